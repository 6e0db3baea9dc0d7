"""A device's own op tables: measured by the harness (``simctl profile --measure-ops``),
read back by the hardware model exactly, and composed in the ``harness`` style, whose op
list is the one the decoder runs (structure only: no test here depends on timings)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from simulator.hardware import Estimate, HardwareError, load_gpu
from simulator.hardware.compose import (
    HARNESS_CACHED_ATTENTION_KERNELS,
    HARNESS_HEAD_VIEWS,
    HARNESS_LAYER_VIEWS,
    STYLES,
    Pass,
    StepCost,
    decode_step,
    speculative_round,
    verify_pass,
)
from simulator.hardware.tables import DATA, SPEC_FILE, GpuTables
from simulator.harness.presets import PRESETS

TORCH = "the harness needs torch (pip install torch==2.13.0)"
TINY = PRESETS["tiny"]


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Path:
    """Tables of this CPU for the tiny preset, written by ``simctl profile --measure-ops --quick``."""
    pytest.importorskip("torch", reason=TORCH)
    from typer.testing import CliRunner

    from simulator.cli import app

    out = tmp_path_factory.mktemp("optable") / "cpu"
    result = CliRunner().invoke(app, ["profile", "--measure-ops", str(out), "--quick", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    return out


# -- the folder, read back ----------------------------------------------------------------


def test_a_measured_folder_has_the_shipped_layout(measured):
    shipped = DATA / "a100-sxm" / "vllm-0.14.0"
    for name in ("gemm", "decode_attention", "prefill_attention"):
        ours, theirs = pd.read_parquet(measured / f"{name}.parquet"), pd.read_parquet(shipped / f"{name}.parquet")
        assert list(ours.columns) == list(theirs.columns)
        assert list(ours.dtypes) == list(theirs.dtypes)
        assert len(ours) > 0
    spec = json.loads((measured / SPEC_FILE).read_text())
    assert spec["dtype"] == "float32" and spec["dtype_bytes"] == 4 and spec["threads"] >= 1
    assert spec["memory_bandwidth_bytes_per_s"] > 0 and spec["flops_per_s"] > 0
    assert spec["torch"] and spec["device"].startswith("CPU")
    assert {"add", "mul", "rsqrt", "softmax", "exponential", "argmax"} <= set(spec["elementwise"]["ops"])
    assert set(spec["host"]) == {"view_s", "module_s"}


def test_a_measured_folder_answers_its_rows_exactly(measured):
    gpu = load_gpu(measured)
    assert isinstance(gpu, GpuTables) and load_gpu(str(measured)).spec == gpu.spec
    for m, n, k, seconds in pd.read_parquet(measured / "gemm.parquet").itertuples(index=False):
        assert gpu.gemm(m, n, k) == Estimate(seconds, "exact")
    decode = pd.read_parquet(measured / "decode_attention.parquet")
    for r in decode.itertuples(index=False):
        est = gpu.decode_attention(r.batch_size, r.step, r.num_heads, r.num_key_value_heads, r.head_dim)
        assert est == Estimate(r.seconds, "exact")
    for r in pd.read_parquet(measured / "prefill_attention.parquet").itertuples(index=False):
        est = gpu.prefill_attention(r.batch_size, r.isl, r.num_heads, r.num_key_value_heads, r.head_dim)
        assert est == Estimate(r.seconds, "exact")
    for r in pd.read_parquet(measured / "verify_attention.parquet").itertuples(index=False):
        est = gpu.verify_attention(r.batch_size, r.step, r.tokens, r.num_heads, r.num_key_value_heads, r.head_dim)
        assert est == Estimate(r.seconds, "exact")
    for op, entry in gpu.spec["elementwise"]["ops"].items():
        for nbytes, seconds in entry["points"]:
            assert gpu.elementwise(nbytes, op) == Estimate(seconds, "exact")


def test_elementwise_answers_say_how_they_were_obtained(measured):
    gpu = load_gpu(measured)
    sizes = sorted(b for b, _ in gpu.spec["elementwise"]["ops"]["add"]["points"])
    assert gpu.elementwise((sizes[0] + sizes[1]) / 2, "add").tag == "interpolated"
    assert gpu.elementwise(10 * sizes[-1], "add").tag == "extrapolated"
    assert gpu.elementwise(sizes[1], "cumprod").tag == "assumed"          # an op the folder did not time
    assert gpu.elementwise(sizes[1]).tag in ("exact", "interpolated")       # the pooled streaming ops
    assert gpu.host("view").seconds == gpu.spec["host"]["view_s"]


def test_shipped_gpus_answer_as_before():
    """The extensions leave the shipped tables' answers alone: elementwise whatever the op,
    verify attention as a decode step, no host cost."""
    a100 = load_gpu("a100-sxm")
    assert a100.elementwise(4096, "exponential") == a100.elementwise(4096)
    assert a100.elementwise(4096).tag == "assumed"
    assert a100.verify_attention(8, 1000, 4, 32, 8, 128) == a100.decode_attention(8, 1003, 32, 8, 128)
    assert a100.host("view") == Estimate(0.0, "assumed")


def test_a_folder_that_is_not_measured_tables_is_one_line(tmp_path):
    with pytest.raises(HardwareError, match="not a folder of measured op tables") as err:
        load_gpu(tmp_path)
    assert "\n" not in str(err.value)
    (tmp_path / SPEC_FILE).write_text("[1, 2]")
    with pytest.raises(HardwareError, match="expected a JSON object"):
        load_gpu(tmp_path)
    (tmp_path / SPEC_FILE).write_text(json.dumps({"device": "x", "memory_bandwidth_bytes_per_s": 1.0}))
    with pytest.raises(HardwareError, match="gemm.parquet is missing"):
        load_gpu(tmp_path)
    with pytest.raises(HardwareError, match="no tables for GPU 'no-such-gpu'"):
        load_gpu("no-such-gpu")


def test_measure_ops_refuses_bad_input_in_one_line(measured, tmp_path):
    from typer.testing import CliRunner

    from simulator.cli import app

    runner = CliRunner()
    for args, message in ((["--measure-ops", str(measured), "--quick"], "use --force"),
                          (["--measure-ops", str(tmp_path / "x"), "--model", "no-such-model"], "unknown model preset"),
                          (["--measure-ops", str(tmp_path / "x"), "--gpu", "a100-sxm"], "takes a CUDA device index"),
                          (["--measure-ops", str(tmp_path / "x"), "--threads", "0"], "greater than or equal to 1")):
        result = runner.invoke(app, ["profile", *args])
        assert result.exit_code == 2 and message in result.output, result.output
    (tmp_path / "file").write_text("")
    result = runner.invoke(app, ["profile", "--measure-ops", str(tmp_path / "file"), "--quick"])
    assert result.exit_code == 2 and "is a file" in result.output


def test_measure_ops_refuses_models_whose_weights_do_not_fit(measured, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from simulator.cli import app
    from simulator.harness import optable

    monkeypatch.setattr(optable, "memory_bytes", lambda dev: 1e9)     # a 1 GB device
    result = CliRunner().invoke(app, ["profile", "--measure-ops", str(tmp_path / "x"), "--model", "llama-160m"])
    assert result.exit_code == 2 and "choose smaller models" in result.output, result.output
    assert not (tmp_path / "x").exists()


# -- the harness style: the decoder's own op list ------------------------------------------


def _aten_ops(fn) -> tuple[int, int]:
    """Kernels and view ops (no kernel) that ``fn()`` dispatches, counted below autograd."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.kernels = self.views = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            # _unsafe_view aliases like a view but is not tagged as one
            if func.is_view or func is torch.ops.aten._unsafe_view.default:
                self.views += 1
            else:
                self.kernels += 1
            return func(*args, **(kwargs or {}))

    with Count() as count:
        fn()
    return count.kernels, count.views


