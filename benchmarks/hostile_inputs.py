"""Hostile inputs and interruptions: fuzz cases tried and handled per class, and the figures
of interrupted runs (orphan processes, leftover .part files, sweep rows lost).

Runs the fuzz classes of ``tests/test_fuzz_inputs.py`` (hypothesis, derandomized) and the
fault scenarios of ``tests/faults.py`` (SIGKILL and SIGINT at seeded moments of replay, sweep
on local processes and on a Dask cluster, and calibrate), and writes the table into docs/robustness.md (``--write-docs``)::

    python benchmarks/hostile_inputs.py --write-docs     # 1000 cases a class, 3 moments a fault
    python benchmarks/hostile_inputs.py --quick          # 1 case a class, replay Ctrl-C'd once

and the hostile-case classes of ``tests/hostile_*.py`` (outputs onto special files,
concurrent writers, full disks, hostile HTTP clients, hostile servers for ``load``, ...),
``--hostile-cases`` a class (100 by default; 1 in quick mode: the suite runs each class on its own).
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"


def hostile_classes() -> dict:
    """The classes of ``tests/hostile_*.py``: each module's ``CLASSES`` maps a class name to a
    function ``(examples) -> (tried, handled)`` that tries that many hostile cases (special
    output files, concurrent writers, full disks, hostile HTTP clients and servers ...) and
    counts those handled as promised (no traceback, no hang, no file destroyed or lost, no
    HTTP 500). One module a class family; the suite runs each with a few cases."""
    import importlib

    sys.path.insert(0, str(TESTS))
    classes: dict = {}
    for path in sorted(TESTS.glob("hostile_*.py")):
        classes.update(importlib.import_module(path.stem).CLASSES)
    return classes


def run(examples: int, moments: int, seed: int, kinds: tuple[str, ...] | None = None,
        hostile_cases: int | None = None, quick: bool = False,
        signals: tuple[signal.Signals, ...] = (signal.SIGKILL, signal.SIGINT)) -> dict:
    """``kinds``: the interrupted commands (default: every one of ``tests/faults.py``);
    ``hostile_cases``: cases a class of :func:`hostile_classes` (default ``examples``: their
    cases start processes and servers, seconds each, where a fuzz case takes milliseconds);
    ``quick``: each interrupted command's quick form (``tests/faults.py``: the run after the
    interruption in this process); ``signals``: those sent to each command."""
    sys.path.insert(0, str(TESTS))
    import faults
    import fuzzing
    import test_fuzz_inputs

    classes = {}
    for klass in test_fuzz_inputs.CLASSES:
        if klass == "real traces mutated" and not fuzzing.REAL.is_dir():
            continue
        fuzzing.TALLY.pop(klass, None)
        try:
            test_fuzz_inputs.fuzz(klass, examples)()
        except Exception:  # noqa: BLE001 - a broken contract is counted, not raised
            pass
        tried, handled = fuzzing.TALLY[klass]
        classes[klass] = {"tried": tried, "handled": handled}
    for klass, attempt in hostile_classes().items():
        tried, handled = attempt(examples if hostile_cases is None else hostile_cases)
        classes[klass] = {"tried": tried, "handled": handled}
    rng = random.Random(seed)
    base = Path(tempfile.mkdtemp(prefix="simctl-faults-"))
    runs = []
    try:
        for kind in kinds or tuple(faults.COMMANDS):
            for sig in signals:
                for i in range(moments):
                    folder = base / f"{kind.replace(' --', '-')}-{sig.name}-{i}"
                    got = faults.interrupt(kind, sig, round(rng.uniform(0.3, 0.9), 2), folder, base, quick=quick)
                    runs.append({k: got[k] for k in ("kind", "signal", "moment", "delay", "exit", "orphans", "leftovers",
                                                     "rows_lost", "identical", "one_line", "said")})
    finally:
        faults.close_forker()  # the quick form's forking interpreter, if it started one
    return {"examples": examples, "classes": classes, "faults": runs}


def table(result: dict) -> str:
    lines = ["| fuzz class | cases tried | handled |", "|---|---:|---:|"]
    total = [0, 0]
    for klass, c in result["classes"].items():
        lines.append(f"| {klass} | {c['tried']:,} | {c['handled']:,} ({100 * c['handled'] / max(c['tried'], 1):.0f} %) |")
        total[0] += c["tried"]
        total[1] += c["handled"]
    lines.append(f"| **all** | **{total[0]:,}** | **{total[1]:,} ({100 * total[1] / max(total[0], 1):.1f} %)** |")
    lines += ["", "| interrupted | runs | orphan processes | leftover .part files | sweep rows lost | "
              "resumed = uninterrupted | no traceback, at most one line | Ctrl-C said what it kept |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in result["faults"]:
        groups.setdefault((r["kind"], r["signal"]), []).append(r)
    for (kind, sig), rs in groups.items():
        lines.append(f"| `simctl {kind}`, {sig} | {len(rs)} | {sum(r['orphans'] for r in rs)} | "
                     f"{sum(r['leftovers'] for r in rs)} | {sum(r['rows_lost'] for r in rs)} | "
                     f"{sum(r['identical'] for r in rs)} of {len(rs)} | {sum(r['one_line'] for r in rs)} of {len(rs)} | "
                     f"{_said(rs)} |")
    return "\n".join(lines) + "\n"


def _said(runs: list[dict]) -> str:
    """How many of the runs that exited 130 said so in one line (``–``: none did; a kill -9,
    or a Ctrl-C once the command had finished)."""
    stopped = [r for r in runs if r["exit"] == 130]
    return f"{sum(r['said'] for r in stopped)} of {len(stopped)}" if stopped else "–"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=1000, help="fuzz cases a class")
    parser.add_argument("--moments", type=int, default=3, help="interruptions per command and signal")
    parser.add_argument("--hostile-cases", type=int, default=100,
                        help="cases a class of tests/hostile_*.py (outputs, writers, HTTP clients, servers for load)")
    parser.add_argument("--quick", action="store_true", help="1 case a class; replay Ctrl-C'd once")
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/robustness.md")
    args = parser.parse_args(argv)
    if args.quick:
        # the script's own check, every row and column of its table once: one fuzz case a
        # class and a Ctrl-C (the signal whose run also says what it kept);
        # tests/test_fuzz_inputs.py (each class with its own count of cases) and test_faults.py
        # cover the rest, kill -9 of every command among it
        result = run(1, 1, args.seed, kinds=("replay",), hostile_cases=1, quick=True, signals=(signal.SIGINT,))
    else:
        result = run(args.examples, args.moments, args.seed, hostile_cases=args.hostile_cases)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from docs_tables import report

    return report(result, table(result), "hostile-inputs", write_docs=args.write_docs, as_json=args.json,
                  page="robustness.md")


if __name__ == "__main__":
    sys.exit(main())
