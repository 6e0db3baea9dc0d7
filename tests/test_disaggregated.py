"""Disaggregated prefill and decode (``disaggregated``): exact limits from the profile's step
costs, hand-computed timelines of KV transfers, invariants, and its errors."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error, run, timeline
from typer.testing import CliRunner

import simulator as sim
from simulator.cli import app
from simulator.errors import ScenarioError
from simulator.metrics import summarize
from simulator.model import simulate
from simulator.model.topologies.disaggregated import LINKS
from simulator.profile import profile_from_dict
from simulator.profile.iteration import step_cost
from simulator.scenario import build_scenario
from simulator.serve.runtime import check_served
from simulator.trace.model import Call, Prompt, Trace

ROOT = Path(__file__).resolve().parent.parent
LLAMA_KV = 131_072  # Llama-3.1-8B: 32 layers x 8 KV heads x 128 dims x (K, V) x 2 bytes


def iteration_profile(prompt_tokens: int = 100, **kv) -> object:
    """Iteration = 1 + 0.5·rows + 0.01·prefill tokens, deterministic."""
    return profile_from_dict({"tasks": {"x": {
        "resource": "gpu", "prompt_tokens": prompt_tokens, "max_tokens": 4, **kv,
        "service": {"kind": "iteration", "dist": "deterministic",
                    "step": {"base": 1.0, "per_row": 0.5, "per_prefill_token": 0.01}}}}})


def token_trace(calls: list[tuple[float, list[int]]]) -> Trace:
    """Calls of ``x`` prompts given by their max tokens."""
    return Trace(tuple(Call(str(i), float(t), tuple(Prompt("x", max_tokens=m) for m in ms))
                       for i, (t, ms) in enumerate(calls)))


def disaggregated(trace: Trace, profile, gpus: int = 2, **settings) -> object:
    settings.setdefault("kv_bytes_per_token", 1000)
    return run(trace, profile, gpus=gpus, topology="disaggregated", **settings)


# -- (a) exact limits from the profile ------------------------------------------------------

def test_unlimited_bandwidth_one_prompt_ttft_is_the_prefill_step_and_tpot_the_decode_steps():
    """One prompt on 1P1D with an infinitely fast link: TTFT is the prefill iteration the
    profile prices, each later token one decode step of one row at its context."""
    profile = sim.load_profile("h100-sxm-llama-3.1-8b-cuda-graph")
    task = profile.tasks["infobench"]
    cost = step_cost(task, task.service)
    rng = np.random.default_rng(0)  # (deterministic: no draw is used)
    ptoks, mtoks = 2000, 50
    trace = Trace((Call("0", 3.0, (Prompt("infobench", prompt_tokens=ptoks, max_tokens=mtoks),)),))
    log = run(trace, profile, gpus=2, topology="disaggregated", kv_bytes_per_token=LLAMA_KV,
              kv_link_gbps=1e300)
    row = log.iloc[0]
    prefill = cost.step(0, [ptoks], 0, rng, 0)
    decode = [cost.step(1, [], ptoks + made, rng, ptoks + mtoks) for made in range(1, mtoks)]
    assert row["first_token_at"] - row["arrived_at"] == pytest.approx(prefill, rel=1e-12)
    assert row["done_at"] - row["first_token_at"] == pytest.approx(sum(decode), rel=1e-9)
    assert row["transfer_s"] == pytest.approx(0.0, abs=1e-15)
    # the summary's token figures read these instants unchanged
    summary = summarize(log)
    figures = summary["tasks"]["infobench"]
    assert figures["ttft"]["p50"] == pytest.approx(prefill, rel=1e-9)
    assert figures["tpot"]["p50"] == pytest.approx(sum(decode) / (mtoks - 1), rel=1e-9)


# -- (b) one transfer by hand -------------------------------------------------------------

def test_hand_timeline_of_one_transfer_over_a_finite_link():
    """Prompts of 100 tokens, 1000 KV bytes a token, a link of 1e-6 GB/s (1000 B/s) and 2 s
    of latency: a transfer takes 101 s + 2 s = 103 s. One prompt of 3 tokens at t=1 on 1P1D:

    t=1    prefill alone: 1 + 0.5 + 0.01·100 = 2.5 -> first token at 3.5; leaves GPU 0
    t=3.5  transfer 103 s -> joins GPU 1 at 106.5, admitted at once as a decoding row
    t=106.5  1 + 0.5 = 1.5 -> 108 (2nd token); 1.5 -> 109.5 (3rd, done)
    """
    log = disaggregated(token_trace([(1, [3])]), iteration_profile(), kv_link_gbps=1e-6, kv_link_latency=2.0)
    assert timeline(log, "first_token_at") == [("0.0", 3.5)]
    assert timeline(log, "transfer_s") == [("0.0", 103.0)]
    assert timeline(log) == [("0.0", 109.5)]
    assert list(log["prefill_gpu"]) == [0] and list(log["decode_gpu"]) == [1] and list(log["gpu"]) == [1]


def test_named_link_bandwidths():
    """``kv_link`` sets the bandwidth: 101 tokens x 1e9 bytes over each link's GB/s."""
    for link, gbps in LINKS.items():
        log = disaggregated(token_trace([(0, [2])]), iteration_profile(), kv_link=link, kv_bytes_per_token=10**9)
        assert log["transfer_s"].iloc[0] == pytest.approx(101 / gbps, rel=1e-12)


