"""Padding waste (simulator.padding): the batching lab's formula on hand-made batches, exactly.

padded = batch size × (longest prompt + longest max tokens), actual = Σ (prompt + max
tokens), waste = (padded − actual) / padded; totals Σ(padded − actual) / Σ padded.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from simulator.metrics import summarize
from simulator.model import simulate
from simulator.padding import batch_padding, continuous_rows, padding_figures
from simulator.profile import profile_from_dict
from simulator.scenario import build_scenario
from simulator.trace.model import Call, Prompt, Trace


def _log(rows: list[tuple[int, str, str, int, int]], dtype=np.int32) -> pd.DataFrame:
    """A log of ``(batch_id, task, queue, prompt_tokens, max_tokens)`` rows (int32 columns:
    the log's integer widths may narrow)."""
    batch, task, queue, p, m = zip(*rows, strict=True)
    return pd.DataFrame({
        "batch_id": np.array(batch, dtype=dtype), "task": pd.Categorical(task), "queue": pd.Categorical(queue),
        "prompt_tokens": np.array(p, dtype=dtype), "max_tokens": np.array(m, dtype=dtype),
    })


def test_equal_rows_waste_nothing():
    table = batch_padding(_log([(0, "x", "x", 50, 20)] * 4))
    assert table.loc[0, ["size", "padded", "actual"]].tolist() == [4, 280, 280]
    assert table.loc[0, "waste"] == 0.0


def test_one_long_row_pads_the_rest():
    # three rows of 10 + 10 and one of 100 + 100: padded 4 × 200 = 800, actual 60 + 200 = 260
    table = batch_padding(_log([(0, "x", "x", 10, 10)] * 3 + [(0, "x", "x", 100, 100)]))
    assert table.loc[0, ["longest_prompt", "longest_output", "padded", "actual"]].tolist() == [100, 100, 800, 260]
    assert table.loc[0, "waste"] == pytest.approx(540 / 800, rel=1e-15)


def test_longest_prompt_and_longest_output_may_come_from_different_rows():
    # (5 + 40) and (30 + 10): the rectangle is 2 × (30 + 40) = 140, the work 85
    table = batch_padding(_log([(0, "x", "x", 5, 40), (0, "x", "x", 30, 10)]))
    assert table.loc[0, ["padded", "actual"]].tolist() == [140, 85]
    assert table.loc[0, "waste"] == pytest.approx(55 / 140, rel=1e-15)


def test_totals_weigh_batches_by_their_padded_work_and_the_mean_does_not():
    rows = ([(0, "x", "x", 10, 10)] * 3 + [(0, "x", "x", 100, 100)]   # 800 padded, 260 actual
            + [(1, "x", "x", 50, 50)] * 2                               # 200, 200
            + [(2, "y", "y@0", 5, 15), (2, "y", "y@0", 20, 10)])         # 2 × 35 = 70, 50
    log = _log(rows)
    figures = padding_figures(log["batch_id"].to_numpy(), log["prompt_tokens"].to_numpy(),
                              log["max_tokens"].to_numpy(), continuous_rows(log))
    assert figures["batches"] == 3
    assert (figures["padded_tokens"], figures["actual_tokens"]) == (1070, 510)
    assert Fraction(figures["waste"]).limit_denominator(10_000) == Fraction(560, 1070)
    assert figures["mean_batch_waste"] == pytest.approx((540 / 800 + 0 + 20 / 70) / 3, rel=1e-12)


def test_continuous_admissions_pad_nothing_and_turned_away_prompts_count_nowhere():
    log = _log([(0, "c", "c~0", 10, 10), (0, "c", "c~0", 100, 100),   # continuous: no rectangle
                (-1, "x", "x", 500, 500),                              # rejected: no batch
                (1, "x", "x", 10, 10), (1, "x", "x", 30, 10)])
    table = batch_padding(log)
    assert table["pads"].tolist() == [False, True]
    assert table["padded"].tolist() == [220, 80]
    assert table["waste"].tolist() == [0.0, 20 / 80]
    # a task named like a continuous queue is not taken for one: its queue must be TASK~g
    assert continuous_rows(_log([(0, "a~1", "a~1", 1, 1), (1, "b", "b~12", 1, 1)])).tolist() == [False, True]


def test_a_group_without_batches_has_no_ratios():
    log = _log([(-1, "x", "x", 10, 10)])
    figures = padding_figures(log["batch_id"].to_numpy(), log["prompt_tokens"].to_numpy(),
                              log["max_tokens"].to_numpy(), continuous_rows(log))
    assert figures == {"batches": 0, "padded_tokens": 0, "actual_tokens": 0, "waste": None,
                       "mean_batch_waste": None}


def test_the_per_batch_totals_are_the_detailed_ones_however_the_rows_lie():
    """The summary's per-batch padded and actual tokens (``detail=False``: batches of one
    taken without a scatter where row i is batch i, without a second array where nothing
    pads) are the detailed table's, and so are their totals and each batch's task."""
    from simulator.padding import _per_batch, batch_work, padding_totals

    rng = np.random.default_rng(5)
    for trial in range(300):
        n = int(rng.integers(1, 40))
        ids = np.arange(n, dtype=np.int32) if trial % 2 else np.sort(rng.integers(0, n, n)).astype(np.int32)
        if trial % 3 == 1:
            ids = rng.permutation(ids)
        if trial % 5 == 2:
            ids[rng.random(n) < 0.2] = -1  # (turned away)
        p, m = rng.integers(0, 50, n).astype(np.int32), rng.integers(1, 50, n).astype(np.int32)
        continuous = rng.random(n) < (0.5 if trial % 7 == 3 else 0.0)
        label = rng.integers(0, 3, n).astype(np.int8)
        label[ids >= 0] = (ids[ids >= 0] % 3)  # (a batch's rows share their task)
        full = _per_batch(ids, p, m, continuous)
        padded, actual, label_of = batch_work(ids, p, m, continuous, label)
        assert padded.tolist() == full["padded"].tolist() and actual.tolist() == full["actual"].tolist()
        assert label_of.tolist() == (full["batch_id"] % 3).tolist()
        totals = padding_totals(padded, actual)
        assert totals == padding_totals(full["padded"].copy(), full["actual"].copy())


def test_the_summary_reports_padding_per_task_and_overall():
    # One GPU, flush 0, max batch 2, 3 s per batch: a alone 0..3, then {b, c} 3..6.
    # a: 10 + 10 alone (0 waste); {b, c}: 2 × (100 + 50) = 300 padded, 150 + 60 = 210 actual.
    # d (task y, continuous) pads nothing.
    trace = Trace((Call("0", 0.0, (Prompt("x", 10, 10),)),
                   Call("1", 1.0, (Prompt("x", 100, 50), Prompt("x", 30, 30), Prompt("y", 40, 5)))))
    scenario = build_scenario(defaults={"flush": 0.0, "max_batch": 2}, run={"gpus": 1},
                              tasks={"y": {"topology": "continuous"}})
    profile = profile_from_dict({"tasks": {
        "x": {"resource": "gpu", "service": {"kind": "distribution", "dist": "deterministic", "mean": 3.0}},
        "y": {"resource": "gpu", "service": {"kind": "iteration", "step": {"base": 0.01}}}}})
    log = simulate(trace, scenario, profile, 0)
    summary = summarize(log)
    x = summary["tasks"]["x"]["padding"]
    assert (x["batches"], x["padded_tokens"], x["actual_tokens"]) == (2, 20 + 300, 20 + 210)
    assert x["waste"] == pytest.approx(90 / 320, rel=1e-12)
    assert x["mean_batch_waste"] == pytest.approx((0 + 90 / 300) / 2, rel=1e-12)
    y = summary["tasks"]["y"]["padding"]
    assert (y["padded_tokens"], y["actual_tokens"], y["waste"]) == (45, 45, 0.0)
    overall = summary["overall"]["padding"]
    assert (overall["padded_tokens"], overall["actual_tokens"]) == (365, 275)

