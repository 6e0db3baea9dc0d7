"""How many prompts per second does the simulator replay?

Synthesizes a trace with the production statistics of the bundled trace (gamma
inter-arrivals, mean 10.05 s, CV 0.65; 1-8 prompts per call; graph/mmlu/infobench mix),
replays it through the design-notes scenario (``scenarios/design-notes.toml``) on the
default profile, and prints prompts simulated per second of wall time: for the
simulation alone (building the model, running simpy, writing the event log) and for the
whole replay including the summary. Each figure is the best of ``--repeat`` runs (the
least disturbed by other work on the machine).

    python benchmarks/replay_throughput.py                 # 100,000 calls, 3 repeats
    python benchmarks/replay_throughput.py --calls 2000 --repeat 1   # quick check
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parent.parent


def run(calls: int, repeat: int, seed: int) -> dict:
    from simulator import build_scenario, load_profile, simulate, summarize, synthesize
    from simulator.trace.synth import SynthSpec

    mean_gap = 10.05
    # Enough duration for ``calls`` arrivals on average; then cut to exactly ``calls``.
    spec = SynthSpec(duration=mean_gap * calls * 1.05, arrival="gamma", mean=mean_gap, cv=0.65)
    trace = synthesize(spec, seed)
    trace = type(trace)(calls=trace.calls[:calls], meta=trace.meta, source="synthetic")
    scenario = build_scenario(path=ROOT / "scenarios" / "design-notes.toml")
    profile = load_profile("seed-calibrated")

    sim_times, total_times = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        log = simulate(trace, scenario, profile, seed)
        t1 = time.perf_counter()
        summary = summarize(log, config={}, deadline=scenario.deadline, gpus=scenario.gpus)
        t2 = time.perf_counter()
        sim_times.append(t1 - t0)
        total_times.append(t2 - t0)
    prompts = trace.n_prompts
    assert summary["overall"]["prompts"] == prompts  # every prompt accounted for
    return {
        "calls": len(trace),
        "prompts": prompts,
        "simulated_s": summary["makespan_s"],
        "simulate_s": min(sim_times),
        "replay_s": min(total_times),
        "simulate_prompts_per_s": prompts / min(sim_times),
        "replay_prompts_per_s": prompts / min(total_times),
        "gpu_utilization": [round(g["utilization"], 3) for g in summary["gpus"]],
        "python": platform.python_version(),
        "machine": platform.machine(),
        "repeat": repeat,
        "seed": seed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100_000, help="calls in the synthetic trace")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the best is reported")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--write-docs", action="store_true", help="write the figures into docs/benchmarks.md")
    args = parser.parse_args(argv)
    result = run(args.calls, args.repeat, args.seed)
    if args.write_docs:
        from docs_tables import write_generated

        write_generated("replay-throughput", (
            f"**{result['simulate_prompts_per_s']:,.0f} prompts simulated per second** "
            f"({result['simulate_s']:.2f} s; {result['replay_prompts_per_s']:,.0f}/s including the summary): "
            f"{result['calls']:,} calls, {result['prompts']:,} prompts, design-notes scenario, one core, best of "
            f"{result['repeat']}, Python {result['python']} on {result['machine']}."))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"{result['calls']:,} calls, {result['prompts']:,} prompts, "
            f"{result['simulated_s']:,.0f} s simulated (GPU utilisation "
            f"{', '.join(f'{u:.0%}' for u in result['gpu_utilization'])})\n"
            f"simulate: {result['simulate_s']:.2f} s -> "
            f"{result['simulate_prompts_per_s']:,.0f} prompts/s\n"
            f"replay with summary: {result['replay_s']:.2f} s -> "
            f"{result['replay_prompts_per_s']:,.0f} prompts/s\n"
            f"(best of {result['repeat']}, Python {result['python']}, {result['machine']})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