VARIANTS = [TINY, dataclasses.replace(TINY, name="mha", kv_heads=4),
            dataclasses.replace(TINY, name="qwen3-like", qk_norm=True, tied_embeddings=True),
            dataclasses.replace(TINY, name="qwen2-like", qkv_bias=True, tied_embeddings=True)]


@pytest.mark.parametrize("shape", VARIANTS, ids=lambda s: s.name)
@pytest.mark.parametrize("tokens", [1, 3])
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_the_harness_style_counts_every_kernel_one_layer_runs(measured, shape, tokens, dtype_name):
    """One cached ``Layer.forward`` and one fresh one (``full_forward``'s path): the aten ops
    that launch a kernel are the kernels the style counts, its view ops the views it prices;
    then the whole ``Decoder.forward`` for its head."""
    torch = pytest.importorskip("torch", reason=TORCH)
    from simulator.harness.decoder import Decoder

    dtype = getattr(torch, dtype_name)
    # the style counts the casts of the tables' dtype: fp32 from this CPU's folder, bf16 from a shipped GPU
    gpu = load_gpu(measured) if dtype == torch.float32 else load_gpu("a100-sxm")
    model = Decoder(shape, "cpu", dtype, max_len=64)
    layer, batch, context, view = model.layers[0], 2, 10, 32
    cache = model.new_cache(batch, 64)
    x = torch.randn(batch, tokens, shape.hidden, dtype=dtype)
    slots = context + torch.arange(tokens)[None, :].expand(batch, tokens)
    rows = torch.arange(batch)[:, None]
    cos, sin = model.cos[slots][:, None], model.sin[slots][:, None]
    mask = torch.arange(view)[None, None, None, :] <= slots[:, None, :, None]
    with torch.no_grad():
        cached = _aten_ops(lambda: layer(x, cos, sin, cache.k[0], cache.v[0], rows, slots, mask, view))
        cos0, sin0 = model.cos[:tokens][None, None], model.sin[:tokens][None, None]
        fresh = _aten_ops(lambda: layer(x, cos0, sin0, None, None, None, None, None, tokens))
        calls = []
        hooks = [m.register_forward_pre_hook(lambda *_: calls.append(1)) for m in layer.modules()]
        layer(x, cos, sin, cache.k[0], cache.v[0], rows, slots, mask, view)
        for hook in hooks:
            hook.remove()
    one_layer = dataclasses.replace(shape, layers=1)
    for counted, p in ((cached, Pass(batch, tokens, context, False, batch * tokens, False)),
                       (fresh, Pass(batch, tokens, 0, True, batch * tokens, False))):
        cost = StepCost()
        STYLES["harness"].layers(gpu, one_layer, cost, p)
        assert cost.kernels == counted[0]
        assert HARNESS_LAYER_VIEWS["fresh" if p.fresh else "cached"] == counted[1]
    assert len(calls) == 10 + (2 if shape.qk_norm else 0)

    tokens_t = torch.randint(0, shape.vocab, (batch, tokens))
    cache.pos.fill_(context)
    kernels, views = _aten_ops(lambda: model(tokens_t, cache, view))
    head = StepCost()
    STYLES["harness"].head(gpu, shape, head, Pass(batch, tokens, context, False, batch * tokens, False))
    assert head.kernels == kernels - shape.layers * cached[0]
    assert HARNESS_HEAD_VIEWS["cached"] == views - shape.layers * cached[1]
    kernels, views = _aten_ops(lambda: model.full_forward(tokens_t))
    head = StepCost()
    STYLES["harness"].head(gpu, shape, head, Pass(batch, tokens, 0, True, batch * tokens, False))
    assert head.kernels == kernels - shape.layers * fresh[0]
    assert HARNESS_HEAD_VIEWS["fresh"] == views - shape.layers * fresh[1]


