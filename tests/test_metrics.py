"""Metrics are pure functions of the event log: check each formula on hand-made logs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from helpers import assert_same_figures

from simulator.events import EVENT_COLUMNS, with_durations
from simulator.metrics import (
    busy_time,
    call_figures,
    call_table,
    client_calls,
    describe,
    json_ready,
    percentiles,
    summarize,
    time_average_in_system,
)
from simulator.scenario import Compositions


def make_log(rows):
    """rows: (call_index, prompt_index, task, arrived, batched, started, done, gpu, batch, size)."""
    df = pd.DataFrame(rows, columns=["call_index", "prompt_index", "task", "arrived_at", "batched_at",
                                     "started_at", "done_at", "gpu", "batch_id", "batch_size"])
    df["call_id"] = df["call_index"].astype(str)
    df["resource"] = np.where(df["gpu"].isna(), "cpu", "gpu")
    df["queue"] = df["task"]
    df["worker"] = 0
    df["prompt_tokens"] = 10
    df["max_tokens"] = 20
    df["status"] = "served"
    df["first_token_at"] = df["started_at"] + (df["done_at"] - df["started_at"]) / 2
    df["preemptions"] = 0
    df["gpu"] = df["gpu"].astype("Int64")
    return df[EVENT_COLUMNS]


LOG = make_log([
    # call 0: a (gpu 0) and g (cpu); call 1: a, a in one batch on gpu 1; call 2: a late
    (0, 0, "a", 0.0, 1.0, 2.0, 5.0, 0, 0, 1),
    (0, 1, "g", 0.0, 0.0, 0.0, 0.5, None, 1, 1),
    (1, 0, "a", 1.0, 1.5, 1.5, 4.0, 1, 2, 2),
    (1, 1, "a", 1.0, 1.5, 1.5, 4.0, 1, 2, 2),
    (2, 0, "a", 3.0, 5.0, 5.0, 10.0, 0, 3, 1),
])


def test_durations_are_differences_of_instants():
    d = with_durations(LOG)
    assert list(d["latency_s"]) == [5.0, 0.5, 3.0, 3.0, 7.0]
    assert list(d["wait_s"]) == [2.0, 0.0, 0.5, 0.5, 2.0]
    assert list(d["batching_s"]) == [1.0, 0.0, 0.5, 0.5, 2.0]
    assert list(d["service_s"]) == [3.0, 0.5, 2.5, 2.5, 5.0]


def test_describe_uses_linear_percentiles_and_handles_empty():
    s = describe([1, 2, 3, 4])
    assert s == {"mean": 2.5, "p50": 2.5, "p90": pytest.approx(3.7), "p95": pytest.approx(3.85),
                 "p99": pytest.approx(3.97), "max": 4.0}
    assert describe([]) == {k: None for k in s}


def test_percentiles_are_numpys_bit_for_bit():
    # Small samples are read off a sort, large ones off order statistics placed by partitions
    # (and a sort of the last values): both must give numpy's floats exactly (ties, a huge
    # stand-in value, one value, NaN), at any percentile.
    rng = np.random.default_rng(7)
    for trial in range(3000):
        n = int(rng.integers(1, 40)) if trial % 50 else int(rng.integers(4000, 6000))
        if trial % 250 == 0:  # (past the values a sort takes at once: a chain of partitions)
            n = int(rng.integers(40_000, 120_000))
        x = rng.exponential(size=n) * 10 ** rng.uniform(-3, 3)
        if trial % 3 == 1:
            x = np.round(x, 1)
        if trial % 3 == 2:
            x[rng.random(n) < 0.3] = 1e300
        for q in ((50, 90, 95, 99), (0.1, 33.3, 99.9, 100.0), (0.0001, 50, 50.0001, 70, 99.99)):
            assert percentiles(x.copy(), q) == [float(v) for v in np.percentile(x, q)]
    for n in (3, 5000, 50_000):
        x = np.arange(n, dtype=float)
        x[n // 3] = np.nan
        assert all(math.isnan(v) for v in percentiles(x, (50, 99)))


def test_calls_complete_with_their_last_prompt_and_know_their_tasks():
    calls = call_table(with_durations(LOG), deadline=6.0)
    assert list(calls["latency_s"]) == [5.0, 3.0, 7.0]
    assert list(calls["tasks"]) == ["a+g", "a", "a"]
    assert list(calls["completed"]) == [True, True, False]


def test_busy_time_is_the_union_of_intervals():
    assert busy_time(np.array([0.0, 1.0, 5.0]), np.array([2.0, 3.0, 6.0])) == 4.0
    assert busy_time(np.array([]), np.array([])) == 0.0
    # Intervals in start order are taken as they are, others sorted first: the same float
    # either way, with ties, touching and nested intervals.
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(1, 60))
        starts = np.round(rng.uniform(0, 20, n), 0)
        ends = starts + np.round(rng.exponential(2, n), 0)
        order = np.argsort(starts, kind="stable")
        shuffled = rng.permutation(n)
        assert busy_time(starts[order], ends[order]) == busy_time(starts[shuffled], ends[shuffled])
        covered = np.zeros(4000, dtype=bool)  # (on a grid of 0.01: every bound is a whole number)
        for a, b in zip(starts, ends, strict=True):
            covered[int(a * 100):int(b * 100)] = True
        assert busy_time(starts, ends) == pytest.approx(covered.sum() / 100)


def test_batch_sizes_are_one_per_batch_in_order_of_batch_id():
    from simulator.metrics import batch_sizes_of

    rng = np.random.default_rng(4)
    for _ in range(200):
        sizes_of_batch = rng.integers(1, 5, int(rng.integers(1, 30)))
        ids = np.repeat(np.arange(sizes_of_batch.size), sizes_of_batch)
        keep = rng.random(ids.size) < 0.8  # (some of a batch's rows: another group's)
        keep[0] = True
        ids = ids[keep]
        want = sizes_of_batch[np.unique(ids)]
        sizes = sizes_of_batch[ids].astype(np.int32)
        assert batch_sizes_of(ids, sizes).tolist() == want.tolist()  # (rows in order of batch)
        shuffled = rng.permutation(ids.size)
        assert batch_sizes_of(ids[shuffled], sizes[shuffled]).tolist() == want.tolist()


def test_summary_figures_from_the_log():
    s = summarize(LOG, {"x": 1}, deadline=6.0, gpus=3)
    o = s["overall"]
    assert (o["prompts"], o["completed"], o["timed_out"], o["unfinished"]) == (5, 4, 1, 1)
    # The timed-out prompt counts as infinitely late: latencies 0.5, 3, 3, 5, inf.
    assert o["latency"]["p50"] == 3.0
    assert o["latency"]["mean"] == o["latency"]["max"] == o["latency"]["p95"] == math.inf
    # Calls: 5 and 3 done, the third (7 s, after the deadline) infinitely late.
    assert o["call_latency"]["p50"] == 5.0 and o["call_latency"]["max"] == math.inf
    assert s["makespan_s"] == 10.0
    assert o["throughput_prompts_per_s"] == pytest.approx(4 / 10)
    a = s["tasks"]["a"]
    assert (a["prompts"], a["completed"], a["timed_out"]) == (4, 3, 1)
    assert a["mean_batch_size"] == pytest.approx((1 + 2 + 1) / 3)
    assert a["wait"]["mean"] == pytest.approx((2 + 0.5 + 0.5) / 3)
    assert s["tasks"]["g"]["service"]["mean"] == 0.5
    # GPU 0 busy [2,5) and [5,10): 8 of 10 s; GPU 1 busy [1.5, 4): 2.5 s; GPU 2 idle.
    assert [g["utilization"] for g in s["gpus"]] == pytest.approx([0.8, 0.25, 0.0])
    assert [g["batches"] for g in s["gpus"]] == [2, 1, 0]
    assert s["config"] == {"x": 1}


def test_unfinished_prompts_are_infinitely_late_in_every_latency_percentile():
    """Percentiles over completed prompts alone would reward not finishing."""
    x = np.concatenate([np.arange(1.0, 39.0), [np.inf, np.inf]])  # 38 done, 2 of 40 unfinished
    d = describe(x)
    assert d["p50"] == pytest.approx(np.percentile(np.arange(1.0, 41.0), 50))
    assert d["p90"] == pytest.approx(np.percentile(np.arange(1.0, 41.0), 90))  # below the unfinished
    assert d["p95"] == d["p99"] == d["max"] == d["mean"] == math.inf
    assert describe([np.inf, np.inf])["p50"] == math.inf
    assert json_ready({"a": [math.inf, 1.0, math.nan], "b": {"c": -math.inf}}) == {"a": [None, 1.0, None], "b": {"c": None}}


def test_summary_keys_are_stable():
    s = summarize(LOG)
    assert set(s) == {"overall", "tasks", "compositions", "gpus", "gpu_seconds", "makespan_s", "deadline_s", "config"}
    assert set(s["overall"]) == {"prompts", "completed", "unfinished", "timed_out", "rejected", "dropped",
                                 "sent_after_timeout", "preemptions", "calls", "calls_completed",
                                 "latency", "call_latency", "wait", "service", "ttft", "tpot",
                                 "mean_batch_size", "throughput_prompts_per_s", "padding", "tokens"}
    assert set(s["overall"]["padding"]) == {"batches", "padded_tokens", "actual_tokens", "waste", "mean_batch_waste"}
    assert set(s["gpus"][0]) == {"id", "utilization", "busy_s", "batches", "mean_batch_size", "mean_concurrency"}


def test_turned_away_prompts_fail_their_call_and_are_counted_by_status():
    log = LOG.copy()
    # call 1's second prompt (row 3) was rejected: no batch, no instants
    log.loc[3, ["status", "batched_at", "started_at", "first_token_at", "done_at", "batch_id"]] = \
        ["rejected", np.nan, np.nan, np.nan, np.nan, -1]
    s = summarize(log)
    assert s["overall"]["rejected"] == 1 and s["overall"]["completed"] == len(log) - 1
    assert s["overall"]["calls_completed"] == s["overall"]["calls"] - 1
    assert not call_table(log).loc[1, "completed"]


def test_ttft_and_tpot_follow_their_definitions():
    s = summarize(LOG)
    d = with_durations(LOG)
    assert s["overall"]["ttft"]["mean"] == pytest.approx((LOG["first_token_at"] - LOG["arrived_at"]).mean())
    assert s["overall"]["tpot"]["max"] == pytest.approx(((LOG["done_at"] - LOG["first_token_at"]) / 19).max())
    assert d["tpot_s"].tolist() == pytest.approx(((LOG["done_at"] - LOG["first_token_at"]) / 19).tolist())


def test_time_average_in_system_by_hand():
    # Prompts in system: [0,0.5): 2, [0.5,1): 1, [1,4): 3, [4,5): 1, ... integrate by hand.
    area = 2 * 0.5 + 1 * 0.5 + 3 * 2.0 + 4 * 1.0 + 2 * 1.0 + 1 * 5.0  # [1,3):3 [3,4):4 [4,5):2 [5,10):1
    assert time_average_in_system(LOG) == pytest.approx(area / 10.0)
    # Little's law holds exactly on a finished sample path: L = (N / T) * W.
    w = with_durations(LOG)["latency_s"].mean()
    assert time_average_in_system(LOG) == pytest.approx(len(LOG) / 10.0 * w)


def test_composition_classes_are_a_setting_absent_by_default():
    """Without rules no summary speaks of the users' task names (a BurstGPT import, say)."""
    log = LOG.assign(task=LOG["task"].map({"a": "infobench", "g": "graph"}))
    assert summarize(log, client_timeout=4.0)["compositions"] == {}
    assert call_figures(client_calls(log, 4.0), 4.0)["compositions"] == {}
    rules = Compositions.parse({"solo": {"only": ["infobench"]}, "mixed": {"all": ["graph", "infobench"]},
                                "no-graph": {"none": ["graph"]}}, None)
    assert [rules.classify(frozenset(s)) for s in (["infobench"], ["graph", "infobench"], ["mmlu"], ["graph"])] \
        == ["solo", "mixed", "no-graph", "other"]


