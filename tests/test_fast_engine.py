"""The fast engine (compiled kernel) against the reference engine (simpy): the same event log,
prompt by prompt, for every configuration the kernel supports; and a loud refusal, never a
silent fallback, for what it does not model."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from simulator import build_scenario, load_profile, load_trace
from simulator.errors import ScenarioError
from simulator.model import DISPATCH_RULES, GPU_SHARING, POLICIES, TOPOLOGIES, engine as engine_module, simulate
from simulator.model.dispatch import PREFIX_RULES
from simulator.model.fast import POLICY_CODES, RULE_CODES, SHARING_CODES, TOPOLOGY_CODES, unsupported
from simulator.profile import profile_from_dict
from simulator.profile.kinds.table import TableService
from simulator.settings import TASK

SHARED = Path(__file__).resolve().parents[2] / "shared"
TASKS = ("mmlu", "infobench", "graph")
TRACE = load_trace("example")
#: The first 14 calls of the bundled trace: every task, and at the drawn rates (1x-4x)
#: queues that fill, batches that grow, rows that preempt and prompts turned away in as many
#: drawn configurations as the first 20 calls, and those as the whole trace (counted over 150 drawn
#: configurations of each strategy below; 10 calls lose some), which the reference engine
#: replays slower. The bundled-scenario tests below keep the whole traces.
HEAD = type(TRACE)(calls=TRACE.calls[:14], meta=TRACE.meta, source=TRACE.source)


def _profiles() -> list:
    seed = json.loads((Path(__file__).resolve().parents[1] / "profiles" / "seed-calibrated.json").read_text())
    other = json.loads(json.dumps(seed))
    other["tasks"]["mmlu"]["service"] = {
        "kind": "table", "axes": {"batch_size": [1, 2, 4, 8], "max_tokens": [16, 64]},
        "seconds": [[1.0, 2.0], [1.2, 2.6], [1.5, 3.1], [2.2, 4.0]], "dist": "gamma", "cv": 0.3}
    other["tasks"]["infobench"]["service"] = {"kind": "distribution", "dist": "exponential",
                                              "mean": {"base": 20.0, "per_prompt": 3.0}}
    other["tasks"]["graph"]["service"] = {"kind": "table", "axes": {"prompt_tokens": [10, 100, 1000]},
                                          "seconds": [0.1, 0.3, 0.9], "dist": "lognormal", "cv": 0.5}
    other["tasks"]["graph"]["tokens_per_iteration"] = 3.0
    # fractional tokens per iteration (continuous engines draw each row's tokens) and a KV cache
    drawn = json.loads(json.dumps(other))
    drawn["tasks"]["infobench"]["tokens_per_iteration"] = 2.5
    drawn["tasks"]["mmlu"]["tokens_per_iteration"] = 1.25
    drawn["tasks"]["mmlu"]["kv_cache"] = {"blocks": 400}
    drawn["tasks"]["graph"]["kv_cache"] = {"blocks": 90}
    return [load_profile("seed-calibrated"), profile_from_dict(other), profile_from_dict(drawn)]


PROFILES = _profiles()


def assert_same_log(trace, scenario, profile, seed) -> pd.DataFrame | None:
    """The same event log from both engines (or the same error: a prompt larger than a
    continuous engine's KV cache)."""
    try:
        reference = simulate(trace, scenario, profile, seed, engine="reference")
    except ScenarioError as error:
        assert "KV blocks" in str(error)
        with pytest.raises(ScenarioError) as raised:
            simulate(trace, scenario, profile, seed, engine="fast")
        assert str(raised.value) == str(error)
        return None
    fast = simulate(trace, scenario, profile, seed, engine="fast")
    assert fast.attrs["engine"] == "fast" and reference.attrs["engine"] == "reference"
    pd.testing.assert_frame_equal(reference, fast)
    return fast


task_settings = st.fixed_dictionaries(
    {"topology": st.sampled_from(sorted(TOPOLOGY_CODES)), "policy": st.sampled_from(sorted(POLICY_CODES)),
     "dispatch": st.sampled_from(sorted(RULE_CODES)), "flush": st.sampled_from([0.0, 0.1, 0.5, 2.0, 5.0]),
     "max_batch": st.integers(1, 9)},
    optional={"workers": st.integers(1, 5), "max_queue": st.integers(1, 12), "priority": st.integers(0, 2),
              "sticky_gpu": st.booleans(), "dispatch_per": st.sampled_from(["prompt", "group"]),
              "cpu_workers": st.integers(1, 4), "resource": st.sampled_from(["gpu", "cpu"]),
              "max_tokens": st.sampled_from([8, 50, 300]),
              # continuous engines
              "max_num_seqs": st.integers(1, 12), "max_batched_tokens": st.sampled_from([40, 400, 1200, 8192]),
              "kv_blocks": st.sampled_from([30, 60, 200]), "block_size": st.sampled_from([1, 4, 16])})
run_settings = st.fixed_dictionaries(
    {"gpus": st.integers(1, 4), "gpu_sharing": st.sampled_from(sorted(SHARING_CODES))},
    optional={"cold_start": st.sampled_from([30.0, 400.0]),
              "group_order": st.permutations(list(TASKS)).map(lambda p: p[:2])})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tasks=st.tuples(task_settings, task_settings, task_settings), run=run_settings,
       profile=st.sampled_from(range(len(PROFILES))), seed=st.integers(0, 3), rate=st.sampled_from([1.0, 3.0]))
