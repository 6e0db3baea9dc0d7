"""Per-operation GPU latencies from measured tables: exact, interpolated or extrapolated.

The tables (``data/<gpu>/<backend>/``, cut from NVIDIA's aiconfigurator measurements; source,
licence and units in ``data/README.md``) give the latency of one op on one GPU, timed inside
CUDA-graph replay, at grid points:

* ``gemm``: ``[m, k] × [k, n]`` in bf16, axes m, n, k;
* ``decode_attention``: one decode step of ``batch`` rows against ``step`` cached tokens
  (per head configuration: query heads, KV heads, head dim);
* ``prefill_attention``: causal attention over ``batch`` fresh prompts of ``isl`` tokens.

An answer (:class:`Estimate`) is, in this order of preference:

1. **exact** — the point is a measured row;
2. **interpolated** — every corner of the grid cell around it was measured: multilinear
   interpolation of log latency in the logs of the axes (latencies grow as powers of the
   sizes, so the log space keeps the interpolation between its corners' rates);
3. **extrapolated** — outside the measured grid (the 152k-vocabulary LM head, long decode
   contexts at large batches, head counts the tables lack): the nearest measured point
   (in log space) scaled by the ratio of a roofline model fitted to the whole table,
   ``c0 + bytes · β + flops · φ`` (fixed cost, inverse effective bandwidth, inverse
   effective peak; non-negative least squares on relative error).

Ops the tables lack (norms, RoPE, activations, residual adds, sampling) are **assumed** to
cost the GEMM fit's fixed cost plus their bytes at its effective bandwidth
(:meth:`GpuTables.elementwise`). The fit is a helper for shapes off the grid, not a physical
claim: its effective peak can come out above the spec sheet's, because the sum of a memory
and a compute term overstates the time of shapes where both matter.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from simulator.errors import SimctlError

DATA = Path(__file__).resolve().parent / "data"
BF16 = 2
#: How an answer was obtained, most trustworthy first.
TAGS = ("exact", "interpolated", "extrapolated", "assumed")


class HardwareError(SimctlError):
    """An unknown GPU or backend, or a shape no table can answer."""

    kind = "hardware"


@dataclass(frozen=True)
class Estimate:
    """Seconds of one op, and how they were obtained (one of :data:`TAGS`)."""

    seconds: float
    tag: str


def gpu_specs() -> dict[str, dict]:
    """The shipped GPUs' spec figures (bandwidth, bf16 peak, memory) and table backends."""
    return json.loads((DATA / "gpus.json").read_text())


class GridTable:
    """One measured table: exact rows, log-space multilinear interpolation inside fully
    measured cells, roofline-scaled extrapolation from the nearest measured point elsewhere.

    ``features(points) -> (bytes, flops)`` describes the work of each point, for the fit."""

    def __init__(self, frame: pd.DataFrame, axes: Sequence[str],
                 features: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]) -> None:
        self.axes = list(axes)
        self.features = features
        points = frame[self.axes].to_numpy(float)
        self.seconds = frame["seconds"].to_numpy(float)
        self.points = points
        self.exact = {tuple(int(v) for v in p): s for p, s in zip(points, self.seconds)}
        self.grid = [np.unique(points[:, i]) for i in range(points.shape[1])]
        index = tuple(np.searchsorted(self.grid[i], points[:, i]) for i in range(points.shape[1]))
        self.log_values = np.full([len(g) for g in self.grid], np.nan)
        self.log_values[index] = np.log(self.seconds)
        self._log_points = np.log(points)

    @cached_property
    def fit(self) -> np.ndarray:
        """``(c0, β, φ)`` of ``c0 + bytes·β + flops·φ`` fitted to every row (relative error)."""
        from scipy.optimize import nnls

        nbytes, flops = self.features(self.points)
        design = np.column_stack([np.ones_like(nbytes), nbytes, flops]) / self.seconds[:, None]
        scale = design.max(axis=0)
        coef, _ = nnls(design / scale, np.ones_like(self.seconds))
        return coef / scale

    def model(self, point: Sequence[float]) -> float:
        """The fitted roofline model's seconds at ``point``."""
        nbytes, flops = self.features(np.asarray([point], dtype=float))
        c0, beta, phi = self.fit
        return float(c0 + nbytes[0] * beta + flops[0] * phi)

    def interpolate(self, point: Sequence[float]) -> float | None:
        """Log-space multilinear interpolation, or None if a corner is missing or outside."""
        lows, weights = [], []
        for value, axis in zip(point, self.grid):
            if not axis[0] <= value <= axis[-1]:
                return None
            hi = int(np.searchsorted(axis, value))
            if axis[hi] == value:
                lows.append((hi, hi))
                weights.append(0.0)
                continue
            lo = hi - 1
            lows.append((lo, hi))
            weights.append((math.log(value) - math.log(axis[lo])) / (math.log(axis[hi]) - math.log(axis[lo])))
        total = 0.0
        for corner in np.ndindex(*(2,) * len(point)):
            w = 1.0
            idx = []
            for bit, (lo, hi), t in zip(corner, lows, weights):
                w *= t if bit else 1 - t
                idx.append(hi if bit else lo)
            if w == 0:
                continue
            value = self.log_values[tuple(idx)]
            if np.isnan(value):
                return None
            total += w * value
        return math.exp(total)

    def nearest(self, point: Sequence[float]) -> int:
        """Row index of the measured point nearest ``point`` in log space."""
        distance = ((self._log_points - np.log(np.asarray(point, dtype=float))) ** 2).sum(axis=1)
        return int(np.argmin(distance))

    def lookup(self, point: Sequence[float]) -> Estimate:
        key = tuple(int(v) for v in point)
        if all(float(v) == int(v) for v in point) and key in self.exact:
            return Estimate(float(self.exact[key]), "exact")
        inside = self.interpolate(point)
        if inside is not None:
            return Estimate(inside, "interpolated")
        anchor = self.nearest(point)
        ratio = self.model(point) / self.model(self.points[anchor])
        return Estimate(float(self.seconds[anchor] * ratio), "extrapolated")


