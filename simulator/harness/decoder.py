"""A compact Llama/Qwen-style decoder with a per-row static KV cache.

Architecture: token embedding; per layer RMSNorm → grouped-query attention with rotary
position embedding (optional q/k/v biases as in Qwen2, optional per-head q/k RMSNorm as in
Qwen3) → residual → RMSNorm → SwiGLU MLP → residual; final RMSNorm and the output head
(tied to the embedding or not).

The KV cache is one static tensor per K and V, ``[layers, B, kv_heads, S_max, head_dim]``,
plus a position per row (``KVCache.pos``, a device tensor). A forward of ``T`` tokens for
row ``b`` writes its keys and values at positions ``pos[b] .. pos[b]+T-1`` and attends to
every cached position up to its own. Each row can therefore advance by a different
number of tokens, and rolling back rejected tokens is moving ``pos`` back: entries past
``pos`` are stale and simply overwritten by the next write. Nothing is ever re-aligned or
re-padded, and nothing here reads a device value on the host, so a step never
synchronises.

Attention reads the cache only up to ``view`` positions (a length the caller chooses,
e.g. a bucket above the longest row), so short contexts do not pay for ``S_max``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from simulator.harness.presets import ModelShape


@dataclass
class KVCache:
    """Static per-row KV cache: ``k``/``v`` ``[layers, B, kv_heads, S_max, head_dim]``, ``pos`` ``[B]``."""

    k: torch.Tensor
    v: torch.Tensor
    pos: torch.Tensor

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 (as the reference implementations do), return in x's dtype.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def rope_tables(head_dim: int, max_len: int, theta: float, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables ``[max_len, head_dim]`` (the rotate-half convention of Llama/Qwen)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(max_len, device=device, dtype=torch.float32), inv)
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[B, H, T, D]`` by per-token tables ``cos``/``sin`` ``[B, 1, T, D]``."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def attend_cached(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  rows: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor, view: int, gqa: bool) -> torch.Tensor:
    """One layer's attention against its cache: this pass's keys and values written at each
    row's own positions, then ``q`` attending the first ``view`` cached positions under ``mask``.

    ``q`` ``[B, H, T, D]`` and ``k`` ``[B, KV, T, D]`` (rotated), ``v`` ``[B, T, KV, D]``, the
    layer's cache ``[B, KV, S_max, D]``, ``rows`` ``[B, 1]``, ``slots`` ``[B, T]``, ``mask``
    ``[B, 1, T, view]`` (True: attend). Returns ``[B, H, T, D]``. This is the op the measured
    decode- and verify-attention tables time (:mod:`simulator.harness.optable`).
    """
    # Advanced indexing on the batch and sequence dims puts them first: [B, T, kv_heads, D].
    k_cache[rows, :, slots] = k.transpose(1, 2)
    v_cache[rows, :, slots] = v
    keys, values = k_cache[:, :, :view], v_cache[:, :, :view]
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=gqa)


def attend_fresh(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gqa: bool) -> torch.Tensor:
    """Causal attention over this pass's tokens alone (no cache): ``q`` ``[B, H, T, D]``, ``k``
    ``[B, KV, T, D]``, ``v`` ``[B, T, KV, D]``; the op the measured prefill-attention table times."""
    return F.scaled_dot_product_attention(q, k, v.transpose(1, 2), is_causal=True, enable_gqa=gqa)


class Layer(nn.Module):
    def __init__(self, s: ModelShape) -> None:
        super().__init__()
        self.s = s
        self.attn_norm = RMSNorm(s.hidden, s.norm_eps)
        self.q = nn.Linear(s.hidden, s.heads * s.head_dim, bias=s.qkv_bias)
        self.k = nn.Linear(s.hidden, s.kv_heads * s.head_dim, bias=s.qkv_bias)
        self.v = nn.Linear(s.hidden, s.kv_heads * s.head_dim, bias=s.qkv_bias)
        self.o = nn.Linear(s.heads * s.head_dim, s.hidden, bias=False)
        self.q_norm = RMSNorm(s.head_dim, s.norm_eps) if s.qk_norm else None
        self.k_norm = RMSNorm(s.head_dim, s.norm_eps) if s.qk_norm else None
        self.mlp_norm = RMSNorm(s.hidden, s.norm_eps)
        self.gate = nn.Linear(s.hidden, s.intermediate, bias=False)
        self.up = nn.Linear(s.hidden, s.intermediate, bias=False)
        self.down = nn.Linear(s.intermediate, s.hidden, bias=False)

    def forward(self, x, cos, sin, k_cache, v_cache, rows, slots, mask, view):
        B, T, _ = x.shape
        s = self.s
        h = self.attn_norm(x)
        q = self.q(h).view(B, T, s.heads, s.head_dim)
        k = self.k(h).view(B, T, s.kv_heads, s.head_dim)
        v = self.v(h).view(B, T, s.kv_heads, s.head_dim)
        if self.q_norm is not None and self.k_norm is not None:  # both or neither (qk_norm)
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q.transpose(1, 2), cos, sin)
        k = apply_rope(k.transpose(1, 2), cos, sin)
        gqa = s.heads != s.kv_heads
        if k_cache is None:  # plain causal attention over these tokens only (reference path)
            out = attend_fresh(q, k, v, gqa)
        else:
            out = attend_cached(q, k, v, k_cache, v_cache, rows, slots, mask, view, gqa)
        x = x + self.o(out.transpose(1, 2).reshape(B, T, s.heads * s.head_dim))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Decoder(nn.Module):
    """A decoder of shape ``shape`` with random weights (std 0.02, as HF initialises).

    The weights are drawn on the host from ``seed`` (the same weights on every device), or,
    with ``init_on_device``, drawn on ``device`` itself by its own generator: the layers are
    laid out on the meta device and only then allocated, so a multi-billion-parameter model
    is ready in seconds instead of minutes of host sampling (timings depend on shapes only).
    """

    # rotary tables [max_len, head_dim], registered as buffers so that they follow .to()
    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, shape: ModelShape, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, seed: int = 0, max_len: int = 8192,
                 init_on_device: bool = False) -> None:
        super().__init__()
        self.shape = shape
        with torch.device("meta") if init_on_device else contextlib.nullcontext():
            # On the meta device the embedding is given its (empty) weight: its own normal_
            # init, which every weight drawn below replaces, would load torch's Python meta
            # kernels and their compiler (about 2 CPU-seconds a process) to do nothing.
            self.embed = nn.Embedding(shape.vocab, shape.hidden,
                                      _weight=torch.empty(shape.vocab, shape.hidden) if init_on_device else None)
            self.layers = nn.ModuleList(Layer(shape) for _ in range(shape.layers))
            self.norm = RMSNorm(shape.hidden, shape.norm_eps)
            self.head = None if shape.tied_embeddings else nn.Linear(shape.hidden, shape.vocab, bias=False)
        if init_on_device:
            # meta tensors change dtype for free; allocating afterwards never holds fp32 copies
            self.to(dtype=dtype).to_empty(device=device)
            generator = torch.Generator(device=device).manual_seed(seed)
            with torch.no_grad():
                for name, p in self.named_parameters():
                    if "norm" in name:
                        p.fill_(1.0)
                    else:
                        p.normal_(0.0, 0.02, generator=generator)
        else:
            generator = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for name, p in self.named_parameters():
                    if "norm" not in name:
                        p.copy_(torch.randn(p.shape, generator=generator) * 0.02)
            self.to(device=device, dtype=dtype)
        self.eval()
        cos, sin = rope_tables(shape.head_dim, max_len, shape.rope_theta, device, dtype)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parameters())

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        s = self.shape
        size = (s.layers, batch, s.kv_heads, max_len, s.head_dim)
        return KVCache(torch.zeros(size, device=self.device, dtype=self.dtype),
                       torch.zeros(size, device=self.device, dtype=self.dtype),
                       torch.zeros(batch, device=self.device, dtype=torch.long))

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, cache: KVCache, view: int | None = None) -> torch.Tensor:
        """Logits ``[B, T, vocab]`` for ``tokens`` ``[B, T]`` placed at ``cache.pos`` per row.

        Writes their keys/values into ``cache``; does not move ``cache.pos`` (the caller
        decides how far each row advances). ``view`` bounds the attended cache length
        (default ``S_max``); it must exceed every written position.
        """
        B, T = tokens.shape
        view = cache.max_len if view is None else view
        offsets = torch.arange(T, device=tokens.device)
        slots = cache.pos[:, None] + offsets                                 # [B, T]
        rows = torch.arange(B, device=tokens.device)[:, None]                # [B, 1]
        cos, sin = self.cos[slots][:, None], self.sin[slots][:, None]        # [B, 1, T, D]
        keys = torch.arange(view, device=tokens.device)
        mask = (keys[None, None, None, :] <= slots[:, None, :, None])        # [B, 1, T, view]
        x = self.embed(tokens)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache.k[i], cache.v[i], rows, slots, mask, view)
        x = self.norm(x)
        return x @ self.embed.weight.T if self.head is None else self.head(x)

    @torch.no_grad()
    def full_forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits of a plain causal forward over ``tokens`` ``[B, T]`` from position 0.

        The reference the cached path is tested against: no cache, no mask, SDPA's own
        causal attention.
        """
        T = tokens.shape[1]
        cos, sin = self.cos[:T][None, None], self.sin[:T][None, None]
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin, None, None, None, None, None, T)
        x = self.norm(x)
        return x @ self.embed.weight.T if self.head is None else self.head(x)
