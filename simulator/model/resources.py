"""Devices that serve batches: GPUs (exclusive or processor-sharing) and CPU pools.

A device takes a :class:`Batch` whose ``work`` is its service time in seconds of exclusive
use, sets ``started_at`` and ``done_at``, and calls ``batch.on_done(batch)`` at completion.
``outstanding`` (prompts in batches started or waiting on the device) is what the
``least-loaded`` dispatch rule compares, ``outstanding_tokens`` what ``jsq-tokens`` does.

GPU sharing between concurrent batches (``gpu_sharing``):

* ``exclusive`` — one batch at a time; batches that find the GPU busy wait in line, by
  their task's priority (higher first), FIFO within a priority; a running batch is never
  interrupted.
* ``processor-sharing`` — every batch on the GPU starts at once and the n concurrent
  batches each progress at rate 1/n (kernels of concurrent threads interleave), so each
  slows down accordingly (:class:`RetimedGpu` with its own :class:`Clock`).

With ``host_lock`` every GPU is a :class:`RetimedGpu` on one :class:`HostLock`: batches on
different GPUs slow each other down through the host process's interpreter lock.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable
from heapq import heappop, heappush
from typing import TYPE_CHECKING, Any

from simulator.model.event_order import COMPLETION
from simulator.registry import Registry

if TYPE_CHECKING:
    from simpy.events import Event

    from simulator.model.kernel import SimEnvironment


class Batch:
    """One batch of prompts of one task, from formation to completion."""

    __slots__ = (
        "id", "task", "queue", "prompts", "worker", "device", "formed_at", "started_at",
        "done_at", "work", "on_done", "holder", "priority", "first_token_work",
        "tokens", "host_fraction",
    )

    def __init__(self, id: int, task: str, queue: str, prompts: list[int], worker: int,
                 formed_at: float, work: float) -> None:
        self.id = id
        self.task = task
        self.queue = queue
        self.prompts = prompts
        self.worker = worker
        self.device = -1
        self.formed_at = formed_at
        self.started_at = float("nan")
        self.done_at = float("nan")
        self.work = work
        self.on_done: Callable[[Batch], Any] | None = None
        self.holder: Any = None  # the worker that waits on this batch, if any
        self.priority = 0
        self.first_token_work = work
        self.tokens = 0  # prompt plus max output tokens of its prompts (jsq-tokens dispatch)
        self.host_fraction = 0.0  # share of its service time that holds the host lock


class Device(ABC):
    """Something a batch runs on. ``gpu_id`` is -1 for CPU pools."""

    gpu_id: int = -1
    outstanding: int = 0
    outstanding_tokens: int = 0
    #: called after every batch finishes (queues that form batches only on a free GPU)
    watchers: list

    @property
    def waiting_count(self) -> int:
        """A device has no line of prompts, only batches: ``shortest-waiting`` compares
        outstanding prompts here, like ``least-loaded``."""
        return self.outstanding

    def is_free(self) -> bool:
        """Nothing runs or waits on the device."""
        return self.outstanding == 0

    @abstractmethod
    def submit(self, batch: Batch) -> None:
        """Take ``batch`` now: start it, or queue it until the device can."""

    # The one place a device counts what it holds (what the dispatch rules compare).
    def _take(self, batch: Batch) -> None:
        batch.device = self.gpu_id
        self.outstanding += len(batch.prompts)
        self.outstanding_tokens += batch.tokens

    def _release(self, batch: Batch) -> None:
        self.outstanding -= len(batch.prompts)
        self.outstanding_tokens -= batch.tokens


class ServerPool(Device):
    """``servers`` identical servers with one FIFO line (``None``: unlimited servers).

    With one server this is an exclusive GPU; with ``None`` a CPU pool where every batch
    starts at once (a thread per request)."""

    def __init__(self, env: SimEnvironment, gpu_id: int, servers: int | None) -> None:
        self.env = env
        self.gpu_id = gpu_id
        self.servers = servers
        self.busy = 0
        self.watchers = []
        self.line: list[tuple[int, int, Batch]] = []  # heap of (-priority, arrival order, batch)
        self._order = itertools.count()
        self.outstanding = 0
        self.outstanding_tokens = 0

    def submit(self, batch: Batch) -> None:
        self._take(batch)
        if self.servers is None or self.busy < self.servers:
            self._start(batch)
        else:
            heappush(self.line, (-batch.priority, next(self._order), batch))

    def _start(self, batch: Batch) -> None:
        self.busy += 1
        now = self.env._now
        batch.started_at = now
        self.env.call_at(now + batch.work, COMPLETION, self._finish, batch)

    def _finish(self, event: Event) -> None:
        batch: Batch = event._value
        batch.done_at = self.env._now
        self.busy -= 1
        self._release(batch)
        # The next waiting batch starts before the finished batch's worker is told, so a
        # batch already waiting for this GPU keeps its FIFO place.
        if self.line:
            self._start(heappop(self.line)[2])
        batch.on_done(batch)  # type: ignore[misc]
        for watcher in self.watchers:
            watcher()


def host_slowdown(threads: int, host_fraction: float) -> float:
    """How many times slower than alone each of ``threads`` concurrent threads runs when
    each spends ``host_fraction`` of its solo time holding one lock.

    The machine-repairman model (a closed network of ``threads`` customers, one
    exponential server): a thread alternates lock work ``h`` and lock-free work ``g``,
    ``f = h / (h + g)``, ``r = h / g``; the lock is busy with probability
    ``U = 1 - P0``, ``P0 = 1 / sum_k N!/(N-k)! r^k``, so a cycle takes ``N h / U`` against
    ``h + g`` alone: slowdown ``N f / U``. It is 1 for one thread or ``f = 0``, N for
    ``f = 1``, and smooth between (two threads: 1.25 at f = 0.5, 1.81 at f = 0.9)."""
    if threads <= 1 or host_fraction <= 0:
        return 1.0
    if host_fraction >= 1:
        return float(threads)
    r = host_fraction / (1.0 - host_fraction)
    total, term = 1.0, 1.0
    for k in range(1, threads + 1):
        term *= (threads - k + 1) * r
        total += term
    busy = 1.0 - 1.0 / total
    return threads * host_fraction / busy


class Clock:
    """What re-times the batches of :class:`RetimedGpu` devices: every start or finish on one
    of its devices first brings all of them up to now, then reschedules them all. Alone
    (one GPU, no host lock) it runs at full speed."""

    speed = 1.0

    def __init__(self) -> None:
        self.devices: list[RetimedGpu] = []

    def before_change(self) -> None:
        """Bring every device's remaining work up to now at the current speed."""
        for device in self.devices:
            device.advance()

    def after_change(self) -> None:
        """Reschedule every device's next completion."""
        for device in self.devices:
            device.reschedule()


