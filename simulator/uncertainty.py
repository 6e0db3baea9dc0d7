"""Answers with their uncertainty: SLO verdicts as probabilities, figures as 90 % intervals.

A replay answers for one profile and one seed; the real system is neither. This module draws
N **worlds**, each one whole simulated run with its own seed *and* its own variant of the
profile, runs them all (through the sweep machinery: in parallel, each configuration once),
and reports per figure the distribution over the worlds, its 90 % interval, and per SLO the
probability that it is met.

What varies between worlds (:func:`sources_of` says which apply to a profile):

* **the run** — world ``i`` replays seed ``first_seed + i``: arrivals, lengths and service
  noise as the profile's own randomness draws them (a deterministic profile gives every seed
  the same run);
* **the calibration** — a profile ``simctl calibrate`` wrote (``meta.fit``) carries the fits
  its run could not tell apart (``ensemble``) and the relative standard error of each fitted
  value (``relative_se``, Gauss–Newton): a world takes one fit of the ensemble, uniformly,
  and scales each value by ``exp(N(0, se))``, ``se`` capped at
  :data:`simulator.calibrate.IDENTIFIED_SE` (a larger one says the run does not see the
  value, and the ensemble's spread already holds what it leaves open), within the value's
  calibration bounds;
* **the engine's host costs** — a composed profile's ``engine`` blocks (not fitted: without
  ``meta.fit``) have each host parameter drawn from a normal whose 5 % and 95 % quantiles are
  the engine's stated interval (:attr:`simulator.hardware.engines.EngineSpec.intervals`:
  bootstrap intervals of ``benchmarks/public_validation.py`` for the serving engines, the
  range of the assumption for ``hf-eager``), floored at 0, one draw per world shared by every
  task (one engine). A fitted profile's other host parameters are *not* drawn: the fit found
  its values given theirs, and moving one alone would undo the fit; free them in calibration
  and the ensemble carries their uncertainty;
* **the kernel costs** — a composed profile's (``meta.grounded``) kernel costs come from
  interpolating NVIDIA's per-op tables: a world scales them (every cost coefficient of the
  task's service but the engine block) by ``exp(N(0, σ))``, one factor per world for every
  task, σ = :data:`KERNEL_SIGMA`.

* **the model itself** (only when asked: ``model_error = σ``, ``--model-error``) — what no
  parameter of the profile holds: the model's own error on a configuration it was not fitted
  on. Each world's time figures (latencies, waits, service times, TTFT, TPOT) are multiplied
  by ``exp(σ z)``, one standard normal ``z`` a world (the same for every configuration, so
  configurations stay comparable). σ must come from out-of-sample evidence: on the users'
  server, ``benchmarks/uncertainty_coverage.py`` learns it leave one run out (0.26–0.34),
  and without it the stated intervals held a third of the observed figures (docs/uncertainty.md).

**P(SLO met)** from ``k`` of ``n`` worlds meeting it: the posterior mean of a Beta(k + 1,
n − k + 1) (a uniform prior on p), ``p = (k + 1) / (n + 2)`` — never 0 or 1 from finitely
many worlds — with its own sampling error, the posterior standard deviation
``sqrt(p (1 − p) / (n + 3))``. An SLO is *met at confidence c* when ``p ≥ c``.

**Intervals**: the 90 % interval of a figure is the pair of order statistics of its values
over the worlds at ranks ``floor(0.05 (n − 1))`` and ``ceil(0.95 (n − 1))`` (0-based): never
narrower than the empirical quantiles, and a figure that is infinite in some worlds (prompts
that never finish) gives an infinite bound rather than an interpolation of infinities. The
interval between the order statistics of ranks ``i < j`` holds one more world drawn the same
way with probability ``(j − i) / (n + 1)``: with 20 worlds (the smallest and the largest)
19/21 = 0.905.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from simulator.errors import PlanError, ProfileError
from simulator.plan import SLO, Evaluator
from simulator.profile import Profile, profile_from_dict
from simulator.settings import LARGEST_SEEDS
from simulator.sweep import Base, _local_results, config_key

#: the interval's level: 90 %, its bounds the 5th and 95th percentiles over the worlds
LEVEL = 0.9
#: worlds drawn when uncertainty is asked for and no count is given
DEFAULT_WORLDS = 20
#: the confidence ``simctl plan --worlds`` asks of every SLO when none is given
DEFAULT_CONFIDENCE = 0.9
#: σ of the log-normal factor on a composed profile's kernel costs. Source: the leave-one-out
#: interpolation error of the shipped per-op tables (``benchmarks/hardware_interpolation.py``,
#: docs/hardware.md): the largest median error over the tables, 3.8 % (A100 GEMMs), is the
#: median |error| of a log-normal of σ = 0.038 / 0.6745. One factor for every kernel of a
#: world (fully correlated) is the conservative reading: independent per-op errors would
#: mostly cancel over the thousands of kernels of a pass.
KERNEL_SIGMA = 0.038 / 0.6745
#: the largest number of worlds (each one whole replay per configuration)
LARGEST_WORLDS = LARGEST_SEEDS   # each world is one whole run, as a seed is
#: the largest model-error σ accepted (in log: a factor e^5 either way at one sd is no model)
LARGEST_MODEL_ERROR = 5.0
#: the parts of a flattened figure name that make it a time (scaled by the model error)
_TIME_PARTS = frozenset({"latency", "call_latency", "wait", "service", "ttft", "tpot"})


def is_time_figure(name: str) -> bool:
    """Whether the flattened summary figure ``name`` is a duration (``tasks.x.latency.p95``,
    ``overall.tokens.ttft_ms.p99``), which the model error scales; counts, rates and costs
    are not."""
    parts = name.split(".")
    return bool(_TIME_PARTS.intersection(parts[:-1])) or any(p.endswith("_ms") for p in parts[:-1])


def check_model_error(sigma: float) -> None:
    """:class:`PlanError` unless ``0 <= sigma <=`` :data:`LARGEST_MODEL_ERROR`."""
    if not (isinstance(sigma, (int, float)) and 0.0 <= sigma <= LARGEST_MODEL_ERROR):
        raise PlanError(None, None, "--model-error", f"must be a log-scale sd in [0, {LARGEST_MODEL_ERROR:g}], "
                        f"got {sigma!r}")


def stated_model_error(profile: Profile) -> float:
    """σ of the model error ``profile`` states in ``meta.model_error`` (``{"sigma": σ,
    "source": where it was measured}``: its error out of sample, measured on real runs), which
    ``--worlds`` applies unless ``--model-error`` says otherwise; 0 where it states none.
    :class:`ProfileError` naming the field for a stated σ that is not one."""
    stated = (profile.meta or {}).get("model_error")
    if stated is None:
        return 0.0
    sigma = stated.get("sigma") if isinstance(stated, dict) else None
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not 0.0 <= sigma <= LARGEST_MODEL_ERROR:
        raise ProfileError(profile.path or profile.name, None, "meta.model_error.sigma",
                           f"must be a log-scale sd in [0, {LARGEST_MODEL_ERROR:g}], got {sigma!r}")
    return float(sigma)


def _model_error(profile: Profile, sigma: float | None) -> float:
    """``sigma`` checked, or (``None``) the σ ``profile`` states."""
    if sigma is None:
        return stated_model_error(profile)
    check_model_error(sigma)
    return sigma


def model_error_factors(worlds: int, sigma: float, seed: int = 0) -> np.ndarray:
    """Each world's model-error factor ``exp(σ z)`` (its own stream of ``seed``: the profile's
    draws do not move with σ)."""
    rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(4)[3])
    return np.exp(sigma * rng.standard_normal(worlds))


# -- probabilities and intervals ----------------------------------------------------------


@dataclass(frozen=True)
class Probability:
    """P(met) from ``met`` of ``worlds`` worlds: Beta posterior mean ``p`` and sd ``se``."""

    p: float
    se: float
    met: int
    worlds: int

    def to_dict(self) -> dict[str, Any]:
        return {"p": self.p, "p_se": self.se, "worlds_met": self.met, "worlds": self.worlds}


def probability_met(met: Sequence[bool]) -> Probability:
    """P(met) from each world's outcome: ``(k + 1) / (n + 2)`` with standard error
    ``sqrt(p (1 − p) / (n + 3))`` (the module docstring says why)."""
    n = len(met)
    if n == 0:
        raise ValueError("probability_met needs at least one world")
    k = int(sum(bool(m) for m in met))
    p = (k + 1) / (n + 2)
    return Probability(p, math.sqrt(p * (1 - p) / (n + 3)), k, n)


def interval(values: Sequence[float] | np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """The ``level`` interval of ``values`` over worlds: the order statistics at ranks
    ``floor(a (n − 1))`` and ``ceil((1 − a) (n − 1))``, ``a = (1 − level) / 2`` (NaN counts as
    +inf: a figure with no value is not met)."""
    x = np.sort(np.where(np.isnan(np.asarray(values, float)), np.inf, np.asarray(values, float)))
    if x.size == 0:
        raise ValueError("interval needs at least one value")
    a = (1.0 - level) / 2.0
    # (a tiny slack keeps 0.05 * 20 from landing on 1.0000000000000002 and losing a rank)
    lo = int(math.floor(a * (x.size - 1) + 1e-9))
    hi = int(math.ceil((1.0 - a) * (x.size - 1) - 1e-9))
    return float(x[lo]), float(x[hi])


# -- profile variants ---------------------------------------------------------------------


@dataclass(frozen=True)
class Sources:
    """What varies between the worlds of a profile (see the module docstring)."""

    fit: tuple[str, ...] = ()                 # fitted values drawn from the calibration
    engine: tuple[str, ...] = ()              # engine host parameters drawn in their intervals
    kernels: bool = False                     # kernel costs scaled by the interpolation error
    model_error: float = 0.0                  # σ of the model-error factor on time figures

    def describe(self) -> str:
        parts = ["seeds"]
        if self.fit:
            parts.append("calibration fits (" + ", ".join(self.fit) + ")")
        if self.engine:
            parts.append("engine host costs (" + ", ".join(self.engine) + ")")
        if self.kernels:
            parts.append(f"kernel costs (σ {KERNEL_SIGMA:.3f} in log)")
        if self.model_error:
            parts.append(f"model error (σ {self.model_error:g} in log)")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"seeds": True, "fit": list(self.fit), "engine": list(self.engine),
                "kernels": KERNEL_SIGMA if self.kernels else None, "model_error": self.model_error or None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sources:
        """The sources a result's ``sources`` block (:meth:`to_dict`) names."""
        return cls(tuple(data.get("fit") or ()), tuple(data.get("engine") or ()), bool(data.get("kernels")),
                   float(data.get("model_error") or 0.0))


