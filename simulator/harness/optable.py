"""A device's own per-op tables, timed with the harness's torch ops, for the composition.

:func:`measure_op_tables` times on one device, in one dtype, the ops a pass of
:mod:`simulator.harness.decoder` runs, over a grid chosen from the presets' shapes
(:meth:`OpGrid.for_shapes`), and writes them in the layout of the shipped GPU tables
(:mod:`simulator.hardware.tables`), so that ``load_gpu(folder)`` answers from them and
:mod:`simulator.hardware.compose` (style ``harness``) composes this device's passes:

* ``gemm.parquet`` (m, n, k, seconds): ``F.linear(x, W)`` with ``x`` ``[m, 1, k]`` and ``W``
  ``[n, k]``, what ``nn.Linear`` runs (``x[m, k] @ W[k, n]``);
* ``decode_attention.parquet`` (batch_size, step, num_heads, num_key_value_heads, head_dim,
  seconds): :func:`~simulator.harness.decoder.attend_cached` for one new token per row after
  ``step`` cached ones — both cache writes, SDPA's conversion of the bool mask, SDPA over
  ``step + 1`` positions;
* ``prefill_attention.parquet`` (batch_size, isl, ...): :func:`~simulator.harness.decoder.attend_fresh`,
  causal SDPA over ``isl`` fresh tokens per row;
* ``verify_attention.parquet`` (batch_size, ..., step, tokens, seconds), a table the shipped
  GPUs lack: ``attend_cached`` for ``tokens`` new tokens per row (a verify pass, a round's
  first draft step) after ``step`` cached ones; on the CPU three queries per row cost some
  40 % more than one, which a one-query decode table cannot say;
* ``optable.json``: the device, dtype, torch version and threads, the copy bandwidth
  (:func:`~simulator.harness.timing.measure_bandwidth`), a peak rate from one large GEMM, and
  every elementwise op the ``harness`` style prices (add, mul, rsqrt, ..., softmax,
  exponential noise, argmax) timed at several sizes, with its fit ``c0 + bytes · β``;
  ``GpuTables.elementwise(nbytes, op)`` answers from these timings.

Memory context. A decode pass streams weights (and KV cache) far larger than a CPU's
last-level cache or a GPU's L2, so every weight is read from memory; timed alone and
repeated, the same weight would stay cached and the GEMM would run several times faster. So
each GEMM is timed where it runs: at each m the grid's GEMMs run as the passes of the
shapes run them (:attr:`OpGrid.passes`: every layer's q, k, v, o, gate, up and down, then the
output head, each on its own weight), every call timed. Timed in that order they also take
what a pass does to the memory system (on the CPU this measured a GEMM up to 15 % slower than
the same GEMM cycled alone through copies of its weight). KV caches are rotated through
copies totalling :attr:`OpGrid.rotate_bytes` (the untimed ``setup`` of each repeat picks the
next copy), while activations (the GEMM's input, queries, the mask, elementwise operands)
are reused, as in a pass, where the op before has just written them.

Each point is the median of its timed repeats after warm-up (:func:`~simulator.harness.timing.time_call`);
repeats stop early once they add up to :attr:`OpGrid.point_seconds`, so large shapes do not
dominate the run.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd
import torch
import torch.nn.functional as F

from simulator.hardware.compose import FP32, HARNESS_STREAMS
from simulator.hardware.tables import SPEC_FILE, elementwise_table
from simulator.harness.decoder import attend_cached, attend_fresh
from simulator.harness.presets import ModelShape
from simulator.harness.timing import measure_bandwidth, synchronize, time_call, time_sequence, time_split

FORMAT = "simctl-optable/1"
#: Elementwise ops timed at :attr:`OpGrid.elementwise_numel` sizes, and those timed over
#: :attr:`OpGrid.logit_rows` rows of the vocabulary (sampling)
ACTIVATION_OPS = ("add", "mul", "pow", "rsqrt", "neg", "silu", "mean", "cat", "index", "embedding")
LOGIT_OPS = ("softmax", "exponential", "div", "argmax")
#: Pure streaming ops whose timings, pooled, price an op the table did not time
POOLED = ("add", "mul", "neg", "pow")


@dataclass(frozen=True)
class OpGrid:
    """What :func:`measure_op_tables` times: GEMM ``(m, n, k)`` triples (timed inside
    ``passes``, each pass the ``(n, k)`` of its GEMMs in order), decode-attention
    ``(batch, step, heads, kv_heads, head_dim)`` and prefill-attention ``(batch, isl, heads,
    kv_heads, head_dim)`` points, elementwise sizes (elements) and sampling rows of ``vocab``;
    how long each point is timed, and how many bytes of weight / cache copies it rotates."""

    gemm: tuple[tuple[int, int, int], ...]
    passes: tuple[tuple[tuple[int, int], ...], ...]
    decode_attention: tuple[tuple[int, int, int, int, int], ...]
    prefill_attention: tuple[tuple[int, int, int, int, int], ...]
    verify_attention: tuple[tuple[int, int, int, int, int, int], ...] = ()
    elementwise_numel: tuple[int, ...] = (16, 256, 2048, 16384, 131072, 1048576)
    row_width: int = 1024
    vocab: int = 32000
    logit_rows: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    repeats: int = 15
    min_repeats: int = 3
    warmup: int = 2
    point_seconds: float = 0.3
    rotate_bytes: int = 256 << 20
    shapes: tuple[str, ...] = ()

    @classmethod
    def for_shapes(cls, shapes: Sequence[ModelShape], batches: Sequence[int] = (1, 2, 4, 8),
                   contexts: Sequence[int] = (16, 32, 64, 128, 192, 256, 384, 512),
                   lookaheads: Sequence[int] = (1, 2, 3), prompt_tokens: Sequence[int] = (16, 64, 256),
                   **timing: Any) -> OpGrid:
        """The grid covering what the ``harness`` composition asks of these shapes at these
        batches, cached contexts, lookaheads and prompt lengths: GEMMs at every pass's token
        count (decode ``B``, a round's first draft step ``2B``, verify ``B(k+1)``; prefill
        ``B·P`` for the layer GEMMs, not the output head, which a prefill would run at sizes
        too slow to time here), for each of the shapes' (n, k) pairs; attention at every
        batch and context (or prompt length) for each head configuration. ``timing``
        overrides the timing fields (``repeats``, ``point_seconds``, ...)."""
        if not shapes:
            raise ValueError("for_shapes needs at least one model shape")
        ms = sorted({b for b in batches} | {2 * b for b in batches}
                    | {b * (k + 1) for b in batches for k in lookaheads})
        prefill_ms = sorted({b * p for b in batches for p in prompt_tokens} - set(ms))
        layer_nk: set[tuple[int, int]] = set()
        head_nk: set[tuple[int, int]] = set()
        heads: set[tuple[int, int, int]] = set()
        for s in shapes:
            q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
            layer_nk |= {(q, s.hidden), (kv, s.hidden), (s.hidden, q), (s.intermediate, s.hidden),
                         (s.hidden, s.intermediate)}
            head_nk.add((s.vocab, s.hidden))
            heads.add((s.heads, s.kv_heads, s.head_dim))
        gemm = sorted({(m, n, k) for m in ms for n, k in layer_nk | head_nk}
                      | {(m, n, k) for m in prefill_ms for n, k in layer_nk})
        passes = tuple(_pass_layout(s) for s in dict.fromkeys(shapes))
        decode = sorted((b, c, *h) for b in batches for c in contexts for h in heads)
        prefill = sorted((b, p, *h) for b in batches for p in prompt_tokens for h in heads)
        # several new tokens per row against the cache: a round's first draft step (2) and
        # its verify pass (k + 1)
        tokens = sorted({2} | {k + 1 for k in lookaheads})
        verify = sorted((b, c, t, *h) for b in batches for c in contexts for t in tokens for h in heads)
        rows = sorted({b for b in batches} | {b * (k + 1) for b in batches for k in lookaheads})
        return cls(tuple(gemm), passes, tuple(decode), tuple(prefill), tuple(verify),
                   row_width=max(s.hidden for s in shapes),
                   vocab=max(s.vocab for s in shapes), logit_rows=tuple(rows),
                   shapes=tuple(s.name for s in shapes), **timing)

    def weight_bytes(self, dtype_bytes: int) -> int:
        """Bytes of the weights the GEMM timing holds at once (one per GEMM of each pass)."""
        order = [nk for layout in self.passes for nk in layout]
        order += sorted({(n, k) for _, n, k in self.gemm} - set(order))
        return dtype_bytes * sum(n * k for n, k in order)

    def points(self) -> int:
        """How many measurements the grid makes (for a progress bar)."""
        return (2 + len(self.gemm) + len(self.decode_attention) + len(self.prefill_attention)
                + len(self.verify_attention)
                + len(ACTIVATION_OPS) * len(self.elementwise_numel) + len(LOGIT_OPS) * len(self.logit_rows)
                + len(self.elementwise_numel) + 2)   # casts (timed only off fp32; counted anyway), host


def _randn(size: tuple[int, ...], dev: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(size, device=dev, dtype=dtype) * 0.02


def _randn_pair(size: tuple[int, ...], dev: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return _randn(size, dev, dtype), _randn(size, dev, dtype)


def _pass_layout(s: ModelShape) -> tuple[tuple[int, int], ...]:
    """The (n, k) of every GEMM one pass of ``s`` runs, in order: per layer q, k, v, o, gate,
    up, down (:class:`~simulator.harness.decoder.Layer`), then the output head."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    layer = ((q, s.hidden), (kv, s.hidden), (kv, s.hidden), (s.hidden, q), (s.intermediate, s.hidden),
             (s.intermediate, s.hidden), (s.hidden, s.intermediate))
    return layer * s.layers + ((s.vocab, s.hidden),)


