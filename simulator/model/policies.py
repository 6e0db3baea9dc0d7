"""Batch-release policies: when a micro-batch queue hands a batch to a free worker.

A policy is consulted only while the queue is non-empty *and* a worker is free. It reads
nothing but its arguments and returns a decision: release the first ``count`` waiting
prompts now (FIFO), or wait until an instant (the engine sets a timer and asks again then,
or earlier if prompts arrive or the queue fills).

Timelines (flush window W, max batch B, one worker)::

    oldest  (Triton max_queue_delay; the worker loop of the design notes)
      the window is anchored at the enqueue time of the oldest waiting prompt:
      release at  max(oldest_enqueued_at + W, worker free)  or as soon as B are waiting.
      A worker that was busy finds an overdue head and releases at once.

          prompt a arrives t=0 ─┐          worker busy until t=3
          prompt b arrives t=1 ─┤  W=2     t=2: a has waited W, but no worker
                                └──────►  t=3: worker free, head overdue → batch {a, b} at 3

    pickup  (TorchServe)
      the window starts when a free worker finds the queue non-empty:
      release at  pickup_at + W  or as soon as B are waiting.

          same arrivals, worker free at t=3 finds {a, b} → window runs 3..5 → batch at 5

    adaptive
      like oldest, with a window that shrinks as the batch fills and as the queue's other
      GPUs sit idle: flush × (1 − waiting / B) × (1 − idle share of the other GPUs).

    static  (static batching)
      waits for a full batch; ``flush`` > 0 is a timeout anchored at the oldest waiting
      prompt (as oldest), ``flush`` = 0 means no timeout. When the trace has no more calls
      to send, a partial batch is released (otherwise its prompts would never finish).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# The rule itself is plain functions of numbers in the rules layer: the policy classes below
# and BatchRelease call them, and the compiled kernel compiles them, so the rule exists once
# whatever engine runs it.
from simulator.model.rules.queue import ADAPTIVE, OLDEST, PICKUP, STATIC, release_step, window_end
from simulator.registry import Registry

__all__ = ["ADAPTIVE", "OLDEST", "PICKUP", "POLICIES", "STATIC", "BatchingPolicy", "Decision", "ReleaseNow",
           "WaitUntil", "release_step", "window_end"]


@dataclass(frozen=True, slots=True)
class ReleaseNow:
    """Release the first ``count`` waiting prompts as one batch, now."""

    count: int


@dataclass(frozen=True, slots=True)
class WaitUntil:
    """Release nothing before instant ``at`` (``inf``: only when the batch is full)."""

    at: float


Decision = ReleaseNow | WaitUntil

class BatchingPolicy:
    """Base class: a flush window ``flush`` (seconds) and a ``max_batch`` size; a policy is its
    ``code`` for :func:`window_end`."""

    name = ""
    code = OLDEST

    def __init__(self, flush: float, max_batch: int) -> None:
        if not flush >= 0:
            raise ValueError(f"flush must be >= 0, got {flush}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.flush = float(flush)
        self.max_batch = int(max_batch)

    def release(self, waiting: int, oldest_enqueued_at: float, now: float, pickup_at: float,
                idle_share: float = 0.0) -> Decision:
        """Decide for a non-empty queue with a free worker.

        ``waiting``: prompts in the queue (> 0); ``oldest_enqueued_at``: when the head
        prompt joined; ``pickup_at``: when a free worker first found the queue non-empty
        since the last release; ``idle_share``: the share of the queue's *other* GPUs
        (besides the one this batch would go to) that have nothing to run (0 with one GPU).
        """
        end = window_end(self.code, self.flush, self.max_batch, waiting, oldest_enqueued_at, pickup_at, idle_share)
        count, _ = release_step(waiting, self.max_batch, end, now, math.nan, False)
        return ReleaseNow(count) if count else WaitUntil(end)


POLICIES: Registry[type[BatchingPolicy]] = Registry("batching policy")


@POLICIES.register("oldest")
class OldestTimer(BatchingPolicy):
    """Window anchored at the oldest waiting prompt's enqueue time."""

    name = "oldest"
    code = OLDEST


@POLICIES.register("pickup")
class PickupTimer(BatchingPolicy):
    """Window started when a free worker finds the queue non-empty."""

    name = "pickup"
    code = PICKUP


def is_unbounded(instant: float) -> bool:
    """True for a wait that only a full batch can end (an infinite flush window)."""
    return math.isinf(instant)


@POLICIES.register("adaptive")
class AdaptiveTimer(BatchingPolicy):
    """A window that shrinks as the batch fills and as GPUs sit idle: anchored at the oldest
    waiting prompt like ``oldest``, of length
    ``flush * (1 - waiting / max_batch) * (1 - idle_share)``.

    A lone prompt waits (almost) the full window for company; each prompt that joins
    shortens the wait, since a fuller batch gains less from waiting; a full batch goes at
    once. With W = 4 s, B = 4: one prompt waiting gives a 3 s window, two give 2 s, three 1 s.
    Under heavy load queues are long and the window vanishes; under light load it is the
    fixed window's. And if the queue's other GPUs are idle too, waiting buys nothing
    (prompts that come later can go to them), so the window shrinks by the idle share: with
    every other GPU idle, the batch goes at once. With one GPU only the fill counts.
    """

    name = "adaptive"
    code = ADAPTIVE


@POLICIES.register("static")
class StaticBatch(BatchingPolicy):
    """Static batching: a batch goes when it is full; ``flush`` > 0 is a timeout from the
    oldest waiting prompt, ``flush`` = 0 no timeout (the queue drains when input ends)."""

    name = "static"
    code = STATIC
