"""Calibration recovers known parameters from a run simulated with them, and the scenario
settings that model the users' real server behave as stated."""

from __future__ import annotations

import copy
import inspect
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import fixed_profile, make_trace, run, timeline

from simulator.calibrate import (
    F_SCALE,
    SCREEN,
    STARTS,
    _local_fits,
    _screened_points,
    _with_values,
    calibrate,
    free_parameters,
    predict,
)
from simulator.errors import ProfileError, ScenarioError
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
    # 8 screened points and local fits from the best two reach the fit that 16 and three
    # reach (from the best one alone, a shallower basin), in about half the evaluations.
    result = calibrate(observed, trace, scenario, start, seeds=(0,), max_evaluations=60, screen=8, starts=2)
    assert np.nanmax(np.abs(result.errors[["p50_err", "p90_err"]].to_numpy())) < 0.1
    base, per_row = result.values["mmlu.step_base"], result.values["mmlu.step_per_row"]
    assert base == pytest.approx(0.05, rel=0.25)
    # a lone prompt: 3 sequential one-row generations of 50 iterations
    assert 150 * (base + per_row) == pytest.approx(150 * (0.05 + 0.004), rel=0.15)
    # the start was far off: the fit moved it
    assert abs(np.log(base / 0.03)) > 0.2


def _observed_from(trace, scenario, data: dict, seed: int = 0) -> ObservedRun:
    calls = client_calls(simulate(trace, scenario, profile_from_dict(data), seed=seed), scenario.client_timeout)
    calls["call_id"] = calls["call_id"].astype(str)
    return ObservedRun("truth", "memory", calls)


def _mmlu_context_start() -> dict:
    """The 4-queue starting profile with MMLU's base and per-context costs free."""
    start = json.loads((ROOT / "profiles" / "qwen3-4b-nospec-start.json").read_text())
    start["tasks"]["mmlu"]["service"]["step"].update(base=0.03, per_row=0.002, per_context_token=1e-5)
    start["meta"]["calibrate"] = [
        start["meta"]["calibrate"][0],
        {"name": "mmlu.step_per_context_token", "task": "mmlu", "path": "service.step.per_context_token",
         "min": 1e-8, "max": 1e-3}]
    return start


@pytest.mark.slow
def test_a_cost_that_grows_with_length_is_pinned_by_runs_at_two_lengths_not_one():
    """Truth: MMLU iterations of 0.03 s + 0.002 s per row + 4e-5 s per row and context token.
    One run at 50 tokens barely sees the context term; fitted jointly with a run at 256
    tokens (``also``) it is recovered, with a smaller standard error."""
    # The first 60 calls (each fit evaluation simulates the trace once a run): enough calls
    # of each length for the joint fit to pin both costs, and the short run alone still not.
    trace = load_trace(ROOT / "traces" / "batch_arrivals.json").head(60)
    short = build_scenario(path=ROOT / "scenarios" / "lminference-4queues.toml")
    long = build_scenario(path=ROOT / "scenarios" / "lminference-4queues-longmmlu.toml")
    start = _mmlu_context_start()
    truth = copy.deepcopy(start)
    truth["tasks"]["mmlu"]["service"]["step"].update(base=0.03, per_context_token=4e-5)
    start["tasks"]["mmlu"]["service"]["step"].update(base=0.06, per_context_token=4e-6)
    obs_short, obs_long = _observed_from(trace, short, truth), _observed_from(trace, long, truth)
    # the short run alone has one basin: 8 screened points and one local fit reach the same
    # fit, and so the same standard errors, as the joint fit's 16 and two. The joint fit's
    # best start converges within 20 evaluations (a cap of 60 gives the same fit): the cap
    # only stops the other start sooner.
    one = calibrate(obs_short, trace, short, start, max_evaluations=60, screen=8, starts=1)
    both = calibrate(obs_short, trace, short, start, max_evaluations=20, screen=16, starts=2,
                     also=[(obs_long, trace, long)])
    assert one.seeds == (0,)        # a deterministic model needs one seed
    assert both.values["mmlu.step_per_context_token"] == pytest.approx(4e-5, rel=0.3)
    assert both.values["mmlu.step_base"] == pytest.approx(0.03, rel=0.3)
    assert both.relative_se["mmlu.step_per_context_token"] < one.relative_se["mmlu.step_per_context_token"]


