"""How many rows per second do the production-trace importers read?

Writes synthetic files in the Azure CSV, BurstGPT CSV and Mooncake JSONL layouts (``--rows``
requests each, Poisson arrivals, lognormal token counts) to a temporary folder, then times
``load_trace`` on each: parsing, checking every row, sorting and building the trace.

    python benchmarks/import_throughput.py                # 1,000,000 rows per format
    python benchmarks/import_throughput.py --rows 20000   # quick
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd


def write_inputs(folder: Path, rows: int) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    t = np.cumsum(rng.exponential(0.05, rows))
    ctx = np.maximum(1, rng.lognormal(6, 1, rows)).astype(int)
    gen = np.maximum(0, rng.lognormal(4, 1, rows)).astype(int)
    stamps = pd.Timestamp("2024-05-10") + pd.to_timedelta(t, unit="s")
    files = {"azure": folder / "azure.csv", "burstgpt": folder / "burstgpt.csv", "mooncake": folder / "mooncake.jsonl"}
    pd.DataFrame({"TIMESTAMP": stamps.strftime("%Y-%m-%d %H:%M:%S.%f"), "ContextTokens": ctx,
                  "GeneratedTokens": gen}).to_csv(files["azure"], index=False)
    pd.DataFrame({"Timestamp": np.floor(t).astype(int), "Model": np.where(rng.random(rows) < 0.8, "ChatGPT", "GPT-4"),
                  "Request tokens": ctx, "Response tokens": gen + 1, "Total tokens": ctx + gen + 1,
                  "Log Type": "Conversation log"}).to_csv(files["burstgpt"], index=False)
    with open(files["mooncake"], "w") as fh:
        for ms, a, b in zip((t * 1000).astype(int).tolist(), ctx.tolist(), gen.tolist(), strict=True):
            fh.write(json.dumps({"timestamp": ms, "input_length": a, "output_length": b, "hash_ids": [0, 1]}) + "\n")
    return files


def run(rows: int) -> dict:
    from simulator.trace.formats import load_trace

    out = {"rows": rows}
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in write_inputs(Path(tmp), rows).items():
            t0 = time.perf_counter()
            trace = load_trace(path)
            seconds = time.perf_counter() - t0
            assert len(trace) == rows
            out[name] = {"seconds": seconds, "rows_per_s": rows / seconds}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.rows)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for name in ("azure", "burstgpt", "mooncake"):
            r = result[name]
            print(f"{name:9s} {args.rows:,} rows in {r['seconds']:.2f} s: {r['rows_per_s']:,.0f} rows/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
