"""An asyncio event loop on virtual time, for tests of code that runs on real timers.

:class:`VirtualTimeLoop` is asyncio's own selector loop with two changes:

* its clock (:meth:`~asyncio.AbstractEventLoop.time`) is virtual: it starts at 0 and moves
  only when the loop would otherwise wait;
* its selector (:class:`VirtualSelector`, wrapping the platform's real one) never waits for
  a timer: when the loop asks it to wait up to ``timeout`` seconds for I/O (``timeout`` is
  what asyncio computes: the time to the earliest timer, 0 when callbacks are ready), it
  polls the real file descriptors without blocking and, if none is ready, moves the clock
  ``timeout`` forward (to exactly the earliest timer's instant) and returns. The loop then
  runs the timers now due, as it would have after a real wait.

So ``asyncio.sleep``, ``loop.call_at``/``call_later``, ``asyncio.timeout`` and
``asyncio.wait_for`` take no real time, every timer fires with the clock reading exactly
its instant (same-instant timers in one turn, in the order they were set, as on a real
loop), and nothing a test asserts about instants depends on how busy the machine is. Everything else is asyncio's own code: the ready queue, the timer heap,
futures, tasks and the order they run in.

The clock moves only when nothing else can: no callback ready, no real I/O ready and no
executor job running. While a job of :meth:`VirtualTimeLoop.run_in_executor` (a thread)
runs, the selector waits for real, as an ordinary loop does (the clock then moves by a
timer's timeout only when that much real time passed without the job ending), so a thread
is never overtaken by a jump. Real sockets are polled but not waited for: a peer that has
not answered *yet* is overtaken by the next jump, so code under test should talk in-process
(``httpx.ASGITransport``), not over sockets.

When nothing at all is scheduled (no timer, no executor job), the loop can only be woken by
real I/O or another thread; the selector then waits for real up to ``idle_limit`` seconds
and raises :class:`VirtualTimeDeadlock` if nothing came: a test that would hang fails.

:func:`run_virtual` is :func:`asyncio.run` on a new :class:`VirtualTimeLoop`.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class VirtualTimeDeadlock(RuntimeError):
    """The loop had nothing scheduled and no I/O came for ``idle_limit`` real seconds."""


class VirtualSelector(selectors.BaseSelector):
    """A real selector whose waits for timers are jumps of a virtual clock (module docstring)."""

    def __init__(self, idle_limit: float = 60.0, next_timer: Callable[[], float | None] = lambda: None) -> None:
        self._real = selectors.DefaultSelector()
        #: the earliest live timer's instant (``None``: none or unknown): a jump lands on it
        #: exactly rather than at ``now + (when - now)``, which float rounding may miss by an ulp
        self.next_timer = next_timer
        #: the virtual clock, seconds
        self.now = 0.0
        #: executor jobs running (the clock does not jump while there are any)
        self.jobs = 0
        self.idle_limit = idle_limit

    # -- the real selector's registrations -----------------------------------------------
    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    # -- waiting -------------------------------------------------------------------------
    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = self._real.select(0)
        if events or timeout is not None and timeout <= 0:
            return events
        if self.jobs:  # a thread is working: wait for it (or the timer) for real
            events = self._real.select(timeout)
            if not events and timeout is not None:
                self.now += timeout
            return events
        if timeout is None:  # nothing scheduled: only real I/O or another thread can wake us
            events = self._real.select(self.idle_limit)
            if not events:
                raise VirtualTimeDeadlock(f"the virtual-time loop had nothing scheduled and no I/O for "
                                          f"{self.idle_limit:g} real seconds (a deadlock in the code under test?)")
            return events
        target = self.now + timeout  # the jump: the earliest timer is now due
        when = self.next_timer()
        if when is not None and self.now <= when <= target + 1e-9:
            target = when
        self.now = max(self.now, target)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """asyncio's selector loop on a virtual clock (module docstring)."""

    def __init__(self, idle_limit: float = 60.0) -> None:
        self._virtual = VirtualSelector(idle_limit, self._next_timer)
        super().__init__(selector=self._virtual)

    def _next_timer(self) -> float | None:
        # asyncio's timer heap; it has dropped cancelled heads before it selects
        scheduled = getattr(self, "_scheduled", None)
        return scheduled[0].when() if scheduled else None

    def time(self) -> float:
        return self._virtual.now

    def run_in_executor(self, executor: Any, func: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """As asyncio's, and the clock does not jump until the job has ended."""
        future = super().run_in_executor(executor, func, *args)
        self._virtual.jobs += 1

        def ended(_: asyncio.Future[T]) -> None:
            self._virtual.jobs -= 1
        future.add_done_callback(ended)
        return future

    async def shutdown_default_executor(self, timeout: float | None = None) -> None:
        """As asyncio's, without a timeout: its joining thread is not an executor job, and a
        virtual timeout would end the wait before the thread did."""
        await super().shutdown_default_executor()


def run_virtual(main: Coroutine[Any, Any, T], *, idle_limit: float = 60.0) -> T:
    """Run ``main`` to its end on a new :class:`VirtualTimeLoop` (as :func:`asyncio.run`)."""
    with asyncio.Runner(loop_factory=lambda: VirtualTimeLoop(idle_limit)) as runner:
        return runner.run(main)
