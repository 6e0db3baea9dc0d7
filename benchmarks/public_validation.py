"""Composed service times against public measured serving figures, and the engines' host time.

Every row of ``benchmarks/data/public_serving/*.csv`` is one number a public source printed
(source URL, engine and version, GPU, TP, dtype and workload in the row; reading notes in
that folder's README). Each is predicted from the shipped per-op tables of its GPU and engine
family (:mod:`simulator.hardware`), the model's shape, and the engine's host time:

* **static batch** (``offline-batch``: ``batch_latency``, ``output_throughput`` at a stated
  batch, as ``batch · osl / (throughput · tp)`` when printed per GPU): one packed prefill of
  the batch and ``osl − 1`` decode steps of ``batch`` rows at the mean context
  ``isl + osl/2``, plus ``osl`` passes of host time;
* **first token at batch 1** (``ttft``, static batch or one client): one prefill plus one
  pass of host time;
* **serving at concurrency C** (``tpot`` / ``itl``): one decode step of C rows at
  ``isl + osl/2`` cached tokens, plus the prefills that start per step in steady state
  (``C / osl`` of them; aiconfigurator's own reading of its rows), plus one pass of host
  time.

Host time per pass is ``step_s + row_s · rows`` (:mod:`simulator.hardware.engines`): the
engine's scheduler, input preparation, sampling and detokenisation that CUDA graphs do not
hide. It is **fitted** per engine family (vLLM, TensorRT-LLM, SGLang) on a declared subset:
aiconfigurator's measured serving rows at TP 1 (:data:`FIT_SUBSET`); every other row (TP > 1,
other GPUs, other models, other sources) is out of sample. The fit's uncertainty is the
spread of the parameters over bootstrap resamples of the fitted rows.

    python benchmarks/public_validation.py [--write-docs] [--json] [--refresh-silicon PATH]

``--refresh-silicon`` rewrites ``aiconfigurator-silicon.csv`` from aiconfigurator-core's
``systems/silicon_sample.csv`` (the dense-model aggregated-serving rows simctl can compose).
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
DATA = Path(__file__).resolve().parent / "data" / "public_serving"
SILICON = DATA / "aiconfigurator-silicon.csv"
#: Hugging Face id -> simctl preset (architecture only: weights do not change timing)
MODELS = {
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b", "nvidia/Llama-3.1-8B-Instruct-FP8": "llama-3.1-8b",
    "meta-llama/Meta-Llama-3.1-8B-Instruct": "llama-3.1-8b", "meta-llama/Meta-Llama-3-8B": "llama-3.1-8b",
    "meta-llama/Llama-3.1-70B": "llama-3.1-70b", "meta-llama/Llama-3.3-70B-Instruct": "llama-3.1-70b",
    "meta-llama/Meta-Llama-3-70B-Instruct": "llama-3.1-70b", "Qwen/Qwen3-32B": "qwen3-32b",
    "meta-llama/Llama-2-7b-hf": "llama-2-7b", "meta-llama/Llama-2-13b-hf": "llama-2-13b",
    "meta-llama/Llama-2-70b-hf": "llama-2-70b", "mistralai/Mistral-7B-v0.1": "mistral-7b-v0.1",
    "mistralai/Mixtral-8x7B-v0.1": "mixtral-8x7b", "mistralai/Mixtral-8x7B-Instruct-v0.1": "mixtral-8x7b",
}
#: engine named by a source -> the family whose tables and host time price it. NVIDIA NIM
#: serves Llama on TensorRT-LLM engines (its backend is not printed; an assumption).
FAMILIES = {"vllm": "vllm", "trtllm": "trtllm", "tensorrt-llm": "trtllm", "sglang": "sglang", "nvidia-nim": "trtllm"}
#: rows whose host time is fitted: aiconfigurator's serving rows at TP 1
FIT_SUBSET = "every source's rows at TP 1"
SOURCES_ORDER = ("aiconfigurator-silicon", "vllm-perf-ci", "trtllm-perf-docs", "trtllm-h200-launch-blog",
                 "nim-llm-benchmarking")


def refresh_silicon(path: Path) -> int:
    """Write the composable rows of aiconfigurator's ``silicon_sample.csv`` in the shared layout."""
    raw = pd.read_csv(path, low_memory=False)
    raw = raw[(raw["mode"] == "agg") & raw["model_path"].isin(MODELS)]
    quant = raw["gemm_quant_mode"].fillna("bf16")
    raw = raw[quant.isin(["bf16", "fp8", "fp8_block"])]
    rows = []
    for r in raw.itertuples():
        dtype = "bf16" if pd.isna(r.gemm_quant_mode) else "fp8"
        for metric, value in (("tpot", r.silicon_tpot_ms), ("ttft", r.silicon_ttft_ms)):
            rows.append({
                "source": "aiconfigurator-silicon",
                "url": "https://github.com/ai-dynamo/aiconfigurator (aiconfigurator-core 0.12.0, "
                       "systems/silicon_sample.csv)",
                "retrieved": "2026-11-27", "engine": r.backend,
                "engine_version": "" if pd.isna(r.backend_version) else str(r.backend_version),
                "model": r.model_path, "gpu": str(r.system).replace("_", "-"), "gpu_count": int(r.tp_size),
                "tp": int(r.tp_size), "dtype": dtype, "kv_dtype": "", "mode": "serving", "isl": int(r.isl),
                "osl": int(r.osl), "batch": "", "concurrency": int(r.batch_size), "metric": metric,
                "value": float(value), "unit": "ms",
                "notes": f"row {r.id}; gemm_quant_mode {r.gemm_quant_mode}; {r.silicon_data_source}"})
    pd.DataFrame(rows).to_csv(SILICON, index=False)
    return len(rows)