def test_kernel_equals_reference_on_every_supported_configuration(tasks, run, profile, seed, rate):
    overrides = {f"tasks.{t}.{k}": v for t, values in zip(TASKS, tasks, strict=True) for k, v in values.items()}
    overrides.update({f"run.{k}": v for k, v in run.items()})
    scenario = build_scenario(path="design-notes", overrides=overrides)
    trace = HEAD.scaled(rate)
    reason = unsupported(trace, scenario, PROFILES[profile])
    if reason is not None:  # a split CPU task without cpu_workers: the reference engine's error
        assert "cpu_workers" in reason
        with pytest.raises(ScenarioError, match="cpu_workers"):
            simulate(trace, scenario, PROFILES[profile], seed)
        return
    assert_same_log(trace, scenario, PROFILES[profile], seed)


def _kv_blocks(values: dict) -> dict:
    """A KV cache given in tokens (most prompts fit it, a few rows fill it) as blocks."""
    kv_tokens = values.pop("kv_tokens", None)
    if kv_tokens is not None:
        values["kv_blocks"] = max(kv_tokens // values.get("block_size", 16), 1)
    return values


continuous_settings = st.fixed_dictionaries(
    {"topology": st.sampled_from(["continuous", "continuous", "continuous", "shared", "split", "direct"]),
     "dispatch": st.sampled_from(sorted(RULE_CODES)), "max_num_seqs": st.integers(1, 16),
     "max_batched_tokens": st.sampled_from([30, 300, 900, 8192])},
    optional={"kv_tokens": st.sampled_from([1000, 1200, 1500, 2500, 10000]), "block_size": st.sampled_from([1, 4, 16]),
              "max_queue": st.integers(1, 12), "priority": st.integers(0, 2), "max_tokens": st.sampled_from([8, 50, 300]),
              "resource": st.sampled_from(["gpu", "cpu"]), "cpu_workers": st.integers(1, 3),
              "flush": st.sampled_from([0.0, 0.5, 2.0]), "max_batch": st.integers(1, 6), "workers": st.integers(1, 3)},
).map(_kv_blocks)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tasks=st.tuples(continuous_settings, continuous_settings, continuous_settings), run=run_settings,
       profile=st.sampled_from(range(len(PROFILES))), seed=st.integers(0, 3), rate=st.sampled_from([1.0, 4.0]))
def test_kernel_equals_reference_with_continuous_engines(tasks, run, profile, seed, rate):
    """Continuous engines beside micro-batch queues on the same GPUs (exclusive or processor
    sharing), on CPU pools, with token budgets, row limits, KV caches that preempt, drawn
    tokens per iteration and queue limits."""
    overrides = {f"tasks.{t}.{k}": v for t, values in zip(TASKS, tasks, strict=True) for k, v in values.items()}
    overrides.update({f"run.{k}": v for k, v in run.items()})
    scenario = build_scenario(path="design-notes", overrides=overrides)
    trace = HEAD.scaled(rate)
    reason = unsupported(trace, scenario, PROFILES[profile])
    if reason is not None:
        assert "cpu_workers" in reason
        return
    assert_same_log(trace, scenario, PROFILES[profile], seed)


