"""The edges of what simctl reads: scenario task names checked against the run, control
characters in names, files refused from their head, numbers past what a field holds, and
readers' messages naming the record and the field (``tests/hostile_inputs_edges.py`` holds
the generated cases)."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from helpers import assert_one_line_error
from hostile_inputs_edges import CLASSES, names_cases, sizes_cases
from typer.testing import CliRunner

from simulator.cli import app
from simulator.errors import ScenarioError, SimctlWarning, TraceError
from simulator.profile import load_profile
from simulator.scenario import build_scenario, check_tasks
from simulator.trace.formats import load_trace

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps([{"t": i, "prompts": [task]} for i, task in enumerate(["mmlu", "infobench", "graph"])]))
    return path


# -- scenario task names ----------------------------------------------------------------

def test_a_typo_in_a_scenario_task_is_refused_with_the_task_meant(tmp_path, trace):
    scenario = tmp_path / "s.toml"
    scenario.write_text("[tasks.mmluu]\nflush = 0.1\n")
    assert_one_line_error(runner.invoke(app, ["replay", str(trace), "-c", str(scenario)]),
                          "s.toml", "tasks.mmluu", "unknown task 'mmluu'", "did you mean 'mmlu'?",
                          "graph", "infobench")


def test_a_task_far_from_every_known_one_lists_them_without_a_guess(trace):
    result = runner.invoke(app, ["replay", str(trace), "--set", "tasks.zzz.flush=1"])
    assert_one_line_error(result, "tasks.zzz", "unknown task 'zzz' (tasks the trace and the profile")
    assert "did you mean" not in result.stderr


@pytest.mark.parametrize("words", [["sweep", "--flush", "0,1", "-j", "1"],
                                   ["plan", "--slo", "mmlu.latency.p95<=100", "--flush", "0", "--max-gpus", "1",
                                    "-j", "1"]])
def test_sweeps_and_plans_check_the_scenario_tasks_before_any_replay(tmp_path, trace, words):
    scenario = tmp_path / "s.toml"
    scenario.write_text("[tasks.infobnch]\nflush = 0.1\n")
    out = ["-o", str(tmp_path / "r.parquet")] if words[0] == "sweep" else []
    result = runner.invoke(app, [words[0], str(trace), "-c", str(scenario), *words[1:], *out])
    assert_one_line_error(result, "s.toml", "tasks.infobnch", "did you mean 'infobench'?")
    assert not (tmp_path / "r.parquet").exists()


def test_a_task_the_profile_serves_but_the_trace_lacks_is_a_warning(tmp_path):
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps([{"t": 0, "prompts": ["infobench"]}]))
    scenario = tmp_path / "s.toml"
    scenario.write_text("[tasks.mmlu]\nflush = 0.1\n")
    result = runner.invoke(app, ["replay", str(trace), "-c", str(scenario)])
    assert result.exit_code == 0, result.output
    assert "warning: " in result.stderr and "tasks.mmlu" in result.stderr and "no prompt of task 'mmlu'" in result.stderr


def test_check_tasks_is_the_one_check_of_a_scenario_against_a_profile_and_a_trace():
    profile = load_profile("seed-calibrated")
    scenario = build_scenario(path="design-notes")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_tasks(scenario, profile.tasks, ["graph", "mmlu", "infobench"])  # all known: silent
        check_tasks(scenario, profile.tasks)  # no trace (serve): the profile's tasks are enough
    with pytest.warns(SimctlWarning, match="tasks.graph: the trace has no prompt of task 'graph'"):
        check_tasks(scenario, profile.tasks, ["mmlu", "infobench"])
    typo = build_scenario(overrides={"tasks.grahp.flush": 1.0})
    with pytest.raises(ScenarioError, match=r"tasks.grahp: unknown task 'grahp'; did you mean 'graph'\?"):
        check_tasks(typo, profile.tasks)


@pytest.mark.parametrize("toml, needles", [
    ('[tasks."mm\\nlu"]\nflush = 0.1\n', ["tasks.'mm\\nlu'", "control character ('\\n'"]),
    ('name = "a\\tb"\n', ["field 'name'", "control character ('\\t'"]),
    ('[compositions]\n"x\\u001b" = {any = ["mmlu"]}\n', ["compositions.", "control character ('\\x1b'"]),
    ('[compositions]\nx = {any = ["mm\\rlu"]}\n', ["compositions.x", "field 'any'", "control character"]),
    ('[tasks.mmlu]\ndispatch_group = "q\\u0000"\n', ["tasks.mmlu", "field 'dispatch_group'", "control character"]),
])
def test_control_characters_in_scenario_names_are_refused_naming_the_field(tmp_path, trace, toml, needles):
    scenario = tmp_path / "s.toml"
    scenario.write_text(toml)
    assert_one_line_error(runner.invoke(app, ["replay", str(trace), "-c", str(scenario)]), "s.toml", *needles)


def test_control_characters_in_trace_and_profile_names_are_refused(tmp_path, trace):
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps({"format": "simctl-trace/1", "meta": {},
                               "calls": [{"id": "0", "t": 0, "prompts": [{"task": "mm\u0085lu"}]}]}))
    assert_one_line_error(runner.invoke(app, ["validate", str(bad)]), "t.json", "record 0", "prompts[0].task",
                          "control character")
    doc = json.loads((ROOT / "profiles" / "seed-calibrated.json").read_text())
    doc["tasks"]["mm\nlu"] = doc["tasks"].pop("mmlu")
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps(doc))
    assert_one_line_error(runner.invoke(app, ["replay", str(trace), "-p", str(profile)]), "p.json",
                          "task 'mm\\nlu'", "control character")


# -- files refused from their head ------------------------------------------------------

def test_a_sparse_file_of_zeros_is_refused_at_once(tmp_path):
    """512 MiB of NUL bytes took 13 s and 1.2 GB before it was called not JSON; the head
    check refuses it from its first bytes (the timeout is only a guard against a hang)."""
    path = tmp_path / "zeros.json"
    with open(path, "wb") as fh:
        fh.truncate(512 << 20)
    done = subprocess.run([sys.executable, "-c", "import sys; from simulator.cli import main; sys.exit(main())",
                           "validate", str(path)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and "zeros.json" in lines[0], done.stderr
    assert "NUL byte at offset 0" in lines[0]


@pytest.mark.parametrize("content, needle", [
    (b"hello\n" * 10, "not valid JSON: Expecting value at line 1, column 1"),
    (b"\n\n   x = 1\n", "not valid JSON: Expecting value at line 3, column 4"),
    (b"\x89PNG\r\n\x1a\n" + b"\xff" * 100, "not a UTF-8 text file (bad byte at offset 0)"),
    (b"[1, 2" + b"\0" * 100, "not a text file (a NUL byte at offset 5)"),
])
def test_a_head_that_is_no_format_is_refused_as_the_parser_would(tmp_path, content, needle):
    path = tmp_path / "t.json"
    path.write_bytes(content)
    with pytest.raises(TraceError, match="t.json: " + needle.replace("(", r"\(").replace(")", r"\)")):
        load_trace(path)
    if content.startswith(b"\n\n"):  # the line and column are those json itself reports
        with pytest.raises(json.JSONDecodeError) as exc:
            json.loads(content)
        assert (exc.value.lineno, exc.value.colno) == (3, 4)


@pytest.mark.parametrize("flag", ["-p", "-c"])
def test_profiles_and_scenarios_are_refused_from_their_head_too(tmp_path, trace, flag):
    path = tmp_path / "zeros"
    with open(path, "wb") as fh:
        fh.truncate(64 << 20)
    assert_one_line_error(runner.invoke(app, ["replay", str(trace), flag, str(path)]), "zeros",
                          "NUL byte at offset 0")


# -- numbers and ids --------------------------------------------------------------------

def test_a_profile_number_past_any_float_names_the_task_and_field(tmp_path, trace):
    doc = json.loads((ROOT / "profiles" / "seed-calibrated.json").read_text())
    task = next(t for t, spec in doc["tasks"].items() if "mean" in spec["service"])
    doc["tasks"][task]["service"]["mean"] = "@@"
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps(doc).replace('"@@"', "9" * 401))
    assert_one_line_error(runner.invoke(app, ["replay", str(trace), "-p", str(profile)]), "p.json",
                          f"task '{task}'", "service.mean", "too large", "401 digits")


@pytest.mark.parametrize("layout", ["list", "written"])
@pytest.mark.parametrize("value", [None, 1.5, [], {}, True, ""])
def test_a_call_id_that_is_neither_a_string_nor_an_integer_is_refused(tmp_path, layout, value):
    calls = [{"id": "a", "t": 0, "prompts": ["mmlu"]}, {"id": value, "t": 1, "prompts": ["mmlu"]}]
    path = tmp_path / "t.json"
    if layout == "list":
        path.write_text(json.dumps(calls))
    else:  # one call a line, as simctl writes it (the fast reader's layout)
        path.write_text('{\n  "format": "simctl-trace/1",\n  "meta": {},\n  "calls": [\n    '
                        + ",\n    ".join(json.dumps(c) for c in calls) + "\n  ]\n}\n")
    assert_one_line_error(runner.invoke(app, ["validate", str(path)]), "t.json", "record 1", "field 'id'",
                          "must be a non-empty string or an integer")


def test_an_integer_call_id_is_still_read_as_its_text(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps([{"id": 7, "t": 0, "prompts": ["mmlu"]}]))
    assert load_trace(path).calls[0].id == "7"


# -- readers' messages ------------------------------------------------------------------

@pytest.mark.parametrize("value", [1, True, "x", 1e308, {}])
def test_mooncake_hash_ids_not_a_list_names_the_line_and_field(tmp_path, value):
    path = tmp_path / "m.jsonl"
    good = {"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "hash_ids": value}) + "\n")
    assert_one_line_error(runner.invoke(app, ["validate", str(path)]), "m.jsonl", "line 2", "field 'hash_ids'",
                          "must be a list")


def test_a_mooncake_number_past_any_float_names_the_line_and_field(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
                    '{"timestamp": ' + "9" * 401 + ', "input_length": 10, "output_length": 5}\n')
    assert_one_line_error(runner.invoke(app, ["validate", str(path)]), "m.jsonl", "line 2", "field 'timestamp'",
                          "401 digits")


@pytest.mark.parametrize("rows, needles", [
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n2023-11-16 18:15:50.99,396,\"\n",
     ["line 3", "quoted field", "never closed"]),
    ("0,2,1,Gamma,1.0,0.5\n10,3,1.5,Weibull,0.8,4,9\n", ["line 2", "has 7 fields", "have 6"]),
])
def test_a_csv_the_parser_gives_up_on_names_the_line(tmp_path, rows, needles):
    path = tmp_path / "t.csv"
    path.write_text(rows)
    assert_one_line_error(runner.invoke(app, ["validate", str(path)]), "t.csv", *needles)


# -- the generated cases ----------------------------------------------------------------

@pytest.mark.parametrize("cases", [names_cases, sizes_cases], ids=["names", "sizes"])
def test_every_generated_edge_case_is_handled(cases):
    tried, handled, failures = cases(12)
    assert tried == 12
    assert handled == tried, "\n\n".join(failures[:3])


def test_the_classes_are_those_the_benchmark_reports():
    assert set(CLASSES) == {"scenario name typos and control characters", "huge and non-format files"}
    assert CLASSES["huge and non-format files"](3) == (3, 3)