class _Rotation:
    """Copies of an operand set, cycled between timed calls so that each call finds its
    operands out of cache: ``copies · nbytes`` reach ``budget`` (at least two copies)."""

    def __init__(self, make: Callable[[], Any], nbytes: int, budget: int, most: int = 512) -> None:
        first = make()
        count = max(2, min(most, math.ceil(budget / max(nbytes, 1))))
        # clones write real pages (a fresh zeroed tensor could map one shared zero page)
        self.copies = [first] + [tuple(t.clone() for t in first) if isinstance(first, tuple) else first.clone()
                                 for _ in range(count - 1)]
        self.index = 0

    def advance(self) -> None:
        self.index = (self.index + 1) % len(self.copies)

    @property
    def current(self) -> Any:
        return self.copies[self.index]


class _PassContext:
    """The GEMMs of the grid's passes, each on its own weight (one pass's memory), run one at
    a time, untimed, before each timed call of another op, so that op meets the caches (and
    the host's own code and data) as a pass leaves them: right after a layer GEMM
    (:meth:`layer`) or, for the sampling after a pass, after an output head (:meth:`head`)."""

    def __init__(self, weights: Sequence[tuple[int, int, torch.Tensor]], heads: set[tuple[int, int]],
                 dev: torch.device, dtype: torch.dtype) -> None:
        self.layers = [w for n, k, w in weights if (n, k) not in heads] or [w for _, _, w in weights]
        self.heads = [w for n, k, w in weights if (n, k) in heads] or self.layers
        self.x = {w.shape[1]: torch.randn(1, 1, w.shape[1], device=dev, dtype=dtype) for _, _, w in weights}
        self.i = self.j = 0

    def layer(self) -> None:
        self.i = (self.i + 1) % len(self.layers)
        w = self.layers[self.i]
        F.linear(self.x[w.shape[1]], w)

    def head(self) -> None:
        self.j = (self.j + 1) % len(self.heads)
        w = self.heads[self.j]
        F.linear(self.x[w.shape[1]], w)


