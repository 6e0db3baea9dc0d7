"""Micro-batch queue rules: a queue's limits, and when it releases a batch of its waiting
prompts to which idle worker.

The reference engine's :class:`~simulator.model.queues.BatchQueue` and the live server's
queue keep their own waiting lines, workers and timers and ask these rules, so the two
release the same batches at the same instants.

Release (:class:`BatchRelease`): while prompts wait and a worker is idle (or the queue has
unlimited workers), the task's forming rule picks the idle worker that forms the next batch
(none: the queue waits for a GPU to free), and the batching policy, told how many wait, when
the oldest arrived, when the queue's current pickup began and the share of the queue's other
GPUs that sit idle, says release ``count`` now or wait until an instant. A wait sets one
flush timer per instant (a timer that fires for an instant since superseded is ignored); a
wait for a full batch sets none, and once input has closed it releases what waits. That
decision is :func:`window_end` and :func:`release_step`, plain functions of numbers the compiled
kernel compiles too.

Limits (:class:`QueueLimits`) as Triton's queue policy has them.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, Protocol, TypeVar


def queue_room(max_queue: int, waiting: int, arriving: int) -> int:
    """How many of ``arriving`` prompts join a line of ``waiting`` that holds at most
    ``max_queue`` (negative: no limit); the rest are rejected. A plain function of numbers:
    :class:`QueueLimits` calls it and the compiled kernel compiles it."""
    if max_queue < 0:
        return arriving
    return min(arriving, max(max_queue - waiting, 0))


#: The batching policies' codes (simulator.model.policies): the compiled kernel's queue table
#: holds them (simulator.model.fast)
OLDEST, PICKUP, ADAPTIVE, STATIC = 0, 1, 2, 3


def window_end(policy: int, flush: float, max_batch: int, waiting: int, oldest_enqueued_at: float,
               pickup_at: float, idle_share: float) -> float:
    """The instant the window of policy ``policy`` (a code above) closes (the timelines are
    :mod:`simulator.model.policies`'):
    ``inf`` where only a full batch ends the wait."""
    if policy == OLDEST:
        return oldest_enqueued_at + flush
    if policy == PICKUP:
        return pickup_at + flush
    if policy == ADAPTIVE:
        fill = min(waiting, max_batch) / max_batch
        return oldest_enqueued_at + flush * (1.0 - fill) * (1.0 - idle_share)
    return oldest_enqueued_at + flush if flush > 0 else math.inf


def release_step(waiting: int, max_batch: int, end: float, now: float, timer_at: float,
                 input_closed: bool) -> tuple[int, float]:
    """One ask of the release rule, the window closing at ``end`` (:func:`window_end`):
    ``(count, timer)``. ``count`` > 0: release the first ``count`` waiting prompts now — a
    full batch as soon as one waits, all of them once the window has closed, and all of
    them once input has closed where only a full batch ends the wait (one would never
    fill). Else ``timer``: the instant to set a flush timer at, or NaN where none is set
    (the timer set for ``timer_at`` (NaN: none) still stands, or only a full batch ends the
    wait)."""
    if waiting >= max_batch:
        return max_batch, math.nan
    if now >= end:
        return waiting, math.nan
    if math.isinf(end):
        return (waiting if input_closed else 0), math.nan
    return 0, (end if end != timer_at else math.nan)


@dataclass(frozen=True)
class QueueLimits:
    """Triton's queue policy, for a micro-batch queue and a continuous engine's waiting line
    alike: at most ``max_queue`` prompts wait (one that finds the line full is rejected); a
    prompt waits at most ``timeout`` seconds, then it is dropped (``drop``) or marked
    ``sent_after_timeout`` and still served."""

    max_queue: int | None = None
    timeout: float | None = None
    drop: bool = True

    @classmethod
    def of(cls, config: Any) -> QueueLimits:
        """The limits a task's configuration sets (``max_queue``, ``queue_timeout``,
        ``timeout_action``)."""
        return cls(config.max_queue, config.queue_timeout, config.timeout_action == "drop")

    def room(self, waiting: int, arriving: int) -> int:
        """How many of ``arriving`` prompts join a line of ``waiting`` (the rest are rejected)."""
        return queue_room(-1 if self.max_queue is None else self.max_queue, waiting, arriving)

    def deadline(self, joined_at: float) -> float | None:
        """The instant prompts that joined at ``joined_at`` time out (``None``: never)."""
        return None if self.timeout is None else joined_at + self.timeout


D = TypeVar("D")


class Worker(Generic[D]):
    """A batch worker: bound to one device, or (``device is None``) picking one per batch."""

    __slots__ = ("id", "device")

    def __init__(self, id: int, device: D | None) -> None:
        self.id = id
        self.device = device


W = TypeVar("W", bound=Worker)


class _Forming(Protocol):
    def worker(self, idle: Sequence[Any]) -> Any: ...


class _Policy(Protocol):
    code: int
    flush: float
    max_batch: int


class Release(NamedTuple):
    """Release ``size`` waiting prompts now to ``worker`` (``None``: a new worker of a
    queue with unlimited workers)."""

    worker: Any
    size: int


class BatchRelease(Generic[W]):
    """The release rule of one micro-batch queue (module docstring): its state is when the
    current pickup began (``pickup_at``) and the flush timer set (``timer_at``)."""

    def __init__(self, policy: _Policy, forming: _Forming, devices: Sequence[Any]) -> None:
        self.policy = policy
        self.forming = forming
        self.devices = devices
        self.pickup_at: float | None = None
        self.timer_at: float | None = None

    def idle_share(self, chosen: Any) -> float:
        """Share of the queue's GPUs other than ``chosen`` with nothing to run."""
        others = [d for d in self.devices if d is not chosen]
        if not others:
            return 0.0
        return sum(d.outstanding == 0 for d in others) / len(others)

    def next(self, waiting: int, oldest_arrived_at: float, now: float, idle: deque[W],
             input_closed: bool = False) -> Release | float | None:
        """Asked with ``waiting`` (> 0) prompts waiting, the oldest arrived at
        ``oldest_arrived_at``, and a worker idle in ``idle`` (longest idle first) or none
        idle in a queue with unlimited workers: a :class:`Release` (its worker taken off
        ``idle``), or an instant to set a flush timer at (ask again then, or earlier), or
        ``None`` (nothing to do until a worker or a GPU frees or a prompt arrives)."""
        if self.pickup_at is None:
            self.pickup_at = now
        worker = None
        if idle:
            worker = self.forming.worker(idle)
            if worker is None:
                return None  # no idle worker may form a batch yet (batch_forming)
        policy = self.policy
        # only the adaptive window reads the idle share (a pass over the queue's GPUs)
        share = 0.0
        if policy.code == ADAPTIVE and self.devices:
            share = self.idle_share(worker.device if worker is not None else None)
        timer_at = math.nan if self.timer_at is None else self.timer_at
        end = window_end(policy.code, policy.flush, policy.max_batch, waiting, oldest_arrived_at, self.pickup_at,
                         share)
        count, timer = release_step(waiting, policy.max_batch, end, now, timer_at, input_closed)
        if count == 0:
            if math.isnan(timer):
                return None
            self.timer_at = timer
            return timer
        self.pickup_at = None
        self.timer_at = None
        if worker is not None:
            idle.remove(worker)
        return Release(worker, count)

    def dropped(self, waiting: int) -> None:
        """Prompts left the line unserved (``queue_timeout``), ``waiting`` still wait: with
        none left, the current pickup ends (the next prompt starts a new one)."""
        if not waiting:
            self.pickup_at = None

    def fired(self, at: float) -> bool:
        """The flush timer set for ``at`` fired: whether the queue asks again (not when the
        batch was released earlier or the window moved)."""
        if at != self.timer_at:
            return False
        self.timer_at = None
        return True
