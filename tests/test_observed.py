"""Observed runs: the reader's counts and percentiles against values computed here from the
raw JSON of the users' real runs (skipped where ../shared/ is absent), and compare-runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error
from typer.testing import CliRunner

from simulator.cli import app
from simulator.errors import ObservedError
from simulator.observed import compare_calls, read_observed, read_run
from simulator.scenario import build_scenario

REQUEST = (Path(__file__).resolve().parents[2] / "shared" / "traces" / "real" / "lminference"
           / "EEElisa@dfb2bf8" / "mingqia2_3" / "request")
needs_shared = pytest.mark.skipif(not REQUEST.exists(), reason=f"real runs not present at {REQUEST}")
RUNS = ["4B_fw_5_b10", "4B_fw_5_b10_updated", "4B_separate_queues_no_thinking", "4B_4queues_nothinking",
        "4B_4queues_nothinking_longmmlu", "4B_4queues_nothinking_longmmlu_fixedgraph", "py"]
TASK_OF = lambda idx: "graph" if idx < 100 else "infobench" if idx < 200 else "mmlu"  # noqa: E731


def raw_expectation(folder: Path) -> dict:
    """Computed independently: success = a batch file whose response has choices."""
    arrivals = json.loads((REQUEST / "batch_arrivals.json").read_text())
    ok_latency, failed, comp = {}, 0, {}
    for rec in arrivals:
        f = folder / f"batch_{rec['batch_id']:04d}.json"
        tasks = {TASK_OF(i) for i in rec["prompt_idxs"]}
        comp[rec["batch_id"]] = ("any-infobench" if "infobench" in tasks else
                                 "mmlu-no-infobench" if "mmlu" in tasks else "graph-only")
        body = json.loads(f.read_text()) if f.exists() else None
        if body and body.get("status_code") == 200 and isinstance(body.get("response"), dict) \
                and "choices" in body["response"]:
            ok_latency[rec["batch_id"]] = body["request_duration"]
        else:
            failed += 1
    return {"ok": ok_latency, "failed": failed, "composition": comp}


@needs_shared
@pytest.mark.parametrize("run", RUNS)
def test_reader_counts_and_percentiles_match_the_raw_files(run):
    folder = REQUEST / f"batch_results_{run}"
    observed = read_observed(folder, compositions=build_scenario(path="lminference-fw5").compositions)
    expected = raw_expectation(folder)
    figures = observed.figures()
    assert figures["overall"]["calls"] == 98
    assert figures["overall"]["ok"] == len(expected["ok"])
    assert figures["overall"]["failed"] == expected["failed"]
    lat = np.array(list(expected["ok"].values()))
    for q in (50, 90, 99):
        assert figures["overall"]["latency"][f"p{q}"] == pytest.approx(np.percentile(lat, q))
    censored = np.concatenate([np.minimum(lat, 600.0), np.full(expected["failed"], 600.0)])
    assert figures["overall"]["latency_censored"]["p90"] == pytest.approx(np.percentile(censored, 90))
    for label in ("graph-only", "mmlu-no-infobench", "any-infobench"):
        ids = [b for b, c in expected["composition"].items() if c == label]
        mine = [expected["ok"][b] for b in ids if b in expected["ok"]]
        assert figures["compositions"][label]["calls"] == len(ids)
        assert figures["compositions"][label]["latency"]["mean"] == pytest.approx(np.mean(mine))


@needs_shared
def test_published_figures_of_the_runs_are_reproduced():
    # modeled-system.md §5: 4B_fw_5_b10 mean 265.7, p50 333.2; 4B_4queues p90 70.0; the
    # separate-queues run 88 ok / 10 failed.
    fw = read_observed(REQUEST / "batch_results_4B_fw_5_b10").figures()["overall"]
    assert round(fw["latency"]["mean"], 1) == 265.7 and round(fw["latency"]["p50"], 1) == 333.2
    q4 = read_observed(REQUEST / "batch_results_4B_4queues_nothinking").figures()["overall"]
    assert round(q4["latency"]["p90"], 1) == 70.0
    sq = read_observed(REQUEST / "batch_results_4B_separate_queues_no_thinking").figures()["overall"]
    assert (sq["ok"], sq["failed"]) == (88, 10)


@needs_shared
def test_wrong_arrival_file_is_a_one_line_error():
    result = CliRunner().invoke(app, ["observed", str(REQUEST / "batch_results_sample_py")])
    assert_one_line_error(result, "simulation_summary.json", "total_batches", "--arrivals")
    good = CliRunner().invoke(app, ["observed", str(REQUEST / "batch_results_sample_py"),
                                    "--arrivals", str(REQUEST / "batch_arrivals_sample.json")])
    assert good.exit_code == 0, good.stdout


def test_reader_on_a_hand_made_folder(tmp_path):
    # call 0 ok (12 s); call 1 has a file with an error body (failed); call 2 has no file.
    arrivals = [{"batch_id": i, "arrival_time": 10.0 * i, "batch_size": 1, "max_length": 64,
                 "prompts": ["The following is a multiple choice question: A?"]} for i in range(3)]
    (tmp_path / "batch_arrivals.json").write_text(json.dumps(arrivals))
    run = tmp_path / "batch_results_x"
    run.mkdir()
    base = {"batch_size": 1, "scheduled_arrival_time": 0.0, "actual_send_time": 0.01, "status_code": 200}
    (run / "batch_0000.json").write_text(json.dumps({**base, "batch_id": 0, "request_duration": 12.0,
                                                     "completion_time": 12.0, "response": {"choices": [{"text": "A"}]}}))
    (run / "batch_0001.json").write_text(json.dumps({**base, "batch_id": 1, "request_duration": 0.5,
                                                     "completion_time": 10.5, "response": {"error": "Already borrowed"}}))
    observed = read_observed(run)
    assert observed.calls["ok"].tolist() == [True, False, False]
    assert observed.calls["error"].tolist()[1] == "Already borrowed"
    assert observed.calls["latency_censored_s"].tolist() == [12.0, 600.0, 600.0]
    # compare a run with itself: zero error everywhere
    name, calls = read_run(run)
    table = compare_calls(calls, calls)
    assert (table[[c for c in table if c.endswith("_err")]].fillna(0) == 0).all().all()
    bad = run / "batch_0002.json"
    bad.write_text("{not json")
    with pytest.raises(ObservedError, match="batch_0002.json"):
        read_observed(run)


def test_compare_runs_cli_writes_plots_and_refuses_overwrite(tmp_path):
    from helpers import fixed_profile, make_trace, run as simulate_run

    from simulator.events import write_event_log

    log = simulate_run(make_trace([(0, ["mmlu"]), (1, ["graph"])]), fixed_profile(mmlu=2.0, graph=0.1), gpus=1)
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    write_event_log(log, a)
    write_event_log(log, b)
    out = CliRunner().invoke(app, ["compare-runs", str(a), str(b), "--plot", str(tmp_path / "p")])
    assert out.exit_code == 0, out.stdout
    assert (tmp_path / "p" / "cdf.png").stat().st_size > 0 and (tmp_path / "p" / "scatter.png").exists()
    again = CliRunner().invoke(app, ["compare-runs", str(a), str(b), "--plot", str(tmp_path / "p")])
    assert_one_line_error(again, "cdf.png")


def test_answers_are_taken_after_the_template_or_the_echoed_prompt():
    from simulator.observed import answer_of

    assert answer_of({"text": "user\nQ?\nassistant\n<think>\n\n</think>\n\nHARER"}) == "HARER"
    assert answer_of({"text": "Q? the answer", "prompt": "Q?"}) == "the answer"
    assert answer_of({"text": "  plain answer "}) == "plain answer"
    assert answer_of({"no": "text"}) is None


@needs_shared
def test_measured_output_lengths_match_the_raw_responses(tmp_path):
    """Every InfoBench prompt of the 4-queue run was answered; its length here, from the raw
    JSON, is the trace's max_tokens after --write-trace (4 characters a token, rounded up)."""
    folder = REQUEST / "batch_results_4B_4queues_nothinking"
    arrivals = json.loads((REQUEST / "batch_arrivals.json").read_text())
    expected = {}
    for rec in arrivals:
        body = json.loads((folder / f"batch_{rec['batch_id']:04d}.json").read_text())
        for i, (idx, choice) in enumerate(zip(rec["prompt_idxs"], body["response"]["choices"], strict=True)):
            if TASK_OF(idx) != "infobench":
                continue
            text = choice["text"]
            answer = text.split("</think>", 1)[1].strip() if "</think>" in text else (
                text[len(choice["prompt"]):].strip() if text.startswith(choice.get("prompt") or "\0") else text.strip())
            expected[(str(rec["batch_id"]), i)] = -(-len(answer) // 4)
    assert len(expected) == 100
    out = tmp_path / "lengths.json"
    result = CliRunner().invoke(app, ["observed", str(folder), "--lengths", "infobench", "--write-trace", str(out)])
    assert result.exit_code == 0, result.output
    from simulator.trace.formats import load_trace

    trace = load_trace(out)
    got = {(c.id, i): p.max_tokens for c in trace.calls for i, p in enumerate(c.prompts) if p.task == "infobench"}
    assert got == expected
    # other tasks keep the client's max_tokens; the source run is recorded
    assert {p.max_tokens for c in trace.calls for p in c.prompts if p.task != "infobench"} == {2048}
    assert trace.meta["output_lengths"]["prompts"] == 100
    # the options go together, and the trace is not overwritten
    again = CliRunner().invoke(app, ["observed", str(folder), "--lengths", "infobench", "--write-trace", str(out)])
    assert_one_line_error(again, str(out))
    alone = CliRunner().invoke(app, ["observed", str(folder), "--write-trace", str(tmp_path / "x.json")])
    assert_one_line_error(alone, "--lengths")


@needs_shared
def test_the_shipped_lengths_trace_is_the_real_arrivals_with_the_measured_lengths():
    from simulator.observed import with_observed_lengths
    from simulator.trace.formats import load_trace

    real = load_trace(REQUEST / "batch_arrivals.json")
    expected = with_observed_lengths(real, read_observed(REQUEST / "batch_results_4B_4queues_nothinking", real),
                                     ["infobench"])
    shipped = load_trace(Path(__file__).resolve().parents[1] / "traces" / "lminference-4queues-lengths.json")
    assert [(c.id, c.t) for c in shipped.calls] == [(c.id, c.t) for c in expected.calls]
    assert [[(p.task, p.prompt_tokens, p.max_tokens) for p in c.prompts] for c in shipped.calls] == \
           [[(p.task, p.prompt_tokens, p.max_tokens) for p in c.prompts] for c in expected.calls]


def test_a_folder_with_arrivals_but_no_results_says_what_is_missing(tmp_path):
    (tmp_path / "batch_arrivals.json").write_text("[]")
    (tmp_path / "batch_results_a").mkdir()
    (tmp_path / "batch_results_a" / "batch_0000.json").write_text("{}")
    result = CliRunner().invoke(app, ["observed", str(tmp_path)])
    assert_one_line_error(result, "no results of a run here", "simulation_summary.json", "batch_NNNN.json",
                          "the arrival file, not a run", "batch_results_a")


def test_observed_shows_a_time_scaled_run_in_model_seconds_with_its_token_figures(tmp_path):
    from test_cli_predict import write_scaled_run

    write_scaled_run(tmp_path / "run", 20.0, timeout=30.0)
    runner = CliRunner()
    result = runner.invoke(app, ["observed", str(tmp_path / "run"), "--goodput", "ttft:1s", "--percentiles", "50,95"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "clock × 20" in text and "censored at 600 s" in text  # its own 30 s × 20
    assert "Token timings per request (ms;" in result.stdout and "goodput/s" in result.stdout
    data = json.loads(runner.invoke(app, ["observed", str(tmp_path / "run"), "--json", "-", "--timeout", "5"]).stdout)
    assert data["time_scale"] == 20 and data["timeout_s"] == 100.0  # --timeout is on the run's clock
    overall = data["figures"]["tokens"]["overall"]
    assert list(overall["ttft_ms"]) == ["mean", "p50", "p90", "p99"] and "goodput_per_s" not in overall
    bad = runner.invoke(app, ["observed", str(tmp_path / "run"), "--goodput", "ttft=1s"])
    assert_one_line_error(bad, "--goodput")


def test_a_client_run_without_requests_has_no_token_figures(tmp_path):
    from test_cli_predict import write_scaled_run

    write_scaled_run(tmp_path / "run", 1.0)
    (tmp_path / "run" / "requests.parquet").unlink()
    run = read_observed(tmp_path / "run")
    assert run.time_scale == 1 and run.figures()["tokens"] is None
    result = CliRunner().invoke(app, ["observed", str(tmp_path / "run")])
    assert result.exit_code == 0 and "no per-request records" in result.stdout
