"""The cost of one decoder forward pass on a GPU, composed from per-op latencies.

A forward pass of a Llama/Qwen-style decoder over ``rows`` rows, each adding ``new`` tokens
to ``context`` tokens it has cached, is the sum over its layers of the ops an *execution
style* launches, plus the embedding, the final norm, the LM head and (for a generation
step) sampling. Each op is priced from the GPU's tables (:mod:`simulator.hardware.tables`):

* GEMMs ``[t, k] × [k, n]`` (t = the tokens of the pass) from the GEMM table;
* attention from the decode-attention table (queries against a cache) or the
  prefill-attention table (fresh prompts, causal);
* elementwise ops (norms, RoPE, activations, residual adds, cache copies, casts) are not
  in the tables: each kernel costs the GEMM fit's fixed cost plus its bytes at the fit's
  effective bandwidth (:meth:`GpuTables.elementwise`, tagged ``assumed``).

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
    how many kernels it launches."""

    seconds: float = 0.0
    parts: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    by_tag: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    stream_bytes: float = 0.0
    spec_bandwidth: float = 0.0
    kernels: int = 0

    def add(self, part: str, estimate: Estimate, times: int = 1, kernels: int = 1) -> None:
        seconds = estimate.seconds * times
        self.seconds += seconds
        self.parts[part] += seconds
        self.by_tag[estimate.tag] += seconds
        self.kernels += kernels * times

    def extend(self, other: StepCost, prefix: str = "") -> None:
        for part, seconds in other.parts.items():
            self.parts[prefix + part] += seconds
        for tag, seconds in other.by_tag.items():
            self.by_tag[tag] += seconds
        self.seconds += other.seconds
        self.stream_bytes += other.stream_bytes
        self.kernels += other.kernels

    @property
    def floor_seconds(self) -> float:
        """The bytes the pass must stream over the GPU's spec bandwidth."""
        return self.stream_bytes / self.spec_bandwidth

    def to_dict(self) -> dict:
        return {"seconds": self.seconds, "parts": dict(self.parts), "by_tag": dict(self.by_tag),
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
    cost.add(part, Estimate(per.seconds * kernels, per.tag), times, kernels)


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


def _eager_layers(gpu: GpuTables, shape: ModelShape, cost: StepCost, p: Pass) -> None:
    """Hugging Face eager modules (module docstring)."""
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
    cost.add("lm_head", gpu.gemm(p.logits, shape.vocab, shape.hidden))
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
    cost.add("lm_head", gpu.gemm(p.logits, V, h))
    _elementwise(gpu, cost, "logits", (BF16 + FP32) * p.logits * V, 1)       # .float()
    if p.sample:
        kernels, per_logit = SAMPLING_EAGER
        _elementwise(gpu, cost, "sampling", per_logit * p.rows * V, kernels)
        _elementwise(gpu, cost, "sampling", 64.0 * p.rows, BOOKKEEPING_EAGER)


@dataclass(frozen=True)
class Style:
    """How an engine executes a decoder: the ops of its layers and of its head."""

    layers: Callable[[GpuTables, ModelShape, StepCost, Pass], None]
    head: Callable[[GpuTables, ModelShape, StepCost, Pass], None]


#: execution style -> its ops (module docstring)
STYLES: dict[str, Style] = {
    "fused": Style(_fused_layers, _fused_head),
    "hf-eager": Style(_eager_layers, _eager_head),
}


def style_of(name: str) -> Style:
    try:
        return STYLES[name]
    except KeyError:
        raise ValueError(f"unknown execution style {name!r}; valid: {', '.join(STYLES)}") from None


def _weights_bytes(shape: ModelShape) -> float:
    return BF16 * (shape.parameters() - shape.vocab * shape.hidden * (0 if shape.tied_embeddings else 1))


def forward(gpu: GpuTables, shape: ModelShape, p: Pass, style: str = "fused") -> StepCost:
    """One forward pass described by ``p`` in execution style ``style``."""
    run = style_of(style)
    cost = StepCost(spec_bandwidth=gpu.spec["memory_bandwidth_bytes_per_s"])
    run.layers(gpu, shape, cost, p)
    run.head(gpu, shape, cost, p)
    cost.stream_bytes = _weights_bytes(shape) + (0 if p.fresh else shape.kv_bytes_per_token(BF16) * p.rows * p.context)
    return cost


def _mean(values: Sequence[int]) -> int:
    return max(1, round(sum(values) / len(values)))


def decode_step(gpu: GpuTables, shape: ModelShape, context: Sequence[int], style: str = "fused") -> StepCost:
    """One decode step of ``len(context)`` rows, row i with ``context[i]`` cached tokens."""
    b = len(context)
    cost = forward(gpu, shape, Pass(b, 1, _mean(context), False, b, True), style)
    cost.stream_bytes = _weights_bytes(shape) + shape.kv_bytes_per_token(BF16) * sum(context)
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
    cost.stream_bytes = _weights_bytes(shape) + shape.kv_bytes_per_token(BF16) * sum(context)
    return cost


def speculative_round(gpu: GpuTables, target: ModelShape, draft: ModelShape, context: Sequence[int],
                      lookahead: int, style: str = "fused") -> StepCost:
    """``lookahead`` draft decode steps (the rows' contexts growing by one each) and one target
    verify pass of ``lookahead + 1`` tokens per row."""
    cost = StepCost(spec_bandwidth=gpu.spec["memory_bandwidth_bytes_per_s"])
    for j in range(lookahead):
        cost.extend(decode_step(gpu, draft, [c + j for c in context], style), prefix="draft ")
    cost.extend(verify_pass(gpu, target, context, lookahead, style))
    return cost


def uncached_pass(gpu: GpuTables, shape: ModelShape, rows: int, length: int, style: str = "hf-eager") -> StepCost:
    """A forward without a KV cache over ``rows`` sequences right-padded to ``length`` tokens,
    logits at every position (what a speculative decoder without a cache runs for each draft
    token and each verification)."""
    return forward(gpu, shape, Pass(rows, length, 0, True, rows * length, False), style)
