"""The reading layer (:mod:`simulator.inputs`): no reader bypasses it, and each class of
unreadable file it stops is one ``error:`` line (each case once a hang or a traceback)."""

from __future__ import annotations

import ast
import hashlib
import json
import math
import os
from pathlib import Path

import pytest
from helpers import assert_one_line_error
from typer.testing import CliRunner

from simulator import inputs
from simulator.cli import app
from simulator.errors import SweepError, TraceError

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "simulator"
TRACE = ROOT / "traces" / "batch_arrivals.json"
runner = CliRunner()

#: Calls that open or read a file. Parsing text already read (``json.loads``) is not one.
READING_CALLS = {"open", "read_text", "read_bytes", "load", "reader", "DictReader", "read_csv", "read_parquet",
                 "read_table", "read_json", "read_feather", "read_excel", "loadtxt", "genfromtxt", "fromfile",
                 "ParquetFile", "memmap", "mmap"}
#: What may call them outside inputs.py and outputs.py, and why: (file, callee) -> reason.
ALLOWED = {
    # A maintainer's script that turns NVIDIA's published tables into the package's data.
    ("simulator/hardware/extract.py", "read_parquet"): "maintainer script, not a user file",
    ("simulator/hardware/extract.py", "read_text"): "maintainer script, not a user file",
    # The data shipped inside the package (simulator/hardware/data).
    ("simulator/hardware/tables.py", "read_text"): "package data",
    ("simulator/hardware/tables.py", "read_parquet"): "package data",
    # Reads the packaged numba cache's stamp (kernel_cache), hashes simctl's own source files
    # to key the compiled kernel (kernel_sources) and reads the extension's stamp (compiled).
    ("simulator/model/kernel_cache.py", "read_bytes"): "simctl's own compiled-kernel stamp",
    ("simulator/model/kernel_sources.py", "read_bytes"): "the package's own source",
    ("simulator/model/compiled.py", "read_text"): "simctl's own compiled-kernel stamp",
    # An LLVM IR builder's load instruction (the extension's reference counts), not a file.
    ("simulator/model/extension.py", "load"): "llvmlite's IR builder, no file",
    # The stamp the precompile wrote beside the compiled kernel it packages.
    ("simulator/model/precompile.py", "read_text"): "simctl's own compiled-kernel stamp",
    # The sweep journal is simctl's own output, appended to (and its last byte checked).
    ("simulator/sweep.py", "open"): "simctl's own journal, written by it",
    # csv.reader over a handle that inputs.open_text opened.
    ("simulator/trace/formats/_requests.py", "reader"): "reads an inputs.open_text handle",
}
#: Receivers whose calls are the reading layer itself (``inputs.read_csv``...).
LAYER = {"inputs", "reading"}


