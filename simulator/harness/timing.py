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


#: Host time (beyond the host's own enqueueing) the GPU must still be asleep for, when the
#: host finishes enqueueing a timed pass: guards against the sleep starting late
SLEEP_MARGIN_S = 50e-6
SLEEP_TRIES = 4
#: The longest sleep a chunk waits behind, and the most calls a chunk enqueues
MAX_SLEEP_S = 0.02
CHUNK_CALLS = 32
_SLEEP_CYCLES_PER_S: dict[int, float] = {}


def _sleep_cycles_per_second(device: torch.device) -> float:
    """Clock cycles per second of ``torch.cuda._sleep`` on ``device``, timed once with events."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SLEEP_CYCLES_PER_S:
        cycles = 2_000_000
        torch.cuda._sleep(cycles // 10)                   # the first call loads the kernel
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        torch.cuda.synchronize(device)
        _SLEEP_CYCLES_PER_S[index] = cycles / (start.elapsed_time(end) / 1e3)
    return _SLEEP_CYCLES_PER_S[index]


def time_split(calls: Sequence[Callable[[], object]], device: torch.device, passes: int,
               setup: Callable[[], object] | None = None) -> tuple[list[list[float]], list[list[float]]]:
    """Per call, ``passes`` samples of its **device** seconds and of its **host** seconds.

    Timed the plain way (:func:`time_sequence`), a short op on an idle GPU measures the host's
    launch latency rather than the kernel: the end event waits for the host to enqueue the op.
    Here the calls are enqueued in chunks of at most :data:`CHUNK_CALLS` (few enough never to
    fill the device's launch queue, which would block the host), each behind a sleep kernel
    meant to outlast the host's enqueueing of the chunk, so each pair of events brackets the
    op's kernels running back to back on the device (what a CUDA graph replays);
    ``perf_counter`` around each call gives the host's time to issue it (what an eager pass
    pays per call). A chunk whose sleep ended before the host finished enqueueing it doubles
    the sleep (up to :data:`MAX_SLEEP_S`) and its pass runs again, at most :data:`SLEEP_TRIES`
    times (the last try is kept). On a CPU the two are the same synchronous seconds."""
    if device.type != "cuda":
        samples = time_sequence(calls, device, passes, setup)
        return samples, samples
    cycles_per_s = _sleep_cycles_per_second(device)
    device_s: list[list[float]] = [[] for _ in calls]
    host_s: list[list[float]] = [[] for _ in calls]
    lead = 1e-3
    for _ in range(passes):
        for _ in range(SLEEP_TRIES):
            if setup:
                setup()
            events, issued, late = [], [], False
            for first in range(0, len(calls), CHUNK_CALLS):
                asleep, awake = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                asleep.record()
                torch.cuda._sleep(int(lead * cycles_per_s))
                awake.record()
                began = time.perf_counter()
                for call in calls[first:first + CHUNK_CALLS]:
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    t0 = time.perf_counter()
                    call()
                    issued.append(time.perf_counter() - t0)
                    end.record()
                    events.append((start, end))
                enqueued = time.perf_counter() - began
                torch.cuda.synchronize(device)
                if asleep.elapsed_time(awake) / 1e3 <= enqueued + SLEEP_MARGIN_S:
                    late = True
                    lead = min(MAX_SLEEP_S, 2 * max(lead, enqueued + SLEEP_MARGIN_S))
            if not late:
                break
        for i, ((start, end), host) in enumerate(zip(events, issued, strict=True)):
            device_s[i].append(start.elapsed_time(end) / 1e3)
            host_s[i].append(host)
    return device_s, host_s


def measure_bandwidth(device: torch.device, nbytes: int = 1 << 30, repeats: int = 10) -> float:
    """Device-memory bandwidth in bytes/s from a large device-to-device copy (read + write)."""
    n = nbytes // 4
    # a copy moves the same bytes whatever they hold: filled, not drawn (drawing a host
    # buffer this size costs more than timing its copies)
    src = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    timing = time_call(lambda: dst.copy_(src), device, warmup=3, repeats=repeats)
    return 2 * n * 4 / timing.median
