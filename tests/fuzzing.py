"""Hostile-input fuzzing: the contract every case is held to, the files it starts from, and
the hostile values it draws, shared by ``tests/test_fuzz_inputs.py`` and
``benchmarks/hostile_inputs.py`` (which reports the tally per class).

The contract, for any command line and any file content (README, "Errors"):

* the command ends with exit status 0 (the input happened to be valid: then every file it
  wrote is readable) or 2 (``plan`` may also answer 1: no configuration met the SLOs);
* exit 2 prints exactly one line on stderr, starting ``error: ``, naming the file when the
  input was a file; no traceback, no exception other than ``SystemExit``;
* every input file is byte-identical afterwards;
* no partial output: no ``.part`` file left, and an exit 2 writes no result file.

Commands run in-process through typer's ``CliRunner``. ``serve`` and ``load`` are left out
(they wait on a network); ``profile`` is left out (it measures on a device).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT.parent / "shared" / "traces" / "real"


runner = CliRunner()

#: class -> [cases tried, cases handled]; read by the benchmark's report.
TALLY: dict[str, list[int]] = defaultdict(lambda: [0, 0])
#: Commands the fuzz never runs, and why.
SKIPPED_COMMANDS = {"serve": "serves HTTP until stopped", "load": "sends to a live endpoint",
                    "profile": "measures on a device"}

#: Values hostile to any option, whatever it parses.
HOSTILE_VALUES = ("", " ", "-1", "0", "nan", "inf", "-inf", "1e400", "-1e400", "9" * 30, "2**63",
                  "9223372036854775808", "x", ",", "1,,2", "a,b", "=", "0x10", "1_000", "\u00e9", "1e-320",
                  "-0", "1;2", "../../", "\\")
#: Hostile JSON values put in place of one field of a valid document.
HOSTILE_JSON = (None, True, False, 0, -1, -0.5, 1e308, 2**63, 2**64, -(2**63) - 1, 10**400, "", "x", "NaN",
                "1e400", "2023-01-01T00:00:00Z", "0001-01-01T00:00:00+05:00", [], [[]], {}, {"a": {}},
                math.nan, math.inf, -math.inf, "\x00", "\udcff" * 0 + "\u202e")
#: Hostile CSV cells.
HOSTILE_CELLS = ("", "-1", "nan", "NaN", "inf", "-inf", "1e30", "1e400", "9" * 25, "x", "0.5",
                 "2023-11-16 18:15:46.6805900", "0001-01-01 00:00:00", "2023-11-16T18:15:46+05:00",
                 "9999-12-31 23:59:59", '"', "a,b", "\u00e9", "\xff")


@functools.lru_cache(maxsize=1)
def workspace() -> dict[str, Path]:
    """The valid inputs every case starts from, made once per process in a temporary folder."""
    from simulator.events import write_event_log
    from simulator.profile import load_profile
    from simulator.replay import replay
    from simulator.scenario import build_scenario
    from simulator.trace.formats import load_trace, save_trace
    from simulator.trace.model import Trace

    d = Path(tempfile.mkdtemp(prefix="simctl-fuzz-"))
    full = load_trace(ROOT / "traces" / "batch_arrivals.json")
    trace = d / "trace.json"
    save_trace(Trace(calls=full.calls[:12], meta=full.meta, source=full.source), trace)
    scenario = d / "scenario.toml"
    scenario.write_bytes((ROOT / "scenarios" / "design-notes.toml").read_bytes())
    profile = d / "profile.json"
    profile.write_bytes((ROOT / "profiles" / "seed-calibrated.json").read_bytes())
    result = replay(load_trace(trace), build_scenario(path=scenario), load_profile(profile), seed=0)
    write_event_log(result.log, d / "events.parquet")
    write_event_log(result.log, d / "events.csv")
    out = runner.invoke(_app(), ["sweep", str(trace), "--flush", "0,1", "--max-batch", "4,8", "--topology", "shared,split", "-j", "1",
                                 "-o", str(d / "sweep.parquet")])
    assert out.exit_code == 0, out.output
    out = runner.invoke(_app(), ["sweep", str(trace), "--rate-scale", "1,2", "-j", "1", "-o", str(d / "load.parquet")])
    assert out.exit_code == 0, out.output
    (d / "azure.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                 "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n")
    (d / "burstgpt.csv").write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                                    "5,ChatGPT,472,18,490,Conversation log\n45,GPT-4,1087,230,1317,Conversation log\n")
    (d / "mooncake.jsonl").write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n'
                                      '{"timestamp": 40, "input_length": 20, "output_length": 7, "hash_ids": [2]}\n')
    (d / "servegen.csv").write_text("0,2,1,Gamma,1.0,0.5\n10,3,1.5,Weibull,0.8,4\n")
    (d / "servegen.json").write_text(json.dumps({"0": {"input_tokens": "{10: 0.5, 20: 0.5}",
                                                       "output_tokens": "{5: 1.0}"}}))
    os.mkfifo(d / "fifo")
    (d / "dangling.json").symlink_to(d / "nowhere")
    (d / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (d / "out").mkdir()
    return {p.stem if p.suffix != ".csv" else p.stem + "_csv": p for p in d.iterdir()} | {
        "folder": d / "out", "missing": d / "missing.json", "root": d, "events_csv": d / "events.csv"}


def _app():
    from simulator.cli import app

    return app


def digest(paths: Iterable[Path]) -> dict[Path, bytes]:
    """Each regular file's bytes: kept whole and compared, cheaper than hashing them (the
    workspace's files are under a megabyte together)."""
    return {p: p.read_bytes() for p in paths if p.is_file() and not p.is_symlink()}