def test_a_speculative_round_in_the_harness_style_recaches_the_previous_token(measured):
    """The harness's first draft step runs two tokens per row (SpecDecoder step 1); the
    fused style's round stays k one-token draft steps and one verify pass."""
    gpu = load_gpu(measured)
    context = [16, 16]
    harness = speculative_round(gpu, TINY, TINY, context, 2, "harness")
    one_token = [decode_step(gpu, TINY, [c + j for c in context], "harness") for j in range(2)]
    verify = verify_pass(gpu, TINY, context, 2, "harness")
    assert math.isfinite(harness.seconds)
    # the first draft step: two tokens' GEMMs and logits, the same sampling and launches
    assert harness.kernels == sum(s.kernels for s in one_token) + verify.kernels
    # the output head runs over every position: two tokens per row, then one (a table lookup,
    # so the comparison is exact whatever this CPU measured)
    rows = len(context)
    head = [gpu.gemm(tokens, TINY.vocab, TINY.hidden).seconds for tokens in (2 * rows, rows)]
    assert harness.parts["draft lm_head"] == pytest.approx(sum(head))
    a100 = load_gpu("a100-sxm")
    fused = speculative_round(a100, TINY, TINY, context, 2)
    parts = [decode_step(a100, TINY, [c + j for c in context]) for j in range(2)] + [verify_pass(a100, TINY, context, 2)]
    assert fused.seconds == pytest.approx(sum(s.seconds for s in parts))
    assert fused.kernels == sum(s.kernels for s in parts)