def test_continuous_engines_preempt_and_draw_alike():
    """Hand-picked cases the random ones may miss: KV caches small enough to preempt often,
    fractional tokens per iteration, two tasks' engines sharing GPUs both ways."""
    for sharing in sorted(SHARING_CODES):
        for profile in PROFILES:
            scenario = build_scenario(path="design-notes", overrides={
                "run.gpu_sharing": sharing, "tasks.infobench.topology": "continuous",
                "tasks.infobench.kv_blocks": 70, "tasks.infobench.max_num_seqs": 12,
                "tasks.mmlu.topology": "continuous", "tasks.mmlu.dispatch": "jsq-tokens",
                "tasks.mmlu.kv_blocks": 50, "tasks.mmlu.max_batched_tokens": 600})
            log = assert_same_log(HEAD.scaled(2.0), scenario, profile, 2)
            assert log is not None and log["preemptions"].sum() > 0


def test_a_continuous_run_short_of_token_draws_runs_again_with_more(monkeypatch):
    """Fractional tokens per iteration are drawn in bulk before the run; a run that needs
    more stops and runs again with more, to the same log."""
    from simulator.model import fast

    monkeypatch.setattr(fast, "FIRST_DRAW_FACTOR", 0.01)
    monkeypatch.setattr(fast, "DRAW_SLACK", 0)
    calls = []
    lower = fast.lower
    monkeypatch.setattr(fast, "lower", lambda *args: calls.append(args[-1]) or lower(*args))
    scenario = build_scenario(path="design-notes", overrides={
        "tasks.infobench.topology": "continuous", "tasks.infobench.kv_blocks": 70})
    assert_same_log(TRACE, scenario, PROFILES[2], 1)
    assert len(calls) > 1 and calls == [0.01 * 4**k for k in range(len(calls))]


@pytest.mark.parametrize("name", ["design-notes", "lminference-separate-queues"])
def test_kernel_equals_reference_on_the_bundled_scenarios_and_traces(name):
    for topology in (None, "continuous"):
        scenario = build_scenario(path=name, run={"host_lock": False})
        for trace_name in ("example", "lminference-4queues-lengths"):
            trace = load_trace(trace_name)
            profile = load_profile("seed-calibrated")
            if topology is not None:  # every GPU task on continuous engines
                overrides = {f"tasks.{t}.topology": topology for t in trace.tasks
                             if (scenario.for_task(t).resource or profile.task(t).resource) == "gpu"}
                scenario = build_scenario(path=name, run={"host_lock": False}, overrides=overrides)
            if unsupported(trace, scenario, profile) is None:
                assert_same_log(trace, scenario, profile, 1)


def test_kernel_equals_reference_on_a_real_public_trace():
    path = SHARED / "traces" / "real" / "burstgpt"
    files = sorted(path.glob("*.csv")) if path.is_dir() else []
    if not files:
        pytest.skip("../shared/traces/real/burstgpt is absent (the real public traces ship beside the repo)")
    from simulator.trace.formats import load_trace as read

    trace = read(files[0]).renamed({})
    trace = type(trace)(calls=trace.calls[:3000], meta=trace.meta, source=trace.source)
    task = trace.tasks[0]
    profile = profile_from_dict({"tasks": {t: {"resource": "gpu", "service": {
        "kind": "table", "axes": {"batch_size": [1, 8], "prompt_tokens": [64, 4096], "max_tokens": [16, 1024]},
        "seconds": [[[0.2, 6.0], [0.9, 7.0]], [[0.4, 9.0], [2.5, 12.0]]], "dist": "gamma", "cv": 0.2}}
        for t in trace.tasks}})
    for topology, policy, dispatch in (("shared", "oldest", "round-robin"), ("split", "adaptive", "jsq-tokens"),
                                       ("direct", "oldest", "least-loaded"), ("continuous", "oldest", "jsq-tokens")):
        for sharing in ("exclusive", "processor-sharing") if topology == "continuous" else ("exclusive",):
            scenario = build_scenario(run={"gpus": 3, "gpu_sharing": sharing}, tasks={task: {
                "topology": topology, "policy": policy, "dispatch": dispatch, "flush": 0.2, "max_num_seqs": 32}})
            assert_same_log(trace, scenario, profile, 0)


