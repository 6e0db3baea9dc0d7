"""The cost of one decoder forward pass on a GPU, composed from per-op latencies.

A forward pass of a Llama/Qwen-style decoder over ``rows`` rows, each adding ``new`` tokens
to ``context`` tokens it has cached, is the sum over its layers of the ops an *execution
style* launches, plus the embedding, the final norm, the LM head and (for a generation
step) sampling. Each op is priced from the GPU's tables (:mod:`simulator.hardware.tables`):

* GEMMs ``[t, k] × [k, n]`` (t = the tokens of the pass) from the GEMM table;
* attention from the decode-attention table (queries against a cache) or the
  prefill-attention table (fresh prompts, causal);
* elementwise ops (norms, RoPE, activations, residual adds, cache copies, casts) are not
  in the shipped tables: each kernel costs the GEMM fit's fixed cost plus its bytes at the
  fit's effective bandwidth (:meth:`GpuTables.elementwise`, tagged ``assumed``); a device's
  own measured tables (``simctl profile --measure-ops``) time them, op by op.

Execution styles (:data:`STYLES`; an engine names the style it runs):

* ``fused`` — vLLM / TensorRT-LLM: q/k/v in one GEMM, gate and up in one, every layer's
  elementwise work in fused kernels (priced as one op streaming its bytes), the KV cache
  paged in place;
* ``hf-eager`` — Hugging Face ``transformers`` modules run eagerly: q, k, v, gate and up
  as separate GEMMs; RMSNorm as the eight kernels its fp32 module launches; RoPE as five
  kernels per tensor; the grouped K/V repeated to every query head before attention
  (``repeat_kv``, a copy); the ``DynamicCache`` re-allocated by ``torch.cat`` on every
  step (the whole cache read and written); logits cast to fp32; and in a generation step
  the sampling processors (temperature, top-k, top-p's sort, softmax, multinomial) over
  the full vocabulary.

* ``harness`` — the decoder of :mod:`simulator.harness.decoder` run eagerly in the dtype of
  the tables (a device's own, measured by :mod:`simulator.harness.optable`): ops exactly as
  ``Layer.forward`` and ``Decoder.forward`` dispatch them (``tests/test_optable.py`` counts
  them) — separate q/k/v/gate/up GEMMs, RMSNorm's six fp32 kernels (nine off fp32: three
  casts), RoPE with cat, cached attention as one measured op (cache writes, mask, SDPA; with
  several new tokens per row, the measured verify-attention table), logits at every
  position; in a sampling pass softmax and the harness's Gumbel-max sample, and in a verify
  pass the round's acceptance and bookkeeping; the host cost of the view ops and module
  calls, which launch nothing; a speculative round's first draft step runs two tokens per
  row (``Style.recache_previous``).

Every op is also counted as kernel launches (:attr:`StepCost.kernels`): an engine without
CUDA graphs pays host time per launch (:mod:`simulator.hardware.engines`).

Rows of different context lengths in one pass are priced as a batch at their mean length
(decode attention streams each row's cache, so its cost follows the total cached tokens);
``hf-eager`` pads every row to the longest, so callers pass the longest for every row.
A speculative round is ``k`` draft decode steps and one target pass verifying ``k + 1``
tokens per row; the verify's attention reads each row's cache once for all its ``k + 1``
queries, priced as a decode step at the context plus ``k`` tokens. A decoder without a KV
cache (:func:`uncached_pass`) runs every pass as a fresh prefill over each row's whole
sequence, with logits at every position.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from simulator.hardware.tables import BF16, Estimate, GpuTables
from simulator.harness.presets import ModelShape

FP32 = 4


@dataclass
class StepCost:
    """Seconds of one pass, split by part and by provenance tag; ``stream_bytes`` is what the
    pass must read from GPU memory at least (weights once, cached K/V once); ``kernels`` is
    how many kernels it launches; ``host_seconds`` what the host spends issuing them where
    the tables time that apart (:attr:`~simulator.hardware.tables.GpuTables.split_timing`;
    else 0: inside ``seconds`` on a synchronous device, or not the tables' to say)."""

    seconds: float = 0.0
    host_seconds: float = 0.0
    parts: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    by_tag: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    stream_bytes: float = 0.0
    spec_bandwidth: float = 0.0
    kernels: int = 0

    def add(self, part: str, estimate: Estimate, times: int = 1, kernels: int = 1) -> None:
        seconds = estimate.seconds * times
        self.seconds += seconds
        self.host_seconds += estimate.host_seconds * times
        self.parts[part] += seconds
        self.by_tag[estimate.tag] += seconds
        self.kernels += kernels * times

    def extend(self, other: StepCost, prefix: str = "") -> None:
        for part, seconds in other.parts.items():
            self.parts[prefix + part] += seconds
        for tag, seconds in other.by_tag.items():
            self.by_tag[tag] += seconds
        self.seconds += other.seconds
        self.host_seconds += other.host_seconds
        self.stream_bytes += other.stream_bytes
        self.kernels += other.kernels

    @property
    def eager_seconds(self) -> float:
        """The pass run eagerly: its launches run ahead of the device until the pass's end
        waits for both, so it takes the longer of the host's and the device's seconds (where
        the tables time them apart; else ``seconds``). ``seconds`` alone is the pass replayed
        from a CUDA graph, whose host issues one launch."""
        return max(self.seconds, self.host_seconds)

    @property
    def floor_seconds(self) -> float:
        """The bytes the pass must stream over the GPU's spec bandwidth."""
        return self.stream_bytes / self.spec_bandwidth

    def to_dict(self) -> dict:
        return {"seconds": self.seconds, "host_seconds": self.host_seconds, "eager_seconds": self.eager_seconds,
                "parts": dict(self.parts), "by_tag": dict(self.by_tag),
                "floor_seconds": self.floor_seconds, "kernels": self.kernels}


@dataclass(frozen=True)
class Pass:
    """What one forward pass processes: ``rows`` rows of ``new`` tokens each, on top of
    ``context`` cached tokens per row (their mean); ``fresh``: attention is a causal prefill
    over the new tokens alone (no cache); ``logits``: rows × positions the LM head runs on;
    ``sample``: the pass ends a generation step (sampling over the vocabulary per row)."""

    rows: int
    new: int
    context: int
    fresh: bool
    logits: int
    sample: bool
    #: tokens of packed prompts of different lengths (default: rows × new)
    packed: int | None = None

    @property
    def tokens(self) -> int:
        return self.packed if self.packed is not None else self.rows * self.new


def _elementwise(gpu: GpuTables, cost: StepCost, part: str, nbytes: float, kernels: int, times: int = 1) -> None:
    """``kernels`` elementwise kernels streaming ``nbytes`` in all, each paying the fixed cost."""
    if kernels <= 0:
        return
    per = gpu.elementwise(nbytes / kernels)
    cost.add(part, Estimate(per.seconds * kernels, per.tag, per.host_seconds * kernels), times, kernels)


def _attention(gpu: GpuTables, shape: ModelShape, p: Pass) -> Estimate:
    if p.fresh:
        return gpu.prefill_attention(p.rows, max(p.new, 1), shape.heads, shape.kv_heads, shape.head_dim)
    return gpu.decode_attention(p.rows, max(p.context + p.new - 1, 1), shape.heads, shape.kv_heads, shape.head_dim)


def _fused_layers(gpu: GpuTables, shape: ModelShape, cost: StepCost, p: Pass) -> None:
    """vLLM / TensorRT-LLM: fused q/k/v and gate/up GEMMs, fused elementwise kernels."""
    L, h, t = shape.layers, shape.hidden, p.tokens
    q, kv, inter = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.intermediate
    cost.add("gemm", gpu.gemm(t, q + 2 * kv, h), L)
    cost.add("gemm", gpu.gemm(t, h, q), L)
    if shape.experts:
        # the router's GEMM, then the fused experts op as measured for this architecture
        # (its width unsplit: the table is keyed by the model's and the group's sizes)
        cost.add("gemm", gpu.gemm(t, shape.experts, h), L)
        cost.add("moe", gpu.moe(t, h, inter * gpu.tp, shape.experts_per_token, shape.experts), L)
        inter = shape.active_intermediate
    else:
        cost.add("gemm", gpu.gemm(t, 2 * inter, h), L)
        cost.add("gemm", gpu.gemm(t, h, inter), L)
    cost.add("attention", _attention(gpu, shape, p), L)
    # bytes read + written: 2 RMS norms (x in, x out), RoPE (q and k in and out), SiLU·mul
    # (gate and up in, one out), 2 residual adds (two in, one out); priced as one stream a
    # layer (the engines fuse them), counted as the six kernels they launch
    per_layer = BF16 * t * (2 * 2 * h + 2 * (q + kv) + 3 * inter + 2 * 3 * h)
    if shape.qk_norm:
        per_layer += BF16 * t * 2 * (q + kv)
    cost.add("elementwise", gpu.elementwise(per_layer), L, kernels=6)


#: HF's RMSNorm in fp32: cast up, pow, mean, add eps, rsqrt, mul, cast down, mul weight —
#: eight kernels; bytes read + written per element of the normalised tensor
RMSNORM_EAGER = (8, BF16 + FP32 + 2 * FP32 + FP32 + 3 * FP32 + FP32 + BF16 + 3 * BF16)
#: RoPE on one tensor: q·cos, neg of one half, cat of halves, rotated·sin, add
ROPE_EAGER = (5, 3 * BF16 + BF16 + 2 * BF16 + 3 * BF16 + 3 * BF16)


def _dense_only(shape: ModelShape, style: str) -> None:
    if shape.experts:
        from simulator.errors import HardwareError

        raise HardwareError(None, None, "--engine", f"{shape.name} is a mixture of experts: composed in the fused "
                            f"style only (--engine cuda-graph), not {style}")


def _eager_layers(gpu: GpuTables, shape: ModelShape, cost: StepCost, p: Pass) -> None:
    """Hugging Face eager modules (module docstring)."""
    _dense_only(shape, "hf-eager")
    L, h, t = shape.layers, shape.hidden, p.tokens
    q, kv, inter = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.intermediate
    norm_kernels, norm_bytes = RMSNORM_EAGER
    rope_kernels, rope_bytes = ROPE_EAGER
    _elementwise(gpu, cost, "norm", norm_bytes * t * h, norm_kernels, L)
    for n in (q, kv, kv):
        cost.add("gemm", gpu.gemm(t, n, h), L)
    if shape.qk_norm:
        _elementwise(gpu, cost, "norm", norm_bytes * t * q, norm_kernels, L)
        _elementwise(gpu, cost, "norm", norm_bytes * t * kv, norm_kernels, L)
    _elementwise(gpu, cost, "rope", rope_bytes * t * q, rope_kernels, L)
    _elementwise(gpu, cost, "rope", rope_bytes * t * kv, rope_kernels, L)
    attended = p.new if p.fresh else p.context + p.new
    if not p.fresh:
        # DynamicCache.update: torch.cat of the old cache and the new keys (and values)
        # into a new tensor — the whole cache read and written every step
        _elementwise(gpu, cost, "cache copy", 2 * BF16 * p.rows * kv * (p.context + attended), 2, L)
    if shape.heads != shape.kv_heads:
        # repeat_kv: K and V expanded to every query head before SDPA (a padded batch
        # passes a mask, and SDPA's own GQA path is taken only without one)
        _elementwise(gpu, cost, "repeat kv", 2 * BF16 * p.rows * attended * (kv + q), 2, L)
    cost.add("attention", _attention(gpu, shape, p), L, kernels=3)
    _elementwise(gpu, cost, "elementwise", 2 * BF16 * t * q, 1, L)            # transpose to contiguous
    cost.add("gemm", gpu.gemm(t, h, q), L)
    _elementwise(gpu, cost, "elementwise", 3 * BF16 * t * h, 1, L)            # residual add
    _elementwise(gpu, cost, "norm", norm_bytes * t * h, norm_kernels, L)
    cost.add("gemm", gpu.gemm(t, inter, h), L)
    cost.add("gemm", gpu.gemm(t, inter, h), L)
    _elementwise(gpu, cost, "elementwise", 2 * BF16 * t * inter + 3 * BF16 * t * inter, 2, L)  # SiLU, mul
    cost.add("gemm", gpu.gemm(t, h, inter), L)
    _elementwise(gpu, cost, "elementwise", 3 * BF16 * t * h, 1, L)            # residual add


def _fused_head(gpu: GpuTables, shape: ModelShape, cost: StepCost, p: Pass) -> None:
    """Embedding gather, final norm, LM head over the sampled rows, sampling."""
    cost.add("embedding", gpu.elementwise(BF16 * 2 * p.tokens * shape.hidden))
    cost.add("elementwise", gpu.elementwise(BF16 * 2 * p.logits * shape.hidden))
    cost.add("lm_head", gpu.gemm(p.logits, _head_width(gpu, shape), shape.hidden))
    if p.sample:
        # softmax and sampling read the fp32 logits twice
        cost.add("sampling", gpu.elementwise(4 * 2 * p.logits * shape.vocab))


#: HF generate's sampling per step: temperature, top-k (topk, compare, masked_fill), top-p
#: (sort, softmax, cumsum, compare, scatter, masked_fill), softmax, multinomial — kernels
#: and bytes per logit (fp32); then about a dozen bookkeeping kernels on tiny tensors
#: (next token where unfinished, appending ids and mask, end-of-sequence checks)
SAMPLING_EAGER = (17, 2 * FP32 + FP32 + 2 * FP32 + 2 * FP32 + 8 * FP32 + 2 * FP32 + 2 * FP32 + 2 * FP32 + 2 * FP32
                  + 2 * FP32 + 2 * FP32 + 2 * FP32)
BOOKKEEPING_EAGER = 12
#: per forward: rotary tables (inv_freq expand, matmul, cat, cos, sin, casts) and the 4-D
#: attention mask (arange, compare, padding merge, expand, where, cast)
PREAMBLE_EAGER = 14


def _eager_head(gpu: GpuTables, shape: ModelShape, cost: StepCost, p: Pass) -> None:
    h, V = shape.hidden, shape.vocab
    cost.add("embedding", gpu.elementwise(2 * BF16 * p.tokens * h))
    attended = p.new if p.fresh else p.context + p.new
    _elementwise(gpu, cost, "elementwise", BF16 * p.rows * p.new * attended + 1024, PREAMBLE_EAGER)
    norm_kernels, norm_bytes = RMSNORM_EAGER
    _elementwise(gpu, cost, "norm", norm_bytes * p.tokens * h, norm_kernels)
    cost.add("lm_head", gpu.gemm(p.logits, _head_width(gpu, shape), h))
    _elementwise(gpu, cost, "logits", (BF16 + FP32) * p.logits * V, 1)       # .float()
    if p.sample:
        kernels, per_logit = SAMPLING_EAGER
        _elementwise(gpu, cost, "sampling", per_logit * p.rows * V, kernels)
        _elementwise(gpu, cost, "sampling", 64.0 * p.rows, BOOKKEEPING_EAGER)


#: Bytes per element each elementwise op of the ``harness`` style streams, in units of the
#: element size (``copy`` is a dtype cast: its bytes are the two sizes' sum). The op tables a
#: device measures (:mod:`simulator.harness.optable`) fit each op's cost against these same
#: bytes, so what matters is that both sides count alike, not that they count DRAM traffic.
HARNESS_STREAMS: dict[str, int] = {
    "add": 3, "mul": 3, "div": 3, "pow": 2, "rsqrt": 2, "neg": 2, "silu": 2, "mean": 1, "cat": 2,
    "index": 2, "embedding": 2, "softmax": 2, "exponential": 1, "argmax": 1,
}
#: Kernels of :func:`~simulator.harness.decoder.attend_cached`: two cache writes (index_put),
#: SDPA's conversion of the bool mask (two scalar tensors and a where), SDPA itself
HARNESS_CACHED_ATTENTION_KERNELS = 6
#: A speculative round's bookkeeping on tiny tensors, outside the passes and the sampling
#: priced by size (SpecDecoder.generate steps 1-4): the draft loop's cache-position moves and
#: stacks, the verify input's cat, injected acceptance (rand, compare, cast, cumprod, sum),
#: the next token's indexing and choice, committing tokens and advancing positions, the
#: loop's end check
HARNESS_ROUND_KERNELS = 34
#: View ops (no kernel: t, view and _unsafe_view around each GEMM, head reshapes, transposes,
#: slices, the layer's cache selects) of one layer, cached and fresh, and of Decoder.forward
#: around its layers (slots, rotary rows and mask broadcasts; the head's reshapes)
HARNESS_LAYER_VIEWS = {"cached": 37, "fresh": 33}
HARNESS_HEAD_VIEWS = {"cached": 12, "fresh": 9}


def _dtype_bytes(gpu: GpuTables) -> int:
    """Element size of the dtype the tables were measured in (shipped GPU tables: bf16)."""
    return int(gpu.spec.get("dtype_bytes", BF16))


def _op(gpu: GpuTables, cost: StepCost, part: str, op: str | None, numel: float, es: int, times: int = 1) -> None:
    """One harness kernel over ``numel`` elements of ``es`` bytes, priced by ``op``'s fit."""
    streams = HARNESS_STREAMS.get(op, 2) if op else 2
    cost.add(part, gpu.elementwise(streams * numel * es, op), times)


def _cast(gpu: GpuTables, cost: StepCost, part: str, numel: float, es: int, times: int = 1) -> None:
    """A cast between the tables' dtype and fp32 (``x.float()``, ``.to(dtype)``)."""
    cost.add(part, gpu.elementwise((es + FP32) * numel, "copy"), times)


def _harness_norm(gpu: GpuTables, cost: StepCost, rows: int, dim: int, es: int, times: int) -> None:
    """:class:`~simulator.harness.decoder.RMSNorm` of ``rows`` vectors of ``dim``: pow, mean,
    add eps, rsqrt, mul, mul by the weight — computed in fp32; in another dtype three casts
    run too (x up, the weight up, the result down), in fp32 they are no-ops and launch nothing."""
    n = rows * dim
    if es != FP32:
        _cast(gpu, cost, "norm", n, es, times)
        _cast(gpu, cost, "norm", dim, es, times)
        _cast(gpu, cost, "norm", n, es, times)
    _op(gpu, cost, "norm", "pow", n, FP32, times)
    _op(gpu, cost, "norm", "mean", n, FP32, times)
    _op(gpu, cost, "norm", "add", rows, FP32, times)
    _op(gpu, cost, "norm", "rsqrt", rows, FP32, times)
    _op(gpu, cost, "norm", "mul", n, FP32, times)
    _op(gpu, cost, "norm", "mul", n, FP32, times)


def _harness_rope(gpu: GpuTables, cost: StepCost, numel: int, es: int, times: int) -> None:
    """:func:`~simulator.harness.decoder.apply_rope` on ``numel`` elements: neg of one half,
    cat of the halves, x·cos, rotated·sin, add."""
    _op(gpu, cost, "rope", "neg", numel / 2, es, times)
    _op(gpu, cost, "rope", "cat", numel, es, times)
    _op(gpu, cost, "rope", "mul", numel, es, times)
    _op(gpu, cost, "rope", "mul", numel, es, times)
    _op(gpu, cost, "rope", "add", numel, es, times)


def _harness_layers(gpu: GpuTables, shape: ModelShape, cost: StepCost, p: Pass) -> None:
    """:class:`~simulator.harness.decoder.Layer` ``.forward``, op by op, in the tables' dtype:
    separate q/k/v/gate/up ``nn.Linear`` GEMMs (a bias is added inside the GEMM, addmm),
    RMSNorms in fp32, RoPE with cat, attention as :func:`~simulator.harness.decoder.attend_cached`
    (cache writes, mask, SDPA: the decode-attention table times exactly this) or, for a fresh
    pass, :func:`~simulator.harness.decoder.attend_fresh`; SiLU, the gating mul, residual adds."""
    _dense_only(shape, "harness")
    L, h, t, es = shape.layers, shape.hidden, p.tokens, _dtype_bytes(gpu)
    q, kv, inter = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.intermediate
    _harness_norm(gpu, cost, t, h, es, L)
    for n in (q, kv, kv):
        cost.add("gemm", gpu.gemm(t, n, h), L)
    if shape.qk_norm:
        _harness_norm(gpu, cost, t * shape.heads, shape.head_dim, es, L)
        _harness_norm(gpu, cost, t * shape.kv_heads, shape.head_dim, es, L)
    _harness_rope(gpu, cost, t * q, es, L)
    _harness_rope(gpu, cost, t * kv, es, L)
    # the attention output [B, H, T, D] comes back laid out as [B, T, H, D]: its transpose and
    # reshape for the o projection are views, no copy
    if p.fresh or p.new == 1:
        attention = _attention(gpu, shape, p)
    else:   # several queries per row against the cache cost more than one (measured folders say how much)
        attention = gpu.verify_attention(p.rows, p.context, p.new, shape.heads, shape.kv_heads, shape.head_dim)
    cost.add("attention", attention, L, kernels=1 if p.fresh else HARNESS_CACHED_ATTENTION_KERNELS)
    cost.add("gemm", gpu.gemm(t, h, q), L)
    _op(gpu, cost, "elementwise", "add", t * h, es, L)            # residual
    _harness_norm(gpu, cost, t, h, es, L)
    cost.add("gemm", gpu.gemm(t, inter, h), L)
    _op(gpu, cost, "elementwise", "silu", t * inter, es, L)
    cost.add("gemm", gpu.gemm(t, inter, h), L)
    _op(gpu, cost, "elementwise", "mul", t * inter, es, L)
    cost.add("gemm", gpu.gemm(t, h, inter), L)
    _op(gpu, cost, "elementwise", "add", t * h, es, L)            # residual
    # what launches no kernel still costs the host: view ops, module calls (the layer, its
    # norms and its linears)
    cost.add("host", gpu.host("view"), L * HARNESS_LAYER_VIEWS["fresh" if p.fresh else "cached"], kernels=0)
    cost.add("host", gpu.host("module"), L * (10 + (2 if shape.qk_norm else 0)), kernels=0)


def _harness_sample(gpu: GpuTables, cost: StepCost, rows: int, vocab: int, es: int) -> None:
    """``softmax(logits.float())`` then :func:`~simulator.harness.specdec.sample` over
    ``rows`` rows of the vocabulary: exponential noise, divide, argmax."""
    n = rows * vocab
    if es != FP32:
        _cast(gpu, cost, "sampling", n, es)
    _op(gpu, cost, "sampling", "softmax", n, FP32)
    _op(gpu, cost, "sampling", "exponential", n, FP32)
    _op(gpu, cost, "sampling", "div", n, FP32)
    _op(gpu, cost, "sampling", "argmax", n, FP32)


def _harness_head(gpu: GpuTables, shape: ModelShape, cost: StepCost, p: Pass) -> None:
    """:meth:`~simulator.harness.decoder.Decoder.forward` around its layers, and what the
    harness does with the logits.

    Cached passes first build the slots, the rotary rows and the mask; a fresh pass is
    ``Decoder.full_forward`` (no cache: slices only). Then the embedding, the final norm and
    the output head over **every** position (the harness computes all of them; callers pick).
    A sampling pass with one distribution per row is a plain or draft decode step
    (``plain_generate``, SpecDecoder step 1): softmax and sample, advance the cache position.
    A cached sampling pass with logits at more than one position per row is a verify pass
    (:func:`verify_pass`, SpecDecoder steps 2-4): softmax over every position, the drafts'
    distributions stacked twice (acceptance and next token), the next token's distribution
    gathered and sampled, and the round's bookkeeping (:data:`HARNESS_ROUND_KERNELS`)."""
    h, V, t, es = shape.hidden, shape.vocab, p.tokens, _dtype_bytes(gpu)
    if not p.fresh:
        attended = p.context + p.new
        for numel in (p.new, t, p.rows):                             # arange, slots add, arange
            _op(gpu, cost, "elementwise", None, numel, 8)
        _op(gpu, cost, "elementwise", "index", t * shape.head_dim, es, 2)    # cos and sin rows
        _op(gpu, cost, "elementwise", None, attended, 8)             # arange over the view
        _op(gpu, cost, "elementwise", None, t * attended, 1)         # mask compare (bool)
    _op(gpu, cost, "embedding", "embedding", t * h, es)
    _harness_norm(gpu, cost, t, h, es, 1)
    cost.add("lm_head", gpu.gemm(t, V, h))
    cost.add("host", gpu.host("view"), HARNESS_HEAD_VIEWS["fresh" if p.fresh else "cached"], kernels=0)
    # the decoder, its embedding, its final norm and (untied) its output head
    cost.add("host", gpu.host("module"), 3 if shape.tied_embeddings else 4, kernels=0)
    if not p.sample:
        return
    verify = not p.fresh and p.logits > p.rows
    if not verify:
        _harness_sample(gpu, cost, p.rows, V, es)
        _op(gpu, cost, "sampling", None, p.rows, 8)                 # cache.pos.add_(1)
        return
    drafts = p.new - 1
    n = p.logits * V
    if es != FP32:
        _cast(gpu, cost, "sampling", n, es)
    _op(gpu, cost, "sampling", "softmax", n, FP32)
    _op(gpu, cost, "sampling", "cat", drafts * p.rows * V, FP32, 2)  # torch.stack(q_probs), twice
    _op(gpu, cost, "sampling", "index", p.rows * V, FP32)           # p[rows, m]
    for op in ("exponential", "div", "argmax"):
        _op(gpu, cost, "sampling", op, p.rows * V, FP32)
    _op(gpu, cost, "sampling", None, 8 * p.rows * (drafts + 1), 8, HARNESS_ROUND_KERNELS)


@dataclass(frozen=True)
class Style:
    """How an engine executes a decoder: the ops of its layers and of its head.

    ``recache_previous``: a speculative round's first draft step also runs the token before
    the current one (two tokens per row), so the draft caches a last draft token the previous
    round accepted (the harness's SpecDecoder step 1)."""

    layers: Callable[[GpuTables, ModelShape, StepCost, Pass], None]
    head: Callable[[GpuTables, ModelShape, StepCost, Pass], None]
    recache_previous: bool = False


#: execution style -> its ops (module docstring)
STYLES: dict[str, Style] = {
    "fused": Style(_fused_layers, _fused_head),
    "hf-eager": Style(_eager_layers, _eager_head),
    "harness": Style(_harness_layers, _harness_head, recache_previous=True),
}


def style_of(name: str) -> Style:
    try:
        return STYLES[name]
    except KeyError:
        raise ValueError(f"unknown execution style {name!r}; valid: {', '.join(STYLES)}") from None


def _head_width(gpu: GpuTables, shape: ModelShape) -> int:
    """The output head's columns on one GPU: the vocabulary split over the tensor-parallel group."""
    return -(-shape.vocab // gpu.tp)


def _weights_bytes(gpu: GpuTables, shape: ModelShape) -> float:
    """What one GPU of the group streams of the weights in a pass (the input embedding is
    gathered, not streamed)."""
    return shape.weight_bytes(gpu.tp, gpu.dtype_bytes) \
        - BF16 * _head_width(gpu, shape) * shape.hidden * (0 if shape.tied_embeddings else 1)


def _kv_bytes(gpu: GpuTables, shape: ModelShape) -> int:
    """Bytes of K and V one cached token holds on one GPU of the group."""
    return shape.sharded(gpu.tp).kv_bytes_per_token(gpu.kv_dtype_bytes)


def forward(gpu: GpuTables, shape: ModelShape, p: Pass, style: str = "fused") -> StepCost:
    """One forward pass described by ``p`` in execution style ``style``, on one GPU of
    ``gpu``'s tensor-parallel group (``gpu.tp``; 1: the whole model on one GPU).

    With tensor parallelism each GPU runs its shard of every layer (:meth:`ModelShape.sharded`)
    and the group all-reduces the hidden states twice a layer (after the attention's output
    projection and after the MLP's down projection: ``tokens × hidden`` bf16 each), priced
    from the backend's measured all-reduce; the output head's shards are gathered, priced as
    an all-reduce of the logits (an all-gather moves less: an upper bound on a small term)."""
    run = style_of(style)
    tp = gpu.tp
    local = shape.sharded(tp)
    cost = StepCost(spec_bandwidth=gpu.spec["memory_bandwidth_bytes_per_s"])
    run.layers(gpu, local, cost, p)
    run.head(gpu, local, cost, p)
    if tp > 1:
        cost.add("allreduce", gpu.allreduce(BF16 * p.tokens * shape.hidden), 2 * shape.layers)
        cost.add("allreduce", gpu.allreduce(BF16 * p.logits * shape.vocab))
    cost.stream_bytes = _weights_bytes(gpu, shape) + (0 if p.fresh else _kv_bytes(gpu, shape) * p.rows * p.context)
    return cost


def _mean(values: Sequence[int]) -> int:
    return max(1, round(sum(values) / len(values)))


def decode_step(gpu: GpuTables, shape: ModelShape, context: Sequence[int], style: str = "fused") -> StepCost:
    """One decode step of ``len(context)`` rows, row i with ``context[i]`` cached tokens."""
    b = len(context)
    cost = forward(gpu, shape, Pass(b, 1, _mean(context), False, b, True), style)
    cost.stream_bytes = _weights_bytes(gpu, shape) + _kv_bytes(gpu, shape) * sum(context)
    return cost


def prefill(gpu: GpuTables, shape: ModelShape, prompt_tokens: Sequence[int], style: str = "fused") -> StepCost:
    """The prefill of ``len(prompt_tokens)`` fresh prompts packed into one pass (logits only
    for each prompt's last position; ``hf-eager`` pads every prompt to the longest)."""
    n = len(prompt_tokens)
    if style == "hf-eager":
        return forward(gpu, shape, Pass(n, max(prompt_tokens), 0, True, n, True), style)
    # packed without padding: the GEMMs see the true token count
    return forward(gpu, shape, Pass(n, _mean(prompt_tokens), 0, True, n, True, packed=sum(prompt_tokens)), style)


def verify_pass(gpu: GpuTables, shape: ModelShape, context: Sequence[int], lookahead: int,
                style: str = "fused") -> StepCost:
    """The target's pass over ``lookahead + 1`` tokens per row (the drafts and the bonus)."""
    b = len(context)
    cost = forward(gpu, shape, Pass(b, lookahead + 1, _mean(context), False, b * (lookahead + 1), True), style)
    cost.stream_bytes = _weights_bytes(gpu, shape) + _kv_bytes(gpu, shape) * sum(context)
    return cost


def speculative_round(gpu: GpuTables, target: ModelShape, draft: ModelShape, context: Sequence[int],
                      lookahead: int, style: str = "fused") -> StepCost:
    """``lookahead`` draft decode steps (the rows' contexts growing by one each) and one target
    verify pass of ``lookahead + 1`` tokens per row."""
    cost = StepCost(spec_bandwidth=gpu.spec["memory_bandwidth_bytes_per_s"])
    first = 1 if style_of(style).recache_previous and lookahead > 0 else 0
    if first:
        # the previous token and the current one, attending what a one-token step would
        b = len(context)
        step = forward(gpu, draft, Pass(b, 2, max(_mean(context) - 1, 0), False, b, True), style)
        step.stream_bytes = _weights_bytes(gpu, draft) + _kv_bytes(gpu, draft) * sum(context)
        cost.extend(step, prefix="draft ")
    for j in range(first, lookahead):
        cost.extend(decode_step(gpu, draft, [c + j for c in context], style), prefix="draft ")
    cost.extend(verify_pass(gpu, target, context, lookahead, style))
    return cost


def uncached_pass(gpu: GpuTables, shape: ModelShape, rows: int, length: int, style: str = "hf-eager") -> StepCost:
    """A forward without a KV cache over ``rows`` sequences right-padded to ``length`` tokens,
    logits at every position (what a speculative decoder without a cache runs for each draft
    token and each verification)."""
    return forward(gpu, shape, Pass(rows, length, 0, True, rows * length, False), style)
