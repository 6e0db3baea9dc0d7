"""Timing kernels honestly: warm-up, repeats, CUDA events on a GPU, perf_counter on a CPU.

On CUDA every repeat is bracketed by a pair of CUDA events recorded on the current stream,
and the host synchronises once, after the last repeat, so the timed work runs back to back
as it would in a serving loop. The memory floor of a step is the bytes it must stream from
GPU memory (weights plus the KV cache it reads) over the copy bandwidth measured on the
same device: no step can be faster, so one that is is reported as a measurement error.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Timing:
    """Seconds per call: median and 10th/90th percentiles over ``repeats`` timed calls."""

    median: float
    p10: float
    p90: float
    repeats: int

    def to_dict(self) -> dict[str, float]:
        return {"median_s": self.median, "p10_s": self.p10, "p90_s": self.p90, "repeats": self.repeats}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], device: torch.device, warmup: int = 2, repeats: int = 5,
              setup: Callable[[], object] | None = None) -> Timing:
    """Time ``fn()``; ``setup()`` (untimed) runs before each call, e.g. to reset a cache pointer."""
    for _ in range(warmup):
        if setup:
            setup()
        fn()
    synchronize(device)
    samples = time_sequence([fn], device, repeats, setup)[0]
    arr = np.array(samples)
    return Timing(float(statistics.median(samples)), float(np.percentile(arr, 10)),
                  float(np.percentile(arr, 90)), repeats)


def time_sequence(calls: Sequence[Callable[[], object]], device: torch.device, passes: int,
                  setup: Callable[[], object] | None = None) -> list[list[float]]:
    """Seconds of each of ``calls`` run in order, ``passes`` times (``setup()``, untimed, before
    each pass): per call, one sample per pass — ``perf_counter`` around each call on a CPU, a
    pair of CUDA events around each on a GPU, the host synchronising once per pass."""
    samples: list[list[float]] = [[] for _ in calls]
    for _ in range(passes):
        if setup:
            setup()
        if device.type == "cuda":
            events = []
            for call in calls:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                call()
                end.record()
                events.append((start, end))
            torch.cuda.synchronize(device)
            for i, (start, end) in enumerate(events):
                samples[i].append(start.elapsed_time(end) / 1e3)
        else:
            for i, call in enumerate(calls):
                t0 = time.perf_counter()
                call()
                samples[i].append(time.perf_counter() - t0)
    return samples


def measure_bandwidth(device: torch.device, nbytes: int = 1 << 30, repeats: int = 10) -> float:
    """Device-memory bandwidth in bytes/s from a large device-to-device copy (read + write)."""
    n = nbytes // 4
    # a copy moves the same bytes whatever they hold: filled, not drawn (drawing a host
    # buffer this size costs more than timing its copies)
    src = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    timing = time_call(lambda: dst.copy_(src), device, warmup=3, repeats=repeats)
    return 2 * n * 4 / timing.median