def _listing(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()} if folder.is_dir() else set()


def _valid_output(path: Path) -> str | None:
    """Why the file a successful command wrote is not readable, or ``None``."""
    if path.suffix == ".part" or path.name.endswith(".journal"):
        return None
    if path.is_dir():  # a folder of figures
        return next((why for p in path.iterdir() if (why := _valid_output(p))), None)
    data = path.read_bytes()
    if not data:
        return "empty output file"
    if path.suffix == ".json":
        try:
            json.loads(data)
        except ValueError as exc:
            return f"output is not JSON ({exc})"
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq

        pq.read_table(path)
    elif path.suffix == ".png" and not data.startswith(b"\x89PNG"):
        return "output is not a PNG"
    return None


def check(klass: str, args: Sequence[str], inputs: Iterable[Path] = (), out: Path | None = None) -> None:
    """Run ``simctl ARGS`` and hold it to the contract (module docstring), counting the case
    under ``klass`` in :data:`TALLY`; :class:`AssertionError` saying what broke it."""
    files = workspace()
    out = out or files["folder"]
    watched = [*inputs, *(p for k, p in files.items() if k not in ("root", "folder", "fifo"))]
    before, listed = digest(watched), _listing(out)
    TALLY[klass][0] += 1
    # Run inside the case folder: an option given a relative name ("x", " ", ".") writes
    # there, where the checks below see it, never into the folder the fuzz was started in.
    with contextlib.chdir(out):
        result = runner.invoke(_app(), list(args))
    shown = f"[{klass}] simctl {' '.join(map(str, args))}\n{result.output}"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        result.exception.add_note(shown)
        raise result.exception
    allowed = (0, 1, 2) if args and args[0] == "plan" else (0, 2)
    assert result.exit_code in allowed, f"exit {result.exit_code}\n{shown}"
    assert "Traceback" not in result.output, shown
    if result.exit_code == 2:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), f"not one error line\n{shown}"
    # an input that existed is unchanged; a file written at a name that did not exist (an
    # output option given the "missing" path) modified nothing
    after = digest(watched)
    assert all(after.get(p) == h for p, h in before.items()), f"modified an input file\n{shown}"
    made = _listing(out) - listed
    assert not [m for m in made if m.endswith(".part")], f"left a .part file\n{shown}"
    if result.exit_code == 2:
        assert not [m for m in made if not m.endswith(".journal")], f"exit 2 wrote {made}\n{shown}"
    else:
        for name in made:
            why = _valid_output(out / name)
            assert why is None, f"{why}\n{shown}"
    for name in made:  # each case starts from the same folder
        _remove(out / name)
    TALLY[klass][1] += 1


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def hostile_file(name: str, content: bytes) -> Path:
    """``content`` written to a fresh file called ``name`` in the workspace's case folder."""
    folder = workspace()["root"] / "cases"
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_bytes(content)
    return path


def mutate(data: bytes, ops: Sequence[tuple[int, int, int]]) -> bytes:
    """``data`` with each ``(kind, position, byte)`` applied: 0 flip a byte, 1 insert one,
    2 delete one, 3 truncate there, 4 duplicate a slice from there."""
    buf = bytearray(data)
    for kind, pos, byte in ops:
        if not buf:
            break
        i = pos % len(buf)
        if kind == 0:
            buf[i] ^= byte or 1
        elif kind == 1:
            buf.insert(i, byte)
        elif kind == 2:
            del buf[i]
        elif kind == 3:
            del buf[i:]
        else:
            buf[i:i] = buf[i:i + 1 + byte]
    return bytes(buf)


