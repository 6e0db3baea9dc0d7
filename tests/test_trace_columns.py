"""A trace held as columns: the fast native reader, and every trace operation on columns.

The fast reader (:func:`simulator.trace.formats.native.read_native_fast`) reads the
canonical form of ``simctl-trace/1`` straight into columns and leaves everything else to
the general reader. Whichever reads a file, the trace, its warnings and its errors must be
the same: these tests read each drawn file both ways and compare.
"""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from simulator.errors import TraceError
from simulator.trace.formats import load_trace, save_trace
from simulator.trace.formats._common import read_json
from simulator.trace.formats.native import read_native, read_native_fast, read_native_lines
from simulator.trace.model import Call, Prompt, Trace, TraceColumns

# -- drawn files: a valid file in the canonical form, then at most one change ------------

valid_prompts = st.one_of(
    st.sampled_from(["graph", "mmlu", "infobench", "a b", "ünï"]),
    st.fixed_dictionaries({"task": st.sampled_from(["graph", "mmlu", "infobench"])}, optional={
        "prompt_tokens": st.one_of(st.none(), st.integers(0, 5000)),
        "max_tokens": st.one_of(st.none(), st.integers(1, 5000)),
        "text": st.one_of(st.none(), st.text(max_size=5))}),
)
valid_calls = st.lists(
    st.fixed_dictionaries({"t": st.floats(0, 1e4), "prompts": st.lists(valid_prompts, min_size=1, max_size=4)},
                          optional={"id": st.text(min_size=1, max_size=3)}),
    min_size=1, max_size=6,
).map(lambda calls: sorted(calls, key=lambda c: c["t"]))

#: One change each: what the format allows outside its canonical form, and what it refuses.
CHANGES = {
    "none": lambda call, prompt: None,
    "synonym of t": lambda call, prompt: call.update(timestamp=call.pop("t")),
    "synonym of task": lambda call, prompt: isinstance(prompt, dict) and prompt.update(type=prompt.pop("task")),
    "unknown call field": lambda call, prompt: call.update(other=1),
    "unknown prompt field": lambda call, prompt: isinstance(prompt, dict) and prompt.update(extra=None),
    "iso time": lambda call, prompt: call.update(t="2025-01-01T00:00:00"),
    "epoch time": lambda call, prompt: call.update(t=call["t"] + 1.5e9),
    "negative time": lambda call, prompt: call.update(t=-1.0),
    "time as text": lambda call, prompt: call.update(t="soon"),
    "time null": lambda call, prompt: call.update(t=None),
    "no prompts": lambda call, prompt: call.update(prompts=[]),
    "prompt a number": lambda call, prompt: call["prompts"].append(3),
    "blank task": lambda call, prompt: call["prompts"].append(" "),
    "negative tokens": lambda call, prompt: call["prompts"].append({"task": "mmlu", "prompt_tokens": -1}),
    "zero max tokens": lambda call, prompt: call["prompts"].append({"task": "mmlu", "max_tokens": 0}),
    "huge tokens": lambda call, prompt: call["prompts"].append({"task": "mmlu", "max_tokens": 2**63}),
    "boolean tokens": lambda call, prompt: call["prompts"].append({"task": "mmlu", "prompt_tokens": True}),
    "fractional tokens": lambda call, prompt: call["prompts"].append({"task": "mmlu", "prompt_tokens": 1.5}),
    "integer id": lambda call, prompt: call.update(id=7),
    "empty id": lambda call, prompt: call.update(id=""),
    "duplicate id": lambda call, prompt: call.update(id="0"),
    "out of order": lambda call, prompt: call.update(t=1e5),
}


