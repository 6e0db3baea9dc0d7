"""Result files the tools wrote against ``simctl serve`` (``tests/data/tool_fixtures/simctl-serve``,
written by ``benchmarks/tool_compat.py --fixtures``), checked as that benchmark checks a live
run: simctl's reader gives the tools' own counts and percentiles, and the tools' figures are
those of ``simctl replay`` of the same schedule (the files are fixed, the replay deterministic:
nothing here depends on timing)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "data" / "tool_fixtures" / "simctl-serve"
#: the --time-scale of the server these files were written against (their README)
TIME_SCALE = 5.0


def _bench():
    spec = importlib.util.spec_from_file_location("tool_compat", ROOT / "benchmarks" / "tool_compat.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    return _bench()


def test_guidellm_sweep_against_simctl_serve(bench):
    rows = bench.check_file("GuideLLM sweep", FIXTURES / "guidellm-sweep.json", "guidellm", TIME_SCALE)
    benchmarks = json.loads((FIXTURES / "guidellm-sweep.json").read_text())["benchmarks"]
    assert len(rows) == len(benchmarks) == 3
    for row, b in zip(rows, benchmarks, strict=True):
        assert row["requests"] == row["ok"] == b["metrics"]["request_totals"]["successful"] == row["reader_requests"]
        assert row["reader_worst"] <= bench.READER_TOLERANCE, row
        assert row["replay_worst"] <= bench.TOLERANCE, row
        assert row["pass"]


def test_aiperf_against_simctl_serve(bench):
    (row,) = bench.check_file("AIPerf", FIXTURES / "aiperf", "aiperf", TIME_SCALE, "rate 1/s")
    summary = json.loads((FIXTURES / "aiperf" / "profile_export_aiperf.json").read_text())
    assert row["requests"] == row["ok"] == int(summary["request_count"]["avg"]) == row["reader_ok"]
    assert row["reader_worst"] <= bench.READER_TOLERANCE and row["replay_worst"] <= bench.TOLERANCE, row
    # the sleep backend's words count as the server's tokens: AIPerf's own output lengths
    # (its tokenizer's count) equal the server's usage counts
    assert summary["osl_mismatch_diff_pct"]["avg"] == pytest.approx(0, abs=1e-9)


def test_a_replay_that_disagrees_fails_the_check(bench):
    """The check can fail: the same schedule replayed at twice the time scale is off."""
    rows = bench.check_file("GuideLLM sweep", FIXTURES / "guidellm-sweep.json", "guidellm", 2 * TIME_SCALE)
    assert not any(r["pass"] for r in rows)


def test_nearest_rank_is_guidellms_percentile(bench):
    import numpy as np

    values = np.array([5.0, 1.0, 4.0, 2.0, 3.0, 6.0, 7.0, 8.0, 9.0, 10.0])
    assert bench.nearest_rank(values, 50) == 5.0
    assert bench.nearest_rank(values, 90) == 10.0   # 0.1 summed nine times falls short of 0.9
    assert bench.nearest_rank(values, 50, weights=np.r_[np.ones(9), 100.0]) == 10.0