def _then(*steps: Callable[[], object]) -> Callable[[], None]:
    """One untimed setup running ``steps`` in order."""
    def run() -> None:
        for step in steps:
            step()
    return run


class _Timed(NamedTuple):
    """One point: the op's seconds (on a GPU its kernels' time on the device, on a CPU the
    call's) and, on a GPU, the host's seconds issuing the call (None on a CPU, where the
    call's seconds already hold them)."""

    seconds: float
    host_s: float | None = None


def _time(fn: Callable[[], object], dev: torch.device, grid: OpGrid,
          setup: Callable[[], object] | None = None) -> _Timed:
    """Median seconds of ``fn`` after warm-up (:func:`~simulator.harness.timing.time_split`
    on a GPU); repeats capped by ``grid.point_seconds``."""
    for _ in range(grid.warmup):
        if setup:
            setup()
        fn()
    synchronize(dev)
    if setup:
        setup()
    start = time.perf_counter()
    fn()
    synchronize(dev)
    once = time.perf_counter() - start
    repeats = int(min(grid.repeats, max(grid.min_repeats, grid.point_seconds / max(once, 1e-9))))
    if dev.type != "cuda":
        return _Timed(time_call(fn, dev, warmup=0, repeats=repeats, setup=setup).median)
    device_s, host_s = time_split([fn], dev, repeats, setup)
    return _Timed(float(statistics.median(device_s[0])), float(statistics.median(host_s[0])))


