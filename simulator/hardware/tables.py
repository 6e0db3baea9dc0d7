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

A device can also measure its own tables with the harness (``simctl profile --measure-ops
DIR``, :mod:`simulator.harness.optable`): ``load_gpu(DIR)`` (:meth:`GpuTables.from_folder`)
reads the same three tables from that folder and its spec from ``optable.json``, which also
holds elementwise ops timed at several sizes; such a folder also has a fourth table,
``verify_attention`` (several new tokens per row against a cache,
:meth:`GpuTables.verify_attention`). Such a folder answers
:meth:`GpuTables.elementwise` from those timings, with the tags' usual meaning along the
one axis, bytes: **exact** at a measured size of that op, **interpolated** (log-log) between
its measured sizes, **extrapolated** beyond them (the nearest size scaled by the op's fit
``c0 + bytes · β``); an op it did not time is priced from the pooled streaming ops (add, mul,
neg, pow) and stays **assumed**.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.errors import HardwareError

DATA = Path(__file__).resolve().parent / "data"
BF16 = 2
#: bytes of one element of each dtype the tables were measured in
DTYPE_BYTES = {"bf16": 2, "fp8": 1}
#: The spec of a folder of tables a device measured of itself (:meth:`GpuTables.from_folder`).
SPEC_FILE = "optable.json"
TABLE_NAMES = ("gemm", "decode_attention", "prefill_attention")
#: How an answer was obtained, most trustworthy first.
TAGS = ("exact", "interpolated", "extrapolated", "assumed")


@dataclass(frozen=True)
class Estimate:
    """Seconds of one op, and how they were obtained (one of :data:`TAGS`); ``host_seconds``:
    the host's seconds issuing it, where tables time it apart from the device's (a GPU's own
    measured folder, :attr:`GpuTables.split_timing`), else 0 (inside ``seconds``, or none)."""

    seconds: float
    tag: str
    host_seconds: float = 0.0


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
        self.grid = [np.unique(points[:, i]) for i in range(points.shape[1])]
        index = tuple(np.searchsorted(self.grid[i], points[:, i]) for i in range(points.shape[1]))
        self.log_values = np.full([len(g) for g in self.grid], np.nan)
        self.log_values[index] = np.log(self.seconds)
        # The measured seconds of each integral point, on the same grid (NaN: not measured):
        # made with whole-column operations, where a dict keyed by row tuples took most of a
        # table's load.
        integral = (points == np.trunc(points)).all(axis=1)
        self.exact_values = np.full(self.log_values.shape, np.nan)
        self.exact_values[tuple(i[integral] for i in index)] = self.seconds[integral]
        self._log_points = np.log(points)

    @cached_property
    def fit(self) -> np.ndarray:
        """``(c0, β, φ)`` of ``c0 + bytes·β + flops·φ`` fitted to every row (relative error)."""
        from scipy.optimize import nnls

        nbytes, flops = self.features(self.points)
        design = np.column_stack([np.ones_like(nbytes), nbytes, flops]) / self.seconds[:, None]
        scale = design.max(axis=0)
        scale[scale <= 0] = 1.0   # a feature a table lacks (elementwise ops: no flops) keeps coefficient 0
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
        for value, axis in zip(point, self.grid, strict=True):
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
            for bit, (lo, hi), t in zip(corner, lows, weights, strict=True):
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

    def measured(self, point: Sequence[float]) -> float | None:
        """The measured seconds at ``point`` (integral coordinates), or None if not measured."""
        idx = []
        for value, axis in zip(point, self.grid, strict=True):
            if float(value) != int(value):
                return None
            i = int(np.searchsorted(axis, value))
            if i == len(axis) or axis[i] != value:
                return None
            idx.append(i)
        seconds = self.exact_values[tuple(idx)]
        return None if np.isnan(seconds) else float(seconds)

    def lookup(self, point: Sequence[float]) -> Estimate:
        exact = self.measured(point)
        if exact is not None:
            return Estimate(exact, "exact")
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


