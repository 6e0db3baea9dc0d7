"""simulator.profile.identity: what each profile describes, read from wherever it says so."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simulator.cli import app
from simulator.errors import ProfileError
from simulator.profile import load_profile, profile_from_dict
from simulator.profile.identity import NOT_STATED, ProfileIdentity, describe

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = sorted(p.stem for p in (ROOT / "profiles").glob("*.json"))
TASK = {"resource": "gpu", "service": {"kind": "distribution", "dist": "deterministic", "mean": 1.0}}
runner = CliRunner()


@pytest.mark.parametrize("name", BUNDLED)
def test_every_bundled_profile_says_every_field_of_what_it_describes(name):
    profile = load_profile(name)
    identity = describe(profile)
    for f in fields(ProfileIdentity):
        value = getattr(identity, f.name)
        assert value not in ("", None), f.name
    # the texts are the profile's own, written for it
    assert identity.describes == profile.describes and len(profile.describes) > 40
    assert identity.answers == profile.answers and len(profile.answers) > 40
    assert identity.source in ("measured", "composed", "calibrated", "composed, calibrated", "given")
    assert name in identity.line() and "\n" not in identity.line()


def test_composed_profiles_read_meta_grounded_with_tp_and_dtype_defaults():
    identity = describe(load_profile("h100-sxm-qwen3-8b-qwen3-0.6b-cuda-graph"))
    assert (identity.gpu, identity.tp, identity.dtype, identity.model, identity.draft, identity.engine,
            identity.engine_version) == ("h100-sxm", 1, "bf16", "qwen3-8b", "qwen3-0.6b", "cuda-graph",
                                         "trtllm-1.3.0rc20")
    assert (identity.acceptance, identity.kv_cache, identity.source) == ("0.7", "yes", "composed")
    data = load_profile("h100-sxm-llama-3.1-8b-cuda-graph").to_dict()
    data["meta"]["grounded"] |= {"tp": 2, "dtype": "fp8"}
    assert (describe(profile_from_dict(data)).tp, describe(profile_from_dict(data)).dtype) == (2, "fp8")


def test_the_users_calibrated_speculative_server_says_acceptance_and_no_kv_cache():
    identity = describe(load_profile("a100-sxm-qwen3-4b-qwen3-0.6b-hf-eager"))
    assert identity.acceptance == "0.02" and identity.kv_cache == "mmlu yes / infobench no"
    assert identity.source == "composed, calibrated" and identity.gpu == "a100-sxm"
    fitted = describe(load_profile("qwen3-4b-specdec-fw5"))
    assert (fitted.model, fitted.draft, fitted.gpu, fitted.source) == ("qwen3-4b", "qwen3-0.6b", "a100-sxm",
                                                                        "calibrated")


def test_measured_and_hand_set_profiles():
    measured = describe(load_profile("cpu__tiny__tiny"))
    assert (measured.source, measured.model, measured.draft, measured.dtype) == ("measured", "tiny", "tiny", "float32")
    given = describe(load_profile("seed-calibrated"))
    assert given.source == "given" and given.acceptance == "not modelled" and given.model == NOT_STATED


def test_a_profile_that_states_nothing_reads_not_stated_never_empty():
    identity = describe(profile_from_dict({"tasks": {"x": TASK}}))
    assert identity.gpu == identity.model == identity.describes == NOT_STATED
    assert identity.kv_cache == "not modelled" and identity.source == "given"


def test_describes_and_answers_load_round_trip_and_must_be_text():
    data = {"name": "p", "describes": "a system", "answers": "a question", "tasks": {"x": TASK}}
    profile = profile_from_dict(data)
    assert (profile.describes, profile.answers) == ("a system", "a question")
    assert profile_from_dict(profile.to_dict()).to_dict() == profile.to_dict()
    with pytest.raises(ProfileError, match="describes"):
        profile_from_dict({**data, "describes": 3})


def test_a_composed_profile_gets_describes_and_answers(tmp_path):
    out = tmp_path / "p.json"
    result = runner.invoke(app, ["profile", "--gpu", "a100-sxm", "--model", "qwen3-8b", "-o", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert "qwen3-8b" in data["describes"] and "a100-sxm" in data["describes"]
    assert "qwen3-8b" in data["answers"]
    given = tmp_path / "q.json"
    result = runner.invoke(app, ["profile", "--gpu", "a100-sxm", "--model", "qwen3-8b", "-o", str(given),
                                 "--describes", "our box", "--answers", "our question"])
    assert result.exit_code == 0, result.output
    assert describe(load_profile(given)).describes == "our box"


def test_the_replay_header_prints_the_identity_in_one_line_and_json_carries_it():
    args = ["replay", "example", "-c", "design-notes", "-p", "a100-sxm-qwen3-4b-qwen3-0.6b-hf-eager"]
    result = runner.invoke(app, args, env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    line = next(x for x in result.stdout.splitlines() if x.strip().startswith("profile a100-sxm"))
    for text in ("qwen3-4b + qwen3-0.6b draft", "GPU a100-sxm", "tp 1", "dtype bf16", "engine hf-eager",
                 "acceptance 0.02", "KV cache mmlu yes / infobench no", "composed, calibrated"):
        assert text in line, text
    assert "acceptance=profile's (0.02)" in result.stdout
    doc = json.loads(runner.invoke(app, [*args, "--json", "-"]).stdout)
    assert doc["config"]["profile"]["identity"]["acceptance"] == "0.02"
    assert doc["config"]["profile"]["identity"]["kv_cache"] == "mmlu yes / infobench no"


def test_the_plan_header_prints_each_profile_and_json_carries_them():
    args = ["plan", "example", "-p", "h100-sxm-llama-3.1-8b-cuda-graph", "--slo", "infobench.latency.p95<=1000",
            "--flush", "0", "--topology", "shared", "--max-batch", "10", "--max-gpus", "2",
            "--objective", "fewest-gpus", "-j", "1"]
    result = runner.invoke(app, args, env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].startswith("profile h100-sxm-llama-3.1-8b-cuda-graph: model llama-3.1-8b")
    doc = json.loads(runner.invoke(app, [*args, "--json", "-"]).stdout)
    assert [p["model"] for p in doc["profiles"]] == ["llama-3.1-8b"]
