"""The ``distribution`` kind: a batch's service time is drawn from a named distribution.

The mean depends on the batch size B in one of three ways::

    "mean": 2.5                                   # the same for every B
    "mean": {"base": 90.0, "per_prompt": 1.2}     # base + per_prompt * B
    "mean": {"by_batch_size": {"1": 3, "4": 5}}   # listed sizes; linear in between and
                                                   # beyond (extrapolated from the nearest
                                                   # two), never below 1 % of the smallest

``dist`` is ``deterministic``, ``exponential`` (cv 1), ``gamma`` or ``lognormal``; the last
two take ``cv`` (standard deviation over mean). Token counts are ignored by this kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from simulator.profile import noise
from simulator.profile.iteration import WholeBatchIterations
from simulator.profile.kinds.base import KINDS
from simulator.profile.shape import BatchShape
from simulator.profile.spec import Where, need_number

DISTS = ("deterministic", "exponential", "gamma", "lognormal")


@dataclass(frozen=True)
class BatchMean:
    """Mean batch service time as a function of batch size."""

    base: float
    per_prompt: float = 0.0
    sizes: tuple[int, ...] = ()
    means: tuple[float, ...] = ()

    def __call__(self, size: int) -> float:
        if not self.sizes:
            return self.base + self.per_prompt * size
        if len(self.sizes) == 1:
            return self.means[0]
        if size <= self.sizes[0]:
            i = 0
        elif size >= self.sizes[-1]:
            i = len(self.sizes) - 2
        else:
            i = int(np.searchsorted(self.sizes, size)) - 1
        x0, x1 = self.sizes[i], self.sizes[i + 1]
        y0, y1 = self.means[i], self.means[i + 1]
        value = y0 + (y1 - y0) * (size - x0) / (x1 - x0)
        return max(value, 0.01 * min(self.means))

    def to_json(self) -> Any:
        if self.sizes:
            return {"by_batch_size": {str(s): m for s, m in zip(self.sizes, self.means, strict=True)}}
        if self.per_prompt:
            return {"base": self.base, "per_prompt": self.per_prompt}
        return self.base


def parse_mean(raw: Any, where: Where) -> BatchMean:
    """Parse the ``mean`` field (number, base/per_prompt, or by_batch_size)."""
    if isinstance(raw, dict) and "by_batch_size" in raw:
        table = raw["by_batch_size"]
        if not isinstance(table, dict) or not table:
            raise where.error("mean.by_batch_size", "must be a non-empty object of size: seconds")
        pairs = []
        for key, value in table.items():
            try:
                size = int(key)
            except ValueError:
                raise where.error("mean.by_batch_size", f"key '{key}' is not a batch size") from None
            if size < 1:
                raise where.error("mean.by_batch_size", f"batch size {size} must be >= 1")
            pairs.append((size, need_number(value, where, f"mean.by_batch_size.{key}", positive=True)))
        pairs.sort()
        return BatchMean(base=0.0, sizes=tuple(p[0] for p in pairs), means=tuple(p[1] for p in pairs))
    if isinstance(raw, dict):
        unknown = set(raw) - {"base", "per_prompt"}
        if unknown or "base" not in raw:
            raise where.error("mean", "must be a number, {base, per_prompt} or {by_batch_size}")
        base = need_number(raw["base"], where, "mean.base", minimum=0.0)
        per = need_number(raw.get("per_prompt", 0.0), where, "mean.per_prompt", minimum=0.0)
        if base + per <= 0:
            raise where.error("mean", "base + per_prompt must be > 0")
        return BatchMean(base=base, per_prompt=per)
    return BatchMean(base=need_number(raw, where, "mean", positive=True))


@dataclass(frozen=True)
class DistributionService(WholeBatchIterations):
    """Service time ~ ``dist`` with mean ``mean(B)`` and coefficient of variation ``cv``."""

    dist: str
    batch_mean: BatchMean
    cv: float
    kind: str = "distribution"
    draws_acceptance: ClassVar[bool] = False

    def host_fraction(self, shape: BatchShape) -> float | None:
        return None

    def mean(self, shape: BatchShape) -> float:
        return self.batch_mean(shape.size)

    def variance(self, shape: BatchShape) -> float:
        return (self.cv * self.batch_mean(shape.size)) ** 2

    def sample(self, shape: BatchShape, rng: np.random.Generator) -> float:
        return noise.sample(self.dist, self.batch_mean(shape.size), self.cv, rng)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "dist": self.dist, "mean": self.batch_mean.to_json()}
        if self.dist in ("gamma", "lognormal"):
            out["cv"] = self.cv
        return out


@KINDS.register("distribution")
def parse(spec: dict[str, Any], where: Where) -> DistributionService:
    """Build a :class:`DistributionService` from its JSON object."""
    dist = spec.get("dist", "deterministic")
    if dist not in DISTS:
        raise where.error("dist", f"unknown distribution '{dist}'; valid: {', '.join(DISTS)}")
    if "mean" not in spec:
        raise where.error("mean", "missing")
    batch_mean = parse_mean(spec["mean"], where)
    if dist in ("gamma", "lognormal"):
        if "cv" not in spec:
            raise where.error("cv", f"required for dist '{dist}'")
        cv = need_number(spec["cv"], where, "cv", positive=True)
    else:
        cv = 1.0 if dist == "exponential" else 0.0
    return DistributionService(dist=dist, batch_mean=batch_mean, cv=cv)