@st.composite
def documents(draw):
    calls = draw(valid_calls)
    change = draw(st.sampled_from(sorted(CHANGES)))
    call = calls[draw(st.integers(0, len(calls) - 1))]
    CHANGES[change](call, call["prompts"][0])
    if change == "out of order" and len(calls) > 1:
        calls.remove(call)
        calls.insert(0, call)
    if change == "duplicate id":
        calls[0]["id"] = "0"
    form = draw(st.sampled_from(["list", "wrapped", "wrapped, other format", "wrapped, meta a number"]))
    if form == "list":
        return calls
    meta = 5 if form.endswith("number") else draw(st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
    return {"format": "other" if "other" in form else "simctl-trace/1", "meta": meta, "calls": calls}


def read_both(path: Path) -> tuple[object, object]:
    """What ``load_trace`` gives for ``path`` and what the general reader gives: a trace and
    the warnings' texts, or the error's fields."""
    def outcome(read):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                trace = read()
            except TraceError as exc:
                return ("error", exc.record, exc.field, str(exc))
        return ("trace", trace, [str(w.message) for w in caught])
    return outcome(lambda: load_trace(path)), outcome(lambda: read_native(read_json(path), path))


def laid_out(document, layout: str) -> str:
    """``document`` as JSON text: on one line, indented, or one call a line as
    :func:`~simulator.trace.formats.save_trace` writes it (then read a block at a time)."""
    if layout == "one line":
        return json.dumps(document)
    if layout == "indented" or not isinstance(document, dict):
        return json.dumps(document, indent=2)
    head = json.dumps({k: v for k, v in document.items() if k != "calls"}, indent=2)[:-2]
    calls = ",\n    ".join(json.dumps(c) for c in document["calls"])
    return head + ',\n  "calls": [\n    ' + calls + "\n  ]\n}\n"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(documents(), st.sampled_from(["one line", "indented", "a call a line"]))
def test_the_fast_readers_change_nothing_a_reader_says(tmp_path, document, layout):
    path = tmp_path / "trace.json"
    path.write_text(laid_out(document, layout))
    fast, general = read_both(path)
    assert fast == general
    if fast[0] == "trace":
        assert_same_columns(fast[1].columns, TraceColumns.of_calls(general[1].calls))


written_prompts = st.builds(Prompt, st.sampled_from(["graph", "mmlu", "infobench"]),
                            st.one_of(st.none(), st.integers(0, 4000)), st.one_of(st.none(), st.integers(1, 4096)),
                            st.one_of(st.none(), st.text(max_size=4)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.floats(0, 1e6), st.lists(written_prompts, min_size=1, max_size=8)),
                min_size=1, max_size=30))
def test_what_save_trace_writes_is_read_into_columns_alone(tmp_path, drawn):
    drawn.sort(key=lambda c: c[0])
    trace = Trace(tuple(Call(f"c{i}", t, tuple(ps)) for i, (t, ps) in enumerate(drawn)))
    path = tmp_path / "t.json"
    save_trace(trace, path, force=True)
    read = load_trace(path)
    assert "calls" not in read.__dict__  # a fast reader read it: no Call objects made
    with path.open("rb") as handle:
        assert read_native_lines(handle, path) == read_native_fast(path.read_bytes(), path) == read
    assert read.calls == trace.calls
    assert_same_columns(read.columns, trace.columns)


def assert_same_columns(a: TraceColumns, b: TraceColumns) -> None:
    for name in TraceColumns.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            assert x is not None and y is not None, name
            assert x.dtype == y.dtype and x.tolist() == y.tolist(), name
        else:
            assert x == y, name


# -- every trace operation on columns equals the same on calls --------------------------


@pytest.fixture
def pair() -> tuple[Trace, Trace]:
    calls = (
        Call("a", 0.0, (Prompt("mmlu", 10, 20), Prompt("graph"))),
        Call("b", 1.5, (Prompt("infobench", None, 7, "hello"),)),
        Call("c", 4.0, (Prompt("graph", 3), Prompt("mmlu"), Prompt("infobench", 0, None))),
    )
    on_calls = Trace(calls=calls, meta={"x": 1}, source="s")
    on_columns = Trace(columns=TraceColumns.of_calls(calls), meta={"x": 1}, source="s")
    assert "calls" not in on_columns.__dict__ and "columns" not in on_calls.__dict__
    return on_calls, on_columns