def test_predicted_figures_are_averages_of_whole_simulated_runs():
    """A run's p90 is a figure of one run: predict averages each seed's p90, it does not take
    the p90 of per-call averages (narrower, so lower)."""
    trace = load_trace(ROOT / "traces" / "batch_arrivals.json")
    scenario = build_scenario(path=ROOT / "scenarios" / "lminference-4queues.toml")
    data = json.loads((ROOT / "profiles" / "qwen3-4b-nospec-start.json").read_text())
    data["tasks"]["infobench"]["service"] = {"kind": "distribution", "dist": "gamma", "cv": 0.6,
                                            "mean": {"base": 10.0, "per_prompt": 3.0}}
    observed = _observed_from(trace, scenario, data, seed=99)
    table = predict(observed, trace, scenario, profile_from_dict(data), seeds=(0, 1, 2, 3)).set_index("group")
    p90s = []
    for seed in range(4):
        calls = client_calls(simulate(trace, scenario, profile_from_dict(data), seed), scenario.client_timeout)
        p90s.append(np.percentile(calls["latency_censored_s"], 90))
    assert table.loc["overall", "p90_other"] == pytest.approx(np.mean(p90s))
    assert table.loc["overall", "p90_sd"] == pytest.approx(np.std(p90s, ddof=1))
    ref = np.percentile(observed.calls["latency_censored_s"], 90)
    assert table.loc["overall", "p90_err"] == pytest.approx(np.mean(p90s) / ref - 1)


def test_screened_starts_keep_every_fit_the_run_cannot_tell_apart():
    # What is checked is how the search keeps its fits, not how well they fit: the first 30
    # calls (above the fit's minimum of 10) make each of its evaluations cheap, and 5
    # evaluations a local fit are enough for three fits to be compared and kept or not.
    trace = load_trace(ROOT / "traces" / "batch_arrivals.json").head(30)
    scenario = build_scenario(path=ROOT / "scenarios" / "lminference-4queues.toml")
    start = json.loads((ROOT / "profiles" / "qwen3-4b-nospec-start.json").read_text())
    observed = _observed_from(trace, scenario, start)
    result = calibrate(observed, trace, scenario, start, screen=8, starts=3, max_evaluations=5)
    assert 1 <= len(result.ensemble) <= 3
    assert result.ensemble[0] == result.profile
    assert result.ensemble_values[0] == result.values
    with pytest.raises(ValueError, match="objective"):
        calibrate(observed, trace, scenario, start, objective="median", screen=0)


def test_ties_may_move_a_value_of_another_task():
    start = json.loads((ROOT / "profiles" / "qwen3-4b-nospec-start.json").read_text())
    start["meta"]["calibrate"] = start["meta"]["calibrate"][:1]   # mmlu.step_base alone
    start["meta"]["calibrate"][0]["ties"] = [{"task": "infobench", "path": "service.step.base", "factor": 2.0}]
    params = free_parameters(start, "start.json")
    moved = _with_values(start, params, np.array([0.05]))
    assert moved["tasks"]["mmlu"]["service"]["step"]["base"] == 0.05
    assert moved["tasks"]["infobench"]["service"]["step"]["base"] == pytest.approx(0.1)
    start["meta"]["calibrate"][0]["ties"] = [{"task": "infobench", "path": "service.nope", "factor": 2.0}]
    with pytest.raises(ProfileError, match="service.nope"):
        free_parameters(start, "start.json")


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
    done = dict(zip(log["task"], log["done_at"], strict=True))
    assert done == {"infobench": 4.0, "mmlu": 2.0, "cpu_graph": 1.0}


def test_cold_start_holds_calls_until_the_server_is_up():
    log = run(make_trace([(5, ["x"]), (70, ["x"])]), fixed_profile(x=1.0), gpus=1, cold_start=60)
    assert timeline(log) == [("0.0", 61.0), ("1.0", 71.0)]


