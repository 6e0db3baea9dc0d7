"""The hardware cost model: exact rows, interpolation between them, tagged extrapolation,
the physical floor, and shipped tables that equal NVIDIA's measured rows."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simulator.hardware import HardwareError, gpu_specs, load_gpu
from simulator.hardware.tables import DATA, GridTable, _gemm_features

SHARED = Path(__file__).resolve().parents[2] / "shared" / "hardware" / "aiconfigurator"
needs_shared = pytest.mark.skipif(not SHARED.exists(), reason=f"the aiconfigurator extract is not at {SHARED}")


@pytest.fixture(scope="module")
def a100():
    return load_gpu("a100-sxm")


@pytest.fixture(scope="module")
def h100():
    return load_gpu("h100-sxm", "trtllm-1.3.0rc20")


def test_measured_rows_are_answered_exactly(a100):
    frame = pd.read_parquet(DATA / "a100-sxm" / "vllm-0.14.0" / "gemm.parquet").sample(50, random_state=0)
    for m, n, k, seconds in frame[["m", "n", "k", "seconds"]].itertuples(index=False):
        est = a100.gemm(m, n, k)
        assert est.tag == "exact" and est.seconds == seconds


def test_interpolation_lies_between_its_neighbours_in_log_space(a100):
    """m = 3 lies between the measured m = 2 and m = 4, at the log-space midpoint's weight."""
    lo, hi, mid = a100.gemm(2, 4096, 4096), a100.gemm(4, 4096, 4096), a100.gemm(3, 4096, 4096)
    assert (lo.tag, hi.tag, mid.tag) == ("exact", "exact", "interpolated")
    t = math.log(3 / 2) / math.log(4 / 2)
    assert mid.seconds == pytest.approx(math.exp((1 - t) * math.log(lo.seconds) + t * math.log(hi.seconds)))


def test_an_interpolation_on_a_synthetic_power_law_is_exact():
    """Latency ∝ m^a n^b k^c is linear in the logs: interpolation reproduces it exactly."""
    grid = [(m, n, k) for m in (1, 4, 16) for n in (64, 256) for k in (128, 1024)]
    law = lambda m, n, k: 1e-6 * m ** 0.7 * n ** 1.1 * k ** 0.9  # noqa: E731
    table = GridTable(pd.DataFrame([{"m": m, "n": n, "k": k, "seconds": law(m, n, k)} for m, n, k in grid]),
                      ("m", "n", "k"), _gemm_features)
    est = table.lookup((3, 100, 700))
    assert est.tag == "interpolated" and est.seconds == pytest.approx(law(3, 100, 700), rel=1e-12)


def test_lm_heads_are_extrapolated_and_stream_their_weights_at_no_more_than_spec_bandwidth(a100, h100):
    for gpu in (a100, h100):
        est = gpu.gemm(8, 151936, 2560)
        assert est.tag == "extrapolated"
        floor = 2 * 151936 * 2560 / gpu.spec["memory_bandwidth_bytes_per_s"]
        assert floor <= est.seconds < 2.5 * floor


@pytest.mark.parametrize("gpu_backend", [("a100-sxm", None), ("h100-sxm", "vllm-0.24.0"),
                                         ("h100-sxm", "trtllm-1.3.0rc20")])
def test_decode_attention_is_never_faster_than_reading_its_kv_cache(gpu_backend):
    """The physical floor: a decode step reads every cached K and V byte at least once."""
    gpu = load_gpu(*gpu_backend)
    bw = gpu.spec["memory_bandwidth_bytes_per_s"]
    for batch in (1, 8, 64, 256):
        for kv_len in (127, 1023, 4095, 16383):
            est = gpu.decode_attention(batch, kv_len, 32, 8, 128)
            floor = 2 * 2 * batch * (kv_len + 1) * 8 * 128 / bw
            assert est.seconds >= floor, (gpu_backend, batch, kv_len, est)


def test_shapes_off_the_grid_are_tagged(a100):
    assert a100.decode_attention(256, 4095, 32, 8, 128).tag == "extrapolated"   # beyond the triangular grid
    assert a100.decode_attention(8, 1000, 28, 4, 128).tag == "interpolated"     # between 24 and 32 heads
    assert a100.prefill_attention(4, 350, 32, 8, 128).tag == "interpolated"
    assert a100.elementwise(1e6).tag == "assumed"
    # more work never takes less time along an axis
    times = [a100.gemm(m, 151936, 2560).seconds for m in (1, 8, 64, 512)]
    assert times == sorted(times)


def test_unknown_gpu_or_backend_is_one_line():
    with pytest.raises(HardwareError, match="shipped: a100-sxm, h100-sxm"):
        load_gpu("b200")
    with pytest.raises(HardwareError, match="vllm-0.14.0"):
        load_gpu("a100-sxm", "trtllm-1.3.0rc20")


