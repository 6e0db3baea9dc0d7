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
from dataclasses import dataclass
from typing import Callable

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
    samples: list[float] = []
    if device.type == "cuda":
        pairs = []
        for _ in range(repeats):
            if setup:
                setup()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            pairs.append((start, end))
        torch.cuda.synchronize(device)
        samples = [s.elapsed_time(e) / 1e3 for s, e in pairs]
    else:
        for _ in range(repeats):
            if setup:
                setup()
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    arr = np.array(samples)
    return Timing(float(statistics.median(samples)), float(np.percentile(arr, 10)),
                  float(np.percentile(arr, 90)), repeats)


def measure_bandwidth(device: torch.device, nbytes: int = 1 << 30, repeats: int = 10) -> float:
    """Device-memory bandwidth in bytes/s from a large device-to-device copy (read + write)."""
    n = nbytes // 4
    src = torch.empty(n, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    timing = time_call(lambda: dst.copy_(src), device, warmup=3, repeats=repeats)
    return 2 * n * 4 / timing.median
