"""Production-trace importers on the real public files, malformed rows, and fitted synthesis.

Expected values are computed here from the raw files with the csv/json modules and
datetime, not with the importers' pandas code."""

from __future__ import annotations

import csv
import json
import math
import warnings
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error
from typer.testing import CliRunner

from simulator.cli import app
from simulator.errors import SimctlWarning, TraceError
from simulator.trace.fit import fit_arrivals, spec_from_fit
from simulator.trace.formats import ImportOptions, load_trace, sniff
from simulator.trace.synth import InterArrival, synthesize

REAL = Path(__file__).resolve().parent.parent.parent / "shared" / "traces" / "real"
runner = CliRunner()


def real(rel: str) -> Path:
    path = REAL / rel
    if not path.exists():
        pytest.skip(f"real trace {rel} is not here ({REAL}); it lives in ../shared")
    return path


def quiet_load(path, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SimctlWarning)
        return load_trace(path, options=ImportOptions(**options))


@pytest.mark.parametrize("name, requests", [("conv", 19366), ("code", 8819)])
def test_azure_2023(name, requests):
    path = real(f"azure_llm_2023/AzureLLMInferenceTrace_{name}.csv")
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    stamps = [datetime.fromisoformat(r["TIMESTAMP"]) for r in rows]
    trace = load_trace(path)
    assert sniff(path) == "azure" and len(rows) == requests == len(trace)
    span = (max(stamps) - min(stamps)).total_seconds()
    assert trace.calls[-1].t == pytest.approx(span, abs=1e-6)
    prompts = [c.prompts[0] for c in trace.calls]
    assert sum(p.prompt_tokens for p in prompts) == sum(int(r["ContextTokens"]) for r in rows)
    assert sum(p.max_tokens for p in prompts) == sum(max(1, int(r["GeneratedTokens"])) for r in rows)
    first, last = prompts[0], prompts[-1]
    assert (first.prompt_tokens, first.max_tokens) == (int(rows[0]["ContextTokens"]), max(1, int(rows[0]["GeneratedTokens"])))
    assert (last.prompt_tokens, last.max_tokens) == (int(rows[-1]["ContextTokens"]), max(1, int(rows[-1]["GeneratedTokens"])))
    assert trace.meta["epoch_start"] == pytest.approx(min(stamps).timestamp(), abs=1e-3)


def test_azure_2024_timestamp_style(tmp_path):
    """The 2024 release writes fewer fractional digits; both styles read the same way."""
    path = tmp_path / "azure2024.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.010,10,2\n"
                    "2024-05-10 00:00:01.5,20,3\n2024-05-10 00:00:03,30,0")
    trace = load_trace(path)
    assert trace.arrival_times().tolist() == pytest.approx([0.0, 1.49, 2.99])
    assert [c.prompts[0].max_tokens for c in trace.calls] == [2, 3, 1]


@pytest.mark.parametrize("name", ["BurstGPT_1_first400.csv", "BurstGPT_3_first400.csv"])
def test_burstgpt_both_layouts(name):
    path = real(f"burstgpt/{name}")
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    ok = [r for r in rows if int(r["Response tokens"]) > 0]
    with pytest.warns(SimctlWarning, match=f"left out {len(rows) - len(ok)} failed"):
        trace = load_trace(path)
    assert len(trace) == len(ok) and trace.meta["failed_requests"] == len(rows) - len(ok)
    t = [float(r["Timestamp"]) for r in ok]
    assert trace.calls[-1].t == pytest.approx(max(t) - min(t))
    assert sum(c.prompts[0].prompt_tokens for c in trace.calls) == sum(int(r["Request tokens"]) for r in ok)
    models = {}
    for r in ok:
        models[r["Model"]] = models.get(r["Model"], 0) + 1
    assert trace.task_counts() == models
    everything = quiet_load(path, include_failed=True, task_map={"ChatGPT": "mmlu", "GPT-4": "infobench"})
    assert len(everything) == len(rows)
    assert set(everything.tasks) <= {"mmlu", "infobench"}
    # equal timestamps keep file order
    order = [int(c.id) for c in everything.calls]
    times = [c.t for c in everything.calls]
    assert all(a < b for a, b, s, u in zip(order, order[1:], times, times[1:], strict=False) if s == u)


@pytest.mark.parametrize("name, requests", [("conversation_trace.jsonl", 12031), ("synthetic_trace.jsonl", 3993)])
def test_mooncake(name, requests):
    path = real(f"mooncake_fast25/{name}")
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    trace = load_trace(path)
    assert len(trace) == len(records) == requests
    ms = [r["timestamp"] for r in records]
    assert trace.calls[-1].t == pytest.approx((max(ms) - min(ms)) / 1000)
    assert sum(c.prompts[0].prompt_tokens for c in trace.calls) == sum(r["input_length"] for r in records)
    assert trace.meta["prefix_blocks"] == sum(len(r["hash_ids"]) for r in records)
    assert trace.calls[0].prompts[0].prompt_tokens == records[0]["input_length"]
    grouped = load_trace(path, options=ImportOptions(group_gap=0.0))   # same-timestamp requests: one call
    distinct = len(set(ms))
    assert len(grouped) >= distinct and grouped.n_prompts == len(records)


