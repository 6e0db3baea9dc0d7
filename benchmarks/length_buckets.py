"""Does length-aware batch forming cut padding waste on a real trace, and what does it cost?

Replays the Azure LLM inference trace 2023 (conversation, ``../shared/traces/real/
azure_llm_2023/AzureLLMInferenceTrace_conv.csv``: one request per call, prompt lengths from
a few tokens to several thousand, outputs from one to several hundred) through one task on
a ``shared`` micro-batch queue (``oldest`` window of 1 s, max batch 16) on H100 GPUs, with
the grounded ``h100-sxm-llama-3.1-8b-cuda-graph`` profile (the ``iteration`` kind of its
``infobench`` task: a static batch prefills rows × its longest prompt, then runs one decode
iteration per token of its longest output, so a batch of mixed lengths pays for its longest
row in both phases; the per-iteration base cost dominates, so small batches are dear).

Rows: 1 (one queue), 2, 4 and 8 length buckets at the trace's quantiles, ``similar-length``
selection, and 4 buckets with ``similar-length``; each with both ``batch_forming`` rules
(``eager``: every bucket queue's worker forms its batch at once and waits for the GPU;
``gpu-free``: a batch forms only when its GPU is free). Figures from the event log:
padding waste (Σ(padded − actual) / Σ padded), latency p50 / p95, mean batch size and
mean GPU utilisation. The profile is deterministic, so one seed is the result.

    python benchmarks/length_buckets.py                 # the whole hour, 3 GPUs
    python benchmarks/length_buckets.py --quick         # its first 5 minutes, fewer rows
    python benchmarks/length_buckets.py --write-docs    # rewrite the table in docs/model.md
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parent.parent
AZURE = ROOT.parent / "shared" / "traces" / "real" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
PROFILE = "h100-sxm-llama-3.1-8b-cuda-graph"
TASK = "infobench"   # the profile's task whose costs the trace's requests take
BASE = {"topology": "shared", "policy": "oldest", "flush": 1.0, "max_batch": 16}
VARIANTS: list[tuple[str, dict]] = [
    ("1 queue (fifo)", {}),
    ("2 buckets", {"length_buckets": 2}),
    ("4 buckets", {"length_buckets": 4}),
    ("8 buckets", {"length_buckets": 8}),
    ("similar-length", {"batch_selection": "similar-length"}),
    ("4 buckets + similar-length", {"length_buckets": 4, "batch_selection": "similar-length"}),
]
QUICK = ["1 queue (fifo)", "2 buckets", "similar-length"]


def run(path: Path, gpus: int, end: float | None, quick: bool) -> dict:
    from simulator import build_scenario, load_profile
    from simulator.metrics import summarize
    from simulator.model import simulate
    from simulator.trace.formats._requests import ImportOptions
    from simulator.trace.formats.azure import read_azure

    trace = read_azure(path, ImportOptions(task=TASK, end=end))
    profile = load_profile(PROFILE)
    rows = []
    for forming in ("eager", "gpu-free"):
        for name, settings in VARIANTS:
            if quick and name not in QUICK:
                continue
            scenario = build_scenario(run={"gpus": gpus}, defaults={**BASE, "batch_forming": forming, **settings})
            t0 = time.perf_counter()
            log = simulate(trace, scenario, profile, 0)
            seconds = time.perf_counter() - t0
            summary = summarize(log, gpus=gpus)
            task = summary["tasks"][TASK]
            rows.append({
                "forming": forming, "variant": name, "queues": int(log["queue"].nunique()),
                "waste": task["padding"]["waste"], "mean_batch_waste": task["padding"]["mean_batch_waste"],
                "p50": task["latency"]["p50"], "p95": task["latency"]["p95"],
                "mean_batch_size": task["mean_batch_size"],
                "utilization": sum(g["utilization"] for g in summary["gpus"]) / gpus,
                "engine": log.attrs["engine"].split(" ")[0], "replay_s": seconds,
            })
    lengths = [p.prompt_tokens + p.max_tokens for c in trace.calls for p in c.prompts]
    return {
        "trace": f"Azure LLM 2023 conv{'' if end is None else f', first {end:g} s'}",
        "calls": len(trace.calls), "span_s": trace.calls[-1].t - trace.calls[0].t,
        "length_min": min(lengths), "length_max": max(lengths),
        "profile": PROFILE, "gpus": gpus, "scenario": BASE, "rows": rows,
    }


def table(result: dict) -> str:
    """The markdown table of ``result`` and the line that says how it was measured."""
    lines = ["| batch forming | length rule | queues | padding waste | mean per batch | p50 s | p95 s | "
             "mean batch | GPU util |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['forming']} | {r['variant']} | {r['queues']} | **{100 * r['waste']:.1f} %** | "
                     f"{100 * r['mean_batch_waste']:.1f} % | {r['p50']:.2f} | {r['p95']:.2f} | "
                     f"{r['mean_batch_size']:.2f} | {100 * r['utilization']:.0f} % |")
    lines.append("")
    s = result["scenario"]
    lines.append(
        f"{result['trace']} ({result['calls']:,} requests over {result['span_s']:,.0f} s, lengths "
        f"{result['length_min']:,}–{result['length_max']:,} prompt + output tokens), one `shared` queue per "
        f"bucket ({s['policy']} window {s['flush']:g} s, max batch {s['max_batch']}) on {result['gpus']} GPUs, "
        f"{result['profile']} profile (deterministic); `benchmarks/length_buckets.py`.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=AZURE, help="the Azure 2023 conversation CSV")
    parser.add_argument("--gpus", type=int, default=3)
    parser.add_argument("--end", type=float, default=None, help="keep the trace's first END seconds")
    parser.add_argument("--quick", action="store_true", help="the first 300 s, three rules")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/model.md")
    args = parser.parse_args(argv)
    if not args.trace.exists():
        raise SystemExit(f"{args.trace}: no such file (the real traces live in ../shared/traces/real)")
    end = 300.0 if args.quick and args.end is None else args.end
    result = run(args.trace, args.gpus, end, args.quick)
    from docs_tables import report

    return report(result, table(result), "length-buckets", write_docs=args.write_docs and not args.quick,
                  as_json=args.json, page="model.md")


if __name__ == "__main__":
    raise SystemExit(main())
