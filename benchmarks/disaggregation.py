"""Prefill/decode disaggregation against aggregated engines on a real long-prompt trace.

Replays the Mooncake FAST'25 conversation trace (``../shared/traces/real/mooncake_fast25/
conversation_trace.jsonl``: chat requests of ~12,000 prompt tokens) through one task with the
grounded ``h100-sxm-llama-3.1-8b-cuda-graph`` profile (the ``iteration`` kind of its
``infobench`` task: an iteration costs a base, per row, per prefilled token and per context
token), on N H100s:

* ``aggregated``: a ``continuous`` engine per GPU, every GPU prefilling and decoding;
* ``xPyD``: ``disaggregated`` with x prefill GPUs and y = N − x decode GPUs, for every split,
  over NVLink (900 GB/s) and over InfiniBand NDR (50 GB/s).

The profile states no KV bytes per token; Llama-3.1-8B holds 32 layers × 8 KV heads × 128
dims × 2 (K and V) × 2 bytes = 131,072 bytes per token, given as ``kv_bytes_per_token``.
Prompts are dispatched by outstanding tokens (``jsq-tokens``) in every layout. Figures from
the event log: TTFT p50 / p90, TPOT p50 / p90, latency p90, and whether each layout meets a
TTFT p90 and a TPOT p90 objective (``--ttft-slo``, ``--tpot-slo``). The profile is
deterministic, so one seed is the result. The reference engine runs these (disaggregation is
a reference-engine topology).

    python benchmarks/disaggregation.py                 # the first 600 s, 8 GPUs
    python benchmarks/disaggregation.py --quick         # the first 20 s on 4 GPUs, NVLink only
    python benchmarks/disaggregation.py --write-docs    # rewrite the table in docs/disaggregation.md
"""

from __future__ import annotations

import argparse
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parent.parent
MOONCAKE = ROOT.parent / "shared" / "traces" / "real" / "mooncake_fast25" / "conversation_trace.jsonl"
PROFILE = "h100-sxm-llama-3.1-8b-cuda-graph"
TASK = "infobench"  # the profile's task whose costs the trace's requests take
LLAMA_KV_BYTES = 32 * 8 * 128 * 2 * 2  # 131,072
LINKS = ("nvlink", "infiniband")


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run(path: Path, gpus: int, end: float, links: tuple[str, ...], ttft_slo: float, tpot_slo: float) -> dict:
    from simulator import build_scenario, load_profile
    from simulator.metrics import summarize
    from simulator.model import simulate
    from simulator.trace.formats._requests import ImportOptions
    from simulator.trace.formats.mooncake import read_mooncake

    trace = read_mooncake(path, ImportOptions(task=TASK, end=end))
    profile = load_profile(PROFILE)
    layouts: list[tuple[str, str, dict]] = [("aggregated", "", {"topology": "continuous"})]
    for link in links:
        for x in range(1, gpus):
            layouts.append((f"{x}P{gpus - x}D", link, {"topology": "disaggregated", "prefill_gpus": x,
                                                       "kv_link": link, "kv_bytes_per_token": LLAMA_KV_BYTES}))
    rows = []
    for layout, link, settings in layouts:
        start = cpu_seconds()
        scenario = build_scenario(run={"gpus": gpus}, defaults={"dispatch": "jsq-tokens", **settings})
        log = simulate(trace, scenario, profile, 0)
        overall = summarize(log, gpus=gpus)["overall"]
        transfer = log["transfer_s"].mean() if "transfer_s" in log else 0.0
        row = {"layout": layout, "link": link, "prompts": overall["prompts"], "completed": overall["completed"],
               "ttft_p50": overall["ttft"]["p50"], "ttft_p90": overall["ttft"]["p90"],
               "tpot_p50": overall["tpot"]["p50"], "tpot_p90": overall["tpot"]["p90"],
               "latency_p90": overall["latency"]["p90"], "transfer_mean": float(transfer),
               "cpu_s": cpu_seconds() - start, "engine": log.attrs["engine"].split(" ")[0]}
        row["meets_ttft"] = row["ttft_p90"] <= ttft_slo
        row["meets_tpot"] = row["tpot_p90"] <= tpot_slo
        rows.append(row)
    tokens = trace.columns.prompt_tokens
    return {"trace": f"Mooncake conversation, first {end:g} s", "calls": len(trace.columns.call_t),
            "mean_prompt_tokens": float(tokens.mean()), "profile": PROFILE, "gpus": gpus,
            "kv_bytes_per_token": LLAMA_KV_BYTES, "ttft_slo": ttft_slo, "tpot_slo": tpot_slo,
            "best": best(rows), "rows": rows}