def _fit_of(data: Mapping[str, Any]) -> tuple[list[Any], list[dict[str, float]], dict[str, float]] | None:
    """The free parameters, the ensemble of fits and their relative errors of a calibrated
    profile; ``None`` for one without a usable ``meta.fit``."""
    from simulator.calibrate import free_parameters
    from simulator.errors import ProfileError

    meta = data.get("meta") or {}
    fit = meta.get("fit")
    if not isinstance(fit, dict) or not isinstance(fit.get("values"), dict) or "calibrate" not in meta:
        return None
    try:
        params = free_parameters(dict(data), str(data.get("name", "<profile>")))
    except ProfileError:
        return None
    names = [p.name for p in params]
    ensemble = [e for e in fit.get("ensemble") or [] if isinstance(e, dict) and all(n in e for n in names)]
    if not ensemble:
        if not all(n in fit["values"] for n in names):
            return None
        ensemble = [fit["values"]]
    # (a value the run does not see has an infinite error, which JSON may hold as null)
    se = {n: float(v) if isinstance(v, (int, float)) else math.inf
          for n, v in (fit.get("relative_se") or {}).items() if n in names}
    return params, ensemble, se


def _engine_draws(data: Mapping[str, Any]) -> dict[tuple[str, str], tuple[float, float]]:
    """(engine, parameter) -> the 5-95 % interval to draw it in, for every engine block of
    the profile's tasks whose parameter was not calibrated."""
    from simulator.errors import HardwareError
    from simulator.hardware.engines import get_engine

    out: dict[tuple[str, str], tuple[float, float]] = {}
    for spec in (data.get("tasks") or {}).values():
        block = (spec.get("service") or {}).get("engine") if isinstance(spec, dict) else None
        if not isinstance(block, dict):
            continue
        try:
            engine = get_engine(str(block.get("name")))
        except HardwareError:
            continue
        provenance = block.get("provenance") or {}
        for name, (lo, hi) in engine.intervals.items():
            if hi > lo and name in block and not str(provenance.get(name, "")).startswith("calibrated"):
                out[(engine.name, name)] = (lo, hi)
    return out