def test_profile_kv_bytes_per_token_is_used_and_the_setting_overrides_it():
    kv = {"kv_cache": {"memory_gib": 10.0, "bytes_per_token": 2000}}
    trace = token_trace([(0, [2])])
    scenario = build_scenario(run={"gpus": 2}, defaults={"topology": "disaggregated", "kv_link_gbps": 1e-6})
    assert simulate(trace, scenario, iteration_profile(**kv))["transfer_s"].iloc[0] == pytest.approx(202.0)
    log = disaggregated(trace, iteration_profile(**kv), kv_link_gbps=1e-6, kv_bytes_per_token=500)
    assert log["transfer_s"].iloc[0] == pytest.approx(50.5)


# -- (c) prefill of one prompt overlaps decode of another ---------------------------------

def test_second_prefill_overlaps_first_decode_on_other_gpus():
    """1P1D, unlimited link. a(t=0, 4 tokens), b(t=3, 3 tokens); prompts of 100 tokens.

    GPU 0: t=0 prefill a: 2.5 -> 2.5; t=3 prefill b: 2.5 -> 5.5
    GPU 1: t=2.5 a joins: 1.5 -> 4 (a 2), 1.5 -> 5.5 (a 3);
           t=5.5 b joins the same boundary: a and b decode: 1 + 1 = 2 -> 7.5 (a 4 done, b 2);
           b alone: 1.5 -> 9 (b 3 done)
    """
    log = disaggregated(token_trace([(0, [4]), (3, [3])]), iteration_profile(), kv_link_gbps=1e300)
    assert timeline(log, "first_token_at") == [("0.0", 2.5), ("1.0", 5.5)]
    assert timeline(log) == [("0.0", 7.5), ("1.0", 9.0)]
    # b's prefill ran (3 to 5.5) while a decoded on the other GPU (2.5 to 7.5)
    a, b = log.iloc[0], log.iloc[1]
    assert b["started_at"] < a["done_at"] and b["prefill_gpu"] != a["decode_gpu"]


def test_aggregated_engine_makes_them_wait_for_each_other():
    """The same prompts on one continuous engine: b's prefill joins a's decoding iterations
    (the interference disaggregation removes): a at 2.5, 4, then 5.5 with b admitted
    (1 + 1 + 1 = 3 -> 7: a 4 done, b 1)."""
    log = run(token_trace([(0, [4]), (3, [3])]), iteration_profile(), gpus=1, topology="continuous")
    assert timeline(log, "first_token_at") == [("0.0", 2.5), ("1.0", 7.0)]


# -- (d) invariants ---------------------------------------------------------------------

def test_every_prompt_once_and_one_token_prompts_never_transferred():
    rng = np.random.default_rng(7)
    calls = [(float(t), [int(m) for m in rng.integers(1, 6, size=rng.integers(1, 5))])
             for t in np.sort(rng.uniform(0, 40, 30))]
    log = disaggregated(token_trace(calls), iteration_profile(), gpus=5, prefill_gpus=2,
                        kv_link="infiniband", kv_blocks=40, block_size=16, max_num_seqs=3, dispatch="jsq-tokens")
    n = sum(len(ms) for _, ms in calls)
    assert len(log) == n and (log["status"] == "served").all()
    assert not log[["call_index", "prompt_index"]].duplicated().any()
    one = log["max_tokens"] == 1
    assert one.any() and (~one).any()
    assert log.loc[one, "decode_gpu"].isna().all() and log.loc[one, "transfer_s"].isna().all()
    assert (log.loc[one, "done_at"] == log.loc[one, "first_token_at"]).all()
    assert (log.loc[one, "gpu"] == log.loc[one, "prefill_gpu"]).all()
    many = log[~one]
    assert many["prefill_gpu"].isin([0, 1]).all() and many["decode_gpu"].isin([2, 3, 4]).all()
    assert (many["gpu"] == many["decode_gpu"]).all()
    assert (many["done_at"] >= many["first_token_at"] + many["transfer_s"]).all()
    again = disaggregated(token_trace(calls), iteration_profile(), gpus=5, prefill_gpus=2,
                          kv_link="infiniband", kv_blocks=40, block_size=16, max_num_seqs=3, dispatch="jsq-tokens")
    assert log.equals(again)


