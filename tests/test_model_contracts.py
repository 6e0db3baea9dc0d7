"""Contract tests over the registries: every topology, policy, dispatch rule, sharing mode and
batch selection rule (with length buckets) keeps the invariants, on traces that hypothesis generates.

* every prompt of every call is in the log exactly once, and is served unless a queue
  limit turned it away (rejected only with ``max_queue``, dropped only with a dropping
  ``queue_timeout``);
* nothing happens before it may: arrived_at <= batched_at <= started_at <= first_token_at
  <= done_at;
* no batch exceeds max batch (continuous: the running batch never exceeds max_num_seqs, so
  neither does an admission group), and a batch's recorded size is its number of prompts;
* with exclusive GPUs, no GPU serves two static batches at once;
* a closed-loop client never has more than N calls outstanding;
* with flush 0 and max batch 1 on a shared queue, no prompt waits while a GPU is idle;
* same seed, same event log.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from helpers import make_trace
from hypothesis import HealthCheck, given, settings, strategies as st

from simulator.events import SERVED, STATUSES
from simulator.model import DISPATCH_RULES, GPU_SHARING, POLICIES, TOPOLOGIES, simulate
from simulator.model.dispatch import PREFIX_RULES
from simulator.model.length import SELECTIONS
from simulator.profile import profile_from_dict
from simulator.scenario import build_scenario

# 128 tokens out (not the default 256): the continuous engine steps once per token, and 128
# still outgrows 40 or 70 KV blocks of 16 tokens with two or three 256-token prompts running,
# so admission, preemption and recompute all still happen, in half the iterations.
PROFILE = profile_from_dict({"tasks": {name: {"max_tokens": 128, **task} for name, task in {
    "x": {"resource": "gpu", "service": {"kind": "distribution", "dist": "exponential",
                                         "mean": {"base": 1.0, "per_prompt": 0.5}}},
    "y": {"resource": "gpu", "service": {"kind": "distribution", "dist": "gamma", "cv": 0.5,
                                         "mean": 2.0}},
    "z": {"resource": "cpu", "service": {"kind": "distribution", "dist": "deterministic",
                                         "mean": 0.3}},
}.items()}})
#: the same costs, with GPU work holding a shared host lock part of the time (host_lock runs)
HOST_PROFILE = profile_from_dict({"tasks": {
    name: {**task.to_dict(), **({"host_fraction": f} if task.resource == "gpu" else {})}
    for (name, task), f in zip(PROFILE.tasks.items(), (0.7, 0.3, 0.0), strict=True)}})

calls = st.lists(
    st.tuples(
        st.floats(min_value=0, max_value=60, allow_nan=False).map(lambda t: round(t, 1)),
        st.lists(st.sampled_from(["x", "y", "z"]), min_size=1, max_size=8),
    ),
    min_size=1, max_size=25,
).map(lambda cs: sorted(cs, key=lambda c: c[0]))

task_settings = st.fixed_dictionaries({
    "topology": st.sampled_from(TOPOLOGIES.names()),
    "policy": st.sampled_from(POLICIES.names()),
    # (the prefix rules need traces with prefix ids and prefix caching: tests/test_prefix_cache.py)
    "dispatch": st.sampled_from([name for name in DISPATCH_RULES.names() if name not in PREFIX_RULES]),
    "flush": st.sampled_from([0.0, 0.5, 3.0]),
    "max_batch": st.integers(1, 5),
    "workers": st.sampled_from([None, 1, 2, 3]),
    "priority": st.integers(0, 2),
    "max_queue": st.sampled_from([None, None, 2, 6]),
    "queue_timeout": st.sampled_from([None, None, 1.0, 4.0]),
    "timeout_action": st.sampled_from(["drop", "send"]),
    "max_num_seqs": st.sampled_from([1, 3, 256]),
    "max_batched_tokens": st.sampled_from([300, 8192]),
    "kv_blocks": st.sampled_from([None, 40, 70]),
    "batch_selection": st.sampled_from(SELECTIONS.names()),
    "length_buckets": st.sampled_from([1, 1, 2]),
    # (read by disaggregated only)
    "kv_bytes_per_token": st.just(131_072),
    "kv_link": st.sampled_from(["nvlink", "infiniband", "pcie"]),
    "kv_link_latency": st.sampled_from([0.0, 0.5]),
})
#: Topologies of continuous-batching engines (running batch bounded by max_num_seqs).
ENGINES = ("continuous", "disaggregated")


def _check_invariants(log: pd.DataFrame, trace, per_task: dict, sharing: str, client: str = "open") -> None:
    # Every prompt of every call exactly once.
    expected = {(ci, pi) for ci, c in enumerate(trace.calls) for pi in range(len(c.prompts))}
    seen = list(zip(log["call_index"], log["prompt_index"], strict=True))
    assert len(seen) == len(set(seen)) == len(expected)
    assert set(seen) == expected
    served = log["status"].isin(SERVED)
    assert set(log["status"]) <= set(STATUSES)
    assert np.isfinite(log.loc[served, "done_at"]).all()
    away = log[~served]
    assert away[["batched_at", "started_at", "first_token_at", "done_at"]].isna().all().all()
    assert (away["batch_id"] == -1).all()
    for task, cfg in per_task.items():
        status = log.loc[log["task"] == task, "status"]
        if cfg.get("max_queue") is None:
            assert not (status == "rejected").any()
        if cfg.get("queue_timeout") is None:
            assert not status.isin(["dropped", "sent_after_timeout"]).any()
        elif cfg.get("timeout_action") == "send":
            assert not (status == "dropped").any()
        if cfg.get("topology") not in ENGINES:
            assert (log.loc[log["task"] == task, "preemptions"] == 0).all()
    log = log[served]
    # Causality.
    assert (log["batched_at"] >= log["arrived_at"]).all()
    assert (log["started_at"] >= log["batched_at"]).all()
    assert (log["first_token_at"] > log["started_at"]).all()
    assert (log["done_at"] >= log["first_token_at"]).all()
    # Batch sizes.
    sizes = log.groupby("batch_id").size()
    recorded = log.groupby("batch_id")["batch_size"].first()
    assert (sizes == recorded).all()
    for task, cfg in per_task.items():
        rows = log[log["task"] == task]
        limit = cfg["max_num_seqs"] if cfg.get("topology") in ENGINES else cfg["max_batch"]
        assert (rows["batch_size"] <= limit).all()
        assert rows.groupby("batch_id")["task"].nunique().eq(1).all()
    # A closed loop keeps at most N calls outstanding.
    if client != "open":
        n = int(client.split(":")[1])
        calls = log.groupby("call_index").agg(a=("arrived_at", "min"), d=("done_at", "max"))
        for t in calls["a"]:
            assert ((calls["a"] <= t) & (calls["d"] > t)).sum() <= n
    # Exclusive GPUs serve one static batch at a time.
    static = log[log["task"].map(lambda t: per_task[t].get("topology") not in ENGINES).astype(bool)]
    on_gpus = static[static["gpu"].notna()]
    if sharing == "exclusive" and not on_gpus.empty:
        batches = on_gpus.groupby("batch_id").agg(
            gpu=("gpu", "first"), s=("started_at", "first"), e=("done_at", "first"))
        for _, b in batches.groupby("gpu"):
            b = b.sort_values("s")
            assert (b["s"].to_numpy()[1:] >= b["e"].to_numpy()[:-1] - 1e-9).all()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    calls=calls,
    x=task_settings, y=task_settings, z=task_settings,
    gpus=st.integers(1, 3),
    sharing=st.sampled_from(GPU_SHARING.names()),
    cpu_workers=st.sampled_from([None, 1, 2]),
    client=st.sampled_from(["open", "open", "closed:2", "closed:3:0.5"]),
    host_lock=st.booleans(),
    rotation=st.sampled_from([[], ["x", "z"], ["x", "y", "z"]]),
    seed=st.integers(0, 2**16),
)
def test_every_configuration_keeps_the_invariants(calls, x, y, z, gpus, sharing, cpu_workers, client, host_lock,
                                                  rotation, seed):
    trace = make_trace(calls)
    if client != "open":
        # Static batching without a timeout can wait forever for a closed loop's next call
        # (a stall the model reports: test_static_batching_stall_is_a_clear_error).
        x, y, z = ({**t, "flush": 0.5} if t["policy"] == "static" and t["flush"] == 0 else t for t in (x, y, z))
    z = dict(z, cpu_workers=cpu_workers)
    if z["topology"] == "split" and cpu_workers is None:
        z["cpu_workers"] = 2  # split on the CPU needs a finite pool (its own error test below)
    if z["topology"] == "disaggregated":
        z["topology"] = "continuous"  # (GPU pools: a CPU task cannot split them)
    if "disaggregated" in (x["topology"], y["topology"]):
        gpus = max(gpus, 2)  # a prefill GPU and a decode GPU at least
    scenario = build_scenario(run={"gpus": gpus, "gpu_sharing": sharing, "client": client, "host_lock": host_lock,
                                   "shared_rotation": rotation},
                              tasks={"x": x, "y": y, "z": z})
    profile = HOST_PROFILE if host_lock else PROFILE
    log = simulate(trace, scenario, profile, seed)
    _check_invariants(log, trace, {"x": x, "y": y, "z": z}, sharing, client)
    again = simulate(trace, scenario, profile, seed)
    pd.testing.assert_frame_equal(log, again)


@settings(max_examples=40, deadline=None)
@given(calls=calls, gpus=st.integers(1, 3), policy=st.sampled_from([p for p in POLICIES.names() if p != "static"]),
       seed=st.integers(0, 2**16))
def test_flush_zero_max_batch_one_never_holds_a_prompt_while_a_gpu_idles(calls, gpus, policy, seed):
    trace = make_trace([(t, ["x"] * len(tasks)) for t, tasks in calls])
    scenario = build_scenario(defaults={"flush": 0.0, "max_batch": 1, "policy": policy},
                              run={"gpus": gpus})
    log = simulate(trace, scenario, PROFILE, seed)
    busy = {g: list(zip(b["started_at"], b["done_at"], strict=True))
            for g, b in log.groupby("gpu")[["started_at", "done_at"]]}
    waited = log[log["started_at"] > log["arrived_at"]]
    for a, s in zip(waited["arrived_at"], waited["started_at"], strict=True):
        # Every GPU must be busy throughout (a, s): check at a few instants inside it.
        for t in np.linspace(a, s, 7)[1:-1]:
            for g in range(gpus):
                assert any(b0 <= t < b1 for b0, b1 in busy.get(g, [])), (g, t)


def test_static_batching_stall_is_a_clear_error():
    import pytest

    from simulator.errors import ScenarioError

    scenario = build_scenario(defaults={"policy": "static", "max_batch": 3}, run={"client": "closed:2", "gpus": 1})
    with pytest.raises(ScenarioError, match="stalled: 2 prompt"):
        simulate(make_trace([(0, ["x"])] * 5), scenario, PROFILE, 0)


def test_split_on_an_unlimited_cpu_pool_is_a_clear_error():
    import pytest

    from simulator.errors import ScenarioError

    scenario = build_scenario(tasks={"z": {"topology": "split"}})
    with pytest.raises(ScenarioError, match="cpu_workers"):
        simulate(make_trace([(0, ["z"])]), scenario, PROFILE, 0)


def test_different_seeds_give_different_service_times():
    trace = make_trace([(i, ["x", "y"]) for i in range(20)])
    scenario = build_scenario()
    a = simulate(trace, scenario, PROFILE, 1)
    b = simulate(trace, scenario, PROFILE, 2)
    assert not np.allclose(a["done_at"], b["done_at"])


def test_changing_one_task_leaves_other_tasks_service_draws_alone():
    # Service streams are per task: y's service times do not move when x's setup changes.
    trace = make_trace([(10 * i, ["x", "y"]) for i in range(20)])
    base = simulate(trace, build_scenario(run={"gpus": 4}), PROFILE, 5)
    other = simulate(trace, build_scenario(run={"gpus": 4}, tasks={"x": {"max_batch": 1, "flush": 2.0}}), PROFILE, 5)
    y0 = base[base["task"] == "y"]
    y1 = other[other["task"] == "y"]
    np.testing.assert_allclose((y0["done_at"] - y0["started_at"]).to_numpy(),
                               (y1["done_at"] - y1["started_at"]).to_numpy())
