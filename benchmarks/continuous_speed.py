"""How long does a replay take with continuous (iteration-level) batching?

Replays the bundled trace (``traces/batch_arrivals.json``, 118 calls) through the
design-notes scenario (``scenarios/design-notes.toml``) on the default profile twice: with
every GPU task on the ``continuous`` topology, and, for contrast, as the scenario has them
(``shared`` micro-batch queues). A continuous engine runs one iteration per token step, so
its replay has some fifty times as many events as the static batches' replay. Both run on
the engine ``simulate`` picks (the compiled kernel, which models both); the continuous
replay is also timed on the simpy reference engine, for contrast.

Each time is the best of ``--repeat`` runs of ``simulate`` (the least disturbed by other
work on the machine). The figure that survives a slower or busier machine divides it by the
yardstick of :mod:`simpy_baseline`, measured in the same run (a run of it before each round
of replays, the best kept): the replay *costs as much as idiomatic simpy simulating K
customers* of an M/M/4 queue, with K = replay seconds × simpy customers per second (lower
is faster).

    python benchmarks/continuous_speed.py              # best of 20
    python benchmarks/continuous_speed.py --quick      # a short check (best of 3, smaller yardstick)
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parent.parent


def gpu_task_overrides(trace, scenario, profile) -> dict[str, str]:
    """``--set`` overrides that put every GPU task of the trace on the continuous topology."""
    out = {}
    for task in sorted(trace.tasks):
        resource = scenario.for_task(task).resource or profile.task(task).resource
        if resource == "gpu":
            out[f"tasks.{task}.topology"] = "continuous"
    return out


def run(repeat: int, seed: int, profile_name: str, customers: int) -> dict:
    from simpy_baseline import simpy_customers_per_second

    from simulator import build_scenario, load_profile, load_trace, simulate

    trace = load_trace("example")
    profile = load_profile(profile_name)
    shared = build_scenario(path="design-notes")
    overrides = gpu_task_overrides(trace, shared, profile)
    scenarios = {"continuous": build_scenario(path="design-notes", overrides=overrides), "shared": shared}

    # Rounds of (yardstick, each replay), each figure the best over the rounds: a change of
    # load on the machine during the run then touches the yardstick and the replays alike.
    baseline = 0.0
    best = dict.fromkeys(scenarios, float("inf"))
    engines = dict.fromkeys(scenarios, "")
    reference = float("inf")
    for _ in range(repeat):
        baseline = max(baseline, simpy_customers_per_second(customers))
        for name, scenario in scenarios.items():
            t0 = time.perf_counter()
            log = simulate(trace, scenario, profile, seed)
            best[name] = min(best[name], time.perf_counter() - t0)
            engines[name] = log.attrs["engine"]
        t0 = time.perf_counter()
        simulate(trace, scenarios["continuous"], profile, seed, engine="reference")
        reference = min(reference, time.perf_counter() - t0)
    return {
        "trace": "example",
        "calls": len(trace),
        "prompts": trace.n_prompts,
        "profile": profile_name,
        "continuous_tasks": sorted(k.split(".")[1] for k in overrides),
        "simpy_customers_per_s": baseline,
        "rows": [{"topology": name, "replay_ms": seconds * 1000, "simpy_customers": seconds * baseline,
                  "engine": engines[name]} for name, seconds in best.items()],
        "continuous_reference_ms": reference * 1000,
        "repeat": repeat,
        "seed": seed,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


def table(result: dict) -> str:
    """The markdown table of ``result`` and the line that says how it was measured."""
    lines = ["| GPU tasks on | replay | costs as much as simpy simulating |", "|---|---|---|"]
    for r in result["rows"]:
        what = "continuous" if r["topology"] == "continuous" else "the scenario's `shared` queues"
        lines.append(f"| {what} | **{r['replay_ms']:.1f} ms** | {r['simpy_customers']:,.0f} customers |")
    lines.append("")
    lines.append(
        f"Bundled trace ({result['calls']} calls, {result['prompts']} prompts), design-notes scenario "
        f"({', '.join(result['continuous_tasks'])} on `continuous` in the first row), {result['profile']} "
        f"profile, best of {result['repeat']} rounds; engine: "
        f"{', '.join(sorted({r['engine'] for r in result['rows']}))} (the continuous replay on the reference "
        f"engine: {result['continuous_reference_ms']:.1f} ms); yardstick: idiomatic simpy M/M/4 at "
        f"{result['simpy_customers_per_s']:,.0f} customers/s in the same run; Python {result['python']} "
        f"on {result['machine']}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20,
                        help="rounds (the yardstick, then each replay); the best of each is reported")
    parser.add_argument("--quick", action="store_true", help="a short check: 3 rounds, a smaller yardstick")
    parser.add_argument("--profile", default="seed-calibrated", help="profile name or path")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/benchmarks.md")
    args = parser.parse_args(argv)
    repeat = 3 if args.quick else args.repeat
    customers = 5_000 if args.quick else 50_000
    result = run(repeat, args.seed, args.profile, customers)
    from docs_tables import report

    return report(result, table(result), "continuous-speed", write_docs=args.write_docs, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
