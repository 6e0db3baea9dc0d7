"""The ``iteration`` kind: a service model built from the cost of one engine iteration.

::

    {"kind": "iteration", "dist": "deterministic" | "exponential" | "gamma", "cv": 0.2,
     "step": {"base": 0.02, "per_row": 0.001, "per_prefill_token": 1e-5,
              "per_context_token": 0.0},
     "finished_rows": "leave" | "stay"}

One iteration of a batch with R rows, of which some are admitted this iteration with
``prefill`` prompt tokens in all, over a context of C tokens per row (prompt plus tokens
so far), takes on average
``base + per_row * R + per_prefill_token * prefill + per_context_token * R * C`` seconds,
drawn from ``dist`` around that mean (independently per iteration). With an ``engine`` block
(:mod:`simulator.profile.overhead`) those coefficients are the GPU's kernel time alone and
each iteration adds the engine's host time: ``max(host, gpu)`` for an engine whose eager
launches overlap the GPU, ``host + gpu`` otherwise. The last term is the
part that grows as the sequences do (attention reading every row's KV cache, a cache that
is copied to grow); it is what makes the 200th token of a row dearer than its 20th.
Every row commits one token per iteration; a row's first token comes from the iteration
that prefills it.

The same costs give a static batch's time, so micro-batching and continuous batching are
compared on one set of numbers: a batch of B prompts (longest prompt P, max tokens m_b per
row) runs its first iteration with all B rows prefilling B * P tokens, then one decode
iteration per further token, rows leaving as they finish (the batch ends with its longest
row; a batch is padded to its longest prompt, so every row's context is that prompt plus
the tokens so far). ``finished_rows``: ``leave`` (default) drops a row that reached its max
tokens from later iterations; ``stay`` keeps it to the end, as a static batched generate
does (Hugging Face ``generate`` pads finished rows until every row is done). Mean and
variance are sums over those independent iterations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from simulator.profile.iteration import IterationKindCost, StepCost
from simulator.profile.kinds.base import KINDS
from simulator.profile.overhead import EngineOverhead, parse_engine
from simulator.profile.shape import BatchShape
from simulator.profile.spec import Where, need_number

DISTS = ("deterministic", "exponential", "gamma")
FINISHED_ROWS = ("leave", "stay")
STEP_FIELDS = ("base", "per_row", "per_prefill_token", "per_context_token")


@dataclass(frozen=True)
class IterationService:
    """Per-iteration costs (module docstring); answers static batches and continuous engines."""

    base: float
    per_row: float = 0.0
    per_prefill_token: float = 0.0
    per_context_token: float = 0.0
    dist: str = "deterministic"
    cv: float = 0.0
    finished_rows: str = "leave"
    engine: EngineOverhead | None = None
    kind: str = "iteration"
    draws_acceptance: ClassVar[bool] = False

    def step_cost(self, task_profile: Any) -> StepCost:
        """Its own per-iteration costs; one token per row."""
        return IterationKindCost(self)

    def first_token_seconds(self, task_profile: Any, shape: BatchShape, work: float) -> float:
        """``work`` times the share of the batch's mean its first two iterations take."""
        return work * (self.first_token_mean(shape) / self.mean(shape))

    def step_mean(self, rows: int, prefill_tokens: int, context: int = 0) -> float:
        """Mean seconds of one iteration of ``rows`` rows prefilling ``prefill_tokens`` tokens,
        over ``context`` tokens per row."""
        gpu = (self.base + self.per_row * rows + self.per_prefill_token * prefill_tokens
               + self.per_context_token * rows * context)
        if self.engine is None:
            return gpu
        host = self.engine.host("prefill" if prefill_tokens else "step", rows)
        return float(self.engine.combine(gpu, host))

    @property
    def _cv(self) -> float:
        return {"deterministic": 0.0, "exponential": 1.0}.get(self.dist, self.cv)

    def draw(self, mean: float, rng: np.random.Generator) -> float:
        """One iteration time of mean ``mean``."""
        if self.dist == "deterministic" or mean <= 0:
            return mean
        if self.dist == "exponential":
            return float(rng.exponential(mean))
        shape = 1.0 / self._cv ** 2
        return float(rng.gamma(shape, mean / shape))

    def _running(self, shape: BatchShape) -> np.ndarray:
        """Rows in each iteration of a static batch."""
        rows = np.asarray(shape.rows_max_tokens or (shape.max_tokens,) * shape.size)
        longest = int(rows.max())
        if self.finished_rows == "stay":
            return np.full(longest, rows.size)
        # Rows still running in iteration i (0-based) are those with more than i tokens to make:
        # all but those with at most i (a count per length, summed up: linear in the batch).
        return rows.size - np.cumsum(np.bincount(rows, minlength=longest + 1))[:longest]

    def _iteration_means(self, shape: BatchShape) -> np.ndarray:
        # A batch asks for its mean, first-token share and host share of one shape in a row:
        # the last shape's means are kept (read-only), so they are computed once per batch.
        return self._costs(shape)[0]

    def _costs(self, shape: BatchShape) -> tuple[np.ndarray, float, float]:
        """The iteration means of a static batch of ``shape``, its host seconds (0 without an
        engine block) and its mean seconds (the means' sum)."""
        memo = self.__dict__.get("_memo")
        if memo is not None and (memo[0] is shape or memo[0] == shape):
            return memo[1]
        running = self._running(shape)
        longest = len(running)
        means = self.base + self.per_row * running
        if self.per_context_token:
            means = means + self.per_context_token * running * (shape.prompt_tokens + np.arange(longest))
        means[0] += self.per_prefill_token * shape.size * shape.prompt_tokens
        host_s = 0.0
        if self.engine is not None:
            host = self._host(running)
            host_s = float(host.sum())
            means = self.engine.combine(means, host)
        means.flags.writeable = False
        costs = (means, host_s, float(means.sum()))
        object.__setattr__(self, "_memo", (shape, costs))
        return costs

    def _host(self, running: np.ndarray) -> np.ndarray:
        """Host seconds of each iteration of a static batch (its first one prefills)."""
        assert self.engine is not None
        host = np.asarray(self.engine.host("step", running), dtype=float).copy()
        host[0] = self.engine.host("prefill", running[0])
        return host

    def host_fraction(self, shape: BatchShape) -> float | None:
        """Share of a static batch's time that holds the interpreter lock (``None`` without an
        engine block): ``interpreter_share`` × its host seconds over its seconds."""
        if self.engine is None:
            return None
        _, host, total = self._costs(shape)
        return min(1.0, self.engine.interpreter_share * host / total) if total > 0 else 0.0

    def mean(self, shape: BatchShape) -> float:
        return self._costs(shape)[2]

    def variance(self, shape: BatchShape) -> float:
        return float(((self._cv * self._iteration_means(shape)) ** 2).sum())

    def sample(self, shape: BatchShape, rng: np.random.Generator) -> float:
        means, _, total = self._costs(shape)
        if self.dist == "deterministic":
            return total
        if self.dist == "exponential":
            return float(rng.exponential(means).sum())
        k = 1.0 / self._cv ** 2
        return float(rng.gamma(k, means / k).sum())

    def first_token_mean(self, shape: BatchShape) -> float:
        """Mean seconds from a static batch's start to its first token: the prefill
        iteration and the first decoding iteration after it (where the batch has one)."""
        return float(self._iteration_means(shape)[:2].sum())

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "dist": self.dist,
                               "step": {"base": self.base, "per_row": self.per_row,
                                        "per_prefill_token": self.per_prefill_token}}
        if self.per_context_token:
            out["step"]["per_context_token"] = self.per_context_token
        if self.dist == "gamma":
            out["cv"] = self.cv
        if self.finished_rows != "leave":
            out["finished_rows"] = self.finished_rows
        if self.engine is not None:
            out["engine"] = self.engine.to_dict()
        return out


