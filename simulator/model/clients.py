"""Clients: when each call of the trace is sent (the run setting ``client``).

* :class:`OpenLoop` (``open``) sends each call at its arrival instant, in trace order.
* :class:`ClosedLoop` (``closed:N[:THINK]``) keeps N calls outstanding: it sends the first
  N at the trace's first instant and the trace's next call THINK seconds after one ends; a
  call's prompts arrive when it is sent (its ``arrived_at`` is rewritten then).

A client sends through ``send(call index)`` (the router's); one that needs to know when a
call ends says so with ``watches_calls`` and is told through :meth:`Client.call_done`.
Arrivals are ``ARRIVAL`` events, one pending at a time for an open loop (each schedules the
next), so calls arriving at one instant are taken in trace order.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np

from simulator.model.context import RunContext
from simulator.model.event_order import ARRIVAL
from simulator.settings import parse_client
from simulator.trace.model import Call


class Client(ABC):
    """Base class: sends a run's calls through ``send``."""

    #: whether :meth:`call_done` must be called as each call ends
    watches_calls = False

    @abstractmethod
    def start(self, run: RunContext, calls: tuple[Call, ...], send: Callable[[int], None]) -> None:
        """Schedule the sending of ``calls`` in the run."""

    def call_done(self, ci: int) -> None:  # noqa: B027 - a client that watches calls overrides it
        """Call ``ci`` ended now (only for a client that ``watches_calls``)."""


class OpenLoop(Client):
    """Each call at its arrival instant."""

    def start(self, run: RunContext, calls: tuple[Call, ...], send: Callable[[int], None]) -> None:
        env = run.env

        def arrive(event) -> None:  # one event per call, each scheduling the next
            ci = event._value
            send(ci)
            if ci + 1 < len(calls):
                env.call_at(calls[ci + 1].t, ARRIVAL, arrive, ci + 1)

        if calls:
            env.call_at(calls[0].t, ARRIVAL, arrive, 0)


class ClosedLoop(Client):
    """``calls`` outstanding; the next call sent ``think`` seconds after one ends."""

    watches_calls = True

    def __init__(self, calls: int, think: float) -> None:
        self.calls = calls
        self.think = think

    def start(self, run: RunContext, calls: tuple[Call, ...], send: Callable[[int], None]) -> None:
        env = self._env = run.env
        # Calls go in trace order; a call's prompts arrive when it is sent.
        self._next_call = iter(range(len(calls)))
        start = calls[0].t if calls else 0.0
        arrived_at, first_prompt = run.arrived_at, np.cumsum([0] + [len(c.prompts) for c in calls])

        def issue(event) -> None:
            ci = event._value
            now = env._now
            for i in range(first_prompt[ci], first_prompt[ci + 1]):
                arrived_at[i] = now
            send(ci)

        self._issue = issue
        for _ in range(min(self.calls, len(calls))):
            env.call_at(start, ARRIVAL, issue, next(self._next_call))

    def call_done(self, ci: int) -> None:
        nxt = next(self._next_call, None)
        if nxt is not None:
            self._env.call_at(self._env._now + self.think, ARRIVAL, self._issue, nxt)


def client_for(text: str) -> Client:
    """The client of a run's ``client`` setting (``open`` or ``closed:N[:THINK]``)."""
    closed = parse_client(text)
    return OpenLoop() if closed is None else ClosedLoop(closed.calls, closed.think)
