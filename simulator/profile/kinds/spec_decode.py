"""The ``spec_decode`` kind: batched speculative decoding composed from fitted operation costs.

::

    {"kind": "spec_decode",
     "costs": {"prefill_target": {"form": "prefill", "coef": [c0, c1, c2]},
               "prefill_draft": {...}, "draft_step": {"form": "step", ...},
               "verify": {...}, "decode": {...}, "iteration": {"form": "iteration", ...}},
     "acceptance": 0.3, "lookahead": 3, "discipline": "ragged" | "lockstep", "view_step": 256}

written by ``simctl profile`` (:mod:`simulator.harness.profiler`). The cost forms (seconds;
B rows, T tokens per row, V attended cache length, P prompt length) are

* ``prefill``: ``c0 + c1·B·P + c2·B·P²``;
* ``step``: ``c0 + c1·B·T + c2·B·T·V``;
* ``iteration``: ``c0 + c1·k`` (bookkeeping outside the model calls).

A batch of B prompts (longest prompt P, max tokens per row) takes
``prefill_target(B, P) + prefill_draft(B, P)`` plus, per iteration i,
``draft_step(B, 2, V_i) + (k - 1)·draft_step(B, 1, V_i) + verify(B, k + 1, V_i) + iteration(k)``,
where ``V_i`` is the cache view the harness attends in iteration i (a multiple of
``view_step`` above the longest possible row). The first token comes from the prefill;
each iteration every unfinished row accepts ``n`` drafts, drawn from the run's random
stream as a truncated geometric (each draft accepted with probability ``acceptance`` until
the first rejection, at most k), and commits ``n + 1`` tokens (``ragged``) or ``m + 1`` with
m the minimum over the unfinished rows (``lockstep``). The batch ends when its slowest row
has its max tokens. This module needs numpy only: replay never imports torch.

``"kv_cache": false`` describes a decoder without a KV cache (as in the users' first
server): every draft pass and the verify pass run over each active row's whole sequence,
right-padded to the longest, so iteration i costs
``k·draft_step(R_i, V_i, V_i) + verify(R_i, V_i + k, V_i + k) + iteration(k)`` with R_i the
rows still running and V_i the longest of them (ragged discipline; the prefill is the first
pass and not priced apart).

With an ``engine`` block (:mod:`simulator.profile.overhead`) the cost forms are the GPU's
kernel time alone: each pass (a prefill, a draft pass, the verify pass) then takes
``max(host, gpu)`` or ``host + gpu`` with the engine's host time for that pass, and each
iteration adds ``row_s`` per row running (the per-row acceptance loop).

Adaptive lookahead (the scenario's ``adaptive_lookahead``, per GPU): the lookahead of a
batch is chosen from the mean of the last 100 per-row acceptance rates (accepted over
drafted tokens, per row of past batches on that GPU; 0.5 with no history) from the base
lookahead k: mean > 0.75 → k + 2 (at most 8), > 0.60 → k + 1, > 0.40 → k,
> 0.25 → max(k − 1, 2), else max(k − 2, 1). This is the rule of the users' decoder.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from simulator.profile.acceptance import draw_accepted
from simulator.profile.iteration import SpecDecodeCost, StepCost
from simulator.profile.kinds.base import KINDS
from simulator.profile.overhead import EngineOverhead, parse_engine
from simulator.profile.shape import BatchShape
from simulator.profile.spec import Where, need_number

DISCIPLINES = ("ragged", "lockstep")

#: form name -> (expression, design-matrix builder)
FORMS: dict[str, tuple[str, Callable[..., np.ndarray]]] = {
    "prefill": ("c0 + c1*B*P + c2*B*P^2", lambda B, P: np.stack([np.ones_like(B), B * P, B * P * P], -1)),
    "step": ("c0 + c1*B*T + c2*B*T*V", lambda B, T, V: np.stack([np.ones_like(B), B * T, B * T * V], -1)),
    "iteration": ("c0 + c1*k", lambda k: np.stack([np.ones_like(k), k], -1)),
}


# The forms evaluated term by term, left to right (not as the design matrix times the
# coefficients: a BLAS product's rounding depends on the machine and the array's length).
# Pure numeric functions of float scalars or arrays and an indexable ``c``: the compiled
# engine (simulator.model.kernel_service) compiles these same functions, so both engines
# get the same floats.
def prefill_form(c: Any, B: Any, P: Any) -> Any:
    """``c0 + c1*B*P + c2*B*P^2``."""
    return c[0] + c[1] * (B * P) + c[2] * (B * P * P)


def step_form(c: Any, B: Any, T: Any, V: Any) -> Any:
    """``c0 + c1*B*T + c2*B*T*V``."""
    return c[0] + c[1] * (B * T) + c[2] * (B * T * V)


def iteration_form(c: Any, k: Any) -> Any:
    """``c0 + c1*k``."""
    return c[0] + c[1] * k


#: form name -> its evaluation (the same expression as FORMS, term by term)
EVALUATE: dict[str, Callable[..., Any]] = {"prefill": prefill_form, "step": step_form, "iteration": iteration_form}
#: operation -> the form its cost has
OPERATIONS = {"prefill_target": "prefill", "prefill_draft": "prefill", "draft_step": "step",
              "verify": "step", "decode": "step", "iteration": "iteration"}


@dataclass(frozen=True)
class Cost:
    """A fitted cost: its form and coefficients; call it with the form's variables."""

    form: str
    coef: tuple[float, ...]

    def __call__(self, *args: Any) -> np.ndarray:
        return EVALUATE[self.form](self.coef, *(np.asarray(a, dtype=float) for a in args))

    def to_dict(self) -> dict[str, Any]:
        return {"form": self.form, "expr": FORMS[self.form][0], "coef": list(self.coef)}


