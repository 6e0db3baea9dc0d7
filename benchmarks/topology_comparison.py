"""The bundled trace through every queue topology, on one profile: one table.

Starts from the design-notes scenario (``scenarios/design-notes.toml``: the server's token
caps, GPU sharing and per-task queues) and replaces the topology of the GPU tasks (mmlu,
infobench) by each registered one in turn; graph stays on the CPU as in the notes. For
each, it replays ``traces/batch_arrivals.json`` on ``profiles/seed-calibrated.json`` with
several seeds and prints per task the p50/p90/p99 of prompt latency and p50 time to first
token (averaged over seeds), and the GPU-seconds the run kept the GPUs busy. The same
comparison with the ``static`` policy and the ``adaptive`` one is printed under it.

    python benchmarks/topology_comparison.py            # 5 seeds, markdown table
    python benchmarks/topology_comparison.py --seeds 1 --json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
GPU_TASKS = ("mmlu", "infobench")


def variants() -> list[tuple[str, dict]]:
    """(label, per-task overrides for the GPU tasks)."""
    from simulator.model import TOPOLOGIES

    out = []
    for name in TOPOLOGIES.names():
        extra: dict = {"topology": name}
        if name == "split":
            extra["workers"] = None
        out.append((name, extra))
    out.append(("shared, static (timeout = flush)", {"topology": "shared", "policy": "static"}))
    out.append(("shared, adaptive", {"topology": "shared", "policy": "adaptive"}))
    return out


def run(seeds: int) -> list[dict]:
    from simulator import build_scenario, load_profile, replay
    from simulator.trace.formats import load_trace

    trace = load_trace(ROOT / "traces" / "batch_arrivals.json")
    profile = load_profile("seed-calibrated")
    rows = []
    for label, overrides in variants():
        scenario = build_scenario(path=ROOT / "scenarios" / "design-notes.toml",
                                  tasks={t: overrides for t in GPU_TASKS})
        per_seed = [replay(trace, scenario, profile, seed=s).summary for s in range(seeds)]
        row: dict = {"variant": label, "gpu_seconds": float(np.mean([s["gpu_seconds"] for s in per_seed]))}
        for task in ("graph", *GPU_TASKS):
            for q in ("p50", "p90", "p99"):
                row[f"{task}_{q}"] = float(np.mean([s["tasks"][task]["latency"][q] for s in per_seed]))
            row[f"{task}_ttft_p50"] = float(np.mean([s["tasks"][task]["ttft"]["p50"] for s in per_seed]))
        row["call_p90"] = float(np.mean([s["overall"]["call_latency"]["p90"] for s in per_seed]))
        rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    head = ("| variant | mmlu p50 / p90 / p99 | mmlu TTFT p50 | infobench p50 / p90 / p99 | "
            "infobench TTFT p50 | graph p50 | call p90 | GPU-s |")
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['mmlu_p50']:.1f} / {r['mmlu_p90']:.1f} / {r['mmlu_p99']:.1f} | "
            f"{r['mmlu_ttft_p50']:.2f} | {r['infobench_p50']:.1f} / {r['infobench_p90']:.1f} / "
            f"{r['infobench_p99']:.1f} | {r['infobench_ttft_p50']:.1f} | {r['graph_p50']:.2f} | "
            f"{r['call_p90']:.1f} | {r['gpu_seconds']:,.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    rows = run(args.seeds)
    sys.stdout.write((json.dumps(rows, indent=2) if args.json else markdown(rows)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
