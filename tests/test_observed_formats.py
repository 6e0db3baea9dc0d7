"""Readers of other tools' result files, on files the tools wrote (tests/data/tool_fixtures,
see its README): request counts and percentiles against the summaries each tool stored in
the same files.

Percentile definitions, and the tolerance they leave:

* GuideLLM 0.8 (``DistributionSummary.from_values`` → ``Percentiles.from_pdf``): the
  smallest value whose cumulative weight reaches q (``searchsorted(cumsum(w), q,
  "left")``; nearest rank, numpy's ``inverted_cdf`` but for the float rounding of the
  cumulative sum). :func:`guidellm_percentile` repeats it step for step, so those checks
  are exact. simctl's own figures use numpy's linear interpolation, which lies between the
  two order statistics around the rank: the only gap allowed between them.
* AIPerf 0.13 (``metric_result_from_array``): linear interpolation between order
  statistics, numpy's default; exact agreement. Its CSV rounds to 2 decimals.
* vLLM ``bench serve``: ``np.percentile`` (linear) over successful requests.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error
from typer.testing import CliRunner

from simulator.cli import app
from simulator.errors import ObservedError
from simulator.observed import read_observed, read_observed_runs, read_run

FIXTURES = Path(__file__).parent / "data" / "tool_fixtures"
SWEEP = FIXTURES / "guidellm-0.8.1" / "sweep.json"
ERRORS = FIXTURES / "guidellm-0.8.1" / "constant_errors.json"
AIPERF_OK = FIXTURES / "aiperf-0.13.0" / "ok"
AIPERF_ERRORS = FIXTURES / "aiperf-0.13.0" / "errors"
runner = CliRunner()


def guidellm_percentile(values, q: float) -> float:
    """GuideLLM 0.8's percentile: equal weights over the distinct values, cumulative sum,
    the first value whose cumulative probability reaches q."""
    values = np.sort(np.asarray(values, float))
    unique, inverse = np.unique(values, return_inverse=True)
    weights = np.zeros_like(unique)
    np.add.at(weights, inverse, 1.0)
    cdf = np.cumsum(weights / weights.sum())
    return float(unique[np.searchsorted(cdf, q, side="left")])


def around_rank(values, q: float) -> tuple[float, float]:
    """The two order statistics numpy's linear percentile interpolates between."""
    x = np.sort(np.asarray(values, float))
    pos = q * (len(x) - 1)
    return float(x[int(np.floor(pos))]), float(x[int(np.ceil(pos))])


# -- GuideLLM 0.8 ------------------------------------------------------------------------


def _benchmarks(path: Path) -> list[dict]:
    return json.loads(path.read_text())["benchmarks"]


@pytest.mark.parametrize("k", [0, 1, 2])
def test_guidellm_sweep_benchmark_matches_its_own_summary(k):
    bench = _benchmarks(SWEEP)[k]
    metrics = bench["metrics"]
    run = read_observed(f"{SWEEP}#{k}")
    calls = run.calls
    assert run.name == f"sweep#{k}" and run.meta["benchmark_index"] == k
    assert run.meta["benchmark_label"] == f"constant {bench['config']['strategy']['rate']:g}/s"
    figures = run.figures()["overall"]
    totals = metrics["request_totals"]
    assert (figures["calls"], figures["ok"], figures["failed"]) == (
        totals["total"], totals["successful"], totals["errored"] + totals["incomplete"])
    ok = calls[calls["ok"]]
    latency = ok["latency_s"].to_numpy()
    summary = metrics["request_latency"]["successful"]
    assert summary["count"] == len(latency)
    assert float(np.mean(latency)) == pytest.approx(summary["mean"], rel=1e-12)
    for q in (50, 90):
        tool = summary["percentiles"][f"p{q}"]
        assert guidellm_percentile(latency, q / 100) == pytest.approx(tool, rel=1e-12)
        mine = figures["latency"][f"p{q}"]  # linear: between the order statistics around the rank
        low, high = around_rank(latency, q / 100)
        assert mine == pytest.approx(np.percentile(latency, q))
        assert low <= mine <= high and min(low, tool) <= mine <= max(high, tool)
    ttft_ms = ok["ttft_s"].to_numpy() * 1000
    ttft = metrics["time_to_first_token_ms"]["successful"]
    assert guidellm_percentile(ttft_ms, 0.5) == pytest.approx(ttft["percentiles"]["p50"], rel=1e-12)
    assert float(np.mean(ttft_ms)) == pytest.approx(ttft["mean"], rel=1e-12)
    # GuideLLM weighs each request's ITL by its output tokens after the first
    weights = ok["output_tokens"].to_numpy() - 1
    itl = metrics["inter_token_latency_ms"]["successful"]
    assert float(np.sum(ok["itl_s"] * 1000 * weights) / weights.sum()) == pytest.approx(itl["mean"], rel=1e-9)
    assert ok["output_tokens"].sum() == pytest.approx(metrics["output_token_count"]["successful"]["total_sum"])
    assert ok["prompt_tokens"].sum() == pytest.approx(metrics["prompt_token_count"]["successful"]["total_sum"])


