"""`simctl validate` and `simctl synth` through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import assert_one_line_error
from typer.testing import CliRunner

from simulator.cli import app
from simulator.trace.formats import load_trace

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "traces" / "batch_arrivals.json"
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_validate_prints_the_statistics():
    result = invoke("validate", TRACE)
    assert result.exit_code == 0, result.stderr
    for word in ("118", "347", "Inter-arrival", "median", "Prompts per call", "infobench"):
        assert word in result.stdout


def test_validate_json_agrees_with_the_trace():
    result = invoke("validate", TRACE, "--json")
    stats = json.loads(result.stdout)
    trace = load_trace(TRACE)
    assert (stats["calls"], stats["prompts"]) == (len(trace), trace.n_prompts)
    assert sum(stats["prompts_per_call"].values()) == len(trace)


@pytest.mark.parametrize("content, needles", [
    ("[{\"t\": 1, \"prompts\": [\"mmlu\"]}, {\"t\": -4, \"prompts\": [\"mmlu\"]}]", ["record 1", "field 't'"]),
    ("[{\"t\": 1}]", ["record 0", "field 'prompts'"]),
    ("not json", ["not valid JSON", "line 1"]),
    ("", ["empty"]),
])
def test_validate_bad_traces_exit_2_with_one_line(tmp_path, content, needles):
    path = tmp_path / "bad.json"
    path.write_text(content)
    assert_one_line_error(invoke("validate", path), str(path), *needles)


def test_validate_reports_repairs_as_warnings(tmp_path):
    path = tmp_path / "unsorted.json"
    path.write_text(json.dumps([{"t": 2, "prompts": ["mmlu"]}, {"t": 1, "prompts": ["mmlu"]}]))
    result = invoke("validate", path)
    assert result.exit_code == 0
    assert "warning:" in result.stderr and "sorted" in result.stderr


@pytest.mark.parametrize("fmt", ["native", "client"])
def test_synth_writes_a_readable_reproducible_trace(tmp_path, fmt):
    args = ["synth", "--duration", "600", "--arrival", "gamma", "--mean", "5", "--cv", "0.5",
            "--format", fmt, "--seed", "11"]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert invoke(*args, "-o", a).exit_code == 0
    assert invoke(*args, "-o", b).exit_code == 0
    assert a.read_bytes() == b.read_bytes()
    trace = load_trace(a)
    assert trace.meta["format"] == fmt
    assert 60 < len(trace) < 200 and trace.calls[-1].t <= 600
    assert set(trace.tasks) <= {"graph", "mmlu", "infobench"}


def test_synth_refuses_to_overwrite_without_force(tmp_path):
    out = tmp_path / "t.json"
    out.write_text("precious")
    assert_one_line_error(invoke("synth", "--duration", "100", "-o", out), str(out))
    assert out.read_text() == "precious"
    assert invoke("synth", "--duration", "100", "-o", out, "--force").exit_code == 0
    assert len(load_trace(out)) > 0


@pytest.mark.parametrize("option, value", [
    ("--prompts-per-call", "1:0.5,2:0.4"),
    ("--task-mix", "graph:1.2"),
    ("--arrival", "pareto"),
    ("--mean", "-3"),
    ("--format", "csv"),
])
def test_synth_bad_options_name_the_option(tmp_path, option, value):
    out = tmp_path / "t.json"
    assert_one_line_error(invoke("synth", "--duration", "100", "-o", out, option, value), option)
    assert not out.exists()


def test_synth_request_rate_is_the_mean_gap_it_stands_for(tmp_path):
    by_rate, by_mean = tmp_path / "rate.json", tmp_path / "mean.json"
    assert invoke("synth", "-o", by_rate, "--duration", "50", "--request-rate", "4").exit_code == 0
    assert invoke("synth", "-o", by_mean, "--duration", "50", "--mean", "0.25").exit_code == 0
    assert load_trace(by_rate).calls == load_trace(by_mean).calls
    fitted = tmp_path / "fitted.json"
    done = invoke("synth", "-o", fitted, "--duration", "50", "--fit", TRACE, "--request-rate", "4")
    assert done.exit_code == 0, done.output
    assert load_trace(fitted).meta["spec"]["mean"] == 0.25


@pytest.mark.parametrize("extra, needles", [
    (["--mean", "3"], ("--request-rate", "--mean")),
    (["--fit", "TRACE", "--rate-scale", "2"], ("--request-rate", "--rate-scale")),
    (["--request-rate", "0"], ("--request-rate", "> 0")),
])
def test_synth_request_rate_conflicts(tmp_path, extra, needles):
    extra = [str(TRACE) if x == "TRACE" else x for x in extra]
    args = ["synth", "-o", tmp_path / "t.json", "--duration", "50", *extra]
    if "--request-rate" not in extra:
        args += ["--request-rate", "2"]
    assert_one_line_error(invoke(*args), *needles)
    assert not (tmp_path / "t.json").exists()
