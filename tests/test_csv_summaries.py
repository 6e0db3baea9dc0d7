"""CSV summaries (``--csv``): one row per (run, task), flat columns, written as safely as
every other output (:mod:`simulator.outputs`)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from helpers import assert_one_line_error
from typer.testing import CliRunner

from simulator.cli import app
from simulator.outputs import flat_record, task_rows, write_csv

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "traces" / "batch_arrivals.json"
VLLM = ROOT / "tests" / "data" / "loadgen" / "vllm_bench.json"
runner = CliRunner()


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def test_task_rows_split_a_flat_record_per_task_and_overall():
    record = flat_record({"seed": 3, "gpus": [1, 2], "tasks": {"a": {"latency": {"p95": 1.5}}, "b": {"n": 2}},
                          "overall": {"latency": {"p95": 2.5}}, "compositions": {"a+b": {"n": 1}}})
    assert record["gpus"] == "[1, 2]" and record["tasks.a.latency.p95"] == 1.5
    rows = task_rows(record, {"compositions": "composition"})
    assert rows == [
        {"seed": 3, "gpus": "[1, 2]", "task": "a", "composition": None, "latency.p95": 1.5},
        {"seed": 3, "gpus": "[1, 2]", "task": "b", "composition": None, "n": 2},
        {"seed": 3, "gpus": "[1, 2]", "task": "overall", "composition": None, "latency.p95": 2.5},
        {"seed": 3, "gpus": "[1, 2]", "task": None, "composition": "a+b", "n": 1},
    ]


def test_write_csv_takes_every_column_and_refuses_an_existing_file(tmp_path):
    out = tmp_path / "s.csv"
    write_csv([{"a": 1}, {"a": 2, "b": "x"}], out)
    assert out.read_text() == "a,b\n1,\n2,x\n"
    from simulator.errors import OutputError

    try:
        write_csv([{"a": 3}], out)
    except OutputError as exc:
        assert "--force" in str(exc)
    else:
        raise AssertionError("an existing file was overwritten")
    write_csv([{"a": 3}], out, force=True)
    assert out.read_text() == "a\n3\n"


def test_replay_csv_agrees_with_its_json(tmp_path):
    csv, js = tmp_path / "s.csv", tmp_path / "s.json"
    result = invoke("replay", TRACE, "--seed", "2", "--csv", csv, "--json", js)
    assert result.exit_code == 0, result.output
    summary, table = json.loads(js.read_text()), pd.read_csv(csv)
    assert list(table["task"].dropna()) == [*summary["tasks"], "overall"]
    assert set(table["composition"].dropna()) == set(summary["compositions"])
    assert (table["seed"] == 2).all() and (table["profile"] == summary["config"]["profile"]["name"]).all()
    for _, row in table[table["task"].notna()].iterrows():
        figures = summary["overall"] if row["task"] == "overall" else summary["tasks"][row["task"]]
        assert row["latency.p95"] == figures["latency"]["p95"] and row["prompts"] == figures["prompts"]
    assert_one_line_error(invoke("replay", TRACE, "--csv", csv), "exists", "--force")
    assert_one_line_error(invoke("replay", TRACE, "--csv", csv, "--events", csv, "--force"), "--csv", "--events")
    assert_one_line_error(invoke("replay", TRACE, "--csv", tmp_path / "no" / "s.csv"), "does not exist")


def test_sweep_and_compare_csv(tmp_path):
    results, csv, cells = tmp_path / "r.parquet", tmp_path / "r.csv", tmp_path / "cells.csv"
    done = invoke("sweep", TRACE, "--flush", "0.1,1", "--seeds", "2", "-j", "1", "-o", results, "--csv", csv)
    assert done.exit_code == 0, done.output
    frame, table = pd.read_parquet(results), pd.read_csv(csv)
    assert len(table) == len(frame) * 4  # three tasks and overall per replay
    for _, row in frame.iterrows():
        mine = table[(table["flush"] == row["flush"]) & (table["seed"] == row["seed"])]
        assert sorted(mine["task"]) == ["graph", "infobench", "mmlu", "overall"]
        got = mine.set_index("task")["latency.p95"]
        assert got["infobench"] == row["tasks.infobench.latency.p95"] and got["overall"] == row["overall.latency.p95"]
    compared = invoke("compare", results, "-m", "infobench.latency.p95", "--csv", cells)
    assert compared.exit_code == 0, compared.output
    agg = pd.read_csv(cells)
    assert list(agg["flush"]) == [0.1, 1.0] and (agg["n"] == 2).all()
    expected = frame.groupby("flush")["tasks.infobench.latency.p95"].mean()
    assert list(agg["mean"]) == list(expected)
    assert_one_line_error(invoke("compare", results, "--csv", cells), "exists")


def test_observed_csv(tmp_path):
    csv, js = tmp_path / "o.csv", tmp_path / "o.json"
    result = invoke("observed", VLLM, "--csv", csv, "--json", js)
    assert result.exit_code == 0, result.output
    figures, table = json.loads(js.read_text())["figures"], pd.read_csv(csv)
    overall = table[table["task"] == "overall"].iloc[0]
    assert overall["calls"] == figures["overall"]["calls"] and overall["latency.p50"] == figures["overall"]["latency"]["p50"]
    assert set(table["task"].dropna()) == {"overall", *figures["tasks"]}