def _kernel_costs(service: dict[str, Any]) -> list[tuple[Any, Any]]:
    """(container, key) of every kernel-cost coefficient of a composed task's service: the
    ``iteration`` kind's ``step`` terms and each ``spec_decode`` cost form's ``coef``."""
    out: list[tuple[Any, Any]] = []
    step = service.get("step")
    if isinstance(step, dict):
        out += [(step, k) for k, v in step.items() if isinstance(v, (int, float))]
    for form in (service.get("costs") or {}).values():
        coef = form.get("coef") if isinstance(form, dict) else None
        if isinstance(coef, list):
            out += [(coef, i) for i, v in enumerate(coef) if isinstance(v, (int, float))]
    return out


def sources_of(profile: Profile) -> Sources:
    """What :func:`profile_worlds` varies for ``profile`` (besides the seed)."""
    data = profile.to_dict()
    fit = _fit_of(data)
    engine = () if fit is not None else tuple(sorted(dict.fromkeys(n for _, n in _engine_draws(data))))
    kernels = "grounded" in (data.get("meta") or {}) and any(
        _kernel_costs(spec.get("service") or {}) for spec in data["tasks"].values())
    return Sources(tuple(p.name for p in fit[0]) if fit is not None else (), engine, kernels)


def profile_worlds(profile: Profile, worlds: int, seed: int = 0) -> list[Profile]:
    """``worlds`` variants of ``profile``, one a world (see the module docstring); all equal
    to ``profile`` when :func:`sources_of` finds nothing to vary. Same ``seed``, same variants."""
    from simulator.calibrate import IDENTIFIED_SE, _with_values

    check_worlds(worlds)
    sources = sources_of(profile)
    if not (sources.fit or sources.engine or sources.kernels):
        return [profile] * worlds
    data = profile.to_dict()
    fit = _fit_of(data)
    engine = _engine_draws(data) if fit is None else {}
    fit_rng, engine_rng, kernel_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    out = []
    for _ in range(worlds):
        world = copy.deepcopy(data)
        if fit is not None:
            params, ensemble, se = fit
            chosen = ensemble[int(fit_rng.integers(len(ensemble)))]
            values = []
            for p in params:
                sd = min(se.get(p.name, 0.0), IDENTIFIED_SE)
                sd = sd if math.isfinite(sd) else IDENTIFIED_SE
                values.append(min(p.high, max(p.low, float(chosen[p.name]) * math.exp(sd * fit_rng.standard_normal()))))
            world = _with_values(world, params, np.array(values))
        if engine:
            z = 1.6448536269514722  # the 95 % quantile of the standard normal
            drawn = {key: max(0.0, (lo + hi) / 2 + (hi - lo) / (2 * z) * float(engine_rng.standard_normal()))
                     for key, (lo, hi) in engine.items()}
            for spec in world["tasks"].values():
                block = spec.get("service", {}).get("engine")
                if isinstance(block, dict):
                    for (name, param), value in drawn.items():
                        if block.get("name") == name and param in block:
                            block[param] = min(value, 1.0) if param == "interpreter_share" else value
        if sources.kernels:
            factor = math.exp(KERNEL_SIGMA * float(kernel_rng.standard_normal()))
            for spec in world["tasks"].values():
                for container, key in _kernel_costs(spec.get("service") or {}):
                    container[key] = float(container[key]) * factor
        out.append(profile_from_dict(world, profile.path))
    return out