def _device_name(dev: torch.device) -> str:
    from simulator.harness.profiler import device_name

    return device_name(dev)


def memory_bytes(dev: torch.device) -> float | None:
    """The device's memory (a GPU's, or this machine's RAM), or None where unknown."""
    if dev.type == "cuda":
        return float(torch.cuda.get_device_properties(dev).total_memory)
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def _pass_weights(dev: torch.device, dtype: torch.dtype, grid: OpGrid) -> list[tuple[int, int, torch.Tensor]]:
    """One weight per GEMM of each pass (and one per grid GEMM no pass lists), in pass order."""
    order = [nk for layout in grid.passes for nk in layout]
    order += sorted({(n, k) for _, n, k in grid.gemm} - set(order))
    return [(n, k, _randn((n, k), dev, dtype)) for n, k in order]


def _gemm_rows(dev: torch.device, dtype: torch.dtype, grid: OpGrid, weights: Sequence[tuple[int, int, torch.Tensor]],
               tick: Callable[[str], None]) -> list[dict]:
    """Every GEMM of the grid timed inside the passes it belongs to (module docstring): at each
    m, the passes' GEMMs run in order, each on its own weight, each timed; a GEMM's seconds
    are the median over its occurrences and passes. A pass too slow to repeat (large m: the
    GEMMs are compute-bound there, and their context hardly matters) is cut to the first
    occurrence of each (n, k)."""
    wanted = set(grid.gemm)
    rows = []
    for m in sorted({m for m, _, _ in wanted}):
        xs: dict[int, torch.Tensor] = {}
        sequence = [(n, k, w) for n, k, w in weights if (m, n, k) in wanted]
        for _, k, _ in sequence:
            xs.setdefault(k, torch.randn(m, 1, k, device=dev, dtype=dtype))
        distinct = sorted({(n, k) for n, k, _ in sequence})
        budget = grid.point_seconds * len(distinct)
        start = time.perf_counter()
        time_sequence([partial(F.linear, xs[k], w) for n, k, w in sequence], dev, 1)
        synchronize(dev)
        once = time.perf_counter() - start
        if once * grid.min_repeats > 4 * budget:
            first = {(n, k): w for n, k, w in reversed(sequence)}
            once *= len(distinct) / len(sequence)
            sequence = [(n, k, first[(n, k)]) for n, k in distinct]
        calls = [partial(F.linear, xs[k], w) for n, k, w in sequence]
        time_sequence(calls, dev, max(grid.warmup - 1, 0))
        passes = int(min(grid.repeats, max(grid.min_repeats, budget / max(once, 1e-9))))
        samples, issued = time_split(calls, dev, passes)
        for n, k in distinct:
            tick(f"gemm m={m} n={n} k={k}")
            times = [t for (nn, kk, _), ts in zip(sequence, samples, strict=True) if (nn, kk) == (n, k) for t in ts]
            row = {"m": m, "n": n, "k": k, "seconds": float(statistics.median(times))}
            if dev.type == "cuda":
                hosts = [t for (nn, kk, _), ts in zip(sequence, issued, strict=True) if (nn, kk) == (n, k) for t in ts]
                row["host_seconds"] = float(statistics.median(hosts))
            rows.append(row)
    return rows


