"""Batching policies and dispatch rules are pure decision functions: test them without simpy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simulator.errors import UnknownName
from simulator.model.dispatch import DISPATCH_RULES
from simulator.model.policies import POLICIES, ReleaseNow, WaitUntil


def test_oldest_waits_for_the_head_window_then_releases_everything_waiting():
    p = POLICIES.get("oldest")(flush=2.0, max_batch=4)
    assert p.release(waiting=2, oldest_enqueued_at=1.0, now=1.5, pickup_at=1.5) == WaitUntil(3.0)
    assert p.release(waiting=2, oldest_enqueued_at=1.0, now=3.0, pickup_at=1.5) == ReleaseNow(2)
    # A worker freed late finds an overdue head: release at once, whatever the pickup time.
    assert p.release(waiting=3, oldest_enqueued_at=1.0, now=9.0, pickup_at=9.0) == ReleaseNow(3)


def test_pickup_window_runs_from_the_pickup_instant():
    p = POLICIES.get("pickup")(flush=2.0, max_batch=4)
    assert p.release(waiting=3, oldest_enqueued_at=1.0, now=9.0, pickup_at=9.0) == WaitUntil(11.0)
    assert p.release(waiting=3, oldest_enqueued_at=1.0, now=11.0, pickup_at=9.0) == ReleaseNow(3)


@pytest.mark.parametrize("name", POLICIES.names())
def test_every_policy_releases_a_full_batch_at_once_and_never_more(name):
    p = POLICIES.get(name)(flush=100.0, max_batch=4)
    assert p.release(waiting=4, oldest_enqueued_at=0.0, now=0.0, pickup_at=0.0) == ReleaseNow(4)
    assert p.release(waiting=9, oldest_enqueued_at=0.0, now=0.0, pickup_at=0.0) == ReleaseNow(4)


@pytest.mark.parametrize("name", [n for n in POLICIES.names() if n != "static"])
def test_flush_zero_releases_immediately(name):
    p = POLICIES.get(name)(flush=0.0, max_batch=4)
    assert p.release(waiting=1, oldest_enqueued_at=5.0, now=5.0, pickup_at=5.0) == ReleaseNow(1)


def test_static_waits_for_a_full_batch_and_flush_is_its_timeout():
    no_timeout = POLICIES.get("static")(flush=0.0, max_batch=4)
    assert no_timeout.release(waiting=3, oldest_enqueued_at=0.0, now=1e6, pickup_at=0.0) == WaitUntil(math.inf)
    assert no_timeout.release(waiting=4, oldest_enqueued_at=0.0, now=0.0, pickup_at=0.0) == ReleaseNow(4)
    timeout = POLICIES.get("static")(flush=2.0, max_batch=4)
    assert timeout.release(waiting=1, oldest_enqueued_at=1.0, now=1.5, pickup_at=1.5) == WaitUntil(3.0)
    assert timeout.release(waiting=1, oldest_enqueued_at=1.0, now=3.0, pickup_at=1.5) == ReleaseNow(1)


def test_adaptive_window_shrinks_with_fill_and_with_idle_gpus():
    p = POLICIES.get("adaptive")(flush=8.0, max_batch=4)
    # one of four waiting: 8·(3/4) = 6 s; half the other GPUs idle halves it; all idle: at once
    assert p.release(waiting=1, oldest_enqueued_at=0.0, now=0.0, pickup_at=0.0) == WaitUntil(6.0)
    assert p.release(waiting=1, oldest_enqueued_at=0.0, now=0.0, pickup_at=0.0, idle_share=0.5) == WaitUntil(3.0)
    assert p.release(waiting=1, oldest_enqueued_at=0.0, now=0.0, pickup_at=0.0, idle_share=1.0) == ReleaseNow(1)
    assert p.release(waiting=3, oldest_enqueued_at=0.0, now=0.0, pickup_at=0.0) == WaitUntil(2.0)


def test_infinite_window_waits_only_for_a_full_batch():
    p = POLICIES.get("oldest")(flush=math.inf, max_batch=3)
    assert p.release(waiting=2, oldest_enqueued_at=0.0, now=1e9, pickup_at=0.0) == WaitUntil(math.inf)


def test_policy_rejects_bad_parameters():
    with pytest.raises(ValueError):
        POLICIES.get("oldest")(flush=-1.0, max_batch=2)
    with pytest.raises(ValueError):
        POLICIES.get("oldest")(flush=1.0, max_batch=0)


def test_round_robin_cycles_and_least_loaded_breaks_ties_low():
    rng = np.random.default_rng(0)
    rr = DISPATCH_RULES.get("round-robin")()
    assert [rr.choose([5, 0, 0], rng) for _ in range(5)] == [0, 1, 2, 0, 1]
    ll = DISPATCH_RULES.get("least-loaded")()
    assert ll.choose([3, 1, 1], rng) == 1
    assert ll.choose([0, 0], rng) == 0


def test_random_dispatch_is_uniform():
    rng = np.random.default_rng(1)
    rule = DISPATCH_RULES.get("random")()
    picks = np.array([rule.choose([0, 0, 0, 0], rng) for _ in range(8000)])
    counts = np.bincount(picks, minlength=4)
    # Binomial(8000, 1/4): sd ~ 38.7; allow 5 sd.
    assert np.all(np.abs(counts - 2000) < 5 * np.sqrt(8000 * 0.25 * 0.75))


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(UnknownName, match="valid: oldest, pickup"):
        POLICIES.get("fifo")