def _gemm_features(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    m, n, k = points[:, 0], points[:, 1], points[:, 2]
    return BF16 * (m * k + k * n + m * n), 2 * m * n * k


def _decode_features(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # axes: batch, step, heads, kv heads, head dim; the new token attends step + 1 positions
    b, step, heads, kv, hd = (points[:, i] for i in range(5))
    attended = step + 1
    return 2 * BF16 * b * attended * kv * hd, 4 * b * attended * heads * hd


def _prefill_features(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # axes: batch, isl, heads, kv heads, head dim; causal: half of the isl² score matrix
    b, isl, heads, kv, hd = (points[:, i] for i in range(5))
    return BF16 * b * isl * (2 * heads + 2 * kv) * hd, 2 * b * isl * isl * heads * hd


ATTENTION_AXES = ("batch_size", "{length}", "num_heads", "num_key_value_heads", "head_dim")


class GpuTables:
    """The measured tables of one GPU and backend; every answer in seconds with its tag."""

    def __init__(self, gpu: str, backend: str | None = None) -> None:
        specs = gpu_specs()
        if gpu not in specs:
            raise HardwareError(None, None, "gpu", f"no tables for GPU {gpu!r}; shipped: {', '.join(specs)}")
        backends = specs[gpu]["backends"]
        backend = backend or backends[0]
        if backend not in backends:
            raise HardwareError(None, None, "backend", f"{gpu} has tables for {', '.join(backends)}, not {backend!r}")
        self.gpu, self.backend, self.spec = gpu, backend, specs[gpu]
        self.folder = DATA / gpu / backend

    def _table(self, name: str, axes: Sequence[str], features) -> GridTable:
        return GridTable(pd.read_parquet(self.folder / f"{name}.parquet"), axes, features)

    @cached_property
    def gemm_table(self) -> GridTable:
        return self._table("gemm", ("m", "n", "k"), _gemm_features)

    @cached_property
    def decode_table(self) -> GridTable:
        return self._table("decode_attention", [a.format(length="step") for a in ATTENTION_AXES], _decode_features)

    @cached_property
    def prefill_table(self) -> GridTable:
        return self._table("prefill_attention", [a.format(length="isl") for a in ATTENTION_AXES], _prefill_features)

    def gemm(self, m: int, n: int, k: int) -> Estimate:
        """``[m, k] × [k, n]`` in bf16."""
        return self.gemm_table.lookup((m, n, k))

    def decode_attention(self, batch: int, kv_len: int, heads: int, kv_heads: int, head_dim: int) -> Estimate:
        """One decode step of ``batch`` rows, each attending ``kv_len`` cached tokens plus its new one."""
        return self.decode_table.lookup((batch, max(kv_len, 1), heads, kv_heads, head_dim))

    def prefill_attention(self, batch: int, prompt_tokens: int, heads: int, kv_heads: int, head_dim: int) -> Estimate:
        """Causal attention over ``batch`` fresh prompts of ``prompt_tokens`` tokens."""
        return self.prefill_table.lookup((batch, prompt_tokens, heads, kv_heads, head_dim))

    @property
    def effective_bandwidth(self) -> float:
        """Bytes per second the GEMM table's fit streams at (1 / β)."""
        return 1.0 / self.gemm_table.fit[1]

    def elementwise(self, nbytes: float) -> Estimate:
        """An op the tables lack, priced as the GEMM fit prices a kernel: its fixed cost plus
        ``nbytes`` over the fit's effective bandwidth (an assumption: norms, RoPE,
        activations and adds stream their operands once and do little arithmetic)."""
        c0, beta, _ = self.gemm_table.fit
        return Estimate(float(c0 + nbytes * beta), "assumed")


def load_gpu(gpu: str, backend: str | None = None) -> GpuTables:
    """The tables of ``gpu`` (``a100-sxm``, ``h100-sxm``) for ``backend`` (default: the first
    listed in ``gpus.json``)."""
    return GpuTables(gpu, backend)