def test_composition_figures_in_the_summary_match_the_per_call_table():
    log = LOG.assign(task=LOG["task"].map({"a": "infobench", "g": "graph"}))
    rules = Compositions.parse({"graph-only": {"only": ["graph"]}, "any-infobench": {"any": ["infobench"]}}, None)
    s = summarize(log, client_timeout=4.0, compositions=rules)
    by_table = call_figures(client_calls(log, 4.0, rules), 4.0)["compositions"]
    assert s["compositions"] == by_table and list(by_table) == ["any-infobench"]
    # call 0 (graph + infobench, 5 s) and call 2 (infobench, 7 s) exceed 4 s: failed, censored
    assert s["compositions"]["any-infobench"]["failed"] == 2
    assert s["compositions"]["any-infobench"]["latency_censored"]["max"] == 4.0


def token_log():
    """Four prompts with known instants: TTFT 100, 300, 200 ms; TPOT 100, 200 ms and none
    (one token); e2e 2000, 2300, 200 ms; the fourth turned away."""
    log = make_log([
        (0, 0, "a", 0.0, 0.0, 0.0, 2.0, 0, 0, 1),
        (1, 0, "a", 1.0, 1.0, 1.0, 3.3, 0, 1, 1),
        (2, 0, "b", 2.0, 2.0, 2.0, 2.2, 0, 2, 1),
        (3, 0, "b", 3.0, 3.0, 3.0, 3.0, 0, -1, 1),
    ])
    log["first_token_at"] = [0.1, 1.3, 2.2, np.nan]
    log["max_tokens"] = [20, 11, 1, 5]
    log["status"] = ["served", "served", "served", "rejected"]
    log.loc[3, ["batched_at", "started_at", "done_at"]] = np.nan
    return log


