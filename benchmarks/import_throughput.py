"""How many single-prompt calls per CPU-second does ``load_trace`` read, per format?

Writes synthetic files of ``--rows`` one-prompt calls (Poisson arrivals, lognormal token
counts) in simctl's native JSON, its Parquet form, the users' client JSON and the Azure CSV,
BurstGPT CSV and Mooncake JSONL layouts to a temporary folder, then times ``load_trace`` on
each, in CPU seconds of this process (``time.process_time``: other work on the machine does
not count), to the trace's columns, ready for the engine: parsing, checking every record,
sorting and building the trace. A library call, not a whole command (no start-up).

    python benchmarks/import_throughput.py                        # 200,000 and 1,000,000 calls
    python benchmarks/import_throughput.py --rows 20000           # one size, quick
    python benchmarks/import_throughput.py --write-docs           # figures into docs/traces.md
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

sys.path.insert(0, str(Path(__file__).resolve().parent))


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
    from simulator.trace.formats import save_trace
    from simulator.trace.model import Trace, TraceColumns, id_column

    # The M/M/c form: one-prompt calls of one task, no token counts (the engine's defaults).
    columns = TraceColumns.of_sizes(
        call_t=t, call_ids=id_column([str(i) for i in range(rows)]), sizes=np.ones(rows, dtype=np.int64),
        task_names=("q",), task_of=np.zeros(rows, dtype=np.int32), prompt_tokens=np.full(rows, -1, dtype=np.int32),
        max_tokens=np.zeros(rows, dtype=np.int32))
    trace = Trace(columns=columns)
    files["native"] = save_trace(trace, folder / "native.json")
    files["parquet"] = save_trace(trace, folder / "native.parquet", format="parquet")
    if rows <= CLIENT_ROWS:
        files["client"] = save_trace(trace.renamed({"q": "mmlu"}), folder / "client.json", format="client")
    return files


#: The largest client-format file written (its reader classifies every prompt text).
CLIENT_ROWS = 200_000
FORMATS = ("parquet", "native", "client", "azure", "burstgpt", "mooncake")
LABELS = {"parquet": "Parquet (simctl-trace/1)", "native": "native JSON (simctl-trace/1)",
          "client": "client JSON (batch_arrivals)", "azure": "Azure CSV", "burstgpt": "BurstGPT CSV",
          "mooncake": "Mooncake JSONL"}


#: Reads a figure is the best of: a read of 1,000,000 calls takes a few tenths of a CPU-second,
#: and on a shared machine the CPU time of one read swings by a third with the other work
#: (the caches and cores it shares), so the figure is the read least disturbed.
REPEAT = 7


def run(rows: int, repeat: int = 1) -> dict:
    """Per format: CPU seconds of ``load_trace`` (best of ``repeat``) and calls per CPU-second."""
    import warnings

    from simulator.trace.formats import load_trace

    out: dict = {"rows": rows}
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in write_inputs(Path(tmp), rows).items():
            best = float("inf")
            for _ in range(repeat):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # (the client texts' placeholder tasks)
                    t0 = time.process_time()
                    trace = load_trace(path)
                    trace.columns  # noqa: B018  (ready for the engine)
                    best = min(best, time.process_time() - t0)
            assert len(trace) == rows
            out[name] = {"seconds": best, "rows_per_s": rows / best}
    return out


def table(results: list[dict]) -> str:
    """The docs block: calls per CPU-second, per format and size."""
    sizes = [r["rows"] for r in results]
    lines = ["| format | " + " | ".join(f"{n:,} calls" for n in sizes) + " |",
             "|---|" + "---:|" * len(sizes)]
    for name in FORMATS:
        cells = [f"{r[name]['rows_per_s'] / 1e6:.2f} M/s" if name in r else "–" for r in results]
        lines.append(f"| {LABELS[name]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + ("\n\nSingle-prompt calls read per CPU-second by `load_trace` (a library call) "
                               f"to columns ready for the engine, best of {REPEAT}; written by "
                               "`python benchmarks/import_throughput.py --write-docs`.\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=None, help="one size only (default: 200,000 and 1,000,000)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write-docs", action="store_true", help="write the figures into docs/traces.md")
    args = parser.parse_args(argv)
    if args.rows is not None:
        result = run(args.rows)
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            print(table([result]))
        return 0
    from docs_tables import report

    results = [run(n, repeat=REPEAT) for n in (200_000, 1_000_000)]
    if args.write_docs:
        from docs_tables import write_row

        big = results[-1]
        row = (
            f"| trace reading (library call), {big['rows']:,} single-prompt calls | **{big['parquet']['rows_per_s'] / 1e6:.1f} M "
            f"calls/s** Parquet, {big['native']['rows_per_s'] / 1e6:.1f} M native JSON, "
            f"{big['azure']['rows_per_s'] / 1e6:.1f} M Azure CSV, {big['burstgpt']['rows_per_s'] / 1e6:.1f} M BurstGPT, "
            f"{big['mooncake']['rows_per_s'] / 1e6:.1f} M Mooncake JSONL, per CPU-second | "
            "`benchmarks/import_throughput.py`")
        write_row("trace reading", row + " |")
        write_row("trace reading", row + ", [docs/traces.md](docs/traces.md) |", page="README.md")
    return report({"sizes": results}, table(results), "trace-reading", write_docs=args.write_docs,
                  as_json=args.json, page="traces.md")


if __name__ == "__main__":
    sys.exit(main())