@KINDS.register("iteration")
def parse(spec: dict[str, Any], where: Where) -> IterationService:
    """Build an :class:`IterationService`, checking every field."""
    dist = spec.get("dist", "deterministic")
    if dist not in DISTS:
        raise where.error("dist", f"must be one of {', '.join(DISTS)}, got {dist!r}")
    step = spec.get("step")
    if not isinstance(step, dict):
        raise where.error("step", f"must be an object with {', '.join(STEP_FIELDS)} (seconds)")
    unknown = set(step) - set(STEP_FIELDS)
    if unknown:
        raise where.error(f"step.{sorted(unknown)[0]}", f"unknown field; valid: {', '.join(STEP_FIELDS)}")
    values = {k: need_number(step.get(k, 0.0), where, f"step.{k}", minimum=0.0) for k in STEP_FIELDS}
    if values["base"] + values["per_row"] <= 0 and spec.get("engine") is None:
        raise where.error("step", "an iteration must take time: base + per_row must be > 0")
    cv = 0.0
    if dist == "gamma":
        cv = need_number(spec.get("cv"), where, "cv", positive=True)
    finished = spec.get("finished_rows", "leave")
    if finished not in FINISHED_ROWS:
        raise where.error("finished_rows", f"must be one of {', '.join(FINISHED_ROWS)}, got {finished!r}")
    return IterationService(base=values["base"], per_row=values["per_row"],
                            per_prefill_token=values["per_prefill_token"],
                            per_context_token=values["per_context_token"], dist=dist, cv=cv,
                            finished_rows=finished, engine=parse_engine(spec.get("engine"), where))
