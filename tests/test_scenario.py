"""Scenarios: TOML files, precedence of CLI defaults and per-task overrides, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.errors import ScenarioError
from simulator.scenario import TaskConfig, build_scenario

ROOT = Path(__file__).resolve().parents[1]


def test_design_notes_scenario_expresses_the_users_server():
    sc = build_scenario(path=ROOT / "scenarios" / "design-notes.toml")
    assert sc.gpus == 2 and sc.gpu_sharing == "processor-sharing"
    graph, mmlu, ib = (sc.for_task(t) for t in ("graph", "mmlu", "infobench"))
    assert graph.resource == "cpu" and graph.topology == "direct"
    assert (mmlu.topology, mmlu.flush, mmlu.max_batch, mmlu.workers) == ("shared", 0.5, 5, 1)
    assert (ib.topology, ib.flush, ib.max_batch, ib.workers, ib.max_tokens) == ("shared", 5.0, 10, 2, 512)
    assert ib.policy == mmlu.policy == "oldest"


def test_precedence_defaults_then_cli_then_file_tasks(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('[run]\ngpus = 3\n[defaults]\nflush = 1.0\nmax_batch = 4\n[tasks.a]\nflush = 7.0\n')
    sc = build_scenario(path=f, defaults={"flush": 2.0, "max_batch": None}, run={"gpus": None})
    assert sc.gpus == 3
    assert sc.for_task("a").flush == 7.0          # the file's per-task setting wins
    assert sc.for_task("b").flush == 2.0          # the CLI default beats the file's [defaults]
    assert sc.for_task("b").max_batch == 4        # an option not given leaves the file's value
    assert build_scenario(path=f, run={"gpus": 1}).gpus == 1  # CLI run options win


def test_task_config_defaults():
    assert build_scenario().for_task("anything") == TaskConfig()


@pytest.mark.parametrize("text,record,field", [
    ('[defaults]\nflush = -1\n', "defaults", "flush"),
    ('[defaults]\nmax_batch = 0\n', "defaults", "max_batch"),
    ('[defaults]\nmax_batch = 2.5\n', "defaults", "max_batch"),
    ('[tasks.a]\ncolour = "red"\n', "tasks.a", "colour"),
    ('[tasks.a]\ntopology = "ring"\n', "tasks.a", "topology"),
    ('[tasks.a]\npolicy = "fifo"\n', "tasks.a", "policy"),
    ('[tasks.a]\ndispatch = "hash"\n', "tasks.a", "dispatch"),
    ('[tasks.a]\nresource = "tpu"\n', "tasks.a", "resource"),
    ('[run]\ngpus = 0\n', "run", "gpus"),
    ('[run]\ngpu_sharing = "mps"\n', "run", "gpu_sharing"),
    ('[run]\ndeadline = -5\n', "run", "deadline"),
    ('[run]\nspeed = 2\n', "run", "speed"),
])
def test_bad_scenarios_name_file_record_and_field(tmp_path, text, record, field):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(ScenarioError) as err:
        build_scenario(path=f)
    msg = str(err.value)
    assert msg.startswith(f"{f}: {record}: field '{field}'"), msg
    assert "\n" not in msg


def test_unknown_topology_lists_the_valid_ones():
    with pytest.raises(ScenarioError, match="valid: shared, split, direct"):
        build_scenario(defaults={"topology": "ring"})


def test_not_toml_and_missing_file(tmp_path):
    f = tmp_path / "x.toml"
    f.write_text("[run\n")
    with pytest.raises(ScenarioError, match="not valid TOML"):
        build_scenario(path=f)
    with pytest.raises(ScenarioError, match="no such file"):
        build_scenario(path=tmp_path / "missing.toml")


def test_scenario_is_frozen_and_serialisable():
    import dataclasses
    import json

    sc = build_scenario(defaults={"flush": 0.5})
    with pytest.raises(dataclasses.FrozenInstanceError):
        sc.gpus = 4  # type: ignore[misc]
    assert json.loads(json.dumps(sc.to_dict()))["defaults"]["flush"] == 0.5