def test_servegen_windows_are_synthesised_at_their_rates():
    path = real("servegen_sample/deepseek-r1/chunk-0-trace.csv")
    with open(path, newline="") as fh:
        windows = [(float(r[0]), float(r[1]), float(r[2])) for r in csv.reader(fh)]
    trace = load_trace(path, options=ImportOptions(seed=3))
    first = trace.meta["first_arrival_s"]
    t = trace.arrival_times() + first
    # A window's count is a renewal count: mean about rate × 600, standard deviation about
    # sqrt(rate × 600) × cv (renewal CLT); 4 of them, plus 2 for the window edges.
    sd_total = math.sqrt(sum(r * 600 * cv**2 for _, r, cv in windows))
    expected = sum(r * 600 for _, r, _ in windows)
    assert abs(len(trace) - expected) < 4 * sd_total
    for s, r, cv in [w for w in windows if w[1] > 0]:
        n = int(((t >= s) & (t < s + 600)).sum())
        assert abs(n - r * 600) < 4 * math.sqrt(r * 600) * max(cv, 1) + 2, (s, n, r * 600)
    assert all(p.prompt_tokens is not None for c in trace.calls for p in c.prompts)
    assert load_trace(path, options=ImportOptions(seed=3)).calls == trace.calls


def test_window_and_grouping_options(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(
        f"2024-01-01 00:00:{s:06.3f},{10 + i},5" for i, s in enumerate([0, 0.5, 0.9, 3, 10, 10.2, 20])))
    windowed = load_trace(path, options=ImportOptions(start=0.5, end=10.1, task="chat"))
    assert windowed.arrival_times().tolist() == pytest.approx([0, 0.4, 2.5, 9.5])
    assert windowed.tasks == ["chat"]
    grouped = load_trace(path, options=ImportOptions(group_gap=1.0, max_prompts=2))
    assert [len(c.prompts) for c in grouped.calls] == [2, 1, 1, 2, 1]


@pytest.mark.parametrize("content, line, field", [
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-01-01 00:00:00,1,1\nyesterday,1,1\n", "line 3", "TIMESTAMP"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-01-01 00:00:00,-4,1\n", "line 2", "ContextTokens"),
    ("TIMESTAMP,ContextTokens\n2024-01-01 00:00:00,4\n", "line 1", "GeneratedTokens"),
])
def test_malformed_azure_rows_name_the_line(tmp_path, content, line, field):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(TraceError) as info:
        load_trace(path, format="azure")
    assert (info.value.record, info.value.field) == (line, field)
    assert "\n" not in str(info.value)


def test_bad_rows_are_skipped_and_counted_with_skip_bad(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 5, "output_length": 2}\n'
                    '{"timestamp": 10, "input_length": -5, "output_length": 2}\n'
                    '{"timestamp": 20, "input_length": 5\n'
                    '{"timestamp": 30, "input_length": 5, "output_length": 2}\n')
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert (info.value.record, info.value.field) == ("line 2", "input_length")
    with pytest.warns(SimctlWarning, match=r"skipped 2 bad row\(s\) \(first: line 2"):
        trace = load_trace(path, options=ImportOptions(skip_bad=True))
    assert len(trace) == 2


def test_import_cli(tmp_path):
    src = real("burstgpt/BurstGPT_1_first400.csv")
    out = tmp_path / "b.json"
    result = runner.invoke(app, ["import", "burstgpt", str(src), "-o", str(out), "--group-gap", "2",
                                 "--task-map", "ChatGPT=mmlu,GPT-4=infobench"])
    assert result.exit_code == 0, result.stderr
    assert "warning: " in result.stderr and "failed" in result.stderr
    trace = load_trace(out)
    assert set(trace.tasks) == {"mmlu", "infobench"} and trace.meta["format"] == "native"
    assert_one_line_error(runner.invoke(app, ["import", "azure", str(src), "-o", str(tmp_path / "c.json")]),
                          "missing column")
    assert_one_line_error(runner.invoke(app, ["import", "parquet", str(src), "-o", str(tmp_path / "d.json")]),
                          "unknown format", "burstgpt")


# -- fitting ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind, cv", [("gamma", 0.6), ("lognormal", 1.5), ("weibull", 0.8), ("poisson", 1.0)])
def test_fitting_recovers_the_family_and_its_parameters(kind, cv):
    gaps = InterArrival(kind, 2.0, cv).sample(np.random.default_rng(1), 100_000)
    model = fit_arrivals(np.cumsum(gaps))
    assert model.best.family == {"poisson": "exponential"}.get(kind, kind)
    assert model.best.mean == pytest.approx(2.0, rel=0.02)
    assert model.best.cv == pytest.approx(cv, rel=0.03)
    if kind == "gamma":
        assert model.best.params["shape"] == pytest.approx(1 / cv**2, rel=0.03)
        assert model.best.params["scale"] == pytest.approx(2.0 * cv**2, rel=0.03)