def test_every_registered_policy_and_rule_is_in_the_kernel():
    """A policy or rule added to the model and not to the kernel fails here (and the kernel
    would refuse scenarios that name it, see below). The prefix rules are the exception:
    they need prefix caching, a reference-only setting, so the kernel never sees them."""
    assert set(POLICIES) == set(POLICY_CODES)
    assert set(DISPATCH_RULES) - PREFIX_RULES == set(RULE_CODES)
    assert PREFIX_RULES <= set(DISPATCH_RULES) and TASK["prefix_caching"].reference_only
    assert set(GPU_SHARING) == set(SHARING_CODES)
    assert set(TOPOLOGY_CODES) <= set(TOPOLOGIES)


def test_a_policy_missing_from_the_kernel_is_refused_not_replaced(monkeypatch):
    from simulator.model.policies import OldestTimer

    monkeypatch.setitem(POLICIES._entries, "newest", OldestTimer)
    scenario = build_scenario(defaults={"policy": "newest"})
    profile = load_profile("seed-calibrated")
    with pytest.raises(ScenarioError, match="newest"):
        simulate(TRACE, scenario, profile, 0, engine="fast")
    log = simulate(TRACE, scenario, profile, 0)  # auto: the reference engine, saying why
    assert log.attrs["engine"].startswith("reference") and "newest" in log.attrs["engine"]


def test_auto_says_which_engine_ran(monkeypatch):
    monkeypatch.setattr(engine_module, "SMALL_RUN_PROMPTS", 0)  # (the bundled trace is a small run)
    profile = load_profile("seed-calibrated")
    assert simulate(TRACE, build_scenario(path="design-notes"), profile).attrs["engine"] == "fast"
    continuous = build_scenario(path="design-notes", overrides={"tasks.infobench.topology": "continuous"})
    assert simulate(TRACE, continuous, profile).attrs["engine"] == "fast"
    timed = build_scenario(path="design-notes", overrides={"tasks.infobench.topology": "continuous",
                                                           "tasks.infobench.queue_timeout": 30.0})
    log = simulate(TRACE, timed, profile)
    assert log.attrs["engine"] == "reference (tasks.infobench.queue_timeout)"
    with pytest.raises(ScenarioError, match="queue_timeout"):
        simulate(TRACE, timed, profile, engine="fast")


def test_continuous_engines_of_kinds_the_kernel_lacks_are_named():
    """A continuous task whose iteration costs come from the iteration or spec_decode kind
    runs on the reference engine, which says so."""
    profile = profile_from_dict({"tasks": {"x": {"resource": "gpu", "service": {
        "kind": "iteration", "step": {"base": 0.1, "per_row": 0.01}}}}})
    scenario = build_scenario(defaults={"topology": "continuous"})
    from simulator.trace.model import Call, Prompt, Trace

    trace = Trace((Call("0", 0.0, (Prompt("x"),)),))
    reason = unsupported(trace, scenario, profile)
    assert reason is not None and "continuous" in reason and "iteration" in reason
    assert simulate(trace, scenario, profile).attrs["engine"] == f"reference ({reason})"


@pytest.mark.parametrize("setting", [{"run.host_lock": True}, {"run.client": "closed:4"},
                                     {"tasks.mmlu.queue_timeout": 3.0}, {"tasks.mmlu.rows_per_prompt": 2},
                                     {"run.max_concurrent_groups": 1}, {"run.shared_rotation": ["mmlu"]},
                                     {"tasks.mmlu.batch_forming": "gpu-free"}])
def test_settings_only_the_reference_engine_models_are_named(setting):
    scenario = build_scenario(path="design-notes", overrides=setting)
    reason = unsupported(TRACE, scenario, load_profile("seed-calibrated"))
    assert reason is not None and next(iter(setting)).split(".")[-1] in reason


def test_table_interpolation_matches_scipy():
    """The table kind's own multilinear interpolation (run by both engines) is scipy's
    RegularGridInterpolator with linear extrapolation, to rounding."""
    from scipy.interpolate import RegularGridInterpolator

    rng = np.random.default_rng(3)
    grid = ((1.0, 2.0, 4.0, 8.0), (16.0, 64.0, 256.0), (10.0, 100.0))
    seconds = rng.uniform(0.5, 9.0, size=(4, 3, 2))
    table = TableService(axes=("batch_size", "max_tokens", "prompt_tokens"), grid=grid, seconds=seconds)
    scipy = RegularGridInterpolator(grid, seconds, bounds_error=False, fill_value=None)
    from simulator.profile.kinds import BatchShape

    for size, out, prompt in zip(rng.integers(1, 12, 200), rng.integers(1, 400, 200), rng.integers(1, 150, 200), strict=True):
        expected = max(float(scipy([[size, out, prompt]])[0]), table.floor)
        got = table.mean(BatchShape(int(size), int(prompt), int(out)))
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-12)


