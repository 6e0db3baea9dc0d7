"""Hostile cases at the edges of what simctl reads: names and sizes.

Two classes (``benchmarks/hostile_inputs.py`` reports them; ``tests/test_input_edges.py``
runs each with a few cases):

* **scenario name typos and control characters** — a scenario table ``[tasks.NAME]`` (or
  ``--set tasks.NAME.flush=...``) whose NAME is one edit away from a task of the run
  (``mmluu``, ``mlu``, ``mmul``) must be refused in one line naming the table and the task
  meant; a task the profile serves but the trace has no prompt of only warned about (exit
  0, a ``warning:`` line naming it); a control character (newline, tab, NUL, escape, DEL) in
  a task, class, group or profile name, in the scenario, the trace or the profile, refused
  in one line naming where.
* **huge and non-format files** — sparse files of NUL bytes up to 512 MiB, binary heads,
  text that is not the format, and numbers past a float (integers of hundreds of digits),
  NaN and infinities in a profile or a trace, given where a trace, profile or scenario is
  read: one line naming the file (and, for a number, the record and the field), no
  traceback, and never the whole of a file of zeros read.

A case is handled when the command ends as promised: exit 2 and exactly one ``error:`` line
on stderr holding every expected needle (or exit 0 and the promised ``warning:``), no
traceback, no exception other than ``SystemExit``.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
TASKS = ("graph", "mmlu", "infobench")
#: Control characters a name may be given (C0, DEL and C1).
CONTROLS = ("\n", "\r", "\t", "\x00", "\x1b", "\x7f", "\x85", "\x07")
runner = CliRunner()


def _app():
    from simulator.cli import app

    return app


def outcome(args: list[str], needles: tuple[str, ...] = (), warning: str | None = None) -> str | None:
    """Why ``simctl ARGS`` broke the promise (None: handled). With ``warning`` the command
    must succeed and print a ``warning:`` line holding it; otherwise it must exit 2 with one
    ``error:`` line holding every needle."""
    result = runner.invoke(_app(), args)
    shown = f"simctl {' '.join(map(repr, args))}: exit {result.exit_code}\n{result.output}"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        return f"{type(result.exception).__name__}: {result.exception}\n{shown}"
    if "Traceback" in result.output:
        return f"traceback\n{shown}"
    if warning is not None:
        warned = [line for line in result.stderr.splitlines() if line.startswith("warning: ") and warning in line]
        return None if result.exit_code == 0 and warned else f"no warning naming {warning!r}\n{shown}"
    lines = result.stderr.strip().splitlines()
    if result.exit_code != 2 or len(lines) != 1 or not lines[0].startswith("error: "):
        return f"not exit 2 with one error line\n{shown}"
    missing = [n for n in needles if n not in lines[0]]
    return f"the error does not name {missing}\n{shown}" if missing else None


def typo(rng: random.Random, name: str) -> str:
    """``name`` one edit away (a letter inserted, dropped, changed or two swapped), never a
    task of the run."""
    while True:
        i = rng.randrange(len(name))
        kind = rng.randrange(4)
        letter = rng.choice("abcdefghijklmnopqrstuvwxyz")
        if kind == 0:
            out = name[:i] + letter + name[i:]
        elif kind == 1 and len(name) > 3:
            out = name[:i] + name[i + 1:]
        elif kind == 2:
            out = name[:i] + letter + name[i + 1:]
        elif i + 1 < len(name):
            out = name[:i] + name[i + 1] + name[i] + name[i + 2:]
        else:
            continue
        if out not in TASKS:
            return out


def _toml_key(name: str) -> str:
    """``name`` as a TOML quoted key (control characters escaped as TOML wants them)."""
    return '"' + "".join(c if c.isprintable() and c not in '"\\' else f"\\u{ord(c):04x}" for c in name) + '"'


def _folder() -> Path:
    return Path(tempfile.mkdtemp(prefix="simctl-edges-"))


def _small_trace(folder: Path, tasks: tuple[str, ...] = TASKS) -> Path:
    path = folder / "trace.json"
    calls = [{"id": str(i), "t": float(i), "prompts": [tasks[i % len(tasks)]]} for i in range(6)]
    path.write_text(json.dumps(calls))
    return path


def names_cases(examples: int, seed: int = 7) -> tuple[int, int, list[str]]:
    """``(tried, handled, failures)`` over ``examples`` cases of scenario task-name typos,
    tasks only the profile knows, and control characters in names."""
    rng = random.Random(seed)
    folder = _folder()
    tried = handled = 0
    failures: list[str] = []
    try:
        trace = _small_trace(folder)
        infobench_only = folder / "infobench.json"
        infobench_only.write_text(json.dumps([{"t": 0, "prompts": ["infobench"]}, {"t": 1, "prompts": ["infobench"]}]))
        profile = json.loads((ROOT / "profiles" / "seed-calibrated.json").read_text())
        for n in range(examples):
            kind = n % 6
            scenario = folder / f"s{n}.toml"
            control = rng.choice(CONTROLS)
            meant = rng.choice(TASKS)
            if kind == 0:  # a typo in a scenario table
                name = typo(rng, meant)
                scenario.write_text(f"[tasks.{_toml_key(name)}]\nflush = 0.1\n")
                case = (["replay", str(trace), "-c", str(scenario)], (scenario.name, f"tasks.{name}", f"'{meant}'"), None)
            elif kind == 1:  # a typo through --set, in a sweep
                name = typo(rng, meant)
                case = (["sweep", str(trace), "--flush", "0,1", "-j", "1", "-o", str(folder / f"r{n}.parquet"),
                         "--set", f"tasks.{name}.flush=0.2"], (f"tasks.{name}", f"'{meant}'"), None)
            elif kind == 2:  # a task the profile serves, missing from the trace: a warning
                other = rng.choice([t for t in TASKS if t != "infobench"])
                scenario.write_text(f"[tasks.{other}]\nflush = 0.1\n")
                case = (["replay", str(infobench_only), "-c", str(scenario)], (), f"tasks.{other}")
            elif kind == 3:  # a control character in a scenario's task, class or group name
                at = rng.randrange(len(meant) + 1)
                bad = meant[:at] + control + meant[at:]
                where = rng.randrange(4)
                text, needle = [
                    (f"[tasks.{_toml_key(bad)}]\nflush = 0.1\n", "tasks."),
                    (f"name = {_toml_key(bad)}\n", "field 'name'"),
                    (f"[compositions]\n{_toml_key(bad)} = {{any = [\"mmlu\"]}}\n", "compositions."),
                    (f"[tasks.mmlu]\ndispatch_group = {_toml_key(bad)}\n", "field 'dispatch_group'"),
                ][where]
                scenario.write_text(text)
                case = (["replay", str(trace), "-c", str(scenario)], (scenario.name, needle, "control character"), None)
            elif kind == 4:  # a control character in a trace's task name
                at = rng.randrange(len(meant) + 1)
                bad_trace = folder / f"t{n}.json"
                bad_trace.write_text(json.dumps([{"t": 0, "prompts": ["mmlu"]},
                                                 {"t": 1, "prompts": [meant[:at] + control + meant[at:]]}]))
                case = (["validate", str(bad_trace)], (bad_trace.name, "record 1", "prompts[0]", "control character"),
                        None)
            else:  # a control character in a profile's task name
                at = rng.randrange(len(meant) + 1)
                bad_profile = folder / f"p{n}.json"
                doc = json.loads(json.dumps(profile))
                doc["tasks"][meant[:at] + control + meant[at:]] = doc["tasks"].pop(meant)
                bad_profile.write_text(json.dumps(doc))
                case = (["replay", str(trace), "-p", str(bad_profile)], (bad_profile.name, "control character"), None)
            tried += 1
            why = outcome(*case)
            if why is None:
                handled += 1
            else:
                failures.append(why)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return tried, handled, failures


#: Where a hostile file is given: a command line with ``{f}`` for the file, and what the
#: file is read as.
PLACES = {
    "trace": (["validate", "{f}"]),
    "trace to replay": (["replay", "{f}"]),
    "profile": (["replay", "{trace}", "-p", "{f}"]),
    "scenario": (["replay", "{trace}", "-c", "{f}"]),
    "azure import": (["import", "azure", "{f}", "-o", "{out}"]),
    "mooncake import": (["import", "mooncake", "{f}", "-o", "{out}"]),
}


def _head(rng: random.Random) -> bytes:
    """The first bytes of a file that is no format simctl reads."""
    kind = rng.randrange(4)
    if kind == 0:
        return b""  # zeros from the start
    if kind == 1:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))) + b"\0"
    if kind == 2:
        return bytes(rng.randrange(0x80, 0x100) for _ in range(rng.randrange(1, 64)))  # not UTF-8
    words = ["hello", "ELF", "PK", "%PDF-1.7", "<html>", "GIF89a", "#!/bin/sh", "x=1"]
    return rng.choice(words).encode() + b"\n"


def _leaves(doc: object, path: tuple = ()) -> list[tuple]:
    """Paths of the numbers in ``doc``."""
    if isinstance(doc, dict):
        return [p for k, v in doc.items() for p in _leaves(v, (*path, k))]
    if isinstance(doc, list):
        return [p for i, v in enumerate(doc) for p in _leaves(v, (*path, i))]
    return [path] if isinstance(doc, (int, float)) and not isinstance(doc, bool) else []


def _replaced(doc: object, path: tuple, value: object) -> object:
    doc = json.loads(json.dumps(doc))
    node = doc
    for key in path[:-1]:
        node = node[key]  # type: ignore[index]
    node[path[-1]] = value  # type: ignore[index]
    return doc


def sizes_cases(examples: int, seed: int = 11) -> tuple[int, int, list[str]]:
    """``(tried, handled, failures)`` over ``examples`` cases of sparse NUL files, binary
    and non-format heads followed by a sparse tail, and numbers past what a field holds."""
    rng = random.Random(seed)
    folder = _folder()
    tried = handled = 0
    failures: list[str] = []
    try:
        trace = _small_trace(folder)
        profile = json.loads((ROOT / "profiles" / "seed-calibrated.json").read_text())
        profile_numbers = [p for p in _leaves(profile) if p[0] == "tasks"]
        for n in range(examples):
            kind = n % 3
            path = folder / f"h{n}.bin"
            out = folder / f"o{n}.json"
            if kind < 2:  # a file of zeros, or a non-format head before a sparse tail of zeros
                head = b"" if kind == 0 else _head(rng)
                with open(path, "wb") as fh:
                    fh.write(head)
                    fh.truncate(len(head) + rng.choice([1 << 20, 64 << 20, 512 << 20]))
                place = rng.choice(list(PLACES))
                args = [a.format(f=path, trace=trace, out=out) for a in PLACES[place]]
                needles: tuple[str, ...] = (path.name,)
            else:  # a number no field can hold, in a profile or a trace
                value = rng.choice([10**400, -(10**400), "NaN", "Infinity", "-Infinity", "1e999"])
                text = value if isinstance(value, str) else str(value)
                if rng.random() < 0.5:
                    where = rng.choice(profile_numbers)
                    doc = json.dumps(_replaced(profile, where, "@@"))
                    path = path.with_suffix(".json")
                    path.write_text(doc.replace('"@@"', text))
                    args = ["replay", str(trace), "-p", str(path)]
                    needles = (path.name, f"task '{where[1]}'")
                else:
                    record = rng.randrange(6)
                    field = rng.choice(["t", "prompt_tokens", "max_tokens"])
                    calls = [{"id": str(i), "t": float(i), "prompts": [{"task": "mmlu", "prompt_tokens": 10,
                                                                         "max_tokens": 5}]} for i in range(6)]
                    if field == "t":
                        calls[record]["t"] = "@@"  # type: ignore[assignment]
                    else:
                        calls[record]["prompts"][0][field] = "@@"  # type: ignore[index]
                    path = path.with_suffix(".json")
                    path.write_text(json.dumps(calls).replace('"@@"', text))
                    args = ["validate", str(path)]
                    needles = (path.name, f"record {record}", field)
            tried += 1
            why = outcome(args, needles)
            if why is None:
                handled += 1
            else:
                failures.append(why)
            path.unlink(missing_ok=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return tried, handled, failures


def _counted(cases: Callable[[int], tuple[int, int, list[str]]]) -> Callable[[int], tuple[int, int]]:
    def attempt(examples: int) -> tuple[int, int]:
        tried, handled, _ = cases(examples)
        return tried, handled

    return attempt


CLASSES: dict[str, Callable[[int], tuple[int, int]]] = {
    "scenario name typos and control characters": _counted(names_cases),
    "huge and non-format files": _counted(sizes_cases),
}