def test_a_file_is_read_a_block_of_calls_at_a_time(tmp_path, monkeypatch):
    from simulator.trace.formats import native

    monkeypatch.setattr(native, "BLOCK_BYTES", 64)
    trace = Trace(tuple(Call(f"c{i}", float(i), (Prompt("mmlu" if i % 2 else "graph", i, None, "x" if i == 4 else None),))
                        for i in range(10)), meta={"k": [1]})
    path = tmp_path / "t.json"
    save_trace(trace, path)
    with path.open("rb") as handle:
        read = read_native_lines(handle, path)
    assert read is not None and read.calls == trace.calls and read.meta == {"k": [1], "format": "native"}
    assert read.columns.task_names == ("graph", "mmlu")
    path.write_text(path.read_text().replace('"c7"', '"c1"'))  # a repeated id, in another block
    assert read_native_lines(path.open("rb"), path) is None
    with pytest.raises(TraceError, match="duplicate call id"):
        load_trace(path)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=st.lists(st.tuples(st.sampled_from(["c", "long-id-of-a-call-", "é", 'q"']),
                                st.lists(written_prompts, min_size=1, max_size=3)), min_size=0, max_size=12),
       block=st.sampled_from([16, 64, 200, 1 << 20]), tail=st.sampled_from(["", "\n", " \n\t ", "x", " " * (1 << 16) + "\n"]))
def test_a_file_is_read_as_its_bytes_streamed_are(tmp_path, monkeypatch, drawn, block, tail):
    """A trace file is read by positioned reads into one buffer (blocks are views of it); the
    same bytes streamed from a file object that has no file (read a block at a time) give the
    same trace, or ``None`` alike: across block boundaries, lines longer than a block, blocks
    left to msgspec (an escaped id), what may follow the document (past what is looked
    through from the end too), and a call list left empty."""
    import io

    from simulator.trace.formats import native

    monkeypatch.setattr(native, "BLOCK_BYTES", block)
    trace = Trace(tuple(Call(f"{stem}{i}", float(i), tuple(ps)) for i, (stem, ps) in enumerate(drawn)), meta={"k": 1})
    path = tmp_path / "t.json"
    save_trace(trace, path, force=True)
    path.write_bytes(path.read_bytes() + tail.encode())
    with path.open("rb") as handle:
        assert native._file_of(handle) is not None
        from_file = read_native_lines(handle, path)
    streamed = read_native_lines(io.BytesIO(path.read_bytes()), path)
    assert from_file == streamed
    if drawn and len(tail) < 8 and tail != "x":
        assert from_file is not None and from_file.calls == trace.calls
        assert_same_columns(from_file.columns, trace.columns)
    elif tail != " " * (1 << 16) + "\n":  # no calls, or not JSON after the document: the general reader decides
        assert from_file is None  # (whitespace that long: either, as the streamed read does)


def test_without_positioned_reads_a_file_is_streamed(tmp_path, monkeypatch):
    from simulator.trace.formats import native

    path = tmp_path / "t.json"
    trace = Trace(tuple(Call(f"c{i}", float(i), (Prompt("mmlu", i, 4),)) for i in range(5)))
    save_trace(trace, path)
    monkeypatch.delattr(native.os, "preadv")
    with path.open("rb") as handle:
        assert native._file_of(handle) is None
        read = read_native_lines(handle, path)
    assert read is not None and read.calls == trace.calls


def test_prompt_lists_are_told_apart_by_their_bytes_not_their_hash(tmp_path, monkeypatch):
    from simulator.trace.formats import native

    data = np.frombuffer(b"[1][2][1][22][2]", dtype=np.uint8).copy()
    offsets = np.array([0, 3, 6, 9, 13, 16])
    which, firsts = native._distinct(data, offsets)
    assert which.tolist() == [0, 1, 0, 2, 1] and firsts.tolist() == [0, 1, 3]  # numbered by first appearance
    # every hash equal (a zero multiplier: a string's hash is its length): the same-length
    # strings collide, which the byte comparison finds, and the block goes to msgspec
    monkeypatch.setattr(native, "_HASH_BASE", np.uint64(0))
    assert native._distinct(data, offsets) is None
    trace = Trace(tuple(Call(f"c{i}", float(i), (Prompt(task),)) for i, task in enumerate(["ab", "cd", "ab", "ef"])))
    path = tmp_path / "t.json"
    save_trace(trace, path)
    assert load_trace(path).calls == trace.calls