class HostLock(Clock):
    """One host process with one interpreter lock driving every GPU (the GIL).

    A batch whose task has host fraction ``f`` spends ``f`` of its exclusive service time
    in host code that holds the lock (the Python of a generation loop, kernel launches)
    and the rest on the GPU. Alone it runs at full speed; with others running anywhere
    (other GPUs, or the same GPU under processor sharing) every GPU batch is slowed by
    :func:`host_slowdown` of their number and mean host fraction, on top of its share of
    its own GPU. Every start or finish re-times all running batches.
    """

    def after_change(self) -> None:
        """Recompute the speed for the new set of running batches and reschedule."""
        fractions = [b.host_fraction for device in self.devices for b in device.remaining]
        mean = sum(fractions) / len(fractions) if fractions else 0.0
        self.speed = 1.0 / host_slowdown(len(fractions), mean)
        super().after_change()


class RetimedGpu(Device):
    """A GPU whose running batches drain their work at a rate that changes as batches start
    and finish: their share of the GPU (1, or 1/n for n batches under processor sharing,
    egalitarian) times the speed of its :class:`Clock` — 1 on its own, less under a
    :class:`HostLock` shared with the other GPUs. Exclusive GPUs hold further batches in a
    line by priority, FIFO within one."""

    def __init__(self, env: SimEnvironment, gpu_id: int, host: Clock, exclusive: bool) -> None:
        self.env = env
        self.gpu_id = gpu_id
        self.host = host
        self.exclusive = exclusive
        self.remaining: dict[Batch, float] = {}
        self.line: list[tuple[int, int, Batch]] = []
        self._order = itertools.count()
        self.watchers = []
        self.updated_at = 0.0
        self.version = 0
        self.outstanding = 0
        self.outstanding_tokens = 0
        host.devices.append(self)

    def _rate(self) -> float:
        return self.host.speed / len(self.remaining) if self.remaining else 0.0

    def advance(self) -> None:
        now = self.env._now
        if self.remaining:
            done = (now - self.updated_at) * self._rate()
            for batch in self.remaining:
                self.remaining[batch] -= done
        self.updated_at = now

    def reschedule(self) -> None:
        # One pending completion per device; any change of speed or sharing makes it stale.
        self.version += 1
        if self.remaining:
            least = min(self.remaining.values())
            at = self.env._now + max(least, 0.0) / self._rate()
            self.env.call_at(at, COMPLETION, self._on_timer, self.version)

    def submit(self, batch: Batch) -> None:
        self._take(batch)
        if self.exclusive and self.remaining:
            heappush(self.line, (-batch.priority, next(self._order), batch))
            return
        self.host.before_change()
        self._begin(batch)
        self.host.after_change()

    def _begin(self, batch: Batch) -> None:
        batch.started_at = self.env._now
        self.remaining[batch] = batch.work

    def _on_timer(self, event: Event) -> None:
        if event._value != self.version:
            return
        self.host.before_change()
        least = min(self.remaining.values())
        tolerance = 1e-9 * max(1.0, abs(least))
        finished = [b for b, r in self.remaining.items() if r <= least + tolerance]
        now = self.env._now
        for batch in finished:
            del self.remaining[batch]
            batch.done_at = now
            self._release(batch)
        if self.exclusive and self.line and not self.remaining:
            self._begin(heappop(self.line)[2])
        self.host.after_change()
        for batch in finished:
            batch.on_done(batch)  # type: ignore[misc]
        for watcher in self.watchers:
            watcher()


GPU_SHARING: Registry[Callable[[SimEnvironment, int], Device]] = Registry("GPU sharing mode")
GPU_SHARING.register("exclusive")(lambda env, gpu_id: ServerPool(env, gpu_id, servers=1))
GPU_SHARING.register("processor-sharing")(lambda env, gpu_id: RetimedGpu(env, gpu_id, Clock(), exclusive=False))
