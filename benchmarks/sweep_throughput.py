"""How fast does ``simctl sweep`` run 10,000 configurations of the bundled trace?

Two figures, the command's first:

* **the whole command**: ``simctl sweep example -c design-notes`` over flush windows ×
  topologies × max batch × GPU counts × load (``--rate-scale``), 10 × 2 × 10 × 5 × 10 =
  10,000 configurations, run as a user runs it (a new process: imports, loading the trace
  and profile, the pool of ``--jobs`` processes, the results file, the table at the end).
  Reported: its wall time on ``--jobs`` processes, and its CPU time summed over the command
  and every worker process (``getrusage(RUSAGE_CHILDREN)``: on a shared machine the CPU time
  is the figure that does not depend on the other load);
* **the library call**: :func:`simulator.sweep.run_sweep` of the same grid in this process,
  with the trace, profile and scenario already loaded and the compiled kernel already warm:
  wall and CPU time (this process and its workers).

Also the README's plan example through the CLI (wall time, a new process). ``--quick``: a
32-configuration grid (2 values an axis), no plan example, one repeat: a check that the
script runs, a few CPU-seconds.

    python benchmarks/sweep_throughput.py                 # best of --repeat (default 1)
    python benchmarks/sweep_throughput.py --jobs 1        # one process
    python benchmarks/sweep_throughput.py --write-docs    # docs/sweep-and-plan.md, docs/benchmarks.md, README
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parent.parent

#: The grid: option -> comma-separated values, as on the command line.
GRID = {
    "--flush": "0,0.1,0.25,0.5,1,1.5,2,3,4,5",
    "--topology": "shared,split",
    "--max-batch": "1,2,3,4,5,6,7,8,9,10",
    "--gpus": "1,2,3,4,5",
    "--rate-scale": "0.5,1,1.5,2,2.5,3,3.5,4,4.5,5",
}
QUICK_GRID = {"--flush": "0,5", "--topology": "shared,split", "--max-batch": "1,10", "--gpus": "1,2",
              "--rate-scale": "1,2"}

#: The README's plan example.
PLAN_EXAMPLE = ["plan", "example", "-c", "design-notes", "--task", "infobench", "--flush", "0.1,5",
                "--topology", "shared,split", "--slo", "infobench.latency.p95<=180"]

#: The README's headline table row these figures replace (found by its first cell).
README_ROW = "| sweeps and plans, bundled trace, 2 cores |"


def command(grid: dict[str, str], jobs: int, out: Path) -> list[str]:
    """The ``simctl sweep`` command line of ``grid`` (after ``simctl``)."""
    return ["sweep", "example", "-c", "design-notes", *(x for option, values in grid.items() for x in (option, values)),
            "--jobs", str(jobs), "-o", str(out)]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_command(grid: dict[str, str], jobs: int, repeat: int, folder: Path) -> dict:
    """The whole command, best of ``repeat`` by wall time: wall, CPU of it and its workers."""
    best: dict = {}
    for i in range(repeat):
        out = folder / f"command{i}.parquet"
        cpu0, t0 = children_cpu(), time.perf_counter()
        done = subprocess.run([sys.executable, "-c", "from simulator.cli import main; main()", *command(grid, jobs, out)],
                              capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        wall, cpu = time.perf_counter() - t0, children_cpu() - cpu0
        if done.returncode != 0:
            raise SystemExit(f"simctl sweep failed ({done.returncode}): {done.stderr.strip()[-500:]}")
        if not best or wall < best["wall_s"]:
            best = {"wall_s": wall, "cpu_s": cpu}
    return best


def journal_size(journal: Path, size: list[int], done: int, total: int) -> None:
    """A sweep's progress callback: the size of its ``journal`` as rows are saved, in
    ``size[0]`` (its largest as the last is: the file is removed once the results file is
    written)."""
    if journal.exists():
        size[0] = journal.stat().st_size


def run_library(grid: dict[str, str], jobs: int, repeat: int, folder: Path) -> dict:
    """:func:`run_sweep` of the same grid in this process, best of ``repeat`` by wall time."""
    from simulator import build_scenario, load_profile, load_trace
    from simulator.sweep import Base, SweepSpec, axes_from_options, run_sweep

    base = Base(load_trace("example"), load_profile("seed-calibrated"), build_scenario(path="design-notes"))
    spec = SweepSpec(axes_from_options({option[2:].replace("-", "_"): values for option, values in grid.items()}))
    run_sweep(SweepSpec({"flush": (0.0,)}), base, folder / "warm.parquet", workers=1)  # the kernel loaded
    best: dict = {}
    for i in range(repeat):
        out = folder / f"library{i}.parquet"
        journal_bytes = [0]
        cpu0, t0 = own_cpu() + children_cpu(), time.perf_counter()
        result = run_sweep(spec, base, out, workers=jobs,
                           progress=partial(journal_size, out.with_name(out.name + ".journal"), journal_bytes))
        wall, cpu = time.perf_counter() - t0, own_cpu() + children_cpu() - cpu0
        assert result.ran == len(result.frame) == result.total
        if not best or wall < best["wall_s"]:
            best = {"wall_s": wall, "cpu_s": cpu, "configurations": result.total, "journal_mb": journal_bytes[0] / 1e6}
    return best


def plan_seconds(repeat: int) -> float:
    """Wall seconds of the README's plan example through the CLI (a new process, as a user runs it)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "from simulator.cli import main; main()", *PLAN_EXAMPLE],
                       check=True, capture_output=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        best = min(best, time.perf_counter() - t0)
    return best