def test_operations_on_columns_equal_those_on_calls(pair):
    on_calls, on_columns = pair
    assert on_columns == on_calls
    assert len(on_columns) == len(on_calls) == 3
    assert on_columns.n_prompts == on_calls.n_prompts == 6
    assert on_columns.tasks == on_calls.tasks == ["mmlu", "graph", "infobench"]
    assert on_columns.task_counts() == on_calls.task_counts() == {"mmlu": 2, "graph": 2, "infobench": 2}
    assert on_columns.arrival_times().tolist() == [0.0, 1.5, 4.0]
    assert on_columns.scaled(3.0) == on_calls.scaled(3.0)
    assert on_columns.scaled(3.0).arrival_times().tolist() == [0.0, 0.5, 4.0 / 3.0]
    assert on_columns.to_frame().equals(on_calls.to_frame())
    frame = on_columns.to_frame()
    assert frame["prompt_tokens"].isna().tolist() == [False, True, True, False, True, False]
    assert frame["max_tokens"].isna().tolist() == [False, True, False, True, True, True]
    assert frame["max_tokens"].dtype == "Int64" and frame["max_tokens"].iloc[2] == 7


def test_renaming_merges_tasks_in_order_of_first_appearance(pair):
    on_calls, on_columns = pair
    renamed = on_columns.renamed({"mmlu": "qa", "infobench": "qa"})
    assert renamed.tasks == ["qa", "graph"]
    assert [p.task for c in renamed.calls for p in c.prompts] == ["qa", "graph", "qa", "graph", "qa", "qa"]
    assert renamed.meta["task_map"] == {"mmlu": "qa", "infobench": "qa"}
    assert renamed.calls[1].prompts[0].text == "hello"
    assert on_columns.renamed({"other": "x"}) is on_columns


def test_a_trace_is_immutable_and_pickles_as_what_it_holds(pair):
    _, on_columns = pair
    with pytest.raises(AttributeError):
        on_columns.meta = {}  # type: ignore[misc]
    copy = pickle.loads(pickle.dumps(on_columns))
    assert "calls" not in copy.__dict__ and copy == on_columns
    with pytest.raises(TypeError):
        Trace()


def test_head_keeps_the_first_calls_and_only_their_tasks_from_calls_or_columns():
    calls = (Call("a", 0.0, (Prompt("mmlu", 5, 7),)), Call("b", 1.0, (Prompt("graph", 3, None), Prompt("mmlu", None, 2))),
             Call("c", 2.0, (Prompt("infobench", 9, 9, "text"),)))
    of_calls = Trace(calls, meta={"format": "x"})
    of_columns = Trace(columns=TraceColumns.of_calls(calls), meta={"format": "x"})
    for trace in (of_calls, of_columns):
        head = trace.head(2)
        assert head.calls == calls[:2] and head.tasks == ["mmlu", "graph"] and head.n_prompts == 3
        assert head.meta == {"format": "x", "first_calls": 2}
        assert trace.head(3) is trace and trace.head(9) is trace and len(trace.head(0)) == 0
    assert of_columns.head(1).columns.task_names == ("mmlu",)


# -- the pass over a block of call lines: compiled, interpreted and by array operations ----

def _block_of(document) -> bytes:
    """The call lines of ``document`` as the writer lays them out (the file's last call last)."""
    text = laid_out({"format": "simctl-trace/1", "meta": {}, "calls": document}, "a call a line")
    body = text[text.index('"calls": [\n') + len('"calls": [\n'):text.rindex("\n  ]")]
    return body.encode() + b"\n"


