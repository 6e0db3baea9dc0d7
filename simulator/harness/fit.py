"""Per-operation cost models fitted to step timings, and their check on whole generations.

Forms (seconds; B batch rows, T tokens per row in the step, V attended cache length,
P prompt length; every coefficient >= 0):

* ``prefill``: ``c0 + c1·B·P + c2·B·P²`` (linear layers, then attention's quadratic term);
* ``step`` (draft step, verify, plain decode): ``c0 + c1·B·T + c2·B·T·V`` (launch and weight
  streaming; per-token linear work; attention over the cache view);
* ``iteration``: ``c0 + c1·k`` — the bookkeeping of one speculative iteration outside the
  model calls (sampling, acceptance, commits), fitted to the residuals of a *training* half
  of the measured generations.

A generation is predicted by composing the fitted costs with the iterations it recorded:
``prefill_target + prefill_draft + Σ_iterations (draft(B, 2, V) + (k - 1)·draft(B, 1, V)
+ verify(B, k + 1, V) + iteration(k))``; :func:`check_generations` reports the absolute
percentage error of that prediction on the *held-out* half. This module needs numpy and
scipy only; the forms and :class:`Cost` live with the replay side
(:mod:`simulator.profile.kinds.spec_decode`), which evaluates them without torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from simulator.profile.kinds.spec_decode import FORMS, Cost


def fit_cost(form: str, args: Sequence[Sequence[float]], seconds: Sequence[float]) -> tuple[Cost, float]:
    """Least-squares fit of ``form`` to ``seconds``, on relative residuals, coefficients >= 0.

    Returns the cost and the median absolute percentage error on the fitted points.
    """
    X = FORMS[form][1](*(np.asarray(a, dtype=float) for a in args))
    y = np.asarray(seconds, dtype=float)
    scale = X.max(0)
    scale[scale == 0] = 1
    Xs = X / scale
    start = np.full(X.shape[1], max(y.min(), 1e-9) / X.shape[1])
    res = least_squares(lambda c: (Xs @ c - y) / y, start, bounds=(0, np.inf))
    coef = res.x / scale
    ape = np.abs(X @ coef - y) / y
    return Cost(form, tuple(float(c) for c in coef)), float(np.median(ape))


@dataclass(frozen=True)
class GenerationRecord:
    """A measured generation: its shape, the iterations it ran and its measured seconds."""

    batch: int
    prompt_tokens: int
    lookahead: list[int]          # k per iteration
    views: list[int]              # attended cache length per iteration
    seconds: float


def composed_model_time(costs: dict[str, Cost], g: GenerationRecord) -> float:
    """Seconds the fitted model calls of ``g`` take (without the iteration bookkeeping)."""
    B, P = g.batch, g.prompt_tokens
    k = np.asarray(g.lookahead, dtype=float)
    V = np.asarray(g.views, dtype=float)
    Bv = np.full_like(V, B)
    per_iter = (costs["draft_step"](Bv, 2 * np.ones_like(V), V)
                + (k - 1) * costs["draft_step"](Bv, np.ones_like(V), V)
                + costs["verify"](Bv, k + 1, V))
    return float(costs["prefill_target"](B, P) + costs["prefill_draft"](B, P) + per_iter.sum())


def predict_generation(costs: dict[str, Cost], g: GenerationRecord) -> float:
    """Predicted seconds of ``g``: model calls plus the fitted per-iteration bookkeeping."""
    k = np.asarray(g.lookahead, dtype=float)
    return composed_model_time(costs, g) + float(costs["iteration"](k).sum())


def fit_iteration_overhead(costs: dict[str, Cost], train: Iterable[GenerationRecord]) -> Cost:
    """Fit ``iteration = c0 + c1·k`` to what the model calls leave unexplained in ``train``."""
    rows, target = [], []
    for g in train:
        k = np.asarray(g.lookahead, dtype=float)
        rows.append([len(k), k.sum()])
        target.append(g.seconds - composed_model_time(costs, g))
    X, y = np.asarray(rows), np.asarray(target)
    if len(y) == 0:
        return Cost("iteration", (0.0, 0.0))
    res = least_squares(lambda c: X @ c - y, np.zeros(2), bounds=(0, np.inf))
    return Cost("iteration", tuple(float(c) for c in res.x))


def check_generations(costs: dict[str, Cost], held_out: Sequence[GenerationRecord]) -> dict[str, Any]:
    """Absolute percentage errors of :func:`predict_generation` on ``held_out``."""
    ape = [abs(predict_generation(costs, g) - g.seconds) / g.seconds for g in held_out]
    return {
        "held_out": len(ape),
        "median_ape": float(np.median(ape)) if ape else None,
        "max_ape": float(np.max(ape)) if ape else None,
    }