def _cached_attention_seconds(dev: torch.device, dtype: torch.dtype, grid: OpGrid, context: _PassContext, b: int,
                              step: int, tokens: int, heads: int, kv_heads: int, head_dim: int) -> _Timed:
    """Seconds of :func:`~simulator.harness.decoder.attend_cached` for ``tokens`` new tokens
    per row after ``step`` cached ones: the cache viewed up to ``step + tokens`` positions,
    as the decoder views it when the caller's view is the longest row (no bucket)."""
    es = torch.finfo(dtype).bits // 8
    view = step + tokens
    size = (b, kv_heads, view, head_dim)
    caches = _Rotation(partial(_randn_pair, size, dev, dtype), 2 * math.prod(size) * es, grid.rotate_bytes)
    q = torch.randn(b, heads, tokens, head_dim, device=dev, dtype=dtype)
    k = torch.randn(b, kv_heads, tokens, head_dim, device=dev, dtype=dtype)       # rotated keys
    v = torch.randn(b, tokens, kv_heads, head_dim, device=dev, dtype=dtype)       # the v projection's view
    rows = torch.arange(b, device=dev)[:, None]
    slots = step + torch.arange(tokens, device=dev)[None, :].expand(b, tokens)
    mask = torch.arange(view, device=dev)[None, None, None, :] <= slots[:, None, :, None]

    def run() -> torch.Tensor:
        k_cache, v_cache = caches.current
        return attend_cached(q, k, v, k_cache, v_cache, rows, slots, mask, view, heads != kv_heads)
    return _time(run, dev, grid, _then(caches.advance, context.layer))


def _with_host(row: dict[str, Any], timed: _Timed) -> dict[str, Any]:
    """A table row with its seconds and, where timed apart (a GPU), the host's seconds."""
    row["seconds"] = timed.seconds
    if timed.host_s is not None:
        row["host_seconds"] = timed.host_s
    return row


def _decode_rows(dev: torch.device, dtype: torch.dtype, grid: OpGrid, context: _PassContext,
                 tick: Callable[[str], None]) -> list[dict]:
    rows = []
    for b, step, heads, kv_heads, head_dim in grid.decode_attention:
        tick(f"decode attention B={b} step={step} heads={heads}/{kv_heads}x{head_dim}")
        timed = _cached_attention_seconds(dev, dtype, grid, context, b, step, 1, heads, kv_heads, head_dim)
        rows.append(_with_host({"batch_size": b, "step": step, "num_heads": heads, "num_key_value_heads": kv_heads,
                                "head_dim": head_dim}, timed))
    return rows


def _verify_rows(dev: torch.device, dtype: torch.dtype, grid: OpGrid, context: _PassContext,
                 tick: Callable[[str], None]) -> list[dict]:
    rows = []
    for b, step, tokens, heads, kv_heads, head_dim in grid.verify_attention:
        tick(f"verify attention B={b} step={step} tokens={tokens} heads={heads}/{kv_heads}x{head_dim}")
        timed = _cached_attention_seconds(dev, dtype, grid, context, b, step, tokens, heads, kv_heads, head_dim)
        rows.append(_with_host({"batch_size": b, "step": step, "tokens": tokens, "num_heads": heads,
                                "num_key_value_heads": kv_heads, "head_dim": head_dim}, timed))
    return rows


