"""Cut NVIDIA's aiconfigurator per-op tables down to what simctl ships (run by hand).

    pip install aiconfigurator-core==0.12.0
    python -m simulator.hardware.extract [PATH/TO/aiconfigurator_core]

reads the measured tables the ``aiconfigurator-core`` wheel ships under
``aiconfigurator_core/systems/data/<gpu>/<op>/<framework>/<version>/`` (Apache-2.0; see
``data/README.md``) and writes, for every NVIDIA GPU with GEMM and attention tables and, on
it, the newest version of each framework (TensorRT-LLM, vLLM, SGLang) that measured both,
``simulator/hardware/data/<gpu>/<framework>-<version>/``:

* ``gemm.parquet`` (bf16) and ``gemm-fp8.parquet`` (per-tensor-scaled FP8): ``m, n, k, seconds``;
* ``decode_attention.parquet`` and ``prefill_attention.parquet`` with a bf16 KV cache, and
  ``decode_attention-fp8.parquet`` / ``prefill_attention-fp8.parquet`` with an FP8 one (the
  prefill's attention math in FP8 where the framework measured it so, else bf16): full
  attention only (``window_size`` 0), head dims 64 and 128;
* ``allreduce.parquet``: ``num_gpus, bytes, seconds`` of one bf16 all-reduce: at each size the
  faster of the framework's own custom all-reduce (vLLM: its CUDA-graph path; at that
  version, else the nearest earlier one) and NCCL's;
* ``moe.parquet``: the fused mixture-of-experts op per model architecture (:func:`_moe`).

Duplicate keys (several kernels measured for one shape) keep their median. The GPUs' spec
figures (bandwidth, peaks, memory, NVLink bandwidth, reserved memory) and what each backend
measured become ``gpus.json``. Latencies are converted from milliseconds to seconds; nothing
else is changed.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pandas as pd

DATA = Path(__file__).resolve().parent / "data"
SOURCE_PACKAGE = "aiconfigurator-core"
#: aiconfigurator's system name -> simctl's GPU name (NVIDIA GPUs that have GEMM and
#: attention tables; a100_pcie, h100_pcie, a30 and l4 have spec files but no tables)
GPUS = {"a100_sxm": "a100-sxm", "h100_sxm": "h100-sxm", "h200_sxm": "h200-sxm", "b200_sxm": "b200-sxm",
        "b300_sxm": "b300-sxm", "gb200": "gb200", "gb300": "gb300", "l40s": "l40s",
        "rtx_pro_6000_server": "rtx-pro-6000-server"}
#: in this order in ``gpus.json``: the first measured is the GPU's default backend
FRAMEWORKS = ("vllm", "trtllm", "sglang")
ATTENTION_KEYS = ["batch_size", "num_heads", "num_key_value_heads", "head_dim"]
DTYPES = {"bfloat16": "bf16", "fp8": "fp8"}
#: how tokens are routed to experts in the MoE tables kept, most preferred first (:func:`_moe`)
MOE_ROUTING = ["power_law_1.01", "balanced", "power_law_1.2"]
SPEC_KEYS = {"mem_bw": "memory_bandwidth_bytes_per_s", "bfloat16_tc_flops": "bf16_flops_per_s",
             "fp8_tc_flops": "fp8_flops_per_s", "mem_capacity": "memory_bytes",
             "intra_node_bw": "interconnect_bytes_per_s", "num_gpus_per_node": "gpus_per_node",
             "other_mem": "reserved_bytes"}


def _version_key(version: str) -> tuple:
    """Sortable form of ``1.3.0rc20`` / ``0.5.6.post2`` (numbers compare as numbers)."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.findall(r"\d+|[a-z]+", version))


def _versions(root: Path, op: str, framework: str) -> list[str]:
    folder = root / op / framework
    return sorted((p.name for p in folder.iterdir() if p.is_dir()), key=_version_key) if folder.is_dir() else []