@st.composite
def call_blocks(draw):
    """A block of call lines as the writer writes them, then perhaps one byte changed,
    inserted or removed (what the pass must refuse or read exactly as JSON reads it)."""
    # (each call's fields in the writer's order: id, time, prompts)
    calls = [{"id": call.get("id", str(i)), "t": call["t"], "prompts": call["prompts"]}
             for i, call in enumerate(draw(valid_calls))]
    lists = draw(st.sampled_from(["drawn", "all the first's", "the first's but one"]))
    if lists != "drawn":  # (a trace of one kind of call: every list the first's, or all but one)
        for call in calls[1:]:
            call["prompts"] = list(calls[0]["prompts"])
        if lists == "the first's but one" and len(calls) > 1:
            calls[draw(st.integers(1, len(calls) - 1))]["prompts"].append("mmlu")
    data = bytearray(_block_of(calls))
    last = draw(st.booleans())
    if not last:  # (a block before the file's last: its last call's line ends in a comma too)
        data[-1:] = b",\n"
    edit = draw(st.sampled_from(["none", "change", "insert", "remove"]))
    at = draw(st.integers(0, len(data) - 1))
    byte = draw(st.sampled_from(b' \t\r\n",:[]{}\\0123456789.eE-+xq\x7f\xc3'))
    if edit == "change":
        data[at] = byte
    elif edit == "insert":
        data.insert(at, byte)
    elif edit == "remove":
        del data[at]
    return bytes(data), last


def _as_json(block: bytes, last: bool) -> list | None:
    """The block's calls as JSON reads them, or ``None`` where it is not a list of them."""
    body = block.rstrip()
    if last == body.endswith(b","):
        return None
    try:
        return json.loads(b"[" + (body if last else body[:-1]) + b"]")
    except ValueError:
        return None


@settings(max_examples=300, deadline=None)
@given(call_blocks())
def test_the_pass_over_call_lines_finds_what_json_reads_or_refuses(drawn):
    from simulator.model.compiled import extension
    from simulator.trace.formats import native
    from simulator.trace.formats.native_scan import scan_call_lines

    block, last = drawn
    buf = np.frombuffer(block, dtype=np.uint8)
    ok, id_start, id_end, times, prompts, offsets, same = scan_call_lines(buf, last)
    module = extension()
    if module is not None:  # the compiled pass is the same function
        compiled = module.scan_call_lines(buf, last)
        assert compiled[0] == ok and compiled[6] == same
        assert all(a.tolist() == b.tolist() for a, b in zip(compiled[1:6], (id_start, id_end, times, prompts, offsets), strict=True))
    by_arrays = native._line_fields_by_arrays(block, last)
    if not ok:
        return
    # the fields: JSON values in the writer's places, the times converted (the reader then
    # decodes each list, refusing the block where one is not valid)
    # (where every line's list is the first's, only the first is given)
    assert len(prompts) == (offsets[1] if same else offsets[-1])
    pieces = [prompts[offsets[0 if same else i]:offsets[1 if same else i + 1]].tobytes() for i in range(len(id_start))]
    try:
        decoded = [json.loads(piece) for piece in pieces]
    except ValueError:
        return
    calls = _as_json(block, last)
    assert calls is not None and len(calls) == len(id_start) == len(offsets) - 1
    assert [block[a:b].decode() for a, b in zip(id_start, id_end, strict=True)] == [c["id"] for c in calls]
    assert times.dtype == np.float64 and times.tolist() == [float(c["t"]) for c in calls]
    assert decoded == [c["prompts"] for c in calls]
    assert same == all(piece == pieces[0] for piece in pieces)
    if by_arrays is not None:  # (it may refuse more: it reads a field 8 bytes at a time)
        a_start, a_end, a_times, a_prompts, a_offsets, _ = by_arrays
        assert (a_start.tolist(), a_end.tolist(), a_times.tolist(), a_prompts.tobytes(),
                a_offsets.tolist()) == (id_start.tolist(), id_end.tolist(), times.tolist(), b"".join(pieces),
                                        offsets.tolist())


