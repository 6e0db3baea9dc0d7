"""How many sweep configurations per second on all local cores?

Sweeps the bundled trace (``traces/batch_arrivals.json``, 118 calls) on the default
profile with local processes, writing the Parquet results file, and prints configurations
per second of wall time (including the pool's start-up and the file, excluding loading the
trace and profile, which a sweep does once). The grid crosses every topology (shared, split,
direct, continuous) with GPUs 1-5, flush 0-5 s, max batch 1-10, two policies, two dispatch
rules and five ``max_num_seqs``; a topology is run once per value of the axes it reads, so
it holds 1,100 configurations (``--small``: flush 5 × topology 2 × max batch 5 × GPUs 4, 200).

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


def run(jobs: int | None, repeat: int, small: bool = False) -> dict:
    from simulator import build_scenario, load_profile, load_trace
    from simulator.sweep import Base, SweepSpec, run_sweep

    base = Base(load_trace(ROOT / "traces" / "batch_arrivals.json"), load_profile("seed-calibrated"),
                build_scenario())
    if small:
        axes = {"flush": (0.0, 0.5, 1.0, 2.0, 5.0), "topology": ("shared", "split"),
                "max_batch": (1, 2, 4, 8, 10), "gpus": (1, 2, 3, 4)}
    else:
        axes = {"topology": ("shared", "split", "direct", "continuous"), "gpus": (1, 2, 3, 4, 5),
                "flush": (0.0, 0.5, 1.0, 2.0, 5.0), "max_batch": (1, 2, 4, 8, 10), "policy": ("oldest", "adaptive"),
                "dispatch": ("round-robin", "least-loaded"), "max_num_seqs": (8, 16, 32, 64, 256)}
    spec = SweepSpec(axes)
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeat):
            t0 = time.perf_counter()
            result = run_sweep(spec, base, Path(tmp) / f"sweep{i}.parquet", workers=jobs)
            times.append(time.perf_counter() - t0)
            count = len(result.frame)
            assert result.ran == count
    best = min(times)
    return {"configurations": count, "seconds": best, "configurations_per_s": count / best,
            "jobs": jobs or os.cpu_count(), "cores": os.cpu_count(), "repeat": repeat}


#: The README's plan example.
PLAN_EXAMPLE = ["plan", "example", "-c", "design-notes", "--task", "infobench", "--flush", "0.1,5",
                "--topology", "shared,split", "--slo", "infobench.latency.p95<=180"]


def plan_seconds(repeat: int) -> float:
    """Wall seconds of the README's plan example through the CLI (a new process, as a user runs it)."""
    import subprocess

    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "from simulator.cli import main; main()", *PLAN_EXAMPLE],
                       check=True, capture_output=True, cwd=ROOT)
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=None, help="processes (default: all cores)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--small", action="store_true", help="the 200-configuration grid (a quick check)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write-docs", action="store_true", help="write the figures into docs/benchmarks.md")
    args = parser.parse_args(argv)
    r = run(args.jobs, args.repeat, args.small)
    r["plan_s"] = plan_seconds(args.repeat)
    if args.write_docs:
        from docs_tables import write_generated

        write_generated("sweep-throughput", (
            f"**{r['configurations_per_s']:,.0f} configurations per second**: {r['configurations']:,} configurations of "
            f"the bundled trace in {r['seconds']:.2f} s on {r['jobs']} process(es) ({r['cores']} cores), best of "
            f"{r['repeat']}. The README's plan example (`simctl {' '.join(PLAN_EXAMPLE[:-1])} "
            f"\"{PLAN_EXAMPLE[-1]}\"`) takes **{r['plan_s']:.1f} s** end to end, best of {r['repeat']}."))
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        print(f"{r['configurations']} configurations in {r['seconds']:.2f} s on {r['jobs']} process(es) "
              f"({r['cores']} cores): {r['configurations_per_s']:.1f} configurations/s (best of {r['repeat']}); "
              f"the README's plan example: {r['plan_s']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