def _seconds(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    out = frame.groupby(keys, as_index=False)["latency"].median()
    out["seconds"] = out.pop("latency") / 1e3
    return out.astype({k: "int64" for k in keys}).sort_values(keys).reset_index(drop=True)


def _attention(frame: pd.DataFrame, length: str, kv_dtype: str) -> pd.DataFrame:
    if "window_size" in frame:
        frame = frame[frame["window_size"] == 0]
    frame = frame[frame["head_dim"].isin([64, 128])]
    if "kv_cache_dtype" in frame:
        frame = frame[frame["kv_cache_dtype"] == kv_dtype]
    if "attn_dtype" in frame:
        # the attention math in the cache's dtype where measured so, else in bf16
        wanted = frame[frame["attn_dtype"] == kv_dtype]
        frame = wanted if len(wanted) else frame[frame["attn_dtype"] == "bfloat16"]
    return _seconds(frame, ATTENTION_KEYS + [length])


def _allreduce(root: Path, framework: str, version: str) -> tuple[pd.DataFrame, str]:
    """One bf16 all-reduce: ``num_gpus, bytes, seconds``, and where it was read.

    The framework's custom all-reduce at that version (else the newest before it, else the
    oldest after it) and NCCL's, the faster of the two at each measured size: the engines
    switch to NCCL above their custom kernel's size limit (on PCIe GPUs, much earlier)."""
    tables, names = [], []
    versions = _versions(root, "comm", framework)
    if versions:
        before = [v for v in versions if _version_key(v) <= _version_key(version)]
        chosen = before[-1] if before else versions[0]
        path = root / "comm" / framework / chosen / "custom_allreduce_perf.parquet"
        if path.is_file():
            frame = pd.read_parquet(path)
            if "backend" in frame and (frame["backend"] == "vllm_graph").any():
                frame = frame[frame["backend"] == "vllm_graph"]   # what runs inside vLLM's CUDA graphs
            frame = frame[frame["allreduce_dtype"] == "bfloat16"].assign(bytes=lambda f: 2 * f["message_size"])
            tables.append(_seconds(frame, ["num_gpus", "bytes"]))
            names.append(f"{framework} {chosen} custom all-reduce")
    nccl = _versions(root, "comm", "nccl")
    if nccl:
        frame = pd.read_parquet(root / "comm" / "nccl" / nccl[-1] / "nccl_perf.parquet")
        frame = frame[(frame["op_name"] == "all_reduce") & (frame["nccl_dtype"] == "half")]
        tables.append(_seconds(frame.assign(bytes=lambda f: 2 * f["message_size"]), ["num_gpus", "bytes"]))
        names.append(f"NCCL {nccl[-1]}")
    if not tables:
        return pd.DataFrame(columns=["num_gpus", "bytes", "seconds"]), "none"
    both = pd.concat(tables).groupby(["num_gpus", "bytes"], as_index=False)["seconds"].min()
    return both.sort_values(["num_gpus", "bytes"]).reset_index(drop=True), ", ".join(names) + " (the faster at each size)"


def _moe(root: Path, framework: str, version: str) -> tuple[pd.DataFrame, str]:
    """The fused mixture-of-experts op (routing, the experts' GEMMs, the combine) per model
    architecture: ``dtype, hidden, inter, topk, experts, tp, num_tokens, seconds``, experts
    split by tensor parallelism only (expert parallelism 1); at the framework's version, else
    the newest before it. Tokens routed as :data:`MOE_ROUTING` prefers: a power law of exponent
    1.01 over the experts (aiconfigurator's default workload, near what real routers do), else
    evenly, else the steeper power law."""
    versions = _versions(root, "moe", framework)
    before = [v for v in versions if _version_key(v) <= _version_key(version)]
    if not before or not (root / "moe" / framework / before[-1] / "moe_perf.parquet").is_file():
        return pd.DataFrame(), "none"
    chosen = before[-1]
    frame = pd.read_parquet(root / "moe" / framework / chosen / "moe_perf.parquet")
    frame = frame[frame["distribution"].isin(MOE_ROUTING) & (frame["moe_ep_size"] == 1)
                  & frame["moe_dtype"].isin(list(DTYPES))]
    frame = frame.assign(dtype=frame["moe_dtype"].map(DTYPES),
                         rank=frame["distribution"].map(MOE_ROUTING.index)).rename(columns={
        "hidden_size": "hidden", "inter_size": "inter", "num_experts": "experts", "moe_tp_size": "tp"})
    group = ["dtype", "hidden", "inter", "topk", "experts", "tp"]
    frame = frame[frame["rank"] == frame.groupby(group)["rank"].transform("min")]
    keys = ["hidden", "inter", "topk", "experts", "tp", "num_tokens"]
    out = frame.groupby(["dtype", *keys], as_index=False)["latency"].median()
    out["seconds"] = out.pop("latency") / 1e3
    return out.astype({k: "int64" for k in keys}).sort_values(["dtype", *keys]).reset_index(drop=True), \
        f"{framework} {chosen}"


def _spec(yaml_path: Path) -> dict:
    """The spec figures of a system file (plain ``key: value # comment`` lines)."""
    spec: dict = {}
    for line in yaml_path.read_text().splitlines():
        key, _, value = line.strip().partition(":")
        value = value.split("#")[0].strip()
        if key in SPEC_KEYS and value:
            spec[SPEC_KEYS[key]] = float(value)
    return spec


def extract_gpu(systems: Path, system: str, out_root: Path) -> dict:
    """Write one GPU's shipped tables; its ``gpus.json`` entry."""
    root = systems / "data" / system
    gpu = GPUS[system]
    entry = _spec(systems / f"{system}.yaml") | {"backends": [], "measured": {}}
    for framework in FRAMEWORKS:
        both = sorted(set(_versions(root, "gemm", framework)) & set(_versions(root, "attention", framework)),
                      key=_version_key)
        if not both:
            continue
        version = both[-1]
        backend = f"{framework}-{version}"
        out = out_root / gpu / backend
        out.mkdir(parents=True, exist_ok=True)
        gemm = pd.read_parquet(root / "gemm" / framework / version / "gemm_perf.parquet")
        dtypes = []
        for source, name in DTYPES.items():
            rows = gemm[gemm["gemm_dtype"] == source] if "gemm_dtype" in gemm else gemm
            if len(rows):
                suffix = "" if name == "bf16" else f"-{name}"
                _seconds(rows, ["m", "n", "k"]).to_parquet(out / f"gemm{suffix}.parquet", compression="zstd",
                                                           index=False)
                dtypes.append(name)
        attention = root / "attention" / framework / version
        decode = pd.read_parquet(attention / "generation_attention_perf.parquet")
        prefill = pd.read_parquet(attention / "context_attention_perf.parquet")
        kv = []
        for source, name in DTYPES.items():
            d, p = _attention(decode, "step", source), _attention(prefill, "isl", source)
            if len(d) and len(p):
                suffix = "" if name == "bf16" else f"-{name}"
                d.to_parquet(out / f"decode_attention{suffix}.parquet", compression="zstd", index=False)
                p.to_parquet(out / f"prefill_attention{suffix}.parquet", compression="zstd", index=False)
                kv.append(name)
        allreduce, where = _allreduce(root, framework, version)
        if len(allreduce):
            allreduce.to_parquet(out / "allreduce.parquet", compression="zstd", index=False)
        moe, moe_source = _moe(root, framework, version)
        if len(moe):
            moe.to_parquet(out / "moe.parquet", compression="zstd", index=False)
        device = str(gemm["device"].iloc[0]) if "device" in gemm else gpu
        entry["device"] = device
        entry["backends"].append(backend)
        entry["measured"][backend] = {"gemm": dtypes, "kv_cache": kv, "allreduce": where,
                                      "allreduce_gpus": sorted(int(n) for n in allreduce["num_gpus"].unique()),
                                      "moe": moe_source}
    return entry


def main(source: str | None = None) -> int:
    if source is None:
        import aiconfigurator_core  # type: ignore[import-not-found]

        source = str(Path(aiconfigurator_core.__file__).parent)
    systems = Path(source) / "systems"
    for old in DATA.iterdir():
        if old.is_dir():
            shutil.rmtree(old)
    gpus = {GPUS[s]: extract_gpu(systems, s, DATA) for s in GPUS if (systems / "data" / s).is_dir()}
    (DATA / "gpus.json").write_text(json.dumps(gpus, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