#: Configurations of the grid timed stage by stage (every k-th, in one process).
STAGE_SAMPLE = 500
#: The stages, as the text names them.
STAGE_NAMES = {"scenario": "scenario", "simulate": "simulation", "summary": "summary", "cost": "cost",
               "row": "row", "journal": "journal line"}
#: CPU-ms a configuration that 10,000 configurations in 10 s on 2 processes allow.
TARGET_CPU_MS = 2 * 10 * 1000 / 10_000


def stage_figures(grid: dict[str, str], sample: int) -> dict:
    """CPU milliseconds a configuration spends in each stage of :func:`simulator.sweep.run_job`
    and of its journal line, in this process, over ``sample`` configurations of ``grid``
    drawn at random (seeded), after one untimed pass over them (the kernel loaded, memos made):
    where a sweep's time goes, as :func:`simulator.replay.simulate_and_summarize` spends it."""
    from simulator import build_scenario, load_profile, load_trace
    from simulator.cost import cost_summary, load_prices
    from simulator.metrics import summarize_columns
    from simulator.model.engine import expect_prompts, simulate_columns
    from simulator.sweep import Base, SweepSpec, axes_from_options, flatten, scenario_for, values_line

    base = Base(load_trace("example"), load_profile("seed-calibrated"), build_scenario(path="design-notes"))
    jobs = SweepSpec(axes_from_options({o[2:].replace("-", "_"): v for o, v in grid.items()})).jobs()
    # A seeded random sample, not every k-th: the last axis varies fastest, so a stride that
    # shares a factor with its length would sample a few of its values alone (every 20th
    # configuration of the 10-value --rate-scale axis is always its first value).
    jobs = [jobs[i] for i in sorted(random.Random(0).sample(range(len(jobs)), min(sample, len(jobs))))]
    expect_prompts(len(jobs) * base.trace.n_prompts)  # (the compiled kernel, as a sweep of them takes)
    prices = load_prices()
    names = tuple(STAGE_NAMES)
    spent = dict.fromkeys(names, 0.0)
    for timed in (False, True):
        for key, config, seed in jobs:
            t0 = time.process_time()
            scenario = scenario_for(base, config, None)
            scaled = base.trace.scaled(scenario.rate_scale)
            t1 = time.process_time()
            columns = simulate_columns(scaled, scenario, base.profile, seed)
            t2 = time.process_time()
            summary = summarize_columns(columns, None, deadline=scenario.deadline, gpus=scenario.gpus,
                                        client_timeout=scenario.client_timeout, compositions=scenario.compositions)
            t3 = time.process_time()
            summary["cost"] = cost_summary(summary, scenario, base.profile, prices)
            t4 = time.process_time()
            row = {"config_key": key, "seed": seed, **config, **flatten(summary)}
            t5 = time.process_time()
            values_line(tuple(row.values()))
            t6 = time.process_time()
            if timed:
                for name, (a, b) in zip(names, ((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5), (t5, t6)),
                                        strict=True):
                    spent[name] += b - a
    return {"configurations": len(jobs), "prompts": base.trace.n_prompts,
            **{f"{name}_ms": 1000 * v / len(jobs) for name, v in spent.items()},
            "total_ms": 1000 * sum(spent.values()) / len(jobs)}