calls_strategy = st.lists(
    st.tuples(st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 13.0]),
              st.lists(st.tuples(st.sampled_from(TASKS), st.none() | st.integers(0, 900),
                                 st.none() | st.integers(0, 600)), min_size=1, max_size=5)),
    max_size=30)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls=calls_strategy, tasks=st.tuples(task_settings, task_settings, task_settings), run=run_settings,
       profile=st.sampled_from(range(len(PROFILES))), seed=st.integers(0, 3))
def test_kernel_equals_reference_on_small_traces_with_ties(calls, tasks, run, profile, seed):
    """Arrivals at shared instants (flush timers and completions landing on them too), empty
    and zero-token prompts, the empty trace."""
    from simulator.trace.model import Call, Prompt, Trace

    trace = Trace(tuple(Call(str(i), t, tuple(Prompt(task, p, m) for task, p, m in prompts))
                        for i, (t, prompts) in enumerate(sorted(calls, key=lambda c: c[0]))))
    overrides = {f"tasks.{t}.{k}": v for t, values in zip(TASKS, tasks, strict=True) for k, v in values.items()}
    overrides.update({f"run.{k}": v for k, v in run.items()})
    scenario = build_scenario(path="design-notes", overrides=overrides)
    if unsupported(trace, scenario, PROFILES[profile]) is None:
        assert_same_log(trace, scenario, PROFILES[profile], seed)


# -- the iteration and spec_decode service kinds ------------------------------------------

def _kind_profiles() -> list:
    """Bundled profiles with iteration and spec_decode tasks, and variants of them over each
    kind's options (draw distributions, finished rows, disciplines, no KV cache, engine
    blocks with and without overlap, acceptance at its ends)."""
    bundled = [load_profile(name) for name in ("a100-sxm-qwen3-4b-qwen3-0.6b-hf-eager", "cpu__tiny__tiny",
                                               "h100-sxm-llama-3.1-8b-cuda-graph")]
    base = json.loads(json.dumps(bundled[0].to_dict()))
    tasks = base["tasks"]
    iteration, spec = tasks["mmlu"]["service"], tasks["infobench"]["service"]
    assert iteration["kind"] == "iteration" and spec["kind"] == "spec_decode"
    variants = []
    for it_changes, spec_changes in (
            ({"dist": "gamma", "cv": 0.4, "finished_rows": "leave"}, {"discipline": "lockstep", "acceptance": 0.6}),
            ({"dist": "exponential", "finished_rows": "stay"}, {"kv_cache": True, "acceptance": 1.0, "view_step": 8}),
            ({"dist": "gamma", "cv": 1.3, "engine": None}, {"kv_cache": False, "acceptance": 0.4, "engine": None}),
            ({"dist": "exponential", "step": {**iteration["step"], "per_context_token": 3e-8}},
             {"discipline": "lockstep", "kv_cache": True, "acceptance": 0.0, "lookahead": 5})):
        other = json.loads(json.dumps(base))
        for service, changes in ((other["tasks"]["mmlu"]["service"], it_changes),
                                 (other["tasks"]["infobench"]["service"], spec_changes)):
            service.update({k: v for k, v in changes.items() if v is not None})
            for k in [k for k, v in changes.items() if v is None]:
                service.pop(k, None)
            if service.get("engine"):
                service["engine"]["overlap"] = not service["engine"].get("overlap", False)
        # the graph task as spec_decode too (three tasks of these kinds)
        other["tasks"]["graph"]["service"] = json.loads(json.dumps(other["tasks"]["infobench"]["service"]))
        variants.append(profile_from_dict(other))
    return bundled + variants


KIND_PROFILES = _kind_profiles()
spec_overrides = st.fixed_dictionaries(
    {}, optional={"acceptance": st.sampled_from([0.0, 0.35, 0.9, 1.0]), "lookahead": st.integers(1, 6),
                  "discipline": st.sampled_from(["ragged", "lockstep"])})