def test_synthesis_from_a_fit_of_a_real_trace_keeps_its_rate_and_cv():
    """Azure conv: mean gap within 3 %, gap CV within 10 % of the original's."""
    trace = load_trace(real("azure_llm_2023/AzureLLMInferenceTrace_conv.csv"))
    spec, model = spec_from_fit(trace, duration=trace.calls[-1].t)
    synthetic = synthesize(spec, 0)
    g0, g1 = np.diff(trace.arrival_times()), np.diff(synthetic.arrival_times())
    assert g1.mean() == pytest.approx(g0.mean(), rel=0.03)
    assert g1.std() / g1.mean() == pytest.approx(g0.std() / g0.mean(), rel=0.10)
    tokens = [p.prompt_tokens for c in synthetic.calls for p in c.prompts]
    original = [p.prompt_tokens for c in trace.calls for p in c.prompts]
    assert np.mean(tokens) == pytest.approx(np.mean(original), rel=0.05)


def test_rate_scale_below_one_stretches_time(tmp_path):
    src = real("mooncake_fast25/synthetic_trace.jsonl")
    out = tmp_path / "s.json"
    result = runner.invoke(app, ["synth", "--fit", str(src), "--duration", "2000", "--rate-scale", "0.5",
                                 "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    original = np.diff(load_trace(src).arrival_times()).mean()
    stretched = np.diff(load_trace(out).arrival_times()).mean()
    assert stretched == pytest.approx(2 * original, rel=0.08)
    assert "exponential" in result.stdout      # Mooncake's synthetic trace is Poisson


def test_validate_prints_the_fitted_model():
    result = runner.invoke(app, ["validate", str(real("azure_llm_2023/AzureLLMInferenceTrace_conv.csv"))])
    assert result.exit_code == 0
    assert "Fitted inter-arrival model" in result.stdout and "gamma" in result.stdout


def _grouped_by_definition(t: list[float], gap: float, cap: int) -> list[int]:
    """Call starts as the grouping rule states it, request by request."""
    starts, start = [0], 0
    for i in range(1, len(t)):
        if t[i] - t[start] > gap or i - start >= cap:
            starts.append(i)
            start = i
    return starts


@pytest.mark.parametrize("seed", range(6))
def test_grouping_by_array_operations_follows_the_rule(seed):
    """Ties, gaps at the limit and sums that round across it group as the rule says."""
    from simulator.trace.formats._requests import group_starts

    rng = np.random.default_rng(seed)
    # times on a coarse grid (many ties, many gaps exactly the group gap) plus some in between
    t = np.sort(np.concatenate([rng.integers(0, 300, 800) * 0.1, rng.random(200) * 30]))
    for gap in (0.0, 0.1, 0.3, 0.7, 2.0):
        for cap in (1, 2, 8, 1000):
            assert group_starts(t, gap, cap).tolist() == _grouped_by_definition(t.tolist(), gap, cap)


@pytest.mark.parametrize("name", ["conversation_trace.jsonl", "synthetic_trace.jsonl"])
def test_mooncake_fast_reader_agrees_with_the_line_reader(name, monkeypatch):
    """The one-call decoder and the line-by-line reader (which names bad lines) give the same trace."""
    from simulator.trace.formats import mooncake

    path = real(f"mooncake_fast25/{name}")
    options = ImportOptions(group_gap=0.5)
    fast = load_trace(path, options=options)
    monkeypatch.setattr(mooncake, "_read_columns", lambda path, options: None)
    slow = load_trace(path, options=options)
    assert fast == slow and fast.meta == slow.meta
    assert fast.columns.call_ids.tolist() == slow.columns.call_ids.tolist()


@pytest.mark.parametrize("rel", ["azure_llm_2023/AzureLLMInferenceTrace_code.csv",
                                 "burstgpt/BurstGPT_1_first400.csv", "burstgpt/BurstGPT_3_first400.csv"])
def test_csv_column_reader_agrees_with_the_text_reader(rel, monkeypatch):
    """pyarrow's typed column read and pandas' text read (which names bad rows) give the same trace."""
    from simulator.trace.formats import _requests, azure, burstgpt

    path = real(rel)
    used = []
    for module in (azure, burstgpt):
        monkeypatch.setattr(module, "read_csv_columns",
                            lambda path, types: used.append(_requests.read_csv_columns(path, types)) or used[-1])
    options = {"group_gap": 0.5, "task_map": {"GPT-4": "big"}}
    fast = quiet_load(path, **options)
    assert used and used[-1] is not None  # the column reader read this file
    for module in (azure, burstgpt):
        monkeypatch.setattr(module, "read_csv_columns", lambda path, types: None)
    slow = quiet_load(path, **options)
    assert fast == slow and fast.meta == slow.meta
    assert fast.columns.call_ids.tolist() == slow.columns.call_ids.tolist()
