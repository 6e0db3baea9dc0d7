"""Cut NVIDIA's aiconfigurator per-op tables down to what simctl ships (run by hand).

    python -m simulator.hardware.extract PATH/TO/aiconfigurator-extract

reads the extract described in its README (source commit, licence, units) and writes
``simulator/hardware/data/<gpu>/<backend>/{gemm,decode_attention,prefill_attention}.parquet``
with the columns the cost model uses: bf16 only (as the extract), full attention only
(``window_size`` 0), head dims 64 and 128, latency converted from milliseconds to seconds.
Duplicate keys (the vLLM 0.14.0 context tables measure some MHA shapes twice) keep their
median. The system spec files become ``gpus.json``. Nothing else is changed.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pandas as pd

DATA = Path(__file__).resolve().parent / "data"
#: Shipped (gpu, backend) -> the extract's folder.
SETS = {("a100-sxm", "vllm-0.14.0"): "a100_sxm/vllm-0.14.0",
        ("h100-sxm", "vllm-0.24.0"): "h100_sxm/vllm-0.24.0",
        ("h100-sxm", "trtllm-1.3.0rc20"): "h100_sxm/trtllm-1.3.0rc20"}
ATTENTION_KEYS = ["batch_size", "num_heads", "num_key_value_heads", "head_dim"]


def _attention(frame: pd.DataFrame, length: str) -> pd.DataFrame:
    if "window_size" in frame:
        frame = frame[frame["window_size"] == 0]
    frame = frame[frame["head_dim"].isin([64, 128])]
    keys = ATTENTION_KEYS + [length]
    out = frame.groupby(keys, as_index=False)["latency"].median()
    out["seconds"] = out.pop("latency") / 1e3
    return out.astype({k: "int64" for k in keys}).sort_values(keys).reset_index(drop=True)


def main(source: str) -> int:
    src = Path(source)
    for (gpu, backend), folder in SETS.items():
        out = DATA / gpu / backend
        out.mkdir(parents=True, exist_ok=True)
        gemm = pd.read_parquet(src / folder / "gemm_perf.parquet")
        gemm = gemm.groupby(["m", "n", "k"], as_index=False)["latency"].median()
        gemm["seconds"] = gemm.pop("latency") / 1e3
        gemm.astype({"m": "int64", "n": "int64", "k": "int64"}).to_parquet(out / "gemm.parquet", compression="zstd",
                                                                            index=False)
        decode = pd.read_parquet(src / folder / "generation_attention_perf.parquet")
        _attention(decode, "step").to_parquet(out / "decode_attention.parquet", compression="zstd", index=False)
        prefill = pd.read_parquet(src / folder / "context_attention_perf.parquet")
        _attention(prefill, "isl").to_parquet(out / "prefill_attention.parquet", compression="zstd", index=False)
    gpus = {}
    for gpu, name in (("a100-sxm", "a100_sxm"), ("h100-sxm", "h100_sxm")):
        spec = {}
        for line in (src / "systems" / f"{name}.yaml").read_text().splitlines():
            key, _, value = line.strip().partition(":")
            if key in ("mem_bw", "bfloat16_tc_flops", "mem_capacity") and value.split("#")[0].strip():
                spec[key] = float(value.split("#")[0])
        gpus[gpu] = {"memory_bandwidth_bytes_per_s": spec["mem_bw"], "bf16_flops_per_s": spec["bfloat16_tc_flops"],
                     "memory_bytes": spec["mem_capacity"],
                     "backends": [b for (g, b) in SETS if g == gpu]}
    (DATA / "gpus.json").write_text(json.dumps(gpus, indent=1) + "\n")
    shutil.copy(src / "LICENSE", DATA / "LICENSE")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