def _time_line(i: int, t: str) -> str:
    return f'    {{"id": "{i}", "t": {t}, "prompts": [{{"task": "mmlu"}}]}},\n'


#: Times as JSON writes them: shortest round-trip forms of doubles of every magnitude, and
#: decimal strings of up to 19 digits with exponents (ties and near-ties among them).
json_times = st.one_of(
    st.floats(min_value=0, allow_nan=False, allow_infinity=False).map(repr),
    st.floats(min_value=0, max_value=1e7).map(repr),
    st.builds(lambda digits, point, exponent: (digits[:point] or "0") + ("." + digits[point:] if digits[point:] else "")
              + ("" if exponent is None else f"e{exponent:+d}"),
              st.from_regex(r"[1-9][0-9]{0,18}", fullmatch=True), st.integers(1, 19),
              st.one_of(st.none(), st.integers(-330, 320))),
    st.sampled_from(["0", "-0", "0.0", "0e5", "1E+2", "9007199254740993", "9007199254740995", "2.5e-1",
                     "1.7976931348623157e308", "2.2250738585072014e-308", "4.9e-324", "1e309", "12345678901234567890"]),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(json_times, min_size=1, max_size=8))
def test_the_pass_over_call_lines_converts_times_as_python_does(times):
    """Each time the pass converts is the double nearest its decimal value (Python's float(),
    correctly rounded, ties to even); one it cannot decide leaves the block to msgspec."""
    from simulator.model.compiled import extension
    from simulator.trace.formats.native_scan import scan_call_lines

    block = "".join(_time_line(i, t) for i, t in enumerate(times)).encode()
    buf = np.frombuffer(block, dtype=np.uint8)
    passes = [scan_call_lines(buf, False)]
    module = extension()
    if module is not None:  # (the compiled pass is the same function)
        passes.append(module.scan_call_lines(buf, False))
    expected = [float(t) for t in times]
    for ok, _, _, converted, *_ in passes:
        assert ok == passes[0][0]
        if ok:
            assert [(x, np.signbit(x)) for x in converted.tolist()] == [(x, np.signbit(x)) for x in expected]
    # the writer's times, doubles' shortest forms, are all converted here where they are zero or normal
    if all(t == repr(float(t)) and (float(t) == 0 or float(t) >= 2.2250738585072014e-308) for t in times):
        assert passes[0][0]


def test_a_large_trace_gives_its_freed_heap_memory_back_after_loading(tmp_path, monkeypatch):
    from simulator import heap
    from simulator.trace import formats

    calls = []
    monkeypatch.setattr(heap, "give_back_freed_memory", lambda: calls.append(1))
    trace = Trace(tuple(Call(str(i), float(i), (Prompt("mmlu"),)) for i in range(40)))
    path = tmp_path / "t.json"
    save_trace(trace, path)
    monkeypatch.setattr(heap, "TRIM_FROM_PROMPTS", 41)
    assert formats.load_trace(path).calls == trace.calls and calls == []  # a small trace: no trim
    monkeypatch.setattr(heap, "TRIM_FROM_PROMPTS", 40)
    assert formats.load_trace(path).calls == trace.calls and calls == [1]
    monkeypatch.undo()
    heap.give_back_freed_memory()  # (glibc's malloc_trim, or nothing: it returns)


@pytest.mark.parametrize(("prompts_per_call", "one"), [((), True), ((1,), True), ((1, 1, 1), True),
                                                       ((1, 2, 1), False), ((3,), False)])
def test_one_prompt_a_call_is_told_from_the_columns(prompts_per_call, one):
    trace = Trace(calls=[Call(id=f"c{i}", t=float(i), prompts=[Prompt(task="a") for _ in range(k)])
                         for i, k in enumerate(prompts_per_call)])
    assert trace.columns.one_prompt_a_call() is one
