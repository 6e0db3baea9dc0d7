"""Interrupting simctl at a seeded moment (SIGKILL or SIGINT sent from Python), then running
the same command again: shared by ``tests/test_faults.py`` and ``benchmarks/hostile_inputs.py``.

One :func:`interrupt` returns what the README promises about interruptions, as figures:
``orphans`` (processes of the interrupted command still alive after it), ``leftovers``
(``.part`` files after the next run of the same command), ``rows_lost`` (sweep rows finished
before the interruption that the next run redid), ``identical`` (the resumed outputs equal an
uninterrupted run's: byte for byte for replay's files, row for row for a sweep).
"""

from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIMCTL = [sys.executable, "-c", "from simulator.cli import main; main()"]

#: Each command, run in its folder with relative paths (so two folders' outputs compare).
COMMANDS = {
    "replay": ["replay", "long.json", "-c", "design-notes", "--json", "summary.json", "--events", "events.parquet",
               "--force"],
    "sweep": ["sweep", "long.json", "-c", "design-notes", "--flush", "0,0.1,0.2,0.3,0.4,0.5", "--seeds", "2",
              "--jobs", "2", "--out", "results.parquet"],
}
OUTPUTS = {"replay": ("summary.json", "events.parquet"), "sweep": ("results.parquet",)}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def make_trace(folder: Path, repeats: int = 40) -> Path:
    """The bundled trace repeated ``repeats`` times end to end: a replay of a second or so."""
    from simulator.trace.formats import load_trace, save_trace
    from simulator.trace.model import Call, Trace

    bundled = load_trace(ROOT / "traces" / "batch_arrivals.json")
    span = bundled.calls[-1].t + 1
    calls = tuple(Call(f"{k}-{c.id}", c.t + k * span, c.prompts) for k in range(repeats) for c in bundled.calls)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "long.json"
    save_trace(Trace(calls=calls), path, force=True)
    return path


@functools.cache
def reference(kind: str, base: str) -> dict[str, bytes]:
    """The outputs of an uninterrupted run of ``kind`` (in ``base``/ref-KIND)."""
    folder = Path(base) / f"ref-{kind}"
    make_trace(folder)
    subprocess.run([*SIMCTL, *COMMANDS[kind]], cwd=folder, env=_env(), check=True, capture_output=True, timeout=300)
    return {name: (folder / name).read_bytes() for name in OUTPUTS[kind]}


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (read from /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _rows(folder: Path) -> int:
    """Sweep rows on disk now: journal lines after its header, or the results file's rows."""
    journal = folder / "results.parquet.journal"
    if journal.exists():
        return max(0, sum(1 for line in journal.read_text().splitlines() if line.endswith("}")) - 1)
    if (folder / "results.parquet").exists():
        import pandas as pd

        return len(pd.read_parquet(folder / "results.parquet"))
    return 0


def interrupt(kind: str, sig: signal.Signals, delay: float, folder: Path, base: Path) -> dict[str, object]:
    """Run ``kind`` in ``folder``, send ``sig`` after ``delay`` s, run it again; the figures."""
    expected = reference(kind, str(base))
    make_trace(folder)
    proc = subprocess.Popen([*SIMCTL, *COMMANDS[kind]], cwd=folder, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    tree = descendants(proc.pid)
    finished_before = _rows(folder) if kind == "sweep" else 0
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    until = time.monotonic() + 10
    while time.monotonic() < until and any(alive(p) for p in tree):
        time.sleep(0.05)
    orphans = sum(alive(p) for p in tree)
    one_line = proc.returncode in (0, -9) or ("Traceback" not in err and len(err.strip().splitlines()) <= 1)
    finished = max(finished_before, _rows(folder)) if kind == "sweep" else 0
    again = subprocess.run([*SIMCTL, *COMMANDS[kind]], cwd=folder, env=_env(), capture_output=True, text=True,
                           timeout=300)
    skipped = 0
    if kind == "sweep":
        match = re.search(r"(\d+) already in the file skipped", " ".join(again.stdout.split()))
        skipped = int(match.group(1)) if match else 0
    leftovers = len(list(folder.glob(".*.part")))
    if kind == "sweep":
        import pandas as pd

        key = ["config_key", "seed"]
        got = pd.read_parquet(folder / "results.parquet").sort_values(key).reset_index(drop=True)
        want = pd.read_parquet(base / "ref-sweep" / "results.parquet").sort_values(key).reset_index(drop=True)
        identical = again.returncode == 0 and got.equals(want)
    else:
        identical = again.returncode == 0 and all((folder / n).read_bytes() == b for n, b in expected.items())
    return {"kind": kind, "signal": sig.name, "delay": delay, "exit": proc.returncode, "orphans": orphans,
            "leftovers": leftovers, "rows_lost": max(0, finished - skipped) if kind == "sweep" else 0,
            "identical": identical, "one_line": one_line, "stderr": err[-400:]}
