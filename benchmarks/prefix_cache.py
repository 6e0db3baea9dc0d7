"""How much prefill does prefix caching save on a real trace, and what does routing by it gain?

Replays the Mooncake FAST'25 conversation trace (``../shared/traces/real/mooncake_fast25/
conversation_trace.jsonl``: chat requests of ~12,000 prompt tokens, each with its prefix
block ids, 512 tokens a block) through one task on ``continuous`` engines, one per H100,
with the grounded ``h100-sxm-llama-3.1-8b-cuda-graph`` profile (the ``iteration`` kind of its
``infobench`` task: an iteration costs a base, per row, per prefilled token and per context
token, so the tokens a cache hit does not prefill are time saved).

Rows: no prefix caching; prefix caching with an unlimited cache and with bounded caches per
engine (``prefix_cache_size``), each with prompts dispatched by outstanding tokens
(``jsq-tokens``, which ignores the caches) and by the cached prefix (``cache-aware``:
longest cached prefix first, outstanding tokens to break ties, as llm-d's KV-cache-aware
router). Figures from the event log: hit rate (the share of admitted prompt tokens found
cached), time to first token p50 / p90 and latency p50 / p90. The profile is
deterministic, so one seed is the result. The reference engine runs these (prefix caching
is a reference-engine setting).

    python benchmarks/prefix_cache.py                 # the first 600 s, 8 GPUs
    python benchmarks/prefix_cache.py --quick         # the first 120 s, fewer rows
    python benchmarks/prefix_cache.py --write-docs    # rewrite the table in docs/prefix-caching.md and
                                                      # the README's headline row
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parent.parent
MOONCAKE = ROOT.parent / "shared" / "traces" / "real" / "mooncake_fast25" / "conversation_trace.jsonl"
PROFILE = "h100-sxm-llama-3.1-8b-cuda-graph"
TASK = "infobench"  # the profile's task whose costs the trace's requests take
#: (label, prefix caching, cache size in tokens per engine or None: unlimited)
CACHES: list[tuple[str, bool, int | None]] = [
    ("off", False, None),
    ("unlimited", True, None),
    ("2M tokens", True, 2_000_000),
    ("500k tokens", True, 500_000),
    ("100k tokens", True, 100_000),
]
QUICK = ["off", "unlimited"]
RULES = ("jsq-tokens", "cache-aware")


def run(path: Path, gpus: int, end: float, quick: bool) -> dict:
    from simulator import build_scenario, load_profile
    from simulator.metrics import summarize
    from simulator.model import simulate
    from simulator.trace.formats._requests import ImportOptions
    from simulator.trace.formats.mooncake import read_mooncake

    trace = read_mooncake(path, ImportOptions(task=TASK, end=end))
    profile = load_profile(PROFILE)
    rows = []
    for label, caching, size in CACHES:
        if quick and label not in QUICK:
            continue
        for rule in RULES if caching else RULES[:1]:
            scenario = build_scenario(run={"gpus": gpus}, defaults={
                "topology": "continuous", "dispatch": rule, "prefix_caching": caching, "prefix_cache_size": size})
            log = simulate(trace, scenario, profile, 0)
            summary = summarize(log, gpus=gpus)
            overall = summary["overall"]
            hit = summary["prefix_cache"]["hit_rate"] if caching else 0.0
            rows.append({"cache": label, "dispatch": rule, "hit_rate": hit,
                         "ttft_p50": overall["ttft"]["p50"], "ttft_p90": overall["ttft"]["p90"],
                         "p50": overall["latency"]["p50"], "p90": overall["latency"]["p90"],
                         "engine": log.attrs["engine"].split(" ")[0]})
    tokens = trace.columns.prompt_tokens
    return {"trace": f"Mooncake conversation, first {end:g} s", "calls": len(trace.columns.call_t),
            "mean_prompt_tokens": float(tokens.mean()), "blocks": int(len(trace.columns.prefix_hashes)),
            "distinct_blocks": int(len(set(trace.columns.prefix_hashes.tolist()))),
            "profile": PROFILE, "gpus": gpus, "rows": rows}


def table(result: dict) -> str:
    """The markdown table of ``result`` and the line that says how it was measured."""
    lines = ["| prefix cache per engine | dispatch | hit rate | TTFT p50 s | TTFT p90 s | latency p50 s | "
             "latency p90 s |", "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['cache']} | {r['dispatch']} | **{100 * r['hit_rate']:.1f} %** | {r['ttft_p50']:.2f} | "
                     f"{r['ttft_p90']:.2f} | {r['p50']:.2f} | {r['p90']:.2f} |")
    lines.append("")
    lines.append(
        f"{result['trace']} ({result['calls']:,} requests, {result['mean_prompt_tokens']:,.0f} prompt tokens on "
        f"average, {result['blocks']:,} prefix blocks of which {result['distinct_blocks']:,} distinct), one "
        f"`continuous` engine per GPU on {result['gpus']} GPUs, {result['profile']} profile (deterministic); "
        f"`benchmarks/prefix_cache.py`.")
    return "\n".join(lines)


#: The first cell of the README's headline row (written with ``--write-docs``).
README_ROW = "prefix caching, Mooncake conversation trace"


def readme_row(result: dict) -> str:
    """The README's headline row: hit rate and TTFT p90 without a cache, with an unlimited one
    under load-only dispatch, and under cache-aware dispatch."""
    rows = {(r["cache"], r["dispatch"]): r for r in result["rows"]}
    off, jsq, aware = rows["off", "jsq-tokens"], rows["unlimited", "jsq-tokens"], rows["unlimited", "cache-aware"]
    return (f"| {README_ROW} (first {result['calls']:,} requests, {result['gpus']} H100s, grounded Llama-3.1-8B "
            f"profile) | hit rate of an unlimited cache per engine: {100 * jsq['hit_rate']:.1f} % with jsq-tokens "
            f"dispatch, **{100 * aware['hit_rate']:.1f} %** with cache-aware dispatch; TTFT p90 "
            f"{off['ttft_p90']:.2f} s without a cache, {jsq['ttft_p90']:.2f} s, **{aware['ttft_p90']:.2f} s**; "
            f"smaller caches in the docs | `benchmarks/prefix_cache.py`, "
            f"[docs/prefix-caching.md](docs/prefix-caching.md) |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=MOONCAKE, help="the Mooncake conversation JSONL")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--end", type=float, default=None, help="keep the trace's first END seconds")
    parser.add_argument("--quick", action="store_true", help="the first 120 s, no cache and an unlimited one")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/prefix-caching.md")
    args = parser.parse_args(argv)
    if not args.trace.exists():
        raise SystemExit(f"{args.trace}: no such file (the real traces live in ../shared/traces/real)")
    end = args.end if args.end is not None else 120.0 if args.quick else 600.0
    result = run(args.trace, args.gpus, end, args.quick)
    from docs_tables import report, write_row

    if args.write_docs and not args.quick:
        write_row(README_ROW, readme_row(result), page="README.md")
    return report(result, table(result), "prefix-cache", write_docs=args.write_docs and not args.quick,
                  as_json=args.json, page="prefix-caching.md")


if __name__ == "__main__":
    raise SystemExit(main())