def test_token_figures_of_a_hand_computed_log():
    from simulator.metrics import TokenOptions, parse_goodput

    options = TokenOptions(percentiles=(50.0, 90.0, 99.0), goodput=parse_goodput("ttft:250ms,tpot:0.15s"))
    tok = summarize(token_log(), tokens=options)["overall"]["tokens"]
    approx = pytest.approx
    assert (tok["requests"], tok["completed"]) == (4, 3)
    assert tok["ttft_ms"] == approx({"mean": 200.0, "p50": 200.0, "p90": 280.0, "p99": 298.0})
    assert tok["tpot_ms"] == approx({"mean": 150.0, "p50": 150.0, "p90": 190.0, "p99": 199.0})
    assert tok["itl_ms"] == tok["tpot_ms"]  # evenly spaced simulated tokens: ITL is TPOT
    assert tok["e2e_ms"] == approx({"mean": 1500.0, "p50": 2000.0, "p90": 2240.0, "p99": 2294.0})
    assert tok["span_s"] == approx(3.3)  # first send (0) to last completion (3.3)
    assert tok["output_tokens"] == 32
    assert tok["output_tokens_per_s"] == approx(32 / 3.3)
    assert tok["total_tokens_per_s"] == approx((32 + 30) / 3.3)
    assert tok["requests_per_s"] == approx(3 / 3.3)
    # good: prompt 0 (100 ms, 100 ms) and the one-token prompt 2 (200 ms, no TPOT to miss);
    # prompt 1's TTFT is 300 ms; the turned-away prompt counts against the fraction
    assert (tok["good"], tok["goodput_fraction"]) == (2, 0.5)
    assert tok["goodput_per_s"] == approx(2 / 3.3)
    assert tok["goodput"] == approx({"ttft_ms": 250.0, "tpot_ms": 150.0})


