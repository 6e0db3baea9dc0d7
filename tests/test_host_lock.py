"""One host process driving every GPU: batches compete for its interpreter lock
(``host_lock`` in the scenario, ``host_fraction`` per task in the profile)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import make_trace, run, timeline

from simulator.errors import ProfileError, ScenarioError
from simulator.model.resources import host_slowdown
from simulator.profile import profile_from_dict
from simulator.scenario import build_scenario


def host_profile(fraction: float, **seconds: float):
    return profile_from_dict({"tasks": {
        task: {"resource": "gpu", "host_fraction": fraction,
               "service": {"kind": "distribution", "dist": "deterministic", "mean": mean}}
        for task, mean in seconds.items()}})


def test_slowdown_is_the_machine_repairman_result():
    assert host_slowdown(1, 0.9) == 1.0
    assert host_slowdown(3, 0.0) == 1.0
    assert host_slowdown(3, 1.0) == 3.0
    # two threads, r = h/g: slowdown (1 + 2r + 2r^2) / (1 + r)^2
    for f in (0.1, 0.5, 0.9):
        r = f / (1 - f)
        assert host_slowdown(2, f) == pytest.approx((1 + 2 * r + 2 * r * r) / (1 + r) ** 2)
    # monotone in both arguments, never above the thread count
    grid = [[host_slowdown(n, f) for f in np.linspace(0, 1, 21)] for n in range(1, 6)]
    assert all(np.all(np.diff(row) >= -1e-12) for row in grid)
    assert all(np.all(np.diff(col) >= -1e-12) for col in np.array(grid).T)
    assert all(max(row) <= n + 1e-12 for n, row in enumerate(grid, start=1))


def test_fully_host_bound_batches_on_two_gpus_take_turns():
    # f = 1: two batches of 10 s on two GPUs from t = 0 each run at half speed -> both at 20.
    trace = make_trace([(0, ["a"]), (0, ["a"])])
    log = run(trace, host_profile(1.0, a=10.0), gpus=2, topology="direct", host_lock=True,
              dispatch="round-robin")
    assert list(log["gpu"]) == [0, 1]
    assert timeline(log) == [("0.0", pytest.approx(20)), ("1.0", pytest.approx(20))]


def test_staggered_batches_are_retimed_at_every_start_and_finish():
    # f = 1, a (10 s) from 0 alone: 5 s of work by t = 5; then a and b (10 s) share the
    # host at rate 1/2: a's last 5 s take 10, a done at 15, b has done 5 and finishes alone
    # at 20. With the lock off, each takes its own 10 s.
    trace = make_trace([(0, ["a"]), (5, ["a"])])
    log = run(trace, host_profile(1.0, a=10.0), gpus=2, topology="direct", host_lock=True,
              dispatch="round-robin")
    assert list(log["gpu"]) == [0, 1]
    assert timeline(log) == [("0.0", pytest.approx(15)), ("1.0", pytest.approx(20))]
    free = run(trace, host_profile(1.0, a=10.0), gpus=2, topology="direct", dispatch="round-robin")
    assert timeline(free) == [("0.0", 10.0), ("1.0", 15.0)]


def test_partial_host_fraction_and_exclusive_line():
    # f = 0.5, two GPUs: while both run, each at 1/1.25. Two a (10 s) from 0, one per GPU
    # (round robin): both done at 12.5. c (2 s; its own rotation starts at GPU 0) arrives
    # at 1 and waits behind the first a (exclusive line), then runs alone: done at 14.5.
    trace = make_trace([(0, ["a"]), (0, ["a"]), (1, ["c"])])
    log = run(trace, host_profile(0.5, a=10.0, c=2.0), gpus=2, topology="direct", host_lock=True,
              dispatch="round-robin")
    assert list(log["gpu"]) == [0, 1, 0]
    done = dict(timeline(log))
    assert done["0.0"] == pytest.approx(12.5) and done["1.0"] == pytest.approx(12.5)
    assert done["2.0"] == pytest.approx(14.5)
    assert dict(timeline(log, "started_at"))["2.0"] == pytest.approx(12.5)


def test_processor_sharing_with_the_host_lock():
    # One GPU shared by a (5) from 0 and b (1) from 1, f = 1: the GPU share (1/2) and the
    # host (2 threads, slowdown 2) combine: rate 1/4 each while both run. b needs 4 s: done
    # at 5; a had 4 left at 1, 3 at 5, alone after: done at 8.
    trace = make_trace([(0, ["a"]), (1, ["b"])])
    log = run(trace, host_profile(1.0, a=5.0, b=1.0), gpus=1, topology="direct",
              gpu_sharing="processor-sharing", host_lock=True)
    assert timeline(log) == [("0.0", pytest.approx(8)), ("1.0", pytest.approx(5))]


def test_no_host_fraction_changes_nothing():
    trace = make_trace([(0.5 * i, ["a", "b"]) for i in range(20)])
    profile = host_profile(0.0, a=1.0, b=2.0)
    with_lock = run(trace, profile, gpus=2, host_lock=True, flush=0.3, max_batch=3)
    without = run(trace, profile, gpus=2, flush=0.3, max_batch=3)
    assert np.allclose(with_lock["done_at"], without["done_at"])


def test_bad_values_are_one_line_errors():
    with pytest.raises(ProfileError, match="host_fraction"):
        host_profile(1.5, a=1.0)
    with pytest.raises(ProfileError, match="host_fraction"):
        host_profile(-0.1, a=1.0)
    with pytest.raises(ScenarioError, match="host_lock"):
        build_scenario(run={"host_lock": "yes"})
    assert not math.isnan(host_slowdown(8, 0.999999))