def replace_at(doc: object, path: Sequence[int], value: object) -> object:
    """A copy of JSON ``doc`` with the node chosen by ``path`` (indices taken modulo the
    children at each level) replaced by ``value``."""
    doc = json.loads(json.dumps(doc))
    if not path or not isinstance(doc, (dict, list)) or not doc:
        return value
    node = doc
    for depth_, step in enumerate(path):
        keys = list(node.keys()) if isinstance(node, dict) else list(range(len(node)))
        key = keys[step % len(keys)]
        child = node[key]
        if depth_ == len(path) - 1 or not isinstance(child, (dict, list)) or not child:
            node[key] = value
            return doc
        node = child
    return doc


@functools.cache
def commands() -> dict[str, object]:
    """Every command the fuzz runs, by its words (``plot cdf``): the click command."""
    from simulator.cli import COMMANDS, _load

    found: dict[str, object] = {}
    for name in COMMANDS:
        if name in SKIPPED_COMMANDS:
            continue
        command = _load(name)
        if hasattr(command, "list_commands"):
            for sub in command.list_commands(None):
                found[f"{name} {sub}"] = command.get_command(None, sub)
        else:
            found[name] = command
    return found


def base_args(words: str) -> list[str]:
    """A valid invocation of ``words`` that finishes in milliseconds (outputs in the case folder)."""
    f = workspace()
    o = f["folder"]
    return {
        "replay": ["replay", str(f["trace"])],
        "validate": ["validate", str(f["trace"])],
        "synth": ["synth", "-o", str(o / "s.json"), "--duration", "600"],
        "import": ["import", "azure", str(f["azure_csv"]), "-o", str(o / "i.json")],
        "sweep": ["sweep", str(f["trace"]), "-o", str(o / "r.parquet"), "-j", "1", "--flush", "0"],
        "compare": ["compare", str(f["sweep"]), "--by", "flush,max_batch", "--where", "topology=shared"],
        "plan": ["plan", str(f["trace"]), "--slo", "infobench.latency.p95<=400", "-j", "1", "--flush", "0.5",
                 "--max-batch", "8", "--topology", "shared", "--max-gpus", "2"],
        "plot cdf": ["plot", "cdf", str(f["events"]), "-o", str(o / "c.png")],
        "plot timeline": ["plot", "timeline", str(f["events"]), "-o", str(o / "t.png")],
        "plot batches": ["plot", "batches", str(f["events"]), "-o", str(o / "b.png")],
        "plot decomposition": ["plot", "decomposition", str(f["events"]), "-o", str(o / "d.png")],
        "plot heatmap": ["plot", "heatmap", str(f["sweep"]), "-o", str(o / "h.png"), "--rows", "flush",
                         "--cols", "max_batch"],
        "plot load": ["plot", "load", str(f["load"]), "-o", str(o / "l.png")],
        "observed": ["observed", str(ROOT / "tests" / "data" / "loadgen" / "vllm_bench.json")],
        "compare-runs": ["compare-runs", str(ROOT / "tests" / "data" / "loadgen" / "vllm_bench.json"),
                         str(ROOT / "tests" / "data" / "loadgen" / "guidellm.json")],
        "calibrate": ["calibrate", str(f["folder"]), "--scenario", str(f["scenario"]), "--start", str(f["profile"]),
                      "-o", str(o / "fit.json")],
        "predict": ["predict", str(f["trace"]), "--scenario", str(f["scenario"]), "--profile", str(f["profile"]),
                    "--seeds", "1"],
        "snapshot": ["snapshot", str(ROOT / "tests" / "data" / "vllm_metrics.txt"), "-o", str(o / "snap.json")],
    }[words]


def option_values(option: str, setting: object | None) -> list[str]:
    """Hostile values for ``option``: the generic pool, file kinds for a path, and for an
    option that sets a scenario setting the edges of its declared range and choices."""
    f = workspace()
    values = list(HOSTILE_VALUES)
    values += [str(f[k]) for k in ("missing", "folder", "fifo", "dangling", "binary", "trace", "profile", "scenario")]
    if setting is not None:
        low, high = getattr(setting, "min", None), getattr(setting, "max", None)
        for edge in (low, high):
            if edge is not None:
                values += [repr(edge), repr(edge - 1), repr(edge + 1), repr(edge * 10 + 1)]
        values += [c + "x" for c in getattr(setting, "choices", ())]
    return values
