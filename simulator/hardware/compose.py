"""The cost of one decoder iteration on a GPU, composed from per-op latencies.

A Llama/Qwen-style decoder layer runs, in bf16 (vLLM's fusions: q/k/v in one GEMM, gate and
up in one):

* GEMMs ``qkv (n = (heads + 2·kv_heads)·head_dim, k = hidden)``, ``o_proj (hidden,
  heads·head_dim)``, ``gate_up (2·intermediate, hidden)``, ``down (hidden, intermediate)``,
  each with m = the tokens the step processes;
* attention: decode attention for a decode step (one query token per row, against its cached
  tokens), prefill attention for fresh prompts;
* elementwise ops (two RMS norms, RoPE on q and k, SiLU·mul, two residual adds), priced by the
  bytes they read and write (:meth:`GpuTables.elementwise`, tagged assumed);

then the model adds the embedding gather, the final norm, the LM head (m = rows that sample)
and sampling over the vocabulary. :class:`StepCost` keeps the total, the seconds per part and
per provenance tag, and the bytes the step must stream (weights read once, the KV cache read
once): :attr:`StepCost.floor_seconds` at the spec bandwidth is a physical lower bound.

Rows of different context lengths in one decode step are priced as a batch at their mean
length: decode attention streams each row's cache, so its cost follows the total cached
tokens. A speculative round is ``k`` draft decode steps and one target pass verifying
``k + 1`` tokens per row; the verify's attention reads each row's cache once for all its
``k + 1`` queries, priced as a decode step at the context plus ``k`` tokens.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Sequence

from simulator.hardware.tables import BF16, Estimate, GpuTables
from simulator.harness.presets import ModelShape


@dataclass
class StepCost:
    """Seconds of one step, split by part and by provenance tag; ``stream_bytes`` is what the
    step must read from GPU memory at least (weights once, cached K/V once)."""

    seconds: float = 0.0
    parts: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    by_tag: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    stream_bytes: float = 0.0
    spec_bandwidth: float = 0.0

    def add(self, part: str, estimate: Estimate, times: int = 1) -> None:
        seconds = estimate.seconds * times
        self.seconds += seconds
        self.parts[part] += seconds
        self.by_tag[estimate.tag] += seconds

    def extend(self, other: "StepCost") -> None:
        for part, seconds in other.parts.items():
            self.parts[part] += seconds
        for tag, seconds in other.by_tag.items():
            self.by_tag[tag] += seconds
        self.seconds += other.seconds
        self.stream_bytes += other.stream_bytes

    @property
    def floor_seconds(self) -> float:
        """The bytes the step must stream over the GPU's spec bandwidth."""
        return self.stream_bytes / self.spec_bandwidth

    def to_dict(self) -> dict:
        return {"seconds": self.seconds, "parts": dict(self.parts), "by_tag": dict(self.by_tag),
                "floor_seconds": self.floor_seconds}


def _weights_bytes(shape: ModelShape) -> float:
    return BF16 * (shape.parameters() - shape.vocab * shape.hidden * (0 if shape.tied_embeddings else 1))


def _layers(gpu: GpuTables, shape: ModelShape, cost: StepCost, tokens: int, attention: Estimate) -> None:
    """Every decoder layer's GEMMs, attention and elementwise ops for ``tokens`` tokens."""
    L, h, hd = shape.layers, shape.hidden, shape.head_dim
    q, kv, inter = shape.heads * hd, shape.kv_heads * hd, shape.intermediate
    cost.add("gemm", gpu.gemm(tokens, q + 2 * kv, h), L)
    cost.add("gemm", gpu.gemm(tokens, h, q), L)
    cost.add("gemm", gpu.gemm(tokens, 2 * inter, h), L)
    cost.add("gemm", gpu.gemm(tokens, h, inter), L)
    cost.add("attention", attention, L)
    # bytes read + written: 2 RMS norms (x in, x out), RoPE (q and k in and out), SiLU·mul
    # (gate and up in, one out), 2 residual adds (two in, one out)
    per_layer = BF16 * tokens * (2 * 2 * h + 2 * (q + kv) + 3 * inter + 2 * 3 * h)
    if shape.qk_norm:
        per_layer += BF16 * tokens * 2 * (q + kv)
    cost.add("elementwise", gpu.elementwise(per_layer), L)