def test_token_figures_per_task_share_the_run_span_and_choose_percentiles():
    from simulator.metrics import TokenOptions

    summary = summarize(token_log(), tokens=TokenOptions(percentiles=(25.0, 99.9)))
    a = summary["tasks"]["a"]["tokens"]
    assert list(a["ttft_ms"]) == ["mean", "p25", "p99.9"]
    assert a["ttft_ms"] == pytest.approx({"mean": 200.0, "p25": 150.0, "p99.9": 299.8})
    assert a["output_tokens_per_s"] == pytest.approx(31 / 3.3)
    assert "goodput_per_s" not in a  # no SLO, no goodput


def test_itl_reads_measured_gaps_where_there_are_some():
    from simulator.metrics import token_figures

    requests = pd.DataFrame({"sent_at": [0.0, 0.0], "first_token_at": [0.5, 0.5], "done_at": [1.5, 2.5],
                             "ok": [True, True], "output_tokens": [11, 11], "prompt_tokens": [5, 5],
                             "itl_s": [0.05, np.nan]})
    tok = token_figures(requests)
    assert tok["tpot_ms"]["mean"] == pytest.approx(150.0)  # (100 + 200) / 2
    assert tok["itl_ms"]["mean"] == pytest.approx(125.0)  # measured 50, and 200 where none


