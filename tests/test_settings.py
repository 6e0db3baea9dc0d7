"""The settings schema: each setting declared once, and what is made from it agrees with it.

Checks, flags, sweep axes, ``--set`` keys and the docs' table all come from
``simulator/settings.py``; these tests hold the pieces that cannot be generated (the model's
the registries' names) to the declarations, and the generated ones to
what they were made from.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import assert_one_line_error
from typer.testing import CliRunner

from simulator.cli import app
from simulator.errors import ScenarioError
from simulator.scenario import Scenario, TaskConfig, build_scenario, parse_set
from simulator.settings import (
    AXES,
    RUN,
    SETTINGS,
    TASK,
    RunSettings,
    _declared,
    check_values,
    for_command,
    ignored_by,
    reference_table,
    registry,
    setting,
)
from simulator.sweep import SweepError, parse_axis_values

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "traces" / "batch_arrivals.json"
runner = CliRunner()


# -- the declarations ---------------------------------------------------------------------


def test_every_field_of_the_configuration_is_a_declared_setting():
    assert list(TASK) == [f.name for f in dataclasses.fields(TaskConfig)]
    assert list(RUN) == [f.name for f in dataclasses.fields(RunSettings)]
    run_fields = {f.name for f in dataclasses.fields(Scenario)} - {
        "name", "description", "defaults", "tasks", "compositions", "source"}
    assert run_fields == set(RUN)


@pytest.mark.parametrize("spec", SETTINGS, ids=lambda s: s.name)
def test_each_default_passes_its_own_check_and_a_wrong_kind_of_value_does_not(spec):
    assert spec.check(spec.default, "f.toml", "defaults") == spec.default
    with pytest.raises(ScenarioError) as err:
        spec.check({"a": "table"}, "f.toml", "tasks.x")
    assert str(err.value).startswith(f"f.toml: tasks.x: field '{spec.name}': ")
    assert spec.help and not spec.help.endswith(".")   # commands and the table add the full stop


def test_names_of_topologies_and_kinds_are_registered():
    topologies = registry("simulator.model:TOPOLOGIES")
    kinds = registry("simulator.profile.kinds:KINDS")
    for spec in SETTINGS:
        assert set(spec.read_by) <= set(topologies), spec.name
        assert set(spec.kinds) <= set(kinds), spec.name
        assert set(spec.cli) <= {"replay", "sweep", "plan"}, spec.name
        assert not spec.cli or spec.value_type in (int, float, str, bool), spec.name   # one typed option
        assert not spec.registry or spec.names(), spec.name
        if spec.scope == "run":
            assert not spec.read_by and not spec.kinds, spec.name


def test_what_a_topology_does_not_read_comes_from_the_declarations():
    """``ignored_by`` is the one list of what each registered topology never reads (sweeps
    skip those axes for it); the micro-batching queues read the batching settings and the
    continuous engine does not."""
    topologies = registry("simulator.model:TOPOLOGIES")
    for name in topologies:
        assert not hasattr(topologies.get(name), "ignores"), name
    assert {"flush", "policy", "max_batch"} <= ignored_by("continuous")
    assert not {"flush", "policy", "max_batch"} & ignored_by("shared")
    assert "kv_blocks" in ignored_by("split") and "workers" in ignored_by("direct")
    assert ignored_by("no-such-topology") == frozenset()


def test_importing_the_scenario_imports_nothing_of_the_model():
    code = ("import sys, simulator.scenario, simulator.settings; "
            "sys.exit('simulator.model' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=False).returncode == 0


def test_a_new_field_is_a_setting_with_its_type_default_and_range():
    @dataclasses.dataclass(frozen=True)
    class Extra:
        prefill_chunk: int | None = setting(None, "Prompt tokens one prefill takes per iteration", min=1,
                                            read_by=("continuous",), sweepable=True, cli=("replay", "sweep"))

    spec = _declared(Extra, "task")["prefill_chunk"]
    assert (spec.value_type, spec.optional, spec.default, spec.flag) == (int, True, None, "--prefill-chunk")
    assert Extra().prefill_chunk is None
    assert spec.check(512) == 512 and spec.check(None) is None
    with pytest.raises(ScenarioError, match="must be an integer >= 1, got 0"):
        spec.check(0)
    assert not spec.reads("shared") and spec.reads("continuous")


# -- checks ---------------------------------------------------------------------------------


@pytest.mark.parametrize("scope, values, message", [
    ("task", {"flush": -1}, "must be a number of seconds >= 0, got -1"),
    ("task", {"flush": True}, "must be a number of seconds >= 0, got True"),
    ("task", {"acceptance": 1.5}, "must be a probability in [0, 1], got 1.5"),
    ("task", {"queue_timeout": 0}, "must be a number of seconds > 0, got 0"),
    ("task", {"priority": 1.5}, "must be an integer (higher is served first) in [-2,147,483,647, 2,147,483,647], "
                                "got 1.5"),
    ("task", {"discipline": "wavy"}, "must be ragged or lockstep, got 'wavy'"),
    ("task", {"sticky_gpu": 1}, "must be true or false, got 1"),
    ("task", {"policy": ""}, "must be a name, got ''"),
    ("task", {"policy": "fifo"}, "unknown batching policy 'fifo'; valid: oldest, pickup"),
    ("task", {"gpus": 2}, "unknown setting; 'gpus' is a run setting"),
    ("run", {"flush": 2}, "unknown setting; 'flush' is a task setting"),
    ("run", {"deadline": float("inf")}, "must be a number of seconds > 0, got inf"),
    ("run", {"rate_scale": float("nan")}, "must be a number > 0, got nan"),
    ("run", {"engine": "turbo"}, "must be auto, reference or fast, got 'turbo'"),
    ("run", {"client": "closed:0"}, "closed loop needs N >= 1"),
    ("run", {"group_order": ["a", ""]}, "must be a list of task names"),
    ("run", {"gpu_sharing": "mps"}, "unknown GPU sharing mode 'mps'; valid: exclusive, processor-sharing"),
    # absurd sizes are refused up front with the range, not run until memory runs out
    ("run", {"gpus": 2**63 - 1}, "must be an integer in [1, 100,000], got 9223372036854775807"),
    ("task", {"workers": 10**18}, "must be an integer in [1, 1,000,000], got 1000000000000000000"),
    ("task", {"max_batch": 10**7}, "must be an integer in [1, 1,000,000]"),
    ("task", {"priority": -2**40}, "must be an integer (higher is served first) in [-2,147,483,647, 2,147,483,647]"),
])
def test_checks_say_what_a_valid_value_is(scope, values, message):
    with pytest.raises(ScenarioError) as err:
        check_values(scope, values, "s.toml", scope)
    assert message in str(err.value) and str(err.value).startswith(f"s.toml: {scope}: field '{next(iter(values))}'")


def test_checked_values_take_the_settings_types():
    assert check_values("task", {"flush": 1, "acceptance": 1}, None, None) == {"flush": 1.0, "acceptance": 1.0}
    assert isinstance(check_values("task", {"flush": 1}, None, None)["flush"], float)
    assert check_values("run", {"group_order": ["b", "a"], "deadline": 5}, None, None) == {
        "group_order": ("b", "a"), "deadline": 5.0}


def test_set_reaches_run_and_task_settings_by_their_dotted_names():
    scenario = build_scenario(overrides=parse_set([
        "run.gpus=3", "run.engine=reference", "run.host_lock=true", 'run.group_order=["mmlu"]',
        "tasks.a.flush=0.25", "tasks.a.sticky_gpu=true", "tasks.a.dispatch_per=group", "defaults.priority=2"]))
    assert (scenario.gpus, scenario.engine, scenario.host_lock, scenario.group_order) == (3, "reference", True,
                                                                                          ("mmlu",))
    a = scenario.for_task("a")
    assert (a.flush, a.sticky_gpu, a.dispatch_per, a.priority) == (0.25, True, "group", 2)
    with pytest.raises(ScenarioError, match="--set defaults.gpus: field 'gpus': unknown setting; 'gpus' is a run"):
        build_scenario(overrides=parse_set(["defaults.gpus=3"]))


# -- generated options, axes and docs ---------------------------------------------------


@pytest.mark.parametrize("command", ["replay", "sweep", "plan"])
def test_each_command_has_a_flag_for_each_setting_it_takes(command):
    text = runner.invoke(app, [command, "--help"]).stdout
    flags = set(re.findall(r"(--[a-z][a-z-]*)", text))
    assert {s.flag for s in for_command(command)} <= flags
    assert "--engine" in flags


def test_engine_flag_sets_the_run_and_a_bad_value_names_the_flag(tmp_path):
    result = runner.invoke(app, ["replay", str(TRACE), "--engine", "reference", "--json", "-"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["config"]["scenario"]["engine"] == "reference"
    assert_one_line_error(runner.invoke(app, ["replay", str(TRACE), "--engine", "turbo"]),
                          "--engine:", "auto, reference or fast")
    assert_one_line_error(runner.invoke(app, ["sweep", str(TRACE), "--flush", "0", "--deadline", "-1",
                                              "-o", str(tmp_path / "s.parquet")]), "--deadline:", "> 0")
    assert_one_line_error(runner.invoke(app, ["plan", str(TRACE), "--slo", "overall.latency.p95<=1",
                                              "--engine", "x"]), "--engine:")


def test_the_largest_sizes_run_in_bounded_time_and_memory():
    """At the limits the settings allow, a replay of the bundled trace still finishes: no
    table is sized by a setting past what the trace can use (batch sizes past its prompts)."""
    result = runner.invoke(app, ["replay", str(TRACE), "-c", "design-notes", "--max-batch", "1000000",
                                 "--set", "tasks.infobench.workers=1000000", "--set", "tasks.graph.cpu_workers=1000000"])
    assert result.exit_code == 0, result.output


def test_replay_flag_errors_name_the_flag():
    assert_one_line_error(runner.invoke(app, ["replay", str(TRACE), "--max-batch", "0"]), "--max-batch:",
                           "in [1, 1,000,000]")
    assert_one_line_error(runner.invoke(app, ["replay", str(TRACE), "--client", "closed:x"]), "--client:")


@pytest.mark.parametrize("name", AXES)
def test_every_axis_parses_values_of_its_settings_type(name):
    spec = next(s for s in SETTINGS if s.name == name)
    sample = {int: "1,2", float: "0.5,1", bool: "true,false"}.get(spec.value_type, ",".join(spec.names()[:2]) or "a,b")
    values = parse_axis_values(name, sample)
    assert len(values) == 2 and all(isinstance(v, spec.value_type) for v in values)
    if spec.value_type in (int, float):
        with pytest.raises(SweepError, match=f"{spec.flag}: expected comma-separated"):
            parse_axis_values(name, "1,x")


def test_an_unknown_axis_lists_the_axes():
    with pytest.raises(SweepError, match="unknown sweep axis; valid: policy, topology, flush"):
        parse_axis_values("priority", "1,2")


def test_the_docs_table_is_the_one_the_settings_make():
    page = (ROOT / "docs" / "model.md").read_text()
    block = re.search(r"<!-- BEGIN generated: scenario-settings -->\n(.*?)<!-- END generated: scenario-settings -->",
                      page, re.DOTALL)
    assert block is not None, "docs/model.md has no scenario-settings block"
    assert block.group(1) == reference_table(), (
        "docs/model.md's settings table is stale: run `python docs/build.py docs/model.md` (or `make docs`)")
    assert all(f"| `{s.name}` |" in block.group(1) for s in SETTINGS)
