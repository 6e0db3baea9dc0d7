"""How well do the shipped per-op GPU tables answer shapes they did not measure?

Two checks of :mod:`simulator.hardware` (log-space multilinear interpolation), on every
shipped table (GPU, backend, op):

* **leave one out**: each interior grid value of each axis is dropped in turn and its rows
  are interpolated from the values either side (this doubles the gap, so it reads worse than
  interpolation on the full grid);
* **the A100 grid's spacing on H100 TRT-LLM GEMMs**: rows at m = 3, 5–7, 9–15 predicted from
  m ∈ {1, 2, 4, 8, 16} alone (target: median < 5 %, p95 < 15 %).

    python benchmarks/hardware_interpolation.py              # print the tables
    python benchmarks/hardware_interpolation.py --write-docs # and write them into docs/hardware.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def leave_one_out(table) -> np.ndarray:
    """Relative errors of interpolating each interior grid value of each axis from its neighbours."""
    values = table.log_values
    errors = []
    for axis, grid in enumerate(table.grid):
        logs = np.log(grid)
        for i in range(1, len(grid) - 1):
            t = (logs[i] - logs[i - 1]) / (logs[i + 1] - logs[i - 1])
            lo, mid, hi = (np.take(values, j, axis=axis) for j in (i - 1, i, i + 1))
            predicted = (1 - t) * lo + t * hi
            ok = ~(np.isnan(lo) | np.isnan(mid) | np.isnan(hi))
            errors.append(np.abs(np.exp(predicted[ok] - mid[ok]) - 1))
    return np.concatenate(errors) if errors else np.array([])


def trtllm_m_spacing() -> np.ndarray:
    """Relative errors at m = 3, 5–7, 9–15 of H100 TRT-LLM GEMMs interpolated from m ∈ {1, 2, 4, 8, 16}."""
    import pandas as pd

    from simulator.hardware.tables import DATA, GridTable, _gemm_features

    frame = pd.read_parquet(DATA / "h100-sxm" / "trtllm-1.3.0rc20" / "gemm.parquet")
    coarse = GridTable(frame[frame["m"].isin([1, 2, 4, 8, 16])], ("m", "n", "k"), _gemm_features)
    target = frame[frame["m"].isin([3, 5, 6, 7, *range(9, 16)])]
    predicted = np.array([coarse.lookup(p).seconds for p in target[["m", "n", "k"]].to_numpy()])
    return np.abs(predicted / target["seconds"].to_numpy() - 1)


def run() -> dict:
    from simulator.hardware import gpu_specs, load_gpu

    rows = []
    for gpu, spec in gpu_specs().items():
        for backend in spec["backends"]:
            tables = load_gpu(gpu, backend)
            for op, table in (("gemm", tables.gemm_table), ("decode attention", tables.decode_table),
                              ("prefill attention", tables.prefill_table)):
                err = leave_one_out(table)
                rows.append({"gpu": gpu, "backend": backend, "op": op, "points": int(err.size),
                             "median": float(np.median(err)), "p95": float(np.percentile(err, 95))})
    spacing = trtllm_m_spacing()
    return {"leave_one_out": rows, "trtllm_m_spacing": {"points": int(spacing.size), "median": float(np.median(spacing)),
                                                         "p95": float(np.percentile(spacing, 95))}}


def markdown(result: dict) -> str:
    s = result["trtllm_m_spacing"]
    lines = [f"H100 TensorRT-LLM GEMMs at m = 3, 5–7, 9–15 from m ∈ {{1, 2, 4, 8, 16}} only: "
             f"**median {100 * s['median']:.1f} %, p95 {100 * s['p95']:.1f} %** over {s['points']:,} rows "
             f"(target: median < 5 %, p95 < 15 %).", "",
             "Leave one out (each interior grid value dropped, its rows interpolated from the values either side):", "",
             "| GPU | backend | op | rows | median error | p95 error |", "|---|---|---|---|---|---|"]
    for r in result["leave_one_out"]:
        lines.append(f"| {r['gpu']} | {r['backend']} | {r['op']} | {r['points']:,} | {100 * r['median']:.1f} % "
                     f"| {100 * r['p95']:.1f} % |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args(argv)
    result = run()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(markdown(result))
    if args.write_docs:
        from docs_tables import write_generated

        write_generated("hardware-interpolation", markdown(result), page="hardware.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
