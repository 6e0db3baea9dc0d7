"""Calibration recovers known parameters from a run simulated with them, and the scenario
settings that model the users' real server behave as stated."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import fixed_profile, make_trace, run, timeline

from simulator.calibrate import calibrate, free_parameters
from simulator.errors import ProfileError
from simulator.metrics import client_calls
from simulator.model import simulate
from simulator.observed import ObservedRun
from simulator.profile import profile_from_dict
from simulator.scenario import build_scenario
from simulator.trace.formats import load_trace

ROOT = Path(__file__).resolve().parents[1]


def test_calibration_recovers_what_a_run_simulated_with_known_costs_identifies():
    """Truth: MMLU iterations of 0.05 s + 0.004 s per row. Call latencies pin the cost of the
    batches that actually ran (and the base cost), not the per-row slope on its own: the
    fit must reproduce the latencies and the time of a typical batch, and say so."""
    trace = load_trace(ROOT / "traces" / "batch_arrivals.json")
    scenario = build_scenario(path=ROOT / "scenarios" / "lminference-4queues.toml")
    start = json.loads((ROOT / "profiles" / "qwen3-4b-nospec-start.json").read_text())
    start["meta"]["calibrate"] = start["meta"]["calibrate"][:2]     # MMLU's two costs
    truth = copy.deepcopy(start)
    truth["tasks"]["mmlu"]["service"]["step"].update(base=0.05, per_row=0.004)
    calls = client_calls(simulate(trace, scenario, profile_from_dict(truth), seed=0), 600.0)
    calls["call_id"] = calls["call_id"].astype(str)
    observed = ObservedRun("truth", "memory", calls)
    result = calibrate(observed, trace, scenario, start, seeds=(0,), max_evaluations=60)
    assert np.nanmax(np.abs(result.errors[["p50_err", "p90_err"]].to_numpy())) < 0.1
    base, per_row = result.values["mmlu.step_base"], result.values["mmlu.step_per_row"]
    assert base == pytest.approx(0.05, rel=0.25)
    # a lone prompt: 3 sequential one-row generations of 50 iterations
    assert 150 * (base + per_row) == pytest.approx(150 * (0.05 + 0.004), rel=0.15)
    # the start was far off: the fit moved it
    assert abs(np.log(base / 0.03)) > 0.2


def test_starting_profile_must_name_existing_fields():
    start = json.loads((ROOT / "profiles" / "qwen3-4b-nospec-start.json").read_text())
    start["meta"]["calibrate"][0]["path"] = "service.step.nope"
    with pytest.raises(ProfileError, match="service.step.nope"):
        free_parameters(start, "start.json")


def test_at_most_two_groups_of_a_call_run_at_once_in_the_given_order():
    # Groups graph(1 s, cpu), mmlu(2 s), infobench(3 s) on separate resources; limit 2, order
    # graph, mmlu, infobench: infobench starts when graph ends (1), done at 4.
    trace = make_trace([(0, ["infobench", "mmlu", "cpu_graph"])])
    profile = fixed_profile(infobench=3.0, mmlu=2.0, cpu_graph=1.0)
    scen = build_scenario(run={"gpus": 2, "max_concurrent_groups": 2, "group_order": ["cpu_graph", "mmlu", "infobench"]},
                          defaults={"topology": "direct", "dispatch": "least-loaded"})
    log = simulate(trace, scen, profile, 0)
    done = dict(zip(log["task"], log["done_at"]))
    assert done == {"infobench": 4.0, "mmlu": 2.0, "cpu_graph": 1.0}


def test_cold_start_holds_calls_until_the_server_is_up():
    log = run(make_trace([(5, ["x"]), (70, ["x"])]), fixed_profile(x=1.0), gpus=1, cold_start=60)
    assert timeline(log) == [("0.0", 61.0), ("1.0", 71.0)]


def test_sticky_worker_keeps_the_gpu_of_its_first_batch():
    trace = make_trace([(0, ["x"]), (10, ["x"]), (20, ["x"])])
    sticky = run(trace, fixed_profile(x=1.0), gpus=2, workers=1, dispatch="round-robin", sticky_gpu=True)
    roaming = run(trace, fixed_profile(x=1.0), gpus=2, workers=1, dispatch="round-robin")
    assert list(sticky["gpu"]) == [0, 0, 0] and list(roaming["gpu"]) == [0, 1, 0]


def test_best_of_three_rows_and_sequential_single_prompts():
    # iteration kind: 1 s + 0.5 s per row per iteration, 2 tokens. Batch of 2 prompts x 3 rows:
    # 2 x (1 + 0.5 * 6) = 8 s. A lone prompt: 3 sequential one-row runs of 2 x 1.5 = 9 s.
    profile = profile_from_dict({"tasks": {"x": {"max_tokens": 2, "service": {
        "kind": "iteration", "step": {"base": 1.0, "per_row": 0.5}}}}})
    both = run(make_trace([(0, ["x", "x"])]), profile, gpus=1, rows_per_prompt=3, single_prompt="sequential")
    assert list(both["done_at"]) == [8.0, 8.0]
    alone = run(make_trace([(0, ["x"])]), profile, gpus=1, rows_per_prompt=3, single_prompt="sequential")
    assert list(alone["done_at"]) == [9.0]
    batched = run(make_trace([(0, ["x"])]), profile, gpus=1, rows_per_prompt=3)
    assert list(batched["done_at"]) == [2 * (1 + 0.5 * 3)]


def test_shortest_waiting_ignores_batches_in_service_and_per_group_dispatch():
    # split, flush 0: a(0) goes to queue 0 and into service at once; b(0.5): both queues have
    # nothing waiting -> queue 0 (tie), although GPU 0 is busy. least-loaded sends b to 1.
    trace = make_trace([(0, ["x"]), (0.5, ["x"])])
    sw = run(trace, fixed_profile(x=5.0), gpus=2, topology="split", dispatch="shortest-waiting")
    ll = run(trace, fixed_profile(x=5.0), gpus=2, topology="split", dispatch="least-loaded")
    assert list(sw["gpu"]) == [0, 0] and list(ll["gpu"]) == [0, 1]
    group = run(make_trace([(0, ["x", "x", "x"])]), fixed_profile(x=1.0), gpus=2, topology="split",
                dispatch="round-robin", dispatch_per="group")
    assert list(group["gpu"]) == [0, 0, 0]


def test_forming_batches_only_on_a_free_gpu_collects_more_prompts():
    # One GPU busy 0..5 with a batch of a; b, c arrive at 1, 2. Eager: the worker of the
    # other task... here one task with two workers bound to the one GPU: eager forms {b} at 1
    # and waits for the lock; gpu-free waits until 5 and takes {b, c}.
    trace = make_trace([(0, ["x"]), (1, ["x"]), (2, ["x"])])
    eager = run(trace, fixed_profile(x=5.0), gpus=1, workers=2, max_batch=4)
    free = run(trace, fixed_profile(x=5.0), gpus=1, workers=2, max_batch=4, batch_forming="gpu-free")
    assert list(eager["batch_size"]) == [1, 1, 1] and timeline(eager)[2] == ("2.0", 15.0)
    assert list(free["batch_size"]) == [1, 2, 2] and timeline(free)[2] == ("2.0", 10.0)


def test_adaptive_lookahead_follows_the_rule():
    from simulator.profile.kinds.spec_decode import adaptive_lookahead

    assert [adaptive_lookahead(3, m) for m in (None, 0.8, 0.7, 0.5, 0.3, 0.1)] == [3, 5, 4, 3, 2, 1]
    assert adaptive_lookahead(7, 0.9) == 8