def test_the_interpolation_benchmark_meets_its_target():
    spec = importlib.util.spec_from_file_location(
        "hardware_interpolation", Path(__file__).resolve().parents[1] / "benchmarks" / "hardware_interpolation.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules["hardware_interpolation"] = bench
    spec.loader.exec_module(bench)
    errors = bench.trtllm_m_spacing()
    assert np.median(errors) < 0.05 and np.percentile(errors, 95) < 0.15


@needs_shared
@pytest.mark.parametrize("gpu, backend, folder", [("a100-sxm", "vllm-0.14.0", "a100_sxm/vllm-0.14.0"),
                                                  ("h100-sxm", "trtllm-1.3.0rc20", "h100_sxm/trtllm-1.3.0rc20")])
def test_shipped_tables_are_the_measured_rows(gpu, backend, folder):
    source = pd.read_parquet(SHARED / folder / "gemm_perf.parquet")
    shipped = pd.read_parquet(DATA / gpu / backend / "gemm.parquet")
    merged = source.merge(shipped, on=["m", "n", "k"])
    assert len(shipped) == source[["m", "n", "k"]].drop_duplicates().shape[0]
    np.testing.assert_allclose(merged["seconds"], merged["latency"] / 1e3, rtol=1e-12)
    spec = gpu_specs()[gpu]
    assert spec["memory_bandwidth_bytes_per_s"] in (2.039e12, 3.35e12)


def test_the_cost_model_never_reads_shared():
    text = "".join(p.read_text() for p in (Path(__file__).resolve().parents[1] / "simulator" / "hardware").glob("*.py")
                   if p.name != "extract.py")
    assert "shared" not in text


# -- one decoder iteration, composed ------------------------------------------------------

from simulator.hardware.compose import decode_step, prefill, speculative_round, verify_pass  # noqa: E402
from simulator.harness.presets import get_preset  # noqa: E402

MODELS = ("qwen3-0.6b", "qwen3-4b", "qwen3-8b", "llama-3.1-8b", "qwen2.5-0.5b", "qwen2.5-7b")


@pytest.mark.parametrize("gpu_backend", [("a100-sxm", None), ("h100-sxm", "vllm-0.24.0"),
                                         ("h100-sxm", "trtllm-1.3.0rc20")])
def test_every_composed_decode_step_is_at_least_its_physical_floor(gpu_backend):
    """Weights read once plus the KV cache read once, at the spec bandwidth: no step is faster."""
    gpu = load_gpu(*gpu_backend)
    for model in MODELS:
        shape = get_preset(model)
        for batch in (1, 4, 32, 128):
            for context in (16, 1000, 8000):
                cost = decode_step(gpu, shape, [context] * batch)
                assert cost.seconds >= cost.floor_seconds, (gpu_backend, model, batch, context)
                assert cost.seconds == pytest.approx(sum(cost.parts.values()))
                assert cost.seconds == pytest.approx(sum(cost.by_tag.values()))


def test_composition_counts_every_layer_and_grows_with_work(a100):
    shape = get_preset("qwen3-4b")
    one = decode_step(a100, shape, [500])
    h, hd, inter = shape.hidden, shape.head_dim, shape.intermediate
    per_layer = (a100.gemm(1, (shape.heads + 2 * shape.kv_heads) * hd, h).seconds + a100.gemm(1, h, shape.heads * hd).seconds
                 + a100.gemm(1, 2 * inter, h).seconds + a100.gemm(1, h, inter).seconds)
    assert one.parts["gemm"] == pytest.approx(shape.layers * per_layer)
    assert one.parts["lm_head"] == pytest.approx(a100.gemm(1, shape.vocab, h).seconds)
    assert decode_step(a100, shape, [500] * 16).seconds > one.seconds
    assert decode_step(a100, shape, [4000] * 16).seconds > decode_step(a100, shape, [500] * 16).seconds
    assert prefill(a100, shape, [350] * 4).seconds > prefill(a100, shape, [350]).seconds


def test_a_speculative_round_is_its_draft_steps_and_one_verify(a100):
    target, draft = get_preset("qwen3-4b"), get_preset("qwen3-0.6b")
    context, k = [400] * 8, 3
    spec = speculative_round(a100, target, draft, context, k)
    drafts = sum(decode_step(a100, draft, [c + j for c in context]).seconds for j in range(k))
    assert spec.seconds == pytest.approx(drafts + verify_pass(a100, target, context, k).seconds)
    # a verify of k + 1 tokens costs less than k + 1 decode steps: the weights are read once
    assert verify_pass(a100, target, context, k).seconds < (k + 1) * decode_step(a100, target, context).seconds


def test_llama_3_1_8b_preset_has_the_published_size():
    assert get_preset("llama-3.1-8b").parameters() == pytest.approx(8.03e9, rel=0.01)


@needs_shared
def test_composed_tpot_of_measured_serving_runs_is_within_ten_percent():
    """Llama-3.1-8B on H100 (TensorRT-LLM, TP 1): composed TPOT against the measured rows,
    nothing fitted (benchmarks/hardware_silicon.py writes the figure into docs/hardware.md)."""
    spec = importlib.util.spec_from_file_location(
        "hardware_silicon", Path(__file__).resolve().parents[1] / "benchmarks" / "hardware_silicon.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules["hardware_silicon"] = bench
    spec.loader.exec_module(bench)
    result = bench.run(SHARED / "silicon_sample.csv")
    assert result["rows"] == 42
    assert result["median_abs_error"] < 0.10
    assert result["decode_only_median_error"] < -0.15   # the other requests' prefills matter
