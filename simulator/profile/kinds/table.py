"""The ``table`` kind: measured batch times on a grid, interpolated with scipy.

::

    {"kind": "table",
     "axes": {"batch_size": [1, 2, 4, 8], "max_tokens": [128, 512]},
     "seconds": [[1.1, 4.0], [1.2, 4.3], [1.4, 4.9], [1.9, 6.1]],
     "dist": "deterministic" | "gamma" | "lognormal",  "cv": 0.05}

Axes are any of ``batch_size``, ``prompt_tokens`` and ``max_tokens``, each a strictly
increasing list; ``seconds`` is nested in the order the axes are listed. A batch is looked
up at its size and its largest prompt and output lengths (the longest row sets a batched
generation's time). Between grid points the time is linear in each axis
(:func:`grid_mean`); outside the grid it is extrapolated
linearly and floored at 1 % of the smallest measured time. The optional ``dist``/``cv`` add
run-to-run noise around the interpolated mean.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from simulator.profile import noise
from simulator.profile.iteration import WholeBatchIterations
from simulator.profile.kinds.base import KINDS
from simulator.profile.shape import BatchShape
from simulator.profile.spec import Where, need_number

AXES = ("batch_size", "prompt_tokens", "max_tokens")


@dataclass(frozen=True)
class TableService(WholeBatchIterations):
    """Interpolated batch times over a grid of measured points."""

    draws_acceptance: ClassVar[bool] = False

    axes: tuple[str, ...]
    grid: tuple[tuple[float, ...], ...]
    seconds: np.ndarray
    dist: str = "deterministic"
    cv: float = 0.0
    kind: str = "table"
    _cache: dict = field(init=False, repr=False, compare=False, default_factory=dict)

    @property
    def floor(self) -> float:
        """No batch is faster than 1 % of the fastest measured one."""
        return 0.01 * float(np.min(self.seconds))

    def mean(self, shape: BatchShape) -> float:
        key = tuple(getattr(shape, "size" if a == "batch_size" else a) for a in self.axes)
        value = self._cache.get(key)
        if value is None:
            # Interpolation is costly next to a simulation step; batches repeat shapes.
            width = max(len(g) for g in self.grid)
            grid = np.array([list(g) + [0.0] * (width - len(g)) for g in self.grid])
            value = grid_mean(len(self.axes), grid, [len(g) for g in self.grid], self.seconds.ravel(),
                              [float(k) for k in key], self.floor)
            self._cache[key] = value
        return value

    def variance(self, shape: BatchShape) -> float:
        return (self.cv * self.mean(shape)) ** 2

    def host_fraction(self, shape: BatchShape) -> float | None:
        return None

    def sample(self, shape: BatchShape, rng: np.random.Generator) -> float:
        return noise.sample(self.dist, self.mean(shape), self.cv, rng)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "axes": {a: list(g) for a, g in zip(self.axes, self.grid, strict=True)},
            "seconds": self.seconds.tolist(),
        }
        if self.dist != "deterministic":
            out["dist"], out["cv"] = self.dist, self.cv
        return out


def grid_mean(dims, grid, lens, values, point, floor):
    """Multilinear interpolation on a regular grid, extrapolated linearly beyond it, floored
    at ``floor``: in each axis the cell is the one holding the point (the first or last cell
    outside the grid); ``values`` is the grid flattened in C order. The compiled engine runs
    this same function (:mod:`simulator.model.batch_kernel`), so both give the same floats."""
    lower = [0] * dims
    weight = [0.0] * dims
    for a in range(dims):
        n = lens[a]
        x = point[a]
        i = 0
        while i < n - 2 and grid[a][i + 1] <= x:
            i += 1
        lower[a] = i
        weight[a] = (x - grid[a][i]) / (grid[a][i + 1] - grid[a][i])
    total = 0.0
    for corner in range(1 << dims):
        w = 1.0
        flat = 0
        for a in range(dims):
            up = (corner >> (dims - 1 - a)) & 1
            w *= weight[a] if up else 1.0 - weight[a]
            flat = flat * lens[a] + lower[a] + up
        total += w * values[flat]
    return total if total > floor else floor


@KINDS.register("table")
def parse(spec: dict[str, Any], where: Where) -> TableService:
    """Build a :class:`TableService` from its JSON object, checking the grid's shape."""
    axes_raw = spec.get("axes")
    if not isinstance(axes_raw, dict) or not axes_raw:
        raise where.error("axes", "must be an object of axis name -> increasing list")
    axes, grid = [], []
    for name, values in axes_raw.items():
        if name not in AXES:
            raise where.error(f"axes.{name}", f"unknown axis; valid: {', '.join(AXES)}")
        if not isinstance(values, list) or not values:
            raise where.error(f"axes.{name}", "must be a non-empty list")
        xs = [need_number(v, where, f"axes.{name}", positive=True) for v in values]
        if any(b <= a for a, b in zip(xs, xs[1:], strict=False)):
            raise where.error(f"axes.{name}", "must be strictly increasing")
        axes.append(name)
        grid.append(tuple(xs))
    try:
        seconds = np.asarray(spec.get("seconds"), dtype=float)
    except (TypeError, ValueError):
        raise where.error("seconds", "must be a nested list of numbers") from None
    expected = tuple(len(g) for g in grid)
    if seconds.shape != expected:
        raise where.error("seconds", f"shape {seconds.shape} does not match the axes {expected}")
    if not np.all(np.isfinite(seconds)) or np.any(seconds <= 0):
        raise where.error("seconds", "every time must be a finite number > 0")
    # A one-point axis cannot be interpolated along; repeat it so the grid is valid.
    for i, g in enumerate(grid):
        if len(g) == 1:
            grid[i] = (g[0], g[0] + 1.0)
            seconds = np.concatenate([seconds, seconds], axis=i)
    dist = spec.get("dist", "deterministic")
    if dist not in ("deterministic", "gamma", "lognormal"):
        raise where.error("dist", "must be deterministic, gamma or lognormal")
    cv = need_number(spec.get("cv", 0.0), where, "cv", minimum=0.0)
    if dist != "deterministic" and cv <= 0:
        raise where.error("cv", f"must be > 0 for dist '{dist}'")
    return TableService(axes=tuple(axes), grid=tuple(grid), seconds=seconds, dist=dist, cv=cv)
