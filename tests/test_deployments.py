"""Deployments beyond one bf16 GPU: every shipped GPU and backend, tensor parallelism with
measured all-reduces, FP8 GEMMs and KV caches, memory and the KV cache left, and the one-line
refusals of what cannot be composed."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from simulator.cli import app
from simulator.hardware import HardwareError, gpu_specs, load_gpu
from simulator.hardware.compose import decode_step
from simulator.hardware.memory import RUNTIME_BYTES, activation_bytes, memory_plan
from simulator.hardware.tables import DATA
from simulator.harness.presets import get_preset

runner = CliRunner()
LLAMA_70B = get_preset("llama-3.1-70b")


@pytest.mark.parametrize("gpu", sorted(gpu_specs()))
def test_every_shipped_gpu_and_backend_answers_its_measured_rows_exactly(gpu):
    spec = gpu_specs()[gpu]
    assert spec["memory_bytes"] > 0 and spec["memory_bandwidth_bytes_per_s"] > 0
    for backend in spec["backends"]:
        for dtype in spec["measured"][backend]["gemm"]:
            tables = load_gpu(gpu, backend, dtype)
            suffix = "" if dtype == "bf16" else f"-{dtype}"
            row = pd.read_parquet(DATA / gpu / backend / f"gemm{suffix}.parquet").iloc[7]
            est = tables.gemm(int(row.m), int(row.n), int(row.k))
            assert est.tag == "exact" and est.seconds == row.seconds


def test_an_allreduce_is_the_measured_row_and_free_on_one_gpu():
    gpu = load_gpu("h100-sxm", "vllm-0.24.0", tp=4)
    table = pd.read_parquet(DATA / "h100-sxm" / "vllm-0.24.0" / "allreduce.parquet")
    row = table[table.num_gpus == 4].iloc[3]
    est = gpu.allreduce(float(row.bytes))
    assert est.tag == "exact" and est.seconds == row.seconds
    assert gpu.allreduce(1e6, gpus=1).seconds == 0.0
    # more data takes longer, at a fixed group size
    assert gpu.allreduce(64e6).seconds > gpu.allreduce(64e3).seconds


def test_tensor_parallelism_splits_heads_and_mlp_and_adds_two_allreduces_a_layer():
    local = LLAMA_70B.sharded(4)
    assert (local.heads, local.kv_heads, local.intermediate, local.hidden) == (16, 2, 7168, 8192)
    assert LLAMA_70B.sharded(16).kv_heads == 1   # fewer KV heads than GPUs: replicated, one each
    one = decode_step(load_gpu("h100-sxm", tp=1), get_preset("llama-3.1-8b"), [1000] * 8)
    four = decode_step(load_gpu("h100-sxm", tp=4), get_preset("llama-3.1-8b"), [1000] * 8)
    assert "allreduce" not in one.parts and four.parts["allreduce"] > 0
    assert four.parts["gemm"] < one.parts["gemm"] / 2   # each GPU multiplies a quarter of the weights
    gpu = load_gpu("h100-sxm", tp=4)
    expected = 2 * LLAMA_70B.layers * gpu.allreduce(2 * 8 * LLAMA_70B.hidden).seconds \
        + gpu.allreduce(2 * 8 * LLAMA_70B.vocab).seconds
    assert decode_step(gpu, LLAMA_70B, [1000] * 8).parts["allreduce"] == pytest.approx(expected)


@pytest.mark.parametrize("tp, message", [(3, "does not divide its 64 attention heads"),
                                         (128, "does not divide its 64 attention heads")])
def test_a_tp_that_does_not_divide_the_heads_names_both_numbers(tp, message):
    with pytest.raises(ValueError, match=message):
        LLAMA_70B.sharded(tp)


def test_fp8_is_faster_than_bf16_where_the_tables_say_so():
    for gpu in ("h100-sxm", "h200-sxm", "b200-sxm", "l40s"):
        bf16, fp8 = load_gpu(gpu, dtype="bf16"), load_gpu(gpu, dtype="fp8")
        # the weight-streaming GEMMs of a decode step: the FP8 table measures them faster ...
        assert fp8.gemm(32, 10240, 8192).seconds < bf16.gemm(32, 10240, 8192).seconds
        # ... so the composed step is faster, and it streams half the weight bytes
        a, b = decode_step(bf16, LLAMA_70B.sharded(1), [1000] * 32), decode_step(fp8, LLAMA_70B, [1000] * 32)
        assert b.seconds < a.seconds and b.stream_bytes < 0.6 * a.stream_bytes
    with pytest.raises(HardwareError, match="measured GEMMs in bf16, not 'fp8'"):
        load_gpu("a100-sxm", dtype="fp8")


def test_memory_is_weights_activations_runtime_and_the_kv_cache_left():
    gpu = load_gpu("h100-sxm", tp=4)
    plan = memory_plan(gpu, LLAMA_70B)
    assert plan.weights_bytes == pytest.approx(LLAMA_70B.weight_bytes(4))
    assert plan.activation_bytes == pytest.approx(activation_bytes(LLAMA_70B, 4))
    assert plan.kv_bytes == pytest.approx(0.9 * gpu.spec["memory_bytes"] - plan.weights_bytes
                                          - plan.activation_bytes - RUNTIME_BYTES)
    # every GPU holds 2 of the 8 KV heads of every token, in bf16
    assert plan.kv_bytes_per_token == 2 * 80 * 2 * 128 * 2
    assert plan.kv_tokens == int(plan.kv_bytes // plan.kv_bytes_per_token)
    assert memory_plan(load_gpu("h100-sxm", dtype="fp8", tp=4), LLAMA_70B).kv_tokens > 2 * plan.kv_tokens


@pytest.mark.parametrize("gpu", ["h100-sxm", "h200-sxm"])
def test_llama_70b_composes_at_tp_4_and_8_and_is_refused_on_one_gpu(gpu):
    for tp in (4, 8):
        assert memory_plan(load_gpu(gpu, tp=tp), LLAMA_70B).kv_tokens > 100_000
    with pytest.raises(HardwareError) as err:
        memory_plan(load_gpu(gpu), LLAMA_70B)
    text = str(err.value)
    assert "141.1 GB of weights" in text and "the smallest tensor parallelism that fits: --tp 2" in text


def test_profile_cli_composes_on_new_gpus_with_tp_and_fp8(tmp_path):
    for gpu, extra in (("l40s", []), ("h200-sxm", []), ("b200-sxm", ["--dtype", "fp8"]),
                       ("h100-sxm", ["--tp", "4", "--model", "llama-3.1-70b"])):
        out = tmp_path / f"{gpu}.json"
        args = ["profile", "--gpu", gpu, "--model", "qwen3-8b", *extra, "-o", str(out)]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        data = json.loads(out.read_text())
        grounded = data["meta"]["grounded"]
        assert grounded["gpu"] == gpu and grounded["memory"]["kv_tokens"] > 0
        for task in grounded["tasks"]:
            kv = data["tasks"][task]["kv_cache"]
            assert kv["memory_gib"] * 2**30 == pytest.approx(grounded["memory"]["kv_bytes"])
    assert json.loads((tmp_path / "h100-sxm.json").read_text())["meta"]["grounded"]["tp"] == 4
    assert json.loads((tmp_path / "b200-sxm.json").read_text())["meta"]["grounded"]["dtype"] == "fp8"


@pytest.mark.parametrize("args, message", [
    (["--gpu", "h100-sxm", "--model", "llama-3.1-70b"], "does not fit h100-sxm at TP 1"),
    (["--gpu", "h100-sxm", "--model", "llama-3.1-70b", "--tp", "3"], "not 3"),
    (["--gpu", "a100-40gb", "--model", "qwen3-8b"], "no tables for GPU 'a100-40gb'; shipped: a100-sxm"),
    (["--gpu", "h100-sxm", "--model", "qwen3-8b", "--backend", "vllm-9"], "vllm-0.24.0, trtllm-1.3.0rc20"),
    (["--gpu", "l40s", "--model", "qwen3-8b", "--dtype", "fp4"], "not 'fp4'"),
])
def test_what_cannot_be_composed_is_one_line(tmp_path, args, message):
    out = tmp_path / "p.json"
    result = runner.invoke(app, ["profile", *args, "-o", str(out)])
    assert result.exit_code != 0
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not out.exists()


def test_list_gpus_shows_every_shipped_gpu():
    result = runner.invoke(app, ["profile", "--list-gpus"], terminal_width=400)
    assert result.exit_code == 0
    for gpu, spec in gpu_specs().items():
        assert gpu in result.output and spec["backends"][0] in result.output


def test_a_mixture_of_experts_is_priced_from_its_measured_moe_op():
    mixtral = get_preset("mixtral-8x7b")
    assert mixtral.parameters() == pytest.approx(46.7e9, rel=0.01)   # the published sizes
    assert get_preset("qwen3-30b-a3b").parameters() == pytest.approx(30.5e9, rel=0.01)
    gpu = load_gpu("h100-sxm", "trtllm-1.3.0rc20", tp=2)
    table = pd.read_parquet(DATA / "h100-sxm" / "trtllm-1.3.0rc20" / "moe.parquet")
    row = table[(table.dtype == "bf16") & (table.hidden == 4096) & (table.inter == 14336) & (table.topk == 2)
                & (table.experts == 8) & (table.tp == 2)].iloc[2]
    est = gpu.moe(int(row.num_tokens), 4096, 14336, 2, 8)
    assert est.tag == "exact" and est.seconds == row.seconds
    step = decode_step(gpu, mixtral, [1000] * int(row.num_tokens))
    # one measured MoE op a layer, at the step's tokens; the router's GEMM beside it
    assert step.parts["moe"] == pytest.approx(mixtral.layers * row.seconds)
    # every expert's weights are held, so Mixtral does not fit one H100 in bf16 ...
    with pytest.raises(HardwareError, match="smallest tensor parallelism that fits: --tp 2"):
        memory_plan(load_gpu("h100-sxm"), mixtral)


def test_an_unmeasured_expert_layout_or_eager_engine_is_refused_naming_what_is_known():
    odd = get_preset("mixtral-8x7b").__class__(**{**get_preset("mixtral-8x7b").to_dict(), "experts": 6})
    with pytest.raises(HardwareError, match="measured: .*8 experts × 14336, top 2"):
        decode_step(load_gpu("h100-sxm", "trtllm-1.3.0rc20"), odd, [100])
    result = runner.invoke(app, ["profile", "--gpu", "h200-sxm", "--model", "qwen3-30b-a3b", "--engine", "hf-eager",
                                 "-o", "unused.json"])
    assert result.exit_code != 0 and "mixture of experts" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_moe_config_json_reads_its_experts(tmp_path):
    from simulator.harness.presets import shape_from_config

    config = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
              "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
              "vocab_size": 151936, "num_experts": 128, "num_experts_per_tok": 8}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    shape = shape_from_config(path)
    assert (shape.intermediate, shape.experts, shape.experts_per_token) == (768, 128, 8)
    assert shape.parameters() == get_preset("qwen3-30b-a3b").parameters()
    del config["num_experts_per_tok"]
    path.write_text(json.dumps(config))
    with pytest.raises(Exception, match="num_experts_per_tok"):
        shape_from_config(path)


def test_a_named_engine_composes_from_its_own_frameworks_tables(tmp_path):
    for engine, backend in (("trtllm", "trtllm-1.3.0rc20"), ("sglang", "sglang-0.5.14"), ("cuda-graph", "vllm-0.24.0")):
        out = tmp_path / f"{engine}.json"
        result = runner.invoke(app, ["profile", "--gpu", "h200-sxm", "--model", "qwen3-8b", "--engine", engine,
                                     "-o", str(out)])
        assert result.exit_code == 0, result.output
        grounded = json.loads(out.read_text())["meta"]["grounded"]
        assert (grounded["engine"], grounded["backend"]) == (engine, backend)