def test_guidellm_arrivals_are_the_requests_start_times():
    bench = _benchmarks(SWEEP)[0]
    starts = sorted(r["request_start_time"] for r in bench["requests"]["successful"])
    run = read_observed(f"{SWEEP}#0")
    assert run.calls["arrived_at"].tolist() == pytest.approx([s - starts[0] for s in starts], abs=1e-9)
    # 10 requests at 4/s: the last starts about 9/4 s after the first, not at 0
    assert 2.0 < run.calls["arrived_at"].max() < 2.6
    assert run.trace is not None and len(run.trace.calls) == 10
    assert [c.prompts[0].prompt_tokens for c in run.trace.calls] == [
        r["prompt_tokens"] for r in sorted(bench["requests"]["successful"], key=lambda r: r["request_start_time"])]


def test_guidellm_errored_requests_are_failures_with_their_error():
    bench = _benchmarks(ERRORS)[0]
    run = read_observed(ERRORS)
    totals = bench["metrics"]["request_totals"]
    assert (totals["successful"], totals["errored"]) == (11, 4)
    assert int(run.calls["ok"].sum()) == 11 and int((~run.calls["ok"]).sum()) == 4
    failed = run.calls[~run.calls["ok"]]
    assert failed["error"].str.contains("500 Internal Server Error").all()
    assert failed["latency_censored_s"].eq(600.0).all() and failed["ttft_s"].isna().all()
    latency = run.calls.loc[run.calls["ok"], "latency_s"].to_numpy()
    summary = bench["metrics"]["request_latency"]["successful"]["percentiles"]
    assert guidellm_percentile(latency, 0.5) == pytest.approx(summary["p50"], rel=1e-12)
    assert guidellm_percentile(latency, 0.9) == pytest.approx(summary["p90"], rel=1e-12)


def test_a_sweep_is_one_run_per_benchmark():
    runs = read_observed_runs(SWEEP)
    assert [r.name for r in runs] == ["sweep#0", "sweep#1", "sweep#2"]
    assert [len(r.calls) for r in runs] == [len(b["requests"]["successful"]) for b in _benchmarks(SWEEP)]
    shown = runner.invoke(app, ["observed", str(SWEEP)])
    assert shown.exit_code == 0, shown.output
    for label in ("sweep#0 (constant 4/s)", "sweep#1 (constant 8/s)", "sweep#2 (constant 16/s)", "#K"):
        assert label in " ".join(shown.stdout.split())
    every = json.loads(runner.invoke(app, ["observed", str(SWEEP), "--json", "-"]).stdout)
    assert every["format"] == "simctl-observed-runs/1" and len(every["runs"]) == 3
    assert [r["figures"]["overall"]["ok"] for r in every["runs"]] == [10, 10, 10]


def test_a_sweeps_csv_has_the_rows_of_every_benchmark(tmp_path):
    out = tmp_path / "sweep.csv"
    assert runner.invoke(app, ["observed", str(SWEEP), "--csv", str(out)]).exit_code == 0
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted({r["run"] for r in rows}) == ["sweep#0", "sweep#1", "sweep#2"]


