"""Sweeps (parallel, resumable, on Dask), compare, and the capacity planner."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import pickle
import signal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import assert_one_line_error
from hypothesis import given, settings, strategies as st
from theory import mmc_wait
from typer.testing import CliRunner

import simulator.sweep as sweep_mod
from simulator.cli import app
from simulator.plan import PlanError, parse_slo, plan
from simulator.profile import load_profile, profile_from_dict
from simulator.scenario import build_scenario
from simulator.sweep import Base, SweepError, SweepSpec, aggregate, read_results, run_sweep
from simulator.trace.formats import load_trace
from simulator.trace.synth import SynthSpec, synthesize

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "traces" / "batch_arrivals.json"
runner = CliRunner()


@pytest.fixture(scope="module")
def base() -> Base:
    return Base(load_trace(TRACE), load_profile("seed-calibrated"), build_scenario())


SPEC = SweepSpec({"flush": (0.0, 2.0), "topology": ("shared", "split"), "gpus": (1, 2)}, seeds=(0, 1))


def test_sweep_rows_are_the_replays_of_each_configuration(tmp_path, base):
    result = run_sweep(SPEC, base, tmp_path / "s.parquet", workers=2)
    assert (result.ran, result.skipped, len(result.frame)) == (16, 0, 16)
    frame, meta = read_results(tmp_path / "s.parquet")
    assert meta["hashes"] == base.hashes()
    row = frame[(frame.flush == 2.0) & (frame.topology == "split") & (frame.gpus == 1) & (frame.seed == 1)].iloc[0]
    # the same configuration through replay() gives the same figures
    from simulator import replay

    scenario = build_scenario(run={"gpus": 1}, tasks={t: {"flush": 2.0, "topology": "split"}
                                                      for t in ("mmlu", "infobench")})
    direct = replay(base.trace, scenario, base.profile, seed=1).summary
    assert row["tasks.infobench.latency.p95"] == direct["tasks"]["infobench"]["latency"]["p95"]
    assert row["gpus.0.utilization"] == direct["gpus"][0]["utilization"]
    assert row["tasks.graph.latency.mean"] == direct["tasks"]["graph"]["latency"]["mean"]


def test_interrupted_sweep_resumes_to_the_same_file(tmp_path, base, monkeypatch):
    clean = run_sweep(SPEC, base, tmp_path / "clean.parquet", workers=1).frame
    real = sweep_mod.run_job
    calls = {"n": 0}

    def flaky(job, task, b=None):
        calls["n"] += 1
        if calls["n"] == 7:
            raise RuntimeError("machine went away")
        return real(job, task, b)

    monkeypatch.setattr(sweep_mod, "run_job", flaky)
    out = tmp_path / "resumed.parquet"
    with pytest.raises(RuntimeError):
        run_sweep(SPEC, base, out, workers=1)
    partial, _ = read_results(out)
    assert len(partial) == 6              # everything finished before the failure was kept
    monkeypatch.setattr(sweep_mod, "run_job", real)
    again = run_sweep(SPEC, base, out, workers=1)
    assert (again.ran, again.skipped) == (10, 6)
    pd.testing.assert_frame_equal(again.frame, clean)
    pd.testing.assert_frame_equal(read_results(out)[0], clean)


#: Set while a test wants a Ctrl-C sent to itself as the sweep forks a worker.
_CTRL_C_AT_FORK = {"armed": False}


def _ctrl_c_after_fork() -> None:
    if _CTRL_C_AT_FORK["armed"]:
        _CTRL_C_AT_FORK["armed"] = False
        os.kill(os.getpid(), signal.SIGINT)


def test_a_ctrl_c_while_the_workers_fork_stops_the_sweep(tmp_path, base):
    # A Ctrl-C handled inside an at-fork hook used to be printed ("Exception ignored") and
    # lost: the sweep went on and exited 0. The hook here sends it at exactly that moment.
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("Python's own Ctrl-C handler is not installed in this test process")
    if not hasattr(os, "register_at_fork") or "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("workers are not forked here")
    if not _CTRL_C_AT_FORK.setdefault("registered", False):
        os.register_at_fork(after_in_parent=_ctrl_c_after_fork)
        _CTRL_C_AT_FORK["registered"] = True
    _CTRL_C_AT_FORK["armed"] = True
    try:
        with pytest.raises(sweep_mod.SweepInterrupted) as stopped:
            run_sweep(SPEC, base, tmp_path / "s.parquet", workers=2)
    finally:
        _CTRL_C_AT_FORK["armed"] = False
    assert stopped.value.total == 16 and stopped.value.kept < 16
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Python's handler is back


def test_a_journal_left_by_a_killed_sweep_is_picked_up(tmp_path, base):
    out = tmp_path / "s.parquet"
    run_sweep(SweepSpec({"flush": (0.0,)}), base, out, workers=1)
    store = sweep_mod.ResultStore(out, {"format": "simctl-sweep/1", "hashes": base.hashes(), "task": None,
                                        "axes": ["flush"]})
    job = SweepSpec({"flush": (5.0,)}).jobs()[0]
    store.add(sweep_mod.run_job(job, None, base))      # journal written, never closed: a kill
    store._handle.close()
    result = run_sweep(SweepSpec({"flush": (0.0, 5.0)}), base, out, workers=1)
    assert (result.ran, result.skipped) == (0, 2)


def test_results_of_another_trace_are_refused(tmp_path, base):
    out = tmp_path / "s.parquet"
    run_sweep(SweepSpec({"flush": (0.0,)}), base, out, workers=1)
    other = Base(base.trace.scaled(2.0), base.profile, base.scenario)
    with pytest.raises(SweepError, match="different trace"):
        run_sweep(SweepSpec({"flush": (0.0,)}), other, out, workers=1)
    assert len(read_results(out)[0]) == 1


def test_sweep_on_a_dask_cluster_gives_the_local_rows(tmp_path, base):
    distributed = pytest.importorskip("distributed", reason="dask.distributed is the optional 'cluster' extra")
    spec = SweepSpec({"flush": (0.0, 2.0), "gpus": (1, 2)})
    local = run_sweep(spec, base, tmp_path / "local.parquet", workers=1).frame
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster:
        remote = run_sweep(spec, base, tmp_path / "dask.parquet", cluster=cluster.scheduler_address).frame
    pd.testing.assert_frame_equal(remote, local)


def test_confidence_intervals_over_seeds():
    frame = pd.DataFrame({"flush": [0.0] * 4 + [1.0] * 4, "m": [1.0, 2.0, 3.0, 4.0, 5.0, 5.0, 5.0, 5.0]})
    agg = aggregate(frame, "m", ["flush"])
    first = agg.iloc[0]
    assert first["mean"] == 2.5 and first["n"] == 4
    assert first["ci95"] == pytest.approx(3.182446 * np.std([1, 2, 3, 4], ddof=1) / 2, rel=1e-5)
    assert agg.iloc[1]["ci95"] == 0


def test_aggregated_cells_are_in_the_order_axis_order_sorts_them():
    # Axes holding numbers, names and absent values (an axis a topology ignores) side by side,
    # in a scrambled order: the cells come out as sorting their values by axis_order puts them.
    from simulator.sweep import axis_order

    rng = np.random.default_rng(3)
    flush = [0.5, None, 2.0, 0.25, math.nan, 10.0]
    topology = ["split", "shared", "continuous"]
    gpus = [3, 1, 2]
    cells = [(f, t, g) for f in flush for t in topology for g in gpus]
    picked = [cells[i] for i in rng.permutation(len(cells))]
    frame = pd.DataFrame({"flush": pd.Series([f for f, _, _ in picked], dtype=object),
                          "topology": [t for _, t, _ in picked], "gpus": [g for _, _, g in picked],
                          "m": rng.random(len(picked))})
    agg = aggregate(frame, "m", ["flush", "topology", "gpus"])
    got = list(zip(agg["flush"], agg["topology"], agg["gpus"], strict=True))
    order = [tuple(axis_order(v) for v in cell) for cell in got]
    assert order == sorted(order) and len(got) == len(picked) - len(topology) * len(gpus)  # (None, NaN: one cell)
    assert got[0] == (0.25, "continuous", 1) and got[-1][1:] == ("split", 3) and pd.isna(got[-1][0])


def test_sweep_and_compare_cli(tmp_path):
    out = tmp_path / "s.parquet"
    result = runner.invoke(app, ["sweep", str(TRACE), "--flush", "0,2", "--max-batch", "1,10",
                                 "--gpus", "2", "--out", str(out), "--jobs", "2"])
    assert result.exit_code == 0, result.stderr
    again = runner.invoke(app, ["sweep", str(TRACE), "--flush", "0,2", "--max-batch", "1,10",
                                "--gpus", "2", "--out", str(out)])
    assert "0 replays run, 4 already in the file skipped" in " ".join(again.stdout.split())
    png = tmp_path / "h.png"
    cmp = runner.invoke(app, ["compare", str(out), "--metric", "tasks.infobench.latency.p95",
                              "--by", "flush,max_batch", "--plot", str(png)])
    assert cmp.exit_code == 0, cmp.stderr
    frame, _ = read_results(out)
    best = frame.loc[frame["tasks.infobench.latency.p95"].idxmin()]
    assert f"lowest: flush={best['flush']}, max_batch={best['max_batch']}" in " ".join(cmp.stdout.split())
    assert "one seed: no confidence interval" in " ".join(cmp.stdout.split())
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert_one_line_error(runner.invoke(app, ["compare", str(out), "--by", "flush"]), "max_batch", "--where")
    assert_one_line_error(runner.invoke(app, ["compare", str(out), "--metric", "nope.p95", "--by", "flush,max_batch"]), "nope.p95")


@pytest.mark.parametrize("args, needles", [
    (["--flush", "a,b"], ["--flush", "numbers"]),
    (["--topology", "ring"], ["topology", "ring"]),
    (["--task", "nope", "--flush", "0"], ["nope", "infobench"]),
])
def test_bad_sweep_options(tmp_path, args, needles):
    result = runner.invoke(app, ["sweep", str(TRACE), "--out", str(tmp_path / "s.parquet"), *args])
    assert_one_line_error(result, *needles)


# -- plan -------------------------------------------------------------------------------


@pytest.mark.parametrize("text, figure", [
    ("infobench.latency.p95<=60", "tasks.infobench.latency.p95"),
    ("overall.call_latency.p99 < 120", "overall.call_latency.p99"),
    ("mmlu.wait.mean<=1.5", "tasks.mmlu.wait.mean"),
    ("infobench.timed_out<=0", "tasks.infobench.timed_out"),
    ("overall.throughput_prompts_per_s>=0.2", "overall.throughput_prompts_per_s"),
])
def test_slo_syntax(text, figure):
    assert parse_slo(text, ["mmlu", "infobench"]).figure == figure


@pytest.mark.parametrize("text, words", [
    ("infobench.latency<=60", "did you mean infobench.latency.p"),
    ("chat.latency.p95<=60", "no such figure"),
    ("infobench.speed.p95<=60", "no such figure"),
    ("infobench.latncy.p95<=60", "did you mean infobench.latency.p95"),
    ("infobench.latency.p95 = 60", "expected FIGURE<=NUMBER"),
    ("infobench.timed_out.p95<=0", "did you mean infobench.timed_out"),
    ("infobench.latency.p95<=nan", "finite"),
    ("infobench.latency.p95<=inf", "finite"),
    ("infobench.latency.p95<=-1", ">= 0"),
])
def test_slo_errors_name_the_fault_and_the_closest_figures(text, words):
    with pytest.raises(PlanError, match=words):
        parse_slo(text, ["mmlu", "infobench"])


def test_one_figure_grammar_everywhere(tmp_path):
    """plan --slo, sweep --metric and compare --metric all take both spellings."""
    assert parse_slo("tasks.infobench.latency.p95<=60", ["infobench"]).figure == "tasks.infobench.latency.p95"
    out = tmp_path / "s.parquet"
    for metric in ("infobench.latency.p95", "tasks.infobench.latency.p95"):
        swept = runner.invoke(app, ["sweep", str(TRACE), "--flush", "0,2", "-j", "1", "-o", str(out),
                                    "--metric", metric])
        assert swept.exit_code == 0, swept.output
        assert "tasks.infobench.latency.p95" in swept.stdout
        compared = runner.invoke(app, ["compare", str(out), "-m", metric])
        assert compared.exit_code == 0, compared.output
    assert_one_line_error(runner.invoke(app, ["compare", str(out), "-m", "infobench.latncy.p95"]),
                          "did you mean infobench.latency.p95")


def erlang_c_answer(lam: float, mu: float, bound: float) -> int:
    return next(c for c in range(1, 100) if lam / (c * mu) < 1 and mmc_wait(lam, mu, c) <= bound)


@pytest.mark.slow
@pytest.mark.parametrize("lam", [1.4, 3.3, 6.2])
def test_planner_finds_the_erlang_c_gpu_count(lam):
    """Poisson arrivals, exponential service (mean 1 s), max batch 1, shared queue: the smallest
    GPU count meeting a mean-wait SLO is the Erlang C answer. The bound sits at the geometric
    mean of the waits with c* and c* - 1 servers, far from both relative to the sampling error."""
    mu = 1.0
    c_star = next(c for c in range(1, 100) if lam / c < 0.8)
    above = mmc_wait(lam, mu, c_star - 1) if lam / (c_star - 1) < 1 else 50 * mmc_wait(lam, mu, c_star)
    bound = math.sqrt(mmc_wait(lam, mu, c_star) * above)
    assert erlang_c_answer(lam, mu, bound) == c_star
    trace = synthesize(SynthSpec(duration=20_000 / lam, arrival="poisson", mean=1 / lam,
                                 prompts_per_call={1: 1.0}, task_mix={"x": 1.0}), seed=11)
    profile = profile_from_dict({"tasks": {"x": {"resource": "gpu", "service": {
        "kind": "distribution", "dist": "exponential", "mean": 1 / mu}}}})
    result = plan(Base(trace, profile, build_scenario()), [parse_slo(f"x.wait.mean<={bound}", ["x"])],
                  {"flush": (0.0,), "topology": ("shared",), "max_batch": (1,)}, max_gpus=12,
                  find_max_rate=False, workers=1)
    assert result.met and result.gpus == c_star
    assert result.figures["tasks.x.wait.mean"] <= bound


def test_plan_cli_recommends_and_writes_json(tmp_path):
    out = tmp_path / "plan.json"
    result = runner.invoke(app, ["plan", str(TRACE), "--slo", "infobench.latency.p95<=170",
                                 "--flush", "0,2", "--topology", "shared", "--max-batch", "4,10",
                                 "--max-gpus", "4", "--json", str(out)])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(out.read_text())
    assert set(doc) >= {"gpus", "config", "slos", "met", "figures", "max_rate_scale", "replays"}
    assert doc["met"] and doc["slos"][0]["met"] and doc["max_rate_scale"] >= 1
    assert doc["slos"][0]["value"] <= 170
    # the recommended count is the smallest: one GPU fewer misses the SLO with every configuration
    if doc["gpus"] > 1:
        fewer = runner.invoke(app, ["plan", str(TRACE), "--slo", "infobench.latency.p95<=170",
                                    "--flush", "0,2", "--topology", "shared", "--max-batch", "4,10",
                                    "--max-gpus", str(doc["gpus"] - 1), "--json", "-"])
        assert fewer.exit_code == 1 and json.loads(fewer.stdout)["met"] is False


def test_plan_cli_reports_the_closest_when_nothing_meets():
    result = runner.invoke(app, ["plan", str(TRACE), "--slo", "infobench.latency.p95<=1",
                                 "--flush", "0", "--topology", "shared", "--max-batch", "10",
                                 "--max-gpus", "2"])
    assert result.exit_code == 1
    assert "no configuration within 2 GPU(s) meets every SLO; closest" in " ".join(result.stdout.split())


def test_plan_cli_bad_slo():
    assert_one_line_error(runner.invoke(app, ["plan", str(TRACE), "--slo", "chat.latency.p95<=1"]),
                          "chat", "no such figure")


def test_plan_counts_unfinished_prompts_against_latency_slos(tmp_path):
    """With a deadline at the end of the trace, InfoBench prompts that arrive in its last
    minutes cannot finish; they are infinitely late, so a p95 bound that the completed prompts
    alone would meet is missed, and the table says how many did not finish."""
    args = ["plan", str(TRACE), "-c", str(ROOT / "scenarios" / "design-notes.toml"), "--deadline", "1200",
            "--slo", "infobench.latency.p95<=1000", "--flush", "5", "--topology", "shared", "--max-batch", "10",
            "--max-gpus", "2", "-j", "1"]
    result = runner.invoke(app, args + ["--json", str(tmp_path / "p.json")])
    assert result.exit_code == 1, result.output
    doc = json.loads((tmp_path / "p.json").read_text())   # valid JSON: the infinite p95 is null
    unfinished = doc["figures"]["tasks.infobench.unfinished"]
    assert not doc["met"] and doc["slos"][0]["value"] is None and unfinished > 0.05 * 108
    assert "did not finish" in result.stdout and f"{unfinished:g} of 108" in result.stdout
    # The same run without the deadline finishes everything and meets the bound.
    free = runner.invoke(app, [a for a in args if a not in ("--deadline", "1200")])
    assert free.exit_code == 0 and "meets every SLO" in free.stdout


def test_axes_a_topology_ignores_are_not_expanded_or_printed():
    configs = SweepSpec({"flush": (0.0, 5.0), "max_batch": (4, 8),
                         "topology": ("shared", "continuous")}).configurations()
    assert len(configs) == 2 * 2 + 1
    assert {"topology": "continuous"} in configs
    result = runner.invoke(app, ["plan", str(TRACE), "--slo", "mmlu.latency.p50<=100000", "--max-gpus", "1",
                                 "--topology", "continuous", "--flush", "0,5", "--max-batch", "2,8", "-j", "1"])
    assert result.exit_code == 0, result.output
    assert "topology=continuous" in result.stdout and "flush" not in result.stdout.split("SLOs")[0]
    assert "1 replays in all" in " ".join(result.stdout.split()) or "replays in all" in result.stdout


def test_sweep_refuses_rows_of_other_axes_and_other_formats(tmp_path, base):
    out = tmp_path / "s.parquet"
    run_sweep(SweepSpec({"flush": (0.0,)}), base, out, workers=1)
    with pytest.raises(SweepError, match="axes flush, not max_batch"):
        run_sweep(SweepSpec({"max_batch": (4,)}), base, out, workers=1)
    assert len(read_results(out)[0]) == 1
    assert_one_line_error(runner.invoke(app, ["sweep", str(TRACE), "--flush", "0", "-o", str(tmp_path / "s.csv")]),
                          "s.csv", ".parquet")
    assert not (tmp_path / "s.csv").exists()


def test_compare_says_when_cells_are_indistinguishable(tmp_path):
    out = tmp_path / "s.parquet"
    assert runner.invoke(app, ["sweep", str(TRACE), "--flush", "0,5", "--topology", "shared,continuous",
                               "--seeds", "3", "-j", "1", "-o", str(out)]).exit_code == 0
    result = runner.invoke(app, ["compare", str(out), "-m", "infobench.latency.p95", "--by", "flush,topology"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    frame = read_results(out)[0]
    agg = aggregate(frame, "infobench.latency.p95", ["flush", "topology"])
    from simulator.cli.compare import tied_with_best
    tied = tied_with_best(agg, agg["mean"].idxmin())
    if len(tied) > 1:
        assert f"no single best: {len(tied)} of {len(agg)} cells are indistinguishable" in text and "≈" in text
    else:
        assert "distinguishable from every other cell" in text
    assert "–" in result.stdout   # continuous has no flush window: shown as –, not a crash


def test_welch_tie_rule():
    from simulator.cli.compare import tied_with_best
    agg = pd.DataFrame({"x": [1, 2, 3], "mean": [10.0, 10.5, 30.0], "std": [2.0, 2.0, 1.0], "n": [3, 3, 3]})
    assert tied_with_best(agg, 0) == {0, 1}
    assert tied_with_best(agg.assign(std=[0.01, 0.01, 0.01]), 0) == {0}


def test_slos_on_goodput_and_token_figures():
    from simulator.metrics import TokenOptions, parse_goodput

    tokens = TokenOptions(goodput=parse_goodput("ttft:200ms"))
    assert parse_slo("goodput>=0.9", ["a"], tokens).figure == "overall.tokens.goodput_fraction"
    assert parse_slo("a.tokens.ttft_ms.p99<=500", ["a"]).figure == "tasks.a.tokens.ttft_ms.p99"
    assert parse_slo("a.tokens.ttft_ms.p99.9<=500", ["a"], TokenOptions(percentiles=(99.9,))).figure \
        == "tasks.a.tokens.ttft_ms.p99.9"
    with pytest.raises(PlanError, match="--goodput"):
        parse_slo("goodput>=0.9", ["a"])


def test_goodput_figures_reach_sweep_rows(tmp_path):
    from simulator.metrics import TokenOptions, parse_goodput

    trace, profile = load_trace("example"), load_profile("seed-calibrated")
    base = Base(trace, profile, build_scenario(path="design-notes"),
                tokens=TokenOptions(goodput=parse_goodput("e2e:10s")))
    frame = run_sweep(SweepSpec({"flush": (0.1,)}, seeds=(0,), task="infobench"), base, tmp_path / "r.parquet",
                      workers=1).frame
    row = frame.iloc[0]
    assert 0 <= row["overall.tokens.goodput_fraction"] <= 1
    assert row["tasks.infobench.tokens.goodput_fraction"] < row["tasks.graph.tokens.goodput_fraction"]


def test_plan_goodput_without_its_slo_is_a_one_line_error():
    result = CliRunner().invoke(app, ["plan", "example", "--slo", "goodput>=0.9", "--max-gpus", "1"])
    assert_one_line_error(result, "--goodput")


def test_journal_lines_read_back_as_the_rows_written(tmp_path):
    # Rows go to the journal through msgspec, or json where a figure is NaN or infinite
    # (msgspec would write null): either way a resumed sweep reads back the same values.
    meta = {"format": "simctl-sweep/1", "hashes": {"trace": "t", "profile": "p", "scenario": "s", "prices": "c"},
            "task": None, "axes": ["flush"]}
    rows = [{"config_key": "a", "seed": 0, "flush": 0.1, "x": 0.1 + 0.2, "n": np.int64(3), "y": np.float64(1e-320),
             "none": None, "name": "shared"},
            {"config_key": "b", "seed": 0, "flush": 5.0, "x": math.inf, "n": 2, "y": math.nan, "none": None,
             "name": "split"}]
    store = sweep_mod.ResultStore(tmp_path / "r.parquet", meta)
    store.add(rows[0])
    store.add_many(rows[1:])
    store._handle.close()
    back = sweep_mod.ResultStore(tmp_path / "r.parquet", meta).rows
    assert [r["config_key"] for r in back] == ["a", "b"]
    assert back[0] == {**rows[0], "n": 3, "y": 1e-320}
    assert back[1]["x"] == math.inf and math.isnan(back[1]["y"]) and back[1]["n"] == 2
    assert {k: v for k, v in back[1].items() if k != "y"} == {k: v for k, v in rows[1].items() if k != "y"}


def test_pool_chunks_stay_small_and_balanced():
    assert sweep_mod.chunk_size(10, 2) == 1
    assert sweep_mod.chunk_size(400, 2) == 25      # 16 tasks: 8 a worker
    assert sweep_mod.chunk_size(10_000, 2) == sweep_mod.LARGEST_CHUNK


def test_a_small_sweep_with_no_worker_count_runs_in_this_process(tmp_path, base, monkeypatch):
    """16 replays of a 347-prompt trace are fewer prompts than the reference engine's small
    run: no pool is started for them unless a worker count is asked for."""
    from simulator.model.engine import SMALL_RUN_PROMPTS

    assert sweep_mod.default_workers(16, 347) == 1
    assert sweep_mod.default_workers(SMALL_RUN_PROMPTS, 1) == (os.cpu_count() or 1)

    def no_pool(*args, **kwargs):
        raise AssertionError("a pool was started")

    monkeypatch.setattr(sweep_mod.cf, "ProcessPoolExecutor", no_pool)
    assert base.trace.n_prompts * len(SPEC.jobs()) < SMALL_RUN_PROMPTS
    assert run_sweep(SPEC, base, tmp_path / "s.parquet").ran == 16
    with pytest.raises(AssertionError, match="a pool was started"):
        run_sweep(SPEC, base, tmp_path / "two.parquet", workers=2)


def test_rows_sent_back_by_workers_make_the_frame_their_dicts_make():
    # Workers send rows packed (keys once per key order); the results frame made from them
    # column by column is the frame of the rows as dicts: columns in order of first
    # appearance, missing figures NaN, the same dtypes.
    from simulator.sweep import Rows

    rows = [
        {"config_key": "a", "seed": 0, "gpus.0.busy_s": 1.5, "mean_batch_size": None, "calls": 3, "name": "x"},
        {"config_key": "b", "seed": 1, "gpus.0.busy_s": 2.0, "gpus.1.busy_s": 0.5, "mean_batch_size": 2.0,
         "calls": 4, "name": "y", "cost.unknown": "no price"},
        {"config_key": "c", "seed": 0, "gpus.0.busy_s": float("inf"), "mean_batch_size": None, "calls": 5, "name": "z"},
        {"config_key": "d", "seed": 2, "calls": 6, "gpus.0.busy_s": 0.25, "mean_batch_size": None, "name": "w"},
    ]
    packed = Rows(rows)
    assert len(packed) == 4 and len(packed.blocks) == 3
    assert sorted(packed, key=lambda r: r["config_key"]) == rows
    back = pickle.loads(pickle.dumps(packed))
    pd.testing.assert_frame_equal(back.frame().sort_values("config_key").reset_index(drop=True),
                                  pd.DataFrame(rows), check_exact=True)


_CELL = st.one_of(st.none(), st.integers(-2**70, 2**70), st.integers(-5, 5), st.floats(allow_nan=True),
                  st.booleans(), st.sampled_from(["a", "b"]))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.tuples(st.lists(st.sampled_from("wxyz"), unique=True, max_size=4), st.tuples(*[_CELL] * 4)),
                         min_size=1, max_size=5),
                min_size=1, max_size=8),
       st.integers(1, 6))
def test_a_results_frame_made_in_segments_as_batches_come_is_the_frame_of_the_rows(batches, segment):
    # The results frame is typed a few rows at a time as the workers' batches come in
    # (Columns.SEGMENT rows a segment): whatever the values of a column are across the
    # segments (ints, ints beyond int64, floats, None alone, bools, names) and wherever a
    # column first appears (rows of several key orders in a batch), the joined frame is
    # pandas' frame of the rows as dicts.
    from simulator.sweep import Columns, Rows

    rows: list[dict] = []
    columns = Columns()
    columns.SEGMENT = segment
    for batch in batches:
        made = [{"config_key": str(len(rows) + i), "seed": 0, **dict(zip(keys, values[:len(keys)], strict=True))}
                for i, (keys, values) in enumerate(batch)]
        rows.extend(made)
        columns.add(Rows(made))
    assert len(columns) == len(rows)
    assert columns.keys() == {(row["config_key"], 0) for row in rows}
    expected = pd.DataFrame(rows)
    # (a batch's rows come key order by key order: compared in the rows' order)
    frame = columns.frame().set_index("config_key").loc[expected["config_key"]].reset_index()
    pd.testing.assert_frame_equal(frame, expected, check_exact=True)


@pytest.mark.parametrize("values", [
    [1, None, 3], [1, 2, 3], [1.5, None, 2.0], [None, None, None], [True, False, True], [True, None, False],
    [1, 2**70, 3], ["a", None, "b"], [1, 2.5, None], [float("nan"), 1, 2], [2**63 - 1, -2**63, 0], [1, True, 2],
    [1, 2.0, 3], [float("inf"), -1.0, 0.0], [np.float64(1.0), 2.0, 3.0],
], ids=str)
def test_a_column_of_the_results_frame_has_the_dtype_and_values_pandas_gives_its_list(values):
    # The frame's numeric columns are made by numpy in one call (Rows.frame): each is what
    # pandas infers from the column's values, None NaN, ints alone int64, else as pandas has it.
    from simulator.sweep import Rows

    rows = [{"config_key": str(i), "figure": v} for i, v in enumerate(values)]
    pd.testing.assert_frame_equal(Rows(rows).frame(), pd.DataFrame(rows), check_exact=True)
