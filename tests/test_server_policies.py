"""The policies real servers expose: static batching, priorities, queue limits and
timeouts, closed-loop clients. Hand-computed timelines with deterministic service."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import fixed_profile, make_trace, run, timeline

from simulator.metrics import summarize
from simulator.model import simulate
from simulator.profile import profile_from_dict
from simulator.scenario import build_scenario


def test_static_batch_waits_until_full_and_drains_when_input_ends():
    # max batch 3, no timeout, service 2. a(0) b(1) c(2): full at 2 -> 2..4. d(5) e(6) wait for
    # a third prompt that never comes; e is the last call, so the queue drains at 6 -> 6..8.
    trace = make_trace([(0, ["x"]), (1, ["x"]), (2, ["x"]), (5, ["x"]), (6, ["x"])])
    log = run(trace, fixed_profile(x=2.0), gpus=1, policy="static", max_batch=3, flush=0.0)
    assert timeline(log, "batched_at") == [("0.0", 2), ("1.0", 2), ("2.0", 2), ("3.0", 6), ("4.0", 6)]
    assert timeline(log) == [("0.0", 4), ("1.0", 4), ("2.0", 4), ("3.0", 8), ("4.0", 8)]


def test_static_batch_timeout_is_the_flush_window():
    # Same arrivals, timeout 1.5: d's batch goes at 6.5 (d waited 1.5) with d and e.
    trace = make_trace([(0, ["x"]), (1, ["x"]), (2, ["x"]), (5, ["x"]), (6, ["x"]), (30, ["x"])])
    log = run(trace, fixed_profile(x=2.0), gpus=1, policy="static", max_batch=3, flush=1.5)
    assert timeline(log, "batched_at")[3:5] == [("3.0", 6.5), ("4.0", 6.5)]


def test_higher_priority_batch_goes_first_at_a_busy_gpu_without_preempting():
    # One exclusive GPU, direct batches. lo(0) runs 0..4; at 1 another lo and a hi arrive
    # (lo first in trace order); hi (priority 1) jumps the line: 4..5, then lo 5..9.
    trace = make_trace([(0, ["lo"]), (1, ["lo"]), (1, ["hi"])])
    profile = fixed_profile(lo=4.0, hi=1.0)
    log = run(trace, profile, gpus=1, topology="direct", tasks={"hi": {"priority": 1}})
    assert timeline(log) == [("0.0", 4.0), ("1.0", 9.0), ("2.0", 5.0)]
    fifo = run(trace, profile, gpus=1, topology="direct")
    assert timeline(fifo) == [("0.0", 4.0), ("1.0", 8.0), ("2.0", 9.0)]


def test_full_queue_rejects_and_the_call_fails():
    # flush 0, max batch 1, service 3, queue of 1: a(0) served 0..3; b(1) waits; c(2) finds
    # the queue full: rejected. b 3..6.
    trace = make_trace([(0, ["x"]), (1, ["x"]), (2, ["x"])])
    log = run(trace, fixed_profile(x=3.0), gpus=1, max_batch=1, max_queue=1)
    assert list(log["status"]) == ["served", "served", "rejected"]
    assert timeline(log)[:2] == [("0.0", 3.0), ("1.0", 6.0)] and math.isnan(log["done_at"][2])
    s = summarize(log)
    assert s["overall"]["rejected"] == 1 and s["overall"]["calls_completed"] == 2


@pytest.mark.parametrize("action", ["drop", "send"])
def test_queue_timeout_drops_or_sends_late_prompts(action):
    # service 3, max batch 1, timeout 2.5: a(0) runs 0..3; b(0.2) is still waiting at 2.7.
    # drop: b leaves at 2.7; c(1) starts at 3, before its own timeout at 3.5.
    # send: b stays, runs 3..6 (marked); c starts at 6, past its 3.5 (marked), done at 9.
    trace = make_trace([(0, ["x"]), (0.2, ["x"]), (1, ["x"])])
    log = run(trace, fixed_profile(x=3.0), gpus=1, max_batch=1, queue_timeout=2.5, timeout_action=action)
    if action == "drop":
        assert list(log["status"]) == ["served", "dropped", "served"]
        assert timeline(log, "started_at")[2] == ("2.0", 3.0)
    else:
        assert list(log["status"]) == ["served", "sent_after_timeout", "sent_after_timeout"]
        assert timeline(log) == [("0.0", 3.0), ("1.0", 6.0), ("2.0", 9.0)]


def test_closed_loop_keeps_n_calls_outstanding_with_think_time():
    # closed:2:1 — calls 0 and 1 at t=0 (arrival times in the trace are ignored), service 2
    # per batch, max batch 1, one GPU: 0 runs 0..2, 1 runs 2..4. Call 2 is sent 1 s after
    # call 0 ends (t=3) and runs 4..6; call 3 at 4 + 1 = 5, runs 6..8.
    trace = make_trace([(0, ["x"]), (50, ["x"]), (60, ["x"]), (70, ["x"])])
    log = run(trace, fixed_profile(x=2.0), gpus=1, max_batch=1, client="closed:2:1")
    assert timeline(log, "arrived_at") == [("0.0", 0), ("1.0", 0), ("2.0", 3), ("3.0", 5)]
    assert timeline(log) == [("0.0", 2), ("1.0", 4), ("2.0", 6), ("3.0", 8)]


def test_closed_loop_obeys_the_interactive_response_time_law():
    """N = X (R + Z) for a closed system: N calls, throughput X, response R, think Z. On a
    finished run X·(R + Z) falls short of N only by the ramp-down at the end."""
    rng = np.random.default_rng(3)
    n_calls = 3000
    trace = make_trace([(float(t), ["x"]) for t in range(n_calls)])
    profile = profile_from_dict({"tasks": {"x": {"service": {"kind": "distribution", "dist": "exponential", "mean": 1.0}}}})
    for n, think in ((4, 0.0), (6, 2.0)):
        scen = build_scenario(defaults={"max_batch": 2, "flush": 0.0}, run={"gpus": 2, "client": f"closed:{n}:{think}"})
        log = simulate(trace, scen, profile, seed=int(rng.integers(1000)))
        calls = log.groupby("call_index").agg(a=("arrived_at", "min"), d=("done_at", "max"))
        span = calls["d"].max() - calls["a"].min()
        x = n_calls / span
        r = (calls["d"] - calls["a"]).mean()
        assert x * (r + think) == pytest.approx(n, rel=0.01)


def test_gpu_seconds_and_concurrency_from_the_log():
    # Two batches of 2 on one GPU, 3 s each, back to back: 6 GPU-seconds, 2 rows on average.
    trace = make_trace([(0, ["x", "x"]), (0, ["x", "x"])])
    log = run(trace, fixed_profile(x=3.0), gpus=1, max_batch=2)
    s = summarize(log, gpus=1)
    assert s["gpu_seconds"] == pytest.approx(6.0)
    assert s["gpus"][0]["mean_concurrency"] == pytest.approx(2.0)