def load_rows() -> pd.DataFrame:
    """Every public row simctl can compose: dense models it has a shape for, on GPUs it has
    tables of, with the figures it predicts."""
    frames = [pd.read_csv(p, dtype={"engine_version": str}) for p in sorted(DATA.glob("*.csv"))]
    rows = pd.concat(frames, ignore_index=True)
    rows = rows[rows["model"].isin(MODELS) & rows["engine"].isin(FAMILIES)].copy()
    from simulator.hardware import gpu_specs

    rows = rows[rows["gpu"].isin(gpu_specs())]
    keep = (rows["metric"].isin(["batch_latency", "tpot", "itl"])
            | ((rows["metric"] == "output_throughput") & (rows["mode"] == "offline-batch") & rows["batch"].notna())
            | ((rows["metric"] == "ttft") & ((rows["batch"] == 1) | (rows["concurrency"] == 1))))
    rows = rows[keep].copy()
    rows["preset"] = rows["model"].map(MODELS)
    rows["family"] = rows["engine"].map(FAMILIES)
    rows["dtype"] = rows["dtype"].replace({"fp16": "bf16"})   # fp16 and bf16 GEMMs run alike
    rows["measured_s"] = [_measured_seconds(r) for r in rows.itertuples()]
    return rows.reset_index(drop=True)


def _measured_seconds(r) -> float:
    """The row's figure as the seconds simctl predicts (a batch's latency, a TPOT, a TTFT)."""
    value = float(r.value) / (1e3 if r.unit == "ms" else 1.0)
    if r.metric == "output_throughput":
        per_gpu = "per GPU" in str(r.notes) or "tok/s/GPU" in str(r.notes)
        total = float(r.value) * (int(r.tp) if per_gpu else 1)
        return float(r.batch) * float(r.osl) / total
    return value


@cache
def _gpu(gpu: str, family: str, dtype: str, tp: int):
    from simulator.hardware import gpu_specs, load_gpu

    backend = next(b for b in gpu_specs()[gpu]["backends"] if b.startswith(family + "-"))
    fp8 = dtype == "fp8" and "fp8" in gpu_specs()[gpu]["measured"][backend]["gemm"]
    return load_gpu(gpu, backend, "fp8" if fp8 else "bf16", tp=tp)