def test_one_benchmark_is_chosen_with_hash_k_and_a_sweep_without_it_is_refused():
    alone = runner.invoke(app, ["observed", f"{SWEEP}#2", "--json", "-"])
    assert alone.exit_code == 0, alone.output
    assert json.loads(alone.stdout)["name"] == "sweep#2"
    both = runner.invoke(app, ["compare-runs", f"{SWEEP}#0", f"{SWEEP}#2"])
    assert both.exit_code == 0, both.output
    assert_one_line_error(runner.invoke(app, ["compare-runs", str(SWEEP), f"{SWEEP}#2"]),
                          str(SWEEP), "holds 3 benchmarks", "#K", "#0 constant 4/s (10 requests)")
    assert_one_line_error(runner.invoke(app, ["observed", f"{SWEEP}#3"]), str(SWEEP), "no benchmark #3", "#0 to #2")
    with pytest.raises(ObservedError, match="holds 3 benchmarks"):
        read_observed(SWEEP)
    # one benchmark: the file is the run, and #0 names it too
    assert read_run(ERRORS)[0] == "constant_errors" and read_run(f"{ERRORS}#0")[0] == "constant_errors#0"


def _edited(tmp_path: Path, source: Path, edit) -> Path:
    data = json.loads(source.read_text())
    edit(data)
    out = tmp_path / source.name
    out.write_text(json.dumps(data))
    return out


def test_guidellm_records_of_an_unknown_layout_are_refused(tmp_path):
    def strip_timings(data):
        rec = data["benchmarks"][1]["requests"]["successful"][3]
        for key in ("info", "request_start_time", "request_end_time", "request_latency"):
            rec.pop(key)

    bad = _edited(tmp_path, SWEEP, strip_timings)
    for command in (["observed", str(bad)], ["observed", f"{bad}#1"], ["compare-runs", f"{bad}#0", str(ERRORS)]):
        assert_one_line_error(runner.invoke(app, command), str(bad), "benchmarks[1].requests.successful[3]",
                              "info.timings.request_start", "start_time and end_time")


# -- AIPerf 0.13 -------------------------------------------------------------------------


def _records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "profile_export.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("folder", [AIPERF_OK, AIPERF_ERRORS], ids=["ok", "errors"])
def test_aiperf_export_matches_its_aggregate_export(folder):
    aggregate = json.loads((folder / "profile_export_aiperf.json").read_text())
    run = read_observed(folder)
    calls = run.calls
    errors = aggregate.get("error_request_count", {}).get("avg", 0)
    assert len(calls) == len(_records(folder))
    assert int(calls["ok"].sum()) == aggregate["request_count"]["avg"]
    assert int((~calls["ok"]).sum()) == errors
    ok = calls[calls["ok"]]
    latency_ms, ttft_ms = ok["latency_s"].to_numpy() * 1000, ok["ttft_s"].to_numpy() * 1000
    with open(folder / "profile_export_aiperf.csv", newline="") as f:
        rows = [row for row in csv.reader(f) if row]
    header = rows[0]  # the per-record metrics' section (a later one holds the run-wide values)
    table = {row[0]: row for row in rows}
    for tag, values, name in (("request_latency", latency_ms, "Request Latency (ms)"),
                              ("time_to_first_token", ttft_ms, "Time to First Token (ms)")):
        assert aggregate[tag]["count"] == len(values)
        for q in (50, 90):
            assert np.percentile(values, q) == pytest.approx(aggregate[tag][f"p{q}"], rel=1e-9)
            assert np.percentile(values, q) == pytest.approx(float(table[name][header.index(f"p{q}")]), abs=0.006)
    figures = run.figures()["overall"]
    assert figures["latency"]["p50"] * 1000 == pytest.approx(aggregate["request_latency"]["p50"], rel=1e-9)


