"""The tests' virtual-time event loop (tests/virtual_time.py): timers fire in order at exact
virtual instants, sleeps take no real time, executor jobs are waited for, a deadlock fails."""

from __future__ import annotations

import asyncio
import time

import pytest
from virtual_time import VirtualTimeDeadlock, VirtualTimeLoop, run_virtual


def test_timers_fire_in_order_at_their_exact_instants():
    async def main():
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualTimeLoop) and loop.time() == 0.0
        fired: list[tuple[str, float]] = []

        def note(label: str) -> None:
            fired.append((label, loop.time()))
        for label, at in (("c", 0.7), ("a", 0.1), ("e", 2.2), ("b", 0.3), ("d", 0.7), ("f", 1e5)):
            loop.call_at(at, note, label)
        loop.call_at(0.5, note, "cancelled").cancel()
        loop.call_later(1.3, note, "later")
        await asyncio.sleep(2e5)
        return fired
    fired = run_virtual(main())
    assert [at for _, at in fired] == [0.1, 0.3, 0.7, 0.7, 1.3, 2.2, 1e5]
    # c and d share an instant: asyncio's timer heap orders timers by instant only, so either
    # may come first (as on a real loop); the cancelled one never fires
    assert [label for label, _ in fired] in (["a", "b", "c", "d", "later", "e", "f"],
                                             ["a", "b", "d", "c", "later", "e", "f"])


def test_sleeps_take_no_real_time_and_a_gather_ends_at_the_longest():
    async def main():
        loop = asyncio.get_running_loop()
        ends: dict[float, float] = {}

        async def nap(seconds: float) -> None:
            await asyncio.sleep(seconds)
            ends[seconds] = loop.time()
        await asyncio.sleep(3600)
        assert loop.time() == 3600
        await asyncio.gather(nap(1.0), nap(86400 * 3), nap(2.5))
        return loop.time() - 3600, ends
    real = time.monotonic()
    took, ends = run_virtual(main())
    assert time.monotonic() - real < 10  # three virtual days (and an hour): no real wait
    assert took == 86400 * 3
    assert ends == {1.0: 3601.0, 2.5: 3602.5, 86400 * 3: 3600 + 86400 * 3}


def test_timeouts_fire_at_their_virtual_instant():
    async def main():
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.sleep(10), 2)
        at_wait_for = loop.time()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.25):
                await asyncio.Event().wait()
        return at_wait_for, loop.time()
    assert run_virtual(main()) == (2.0, 2.25)


def test_the_clock_does_not_jump_past_a_running_executor_job():
    """A thread's job ends before a pending timer fires, however long it takes for real."""
    async def main():
        loop = asyncio.get_running_loop()
        fired = []
        loop.call_later(3600, lambda: fired.append(loop.time()))
        result = await loop.run_in_executor(None, lambda: time.sleep(0.05) or "done")
        at_result = loop.time()
        await asyncio.sleep(7200)
        return result, at_result, fired
    assert run_virtual(main()) == ("done", 0.0, [3600.0])


def test_a_loop_with_nothing_scheduled_fails_instead_of_hanging():
    async def main():
        await asyncio.get_running_loop().create_future()  # never set
    with pytest.raises(VirtualTimeDeadlock):
        run_virtual(main(), idle_limit=0.05)