# -- a GPU's split timing: the device's seconds and the host's issuing, apart ---------------


def _split_copy(measured: Path, folder: Path, host_per_call: float) -> Path:
    """``measured`` as a GPU writes its tables: every op's seconds the device's, ``host_seconds``
    (here ``host_per_call`` for every op) the host's issuing it, ``timing: split``."""
    folder.mkdir()
    for path in measured.glob("*.parquet"):
        frame = pd.read_parquet(path)
        frame["host_seconds"] = host_per_call
        frame.to_parquet(folder / path.name, index=False)
    spec = json.loads((measured / SPEC_FILE).read_text())
    spec["timing"] = "split"
    for entry in spec["elementwise"]["ops"].values():
        entry["points"] = [[b, s, host_per_call] for b, s, *_ in entry["points"]]
    (folder / SPEC_FILE).write_text(json.dumps(spec))
    return folder


def test_split_tables_keep_the_host_apart_and_an_eager_pass_takes_the_longer_side(measured, tmp_path):
    synchronous = load_gpu(measured)
    idle, busy = (load_gpu(_split_copy(measured, tmp_path / name, h)) for name, h in (("idle", 0.0), ("busy", 1e-3)))
    assert not synchronous.split_timing and idle.split_timing and busy.split_timing
    assert busy.gemm(1, 64, 64) == Estimate(synchronous.gemm(1, 64, 64).seconds, "exact", 1e-3)
    spec = json.loads((measured / SPEC_FILE).read_text())
    context = [12, 12]
    base = decode_step(synchronous, TINY, context, "harness")
    # the views and module calls leave the device's seconds for the host's
    assert base.host_seconds == 0 and base.eager_seconds == base.seconds
    none = decode_step(idle, TINY, context, "harness")
    assert none.seconds == pytest.approx(base.seconds - base.parts["host"])
    views = TINY.layers * HARNESS_LAYER_VIEWS["cached"] + HARNESS_HEAD_VIEWS["cached"]
    modules = TINY.layers * (10 + (2 if TINY.qk_norm else 0)) + (3 if TINY.tied_embeddings else 4)
    assert none.host_seconds == pytest.approx(views * spec["host"]["view_s"] + modules * spec["host"]["module_s"])
    # each call the pass issues costs the host its time once, an attention call however many
    # kernels it launches
    step = decode_step(busy, TINY, context, "harness")
    calls = step.kernels - TINY.layers * (HARNESS_CACHED_ATTENTION_KERNELS - 1)
    assert step.host_seconds - none.host_seconds == pytest.approx(calls * 1e-3)
    assert step.seconds == pytest.approx(none.seconds)
    assert step.eager_seconds == max(step.seconds, step.host_seconds) == step.host_seconds
    shipped = decode_step(load_gpu("h100-sxm"), PRESETS["qwen3-0.6b"], context, "fused")
    assert shipped.host_seconds == 0 and shipped.eager_seconds == shipped.seconds