def run(jobs: int, repeat: int, quick: bool = False) -> dict:
    grid = QUICK_GRID if quick else GRID
    with tempfile.TemporaryDirectory() as tmp:
        cmd = run_command(grid, jobs, repeat, Path(tmp))
        # the machine's load as the command ended: its wall time is inflated on a shared machine,
        # its CPU time is not
        load = os.getloadavg()[0]
        lib = run_library(grid, jobs, repeat, Path(tmp))
    n = lib["configurations"]
    return {"configurations": n, "jobs": jobs, "cores": os.cpu_count(), "repeat": repeat,
            "command": " ".join(["simctl", *command(grid, jobs, Path("sweep.parquet"))]),
            "command_wall_s": cmd["wall_s"], "command_cpu_s": cmd["cpu_s"],
            "command_configurations_per_s": n / cmd["wall_s"],
            "command_cpu_ms_per_configuration": 1000 * cmd["cpu_s"] / n, "load_average": load,
            "library_wall_s": lib["wall_s"], "library_cpu_s": lib["cpu_s"],
            "library_configurations_per_s": n / lib["wall_s"], "journal_mb": lib["journal_mb"],
            # (kept for readers of earlier results: the library figure)
            "seconds": lib["wall_s"], "configurations_per_s": n / lib["wall_s"],
            "plan_s": None if quick else plan_seconds(repeat),
            "stages": stage_figures(grid, 8 if quick else STAGE_SAMPLE)}


def describe(r: dict) -> str:
    text = (f"**{r['configurations']:,} configurations in {r['command_wall_s']:.1f} s** as a whole command "
            f"(`{r['command']}`: a new process, imports, loading, the pool and the results file included) on "
            f"{r['jobs']} process(es), {r['cores']} cores; **{r['command_cpu_s']:.1f} CPU-s** summed over the command "
            f"and its workers ({r['command_cpu_ms_per_configuration']:.1f} CPU-ms a configuration; the "
            f"machine's 1-minute load average was {r['load_average']:.1f} on its {r['cores']} cores as the command "
            f"ended, so the wall time counts other work too). The library call (`run_sweep` of the same grid, inputs loaded and the kernel warm): "
            f"{r['library_wall_s']:.1f} s, {r['library_cpu_s']:.1f} CPU-s "
            f"({r['library_configurations_per_s']:,.0f} configurations per second). Best of {r['repeat']}.")
    if r.get("journal_mb") is not None:
        text += (f" The journal (`OUT.journal`, removed once the results file is written) held "
                 f"{r['journal_mb']:.0f} MB as the last row was saved.")
    if r.get("stages"):
        st = r["stages"]
        text += (f" Where a configuration's time goes, in one process ({st['configurations']} configurations "
                 f"drawn at random from the grid, {st['prompts']} prompts each, CPU-ms a configuration): the scenario "
                 f"{st['scenario_ms']:.2f}, the simulation {st['simulate_ms']:.2f} (lowering, the compiled kernel, "
                 f"the log's columns), the summary {st['summary_ms']:.2f}, its cost {st['cost_ms']:.2f}, the row "
                 f"{st['row_ms']:.2f} and its journal line {st['journal_ms']:.2f}: **{st['total_ms']:.2f} CPU-ms** "
                 f"in all, against the {TARGET_CPU_MS:.1f} CPU-ms a configuration that 10,000 configurations in "
                 f"10 s on 2 processes allow with nothing else counted; the largest part is the "
                 f"{STAGE_NAMES[max(STAGE_NAMES, key=lambda k: st[f'{k}_ms'])]}.")
    if r["plan_s"] is not None:
        text += (f" The README's plan example (`simctl {' '.join(PLAN_EXAMPLE[:-1])} \"{PLAN_EXAMPLE[-1]}\"`) "
                 f"takes **{r['plan_s']:.1f} s** end to end.")
    return text


def readme_row(r: dict) -> str:
    plan = f"; the plan example above {r['plan_s']:.1f} s end to end" if r["plan_s"] is not None else ""
    return (f"{README_ROW} `simctl sweep` of {r['configurations']:,} configurations (flush × topology × max batch × "
            f"GPUs × load) as a whole command: {r['command_wall_s']:.1f} s on {r['jobs']} processes, "
            f"{r['command_cpu_s']:.1f} CPU-s summed over its processes (load average {r['load_average']:.1f} on "
            f"{r['cores']} cores); the library call of the same grid {r['library_wall_s']:.1f} s, "
            f"{r['library_cpu_s']:.1f} CPU-s{plan} | `benchmarks/sweep_throughput.py`, "
            f"[docs/sweep-and-plan.md](docs/sweep-and-plan.md#sweep-speed) |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes (default: all cores)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="the 32-configuration grid, no plan example (a check)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--from-json", type=Path, help="the figures of a saved --json run instead of a new run")
    parser.add_argument("--write-docs", action="store_true",
                        help="write the figures into docs/sweep-and-plan.md, docs/benchmarks.md and the README")
    args = parser.parse_args(argv)
    r = json.loads(args.from_json.read_text()) if args.from_json else run(args.jobs, args.repeat, args.quick)
    text = describe(r)
    if args.write_docs:
        from docs_tables import write_generated, write_row

        write_generated("sweep-speed", text, page="sweep-and-plan.md")
        write_generated("sweep-throughput", text)
        write_row(README_ROW[2:], readme_row(r), page="README.md")
    print(json.dumps(r, indent=2) if args.json else text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