def _reading_calls() -> set[tuple[str, str]]:
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("simulator/inputs.py", "simulator/outputs.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            receiver = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else None
            if name not in READING_CALLS or receiver in LAYER:
                continue
            if name == "read_json" and receiver is None:
                continue  # the trace formats' own helper over inputs.read_bytes (formats/_common.py)
            found.add((rel, name))
    return found


def test_no_reader_bypasses_the_reading_layer():
    """Every file the user names is opened by simulator.inputs; a new format that opens its
    file itself fails here (route it through inputs, or allow it above with the reason)."""
    found = _reading_calls()
    assert found - ALLOWED.keys() == set(), "read a user file through simulator.inputs"
    assert ALLOWED.keys() - found == set(), "an allowance that no longer applies: remove it"


# -- each class the layer stops ------------------------------------------------------------

def _links(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "dangling.json").symlink_to(tmp_path / "nowhere.json")
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    os.mkfifo(tmp_path / "fifo.json")
    return {"dangling": tmp_path / "dangling.json", "loop": tmp_path / "loop1", "fifo": tmp_path / "fifo.json"}


@pytest.mark.parametrize("kind, needle", [("dangling", "symbolic link to a missing file"),
                                          ("loop", "symbolic link loop"), ("fifo", "not a regular file"),
                                          ("device", "not a regular file")])
@pytest.mark.parametrize("command", [["replay", "{f}"], ["import", "azure", "{f}", "-o", "{out}"],
                                     ["replay", str(TRACE), "--profile", "{f}"],
                                     ["replay", str(TRACE), "--config", "{f}"], ["compare", "{f}"],
                                     ["observed", "{f}"]])
def test_links_pipes_and_devices_are_refused_by_name(tmp_path, kind, needle, command):
    """A FIFO or /dev/zero once blocked or read forever; a dangling link said 'no such file'."""
    target = str(Path("/dev/zero") if kind == "device" else _links(tmp_path)[kind])
    args = [a.replace("{f}", target).replace("{out}", str(tmp_path / "o.json")) for a in command]
    result = runner.invoke(app, args)
    if command[0] == "observed":  # a run is a folder (or a tool's result file): anything else is "not a folder"
        assert_one_line_error(result, target)
        return
    assert_one_line_error(result, target, needle)


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(inputs, "MAX_INPUT_BYTES", 100)
    assert_one_line_error(runner.invoke(app, ["replay", str(TRACE)]), str(TRACE), "the largest file simctl reads")


@pytest.mark.parametrize("name, content, command, needles", [
    ("t.json", '{"calls": [{"t": ' + "9" * 5000 + ', "prompts": ["mmlu"]}]}', ["replay", "{f}"],
     ["t.json", "4300 digits"]),
    ("p.json", '{"tasks": {"a": {"service": {"kind": "distribution", "dist": "deterministic", "mean": '
     + "9" * 5000 + "}}}}", ["replay", str(TRACE), "--profile", "{f}"], ["p.json", "4300 digits"]),
    ("m.jsonl", '{"timestamp": 0, "input_length": ' + "9" * 5000 + ', "output_length": 5}\n',
     ["import", "mooncake", "{f}", "-o", "{out}"], ["m.jsonl", "line 1", "4300 digits"]),
    ("p.json", '{"tasks": ' + "[" * 500 + "]" * 500 + "}", ["replay", str(TRACE), "--profile", "{f}"],
     ["p.json", "nested more than 64 levels"]),
    ("s.toml", "a = " + "[" * 200 + "]" * 200 + "\n", ["replay", str(TRACE), "--config", "{f}"],
     ["s.toml", "nested more than 64 levels"]),
    ("r.json", '{"request_throughput": 1, "backend": "x", "ttfts": [' + "[" * 100 + "]" * 100 + "]}",
     ["observed", "{f}"], ["r.json", "nested more than 64 levels"]),
])
def test_numbers_and_nesting_past_what_the_parser_holds(tmp_path, name, content, command, needles):
    """Integers of over 4300 digits were a ValueError traceback in the trace, the profile
    and the Mooncake reader's format check; over-deep documents reach no recursive code."""
    path = tmp_path / name
    path.write_text(content)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    args = [a.replace("{f}", str(path)).replace("{out}", str(tmp_path / "o.json")) for a in command]
    assert_one_line_error(runner.invoke(app, args), *needles)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert not (tmp_path / "o.json").exists()


def test_finite_is_the_one_check_of_a_number_read_from_a_file():
    assert inputs.finite(3) is None and inputs.finite(0.5, 0, 1) is None
    assert "finite" in inputs.finite(math.nan) and "finite" in inputs.finite(-math.inf)
    assert "64 bits" in inputs.finite(2**63, integer=True) and "64 bits" in inputs.finite(10**400)
    assert "whole" in inputs.finite(1.5, integer=True) and "number" in inputs.finite(True)
    assert "in [0, 1]" in inputs.finite(2.0, 0, 1) and "number" in inputs.finite("3")


def test_depth_measures_any_nesting_without_recursion():
    deep: list = []
    node = deep
    for _ in range(100_000):
        node.append([])
        node = node[0]
    assert inputs.depth(deep, limit=10) == 11 and inputs.depth({"a": [1, {"b": 2}]}) == 3
    with pytest.raises(TraceError, match="nested more than 10"):
        inputs.check_depth(deep, "x.json", TraceError, 10)


def test_calibrate_start_profile_is_read_through_the_layer(tmp_path):
    """A start profile that is not a JSON object was an AttributeError traceback."""
    start = tmp_path / "start.json"
    start.write_text("[1, 2]")
    result = runner.invoke(app, ["calibrate", str(tmp_path), "--scenario", str(ROOT / "scenarios" / "design-notes.toml"),
                                 "--start", str(start), "-o", str(tmp_path / "fit.json")])
    assert_one_line_error(result, "start.json", "a profile is a JSON object")
    assert not (tmp_path / "fit.json").exists()


# -- the sweep journal: a torn line costs that row alone ---------------------------------------

def test_a_torn_journal_line_costs_that_row_alone_and_the_next_append_stands_alone(tmp_path):
    from simulator.sweep import ResultStore

    meta = {"hashes": {"trace": "t", "profile": "p", "scenario": "s"}, "axes": ["flush"], "task": None}
    out = tmp_path / "r.parquet"
    journal = tmp_path / "r.parquet.journal"
    row = {"config_key": "a", "seed": 0, "x": 1.0}
    journal.write_text(json.dumps(meta) + "\n" + json.dumps(row) + "\n" + '{"config_key": "b", "se')
    store = ResultStore(out, meta)
    assert store.done() == {("a", 0)}
    store.add({"config_key": "c", "seed": 0, "x": 2.0})
    store._handle.close()  # noqa: SLF001 - as close() would, without writing the Parquet file
    # Once, the row after the torn fragment was glued to it and lost on the next resume.
    assert ResultStore(out, meta).done() == {("a", 0), ("c", 0)}
    # A header cut short (killed before any run finished) is a fresh start, not an error.
    journal.write_text('{"hashes": {"tra')
    assert ResultStore(out, meta).done() == set()
    # ... and the rows the fresh start saves are read back after it
    fresh = ResultStore(out, meta)
    fresh.add({"config_key": "d", "seed": 0, "x": 3.0})
    fresh._handle.close()  # noqa: SLF001
    assert ResultStore(out, meta).done() == {("d", 0)}
    journal.write_text('{"hashes": {"tra\n' + json.dumps(row) + "\n")
    with pytest.raises(SweepError, match="line 1"):
        ResultStore(out, meta)


def test_a_journal_names_each_key_order_once_and_a_torn_line_costs_its_own_rows_alone(tmp_path):
    # Rows are saved as their values after a line of their keys, once per key order; a key
    # line or row line cut short costs what it held, and the next process numbers its key
    # lines after the whole ones it read.
    from simulator.sweep import ResultStore

    meta = {"hashes": {"trace": "t", "profile": "p", "scenario": "s"}, "axes": ["flush"], "task": None}
    out = tmp_path / "r.parquet"
    journal = tmp_path / "r.parquet.journal"
    store = ResultStore(out, meta)
    store.add_many([{"config_key": "a", "seed": 0, "x": 1.0}, {"config_key": "b", "seed": 0, "x": 2.0},
                    {"config_key": "c", "seed": 0, "y": "z"}])
    store.add({"config_key": "d", "seed": 1, "x": 4.0})
    store._handle.close()  # noqa: SLF001
    lines = journal.read_text().splitlines()
    assert lines[1:] == ['{"keys": ["config_key", "seed", "x"]}', '[0,"a",0,1.0]', '[0,"b",0,2.0]',
                         '{"keys": ["config_key", "seed", "y"]}', '[1,"c",0,"z"]', '[0,"d",1,4.0]']
    back = ResultStore(out, meta)
    assert back.rows == [{"config_key": "a", "seed": 0, "x": 1.0}, {"config_key": "b", "seed": 0, "x": 2.0},
                         {"config_key": "c", "seed": 0, "y": "z"}, {"config_key": "d", "seed": 1, "x": 4.0}]
    # a key line cut short: the rows naming it are redone, the others kept; the next key line
    # written is numbered after the whole ones
    journal.write_text("\n".join([lines[0], lines[1], lines[2], '{"keys": ["config_key", "se']) + "\n"
                       + "[1,\"e\",0,5.0]\n" + lines[2].replace('"a"', '"f"'))
    torn = ResultStore(out, meta)
    assert torn.done() == {("a", 0), ("f", 0)}
    torn.add({"config_key": "g", "seed": 0, "w": True})
    torn.add({"config_key": "h", "seed": 0, "x": 8.0})
    torn._handle.close()  # noqa: SLF001
    assert ResultStore(out, meta).done() == {("a", 0), ("f", 0), ("g", 0), ("h", 0)}
    # a row line naming a key line it does not match, or none, holds no row
    journal.write_text("\n".join([lines[0], lines[1], '[0,"a",0]', '[7,"b",0,1.0]', '[-1,"c",0,1.0]',
                                  '["x","d",0,1.0]', '[0,"e",0,1.0]']) + "\n")
    assert ResultStore(out, meta).done() == {("e", 0)}
