"""How many sweep configurations per second on all local cores?

Sweeps the bundled trace (``traces/batch_arrivals.json``, 118 calls) on the default
profile over 200 configurations (flush 5 × topology 2 × max batch 5 × GPUs 4) with local
processes, writing the Parquet results file, and prints configurations per second of wall
time (including the pool's start-up and the file, excluding loading the trace and profile,
which a sweep does once).

    python benchmarks/sweep_throughput.py            # best of 3
    python benchmarks/sweep_throughput.py --jobs 1   # one core
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parent.parent


def run(jobs: int | None, repeat: int) -> dict:
    from simulator import build_scenario, load_profile, load_trace
    from simulator.sweep import Base, SweepSpec, run_sweep

    base = Base(load_trace(ROOT / "traces" / "batch_arrivals.json"), load_profile("seed-calibrated"),
                build_scenario())
    spec = SweepSpec({"flush": (0.0, 0.5, 1.0, 2.0, 5.0), "topology": ("shared", "split"),
                      "max_batch": (1, 2, 4, 8, 10), "gpus": (1, 2, 3, 4)})
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeat):
            t0 = time.perf_counter()
            result = run_sweep(spec, base, Path(tmp) / f"sweep{i}.parquet", workers=jobs)
            times.append(time.perf_counter() - t0)
            assert result.ran == 200 and len(result.frame) == 200
    best = min(times)
    return {"configurations": 200, "seconds": best, "configurations_per_s": 200 / best,
            "jobs": jobs or os.cpu_count(), "cores": os.cpu_count(), "repeat": repeat}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=None, help="processes (default: all cores)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write-docs", action="store_true", help="write the figures into docs/benchmarks.md")
    args = parser.parse_args(argv)
    r = run(args.jobs, args.repeat)
    if args.write_docs:
        from docs_tables import write_generated

        write_generated("sweep-throughput", (
            f"**{r['configurations_per_s']:,.0f} configurations per second**: {r['configurations']} configurations of "
            f"the bundled trace in {r['seconds']:.2f} s on {r['jobs']} process(es) ({r['cores']} cores), best of "
            f"{r['repeat']}."))
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        print(f"{r['configurations']} configurations in {r['seconds']:.2f} s on {r['jobs']} process(es) "
              f"({r['cores']} cores): {r['configurations_per_s']:.1f} configurations/s (best of {r['repeat']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
