"""simulator.profile.grid: a composed profile warns when a run leaves the grid it was fitted on."""

from __future__ import annotations

from helpers import make_trace
from typer.testing import CliRunner

from simulator.cli import app
from simulator.profile import load_profile
from simulator.profile.grid import fitted_grids, outside_grid
from simulator.replay import replay
from simulator.scenario import build_scenario
from simulator.trace.formats import save_trace
from simulator.trace.model import Call, Prompt, Trace

COMPOSED = "h100-sxm-llama-3.1-8b-cuda-graph"   # infobench grid: rows 1..32, contexts 350..862
runner = CliRunner()


def burst(prompts: int, prompt_tokens: int = 350, max_tokens: int = 512) -> Trace:
    """One call of ``prompts`` InfoBench prompts at t = 0."""
    return Trace((Call("0", 0.0, tuple(Prompt("infobench", prompt_tokens, max_tokens) for _ in range(prompts))),))


def findings(trace: Trace, max_batch: int) -> list:
    profile = load_profile(COMPOSED)
    scenario = build_scenario(path="design-notes", overrides={"tasks.infobench.max_batch": max_batch})
    result = replay(trace, scenario, profile)
    assert result.summary["config"]["profile"]["outside_grid"] == [o.to_dict() for o in outside_grid(profile, result.log)]
    return outside_grid(profile, result.log)


def test_composed_profiles_record_their_grid_and_others_none():
    grids = fitted_grids(load_profile(COMPOSED))
    assert max(grids["infobench"]["rows"]) == 32 and max(grids["infobench"]["context"]) == 862
    assert fitted_grids(load_profile("seed-calibrated")) == {}
    assert "context" in fitted_grids(load_profile("h100-sxm-qwen3-8b-qwen3-0.6b-cuda-graph"))["infobench"]  # views


def test_a_run_within_the_grid_warns_of_nothing():
    assert findings(burst(10), max_batch=10) == []
    # up to twice the largest context is near enough
    assert findings(burst(4, prompt_tokens=1000, max_tokens=700), max_batch=10) == []


def test_more_rows_than_the_grid_warns_naming_profile_task_grid_and_value():
    [found] = findings(burst(40), max_batch=40)
    assert (found.task, found.what, found.value, found.grid_max) == ("infobench", "rows", 40, 32)
    text = found.message()
    assert COMPOSED in text and "infobench" in text and "40 rows" in text and "1, 2, 3, 6, 10, 18, 32" in text


def test_contexts_far_beyond_the_grid_warn():
    [found] = findings(burst(2, prompt_tokens=3000, max_tokens=512), max_batch=10)
    assert (found.what, found.value, found.grid_max) == ("context", 3512, 862)


def test_a_profile_without_a_grid_never_warns():
    result = replay(burst(40), build_scenario(path="design-notes", overrides={"tasks.infobench.max_batch": 40}),
                    load_profile("seed-calibrated"))
    assert result.summary["config"]["profile"]["outside_grid"] == []


def test_replay_prints_one_warning_line_per_finding(tmp_path):
    path = tmp_path / "t.json"
    save_trace(burst(40), path)
    result = runner.invoke(app, ["replay", str(path), "-c", "design-notes", "-p", COMPOSED, "--max-batch", "40"])
    assert result.exit_code == 0, result.output
    # (design-notes also configures tasks this trace has none of: a warning of its own each)
    warnings = [x for x in result.stderr.splitlines() if x.startswith("warning:") and "fitted grid" in x]
    assert len(warnings) == 1 and "40 rows" in warnings[0] and COMPOSED in warnings[0]
    path_in = tmp_path / "u.json"
    save_trace(make_trace([(0.0, ["infobench"] * 4)]), path_in)
    result = runner.invoke(app, ["replay", str(path_in), "-c", "design-notes", "-p", COMPOSED])
    assert result.exit_code == 0 and "fitted grid" not in result.stderr