def test_decode_kv_cache_preempts_and_recomputes_there():
    """A small decode cache: transferred rows are preempted and recomputed on the decode
    GPU, yet every prompt finishes, with its first token from the prefill side."""
    log = disaggregated(token_trace([(0, [30, 30, 30])]), iteration_profile(prompt_tokens=10),
                        kv_blocks=8, block_size=8, kv_link_gbps=1e300)
    assert (log["status"] == "served").all() and log["preemptions"].sum() > 0
    assert (log["done_at"] > log["first_token_at"]).all()


# -- (e) errors ---------------------------------------------------------------------------

@pytest.mark.parametrize(("gpus", "prefill_gpus"), [(2, 2), (3, 5), (1, 1)])
def test_prefill_pool_must_leave_a_decode_gpu(gpus, prefill_gpus):
    with pytest.raises(ScenarioError, match="prefill_gpus") as err:
        disaggregated(token_trace([(0, [2])]), iteration_profile(), gpus=gpus, prefill_gpus=prefill_gpus)
    assert "\n" not in str(err.value)


def test_missing_kv_bytes_per_token_names_the_setting():
    scenario = build_scenario(run={"gpus": 2}, defaults={"topology": "disaggregated"})
    with pytest.raises(ScenarioError, match="kv_bytes_per_token"):
        simulate(token_trace([(0, [2])]), scenario, iteration_profile())


def test_bad_link_name_names_the_field():
    with pytest.raises(ScenarioError, match="kv_link.*nvlink, infiniband or pcie"):
        build_scenario(defaults={"topology": "disaggregated", "kv_link": "ethernet"})


def test_cli_errors_are_one_line(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["replay", "example", "-c", "design-notes", "--topology", "disaggregated",
                                 "--gpus", "2", "--prefill-gpus", "2"])
    assert_one_line_error(result, "prefill_gpus")
    result = runner.invoke(app, ["replay", "example", "-c", "design-notes", "--topology", "disaggregated",
                                 "--gpus", "2", "--kv-link", "carrier-pigeon"])
    assert_one_line_error(result, "--kv-link", "nvlink")


def test_serve_refuses_the_topology():
    scenario = build_scenario(defaults={"topology": "disaggregated"})
    with pytest.raises(ScenarioError, match="topology") as err:
        check_served(scenario, ["x"])
    assert "\n" not in str(err.value)


def test_the_compiled_kernel_refuses_it():
    from simulator.model.fast import unsupported

    scenario = build_scenario(run={"gpus": 2}, defaults={"topology": "disaggregated", "kv_bytes_per_token": 1})
    assert unsupported(token_trace([(0, [2])]), scenario, iteration_profile()) == "tasks.x.topology = 'disaggregated'"
    with pytest.raises(ScenarioError, match="fast engine"):
        simulate(token_trace([(0, [2])]), scenario, iteration_profile(), engine="fast")


def test_prefill_gpus_is_a_sweep_axis(tmp_path):
    runner = CliRunner()
    out = tmp_path / "pd.parquet"
    result = runner.invoke(app, ["sweep", "example", "-c", "design-notes", "--task", "infobench", "--gpus", "4",
                                 "--topology", "disaggregated", "--prefill-gpus", "1,3",
                                 "--set", "tasks.infobench.kv_bytes_per_token=131072",
                                 "--metric", "infobench.ttft.p50", "-o", str(out)])
    assert result.exit_code == 0, result.output
    import pandas as pd

    rows = pd.read_parquet(out)
    assert sorted(rows["prefill_gpus"].tolist()) == [1, 3]
    assert rows["tasks.infobench.ttft.p50"].nunique() == 2


# -- the benchmark's quick mode -------------------------------------------------------------

@pytest.mark.benchmark
def test_benchmark_quick_mode():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "disaggregation.py"), "--quick", "--json"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["rows"]
    assert {r["layout"] for r in rows} >= {"aggregated", "1P3D"}
    for r in rows:
        assert r["completed"] == r["prompts"] and math.isfinite(r["ttft_p50"])


def test_plan_searches_the_split_and_skips_counts_without_a_decode_gpu():
    """A plan over prefill_gpus 1 and 2: at 2 GPUs only 1P1D exists, at 1 GPU none (not an
    error: that count cannot hold the layout)."""
    result = CliRunner().invoke(app, ["plan", "example", "-c", "design-notes", "--task", "infobench",
                                      "--topology", "disaggregated", "--prefill-gpus", "1,2",
                                      "--set", "tasks.infobench.kv_bytes_per_token=131072",
                                      "--slo", "infobench.latency.p95<=180"])
    assert result.exit_code == 0, result.output
    assert "2 GPU: 1/1 met" in result.output and "1 GPU: 0/0 met" in result.output