def test_a_shared_rotation_is_advanced_by_every_group_of_its_tasks():
    # graph (CPU) groups at 0 and 2 take turns 0 and 2 of the rotation; the infobench groups
    # at 1 and 3 get turns 1 and 3: GPU 1 both times. Each task on its own would alternate.
    trace = make_trace([(0, ["cpu_graph"]), (1, ["x"]), (2, ["cpu_graph"]), (3, ["x"])])
    profile = fixed_profile(x=0.5, cpu_graph=0.1)
    tasks = {"x": {"topology": "split", "dispatch": "round-robin", "dispatch_per": "group"},
             "cpu_graph": {"topology": "direct"}}
    shared = run(trace, profile, gpus=2, tasks=tasks, shared_rotation=["cpu_graph", "x"])
    alone = run(trace, profile, gpus=2, tasks=tasks)
    assert list(shared[shared["task"] == "x"]["gpu"]) == [1, 1]
    assert list(alone[alone["task"] == "x"]["gpu"]) == [0, 1]
    with pytest.raises(ScenarioError, match="shared_rotation"):
        build_scenario(run={"shared_rotation": "graph"})


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


def test_calibrate_cli_defaults_are_the_librarys():
    """One search everywhere: ``simctl calibrate`` without options fits as ``calibrate()`` does."""
    from simulator.cli import _load

    library = inspect.signature(calibrate).parameters
    cli = {p.name: p.default for p in _load("calibrate").params}
    assert cli["screen"] == library["screen"].default == SCREEN
    assert cli["starts"] == library["starts"].default == STARTS
    assert cli["max_evaluations"] == library["max_evaluations"].default
    assert cli["objective"] == library["objective"].default
    assert tuple(range(cli["seeds"])) == library["seeds"].default


def test_default_search_reaches_a_basin_the_best_four_screened_points_miss():
    """A toy cost surface like the users' runs: a broad shallow basin that holds the best
    screened points, and a deeper narrow one whose only screened point ranks 6th. The
    default search (calibrate's own defaults) must fit from it; the best 4 alone do not."""
    defaults = inspect.signature(calibrate).parameters
    screen, starts = defaults["screen"].default, defaults["starts"].default
    x0, low, high = np.zeros(2), np.full(2, -5.0), np.full(2, 5.0)
    broad = np.array([-1.5, -1.5])

    def surface(deep: np.ndarray, width: float, depth: float):
        def residuals(x: np.ndarray) -> np.ndarray:
            return np.array([1.0 - 0.6 * np.exp(-np.sum((x - broad) ** 2) / 2)
                             - depth * np.exp(-np.sum((x - deep) ** 2) / (2 * width ** 2))])
        return residuals

    shallow_only = _screened_points(surface(np.zeros(2), 1.0, 0.0), x0, low, high, screen)
    points = np.array([x for _, x in shallow_only])
    gaps = np.linalg.norm(points[:, None] - points[None], axis=-1) + 9 * np.eye(len(points))
    # the screened point farthest from its neighbours, away from the broad basin
    lone = max((i for i in range(len(points)) if np.linalg.norm(points[i] - broad) > 2.2
                and np.linalg.norm(points[i]) < 1.3), key=lambda i: gaps[i].min())
    # The deep basin's centre sits just beyond it, so that its cost falls between the 5th and
    # 6th best of the broad basin's points: it ranks 6th.
    target = (shallow_only[4][0] + shallow_only[5][0]) / 2
    r_lone = F_SCALE * np.sqrt((target / F_SCALE ** 2 + 1) ** 2 - 1)   # inverse of the soft-L1 cost
    width, depth = 0.2, 0.95
    away = (points[lone] - broad) / np.linalg.norm(points[lone] - broad)
    deep = points[lone] + away * width * np.sqrt(-2 * np.log((1 - r_lone) / depth))
    residuals = surface(deep, width, depth)
    ranked = [x for _, x in _screened_points(residuals, x0, low, high, screen)]
    assert 4 <= next(i for i, x in enumerate(ranked) if np.array_equal(x, points[lone])) < starts

    best = _local_fits(residuals, x0, low, high, screen, starts, 120)[0]
    assert np.linalg.norm(best.x - deep) < 0.15 and best.cost < 0.01
    four = _local_fits(residuals, x0, low, high, screen, 4, 120)[0]
    assert np.linalg.norm(four.x - broad) < 0.15 and four.cost > 0.05
