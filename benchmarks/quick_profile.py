"""How long does the quick CPU profile take, and how well do its fitted costs hold?

Runs ``simctl profile --device cpu --quick`` (torch threads pinned to ``--threads``) into a
temporary file and prints the wall time and the held-out check: the absolute error of the
composed cost model on held-out whole generations (median and worst). Both depend on how busy
the machine is, which is why they are measured here and not asserted in a test.

    python benchmarks/quick_profile.py            # one run
    python benchmarks/quick_profile.py --json
    python benchmarks/quick_profile.py --batch 1,2 --max-tokens 8 --lookahead 1,2,3 --acceptance 0.8
                                                   # a narrower grid (the suite's check)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def run(threads: int, grid: list[str] | None = None) -> dict:
    """One quick profile (``grid``: options that narrow its grid, passed to ``simctl profile``)."""
    from typer.testing import CliRunner

    from simulator.cli import app

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "quick.json"
        start = time.perf_counter()
        result = CliRunner().invoke(app, ["profile", "--device", "cpu", "--quick", "--threads", str(threads),
                                          *(grid or []), "-o", str(out)])
        seconds = time.perf_counter() - start
        if result.exit_code != 0:
            raise SystemExit(f"simctl profile failed: {result.output}")
        check = json.loads(out.read_text())["meta"]["fit_check"]
    return {"seconds": seconds, "threads": threads, "held_out": check["held_out"],
            "median_ape": check["median_ape"], "max_ape": check["max_ape"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    # options that narrow the quick grid, passed to simctl profile as given (default: the quick grid's)
    narrowing = {"--batch": "batch sizes", "--max-tokens": "tokens a row", "--prompt-tokens": "prompt lengths",
                 "--lookahead": "lookaheads k", "--acceptance": "injected acceptance rates",
                 "--repeats": "timed repeats a step"}
    for option, what in narrowing.items():
        parser.add_argument(option, help=f"{what}, as simctl profile takes them (default: the quick grid's)")
    args = parser.parse_args(argv)
    grid = [item for option in narrowing
            if (value := getattr(args, option[2:].replace("-", "_"))) for item in (option, value)]
    result = run(args.threads, grid)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"quick CPU profile: {result['seconds']:.1f} s with {result['threads']} thread(s); composed cost "
              f"model vs {result['held_out']} held-out generations: median error {100 * result['median_ape']:.1f} %, "
              f"max {100 * result['max_ape']:.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
