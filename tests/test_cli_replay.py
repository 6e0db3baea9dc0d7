"""`simctl replay` end to end through the CLI: tables, JSON, event logs, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import assert_one_line_error
from typer.testing import CliRunner

from simulator.cli import app
from simulator.cost import cost_summary, load_prices
from simulator.events import EVENT_COLUMNS, read_event_log
from simulator.metrics import summarize
from simulator.profile import DEFAULT_PROFILE, load_profile
from simulator.scenario import build_scenario

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


def test_the_gpu_table_of_a_large_run_lists_the_least_and_most_utilised():
    """Up to GPU_ROWS GPUs the table lists each; beyond, the least and the most utilised
    half and half in id order, and a line says so (the JSON keeps every GPU)."""
    from simulator.cli.replay import GPU_ROWS, shown_gpus

    gpus = [{"id": i, "utilization": u} for i, u in enumerate([0.5, 0.1, 0.9, 0.3, 0.7, 0.2])]
    assert shown_gpus(gpus[:GPU_ROWS]) == gpus[:GPU_ROWS]
    many = [{"id": i, "utilization": (i * 7919 % 101) / 100} for i in range(GPU_ROWS + 9)]
    shown = shown_gpus(many)
    assert len(shown) == GPU_ROWS and [g["id"] for g in shown] == sorted(g["id"] for g in shown)
    left_out = [g["utilization"] for g in many if g not in shown]
    assert len(left_out) == 9
    low = sorted(g["utilization"] for g in shown)[:GPU_ROWS // 2]
    assert max(low) <= min(left_out) and max(left_out) <= min(sorted(g["utilization"] for g in shown)[GPU_ROWS // 2:])
    result = invoke(TRACE, "--gpus", GPU_ROWS + 8)
    assert result.exit_code == 0, result.stderr
    said = " ".join(result.stdout.split())  # (the console wraps the line)
    assert f"{GPU_ROWS + 8} GPUs" in said and "the 16 least and 16 most utilised" in said


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
    scenario = build_scenario(path=SCENARIO)
    again = summarize(log, config=summary["config"], deadline=None, gpus=2, compositions=scenario.compositions)
    again["cost"] = cost_summary(again, scenario, load_profile(DEFAULT_PROFILE), load_prices())
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


def _config(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["config"]["tasks"]


def test_an_explicit_flag_overrides_the_scenario_file_for_every_gpu_task():
    tasks = _config(invoke(TRACE, "--config", SCENARIO, "--flush", "0.1", "--json", "-"))
    assert tasks["infobench"]["flush"] == tasks["mmlu"]["flush"] == 0.1
    assert tasks["infobench"]["max_batch"] == 10            # what the flags do not name stays the file's
    assert tasks["graph"]["topology"] == "direct"           # the CPU task keeps its own settings


def test_set_overrides_one_field_over_flags_and_file():
    tasks = _config(invoke(TRACE, "-c", SCENARIO, "--flush", "2", "--set", "tasks.infobench.flush=0.1",
                           "--set", "run.gpus=3", "--json", "-"))
    assert (tasks["infobench"]["flush"], tasks["mmlu"]["flush"]) == (0.1, 2.0)
    doc = json.loads(invoke(TRACE, "-c", SCENARIO, "--set", "run.gpus=3", "--json", "-").stdout)
    assert doc["config"]["scenario"]["gpus"] == 3 and len(doc["gpus"]) == 3


@pytest.mark.parametrize("item, needles", [
    ("tasks.infobench.flush=-1", ["--set tasks.infobench.flush", ">= 0"]),
    ("tasks.infobench.bogus=1", ["--set tasks.infobench.bogus", "unknown setting"]),
    ("foo=1", ["--set foo", "no such setting"]),
    ("tasks.infobench.flush", ["expected KEY=VALUE"]),
])
def test_bad_set_values_name_the_key(item, needles):
    assert_one_line_error(invoke(TRACE, "--set", item), *needles)


def test_a_topology_flag_leaves_cpu_tasks_alone_and_an_impossible_setting_names_the_fix():
    tasks = _config(invoke(TRACE, "--topology", "split", "--json", "-"))
    assert tasks["mmlu"]["topology"] == tasks["infobench"]["topology"] == "split"
    assert tasks["graph"]["resource"] == "cpu" and tasks["graph"]["topology"] == "shared"
    assert_one_line_error(invoke(TRACE, "--set", "tasks.graph.topology=split"),
                          "graph", "--set tasks.graph.cpu_workers=4", "--set tasks.graph.topology=direct")


def test_task_map_renames_a_production_traces_tasks():
    burst = ROOT / "traces" / "burstgpt_1_first400.csv"
    unmapped = invoke(burst)   # the importer's warning about failed requests comes too
    assert unmapped.exit_code == 2 and "Traceback" not in unmapped.output
    error = unmapped.stderr.splitlines()[0]
    assert error.startswith("error: ") and "ChatGPT" in error and "--task-map" in error
    result = invoke(burst, "--task-map", "ChatGPT=mmlu,GPT-4=infobench", "--json", "-")
    assert result.exit_code == 0, result.output
    assert set(json.loads(result.stdout)["tasks"]) == {"mmlu", "infobench"}


def test_header_shows_every_setting_and_help_shows_defaults():
    result = runner.invoke(app, ["replay", str(TRACE), "-c", str(SCENARIO)], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for text in ("profile=seed-calibrated", "scenario=design-notes", "gpus=2", "sharing=processor-sharing",
                 "seed=0", "flush=5 s", "max_batch=10", "workers=2", "max_tokens=512", "flush=0.5 s"):
        assert text in result.stdout, text
    helptext = " ".join(runner.invoke(app, ["replay", "--help"], env={"COLUMNS": "200"}).stdout.split())
    for text in ("[default: 0.0]", "[default: 8]", "[default: oldest]", "[default: shared]"):
        assert text in helptext, text


@pytest.mark.parametrize("width", [60, 80])
def test_numbers_are_never_cut_in_narrow_output(width):
    result = runner.invoke(app, ["replay", str(TRACE), "--topology", "split"], env={"COLUMNS": str(width)})
    assert result.exit_code == 0
    assert "…" not in result.stdout
    assert all(len(line) <= width for line in result.stdout.splitlines())
    summary = json.loads(invoke(TRACE, "--topology", "split", "--json", "-").stdout)
    for task, figures in summary["tasks"].items():
        for stat in ("p50", "p90", "p95", "p99", "max"):
            assert f"{figures['latency'][stat]:,.1f}" in result.stdout, (task, stat)
    assert "wait mean" in result.stdout and "p90" in result.stdout


def test_calls_that_failed_at_the_client_timeout_are_listed():
    result = runner.invoke(app, ["replay", str(TRACE), "-c", str(SCENARIO), "--set", "run.client_timeout=120"],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "calls failed" in result.stdout and "client timeout (120 s)" in result.stdout


@pytest.mark.parametrize(
    "args, needles",
    [
        (["missing.json"], ["missing.json", "no such file"]),
        ([TRACE, "--profile", "nope"], ["nope", "seed-calibrated"]),
        ([TRACE, "--topology", "bogus"], ["--topology", "bogus", "shared, split, direct"]),
        ([TRACE, "--policy", "newest"], ["--policy", "oldest"]),
        ([TRACE, "--dispatch", "x"], ["--dispatch", "round-robin"]),
        ([TRACE, "--gpu-sharing", "x"], ["--gpu-sharing", "processor-sharing"]),
        ([TRACE, "--max-batch", "0"], ["--max-batch", "in [1, 1,000,000]"]),
        ([TRACE, "--flush", "-1"], ["--flush", ">= 0"]),
        ([TRACE, "--gpus", "0"], ["--gpus"]),
        ([TRACE, "--rate-scale", "0"], ["--rate-scale", "> 0"]),
        ([TRACE, "--config", "nope.toml"], ["nope.toml", "no such file"]),
        ([TRACE, "--seed", "-1"], ["--seed", "greater than or equal to 0"]),
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


def test_token_figures_follow_percentiles_goodput_and_units():
    result = invoke(TRACE, "--json", "-", "--percentiles", "99,50", "--goodput", "ttft:2s,e2e:60000ms")
    assert result.exit_code == 0, result.output
    tokens = json.loads(result.stdout)["overall"]["tokens"]
    assert list(tokens["ttft_ms"]) == ["mean", "p50", "p99"]
    assert tokens["goodput"] == {"ttft_ms": 2000.0, "e2e_ms": 60000.0}
    assert 0 <= tokens["good"] <= tokens["requests"]
    assert tokens["goodput_fraction"] == pytest.approx(tokens["good"] / tokens["requests"])
    ms = invoke(TRACE, "--goodput", "ttft:2s")
    s = invoke(TRACE, "--units", "s")
    assert ms.exit_code == 0 and s.exit_code == 0
    assert "Token timings per prompt (ms;" in ms.stdout and "goodput/s" in ms.stdout
    assert "Token timings per prompt (s;" in s.stdout and "goodput/s" not in s.stdout
    p50 = tokens["ttft_ms"]["p50"]
    assert f"{p50:,.1f}" in ms.stdout and f"{p50 / 1000:,.4f}" in s.stdout


@pytest.mark.parametrize("args, fragment", [
    (["--goodput", "ttft:200"], "--goodput"), (["--goodput", "speed:2s"], "ttft, itl, tpot, e2e"),
    (["--percentiles", "50,x"], "--percentiles"), (["--percentiles", "150"], "(0, 100]"),
    (["--units", "minutes"], "--units"),
])
def test_token_option_errors_are_one_line(args, fragment):
    assert_one_line_error(invoke(TRACE, *args), fragment)
# -- the load flags of serving benchmarks (translations of the trace and settings) ---------


def _summary(*args: object) -> dict:
    result = invoke(TRACE, "--json", "-", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_num_requests_and_request_rate_replay_the_first_calls_at_that_rate():
    from simulator.trace.formats import load_trace

    first = load_trace(TRACE).head(20)
    s = _summary("--num-requests", "20", "--request-rate", "0.1")
    assert s["config"]["trace"]["calls"] == 20 and s["overall"]["prompts"] == first.n_prompts
    # 20 calls, the last at t: 20 / t calls/s; scaled to 0.1 calls/s.
    assert s["config"]["scenario"]["rate_scale"] == pytest.approx(0.1 / (20 / first.calls[-1].t))


def test_max_concurrency_is_a_closed_loop_client():
    by_flag = _summary("--max-concurrency", "3")
    assert by_flag["config"]["scenario"]["client"] == "closed:3"
    assert by_flag == _summary("--client", "closed:3") == _summary("--client", "closed:3", "--max-concurrency", "3")


def test_benchmark_flags_refuse_what_contradicts_them():
    assert_one_line_error(invoke(TRACE, "--request-rate", "2", "--rate-scale", "2"), "--request-rate", "--rate-scale")
    assert_one_line_error(invoke(TRACE, "--request-rate", "2", "--set", "run.rate_scale=2"),
                          "--request-rate", "--set run.rate_scale")
    for bad in ("0", "-1", "inf", "nan"):
        assert_one_line_error(invoke(TRACE, "--request-rate", bad), "--request-rate")
    assert_one_line_error(invoke(TRACE, "--max-concurrency", "3", "--client", "closed:4"),
                          "--max-concurrency 3", "--client closed:4")
    assert_one_line_error(invoke(TRACE, "--max-concurrency", "3", "--client", "open"), "--client open")
    assert_one_line_error(invoke(TRACE, "--num-requests", "119"), "--num-requests", "118 calls")
    assert invoke(TRACE, "--num-requests", "0").exit_code == 2


def test_a_replay_without_events_or_figures_makes_no_frame_and_loads_no_pandas(tmp_path):
    """The summary is read from the run's columns: pandas (and the frame) only where the
    event log or the figures are asked for."""
    import subprocess
    import sys

    code = ("import sys; sys.argv = ['simctl', 'replay', 'example', '-c', 'design-notes', '--json', sys.argv[1]]\n"
            "from simulator.cli import main\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "print(sorted(m for m in ('pandas', 'pyarrow', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s.json")], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
    summary = json.loads((tmp_path / "s.json").read_text())
    from simulator.model.compiled import extension

    # auto: the kernel's extension where it is built (no numba to load), else the reference engine (a small run)
    engine = summary["config"]["engine"]
    assert (engine == "fast") if extension() is not None else engine.startswith("reference")
    assert summary["overall"]["completed"] == summary["overall"]["prompts"] > 0


def test_the_command_imports_without_collections_then_collects_again(tmp_path):
    """``simctl`` pauses the cyclic collector while a command's modules are imported, then
    collects again with the imports' objects frozen; a command run in another program's
    process (CliRunner here) leaves that program's collector as it was."""
    import gc

    code = """if True:
        import gc, json, sys
        from simulator import cli
        seen = {}
        resume = cli._resume_collection
        def spy():
            seen.setdefault("importing", gc.isenabled())
            resume()
            seen.setdefault("after", gc.isenabled())
            seen.setdefault("frozen", gc.get_freeze_count())
        cli._resume_collection = spy
        sys.argv = ["simctl", "validate", "example"]
        try:
            cli.main()
        except SystemExit:
            pass
        print(json.dumps(seen), file=sys.stderr)
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    seen = json.loads(done.stderr.strip().splitlines()[-1])
    assert seen["importing"] is False and seen["after"] is True and seen["frozen"] > 10_000
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    assert CliRunner().invoke(app, ["validate", "example"]).exit_code == 0
    assert gc.isenabled() and gc.get_freeze_count() == frozen


def test_the_command_starts_one_blas_thread_unless_the_user_chose(monkeypatch):
    from simulator.cli import _one_blas_thread

    # numpy (and its OpenBLAS) is not loaded before main() sets the default
    code = "import sys, simulator.cli; sys.exit('numpy' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    _one_blas_thread()
    assert os.environ["OPENBLAS_NUM_THREADS"] == "1"
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "6")
    _one_blas_thread()
    assert os.environ["OPENBLAS_NUM_THREADS"] == "6"
