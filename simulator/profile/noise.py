"""Run-to-run noise around a batch's mean service time, for the kinds that price whole batches
(``distribution``, ``table``): one sampler, and its bulk form for the compiled engine.

``dist`` is ``deterministic`` (or any with ``cv`` 0: no noise), ``exponential`` (cv 1),
``gamma`` (shape ``1 / cv²``) or ``lognormal`` (``σ² = log(1 + cv²)``, ``μ = log(mean) − σ²/2``);
each has mean ``mean`` and coefficient of variation ``cv``.

The bulk form draws the *standard* variates of ``n`` batches at once — numpy's bulk draws
equal its one-by-one draws — and :func:`sample` is exactly ``scale(standard)``: ``mean × z``
(exponential), ``(mean / k) × z`` (gamma), ``exp(μ + σ z)`` (lognormal), as numpy computes
them; the compiled kernel (:mod:`simulator.model.batch_kernel`, ``_form``) applies the same
operations to :func:`standard_draws`, so both engines get the same floats.
"""

from __future__ import annotations

import math

import numpy as np

#: Kernel codes of the distributions (simulator.model.batch_kernel: K_*).
CODES = {"deterministic": 0, "exponential": 1, "gamma": 2, "lognormal": 3}


def is_noiseless(dist: str, cv: float) -> bool:
    return dist == "deterministic" or cv == 0


def sample(dist: str, mean: float, cv: float, rng: np.random.Generator) -> float:
    """One service time of mean ``mean``."""
    if is_noiseless(dist, cv):
        return mean
    if dist == "exponential":
        return float(rng.exponential(mean))
    if dist == "gamma":
        k = 1.0 / (cv * cv)
        return float(rng.gamma(k, mean / k))
    s2 = math.log1p(cv * cv)
    return float(rng.lognormal(math.log(mean) - s2 / 2.0, math.sqrt(s2)))


def parameters(dist: str, cv: float) -> tuple[float, float]:
    """What the kernel's transform needs: ``(k, 0)`` for gamma, ``(σ², σ)`` for lognormal."""
    if dist == "gamma" and not is_noiseless(dist, cv):
        return 1.0 / (cv * cv), 0.0
    if dist == "lognormal" and not is_noiseless(dist, cv):
        s2 = math.log1p(cv * cv)
        return s2, math.sqrt(s2)
    return 0.0, 0.0


def standard_draws(dist: str, cv: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """The standard variates of ``n`` successive :func:`sample` calls on ``rng``, drawn at once."""
    if is_noiseless(dist, cv):
        return np.zeros(0)
    if dist == "exponential":
        return rng.standard_exponential(n)
    if dist == "gamma":
        return rng.standard_gamma(parameters(dist, cv)[0], n)
    return rng.standard_normal(n)
