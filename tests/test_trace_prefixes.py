"""Prefix identity of prompts (block hash ids): kept by every reader, writer and derived trace."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error
from hypothesis import HealthCheck, given, settings, strategies as st
from typer.testing import CliRunner

from simulator.cli import app
from simulator.errors import TraceError
from simulator.trace.formats import ImportOptions, load_trace, save_trace
from simulator.trace.formats.mooncake import BLOCK_TOKENS
from simulator.trace.formats.native import read_native, read_native_fast
from simulator.trace.model import Call, Prompt, Trace, TraceColumns, take_prefixes

REAL = Path(__file__).resolve().parent.parent.parent / "shared" / "traces" / "real"
CONVERSATION = REAL / "mooncake_fast25" / "conversation_trace.jsonl"
runner = CliRunner()


def mooncake_lines(records: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def small_mooncake(tmp_path: Path) -> Path:
    path = tmp_path / "m.jsonl"
    path.write_text(mooncake_lines([
        {"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]},
        {"timestamp": 30, "input_length": 1500, "output_length": 7, "hash_ids": [0, 1, 2]},
        {"timestamp": 10, "input_length": 20, "output_length": 1},                          # none (absent)
        {"timestamp": 40, "input_length": 600, "output_length": 2, "hash_ids": None},      # none (null)
        {"timestamp": 50, "input_length": 900, "output_length": 3, "hash_ids": [7, 8]},
    ]))
    return path


def prefixes_by_call(trace: Trace) -> dict[str, list[tuple[int, ...] | None]]:
    return {c.id: [p.prefix for p in c.prompts] for c in trace.calls}


def test_mooncake_keeps_each_requests_ids_with_its_request(tmp_path):
    trace = load_trace(small_mooncake(tmp_path))
    assert trace.has_prefixes and trace.prefix_block_tokens == BLOCK_TOKENS == 512
    # calls are sorted by time (line 3 before line 2) and the ids moved with their request
    assert prefixes_by_call(trace) == {"1": [(0, 1)], "3": [None], "2": [(0, 1, 2)], "4": [None], "5": [(7, 8)]}
    cols = trace.columns
    assert cols.prefix_offsets.dtype == cols.prefix_hashes.dtype == np.int64
    assert cols.prefix_offsets.tolist() == [0, 2, 2, 5, 5, 7]
    assert cols.prefix_of(1).tolist() == [] and cols.prefix_of(2).tolist() == [0, 1, 2]
    # a window and grouping keep them too
    part = load_trace(tmp_path / "m.jsonl", options=ImportOptions(start=0.005, end=0.045, group_gap=0.02))
    assert [p.prefix for c in part.calls for p in c.prompts] == [None, (0, 1, 2), None]
    assert not load_trace(tmp_path / "m.jsonl", options=ImportOptions(start=0.035, end=0.045)).has_prefixes


def test_mooncake_line_reader_agrees_with_the_fast_reader(tmp_path, monkeypatch):
    from simulator.trace.formats import mooncake

    path = small_mooncake(tmp_path)
    fast = load_trace(path)
    monkeypatch.setattr(mooncake, "_read_columns", lambda path, options: None)
    slow = load_trace(path)
    assert slow == fast and slow.prefix_block_tokens == fast.prefix_block_tokens


def test_round_trip_mooncake_native_parquet_and_back(tmp_path):
    trace = load_trace(small_mooncake(tmp_path), options=ImportOptions(group_gap=0.015))
    save_trace(trace, tmp_path / "t.json")
    native = load_trace(tmp_path / "t.json")
    save_trace(native, tmp_path / "t.parquet", format="parquet")
    parquet = load_trace(tmp_path / "t.parquet")
    save_trace(parquet, tmp_path / "u.json")
    back = load_trace(tmp_path / "u.json")
    for other in (native, parquet, back):
        assert other.calls == trace.calls and other.prefix_block_tokens == 512
        assert np.array_equal(other.columns.prefix_offsets, trace.columns.prefix_offsets)
        assert np.array_equal(other.columns.prefix_hashes, trace.columns.prefix_hashes)
    # the general JSON reader reads what the fast ones read
    raw = (tmp_path / "u.json").read_bytes()
    assert read_native(json.loads(raw), tmp_path / "u.json").calls == read_native_fast(raw, "u.json").calls == trace.calls
    assert '"prefix_block_tokens": 512' in raw.decode() and '"hash_ids": [0, 1, 2]' in raw.decode()


def test_a_trace_without_ids_costs_nothing_and_writes_none(tmp_path):
    trace = Trace(calls=(Call("0", 0.0, (Prompt("mmlu", 10), Prompt("graph"))),))
    cols = trace.columns
    assert (cols.prefix_offsets, cols.prefix_hashes, cols.prefix_block_tokens) == (None, None, 0)
    assert not trace.has_prefixes and cols.prefix_of(0).tolist() == []
    save_trace(trace, tmp_path / "t.json")
    save_trace(trace, tmp_path / "t.parquet", format="parquet")
    assert "hash_ids" not in (tmp_path / "t.json").read_text()
    assert "prefix_block_tokens" not in (tmp_path / "t.json").read_text()
    import pyarrow.parquet as pq
    assert "hash_ids" not in pq.read_table(tmp_path / "t.parquet").column_names
    # a file giving a block size but no ids: no prefixes
    (tmp_path / "b.json").write_text(json.dumps({"format": "simctl-trace/1", "prefix_block_tokens": 16,
                                                 "calls": [{"t": 0, "prompts": ["a"]}]}))
    assert not load_trace(tmp_path / "b.json").has_prefixes


def test_a_trace_made_from_calls_needs_its_block_size():
    calls = (Call("0", 0.0, (Prompt("a", prefix=(3, 4)),)),)
    with pytest.raises(TraceError, match="prefix_block_tokens"):
        Trace(calls=calls)
    trace = Trace(calls=calls, prefix_block_tokens=16)
    assert trace.prefix_block_tokens == 16 and trace.columns.prefix_block_tokens == 16
    assert trace != Trace(calls=calls, prefix_block_tokens=32)
    with pytest.raises(TraceError, match="prefix"):
        _ = Trace(calls=(Call("0", 0.0, (Prompt("a", prefix=(-1,)),)),), prefix_block_tokens=16).columns


# -- every derived trace keeps each prompt's ids ------------------------------------------------

prompt_st = st.builds(Prompt, task=st.sampled_from(["a", "b", "c"]),
                      prefix=st.none() | st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=4).map(tuple))
calls_st = st.lists(st.lists(prompt_st, min_size=1, max_size=3), min_size=1, max_size=8).map(
    lambda cs: tuple(Call(str(i), float(i // 2), tuple(ps)) for i, ps in enumerate(cs)))


def expected(trace: Trace) -> dict[str, list[tuple[int, ...] | None]]:
    return {c.id: [p.prefix for p in c.prompts] for c in trace.calls}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(calls=calls_st, n=st.integers(0, 9), columns=st.booleans())
def test_derived_traces_keep_each_prompts_ids(calls, n, columns, tmp_path_factory):
    made = Trace(calls=calls, prefix_block_tokens=64)
    trace = Trace(columns=made.columns) if columns else made
    ids = expected(made)
    for derived in (trace.scaled(2.0), trace.renamed({"a": "b"}), pickle.loads(pickle.dumps(trace)), trace.head(n),
                    trace.after(n / 2),
                    Trace(columns=TraceColumns.of_calls(trace.calls, 64))):
        got = expected(derived)
        assert got == {k: ids[k] for k in got}
        assert derived.prefix_block_tokens == (64 if any(p for v in got.values() for p in v) else 0)
        cols = derived.columns
        flat = [p for c in derived.calls for p in c.prompts]
        assert [tuple(cols.prefix_of(i).tolist()) or None for i in range(len(flat))] == [p.prefix for p in flat]
    # the readers: native and Parquet give the same ids back
    folder = tmp_path_factory.mktemp("rt")
    for fmt, name in (("native", "t.json"), ("parquet", "t.parquet")):
        save_trace(trace, folder / name, format=fmt)
        assert expected(load_trace(folder / name)) == ids


def test_take_prefixes_reorders_and_selects():
    offsets, hashes = np.array([0, 2, 2, 5]), np.array([1, 2, 3, 4, 5])
    new, taken = take_prefixes(offsets, hashes, np.array([2, 0, 2]))
    assert new.tolist() == [0, 3, 5, 8] and taken.tolist() == [3, 4, 5, 1, 2, 3, 4, 5]
    assert take_prefixes(None, None, np.array([0])) == (None, None)


def test_unsorted_parquet_calls_keep_their_ids(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"call_id": ["a", "b", None], "t": [2.0, 1.0, None], "task": ["x", "y", "y"],
                      "hash_ids": pa.array([[1, 2], [3], [4, 5, 6]], pa.list_(pa.int64()))})
    header = json.dumps({"format": "simctl-trace/1", "prefix_block_tokens": 8, "meta": {}})
    pq.write_table(table.replace_schema_metadata({b"simctl": header.encode()}), tmp_path / "u.parquet")
    with pytest.warns(Warning, match="not sorted"):
        trace = load_trace(tmp_path / "u.parquet")
    assert expected(trace) == {"b": [(3,), (4, 5, 6)], "a": [(1, 2)]}


# -- bad ids: one line naming file, record and field, by every reader ---------------------------

BAD_IDS = [(-1, "-1"), ("x", '"x"'), ([1], "[1]"), (1.5, "1.5"), (True, "true"), (2**64, "digits")]


@pytest.mark.parametrize("bad, shown", BAD_IDS)
def test_bad_mooncake_hash_ids_are_named(tmp_path, bad, shown):
    path = tmp_path / "m.jsonl"
    path.write_text(mooncake_lines([{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]},
                                    {"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [0, bad]}]))
    result = runner.invoke(app, ["validate", str(path)])
    assert_one_line_error(result, str(path), "line 2", "'hash_ids'", "element 1", shown)


@pytest.mark.parametrize("value", ['"abc"', "7", '{"a": 1}'])
def test_mooncake_hash_ids_that_are_not_a_list_are_named(tmp_path, value):
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": ' + value + "}\n")
    assert_one_line_error(runner.invoke(app, ["validate", str(path)]), "line 1", "'hash_ids'", "must be a list")


@pytest.mark.parametrize("bad, shown", BAD_IDS)
@pytest.mark.parametrize("layout", ["writer", "compact"])
def test_bad_native_hash_ids_are_named(tmp_path, bad, shown, layout):
    calls = [{"id": "a", "t": 0, "prompts": [{"task": "x", "hash_ids": [1]}]},
             {"id": "b", "t": 1, "prompts": ["x", {"task": "x", "hash_ids": [1, bad]}]}]
    doc = {"format": "simctl-trace/1", "prefix_block_tokens": 4, "meta": {}, "calls": calls}
    path = tmp_path / "t.json"
    if layout == "writer":  # one call a line, as the line reader takes it
        good = Trace(calls=(Call("a", 0.0, (Prompt("x", prefix=(1,)),)),), prefix_block_tokens=4)
        save_trace(good, path)
        text = path.read_text().replace("\n  ]\n}", ",\n    " + json.dumps(calls[1]) + "\n  ]\n}")
        path.write_text(text)
    else:
        path.write_text(json.dumps(doc))
    assert_one_line_error(runner.invoke(app, ["validate", str(path)]), str(path), "record 1",
                          "'prompts[1].hash_ids[1]'", shown)


def test_native_hash_ids_need_the_block_size(tmp_path):
    calls = [{"t": 0, "prompts": [{"task": "x"}]}, {"t": 1, "prompts": [{"task": "x", "hash_ids": [1]}]}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": "simctl-trace/1", "calls": calls}))
    assert_one_line_error(runner.invoke(app, ["validate", str(path)]), str(path), "'prefix_block_tokens'",
                          "record 1")
    path.write_text(json.dumps(calls))
    assert_one_line_error(runner.invoke(app, ["validate", str(path)]), "'prefix_block_tokens'", "bare list")
    for bad in (0, -3, "512", 1.5, True):
        path.write_text(json.dumps({"format": "simctl-trace/1", "prefix_block_tokens": bad, "calls": calls}))
        assert_one_line_error(runner.invoke(app, ["validate", str(path)]), "'prefix_block_tokens'", "integer >= 1")
    path.write_text(json.dumps({"format": "simctl-trace/1", "prefix_block_tokens": 8, "calls": [
        {"t": 0, "prompts": [{"task": "x", "hash_ids": "12"}]}]}))
    assert_one_line_error(runner.invoke(app, ["validate", str(path)]), "record 0", "'prompts[0].hash_ids'",
                          "must be a list")


def test_bad_parquet_hash_ids_are_named(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    def write(ids: pa.Array, header: dict | None) -> Path:
        table = pa.table({"call_id": ["a", "b"], "t": [0.0, 1.0], "task": ["x", "x"], "hash_ids": ids})
        if header is not None:
            table = table.replace_schema_metadata({b"simctl": json.dumps(header).encode()})
        path = tmp_path / "t.parquet"
        pq.write_table(table, path)
        return path

    header = {"format": "simctl-trace/1", "prefix_block_tokens": 8}
    cases = [
        (pa.array([[1], [2, -5]], pa.list_(pa.int64())), header, ("record 1", "'hash_ids'", "-5")),
        (pa.array([[1], [2, None]], pa.list_(pa.int64())), header, ("record 1", "'hash_ids'", "null")),
        (pa.array([[1], [2**64 - 1]], pa.list_(pa.uint64())), header, ("record 1", "'hash_ids'")),
        (pa.array([["1"], ["2"]], pa.list_(pa.string())), header, ("'hash_ids'", "integers")),
        (pa.array(["1", "2"]), header, ("'hash_ids'", "type")),
        (pa.array([[1], [2]], pa.list_(pa.int64())), None, ("'prefix_block_tokens'", "missing")),
        (pa.array([[1], [2]], pa.list_(pa.int64())), {**header, "prefix_block_tokens": 0},
         ("'prefix_block_tokens'", ">= 1")),
    ]
    for ids, head, needles in cases:
        assert_one_line_error(runner.invoke(app, ["validate", str(write(ids, head))]), "t.parquet", *needles)


# -- the real Mooncake conversation trace -------------------------------------------------------

def test_real_mooncake_conversation_trace_keeps_every_requests_ids(tmp_path):
    if not CONVERSATION.exists():
        pytest.skip(f"the Mooncake conversation trace is not here ({CONVERSATION}); it lives in ../shared")
    lines = CONVERSATION.read_text().splitlines()
    trace = load_trace(CONVERSATION)
    cols = trace.columns
    assert trace.prefix_block_tokens == 512
    assert len(cols.prefix_hashes) == sum(len(json.loads(line)["hash_ids"]) for line in lines)
    # the prompts are in file order (the timestamps never go back): prompt i is line i + 1
    for i in (0, 1, 2, 1000, 6543, len(lines) - 1):
        assert cols.call_ids[cols.call_of[i]] == str(i + 1)
        assert cols.prefix_of(i).tolist() == json.loads(lines[i])["hash_ids"]
    # through simctl import and back, every request's ids are the file's
    out = tmp_path / "c.parquet"
    result = runner.invoke(app, ["import", "mooncake", str(CONVERSATION), "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    back = load_trace(out)
    assert np.array_equal(back.columns.prefix_hashes, cols.prefix_hashes)
    assert np.array_equal(back.columns.prefix_offsets, cols.prefix_offsets)
    stats = json.loads(runner.invoke(app, ["validate", str(out), "--json"]).stdout)["prefix"]
    assert stats["prompts_with_ids"] == len(lines) and stats["block_tokens"] == 512
    assert stats["distinct_blocks"] == len({h for line in lines for h in json.loads(line)["hash_ids"]})