def _kind_scenario(tasks, run, spec_task, spec_defaults):
    overrides = {f"tasks.{t}.{k}": v for t, values in zip(TASKS, tasks, strict=True) for k, v in values.items()}
    overrides.update({f"run.{k}": v for k, v in run.items()})
    overrides.update({f"tasks.infobench.{k}": v for k, v in spec_task.items()})
    return build_scenario(path="design-notes", overrides=overrides, defaults=spec_defaults or None)


def _assert_same_or_reference_error(trace, scenario, profile, seed):
    reason = unsupported(trace, scenario, profile)
    if reason is None:
        assert_same_log(trace, scenario, profile, seed)
        return
    # a split CPU task without cpu_workers, or a spec_decode setting on a task of another
    # kind: the reference engine's error
    assert "cpu_workers" in reason or reason.split(".")[-1] in ("acceptance", "lookahead", "discipline")
    with pytest.raises(ScenarioError):
        simulate(trace, scenario, profile, seed)


# Micro-batched tasks only: continuous engines priced by these kinds run on the reference.
batch_task_settings = task_settings.filter(lambda t: t["topology"] != "continuous")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tasks=st.tuples(batch_task_settings, batch_task_settings, batch_task_settings), run=run_settings,
       profile=st.sampled_from(range(len(KIND_PROFILES))), seed=st.integers(0, 3), rate=st.sampled_from([1.0, 3.0]),
       spec_task=spec_overrides, spec_defaults=spec_overrides)
def test_kernel_equals_reference_with_iteration_and_spec_decode_kinds(tasks, run, profile, seed, rate, spec_task,
                                                                       spec_defaults):
    """The iteration and spec_decode kinds: the same draws from each task's stream, the same
    batch times and first tokens; the scenario's spec_decode settings (a task's own and the
    defaults) applied as the reference engine applies them."""
    scenario = _kind_scenario(tasks, run, spec_task, spec_defaults)
    _assert_same_or_reference_error(HEAD.scaled(rate), scenario, KIND_PROFILES[profile], seed)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls=calls_strategy, tasks=st.tuples(batch_task_settings, batch_task_settings, batch_task_settings), run=run_settings,
       profile=st.sampled_from(range(len(KIND_PROFILES))), seed=st.integers(0, 3), spec_task=spec_overrides)
def test_kernel_equals_reference_with_these_kinds_on_small_traces_with_ties(calls, tasks, run, profile, seed,
                                                                            spec_task):
    from simulator.trace.model import Call, Prompt, Trace

    trace = Trace(tuple(Call(str(i), t, tuple(Prompt(task, p, m) for task, p, m in prompts))
                        for i, (t, prompts) in enumerate(sorted(calls, key=lambda c: c[0]))))
    scenario = _kind_scenario(tasks, run, spec_task, {})
    _assert_same_or_reference_error(trace, scenario, KIND_PROFILES[profile], seed)


@pytest.mark.parametrize("name", ["a100-sxm-qwen3-4b-qwen3-0.6b-hf-eager", "cpu__tiny__tiny",
                                  "h100-sxm-llama-3.1-8b-cuda-graph", "h100-sxm-qwen3-8b-qwen3-0.6b-cuda-graph",
                                  "qwen3-4b-specdec-fw5"])
def test_kernel_equals_reference_on_bundled_profiles_of_these_kinds(name):
    """The bundled scenarios (less their settings only the reference engine models) and
    traces, on the bundled profiles of these kinds."""
    from simulator.settings import RUN, TASK

    profile = load_profile(name)
    ran = 0
    for scenario_name in ("design-notes", "lminference-separate-queues", "lminference-fw5"):
        base = build_scenario(path=scenario_name)
        scenario = replace(
            base, **{s.name: s.default for s in RUN.values() if s.reference_only},
            defaults=replace(base.defaults, **{s.name: s.default for s in TASK.values() if s.reference_only}),
            tasks={t: {k: v for k, v in own.items() if not TASK[k].reference_only} for t, own in base.tasks.items()})
        for trace_name in ("example", "lminference-4queues-lengths"):
            trace = load_trace(trace_name)
            ran += unsupported(trace, scenario, profile) is None
            _assert_same_or_reference_error(trace, scenario, profile, 2)
    assert ran >= 2


