"""`simctl replay` end to end through the CLI: tables, JSON, event logs, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import assert_one_line_error
from simulator.cli import app
from simulator.events import EVENT_COLUMNS, read_event_log
from simulator.metrics import summarize

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "traces" / "batch_arrivals.json"
SCENARIO = ROOT / "scenarios" / "design-notes.toml"
STAT_KEYS = {"mean", "p50", "p90", "p95", "p99", "max"}

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, ["replay", *map(str, args)])


def test_replay_prints_a_table_per_task_and_the_gpus():
    result = invoke(TRACE, "--flush", "0.5")
    assert result.exit_code == 0, result.stderr
    for word in ("graph", "mmlu", "infobench", "overall", "utilisation", "p95"):
        assert word in result.stdout


def test_json_summary_has_the_documented_stable_keys():
    result = invoke(TRACE, "--config", SCENARIO, "--json", "-")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert {"overall", "tasks", "gpus", "makespan_s", "config"} <= summary.keys()
    assert set(summary["tasks"]) == {"graph", "mmlu", "infobench"}
    for block in [summary["overall"], *summary["tasks"].values()]:
        assert {"prompts", "completed", "timed_out", "mean_batch_size",
                "throughput_prompts_per_s"} <= block.keys()
        for stat in ("latency", "call_latency", "wait", "service"):
            assert set(block[stat]) >= STAT_KEYS, stat
    assert [g["id"] for g in summary["gpus"]] == [0, 1]
    for gpu in summary["gpus"]:
        assert {"id", "utilization", "batches", "mean_batch_size"} <= gpu.keys()
        assert 0 <= gpu["utilization"] <= 1
    # The resolved configuration says what the scenario file set for each task.
    tasks = summary["config"]["tasks"]
    assert tasks["infobench"]["flush"] == 5 and tasks["infobench"]["max_batch"] == 10
    assert tasks["mmlu"]["flush"] == 0.5 and tasks["mmlu"]["max_batch"] == 5
    assert tasks["graph"]["resource"] == "cpu"
    assert summary["config"]["scenario"]["gpu_sharing"] == "processor-sharing"


def test_every_prompt_of_the_trace_is_accounted_for():
    summary = json.loads(invoke(TRACE, "--json", "-").stdout)
    from simulator.trace.formats import load_trace

    trace = load_trace(TRACE)
    assert summary["overall"]["prompts"] == trace.n_prompts
    assert summary["overall"]["completed"] + summary["overall"]["timed_out"] == trace.n_prompts
    assert sum(t["prompts"] for t in summary["tasks"].values()) == trace.n_prompts


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_summary_is_recomputed_exactly_from_the_written_event_log(tmp_path, suffix):
    events = tmp_path / f"events{suffix}"
    out = tmp_path / "summary.json"
    result = invoke(TRACE, "--config", SCENARIO, "--events", events, "--json", out)
    assert result.exit_code == 0, result.stderr
    summary = json.loads(out.read_text())
    log = read_event_log(events)
    assert list(log.columns[: len(EVENT_COLUMNS)]) == list(EVENT_COLUMNS)
    again = summarize(log, config=summary["config"], deadline=None, gpus=2)
    # Both formats keep every float exactly (CSV with 17 significant digits).
    assert json.loads(json.dumps(again)) == summary


def test_same_seed_same_summary_other_seed_other_service_times():
    a = json.loads(invoke(TRACE, "--config", SCENARIO, "--seed", "3", "--json", "-").stdout)
    b = json.loads(invoke(TRACE, "--config", SCENARIO, "--seed", "3", "--json", "-").stdout)
    c = json.loads(invoke(TRACE, "--config", SCENARIO, "--seed", "4", "--json", "-").stdout)
    assert a == b
    assert a["overall"]["latency"] != c["overall"]["latency"]


def test_deadline_times_out_what_is_not_finished():
    summary = json.loads(invoke(TRACE, "--deadline", "600", "--json", "-").stdout)
    overall = summary["overall"]
    assert overall["timed_out"] > 0
    assert overall["completed"] + overall["timed_out"] == overall["prompts"]


def test_rate_scale_shortens_the_makespan():
    slow = json.loads(invoke(TRACE, "--json", "-").stdout)
    fast = json.loads(invoke(TRACE, "--rate-scale", "2", "--json", "-").stdout)
    assert fast["config"]["scenario"]["rate_scale"] == 2
    assert fast["makespan_s"] < slow["makespan_s"]


def test_flag_shadowed_by_the_scenario_is_warned_about():
    result = invoke(TRACE, "--config", SCENARIO, "--flush", "2")
    assert result.exit_code == 0
    assert "warning: --flush is overridden by the scenario" in result.stderr


@pytest.mark.parametrize(
    "args, needles",
    [
        (["missing.json"], ["missing.json", "no such file"]),
        ([TRACE, "--profile", "nope"], ["nope", "seed-calibrated"]),
        ([TRACE, "--topology", "bogus"], ["--topology", "bogus", "shared, split, direct"]),
        ([TRACE, "--policy", "newest"], ["--policy", "oldest"]),
        ([TRACE, "--dispatch", "x"], ["--dispatch", "round-robin"]),
        ([TRACE, "--gpu-sharing", "x"], ["--gpu-sharing", "processor-sharing"]),
        ([TRACE, "--max-batch", "0"], ["--max-batch", ">= 1"]),
        ([TRACE, "--flush", "-1"], ["--flush", ">= 0"]),
        ([TRACE, "--gpus", "0"], ["--gpus"]),
        ([TRACE, "--rate-scale", "0"], ["--rate-scale", "> 0"]),
        ([TRACE, "--config", "nope.toml"], ["nope.toml", "no such file"]),
    ],
)
def test_bad_options_fail_with_one_line(args, needles):
    assert_one_line_error(invoke(*args), *needles)


def test_bad_scenario_file_names_file_record_and_field(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[tasks.mmlu]\nmax_batch = "five"\n')
    assert_one_line_error(invoke(TRACE, "--config", bad), str(bad), "tasks.mmlu", "max_batch")
    bad.write_text("[defaults\n")
    assert_one_line_error(invoke(TRACE, "--config", bad), str(bad), "TOML")


def test_bad_trace_names_file_record_and_field(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"t": 0, "prompts": ["mmlu"]}, {"t": -1, "prompts": ["mmlu"]}]))
    assert_one_line_error(invoke(bad), str(bad), "record 1", "'t'")


def test_outputs_are_never_overwritten_without_force(tmp_path):
    out = tmp_path / "summary.json"
    out.write_text("precious")
    assert_one_line_error(invoke(TRACE, "--json", out), str(out), "--force")
    assert out.read_text() == "precious"
    events = tmp_path / "events.csv"
    events.write_text("precious")
    assert_one_line_error(invoke(TRACE, "--events", events), str(events))
    assert events.read_text() == "precious"
    assert invoke(TRACE, "--json", out, "--force").exit_code == 0
    assert json.loads(out.read_text())["overall"]["prompts"] > 0


def test_an_output_may_not_be_the_input_trace(tmp_path):
    trace = tmp_path / "trace.json"
    trace.write_text(TRACE.read_text())
    assert_one_line_error(invoke(trace, "--json", trace, "--force"), str(trace))
    assert trace.read_text() == TRACE.read_text()
