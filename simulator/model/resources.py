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
  slows down accordingly.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
import itertools
from heapq import heappop, heappush
from typing import TYPE_CHECKING, Any, Callable

from simulator.model.kernel import COMPLETION
from simulator.registry import Registry

if TYPE_CHECKING:
    from simpy.events import Event

    from simulator.model.kernel import SimEnvironment


class Batch:
    """One batch of prompts of one task, from formation to completion."""

    __slots__ = (
        "id", "task", "queue", "prompts", "worker", "device", "formed_at", "started_at",
        "done_at", "work", "on_done", "holder", "priority", "first_token_work",
        "tokens",
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
        batch.device = self.gpu_id
        self.outstanding += len(batch.prompts)
        self.outstanding_tokens += batch.tokens
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
        self.outstanding -= len(batch.prompts)
        self.outstanding_tokens -= batch.tokens
        # The next waiting batch starts before the finished batch's worker is told, so a
        # batch already waiting for this GPU keeps its FIFO place.
        if self.line:
            self._start(heappop(self.line)[2])
        batch.on_done(batch)  # type: ignore[misc]
        for watcher in self.watchers:
            watcher()


class ProcessorSharingGpu(Device):
    """A GPU shared equally by every batch on it (egalitarian processor sharing)."""

    def __init__(self, env: SimEnvironment, gpu_id: int) -> None:
        self.env = env
        self.gpu_id = gpu_id
        self.remaining: dict[Batch, float] = {}
        self.watchers = []
        self.updated_at = 0.0
        self.version = 0
        self.outstanding = 0
        self.outstanding_tokens = 0

    def submit(self, batch: Batch) -> None:
        batch.device = self.gpu_id
        self.outstanding += len(batch.prompts)
        self.outstanding_tokens += batch.tokens
        self._advance()
        batch.started_at = self.env._now
        self.remaining[batch] = batch.work
        self._reschedule()

    def _advance(self) -> None:
        now = self.env._now
        if self.remaining:
            done = (now - self.updated_at) / len(self.remaining)
            for batch in self.remaining:
                self.remaining[batch] -= done
        self.updated_at = now

    def _reschedule(self) -> None:
        # One pending completion at a time; a change of the sharing set makes it stale.
        self.version += 1
        if self.remaining:
            least = min(self.remaining.values())
            at = self.env._now + max(least, 0.0) * len(self.remaining)
            self.env.call_at(at, COMPLETION, self._on_timer, self.version)

    def _on_timer(self, event: Event) -> None:
        if event._value != self.version:
            return
        self._advance()
        least = min(self.remaining.values())
        # Batches that finish at this instant (equal work up to rounding) leave together.
        tolerance = 1e-9 * max(1.0, abs(least))
        finished = [b for b, r in self.remaining.items() if r <= least + tolerance]
        now = self.env._now
        for batch in finished:
            del self.remaining[batch]
            batch.done_at = now
            self.outstanding -= len(batch.prompts)
            self.outstanding_tokens -= batch.tokens
        self.outstanding_tokens -= batch.tokens
        self._reschedule()
        for batch in finished:
            batch.on_done(batch)  # type: ignore[misc]
        for watcher in self.watchers:
            watcher()


GPU_SHARING: Registry[Callable[["SimEnvironment", int], Device]] = Registry("GPU sharing mode")
GPU_SHARING.register("exclusive")(lambda env, gpu_id: ServerPool(env, gpu_id, servers=1))
GPU_SHARING.register("processor-sharing")(ProcessorSharingGpu)
