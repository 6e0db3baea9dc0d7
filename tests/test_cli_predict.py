"""``simctl predict``: the figures it prints and writes are the library's, averaged over whole
simulated runs; against an observed run, the errors are ``predict()``'s; bad input is one
``error:`` line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error
from typer.testing import CliRunner

from simulator.calibrate import predict, simulate_figures
from simulator.cli import app
from simulator.metrics import client_calls
from simulator.model import simulate
from simulator.observed import read_observed
from simulator.profile import load_profile
from simulator.scenario import build_scenario
from simulator.trace.formats import load_trace

ROOT = Path(__file__).resolve().parents[1]
REQUEST = (ROOT.parent / "shared" / "traces" / "real" / "lminference" / "EEElisa@dfb2bf8" / "mingqia2_3" / "request")
needs_shared = pytest.mark.skipif(not REQUEST.exists(), reason=f"the users' real runs are not present at {REQUEST}")
STATS = ("p50", "p90", "p99", "mean")


def _invoke(*args: str):
    return CliRunner().invoke(app, ["predict", *args])


def _library_figures(seeds: int = 2):
    return simulate_figures(load_trace("example"), build_scenario(path="design-notes"),
                            load_profile("seed-calibrated"), tuple(range(seeds)))


def test_predict_prints_and_writes_the_librarys_figures(tmp_path):
    out = tmp_path / "figures.json"
    result = _invoke("example", "-s", "design-notes", "-p", "seed-calibrated", "--seeds", "2", "--json", str(out))
    assert result.exit_code == 0, result.output
    expected = _library_figures().set_index("group")
    assert "Call latency predicted" in result.stdout and "over 2 whole runs" in result.stdout
    for group, row in expected.iterrows():
        assert group in result.stdout
        digits = 1 if row["p90"] >= 10 else 2
        assert f"{row['p90']:,.{digits}f} ± {row['p90_sd']:,.{digits}f}" in result.stdout
    data = json.loads(out.read_text())
    assert data["format"] == "simctl-predict/1" and data["seeds"] == [0, 1] and data["observed"] is None
    written = {r["group"]: r for r in data["figures"]}
    assert list(written) == list(expected.index)
    for group, row in expected.iterrows():
        assert written[group]["calls"] == row["calls"]
        for column in ("unfinished", *STATS, *(f"{s}_sd" for s in ("unfinished", *STATS))):
            assert written[group][column] == pytest.approx(row[column]), (group, column)
    # -c names the scenario too (as in replay); an existing output needs --force
    again = _invoke("example", "-c", "design-notes", "-p", "seed-calibrated", "--seeds", "2", "--json", str(out))
    assert_one_line_error(again, str(out), "--force")
    forced = _invoke("example", "-c", "design-notes", "-p", "seed-calibrated", "--seeds", "2", "--json", str(out), "--force")
    assert forced.exit_code == 0, forced.output
    assert json.loads(out.read_text()) == data


def test_simulated_figures_are_averages_of_whole_runs_per_class():
    """Each seed is one run: p90 is the mean of the per-run p90s, not the p90 of per-call
    averages (narrower, so lower), computed here from ``simulate`` independently."""
    trace, scenario, profile = load_trace("example"), build_scenario(path="design-notes"), load_profile("seed-calibrated")
    seeds = (0, 1, 2)
    table = simulate_figures(trace, scenario, profile, seeds).set_index("group")
    runs = [client_calls(simulate(trace, scenario, profile, seed), scenario.client_timeout, scenario.compositions)
            for seed in seeds]
    assert set(table.index) == {"overall", *runs[0]["composition"]}
    for group in table.index:
        lat = [(r if group == "overall" else r[r["composition"] == group])["latency_censored_s"].to_numpy(float)
               for r in runs]
        p90s = [np.percentile(x, 90) for x in lat]
        assert table.loc[group, "calls"] == len(lat[0])
        assert table.loc[group, "p90"] == pytest.approx(np.mean(p90s))
        assert table.loc[group, "p90_sd"] == pytest.approx(np.std(p90s, ddof=1))
        assert table.loc[group, "mean"] == pytest.approx(np.mean([x.mean() for x in lat]))
    per_call = np.mean([r["latency_censored_s"].to_numpy(float) for r in runs], axis=0)
    assert np.percentile(per_call, 90) != pytest.approx(table.loc["overall", "p90"])
    assert table.attrs["seeds"] == seeds
    with pytest.raises(ValueError, match="seed"):
        simulate_figures(trace, scenario, profile, ())


def test_unfinished_calls_are_counted_per_run():
    """A client timeout shorter than InfoBench's calls: they fail in every run, are counted
    as unfinished and their latency is censored at the timeout."""
    trace, profile = load_trace("example"), load_profile("seed-calibrated")
    scenario = build_scenario(path="design-notes", run={"client_timeout": 30.0})
    table = simulate_figures(trace, scenario, profile, (0, 1)).set_index("group")
    runs = [client_calls(simulate(trace, scenario, profile, s), 30.0, scenario.compositions) for s in (0, 1)]
    assert table.loc["overall", "unfinished"] == pytest.approx(np.mean([(~r["ok"]).sum() for r in runs]))
    assert table.loc["overall", "unfinished"] > 0
    assert table.loc["overall", "p99"] == pytest.approx(30.0)


@needs_shared
def test_predict_against_an_observed_run_gives_predicts_errors(tmp_path):
    folder = REQUEST / "batch_results_4B_4queues_nothinking"
    scenario, profile = ROOT / "scenarios" / "lminference-4queues.toml", ROOT / "profiles" / "qwen3-4b-nospec-4queues.json"
    out = tmp_path / "p.json"
    result = _invoke("lminference-4queues-lengths", "-s", str(scenario), "-p", str(profile), "--seeds", "2",
                     "--observed", str(folder), "--json", str(out))
    assert result.exit_code == 0, result.output
    assert "observed in 4B_4queues_nothinking" in result.stdout and "over 2 whole simulated runs" in result.stdout
    scen = build_scenario(path=scenario)
    expected = predict(read_observed(folder, compositions=scen.compositions), load_trace("lminference-4queues-lengths"),
                       scen, load_profile(profile), (0, 1)).set_index("group")
    data = json.loads(out.read_text())
    assert data["observed"]["run"] == "4B_4queues_nothinking"
    written = {r["group"]: r for r in data["figures"]}
    assert list(written) == list(expected.index)
    for group, row in expected.iterrows():
        for stat in STATS:
            for part in ("ref", "other", "sd", "err"):
                assert written[group][f"{stat}_{part}"] == pytest.approx(row[f"{stat}_{part}"]), (group, stat, part)
        assert f"{100 * row['p50_err']:+.0f} %" in result.stdout
    # a trace that is not the one the run replayed is refused, not compared class by class
    other = _invoke("example", "-s", str(scenario), "-p", str(profile), "--seeds", "1", "--observed", str(folder))
    assert_one_line_error(other, str(folder), "not the calls of example")


def test_bad_input_is_one_error_line(tmp_path):
    base = ["-c", "design-notes", "-p", "seed-calibrated", "--seeds", "1"]
    assert_one_line_error(_invoke(str(tmp_path / "nope.json"), *base), "nope.json")
    assert_one_line_error(_invoke("example", "-c", "design-notes", "--seeds", "0"), "--seeds", "greater than or equal to 1")
    assert_one_line_error(_invoke("example", *base, "-p", "no-such-profile"), "no-such-profile")
    empty = tmp_path / "run"
    empty.mkdir()
    assert_one_line_error(_invoke("example", *base, "--observed", str(empty)), str(empty), "no results of a run")
    assert_one_line_error(_invoke("example", *base, "--arrivals", str(tmp_path / "a.json")), "--arrivals", "--observed")
    # never onto an input, even with --force
    trace = tmp_path / "t.json"
    shutil.copy(ROOT / "traces" / "batch_arrivals.json", trace)
    assert_one_line_error(_invoke(str(trace), *base, "--json", str(trace), "--force"), "input")
    assert_one_line_error(_invoke("example", *base, "--json", str(tmp_path / "no" / "f.json")), "does not exist")


def write_scaled_run(folder: Path, time_scale: float, timeout: float = 100.0):
    """A run folder as ``simctl load --time-scale X`` writes it, of a system that behaves
    exactly as seed 0 of the example's replay: every instant on the run's clock is the
    replay's divided by X. Returns the replay's event log."""
    from simulator.metrics import call_table
    from simulator.trace.formats import save_trace

    trace, scenario, profile = load_trace("example"), build_scenario(path="design-notes"), load_profile("seed-calibrated")
    log = simulate(trace, scenario, profile, 0)
    calls = call_table(log)
    folder.mkdir()
    save_trace(trace.scaled(time_scale), folder / "batch_arrivals.json")
    results = []
    for i, call in enumerate(trace.calls):
        row = calls.loc[i]
        record = {"batch_id": call.id, "batch_size": len(call.prompts),
                  "scheduled_arrival_time": call.t / time_scale, "actual_send_time": call.t / time_scale,
                  "request_duration": row["latency_s"] / time_scale, "completion_time": row["done_at"] / time_scale,
                  "status_code": 200, "prompt_idxs": list(range(len(call.prompts))),
                  "response": {"choices": [{"index": j, "text": "x"} for j in range(len(call.prompts))]}, "error": None}
        (folder / f"batch_{i:04d}.json").write_text(json.dumps(record))
        results.append(record)
    (folder / "simulation_summary.json").write_text(json.dumps({
        "total_batches": len(trace.calls), "results": results,
        "load": {"time_scale": time_scale, "rate_scale": 1.0, "timeout_s": timeout}}))
    import pandas as pd

    pd.DataFrame({
        "call_id": log["call_id"].astype(str), "prompt_index": log["prompt_index"], "task": log["task"].astype(str),
        "scheduled_at": log["arrived_at"] / time_scale, "sent_at": log["arrived_at"] / time_scale,
        "first_token_at": log["first_token_at"] / time_scale, "done_at": log["done_at"] / time_scale,
        "status": "ok", "http_status": 200, "error": "", "prompt_tokens": log["prompt_tokens"],
        "output_tokens": log["max_tokens"], "itls_s": [[] for _ in range(len(log))],
    }).to_parquet(folder / "requests.parquet", index=False)
    return log


def test_a_time_scaled_run_is_predicted_in_model_seconds(tmp_path):
    """A run at --time-scale 20 of a system that behaves exactly as the replay: read in
    model seconds, predicting it with the replay's seed is exact (wall seconds compared
    with model seconds were +1,900 % off), censored at its own timeout × 20."""
    log = write_scaled_run(tmp_path / "run", 20.0, timeout=100.0)
    run = read_observed(tmp_path / "run")
    assert run.time_scale == 20 and run.timeout == pytest.approx(2000.0)
    errors = predict(run, load_trace("example"), build_scenario(path="design-notes"), load_profile("seed-calibrated"),
                     seeds=(0,))
    for stat in STATS:
        assert errors[f"{stat}_err"].abs().max() < 1e-9, stat
    # its token figures are the replay's own (the run's clock × 20 is the model's)
    from simulator.metrics import summarize

    expected = summarize(log)["overall"]["tokens"]
    got = run.figures()["tokens"]["overall"]
    for name in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        assert got[name] == pytest.approx(expected[name]), name
    for name in ("span_s", "output_tokens_per_s", "total_tokens_per_s", "requests_per_s"):
        assert got[name] == pytest.approx(expected[name]), name
    tokens = errors.attrs["tokens"]
    assert set(tokens["figure"]) == {"ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"}
    assert tokens["err"].abs().max() < 1e-9
    result = _invoke("example", "-s", "design-notes", "-p", "seed-calibrated", "--seeds", "1",
                     "--observed", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    assert "+0 %" in result.stdout and "+1,9" not in result.stdout
    assert "Token timings per request observed" in result.stdout


@pytest.mark.parametrize("args, fragment", [
    (["--percentiles", "50,abc"], "--percentiles"), (["--percentiles", "0"], "(0, 100]"),
    (["--units", "us"], "--units"),
])
def test_token_option_errors_are_one_line(args, fragment):
    assert_one_line_error(_invoke("example", "--seeds", "1", *args), fragment)