def best(rows: list[dict]) -> str | None:
    """The layout that meets both objectives with the lowest TTFT p90 (``None``: none does)."""
    both = [r for r in rows if r["meets_ttft"] and r["meets_tpot"]]
    if not both:
        return None
    top = min(both, key=lambda r: r["ttft_p90"])
    return f"{top['layout']} {top['link']}".strip()


def table(result: dict) -> str:
    """The markdown table of ``result`` and the lines that say how it was measured."""
    lines = ["| layout | KV link | TTFT p50 s | TTFT p90 s | TPOT p50 ms | TPOT p90 ms | latency p90 s | "
             "transfer mean ms | meets TTFT | meets TPOT |", "|---|---|---|---|---|---|---|---|---|---|"]

    def mark(ok: bool) -> str:
        return "yes" if ok else "no"

    for r in result["rows"]:
        lines.append(f"| {r['layout']} | {r['link'] or '—'} | {r['ttft_p50']:.2f} | {r['ttft_p90']:.2f} | "
                     f"{1000 * r['tpot_p50']:.1f} | {1000 * r['tpot_p90']:.1f} | {r['latency_p90']:.1f} | "
                     f"{1000 * r['transfer_mean']:.2f} | {mark(r['meets_ttft'])} | {mark(r['meets_tpot'])} |")
    lines.append("")
    lines.append(
        f"{result['trace']} ({result['calls']:,} requests, {result['mean_prompt_tokens']:,.0f} prompt tokens on "
        f"average) on {result['gpus']} GPUs, {result['profile']} profile (deterministic), "
        f"kv_bytes_per_token {result['kv_bytes_per_token']:,} (Llama-3.1-8B, 16 bits), jsq-tokens dispatch; "
        f"objectives TTFT p90 ≤ {result['ttft_slo']:g} s and TPOT p90 ≤ {1000 * result['tpot_slo']:g} ms. "
        f"Best meeting both (lowest TTFT p90): **{result['best'] or 'none'}**. `benchmarks/disaggregation.py`.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=MOONCAKE, help="the Mooncake conversation JSONL")
    parser.add_argument("--gpus", type=int, default=None, help="GPUs in all (default 8; 4 with --quick)")
    parser.add_argument("--end", type=float, default=None, help="keep the trace's first END seconds")
    parser.add_argument("--ttft-slo", type=float, default=2.0, help="TTFT p90 objective, seconds")
    parser.add_argument("--tpot-slo", type=float, default=0.02, help="TPOT p90 objective, seconds")
    parser.add_argument("--quick", action="store_true", help="the first 20 s on 4 GPUs, NVLink only")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/disaggregation.md")
    args = parser.parse_args(argv)
    if not args.trace.exists():
        raise SystemExit(f"{args.trace}: no such file (the real traces live in ../shared/traces/real)")
    end = args.end if args.end is not None else 20.0 if args.quick else 600.0
    gpus = args.gpus if args.gpus is not None else 4 if args.quick else 8
    result = run(args.trace, gpus, end, LINKS[:1] if args.quick else LINKS, args.ttft_slo, args.tpot_slo)
    from docs_tables import report

    return report(result, table(result), "disaggregation", write_docs=args.write_docs and not args.quick,
                  as_json=args.json, page="disaggregation.md")


if __name__ == "__main__":
    raise SystemExit(main())