def _moe_features(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # one architecture at a time: its cost grows with the tokens routed (a fixed cost of
    # reading the experts' weights, then work per token)
    return points[:, 0], np.zeros(len(points))


def _allreduce_features(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # a ring all-reduce moves 2·(n-1)/n of the message per GPU; no arithmetic to speak of
    gpus, nbytes = points[:, 0], points[:, 1]
    return 2 * (gpus - 1) / gpus * nbytes, np.zeros(len(points))


def _elementwise_features(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return points[:, 0], np.zeros(len(points))


def elementwise_table(points: Sequence[Sequence[float]]) -> GridTable:
    """A one-axis table of an elementwise op: ``(bytes, seconds)`` rows (repeated sizes keep
    their median); its fit is ``c0 + bytes · β``."""
    frame = pd.DataFrame([pt[:2] for pt in points], columns=["bytes", "seconds"]).groupby("bytes", as_index=False)["seconds"].median()
    return GridTable(frame, ("bytes",), _elementwise_features)


def _verify_features(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # axes: batch, step, tokens, heads, kv heads, head dim; each of the tokens new queries per
    # row attends the step cached positions and the new ones (causal: up to all of them)
    b, step, tokens, heads, kv, hd = (points[:, i] for i in range(6))
    attended = step + tokens
    return 2 * BF16 * b * attended * kv * hd, 4 * b * tokens * attended * heads * hd


ATTENTION_AXES = ("batch_size", "{length}", "num_heads", "num_key_value_heads", "head_dim")
VERIFY_AXES = ("batch_size", "step", "tokens", "num_heads", "num_key_value_heads", "head_dim")


class GpuTables:
    """The measured tables of one GPU and backend; every answer in seconds with its tag."""

    def __init__(self, gpu: str, backend: str | None = None, dtype: str = "bf16", kv_dtype: str | None = None,
                 tp: int = 1) -> None:
        specs = gpu_specs()
        if gpu not in specs:
            raise HardwareError(None, None, "gpu", f"no tables for GPU {gpu!r}; shipped: {', '.join(specs)} "
                                "(simctl profile --list-gpus; or a folder written by simctl profile --measure-ops)")
        backends = specs[gpu]["backends"]
        backend = backend or backends[0]
        if backend not in backends:
            raise HardwareError(None, None, "backend", f"{gpu} has tables for {', '.join(backends)}, not {backend!r}")
        self.gpu, self.backend, self.spec = gpu, backend, specs[gpu]
        self.folder = DATA / gpu / backend
        measured = self.spec.get("measured", {}).get(backend, {"gemm": ["bf16"], "kv_cache": ["bf16"]})
        kv_dtype = kv_dtype or dtype
        if dtype not in measured["gemm"]:
            raise HardwareError(None, None, "dtype", f"{gpu} {backend} measured GEMMs in {', '.join(measured['gemm'])}, "
                                f"not {dtype!r}")
        if kv_dtype not in measured["kv_cache"]:
            raise HardwareError(None, None, "kv_dtype", f"{gpu} {backend} measured attention over a "
                                f"{' or '.join(measured['kv_cache'])} KV cache, not {kv_dtype!r}")
        self.dtype, self.kv_dtype = dtype, kv_dtype
        if tp != 1 and tp not in measured.get("allreduce_gpus", []):
            known = ", ".join(str(n) for n in [1, *measured.get("allreduce_gpus", [])])
            raise HardwareError(None, None, "tp", f"{gpu} {backend}: all-reduce was measured across "
                                f"{known} GPUs, not {tp} (tensor parallelism needs it)")
        self.tp = tp

    @property
    def dtype_bytes(self) -> int:
        """Bytes of one weight in the GEMMs' dtype (fp8: 1)."""
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_dtype_bytes(self) -> int:
        """Bytes of one cached K or V element."""
        return DTYPE_BYTES[self.kv_dtype]

    def _suffix(self, dtype: str) -> str:
        return "" if dtype == "bf16" else f"-{dtype}"

    @classmethod
    def from_folder(cls, folder: str | Path) -> GpuTables:
        """The tables a device measured of itself (``simctl profile --measure-ops``): the three
        parquet tables in the shipped layout and ``optable.json`` (device, dtype, measured copy
        bandwidth, elementwise timings), which becomes :attr:`spec`. :class:`HardwareError`
        naming the file at fault if the folder is not one."""
        folder = Path(folder)
        path = folder / SPEC_FILE
        if not path.is_file():
            raise HardwareError(folder, None, None, f"not a folder of measured op tables (no {SPEC_FILE}; "
                                "write one with simctl profile --measure-ops)")
        try:
            spec = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise HardwareError(path, None, None, f"unreadable: {exc}") from None
        if not isinstance(spec, dict):
            raise HardwareError(path, None, None, "expected a JSON object")
        for key in ("device", "memory_bandwidth_bytes_per_s"):
            if key not in spec:
                raise HardwareError(path, None, key, "missing")
        for name in TABLE_NAMES:
            if not (folder / f"{name}.parquet").is_file():
                raise HardwareError(folder, None, None, f"{name}.parquet is missing")
        tables = cls.__new__(cls)
        tables.gpu, tables.backend, tables.spec = str(spec["device"]), str(spec.get("backend", "measured")), spec
        tables.folder = folder
        tables.dtype = tables.kv_dtype = str(spec.get("dtype", "bf16")) if spec.get("dtype") in DTYPE_BYTES else "bf16"
        tables.tp = 1
        return tables

    def _table(self, name: str, axes: Sequence[str], features) -> GridTable:
        path = self.folder / f"{name}.parquet"
        stat = path.stat()
        return _grid_table(path, stat.st_mtime_ns, stat.st_size, tuple(axes), features)

    @cached_property
    def gemm_table(self) -> GridTable:
        return self._table("gemm" + self._suffix(self.dtype), ("m", "n", "k"), _gemm_features)

    @cached_property
    def _bf16_gemm_table(self) -> GridTable:
        # elementwise kernels stream bf16 activations whatever the GEMMs' dtype: they are
        # priced from the bf16 GEMMs' fit
        if self.dtype == "bf16" or not (self.folder / "gemm.parquet").is_file():
            return self.gemm_table
        return self._table("gemm", ("m", "n", "k"), _gemm_features)

    @cached_property
    def decode_table(self) -> GridTable:
        return self._table("decode_attention" + self._suffix(self.kv_dtype),
                           [a.format(length="step") for a in ATTENTION_AXES], _decode_features)

    @cached_property
    def prefill_table(self) -> GridTable:
        return self._table("prefill_attention" + self._suffix(self.kv_dtype),
                           [a.format(length="isl") for a in ATTENTION_AXES], _prefill_features)

    @cached_property
    def allreduce_table(self) -> GridTable:
        path = self.folder / "allreduce.parquet"
        if not path.is_file():
            raise HardwareError(path, None, None, f"{self.gpu} {self.backend}: no all-reduce table")
        return GridTable(pd.read_parquet(path), ("num_gpus", "bytes"), _allreduce_features)

    @cached_property
    def _moe_rows(self) -> pd.DataFrame:
        path = self.folder / "moe.parquet"
        if not path.is_file():
            raise HardwareError(path, None, None, f"{self.gpu} {self.backend}: no mixture-of-experts table")
        rows = pd.read_parquet(path)
        return rows[rows["dtype"] == self.dtype]

    @cached_property
    def _moe_tables(self) -> dict[tuple[int, ...], GridTable]:
        return {}

    def moe(self, tokens: int, hidden: int, inter: int, topk: int, experts: int) -> Estimate:
        """The fused mixture-of-experts op of one layer over ``tokens`` tokens (routing, each
        token's ``topk`` experts of width ``inter``, the combine), the experts split over the
        tensor-parallel group, in the GEMMs' dtype. Measured per architecture: one the tables
        lack is a :class:`HardwareError` listing those they have (nothing borrowed from another
        model's experts); along the token count, the usual tags."""
        key = (hidden, inter, topk, experts, self.tp)
        table = self._moe_tables.get(key)
        if table is None:
            rows = self._moe_rows
            mine = rows[(rows["hidden"] == hidden) & (rows["inter"] == inter) & (rows["topk"] == topk)
                        & (rows["experts"] == experts) & (rows["tp"] == self.tp)]
            if mine.empty:
                known = rows[rows["tp"] == self.tp].drop_duplicates(["hidden", "inter", "topk", "experts"])
                listed = "; ".join(f"hidden {r.hidden}, {r.experts} experts × {r.inter}, top {r.topk}"
                                   for r in known.itertuples()) or "none"
                raise HardwareError(None, None, "model", f"{self.gpu} {self.backend} has no {self.dtype} measurement "
                                    f"of a mixture of experts with hidden {hidden}, {experts} experts × {inter}, "
                                    f"top {topk} at TP {self.tp}; measured: {listed}")
            table = GridTable(mine[["num_tokens", "seconds"]], ("num_tokens",), _moe_features)
            self._moe_tables[key] = table
        return table.lookup((max(tokens, 1),))

    def allreduce(self, nbytes: float, gpus: int | None = None) -> Estimate:
        """One all-reduce of ``nbytes`` (bf16) across ``gpus`` GPUs (default: the tensor-parallel
        degree), from the backend's measured all-reduce; 0 seconds, ``exact``, on one GPU."""
        gpus = self.tp if gpus is None else gpus
        if gpus <= 1:
            return Estimate(0.0, "exact")
        return self.allreduce_table.lookup((gpus, max(nbytes, 2.0)))

    @cached_property
    def verify_table(self) -> GridTable | None:
        """``verify_attention.parquet``: only folders a device measured with the harness have it."""
        path = self.folder / "verify_attention.parquet"
        return GridTable(pd.read_parquet(path), VERIFY_AXES, _verify_features) if path.is_file() else None

    @property
    def split_timing(self) -> bool:
        """Whether the tables time each op's kernels on the device apart from the host's
        issuing them (a GPU's own measured folder): an eager pass then takes the longer of
        the two sums (:attr:`~simulator.hardware.compose.StepCost.eager_seconds`), a pass
        replayed from a CUDA graph the device's alone."""
        return self.spec.get("timing") == "split"

    @cached_property
    def _host_per_call(self) -> dict[str, float]:
        """Per table of a split-timed folder, the median host seconds of one call of its op
        (issuing an op costs the host about the same whatever its size)."""
        if not self.split_timing:
            return {}
        out = {}
        for name in ("gemm", "decode_attention", "prefill_attention", "verify_attention"):
            path = self.folder / f"{name}.parquet"
            if path.is_file():
                frame = pd.read_parquet(path)
                if "host_seconds" in frame.columns and len(frame):
                    out[name] = float(frame["host_seconds"].median())
        return out

    def _issued(self, estimate: Estimate, table: str) -> Estimate:
        host = self._host_per_call.get(table)
        return estimate if host is None else Estimate(estimate.seconds, estimate.tag, host)

    def gemm(self, m: int, n: int, k: int) -> Estimate:
        """``[m, k] × [k, n]`` in bf16."""
        return self._issued(self.gemm_table.lookup((m, n, k)), "gemm")

    def decode_attention(self, batch: int, kv_len: int, heads: int, kv_heads: int, head_dim: int) -> Estimate:
        """One decode step of ``batch`` rows, each attending ``kv_len`` cached tokens plus its new one."""
        return self._issued(self.decode_table.lookup((batch, max(kv_len, 1), heads, kv_heads, head_dim)),
                            "decode_attention")

    def prefill_attention(self, batch: int, prompt_tokens: int, heads: int, kv_heads: int, head_dim: int) -> Estimate:
        """Causal attention over ``batch`` fresh prompts of ``prompt_tokens`` tokens."""
        return self._issued(self.prefill_table.lookup((batch, prompt_tokens, heads, kv_heads, head_dim)),
                            "prefill_attention")

    def verify_attention(self, batch: int, kv_len: int, tokens: int, heads: int, kv_heads: int,
                         head_dim: int) -> Estimate:
        """``tokens`` new tokens per row (a verify pass: the drafts and the bonus token) attending
        ``kv_len`` cached tokens and, causally, each other. From the measured table of a
        folder that has one; otherwise (the shipped GPUs) priced as a decode step of one query
        per row at ``kv_len + tokens - 1`` cached tokens, reading the same cache."""
        if tokens <= 1 or self.verify_table is None:
            return self.decode_attention(batch, kv_len + tokens - 1, heads, kv_heads, head_dim)
        return self._issued(self.verify_table.lookup((batch, max(kv_len, 1), tokens, heads, kv_heads, head_dim)),
                            "verify_attention")

    @property
    def effective_bandwidth(self) -> float:
        """Bytes per second the GEMM table's fit streams at (1 / β)."""
        return 1.0 / self.gemm_table.fit[1]

    @cached_property
    def _elementwise_tables(self) -> dict[str, GridTable]:
        timed = self.spec.get("elementwise") or {}
        return {op: elementwise_table(entry["points"]) for op, entry in timed.get("ops", {}).items()}

    @cached_property
    def _pooled_elementwise(self) -> GridTable:
        timed = self.spec["elementwise"]
        return elementwise_table([pt for op in timed["pooled"] for pt in timed["ops"][op]["points"]])

    def elementwise(self, nbytes: float, op: str | None = None) -> Estimate:
        """One kernel the tables lack, reading and writing ``nbytes`` in all.

        Shipped GPUs price it as the GEMM fit prices a kernel: its fixed cost plus ``nbytes``
        over the fit's effective bandwidth (an assumption: norms, RoPE, activations and adds
        stream their operands once and do little arithmetic), tagged ``assumed``, whatever
        ``op``. A measured folder answers from ``op``'s own timings (exact, interpolated or
        extrapolated in bytes); without ``op`` from the pooled streaming ops' timings, with
        those tags too; for an ``op`` it did not time, from the pooled ones, ``assumed``."""
        if not self.spec.get("elementwise"):
            c0, beta, _ = self._bf16_gemm_table.fit
            return Estimate(float(c0 + nbytes * beta), "assumed")
        own = self._elementwise_tables.get(op) if op is not None else None
        if own is not None:
            return self._elementwise_issued(own.lookup((max(nbytes, 1.0),)), op)
        pooled = self._pooled_elementwise.lookup((max(nbytes, 1.0),))
        return self._elementwise_issued(pooled if op is None else Estimate(pooled.seconds, "assumed"), None)

    @cached_property
    def _elementwise_host(self) -> dict[str | None, float]:
        """Per timed op of a split-timed folder (None: the pooled ones), the median host
        seconds of one call."""
        timed = self.spec.get("elementwise") or {}
        if not self.split_timing or not timed:
            return {}
        hosts = {op: [pt[2] for pt in entry["points"] if len(pt) > 2] for op, entry in timed.get("ops", {}).items()}
        out: dict[str | None, float] = {op: float(np.median(h)) for op, h in hosts.items() if h}
        pooled = [h for op in timed.get("pooled", ()) for h in hosts.get(op, [])]
        if pooled:
            out[None] = float(np.median(pooled))
        return out

    def _elementwise_issued(self, estimate: Estimate, op: str | None) -> Estimate:
        host = self._elementwise_host.get(op, self._elementwise_host.get(None))
        return estimate if host is None else Estimate(estimate.seconds, estimate.tag, host)


    def host(self, kind: str) -> Estimate:
        """Host seconds of a call that launches no kernel: ``view`` (a view op: transpose, view,
        slice, select, unsqueeze) or ``module`` (an ``nn.Module`` call around its forward).
        A measured folder answers from its timing of one such call in a pass's context,
        ``assumed`` for every call of that kind; the shipped tables time kernels inside
        CUDA-graph replay, where no host work shows: 0, ``assumed``."""
        measured = (self.spec.get("host") or {}).get(f"{kind}_s")
        seconds = float(measured) if measured is not None else 0.0
        # split-timed: the host's alone, beside the device's seconds rather than in them
        return Estimate(0.0, "assumed", seconds) if self.split_timing else Estimate(seconds, "assumed")


@functools.lru_cache(maxsize=32)
def _grid_table(path: Path, mtime_ns: int, size: int, axes: tuple[str, ...], features) -> GridTable:
    """The table in ``path``, read once a process while the file is unchanged (its time and
    size are part of the key): composing profiles for several deployments of one GPU, or a
    sweep of them, reads and indexes each of its tables once. A table is never changed
    after it is built."""
    return GridTable(pd.read_parquet(path), axes, features)


def load_gpu(gpu: str | Path, backend: str | None = None, dtype: str = "bf16", kv_dtype: str | None = None,
             tp: int = 1) -> GpuTables:
    """The tables of ``gpu`` (``a100-sxm``, ``h100-sxm``, ``h200-sxm``, ...: :func:`gpu_specs`)
    for ``backend`` (default: the first listed in ``gpus.json``), GEMMs in ``dtype``
    (``bf16`` or ``fp8``), attention over a ``kv_dtype`` cache (default: ``dtype``), as one
    of ``tp`` GPUs in a tensor-parallel group; or of a folder a device measured (``simctl
    profile --measure-ops DIR``; :meth:`GpuTables.from_folder`, the other arguments ignored)."""
    if isinstance(gpu, Path) or (gpu not in gpu_specs() and Path(gpu).is_dir()):
        return GpuTables.from_folder(gpu)
    return GpuTables(gpu, backend, dtype, kv_dtype, tp)