@pytest.mark.parametrize("text, fragment", [
    ("ttft", "TIMING:BOUND"), ("ttft:200", "with its unit"), ("latency:2s", "TIMING:BOUND"),
    ("ttft:1s,ttft:2s", "given twice"), ("ttft:-1ms", "with its unit"),
])
def test_goodput_slo_errors_name_the_fault(text, fragment):
    from simulator.errors import FigureError
    from simulator.metrics import parse_goodput

    with pytest.raises(FigureError, match=fragment):
        parse_goodput(text)


def test_goodput_and_percentiles_parse():
    from simulator.errors import FigureError
    from simulator.metrics import parse_goodput, parse_percentiles

    assert parse_goodput("TTFT:200ms, e2e:2s,itl:0.5ms") == (("ttft", 0.2), ("e2e", 2.0), ("itl", 0.0005))
    assert parse_percentiles("99,50,90,50") == (50.0, 90.0, 99.0)
    for bad in ("0", "101", "x", ""):
        with pytest.raises(FigureError):
            parse_percentiles(bad)


@pytest.mark.parametrize("topology", ["shared", "split", "direct", "continuous"])
def test_a_runs_columns_give_the_summary_of_its_log_frame(topology):
    # A sweep summarises the fast engine's columns without the frame: the summary must be
    # the frame's, figure for figure, whatever the task codes' order (with a deadline and a
    # client timeout, so unfinished prompts and failed calls are in it).
    from dataclasses import replace

    from simulator import build_scenario, load_profile, load_trace
    from simulator.events import LogColumns
    from simulator.metrics import summarize_columns
    from simulator.model import simulate
    from simulator.model.engine import simulate_columns

    trace = load_trace("example").scaled(2.0)
    base = build_scenario(path="design-notes")
    scenario = replace(base, tasks={**base.tasks, "infobench": {**base.tasks["infobench"], "topology": topology}},
                       deadline=120.0, client_timeout=100.0)
    profile = load_profile("seed-calibrated")
    kwargs = dict(deadline=scenario.deadline, gpus=scenario.gpus, client_timeout=scenario.client_timeout,
                  compositions=scenario.compositions)
    log = simulate(trace, scenario, profile, seed=3, engine="fast")
    columns = simulate_columns(trace, scenario, profile, seed=3, engine="fast")
    assert log.attrs["engine"] == columns.attrs["engine"] == "fast"
    expected = summarize(log, **kwargs)
    assert expected["overall"]["unfinished"] > 0
    assert summarize_columns(columns, **kwargs) == expected
    # the same run with its task names coded in reverse order
    names = list(columns.labels["task"])
    reverse = np.arange(len(names))[::-1]
    recoded = LogColumns({**columns.columns, "task": reverse[columns.columns["task"]]},
                         {**columns.labels, "task": names[::-1]}, columns.attrs)
    assert summarize_columns(recoded, **kwargs) == expected


def _same_figures(got, want):
    """``got`` equals ``want`` leaf for leaf, means (sums over a group taken in another order)
    within floating-point rounding."""
    assert_same_figures(got, want, exact_types=False, close=("mean", "mean_batch_waste"))


@pytest.mark.parametrize("topology, rate, single_task, complete", [
    ("shared", 1.0, False, False), ("split", 3.0, False, False), ("continuous", 2.0, False, False),
    ("shared", 4.0, True, False), ("shared", 1.0, False, True), ("continuous", 1.0, True, True)])