def test_aiperf_token_counts_are_the_servers():
    records = [r for r in _records(AIPERF_OK)]
    calls = read_observed(AIPERF_OK).calls.set_index("call_id")
    usage = {r["metadata"]["x_request_id"]: (r["metrics"]["usage_prompt_tokens"]["value"],
                                             r["metrics"]["usage_completion_tokens"]["value"]) for r in records}
    client = {r["metadata"]["x_request_id"]: r["metrics"]["output_sequence_length"]["value"] for r in records}
    assert {i: (calls.at[i, "prompt_tokens"], calls.at[i, "output_tokens"]) for i in usage} == usage
    # the mock server's tokenizer is not the client's: the two counts differ in this run
    assert any(client[i] != usage[i][1] for i in usage)
    # inter-token latency over the server's tokens, by AIPerf's formula
    for r in records[:5]:
        m, i = r["metrics"], r["metadata"]["x_request_id"]
        gap = (m["request_latency"]["value"] - m["time_to_first_token"]["value"]) / (usage[i][1] - 1) / 1000
        assert calls.at[i, "itl_s"] == pytest.approx(gap)
        # AIPerf's own figure is the same formula over its client-side count
        assert m["inter_token_latency"]["value"] == pytest.approx(
            (m["request_latency"]["value"] - m["time_to_first_token"]["value"]) / (client[i] - 1))
    aggregate = json.loads((AIPERF_OK / "profile_export_aiperf.json").read_text())
    assert calls["output_tokens"].sum() == aggregate["usage_completion_tokens"]["sum"]


def test_aiperf_failures_keep_their_http_status():
    calls = read_observed(AIPERF_ERRORS).calls
    failed = calls[~calls["ok"]]
    assert len(failed) == 6 and failed["status_code"].eq(500).all()
    assert failed["error"].str.startswith("Internal Server Error").all()
    assert failed["prompt_tokens"].eq(24).all()  # error_isl: the client's count, all there is


def test_aiperf_records_without_times_are_refused(tmp_path):
    lines = []
    for r in _records(AIPERF_OK):
        r["metadata"].pop("request_start_ns")
        r["metrics"].pop("request_latency")
        lines.append(json.dumps({"metadata": {"request_start_ns": None, **r["metadata"]}, "metrics": r["metrics"]}))
    bad = tmp_path / "profile_export.jsonl"
    bad.write_text("\n".join(lines))
    assert_one_line_error(runner.invoke(app, ["observed", str(bad)]), str(bad), "request_start_ns", "request_latency")


# -- vllm bench serve --------------------------------------------------------------------

#: the per-request keys of ``result`` in vLLM 0.33.0's ``vllm/benchmarks/serve.py``
#: (``benchmark()``), in its order; ``output_lens`` holds 0 for a failed request
VLLM_PER_REQUEST = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "queue_times",
                    "generated_texts", "errors")


def vllm_result(rate: float, outputs: list[dict]) -> dict:
    """A ``--save-result --save-detailed`` object built as ``serve.py`` builds it: the
    settings, the aggregate counts, the per-request lists from ``RequestFuncOutput``
    fields, and ``process_one_metric``'s summary over the successful requests
    (``--percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99``)."""
    good = [o for o in outputs if o["success"]]
    result = {"date": "20260101-000000", "endpoint_type": "openai-chat", "backend": "openai-chat", "label": None,
              "model_id": "m", "tokenizer_id": "m", "num_prompts": len(outputs), "request_rate": rate,
              "burstiness": 1.0, "max_concurrency": None, "duration": 3.0, "completed": len(good),
              "failed": len(outputs) - len(good), "total_input_tokens": sum(o["prompt_len"] for o in good),
              "total_output_tokens": sum(o["output_tokens"] for o in good), "request_throughput": len(good) / 3.0}
    result.update({
        "input_lens": [o["prompt_len"] for o in outputs],
        "output_lens": [o["output_tokens"] if o["success"] else 0 for o in outputs],
        "ttfts": [o["ttft"] for o in outputs], "itls": [o["itl"] for o in outputs],
        "latencies": [o["latency"] for o in outputs], "start_times": [o["start_time"] for o in outputs],
        "queue_times": [0.0 for _ in outputs], "generated_texts": ["x" * o["output_tokens"] for o in outputs],
        "errors": [o["error"] for o in outputs]})
    assert tuple(k for k in result if k in VLLM_PER_REQUEST) == VLLM_PER_REQUEST
    series = {"ttft": [o["ttft"] for o in good], "itl": [g for o in good for g in o["itl"]],
              "e2el": [o["latency"] for o in good]}
    for name, values in series.items():
        result[f"mean_{name}_ms"] = float(np.mean(values)) * 1000
        result[f"median_{name}_ms"] = float(np.median(values)) * 1000
        for p in (50, 90, 99):
            result[f"p{p}_{name}_ms"] = float(np.percentile(values, p)) * 1000
    return result


