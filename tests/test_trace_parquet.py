"""Parquet traces: what save_trace writes reads back whole, and what a trace may not hold
is refused with one line naming the file, the record and the field."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from typer.testing import CliRunner

from simulator.cli import app
from simulator.errors import SimctlWarning, TraceError
from simulator.trace.formats import load_trace, save_trace, sniff
from simulator.trace.model import Call, Prompt, Trace

prompts = st.builds(Prompt, st.sampled_from(["graph", "mmlu", "infobench"]),
                    st.one_of(st.none(), st.integers(0, 2**31 - 1)), st.one_of(st.none(), st.integers(1, 4096)),
                    st.one_of(st.none(), st.text(max_size=4)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.floats(0, 1e6), st.text(min_size=1, max_size=5),
                          st.lists(prompts, min_size=1, max_size=8)), min_size=1, max_size=30, unique_by=lambda c: c[1]),
       st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3))
def test_a_parquet_trace_keeps_what_the_json_keeps(tmp_path, drawn, meta):
    drawn.sort(key=lambda c: c[0])
    trace = Trace(tuple(Call(i, t, tuple(ps)) for t, i, ps in drawn), meta=meta)
    json_path, parquet_path = tmp_path / "t.json", tmp_path / "t.parquet"
    save_trace(trace, json_path, force=True)
    save_trace(load_trace(json_path), parquet_path, format="parquet", force=True)
    read = load_trace(parquet_path)
    assert "calls" not in read.__dict__  # read as columns
    assert read.calls == load_trace(json_path).calls == trace.calls
    assert read.meta == {**meta, "format": "parquet"}


def test_integer_ids_and_epochs_read_as_the_json_reads_them(tmp_path):
    trace = Trace(tuple(Call(str(i), 1.7e9 + i, (Prompt("q"),)) for i in (3, 1, 2)))
    path = tmp_path / "t.parquet"
    save_trace(trace, path, format="parquet")
    with pytest.warns(SimctlWarning, match="not sorted by time"):
        read = load_trace(path)
    assert sniff(path) == "parquet"
    assert [c.id for c in read.calls] == ["1", "2", "3"]
    assert read.arrival_times().tolist() == [0.0, 1.0, 2.0] and read.meta["epoch_start"] == 1.7e9 + 1


def write_table(path, columns, meta=None):
    table = pa.table(columns)
    if meta is not None:
        table = table.replace_schema_metadata({b"simctl": json.dumps(meta).encode()})
    pq.write_table(table, path)
    return path


GOOD = {"call_id": ["a", None, "b"], "t": [0.0, None, 1.0], "task": ["mmlu", "graph", "mmlu"]}


@pytest.mark.parametrize("change, record, field, message", [
    ({"call_id": ["a", None, "a"]}, 1, "call_id", "duplicate call id"),
    ({"call_id": ["1", None, "1"]}, 1, "call_id", "duplicate call id"),
    ({"call_id": [None, "a", "b"]}, 0, "call_id", "missing on the first row"),
    ({"call_id": ["a", None, ""]}, 1, "call_id", "non-empty"),
    ({"t": [0.0, 0.5, 1.0]}, 0, "t", "not its call's first"),
    ({"t": [None, None, 1.0]}, 0, "t", "missing"),
    ({"t": [0.0, None, -1.0]}, 1, "t", "non-negative"),
    ({"t": [0.0, None, float("nan")]}, 1, "t", "non-negative"),
    ({"task": ["mmlu", " ", "mmlu"]}, 0, "task", "non-empty task name"),
    ({"task": ["mmlu", "gr\naph", "mmlu"]}, 0, "task", "control character"),
    ({"task": ["mmlu", None, "mmlu"]}, 0, "task", "missing"),
    ({"prompt_tokens": pa.array([1, -1, 2], pa.int64())}, 0, "prompt_tokens", ">= 0"),
    ({"max_tokens": pa.array([1, 0, 2], pa.int64())}, 0, "max_tokens", ">= 1"),
    ({"max_tokens": pa.array([1, 2**31, 2], pa.int64())}, 0, "max_tokens", "too large"),
    ({"t": ["x", None, "y"]}, None, "t", "type"),
    ({"extra": [1, 2, 3]}, None, "extra", "unknown column"),
])
def test_what_a_trace_may_not_hold_is_named(tmp_path, change, record, field, message):
    path = write_table(tmp_path / "bad.parquet", {**GOOD, **change})
    with pytest.raises(TraceError, match=message) as info:
        load_trace(path)
    assert (info.value.record, info.value.field) == (record, field)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_file_level_errors(tmp_path):
    with pytest.raises(TraceError, match="unsupported format"):
        load_trace(write_table(tmp_path / "a.parquet", GOOD, {"format": "other/2"}))
    with pytest.raises(TraceError, match="missing column"):
        load_trace(write_table(tmp_path / "b.parquet", {"t": [0.0]}))
    with pytest.raises(TraceError, match="no calls"):
        load_trace(write_table(tmp_path / "c.parquet", {k: pa.array([], pa.string() if k != "t" else pa.float64())
                                                         for k in GOOD}))
    broken = tmp_path / "d.parquet"
    broken.write_bytes(b"PAR1" + b"\0" * 64)
    with pytest.raises(TraceError, match="not a readable Parquet file"):
        load_trace(broken)


def test_import_validate_and_replay_read_and_write_parquet(tmp_path):
    source = tmp_path / "azure.csv"
    source.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,100,20\n"
                      "2023-11-16 18:15:47.00,50,10\n")
    out = tmp_path / "t.parquet"
    runner = CliRunner()
    result = runner.invoke(app, ["import", "auto", str(source), "-o", str(out)])
    assert result.exit_code == 0, result.output
    read = load_trace(out)
    assert read.meta["format"] == "parquet" and len(read) == 2
    assert [p.prompt_tokens for c in read.calls for p in c.prompts] == [100, 50]
    result = runner.invoke(app, ["validate", str(out), "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["calls"] == 2
    bad = write_table(tmp_path / "bad.parquet", {**GOOD, "t": [0.0, None, -1.0]})
    result = runner.invoke(app, ["validate", str(bad)])
    assert result.exit_code != 0 and "record 1" in result.output and "Traceback" not in result.output


def test_columns_read_equal_the_calls_written(tmp_path):
    calls = tuple(Call(f"c{i}", float(i), tuple(Prompt("mmlu" if j else "graph", j or None, 5, None)
                                                 for j in range(i % 3 + 1))) for i in range(50))
    path = tmp_path / "t.parquet"
    save_trace(Trace(calls), path, format="parquet")
    cols = load_trace(path).columns
    assert cols.task_names == ("graph", "mmlu")
    assert np.bincount(cols.call_of).tolist() == [i % 3 + 1 for i in range(50)]