def test_kernel_equals_reference_with_these_kinds_on_a_real_public_trace():
    path = SHARED / "traces" / "real" / "burstgpt"
    files = sorted(path.glob("*.csv")) if path.is_dir() else []
    if not files:
        pytest.skip("../shared/traces/real/burstgpt is absent (the real public traces ship beside the repo)")
    from simulator.trace.formats import load_trace as read

    trace = read(files[0]).renamed({})
    trace = type(trace)(calls=trace.calls[:3000], meta=trace.meta, source=trace.source)
    task = trace.tasks[0]
    services = [load_profile(name).task(t).service.to_dict() for name, t in (
        ("a100-sxm-qwen3-4b-qwen3-0.6b-hf-eager", "infobench"), ("h100-sxm-llama-3.1-8b-cuda-graph", "infobench"))]
    services.append({**services[0], "discipline": "lockstep", "kv_cache": True, "acceptance": 0.7})
    for service in services:
        profile = profile_from_dict({"tasks": {t: {"resource": "gpu", "service": service} for t in trace.tasks}})
        for topology, policy, dispatch in (("shared", "oldest", "round-robin"), ("split", "adaptive", "jsq-tokens"),
                                           ("direct", "oldest", "least-loaded")):
            scenario = build_scenario(run={"gpus": 3}, tasks={task: {
                "topology": topology, "policy": policy, "dispatch": dispatch, "flush": 0.2, "max_batch": 8}})
            assert_same_log(trace, scenario, profile, 0)


def test_auto_gives_small_runs_to_the_reference_engine_until_the_kernel_pays(monkeypatch):
    """``auto`` runs a process's first prompts on the reference engine, up to
    SMALL_RUN_PROMPTS of them, then loads the kernel; once it is loaded, every run takes it.
    The log is the one the kernel gives, whichever ran."""
    takes = engine_module.auto_takes_kernel
    limit = engine_module.SMALL_RUN_PROMPTS
    assert not takes(347, 0, loaded=False) and not takes(limit, 0, loaded=False)
    assert takes(limit + 1, 0, loaded=False) and takes(1, limit, loaded=False)
    assert takes(1, 0, loaded=True)
    monkeypatch.setattr(engine_module, "_small_run_prompts", 0)
    monkeypatch.setattr(engine_module, "kernel_loaded", lambda: False)
    profile, scenario = load_profile("seed-calibrated"), build_scenario(path="design-notes")
    monkeypatch.setattr(engine_module, "SMALL_RUN_PROMPTS",
                        2 * engine_module.reference_work(TRACE.n_prompts, scenario.gpus))
    runs = [simulate(TRACE, scenario, profile, 0) for _ in range(3)]
    assert [r.attrs["engine"] for r in runs] == [engine_module.SMALL_RUN] * 2 + ["fast"]
    fast = simulate(TRACE, scenario, profile, 0, engine="fast")
    for log in runs:
        pd.testing.assert_frame_equal(log, fast, check_exact=True)


def test_a_run_over_many_gpus_is_not_small_for_the_reference_engine():
    """The reference engine's cost grows with the GPUs a dispatch scans and reports: the
    bundled trace is a small run on its 4 GPUs and not on 99,999."""
    work = engine_module.reference_work
    assert work(347, 4) == 355  # 347 prompts × (1 + 4/200), and 4/3 for the GPUs: 355.3
    assert work(347, 4) < engine_module.SMALL_RUN_PROMPTS < work(347, 99_999)
    assert work(0, 0) == 0 and work(10, 0) == 10


def test_a_process_told_of_more_than_a_small_run_takes_the_kernel_at_once(monkeypatch):
    """A sweep says how many prompts its grid holds before its first run: past
    SMALL_RUN_PROMPTS, ``auto`` takes the kernel from that run on (its forked workers
    inherit it loaded); a grid within it leaves the reference engine its small runs."""
    monkeypatch.setattr(engine_module, "_small_run_prompts", 0)
    monkeypatch.setattr(engine_module, "kernel_loaded", lambda: False)
    profile, scenario = load_profile("seed-calibrated"), build_scenario(path="design-notes")
    engine_module.expect_prompts(engine_module.SMALL_RUN_PROMPTS)
    assert simulate(TRACE, scenario, profile, 0).attrs["engine"] == engine_module.SMALL_RUN
    engine_module.expect_prompts(engine_module.SMALL_RUN_PROMPTS + 1)
    assert simulate(TRACE, scenario, profile, 0).attrs["engine"] == "fast"


# -- what lowering keeps for the next run of the same trace (a sweep's runs) -------------


