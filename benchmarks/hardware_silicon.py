"""Composed TPOT against measured serving runs (not fitted): Llama-3.1-8B on one H100.

``silicon_sample.csv`` (NVIDIA aiconfigurator, in ``../shared/hardware/aiconfigurator``; the
product never reads it) holds TensorRT-LLM serving benchmarks of Llama-3.1-8B at TP 1: input
and output lengths, client concurrency C and the measured TPOT. Each is predicted from the
H100 TensorRT-LLM per-op tables alone, nothing fitted:

    TPOT ≈ decode_step(C rows at isl + osl/2 cached tokens) + (C / osl) · prefill(isl)

A request lives about ``osl`` decode steps, so in steady state C/osl other requests start
(and prefill) per step; a decode-only composition misses them. Engine overheads (the CPU's
part of a step) are not modelled yet.

    python benchmarks/hardware_silicon.py [--write-docs] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
SOURCE = Path(__file__).resolve().parents[2] / "shared" / "hardware" / "aiconfigurator" / "silicon_sample.csv"


def run(source: Path = SOURCE) -> dict:
    import pandas as pd

    from simulator.hardware import load_gpu
    from simulator.hardware.compose import decode_step, prefill
    from simulator.harness.presets import get_preset

    rows = pd.read_csv(source, low_memory=False)
    rows = rows[rows["model_path"].str.contains("Llama-3.1-8B") & (rows["tp_size"] == 1) & (rows["system"] == "h100_sxm")]
    gpu, shape = load_gpu("h100-sxm", "trtllm-1.3.0rc20"), get_preset("llama-3.1-8b")
    decode_only, with_prefills = [], []
    for r in rows.itertuples():
        concurrency, isl, osl = int(r.batch_size), int(r.isl), int(r.osl)
        step = decode_step(gpu, shape, [isl + osl // 2] * concurrency).seconds
        tpot = step + concurrency / osl * prefill(gpu, shape, [isl]).seconds
        decode_only.append(1e3 * step / r.silicon_tpot_ms - 1)
        with_prefills.append(1e3 * tpot / r.silicon_tpot_ms - 1)
    a, b = np.array(decode_only), np.array(with_prefills)
    return {"rows": int(len(rows)), "decode_only_median_error": float(np.median(a)),
            "median_abs_error": float(np.median(np.abs(b))), "p90_abs_error": float(np.percentile(np.abs(b), 90)),
            "median_error": float(np.median(b)), "backend_measured": sorted(set(rows["backend_version"].astype(str)))}


def markdown(r: dict) -> str:
    return (f"Llama-3.1-8B on one H100, {r['rows']} TensorRT-LLM serving runs ({', '.join(r['backend_measured'])}; "
            f"input 1k–4k, output 128–512 tokens, concurrency 8–128), TPOT composed from the per-op tables, "
            f"nothing fitted: **median absolute error {100 * r['median_abs_error']:.1f} %**, p90 "
            f"{100 * r['p90_abs_error']:.1f} %, median signed {100 * r['median_error']:+.1f} % (target: median "
            f"< 10 %). Without the other requests' prefills the composition is {100 * r['decode_only_median_error']:+.0f} % "
            f"at the median.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args(argv)
    if not SOURCE.exists():
        sys.stderr.write(f"the measured rows are not at {SOURCE}\n")
        return 2
    result = run()
    print(json.dumps(result, indent=2) if args.json else markdown(result))
    if args.write_docs:
        from docs_tables import write_generated

        write_generated("hardware-silicon", markdown(result), page="hardware.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
