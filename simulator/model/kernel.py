"""The event kernel: simpy's environment with explicit same-instant ordering.

simpy orders events at equal times by priority, then by creation. Creation order is an
accident of the code, so every event this model schedules carries one of these
priorities (:mod:`simulator.model.event_order`), which *are* part of the model:

1. ``COMPLETION`` — a batch finishes and frees its GPU (or CPU server) and its worker;
2. ``ARRIVAL`` — a call arrives and its prompts join their queues;
3. ``TIMER`` — a flush window expires and the queue decides whether to release a batch.

So a worker freed at instant t sees the prompts that arrive at t, and a flush timer at t
sees both: a batch released at t holds every prompt that arrived up to and including t.
Calls that arrive at the same instant are taken in trace order.

Events are scheduled at absolute instants (not ``now + delay``) so a timer set for
``anchor + flush`` fires at exactly that float and the policy's ``now >= anchor + flush``
test holds without tolerances.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappush
from typing import Any

import simpy
from simpy.events import Event, EventPriority


class SimEnvironment(simpy.Environment):
    """A simpy environment that can call a function at an absolute instant."""

    def call_at(self, at: float, priority: int, handler: Callable[[Event], Any], value: Any = None) -> Event:
        """Schedule ``handler(event)`` at instant ``at`` with ``priority`` (one of
        :mod:`simulator.model.event_order`'s); ``event.value`` is ``value``."""
        if at < self._now:
            raise ValueError(f"cannot schedule in the past ({at} < {self._now})")
        event = Event.__new__(Event)
        event.env = self
        event.callbacks = [handler]
        event._value = value
        event._ok = True
        heappush(self._queue, (at, EventPriority(priority), next(self._eid), event))
        return event