def test_runs_that_reuse_kept_lowering_give_the_logs_of_runs_that_do_not(monkeypatch):
    from simulator.model import fast

    scenario = build_scenario(path="design-notes", run={"engine": "fast"})
    profile = load_profile("seed-calibrated")
    fast._KEPT.clear()
    runs = [simulate(TRACE.scaled(x), scenario, profile, seed) for x, seed in ((1, 0), (2, 0), (1, 1), (1, 0))]
    assert fast._KEPT  # the trace's arrays were kept and reused
    # the log's token columns are what is kept, read-only (editing them in place is refused),
    # its other columns copies: editing those changes no later run
    columns = engine_module.simulate_columns(TRACE, scenario, profile, 0).columns
    for name in ("prompt_tokens", "max_tokens"):
        with pytest.raises(ValueError, match="read-only"):
            columns[name][:] = 0
    for name in ("started_at", "done_at", "batch_size", "queue"):
        columns[name][:] = 0
    again = simulate(TRACE, scenario, profile, 0)
    for (x, seed), log in zip(((2, 0), (1, 1), (1, 0), (1, 0)), [*runs[1:], again], strict=True):
        fast._KEPT.clear()
        pd.testing.assert_frame_equal(log, simulate(TRACE.scaled(x), scenario, profile, seed))


def test_what_lowering_keeps_is_bounded_in_bytes(monkeypatch):
    from simulator.model import fast

    scenario = build_scenario(path="design-notes", run={"engine": "fast"})
    profile = load_profile("seed-calibrated")
    from simulator.memo import array_bytes

    fast._KEPT.clear()
    monkeypatch.setattr(fast._KEPT, "max_bytes", 20_000)
    for seed in range(4):
        simulate(TRACE, scenario, profile, seed)
        assert fast._KEPT.nbytes == sum(array_bytes(v) + array_bytes(s) for s, v in fast._KEPT.items())
        assert fast._KEPT.nbytes <= 20_000 or len(fast._KEPT) == 1


def test_more_batches_in_flight_than_the_kernel_first_holds_grow_its_working_slots():
    """Hundreds of batches at once on one processor-sharing GPU (a worker each), then a CPU
    task with no worker limit: past the kernel's first working slots, which it then grows;
    the log is the reference engine's."""
    from simulator.model.batch_kernel import FIRST_SLOTS
    from simulator.trace.model import Call, Prompt, Trace

    n = 3 * FIRST_SLOTS
    trace = Trace(tuple(Call(f"c{i}", i * 1e-3, (Prompt("infobench"), Prompt("graph"))) for i in range(n)))
    scenario = build_scenario(path="design-notes", run={"gpus": 1, "gpu_sharing": "processor-sharing"},
                              tasks={"infobench": {"workers": n, "max_batch": 1, "flush": 0.0}})
    log = assert_same_log(trace, scenario, PROFILES[0], 0)
    assert log is not None
    started, done, batch = (log[c].to_numpy() for c in ("started_at", "done_at", "batch_id"))
    in_flight = max(len(set(batch[(started <= t) & (done > t)].tolist())) for t in started)  # batches at once
    assert in_flight > FIRST_SLOTS


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=40), st.permutations(["a", "b", "c", "d"]))
def test_one_prompt_calls_are_grouped_as_the_pass_over_calls_groups_them(task_of, order):
    # Lowering takes each one-prompt call as one group of its prompt without the pass over
    # the calls (group_prompts): the same arrays as that pass makes, whatever the tasks and
    # the scenario's group order.
    from simulator.model.batch_kernel import group_prompts
    from simulator.model.fast import _groups
    from simulator.trace.model import TraceColumns

    n = len(task_of)
    cols = TraceColumns(call_t=np.zeros(n), call_ids=np.array([f"c{i}" for i in range(n)], dtype=str),
                        call_of=np.arange(n), prompt_index=np.zeros(n), task_names=("a", "b", "c", "d"),
                        task_of=np.array(task_of), prompt_tokens=np.full(n, -1), max_tokens=np.zeros(n))
    assert cols.one_prompt_a_call()
    rank = np.array([order.index(t) for t in cols.task_names], dtype=np.int64)
    call_start = np.arange(n + 1, dtype=np.int64)
    expected = group_prompts.py_func(call_start, cols.task_of, rank, 4)
    got = _groups(cols, tuple(order))
    for a, b in zip(got, expected, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