# -- verdicts over worlds -----------------------------------------------------------------


@dataclass(frozen=True)
class FigureSpread:
    """One figure over the worlds: its values, mean, median and :data:`LEVEL` interval."""

    values: tuple[float, ...]

    @property
    def low(self) -> float:
        return interval(self.values)[0]

    @property
    def high(self) -> float:
        return interval(self.values)[1]

    @property
    def median(self) -> float:
        x = np.sort(np.where(np.isnan(np.asarray(self.values, float)), np.inf, self.values))
        return float(x[(x.size - 1) // 2]) if x.size % 2 else float(0.5 * (x[x.size // 2 - 1] + x[x.size // 2]))

    def to_dict(self) -> dict[str, Any]:
        return {"median": self.median, "interval": [self.low, self.high], "level": LEVEL}


@dataclass(frozen=True)
class Verdict:
    """One SLO over the worlds: the figure's spread and P(met)."""

    slo: SLO
    spread: FigureSpread
    probability: Probability

    def met_at(self, confidence: float) -> bool:
        return self.probability.p >= confidence

    def to_dict(self) -> dict[str, Any]:
        return {"slo": self.slo.text, "figure": self.slo.figure, **self.probability.to_dict(),
                **self.spread.to_dict()}


def verdicts(slos: Sequence[SLO], outcomes: Sequence[Mapping[str, float | None]]) -> list[Verdict]:
    """Each SLO's verdict from the figures of each world (one mapping a world)."""
    out = []
    for s in slos:
        values = [math.nan if o.get(s.figure) is None else float(o[s.figure]) for o in outcomes]  # type: ignore[arg-type]
        out.append(Verdict(s, FigureSpread(tuple(values)), probability_met([s.met(v) for v in values])))
    return out


def joint_probability(slos: Sequence[SLO], outcomes: Sequence[Mapping[str, float | None]]) -> Probability:
    """P(every SLO met in the same world)."""
    return probability_met([all(s.met(o.get(s.figure)) for s in slos) for o in outcomes])


def check_confidence(confidence: float) -> None:
    """:class:`PlanError` unless ``0 < confidence < 1``."""
    if not (isinstance(confidence, (int, float)) and 0.0 < confidence < 1.0):
        raise PlanError(None, None, "--confidence", f"must be a probability strictly between 0 and 1, got {confidence!r}")


def check_worlds(worlds: int) -> None:
    """:class:`PlanError` unless ``1 <= worlds <=`` :data:`LARGEST_WORLDS`."""
    if isinstance(worlds, bool) or not isinstance(worlds, int) or not 1 <= worlds <= LARGEST_WORLDS:
        raise PlanError(None, None, "--worlds", f"must be an integer in [1, {LARGEST_WORLDS:,}], got {worlds!r}")


@dataclass
class WorldsEvaluator(Evaluator):
    """An :class:`~simulator.plan.Evaluator` over worlds: each configuration is replayed once
    a world (its own seed and profile variant, :func:`profile_worlds`); its figures are their
    mean over the worlds, and it *passes* when every SLO of ``slos`` is met with
    ``p >= confidence``. ``outcomes`` keeps each configuration's per-world figures."""

    slos: tuple[SLO, ...] = ()
    confidence: float = DEFAULT_CONFIDENCE
    outcomes: dict[str, list[dict[str, float | None]]] = field(default_factory=dict)
    #: each world's model-error factor on time figures (ones: no model error)
    factors: tuple[float, ...] = ()
    model_error: float = 0.0

    @classmethod
    def build(cls, base: Base, slos: Sequence[SLO], worlds: int = DEFAULT_WORLDS, *, seed: int = 0,
              confidence: float = DEFAULT_CONFIDENCE, task: str | None = None,
              workers: int | None = None, model_error: float | None = None) -> WorldsEvaluator:
        """Draw ``worlds`` variants of ``base``'s profile (seeds ``seed .. seed + worlds − 1``),
        and with ``model_error`` (``None``: what the profile states, :func:`stated_model_error`)
        each world's factor on time figures."""
        check_confidence(confidence)
        check_worlds(worlds)
        model_error = _model_error(base.profile, model_error)
        variants = tuple(profile_worlds(base.profile, worlds, seed))
        return cls(replace(base, worlds=variants), tuple(range(seed, seed + worlds)), task, workers,
                   slos=tuple(slos), confidence=confidence,
                   factors=tuple(float(f) for f in model_error_factors(worlds, model_error, seed)),
                   model_error=model_error)

    def evaluate(self, configs: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
        todo = {config_key(c): dict(c) for c in configs if config_key(c) not in self.cache}
        jobs = [(k, {**c, "world": i}, s) for k, c in todo.items() for i, s in enumerate(self.seeds)]
        rows: dict[str, list[dict[str, Any]]] = {k: [] for k in todo}
        for batch, _ in _local_results(jobs, self.task, self.base, self.workers, lines=False):
            for row in batch:
                rows[row["config_key"]].append(row)
        self.replays += len(jobs)
        for k, found in rows.items():
            found.sort(key=lambda r: r["world"])
            keys = [n for n, v in found[0].items() if isinstance(v, (int, float)) and n not in ("seed", "world")]
            per_world = [{n: (float(r[n]) * (f if is_time_figure(n) else 1.0) if r.get(n) is not None else None)
                          for n in keys} for r, f in zip(found, self.factors or [1.0] * len(found), strict=True)]
            self.outcomes[k] = per_world
            self.cache[k] = {n: sum(math.nan if w[n] is None else w[n] for w in per_world) / len(per_world)  # type: ignore[misc]
                             for n in keys}
        return [self.cache[config_key(c)] for c in configs]

    def verdicts(self, config: Mapping[str, Any], slos: Sequence[SLO] | None = None) -> list[Verdict]:
        """Each SLO's verdict for ``config`` (replayed if it was not)."""
        self.evaluate([config])
        return verdicts(slos if slos is not None else self.slos, self.outcomes[config_key(config)])

    def passes(self, config: Mapping[str, Any], figures: Mapping[str, float], slos: Sequence[SLO]) -> bool:
        """Every SLO met with ``p >= confidence`` over ``config``'s worlds."""
        return all(v.met_at(self.confidence) for v in self.verdicts(config, slos))

    def uncertainty(self, config: Mapping[str, Any], slos: Sequence[SLO]) -> dict[str, Any] | None:
        """The uncertainty block of a plan's result for ``config``: the worlds, the confidence
        asked, the sources drawn, P(every SLO met) and each SLO's verdict."""
        found = self.verdicts(config, slos)
        return {"worlds": len(self.seeds), "confidence": self.confidence,
                "sources": {**sources_of(self.base.profile).to_dict(), "model_error": self.model_error or None},
                "all_met": joint_probability(slos, self.outcomes[config_key(config)]).to_dict(),
                "verdicts": [v.to_dict() for v in found]}


@dataclass
class Assessment:
    """:func:`assess`'s answer for one configuration."""

    config: dict[str, Any]
    verdicts: list[Verdict]
    joint: Probability
    sources: Sources
    seeds: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config, "slos": [v.to_dict() for v in self.verdicts], "all_met": self.joint.to_dict(),
                "sources": self.sources.to_dict(), "seeds": list(self.seeds)}


def assess(base: Base, slos: Sequence[SLO], config: Mapping[str, Any] | None = None, *,
           worlds: int = DEFAULT_WORLDS, seed: int = 0, task: str | None = None,
           workers: int | None = None, model_error: float | None = None) -> Assessment:
    """P(met) and the 90 % interval of every SLO's figure for one configuration of ``base``
    (``config``: sweep axes, as a sweep row's; ``None``: the base scenario as it is)."""
    model_error = _model_error(base.profile, model_error)
    ev = WorldsEvaluator.build(base, slos, worlds, seed=seed, task=task, workers=workers, model_error=model_error)
    config = dict(config or {})
    found = ev.verdicts(config)
    return Assessment(config, found, joint_probability(slos, ev.outcomes[config_key(config)]),
                      replace(sources_of(base.profile), model_error=model_error), ev.seeds)


# -- predictions over worlds --------------------------------------------------------------


def predict_worlds(trace: Any, scenario: Any, profile: Profile, worlds: int = DEFAULT_WORLDS, *, seed: int = 0,
                   observed: Any = None, progress: Callable[[int], None] | None = None,
                   model_error: float | None = None) -> pd.DataFrame:
    """Call latency per composition class over ``worlds`` worlds: one row per group with
    ``calls``, ``unfinished`` (mean), and for p50, p90, p99 and mean the mean over the worlds
    (``p50``), its :data:`LEVEL` interval (``p50_low``, ``p50_high``) and the spread's sd
    (``p50_sd``). With an ``observed`` run, ``p50_ref`` (observed) and ``p50_inside``
    (whether the interval holds it) too. ``attrs``: ``worlds``, ``seeds``, ``sources``,
    ``level`` and ``values`` (stat -> array of worlds × groups, in the rows' order).
    ``model_error``: σ of each world's factor on the latencies (the module docstring;
    ``None``: what the profile states, :func:`stated_model_error`)."""
    from simulator.calibrate import FIGURES, predict, simulate_figures

    model_error = _model_error(profile, model_error)
    variants = profile_worlds(profile, worlds, seed)
    factors = model_error_factors(worlds, model_error, seed)
    seeds = tuple(range(seed, seed + worlds))
    tables = []
    for i, (variant, s) in enumerate(zip(variants, seeds, strict=True), 1):
        if observed is None:
            t = simulate_figures(trace, scenario, variant, (s,)).set_index("group")
        else:
            t = predict(observed, trace, scenario, variant, (s,)).set_index("group")
            t = t.rename(columns={f"{f}_other": f for f in FIGURES})
        tables.append(t)
        if progress:
            progress(i)
    first = tables[0]
    out = pd.DataFrame({"calls": first["calls"].astype(int)}, index=first.index)
    per_world: dict[str, np.ndarray] = {}
    if "unfinished" in first:
        out["unfinished"] = np.mean([t["unfinished"].reindex(out.index).to_numpy(float) for t in tables], axis=0)
    for stat in FIGURES:
        values = np.array([t[stat].reindex(out.index).to_numpy(float) for t in tables])
        values = np.where(np.isnan(values), np.inf, values) * factors[:, None]
        per_world[stat] = values
        out[stat] = values.mean(axis=0)
        with np.errstate(invalid="ignore"):
            out[f"{stat}_sd"] = values.std(axis=0, ddof=1) if len(tables) > 1 else 0.0
        bounds = [interval(values[:, j]) for j in range(values.shape[1])]
        out[f"{stat}_low"] = [b[0] for b in bounds]
        out[f"{stat}_high"] = [b[1] for b in bounds]
        if observed is not None:
            ref = first[f"{stat}_ref"].reindex(out.index).to_numpy(float)
            out[f"{stat}_ref"] = ref
            out[f"{stat}_inside"] = (out[f"{stat}_low"] <= ref) & (ref <= out[f"{stat}_high"])
    out = out.reset_index()
    out.attrs.update(worlds=worlds, seeds=seeds, sources=replace(sources_of(profile), model_error=model_error),
                     level=LEVEL, values=per_world)
    return out


__all__ = ["DEFAULT_CONFIDENCE", "DEFAULT_WORLDS", "KERNEL_SIGMA", "LEVEL", "Assessment", "FigureSpread",
           "Probability", "Sources", "Verdict", "WorldsEvaluator", "assess", "check_confidence", "check_model_error", "check_worlds", "is_time_figure", "model_error_factors", "interval",
           "joint_probability", "predict_worlds", "probability_met", "profile_worlds", "sources_of", "stated_model_error",
           "verdicts"]