def test_the_one_pass_summary_of_a_small_run_is_the_group_by_group_one(monkeypatch, topology, rate, single_task,
                                                                       complete):
    # Small runs (a sweep's) take every group's figures in one pass (compiled, or numpy's
    # without the extension: tests/test_summary_kernel.py holds the two equal); large ones group by
    # group. The two agree: percentiles, counts and maxima exactly, means within rounding
    # (with a deadline, a client timeout, composition classes and a goodput SLO, so
    # unfinished prompts, failed calls and every figure are in it). ``complete``: no
    # deadline and the token figures' default percentiles, so every prompt completes and
    # the large path takes the token figures' e2e, TTFT and TPOT from the group's own.
    from dataclasses import replace

    import simulator.metrics as metrics
    from simulator import build_scenario, load_profile, load_trace
    from simulator.events import LogColumns
    from simulator.metrics import TokenOptions, summarize_columns
    from simulator.model.engine import simulate_columns

    trace = load_trace("example").scaled(rate)
    base = build_scenario(path="design-notes")
    rules = Compositions((("graph-only", {"only": frozenset({"graph"})}), ("has-mmlu", {"all": frozenset({"mmlu"})})))
    scenario = replace(base, tasks={**base.tasks, "infobench": {**base.tasks["infobench"], "topology": topology}},
                       deadline=None if complete else 150.0, client_timeout=None if complete else 120.0,
                       compositions=rules)
    columns = simulate_columns(trace, scenario, load_profile("seed-calibrated"), seed=5)
    if single_task:  # (every prompt relabelled as one task's)
        columns = LogColumns({**columns.columns, "task": np.zeros_like(columns.columns["task"])},
                             {**columns.labels, "task": ["infobench"]}, columns.attrs)
    kwargs = dict(deadline=scenario.deadline, gpus=scenario.gpus, client_timeout=scenario.client_timeout,
                  compositions=scenario.compositions,
                  tokens=TokenOptions() if complete else
                  TokenOptions(percentiles=(25.0, 50.0, 99.9, 100.0), goodput=(("ttft", 1.0), ("tpot", 0.05))))
    one_pass = summarize_columns(columns, **kwargs)
    assert (one_pass["overall"]["unfinished"] == 0) == complete and one_pass["compositions"]
    monkeypatch.setattr(metrics, "_ONE_PASS", 0)
    _same_figures(one_pass, summarize_columns(columns, **kwargs))


def test_without_token_timing_the_one_pass_summary_gives_each_ttft_the_latencys_figures(monkeypatch):
    # A log whose first tokens came as the prompts finished: numpy's one pass sorts the
    # latencies once for both figures; they are the group-by-group summary's, and equal each
    # other. (Without the extension's compiled pass, which tests/test_summary_kernel.py
    # holds to this one.)
    import simulator.metrics as metrics
    from simulator import build_scenario, load_profile, load_trace
    from simulator.events import LogColumns
    from simulator.metrics import summarize_columns
    from simulator.model.engine import simulate_columns

    scenario = build_scenario(path="design-notes")
    columns = simulate_columns(load_trace("example").scaled(3.0), scenario, load_profile("seed-calibrated"), seed=4)
    assert not np.array_equal(columns.columns["first_token_at"], columns.columns["done_at"], equal_nan=True)
    untimed = LogColumns({**columns.columns, "first_token_at": columns.columns["done_at"].copy()}, columns.labels,
                         columns.attrs)
    kwargs = dict(deadline=40.0, gpus=scenario.gpus, client_timeout=None, compositions=scenario.compositions)
    monkeypatch.setattr(metrics, "summary_pass", lambda: None)
    added = []  # the values each summary sorts
    add = metrics._SortedGroups.add
    monkeypatch.setattr(metrics._SortedGroups, "add", lambda self, x, *a: added.append(x.size) or add(self, x, *a))
    summarize_columns(columns, **kwargs)
    timed, added[:] = sum(added), []
    one_pass = summarize_columns(untimed, **kwargs)
    # the TTFTs (overall, then by task) are not sorted again
    assert timed - sum(added) == 2 * len(columns.columns["done_at"])
    assert one_pass["overall"]["unfinished"] > 0
    for group in (one_pass["overall"], *one_pass["tasks"].values()):
        assert group["ttft"] == group["latency"]
    monkeypatch.setattr(metrics, "_ONE_PASS", 0)
    _same_figures(one_pass, summarize_columns(untimed, **kwargs))


def test_a_summary_reads_the_calls_and_tasks_of_its_own_log_not_of_an_earlier_one():
    """The layout of a log's calls and tasks is kept by their contents: a log whose columns
    were edited in place, or another log of other calls, gets its own."""
    from simulator import build_scenario, load_profile, load_trace
    from simulator.metrics import _LAYOUTS, summarize_columns
    from simulator.model.engine import simulate_columns

    log = simulate_columns(load_trace("example"), build_scenario(path="design-notes"), load_profile("seed-calibrated"))
    first = summarize_columns(log)
    task = log.columns["task"]
    task[:] = task[0]  # every prompt now of one task, in the same arrays
    edited = summarize_columns(log)
    _LAYOUTS.clear()
    assert edited == summarize_columns(log) != first
    assert list(edited["tasks"]) == [log.labels["task"][task[0]]]