def _prefill_rows(dev: torch.device, dtype: torch.dtype, grid: OpGrid, context: _PassContext,
                  tick: Callable[[str], None]) -> list[dict]:
    rows = []
    for b, isl, heads, kv_heads, head_dim in grid.prefill_attention:
        tick(f"prefill attention B={b} isl={isl} heads={heads}/{kv_heads}x{head_dim}")
        q = torch.randn(b, heads, isl, head_dim, device=dev, dtype=dtype)
        k = torch.randn(b, kv_heads, isl, head_dim, device=dev, dtype=dtype)
        v = torch.randn(b, isl, kv_heads, head_dim, device=dev, dtype=dtype)
        timed = _time(partial(attend_fresh, q, k, v, heads != kv_heads), dev, grid, context.layer)
        rows.append(_with_host({"batch_size": b, "isl": isl, "num_heads": heads, "num_key_value_heads": kv_heads,
                                "head_dim": head_dim}, timed))
    return rows


def _activation_op(op: str, numel: int, width: int, dev: torch.device,
                   dtype: torch.dtype) -> tuple[Callable[[], object], int]:
    """The op as the decoder runs it on ``numel`` elements (rows of ``width``), and how many
    elements the op's byte count (:data:`~simulator.hardware.compose.HARNESS_STREAMS`) uses."""
    width = min(width, numel)
    rows = max(1, numel // width)
    numel = rows * width
    # norms compute in fp32; everything else runs in the tables' dtype
    fdt = torch.float32 if op in ("pow", "rsqrt", "mean") else dtype
    a = torch.randn(rows, width, device=dev, dtype=fdt)
    b = torch.randn(rows, width, device=dev, dtype=fdt)
    if op == "add":
        return (lambda: a + b), numel
    if op == "mul":
        return (lambda: a * b), numel
    if op == "pow":
        return (lambda: a.pow(2)), numel
    if op == "rsqrt":
        return (lambda: torch.rsqrt(a)), numel
    if op == "neg":
        return (lambda: -a), numel
    if op == "silu":
        return (lambda: F.silu(a)), numel
    if op == "mean":
        return (lambda: a.mean(-1, keepdim=True)), numel
    if op == "cat":
        half = width // 2
        return (lambda: torch.cat([a[..., half:], a[..., :half]], dim=-1)), numel
    if op == "index":
        table = torch.randn(2 * rows, width, device=dev, dtype=dtype)
        idx = torch.arange(rows, device=dev) * 2
        return (lambda: table[idx]), numel
    if op == "embedding":
        table = torch.randn(max(2 * rows, 1024), width, device=dev, dtype=dtype)
        idx = torch.randint(0, table.shape[0], (rows,), device=dev)
        return (lambda: F.embedding(idx, table)), numel
    raise ValueError(f"unknown elementwise op {op!r}")


def _logit_op(op: str, rows: int, vocab: int, dev: torch.device,
              generator: torch.Generator) -> Callable[[], object]:
    """The sampling ops as :func:`~simulator.harness.specdec.sample` and the softmax before it run them (fp32)."""
    logits = torch.randn(rows, vocab, device=dev, dtype=torch.float32)
    probs = torch.softmax(logits, -1)
    noise = torch.empty_like(probs).exponential_(generator=generator)
    if op == "softmax":
        return lambda: torch.softmax(logits, -1)
    if op == "exponential":
        return lambda: torch.empty_like(probs).exponential_(generator=generator)
    if op == "div":
        return lambda: probs / noise
    if op == "argmax":
        return lambda: torch.argmax(probs, dim=-1)
    raise ValueError(f"unknown sampling op {op!r}")


def _point(nbytes: float, timed: _Timed) -> list[float]:
    """An elementwise point: ``[bytes, seconds]``, and the host's seconds where timed apart."""
    return [nbytes, timed.seconds] + ([timed.host_s] if timed.host_s is not None else [])


def _elementwise(dev: torch.device, dtype: torch.dtype, grid: OpGrid, context: _PassContext,
                 tick: Callable[[str], None]) -> dict[str, Any]:
    es = torch.finfo(dtype).bits // 8
    points: dict[str, list[list[float]]] = {}
    for op in ACTIVATION_OPS:
        for numel in grid.elementwise_numel:
            tick(f"elementwise {op} n={numel}")
            fn, n = _activation_op(op, numel, grid.row_width, dev, dtype)
            size = FP32 if op in ("pow", "rsqrt", "mean") else es
            points.setdefault(op, []).append(_point(HARNESS_STREAMS[op] * n * size, _time(fn, dev, grid, context.layer)))
    for numel in grid.elementwise_numel:
        tick(f"elementwise copy n={numel}")
        if dtype != torch.float32:   # a cast to fp32 and back exists only off fp32
            x = torch.randn(numel, device=dev, dtype=dtype)
            points.setdefault("copy", []).append(_point((es + FP32) * numel, _time(x.float, dev, grid, context.layer)))
    generator = torch.Generator(device=dev).manual_seed(0)
    for op in LOGIT_OPS:
        for r in grid.logit_rows:
            tick(f"sampling {op} rows={r}")
            points.setdefault(op, []).append(_point(HARNESS_STREAMS[op] * r * grid.vocab * FP32,
                                                    _time(_logit_op(op, r, grid.vocab, dev, generator), dev, grid,
                                                          context.head)))
    ops = {}
    for op, pts in points.items():
        c0, beta, _ = elementwise_table(pts).fit
        ops[op] = {"points": pts, "c0_s": float(c0), "bytes_per_s": float(1 / beta) if beta > 0 else None}
    pooled = elementwise_table([pt for op in POOLED for pt in points[op]]).fit
    return {"pooled": list(POOLED), "ops": ops,
            "pooled_fit": {"c0_s": float(pooled[0]), "bytes_per_s": float(1 / pooled[1]) if pooled[1] > 0 else None}}


class _Trivial(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def _host(dev: torch.device, dtype: torch.dtype, grid: OpGrid, context: _PassContext,
          tick: Callable[[str], None]) -> dict[str, float]:
    """Host seconds of what launches no kernel, in a pass's context: a view op (transpose,
    view, slice, select, unsqueeze all go the same way through the dispatcher) and the call
    of a module (``nn.Module.__call__`` around a forward that returns its input)."""
    x = torch.randn(1, 1, 4, 16, device=dev, dtype=dtype)
    module = _Trivial()
    tick("host: view op")
    view = _host_seconds(partial(torch.transpose, x, 1, 2), dev, grid, context.layer)
    tick("host: module call")
    call = _host_seconds(partial(module, x), dev, grid, context.layer)
    return {"view_s": view, "module_s": call}


#: Calls of a host-only op per timed sample on a GPU: enough for perf_counter's resolution
HOST_CALLS = 200


def _host_seconds(fn: Callable[[], object], dev: torch.device, grid: OpGrid, setup: Callable[[], object]) -> float:
    """Host seconds of one call of ``fn``, which launches nothing. On a CPU timed as an op
    (after the pass context, like the ops around it); on a GPU a pair of events would time the
    host's gap between them, not the call, so ``perf_counter`` times :data:`HOST_CALLS` calls."""
    if dev.type != "cuda":
        return _time(fn, dev, grid, setup).seconds
    samples = []
    for _ in range(max(grid.min_repeats, min(grid.repeats, 5))):
        start = time.perf_counter()
        for _ in range(HOST_CALLS):
            fn()
        samples.append((time.perf_counter() - start) / HOST_CALLS)
    return float(statistics.median(samples))


def _peak_flops(dev: torch.device, dtype: torch.dtype, grid: OpGrid) -> float:
    n = 8192 if dev.type == "cuda" else 1024
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    return 2 * n ** 3 / _time(lambda: a @ b, dev, grid).seconds


def measure_op_tables(device: str | torch.device, dtype: torch.dtype, grid: OpGrid, out_dir: str | Path,
                      progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Time ``grid`` on ``device`` in ``dtype``; write ``gemm``, ``decode_attention`` and
    ``prefill_attention`` parquet tables (the shipped layout) and ``optable.json`` into
    ``out_dir`` (created; files there are replaced). Returns the spec written to the JSON.
    ``progress(description)`` is called once per measurement (:meth:`OpGrid.points` in all).
    ``load_gpu(out_dir)`` then answers from these tables."""
    dev = torch.device(device)
    tick = progress or (lambda _desc: None)
    out = Path(out_dir)
    started = time.perf_counter()
    with torch.no_grad():
        tick("copy bandwidth")
        # the grid's repeat count caps the copy's too, so a quick grid stays quick here
        bandwidth = measure_bandwidth(dev, nbytes=(1 << 30) if dev.type == "cuda" else (256 << 20),
                                      repeats=min(10, grid.repeats))
        tick("peak GEMM rate")
        flops = _peak_flops(dev, dtype, grid)
        weights = _pass_weights(dev, dtype, grid)
        context = _PassContext(weights, {layout[-1] for layout in grid.passes}, dev, dtype)
        gemm = _gemm_rows(dev, dtype, grid, weights, tick)
        decode = _decode_rows(dev, dtype, grid, context, tick)
        verify = _verify_rows(dev, dtype, grid, context, tick)
        prefill = _prefill_rows(dev, dtype, grid, context, tick)
        elementwise = _elementwise(dev, dtype, grid, context, tick)
        host = _host(dev, dtype, grid, context, tick)
        del weights, context
    synchronize(dev)
    name = _device_name(dev)
    spec = {
        "format": FORMAT,
        "device": name,
        "device_type": dev.type,
        "backend": f"harness (torch {torch.__version__}, {str(dtype).removeprefix('torch.')})",
        "dtype": str(dtype).removeprefix("torch."),
        "dtype_bytes": torch.finfo(dtype).bits // 8,
        "torch": torch.__version__,
        "cuda": torch.version.cuda if dev.type == "cuda" else None,
        "threads": torch.get_num_threads(),
        "memory_bandwidth_bytes_per_s": bandwidth,
        "flops_per_s": flops,
        "memory_bytes": memory_bytes(dev),
        "elementwise": elementwise,
        "host": host,
        # on a GPU each op's seconds are its kernels on the device and host_seconds the host's
        # issuing it (an eager pass overlaps the two); on a CPU one synchronous figure
        "timing": "split" if dev.type == "cuda" else "synchronous",
        "rotate_bytes": grid.rotate_bytes,
        "grid": asdict(grid),
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "seconds_taken": time.perf_counter() - started,
    }
    out.mkdir(parents=True, exist_ok=True)
    _write(gemm, ["m", "n", "k"], out / "gemm.parquet")
    _write(decode, ATTENTION_KEYS + ["step"], out / "decode_attention.parquet")
    _write(prefill, ATTENTION_KEYS + ["isl"], out / "prefill_attention.parquet")
    _write(verify, ATTENTION_KEYS + ["step", "tokens"], out / "verify_attention.parquet")
    (out / SPEC_FILE).write_text(json.dumps(spec, indent=1) + "\n")
    return spec


#: The shipped attention tables' key columns, in their order (:mod:`simulator.hardware.extract`)
ATTENTION_KEYS = ["batch_size", "num_heads", "num_key_value_heads", "head_dim"]


def _write(rows: list[dict], keys: list[str], path: Path) -> None:
    """Rows in the shipped layout: int64 keys in the shipped order, then float seconds."""
    values = ["seconds"] + (["host_seconds"] if rows and "host_seconds" in rows[0] else [])
    frame = pd.DataFrame(rows, columns=keys + values).astype({k: "int64" for k in keys})
    frame.astype({v: "float64" for v in values}).sort_values(keys).reset_index(drop=True).to_parquet(path, index=False)