def _vllm_outputs(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    outputs = []
    for i in range(n):
        if i == 3:  # a failure: RequestFuncOutput's defaults, with the error text
            outputs.append({"success": False, "latency": 0.0, "output_tokens": 0, "ttft": 0.0, "itl": [],
                            "prompt_len": 30, "error": "Bad Request", "start_time": 100.0 + 0.25 * i})
            continue
        ttft, gaps = float(rng.uniform(0.02, 0.1)), [float(g) for g in rng.uniform(0.004, 0.008, size=9)]
        outputs.append({"success": True, "latency": ttft + sum(gaps) + 0.001, "output_tokens": 10, "ttft": ttft,
                        "itl": gaps, "prompt_len": 30, "error": "", "start_time": 100.0 + 0.25 * i})
    return outputs


def test_vllm_bench_result_of_the_current_layout(tmp_path):
    data = vllm_result(4.0, _vllm_outputs(12, 0))
    path = tmp_path / "vllm.json"
    path.write_text(json.dumps(data))
    run = read_observed(path)
    ok = run.calls[run.calls["ok"]]
    assert (len(run.calls), len(ok)) == (12, data["completed"])
    assert run.calls.loc[~run.calls["ok"], "error"].tolist() == ["Bad Request"]
    latency = ok["latency_s"].to_numpy()
    # the file's latencies, not ttft + sum(itls) (which misses the last 1 ms here)
    assert latency == pytest.approx(np.array([x for x, e in zip(data["latencies"], data["errors"], strict=True) if not e]))
    for p in (50, 90):
        assert np.percentile(latency, p) * 1000 == pytest.approx(data[f"p{p}_e2el_ms"])
        assert run.figures()["overall"]["latency"][f"p{p}"] * 1000 == pytest.approx(data[f"p{p}_e2el_ms"])
    assert np.median(ok["ttft_s"]) * 1000 == pytest.approx(data["median_ttft_ms"])
    assert ok["itl_s"].tolist() == pytest.approx([np.mean(g) for g, e in zip(data["itls"], data["errors"], strict=True) if not e])
    assert ok["output_tokens"].eq(10).all() and run.calls["arrived_at"].tolist() == pytest.approx([0.25 * i for i in range(12)])


def test_vllm_appended_results_are_one_benchmark_per_line(tmp_path):
    path = tmp_path / "appended.json"
    path.write_text(json.dumps(vllm_result(2.0, _vllm_outputs(6, 1))) + "\n"
                    + json.dumps(vllm_result(8.0, _vllm_outputs(8, 2))))
    runs = read_observed_runs(path)
    assert [(r.name, len(r.calls), r.meta["benchmark_label"]) for r in runs] == [
        ("appended#0", 6, "rate 2.0"), ("appended#1", 8, "rate 8.0")]
    assert len(read_observed(f"{path}#1").calls) == 8
    assert_one_line_error(runner.invoke(app, ["compare-runs", str(path), f"{path}#1"]), "holds 2 benchmarks")


def test_vllm_result_without_detail_is_refused(tmp_path):
    data = vllm_result(4.0, _vllm_outputs(5, 0))
    for key in ("input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts", "errors"):
        del data[key]  # what serve.py drops without --save-detailed; latencies stay
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(data))
    assert_one_line_error(runner.invoke(app, ["observed", str(path)]), str(path), "ttfts", "--save-detailed")


# -- files of no known layout ------------------------------------------------------------


def test_a_json_file_of_no_known_tool_is_refused(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"results": [1, 2]}))
    assert_one_line_error(runner.invoke(app, ["observed", str(path)]), str(path), "expected", "GuideLLM", "AIPerf",
                          "vllm bench serve")