def _head(gpu: GpuTables, shape: ModelShape, cost: StepCost, tokens: int, sampled: int) -> None:
    """Embedding gather, final norm, LM head over the sampled rows, sampling."""
    cost.add("embedding", gpu.elementwise(BF16 * 2 * tokens * shape.hidden))
    cost.add("elementwise", gpu.elementwise(BF16 * 2 * sampled * shape.hidden))
    cost.add("lm_head", gpu.gemm(sampled, shape.vocab, shape.hidden))
    # softmax and sampling read the fp32 logits twice
    cost.add("sampling", gpu.elementwise(4 * 2 * sampled * shape.vocab))


def decode_step(gpu: GpuTables, shape: ModelShape, context: Sequence[int]) -> StepCost:
    """One decode step of ``len(context)`` rows, row i with ``context[i]`` cached tokens."""
    b = len(context)
    mean = max(1, round(sum(context) / b))
    cost = StepCost(spec_bandwidth=gpu.spec["memory_bandwidth_bytes_per_s"])
    attention = gpu.decode_attention(b, mean, shape.heads, shape.kv_heads, shape.head_dim)
    _layers(gpu, shape, cost, b, attention)
    _head(gpu, shape, cost, b, b)
    cost.stream_bytes = _weights_bytes(shape) + shape.kv_bytes_per_token(BF16) * sum(context)
    return cost


def prefill(gpu: GpuTables, shape: ModelShape, prompt_tokens: Sequence[int]) -> StepCost:
    """The prefill of ``len(prompt_tokens)`` fresh prompts packed into one pass (logits only
    for each prompt's last position)."""
    n = len(prompt_tokens)
    tokens = sum(prompt_tokens)
    mean = max(1, round(tokens / n))
    cost = StepCost(spec_bandwidth=gpu.spec["memory_bandwidth_bytes_per_s"])
    attention = gpu.prefill_attention(n, mean, shape.heads, shape.kv_heads, shape.head_dim)
    _layers(gpu, shape, cost, tokens, attention)
    _head(gpu, shape, cost, tokens, n)
    cost.stream_bytes = _weights_bytes(shape)
    return cost


def verify_pass(gpu: GpuTables, shape: ModelShape, context: Sequence[int], lookahead: int) -> StepCost:
    """The target's pass over ``lookahead + 1`` tokens per row (the drafts and the bonus)."""
    b, tokens = len(context), len(context) * (lookahead + 1)
    mean = max(1, round(sum(context) / b)) + lookahead
    cost = StepCost(spec_bandwidth=gpu.spec["memory_bandwidth_bytes_per_s"])
    attention = gpu.decode_attention(b, mean, shape.heads, shape.kv_heads, shape.head_dim)
    _layers(gpu, shape, cost, tokens, attention)
    _head(gpu, shape, cost, tokens, tokens)
    cost.stream_bytes = _weights_bytes(shape) + shape.kv_bytes_per_token(BF16) * sum(context)
    return cost


def speculative_round(gpu: GpuTables, target: ModelShape, draft: ModelShape, context: Sequence[int],
                      lookahead: int) -> StepCost:
    """``lookahead`` draft decode steps (the rows' contexts growing by one each) and one target
    verify pass of ``lookahead + 1`` tokens per row."""
    cost = StepCost(spec_bandwidth=gpu.spec["memory_bandwidth_bytes_per_s"])
    for j in range(lookahead):
        step = decode_step(gpu, draft, [c + j for c in context])
        for part in list(step.parts):
            step.parts[f"draft {part}"] = step.parts.pop(part)
        cost.extend(step)
    cost.extend(verify_pass(gpu, target, context, lookahead))
    return cost