@cache
def _prefill_seconds(gpu: str, family: str, dtype: str, tp: int, preset: str, isl: int, batch: int) -> float:
    """Kernel seconds of a prefill of ``batch`` prompts of ``isl`` tokens: the rows share
    about a fifth as many prefills as they compose (a TTFT and the throughputs at its length)."""
    from simulator.hardware.compose import prefill
    from simulator.harness.presets import get_preset

    return prefill(_gpu(gpu, family, dtype, tp), get_preset(preset), [isl] * batch).seconds


def compose(r) -> tuple[float, int, int]:
    """Kernel seconds of the row's figure, and the passes and rows its host time counts."""
    from simulator.hardware.compose import decode_step
    from simulator.harness.presets import get_preset

    gpu, shape = _gpu(r.gpu, r.family, r.dtype, int(r.tp)), get_preset(r.preset)
    isl, osl = int(r.isl), int(r.osl)

    def prefill_s(batch: int) -> float:
        return _prefill_seconds(r.gpu, r.family, r.dtype, int(r.tp), r.preset, isl, batch)
    if r.metric == "ttft":
        return prefill_s(1), 1, 1
    if r.mode == "offline-batch":
        b = int(r.batch)
        kernels = prefill_s(b)
        if osl > 1:
            kernels += (osl - 1) * decode_step(gpu, shape, [isl + osl // 2] * b).seconds
        return kernels, osl, b
    c = int(r.concurrency)
    step = decode_step(gpu, shape, [isl + osl // 2] * c).seconds
    return step + c / osl * prefill_s(1), 1, c


def fit_host(rows: pd.DataFrame) -> dict[str, np.ndarray]:
    """``(step_s, row_s)`` per engine family: non-negative least squares, in relative error,
    of ``measured − kernels = passes · (step_s + row_s · rows)`` over the fitted rows."""
    from scipy.optimize import nnls

    out = {}
    for family, part in rows.groupby("family"):
        design = np.column_stack([part["passes"], part["passes"] * part["rows"]]) / part["measured_s"].to_numpy()[:, None]
        target = 1 - part["kernel_s"].to_numpy() / part["measured_s"].to_numpy()
        scale = design.max(axis=0)
        coef, _ = nnls(design / scale, target)
        out[str(family)] = coef / scale
    return out


def run(bootstrap: int = 200, seed: int = 0) -> dict:
    from simulator.errors import HardwareError

    rows = load_rows()
    composed, refused = [], []
    for r in rows.itertuples():
        try:
            composed.append(compose(r))
        except HardwareError as exc:   # what the tables cannot price is counted, not guessed
            composed.append((np.nan, 0, 0))
            refused.append(f"{r.source}: {r.model} on {r.gpu} ({r.family}, {r.dtype}, TP {r.tp}): {exc}")
    keep = ~np.isnan(np.array([c[0] for c in composed], dtype=float))
    rows, composed = rows[keep].reset_index(drop=True), [c for c, k in zip(composed, keep, strict=True) if k]
    rows["kernel_s"], rows["passes"], rows["rows"] = (np.array(v, dtype=float) for v in zip(*composed, strict=True))
    rows["fitted"] = rows["tp"] == 1
    host = fit_host(rows[rows["fitted"]])
    rng = np.random.default_rng(seed)
    spread: dict[str, list] = {f: [] for f in host}
    fit_rows = rows[rows["fitted"]]
    for _ in range(bootstrap):
        sample = fit_rows.iloc[rng.integers(0, len(fit_rows), len(fit_rows))]
        for family, coef in fit_host(sample).items():
            spread[family].append(coef)
    params = {}
    for family, (step_s, row_s) in host.items():
        draws = np.array(spread[family])
        params[family] = {"step_s": float(step_s), "row_s": float(row_s),
                          "step_s_90": [float(x) for x in np.percentile(draws[:, 0], [5, 95])],
                          "row_s_90": [float(x) for x in np.percentile(draws[:, 1], [5, 95])],
                          "fitted_rows": int((fit_rows["family"] == family).sum())}
    step = rows["family"].map(lambda f: host.get(f, (0.0, 0.0))[0])
    per_row = rows["family"].map(lambda f: host.get(f, (0.0, 0.0))[1])
    rows["predicted_s"] = rows["kernel_s"] + rows["passes"] * (step + per_row * rows["rows"])
    rows["error"] = rows["predicted_s"] / rows["measured_s"] - 1
    rows["kernels_error"] = rows["kernel_s"] / rows["measured_s"] - 1
    out_of_sample = rows[~rows["fitted"]]

    def figures(part: pd.DataFrame) -> dict:
        e, k = part["error"].abs(), part["kernels_error"].abs()
        return {"rows": int(len(part)), "median": float(e.median()), "p90": float(e.quantile(0.9)),
                "median_kernels_only": float(k.median()), "signed_median": float(part["error"].median()),
                "gpus": sorted(part["gpu"].unique()), "tp": sorted(int(t) for t in part["tp"].unique()),
                "dtypes": sorted(part["dtype"].unique())}

    per_source = {s: figures(out_of_sample[out_of_sample["source"] == s])
                  for s in SOURCES_ORDER if (out_of_sample["source"] == s).any()}
    return {"host": params, "fit_subset": FIT_SUBSET, "not_composed": sorted(set(refused)), "fitted": figures(rows[rows["fitted"]]),
            "out_of_sample": figures(out_of_sample), "per_source": per_source,
            "rows": rows.drop(columns=["notes", "url"]).to_dict(orient="records")}


def markdown(r: dict) -> str:
    lines = [f"{r['out_of_sample']['rows']} out-of-sample rows from {len(r['per_source'])} public sources "
             f"(GPUs {', '.join(r['out_of_sample']['gpus'])}; TP {', '.join(map(str, r['out_of_sample']['tp']))}; "
             f"{', '.join(r['out_of_sample']['dtypes'])}): **median |error| "
             f"{100 * r['out_of_sample']['median']:.1f} %, p90 {100 * r['out_of_sample']['p90']:.1f} %** with the "
             f"fitted host time (kernels alone: median {100 * r['out_of_sample']['median_kernels_only']:.1f} %). "
             f"Target: median ≤ 8 %, p90 ≤ 15 %.", "",
             "| source | rows | GPUs | TP | dtypes | median \\|error\\| | p90 | signed median | kernels only (median) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, f in [("fitted: " + r["fit_subset"], r["fitted"]), *r["per_source"].items()]:
        lines.append(f"| {name} | {f['rows']} | {', '.join(f['gpus'])} | {', '.join(map(str, f['tp']))} | "
                     f"{', '.join(f['dtypes'])} | {100 * f['median']:.1f} % | {100 * f['p90']:.1f} % | "
                     f"{100 * f['signed_median']:+.1f} % | {100 * f['median_kernels_only']:.1f} % |")
    if r["not_composed"]:
        lines += ["", f"Rows the shipped tables cannot price (left out, not guessed): {len(r['not_composed'])} "
                      "kinds:", ""] + [f"- {why}" for why in r["not_composed"]]
    lines += ["", "Host time per pass, fitted on the TP 1 rows (5–95 % over 200 bootstrap resamples):", "",
              "| engine family | step_s | row_s | fitted rows |", "|---|---|---|---|"]
    for family, p in r["host"].items():
        lines.append(f"| {family} | {1e3 * p['step_s']:.2f} ms [{1e3 * p['step_s_90'][0]:.2f}–"
                     f"{1e3 * p['step_s_90'][1]:.2f}] | {1e6 * p['row_s']:.1f} µs [{1e6 * p['row_s_90'][0]:.1f}–"
                     f"{1e6 * p['row_s_90'][1]:.1f}] | {p['fitted_rows']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--refresh-silicon", type=Path, metavar="PATH")
    args = parser.parse_args(argv)
    if args.refresh_silicon:
        print(f"{refresh_silicon(args.refresh_silicon)} rows written to {SILICON}")
    result = run()
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=2) if args.json else markdown(result))
    if args.write_docs:
        from docs_tables import write_generated

        write_generated("public-validation", markdown(result), page="hardware.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