def iterations_needed(needs: np.ndarray, accepted: np.ndarray, discipline: str) -> int:
    """Iterations until every row has committed ``needs[b]`` tokens, given ``accepted[i, b]``."""
    needs = np.asarray(needs)
    if needs.max() <= 0:
        return 0
    if discipline == "ragged":
        done_at = np.argmax(np.cumsum(accepted + 1, axis=0) >= needs, axis=0)
        return int(done_at[needs > 0].max()) + 1
    # lockstep: all unfinished rows commit min(n) + 1; go from one finishing row to the next
    remaining = needs.astype(np.int64).copy()
    active = remaining > 0
    t = 0
    while active.any():
        step = accepted[t:, active].min(axis=1) + 1
        progress = np.cumsum(step)
        first = int(np.argmax(progress >= remaining[active].min()))
        remaining[active] -= progress[first]
        t += first + 1
        active &= remaining > 0
    return t


@dataclass(frozen=True)
class SpecDecodeService:
    """Batch times of speculative decoding from fitted operation costs (see module docstring)."""

    costs: dict[str, Cost]
    acceptance: float
    lookahead: int
    discipline: str = "ragged"
    view_step: int = 256
    kv_cache: bool = True
    engine: EngineOverhead | None = None
    kind: str = "spec_decode"
    draws_acceptance: ClassVar[bool] = True
    _moments: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def with_overrides(self, acceptance: float | None = None, lookahead: int | None = None,
                       discipline: str | None = None) -> SpecDecodeService:
        """The same costs with another acceptance, lookahead or discipline (scenario/CLI overrides)."""
        changes: dict[str, Any] = {k: v for k, v in (("acceptance", acceptance), ("lookahead", lookahead),
                                      ("discipline", discipline)) if v is not None}
        return replace(self, **changes) if changes else self

    def passes(self, name: str, gpu: Any) -> Any:
        """Seconds of passes of kind ``name`` (``prefill``, ``draft``, ``verify``) that take
        ``gpu`` kernel seconds: the kernel time alone, or combined with the engine's host time."""
        if self.engine is None:
            return gpu
        return self.engine.combine(gpu, self.engine.host(name))

    def round_overhead(self, rows: Any) -> Any:
        """Host seconds per iteration outside the passes: ``row_s`` per running row."""
        return 0.0 if self.engine is None else self.engine.row_s * np.asarray(rows, dtype=float)

    def host_fraction(self, shape: BatchShape) -> float | None:
        """Share of a batch's time that holds the interpreter lock (``None`` without an engine
        block), from one iteration at the batch's mid-generation length: ``interpreter_share``
        × its host seconds over its seconds."""
        if self.engine is None:
            return None
        e, k, B = self.engine, self.lookahead, shape.size
        V = float(shape.prompt_tokens + shape.max_tokens // 2)
        c = self.costs
        if self.kv_cache:
            gpu = [(c["draft_step"](B, 1, V), "draft", k), (c["verify"](B, k + 1, V), "verify", 1)]
        else:
            gpu = [(c["draft_step"](B, V, V), "draft", k), (c["verify"](B, V + k, V + k), "verify", 1)]
        total = sum(n * float(self.passes(name, g)) for g, name, n in gpu) + float(self.round_overhead(B))
        host = sum(n * float(e.host(name)) for _, name, n in gpu) + float(self.round_overhead(B))
        return min(1.0, e.interpreter_share * host / total) if total > 0 else 0.0

    def step_cost(self, task_profile: Any) -> StepCost:
        """Its own prefill and speculative-step terms (:class:`SpecDecodeCost`)."""
        return SpecDecodeCost(self)

    def first_token_seconds(self, task_profile: Any, shape: BatchShape, work: float) -> float:
        """The prefill and the first speculative step at the batch's shape (at most ``work``)."""
        cost = SpecDecodeCost(self)
        first = cost.step(0, [shape.prompt_tokens] * shape.size, 0, None)
        if shape.max_tokens > 1:
            first += cost.step(shape.size, [], shape.prompt_tokens, None, shape.prompt_tokens + shape.max_tokens)
        return min(work, first)

    def time_for(self, B: int, P: int, iterations: int, max_new: int) -> float:
        """Seconds of a batch that ran ``iterations`` speculative iterations."""
        c, k = self.costs, self.lookahead
        t = float(self.passes("prefill", c["prefill_target"](B, P)) + self.passes("draft", c["prefill_draft"](B, P)))
        if iterations == 0:
            return t
        s_max = P + max_new + 2 * (k + 1)
        bound = np.minimum(P + np.arange(iterations) * (k + 1), P + max_new + k + 1)
        views = np.minimum(s_max, self.view_step * np.ceil((bound + k + 1) / self.view_step))
        Bv = np.full(iterations, float(B))
        ones = np.ones(iterations)
        per_iter = (self.passes("draft", c["draft_step"](Bv, 2 * ones, views))
                    + (k - 1) * self.passes("draft", c["draft_step"](Bv, ones, views))
                    + self.passes("verify", c["verify"](Bv, (k + 1) * ones, views)) + c["iteration"](k * ones)
                    + self.round_overhead(Bv))
        return t + float(per_iter.sum())

    def sample(self, shape: BatchShape, rng: np.random.Generator) -> float:
        return self.sample_detail(shape, rng)[0]

    def sample_detail(self, shape: BatchShape, rng: np.random.Generator) -> tuple[float, np.ndarray]:
        """One batch time and each row's acceptance rate (accepted over drafted tokens)."""
        rows = shape.rows_max_tokens or (shape.max_tokens,) * shape.size
        if not self.kv_cache:
            return self._sample_no_cache(shape.prompt_tokens, np.asarray(rows), rng)
        needs = np.asarray(rows) - 1   # the prefill gives every row its first token
        horizon = max(int(needs.max()), 0)
        accepted = draw_accepted(rng, self.acceptance, self.lookahead, (horizon, len(rows)))
        its = iterations_needed(needs, accepted, self.discipline) if horizon else 0
        rates = accepted[:max(its, 1)].mean(axis=0) / self.lookahead if horizon else np.zeros(len(rows))
        return self.time_for(shape.size, shape.prompt_tokens, its, max(rows)), rates

    def _sample_no_cache(self, P: int, needs: np.ndarray, rng: np.random.Generator) -> tuple[float, np.ndarray]:
        """Ragged rounds without a KV cache (module docstring), vectorised over rounds."""
        c, k = self.costs, self.lookahead
        horizon = int(needs.max())
        if horizon <= 0:
            return 0.0, np.zeros(len(needs))
        accepted = draw_accepted(rng, self.acceptance, k, (horizon, len(needs)))
        made = np.minimum(np.cumsum(accepted + 1, axis=0), needs)   # tokens after each round
        before = np.vstack([np.zeros((1, len(needs)), dtype=made.dtype), made[:-1]])
        active = before < needs                                      # rows running in round i
        rounds = int(active.any(axis=1).sum())
        active, before = active[:rounds], before[:rounds]
        R = active.sum(axis=1).astype(float)
        V = P + np.where(active, before, 0).max(axis=1).astype(float)
        t = (k * self.passes("draft", c["draft_step"](R, V, V)) + self.passes("verify", c["verify"](R, V + k, V + k))
             + c["iteration"](np.full(rounds, float(k))) + self.round_overhead(R))
        drafted = active.sum(axis=0) * k
        rates = np.where(drafted > 0, (accepted[:rounds] * active).sum(axis=0) / np.maximum(drafted, 1), 0.0)
        return float(t.sum()), rates

    def _moments_of(self, shape: BatchShape) -> tuple[float, float]:
        key = (shape.size, shape.prompt_tokens, shape.max_tokens, shape.rows_max_tokens)
        if key not in self._moments:
            # Monte Carlo on a fixed stream: deterministic, and never touches a run's stream.
            rng = np.random.default_rng(12345)
            draws = np.array([self.sample(shape, rng) for _ in range(200)])
            self._moments[key] = (float(draws.mean()), float(draws.var()))
        return self._moments[key]

    def mean(self, shape: BatchShape) -> float:
        return self._moments_of(shape)[0]

    def variance(self, shape: BatchShape) -> float:
        return self._moments_of(shape)[1]

    def to_dict(self) -> dict[str, Any]:
        out = {"kind": self.kind, "costs": {k: v.to_dict() for k, v in self.costs.items()},
               "acceptance": self.acceptance, "lookahead": self.lookahead,
               "discipline": self.discipline, "view_step": self.view_step}
        if not self.kv_cache:
            out["kv_cache"] = False
        if self.engine is not None:
            out["engine"] = self.engine.to_dict()
        return out


@KINDS.register("spec_decode")
def parse(spec: dict[str, Any], where: Where) -> SpecDecodeService:
    """Build a :class:`SpecDecodeService`, checking every cost and parameter."""
    costs_raw = spec.get("costs")
    if not isinstance(costs_raw, dict):
        raise where.error("costs", "must be an object of operation -> {form, coef}")
    costs = {}
    for op, form in OPERATIONS.items():
        if op == "decode" and op not in costs_raw:
            continue  # plain decode is measured but not needed for service times
        entry = costs_raw.get(op)
        if not isinstance(entry, dict):
            raise where.error(f"costs.{op}", "missing (an object with 'form' and 'coef')")
        if entry.get("form") != form:
            raise where.error(f"costs.{op}.form", f"must be '{form}', got {entry.get('form')!r}")
        coef = entry.get("coef")
        n = FORMS[form][1](*([np.zeros(1)] * (3 if form == "step" else 2 if form == "prefill" else 1))).shape[-1]
        if not isinstance(coef, list) or len(coef) != n:
            raise where.error(f"costs.{op}.coef", f"must be a list of {n} numbers")
        costs[op] = Cost(form, tuple(need_number(c, where, f"costs.{op}.coef", minimum=0.0) for c in coef))
    alpha = need_number(spec.get("acceptance"), where, "acceptance", minimum=0.0)
    if alpha > 1:
        raise where.error("acceptance", f"must be in [0, 1], got {alpha:g}")
    k = spec.get("lookahead")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise where.error("lookahead", f"must be an integer >= 1, got {k!r}")
    discipline = spec.get("discipline", "ragged")
    if discipline not in DISCIPLINES:
        raise where.error("discipline", f"must be one of {', '.join(DISCIPLINES)}, got {discipline!r}")
    step = spec.get("view_step", 256)
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise where.error("view_step", f"must be an integer >= 1, got {step!r}")
    kv_cache = spec.get("kv_cache", True)
    if not isinstance(kv_cache, bool):
        raise where.error("kv_cache", f"must be true or false, got {kv_cache!r}")
    return SpecDecodeService(costs, alpha, k, discipline, step, kv_cache, parse_engine(spec.get("engine"), where))


def adaptive_lookahead(base: int, history_mean: float | None) -> int:
    """The lookahead the adaptive rule picks from the mean recent acceptance rate (module
    docstring); ``None`` (no history yet) counts as 0.5."""
    mean = 0.5 if history_mean is None else history_mean
    if mean > 0.75:
        return min(base + 2, 8)
    if mean > 0.60:
        return base + 1
    if mean > 0.40:
        return base
    if mean > 0.25:
        return max(base - 1, 2)
    return max(base - 2, 1)
