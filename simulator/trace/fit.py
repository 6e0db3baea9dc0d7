"""Fitting a trace's statistics, to synthesise more traffic like it.

* Inter-arrival gaps: exponential, gamma, lognormal and Weibull, each by maximum likelihood
  (scipy, location fixed at 0), on the positive gaps (simultaneous arrivals are reported
  as a share, and carried by the prompts-per-call distribution when requests are grouped
  into calls). The model with the lowest AIC (2k − 2 ln L) is chosen; each candidate's
  log-likelihood, AIC and Kolmogorov–Smirnov distance are reported.
* Prompts per call and the task mix: their empirical frequencies.
* Tokens per task: lognormal with the sample mean and coefficient of variation (a fixed
  count where every prompt has the same), for prompt and for max tokens.

:func:`spec_from_fit` turns a fit into a :class:`~simulator.trace.synth.SynthSpec`: the
chosen family with its fitted CV, scaled to the trace's own mean gap (so the rate is kept).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats

from simulator.trace.model import Trace
from simulator.trace.synth import SynthSpec, TokenDist

FAMILIES = ("exponential", "gamma", "lognormal", "weibull")


@dataclass(frozen=True)
class ArrivalFit:
    """One fitted inter-arrival family: parameters, implied mean and CV, and its criteria."""

    family: str
    params: dict[str, float]
    mean: float
    cv: float
    log_likelihood: float
    aic: float
    ks: float


def _fit_family(family: str, gaps: np.ndarray) -> ArrivalFit:
    if family == "exponential":
        _, scale = stats.expon.fit(gaps, floc=0)
        dist, params, k = stats.expon(scale=scale), {"scale": scale}, 1
    elif family == "gamma":
        shape, _, scale = stats.gamma.fit(gaps, floc=0)
        dist, params, k = stats.gamma(shape, scale=scale), {"shape": shape, "scale": scale}, 2
    elif family == "lognormal":
        sigma, _, scale = stats.lognorm.fit(gaps, floc=0)
        dist, params, k = stats.lognorm(sigma, scale=scale), {"sigma": sigma, "mu": math.log(scale)}, 2
    else:
        shape, _, scale = stats.weibull_min.fit(gaps, floc=0)
        dist, params, k = stats.weibull_min(shape, scale=scale), {"shape": shape, "scale": scale}, 2
    ll = float(np.sum(dist.logpdf(gaps)))
    mean, var = (float(x) for x in dist.stats(moments="mv"))
    ks = float(stats.kstest(gaps, dist.cdf).statistic)
    return ArrivalFit(family, {n: float(v) for n, v in params.items()}, mean, math.sqrt(var) / mean,
                      ll, 2 * k - 2 * ll, ks)


@dataclass(frozen=True)
class ArrivalModel:
    """The chosen inter-arrival model and every candidate, best (lowest AIC) first."""

    best: ArrivalFit
    candidates: tuple[ArrivalFit, ...]
    gaps: int
    zero_gaps: int

    def to_dict(self) -> dict[str, Any]:
        return {"best": self.best.family, "criterion": "AIC", "gaps": self.gaps, "zero_gaps": self.zero_gaps,
                "candidates": [asdict(c) for c in self.candidates]}


def fit_arrivals(times: np.ndarray, families: tuple[str, ...] = FAMILIES) -> ArrivalModel | None:
    """Fit the gaps between sorted arrival ``times``; ``None`` with fewer than 10 positive gaps."""
    gaps = np.diff(np.sort(np.asarray(times, dtype=float)))
    positive = gaps[gaps > 0]
    if positive.size < 10:
        return None
    fits = []
    for family in families:
        try:
            fits.append(_fit_family(family, positive))
        except (ValueError, RuntimeError, FloatingPointError):
            continue  # a family scipy cannot fit to these gaps is simply not a candidate
    fits.sort(key=lambda f: f.aic)
    return ArrivalModel(fits[0], tuple(fits), int(gaps.size), int((gaps <= 0).sum()))


def _token_dist(values: list[int]) -> TokenDist | None:
    if not values:
        return None
    x = np.asarray(values, dtype=float)
    if np.all(x == x[0]):
        return TokenDist.fixed(int(x[0]))
    return TokenDist.lognormal(float(x.mean()), float(x.std(ddof=1) / x.mean()))


def spec_from_fit(trace: Trace, duration: float, rate_scale: float = 1.0) -> tuple[SynthSpec, ArrivalModel]:
    """A :class:`SynthSpec` with ``trace``'s fitted statistics, its gaps divided by ``rate_scale``."""
    model = fit_arrivals(trace.arrival_times())
    if model is None:
        raise ValueError("the trace has fewer than 10 positive inter-arrival gaps: too few to fit")
    if not rate_scale > 0:
        raise ValueError(f"rate_scale must be > 0, got {rate_scale}")
    best = model.best
    # The family and its shape (hence CV) come from the fit; the mean is the trace's own mean
    # gap, so the synthetic trace keeps the rate (a heavy tail the family cannot follow
    # would otherwise move the rate, which matters most for capacity).
    observed_mean = float(np.diff(trace.arrival_times()).mean())
    kind = {"exponential": "poisson", "gamma": "gamma", "lognormal": "lognormal", "weibull": "weibull"}[best.family]
    sizes = Counter(len(c.prompts) for c in trace.calls)
    tasks = trace.task_counts()
    n_prompts = sum(tasks.values())
    prompt_tokens, max_tokens = {}, {}
    for task in tasks:
        pt = [p.prompt_tokens for c in trace.calls for p in c.prompts if p.task == task and p.prompt_tokens is not None]
        mt = [p.max_tokens for c in trace.calls for p in c.prompts if p.task == task and p.max_tokens is not None]
        if (d := _token_dist(pt)) is not None:
            prompt_tokens[task] = d
        if (d := _token_dist(mt)) is not None:
            max_tokens[task] = d
    spec = SynthSpec(
        duration=duration, arrival=kind, mean=observed_mean / rate_scale, cv=best.cv,
        prompts_per_call={k: v / len(trace) for k, v in sorted(sizes.items())},
        task_mix={t: c / n_prompts for t, c in tasks.items()},
        prompt_tokens=prompt_tokens, max_tokens=max_tokens,
    )
    return spec, model
