"""Calibration: fit a profile's free parameters so that simulated call latencies match an
observed run's.

The free parameters are listed in the starting profile's ``meta.calibrate``::

    {"name": "infobench.pass_base", "task": "infobench", "path": "service.costs.verify.coef.0",
     "min": 1e-4, "max": 5.0, "ties": [{"path": "service.costs.draft_step.coef.0", "factor": 0.3}]}

(``path`` is a dotted path into the task's profile; ``ties`` move other values with it, in
the same task or, with ``"task"``, another one).
The fit works on log-parameters with ``scipy.optimize.least_squares`` (soft-L1 loss, robust
to a few badly modelled calls). The objective (``both`` by default) joins the per-call
residuals ``log(sim) − log(obs)``, where ``sim`` is the call's latency averaged over the seeds
(the same seeds at every step: common random numbers; one seed when the model has no
randomness), and the residuals of the log quantiles of call latency (p10..p95, overall and
per composition class; each seed's quantiles, averaged), which make the fitted distribution,
not only each call's centre, match. Both sides are floored at 0.05 s. Simulated latencies
are not censored in the per-call terms (the model serves every call, so the residuals keep
their slope however slow a candidate is); an observed call that failed at the client timeout
counts only if the simulated one is shorter than the timeout. Several observed runs (``also``)
can be fitted at once. The surface is rough (a batch forms or not as a cost crosses a
threshold) and has several basins, so quasi-random points are screened first and local fits
run from the best few; every local fit whose cost a likelihood-ratio test at 95 % cannot tell
from the best one's is kept (``ensemble``), and :func:`predict_ensemble` gives a prediction's
range over them. Standard errors come from the Gauss–Newton covariance ``s² (JᵀJ)⁻¹`` at the
best fit, in log space (so they are relative).

What the call latencies can and cannot identify: they see batch *times*, not their parts.
A per-iteration cost and the number of iterations trade off against each other — for
speculative decoding the acceptance rate (fewer rounds) against the cost of a round — so
such pairs are identified only through how the batch time varies with batch size and
lookahead, weakly; their standard errors (and the correlation the covariance reports) say
how weakly. Per-batch and per-row costs are told apart by calls that met batches of
different sizes.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from simulator.errors import ObservedError, ProfileError
from simulator.interrupts import sigint_deferred
from simulator.metrics import (
    TOKEN_TIMINGS,
    TOKEN_UNIT,
    TokenOptions,
    client_calls,
    prompt_requests,
    token_figures,
)
from simulator.model import simulate
from simulator.observed import ObservedRun, compare_calls
from simulator.profile import Profile, profile_from_dict
from simulator.scenario import Scenario, check_tasks
from simulator.trace.model import Trace

#: The fewest calls a quantile (of the run, or of one call composition) is fitted from.
MIN_CALLS = 10
FLOOR = 0.05  # seconds: latencies below this are compared as this (graph calls are ~0.1 s)
#: quantiles of call latency the ``quantiles`` objective matches, overall and per composition class
QUANTILES = (10, 25, 50, 75, 90, 95)
#: a quantile residual stands for this many per-call residuals in the ``both`` objective
QUANTILE_WEIGHT = 3.0
OBJECTIVES = ("calls", "quantiles", "both")
F_SCALE = 0.3  # soft-L1 scale: residuals beyond ~30 % in log latency count less than squared
#: quasi-random points screened before the local fits (``simctl calibrate --screen``)
SCREEN = 64
#: local fits, from the best screened points (``simctl calibrate --starts``). A point's
#: screened cost ranks basins poorly: on the users' runs the best fit came from the 5th
#: (``4B_fw_5_b10``) and the 6th (``4B_4queues_nothinking``) best screened point, so the best
#: 4 missed it (cost +1.8 % and +1.7 %, other values); 8 find both, at twice the fits' time.
STARTS = 8


@dataclass(frozen=True)
class FreeParameter:
    name: str
    task: str
    path: str
    low: float
    high: float
    ties: tuple[tuple[str, str, float], ...] = ()  # (task, path, factor)


@dataclass(frozen=True)
class CalibrationResult:
    profile: dict[str, Any]           # the fitted profile, as JSON data
    values: dict[str, float]
    relative_se: dict[str, float]     # standard error of log(value): relative uncertainty
    correlation: np.ndarray
    errors: pd.DataFrame              # predict(observed, ..., fitted profile): figures per class
    cost: float
    evaluations: int
    #: every local fit whose cost the calls cannot tell from the best one's (the best first):
    #: what the run leaves undetermined shows as the spread of their values and predictions
    ensemble: list[dict[str, Any]] = field(default_factory=list)
    ensemble_values: list[dict[str, float]] = field(default_factory=list)
    seeds: tuple[int, ...] = ()


def free_parameters(data: dict[str, Any], where: str) -> list[FreeParameter]:
    raw = (data.get("meta") or {}).get("calibrate")
    if not isinstance(raw, list) or not raw:
        raise ProfileError(where, None, "meta.calibrate", "the starting profile lists no free parameters")
    out = []
    for i, p in enumerate(raw):
        try:
            task = str(p["task"])
            out.append(FreeParameter(str(p["name"]), task, str(p["path"]), float(p["min"]), float(p["max"]),
                                     tuple((str(t.get("task", task)), str(t["path"]), float(t["factor"]))
                                           for t in p.get("ties", ()))))
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ProfileError(where, f"meta.calibrate[{i}]", None,
                               "needs name, task, path, min, max (and optional ties of path, factor, task)") from None
        _get(data, out[-1].task, out[-1].path, where)
        for task, path, _ in out[-1].ties:
            _get(data, task, path, where)
    return out


def _walk(data: dict, task: str, path: str, where: str):
    node: Any = data["tasks"].get(task)
    if node is None:
        raise ProfileError(where, f"task '{task}'", path, "no such task in the profile")
    parts = path.split(".")
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node.get(part) if isinstance(node, dict) else None
        if node is None:
            raise ProfileError(where, f"task '{task}'", path, "no such field in the profile")
    return node, parts[-1]


def _get(data: dict, task: str, path: str, where: str) -> float:
    node, last = _walk(data, task, path, where)
    try:
        value = node[int(last)] if isinstance(node, list) else node[last]
    except (KeyError, IndexError, ValueError):
        raise ProfileError(where, f"task '{task}'", path, "no such field in the profile") from None
    return float(value)


def _set(data: dict, task: str, path: str, value: float) -> None:
    node, last = _walk(data, task, path, "")
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def _with_values(data: dict, params: list[FreeParameter], values: np.ndarray) -> dict:
    out = copy.deepcopy(data)
    for p, v in zip(params, values, strict=True):
        _set(out, p.task, p.path, float(v))
        for task, path, factor in p.ties:
            _set(out, task, path, float(v) * factor)
    return out


def _soft_l1_cost(r: np.ndarray) -> float:
    """``least_squares``' objective for ``loss="soft_l1"``: 0.5 f² Σ 2(√(1 + (r/f)²) − 1)."""
    z = (r / F_SCALE) ** 2
    return float(0.5 * F_SCALE ** 2 * np.sum(2.0 * (np.sqrt(1.0 + z) - 1.0)))


def _screened_points(residuals: Callable[[np.ndarray], np.ndarray], x0: np.ndarray, low: np.ndarray,
                     high: np.ndarray, points: int) -> list[tuple[float, np.ndarray]]:
    """``x0`` and ``points`` scrambled-Sobol points in the box of a factor 10 either way of
    ``x0`` (within the bounds), each with the fit's own cost, best first.

    Why: a parameter whose effect is small at the start (a per-row cost next to a large
    per-batch one) has a flat gradient there, and a local fit leaves it where it began;
    the cost surface of a simulation is also rough at the scale of a finite difference,
    with several basins. Local fits from the best screened points find them."""
    from scipy.stats import qmc

    lo = np.maximum(low, x0 - math.log(10.0))
    hi = np.minimum(high, x0 + math.log(10.0))
    out = [(_soft_l1_cost(residuals(x0)), x0)]
    if points > 0:
        # scipy reads Sobol's direction numbers (an .npz) inside a Cython noexcept function
        # that prints the traceback of a Ctrl-C landing there before it can be carried on:
        # hold it until the sampler is built, then raise it here
        with sigint_deferred():
            sampler = qmc.Sobol(len(x0), scramble=True, seed=0)
        sample = sampler.random_base2(max(0, math.ceil(math.log2(points))))
        out += [(_soft_l1_cost(residuals(x)), x) for x in (lo + u * (hi - lo) for u in sample)]
    return sorted(out, key=lambda item: item[0])


def _local_fits(residuals: Callable[[np.ndarray], np.ndarray], x0: np.ndarray, low: np.ndarray,
                high: np.ndarray, screen: int, starts: int, max_evaluations: int) -> list[Any]:
    """The search: ``least_squares`` fits (soft-L1 loss, within ``[low, high]``, at most
    ``max_evaluations`` evaluations each) from the best ``starts`` (at least 1) of ``x0`` and
    ``screen`` screened points (:func:`_screened_points`), best (lowest cost) first."""
    from scipy.optimize import least_squares

    candidates = _screened_points(residuals, x0, low, high, screen)[:max(1, starts)]
    fits = [least_squares(residuals, x, bounds=(low, high), loss="soft_l1", f_scale=F_SCALE,
                          diff_step=0.1, max_nfev=max_evaluations, x_scale=1.0) for _, x in candidates]
    return sorted(fits, key=lambda f: f.cost)


def _covariance(fit, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Relative standard errors and correlation from the Gauss–Newton covariance
    ``s² (JᵀJ)⁻¹`` (a parameter the calls do not see gets an infinite error)."""
    n = len(fit.fun)
    J = fit.jac
    s2 = float(np.sum(fit.fun ** 2) / max(n - k, 1))
    seen = np.abs(J).sum(axis=0) > 0
    se = np.full(k, math.inf)
    corr = np.full((k, k), np.nan)
    if seen.any():
        cov = np.linalg.pinv(J[:, seen].T @ J[:, seen]) * s2
        se_seen = np.sqrt(np.clip(np.diag(cov), 0, None))
        se[seen] = se_seen
        idx = np.flatnonzero(seen)
        with np.errstate(invalid="ignore", divide="ignore"):
            corr[np.ix_(idx, idx)] = cov / np.outer(se_seen, se_seen)
    return se, corr


class _Target:
    """One observed run the fit must reproduce: its calls' log latencies and quantiles."""

    def __init__(self, observed: ObservedRun, trace: Trace, scenario: Scenario) -> None:
        self.observed, self.trace, self.scenario = observed, trace, scenario
        self.timeout = scenario.client_timeout or math.inf
        obs = observed.calls.set_index("call_id")
        call_ids = [c.id for c in trace.calls]
        missing = set(call_ids) - set(obs.index)
        if missing:
            raise ObservedError(observed.path, None, None,
                                f"the observed run {observed.name} lacks calls of the trace (e.g. {min(missing)})")
        if len(call_ids) < MIN_CALLS:  # its quantiles would rest on nothing
            raise ObservedError(observed.path, None, None, f"a fit needs at least {MIN_CALLS} calls; the run has "
                                f"{len(call_ids)}")
        latency = np.maximum(obs["latency_censored_s"].reindex(call_ids).to_numpy(float), FLOOR)
        self.y = np.log(latency)
        self.failed = ~obs["ok"].reindex(call_ids).to_numpy(bool)
        classes = scenario.compositions.classify
        composition = obs["tasks"].reindex(call_ids).str.split("+").map(lambda t: classes(frozenset(t)))
        groups = [np.ones(len(call_ids), bool)] + [
            (composition == c).to_numpy(bool) for c in scenario.compositions.labels if c != "other"]
        self.groups = [g for g in groups if g.sum() >= MIN_CALLS]
        self.y_quantiles = self._quantiles(latency)

    def _quantiles(self, latency: np.ndarray) -> np.ndarray:
        return np.log(np.concatenate([np.percentile(np.minimum(latency[g], self.timeout), QUANTILES)
                                      for g in self.groups]))

    def simulate(self, profile: Profile, seeds: tuple[int, ...]) -> list[np.ndarray]:
        return [np.maximum(client_calls(simulate(self.trace, self.scenario, profile, seed), None)
                           ["latency_censored_s"].to_numpy(float), FLOOR) for seed in seeds]

    def residuals(self, runs: list[np.ndarray], objective: str) -> list[np.ndarray]:
        parts = []
        if objective in ("calls", "both"):
            r = np.mean(np.log(runs), axis=0) - self.y
            # A call the client gave up on took at least the timeout: only a shorter simulated
            # latency is an error.
            r[self.failed] = np.minimum(r[self.failed], 0.0)
            parts.append(r)
        if objective in ("quantiles", "both"):
            # Each seed is one possible run: its quantiles (censored like the client's) are
            # averaged in log, not taken of the per-call means, whose spread is narrower
            # than a run's.
            sim_q = np.mean([self._quantiles(run) for run in runs], axis=0)
            parts.append(QUANTILE_WEIGHT * (sim_q - self.y_quantiles))
        return parts


def calibrate(observed: ObservedRun, trace: Trace, scenario: Scenario, start: dict[str, Any],
              seeds: tuple[int, ...] = (0, 1, 2), max_evaluations: int = 120,
              progress: Callable[[int, float], None] | None = None, where: str = "<profile>",
              objective: str = "both", screen: int = SCREEN, starts: int = STARTS,
              also: Sequence[tuple[ObservedRun, Trace, Scenario]] = ()) -> CalibrationResult:
    """Fit ``start``'s free parameters to ``observed`` (a run of ``trace`` under ``scenario``)
    and, jointly, to the runs in ``also`` (other configurations of the same hardware: what
    one run leaves undetermined, such as how a cost grows with length, another may pin).

    ``objective``: ``calls`` (per-call log residuals), ``quantiles`` (log residuals of the
    10th..95th percentiles of call latency, overall and per composition class) or ``both``.
    ``screen`` quasi-random points are tried first and local fits run from the best
    ``starts`` of them (see :func:`_screened_points` and :data:`STARTS`)."""
    from scipy.stats import chi2

    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, not {objective!r}")
    params = free_parameters(start, where)
    start_tasks = start.get("tasks")
    if isinstance(start_tasks, dict):
        for run_trace, run_scenario in [(trace, scenario), *((t, s) for _, t, s in also)]:
            check_tasks(run_scenario, start_tasks, run_trace.tasks, f"the profile {where}")
    targets = [_Target(observed, trace, scenario)] + [_Target(*run) for run in also]
    low = np.log([p.low for p in params])
    high = np.log([p.high for p in params])
    x0 = np.clip(np.log([_get(start, p.task, p.path, where) for p in params]), low + 1e-9, high - 1e-9)
    count = [0]

    def residuals(x: np.ndarray) -> np.ndarray:
        count[0] += 1
        profile = profile_from_dict(_with_values(start, params, np.exp(x)), where)
        parts = []
        for target in targets:
            parts += target.residuals(target.simulate(profile, seeds), objective)
        r = np.concatenate(parts)
        if progress:
            progress(count[0], float(np.mean(np.abs(r))))
        return r

    # A model without randomness gives every seed the same run: one seed is enough.
    if len(seeds) > 1:
        probe = profile_from_dict(_with_values(start, params, np.exp(x0)), where)
        pairs = (t.simulate(probe, seeds[:2]) for t in targets)  # lazily: all() stops at the first that differs
        if all(np.array_equal(a, b) for a, b in pairs):
            seeds = seeds[:1]
    fits = _local_fits(residuals, x0, low, high, screen, starts, max_evaluations)
    fit = fits[0]
    k = len(params)
    se, corr = _covariance(fit, k)
    # Fits the calls cannot tell apart: a likelihood-ratio test at 95 % on the cost, in units
    # of the residual variance (approximate under the robust loss).
    s2 = float(np.sum(fit.fun ** 2) / max(len(fit.fun) - k, 1))
    limit = 0.5 * s2 * chi2.ppf(0.95, k)
    ensemble = [_with_values(start, params, np.exp(f.x)) for f in fits if f.cost - fit.cost <= limit]
    fitted = ensemble[0]
    profile = profile_from_dict(fitted, where)
    return CalibrationResult(
        profile=fitted, values={p.name: float(v) for p, v in zip(params, np.exp(fit.x), strict=True)},
        relative_se={p.name: float(s) for p, s in zip(params, se, strict=True)}, correlation=corr,
        errors=predict(observed, trace, scenario, profile), cost=float(fit.cost), evaluations=count[0],
        ensemble=ensemble, ensemble_values=[{p.name: float(v) for p, v in zip(params, np.exp(f.x), strict=True)}
                                            for f in fits if f.cost - fit.cost <= limit],
        seeds=tuple(seeds))


#: the figures of call latency a prediction gives, per composition class and overall
FIGURES = ("p50", "p90", "p99", "mean")


def simulated_runs(trace: Trace, scenario: Scenario, profile: Profile, seeds: Sequence[int],
                   progress: Callable[[int], None] | None = None,
                   logs: list[pd.DataFrame] | None = None) -> list[pd.DataFrame]:
    """One per-call table per seed, each a whole simulated run of ``trace`` in an observed
    run's terms (:func:`simulator.metrics.client_calls`: censored at the scenario's client
    timeout, classed by its ``compositions``, call ids as strings like an observed run's).

    ``progress(i)`` is called after the ``i``-th run (1-based); each run's event log is
    appended to ``logs`` if given."""
    runs = []
    for i, seed in enumerate(seeds, 1):
        log = simulate(trace, scenario, profile, seed)
        if logs is not None:
            logs.append(log)
        calls = client_calls(log, scenario.client_timeout, scenario.compositions)
        calls["call_id"] = calls["call_id"].astype(str)
        runs.append(calls)
        if progress:
            progress(i)
    return runs


def simulate_figures(trace: Trace, scenario: Scenario, profile: Profile,
                     seeds: Sequence[int] = tuple(range(10)),
                     progress: Callable[[int], None] | None = None) -> pd.DataFrame:
    """What ``profile`` predicts for a run of ``trace`` under ``scenario``, with no observed
    run to compare with: one row per group (``overall``, then each composition class of
    the scenario's ``compositions`` that has calls), columns

    * ``calls``: calls in the group (the trace's, the same in every run);
    * ``unfinished``, ``unfinished_sd``: calls that did not finish — failed at the client
      timeout or the deadline, or turned away — mean and standard deviation over seeds;
    * ``p50``, ``p90``, ``p99``, ``mean`` of call latency (censored at the client timeout,
      as an observed run's), each with ``*_sd``.

    Each seed is one whole simulated run: a figure is computed per run (by the same code as
    an observed run's, :func:`simulator.observed.compare_calls`) and then averaged over
    the seeds; ``*_sd`` is its standard deviation over seeds (``ddof=1``; 0 for one seed),
    how much one run scatters. Averaging per-call latencies over seeds first would narrow
    the distribution and bias the upper quantiles low. A figure that depends on a call
    turned away with no client timeout to censor it is ``inf``. ``attrs["seeds"]`` holds
    the seeds. Raises ``ValueError`` for no seeds."""
    seeds = tuple(seeds)
    if not seeds:
        raise ValueError("simulate_figures needs at least one seed")
    tables = []
    for calls in simulated_runs(trace, scenario, profile, seeds, progress):
        # The run against itself: compare_calls's per-group figures, here on one side only.
        table = compare_calls(calls, calls).set_index("group")
        unfinished = {"overall": int((~calls["ok"]).sum())}
        unfinished.update((~calls["ok"]).groupby(calls["composition"]).sum().astype(int).to_dict())
        table["unfinished"] = [unfinished.get(g, 0) for g in table.index]
        tables.append(table)
    first = tables[0]
    out = pd.DataFrame({"calls": first["calls"].astype(int)}, index=first.index)
    for stat in ("unfinished", *FIGURES):
        column = stat if stat == "unfinished" else f"{stat}_other"
        values = np.array([t[column].reindex(out.index).to_numpy(float) for t in tables])
        # numpy interpolates a percentile between two infinite latencies (calls turned away
        # and not censored) as inf − inf = NaN; such a call is infinitely late.
        values = np.where(np.isnan(values), np.inf, values)
        out[stat] = values.mean(axis=0)
        with np.errstate(invalid="ignore"):
            out[f"{stat}_sd"] = values.std(axis=0, ddof=1) if len(tables) > 1 else 0.0
    out = out.reset_index()
    out.attrs["seeds"] = seeds
    return out


def predict(observed: ObservedRun, trace: Trace, scenario: Scenario, profile: Profile,
            seeds: tuple[int, ...] = tuple(range(10)),
            progress: Callable[[int], None] | None = None, tokens: TokenOptions | None = None) -> pd.DataFrame:
    """Errors of a profile's prediction of an observed run, figure by figure.

    Each seed is one possible run: its p50/p90/p99/mean per composition class (latency
    censored at the client timeout) are computed like the observed run's, then averaged
    over the seeds (``*_other``), with their standard deviation over seeds (``*_sd``, how
    much one simulated run scatters). Averaging per-call latencies over seeds first would
    narrow the distribution and bias the upper quantiles low. ``progress(i)`` is called
    after the ``i``-th simulated run.

    Where the run recorded requests (:attr:`ObservedRun.requests`), ``attrs["tokens"]``
    compares its token figures (:func:`simulator.metrics.token_figures`, percentiles by
    ``tokens``) the same way: one row per timing and statistic both sides have, ``observed``,
    ``predicted`` (mean over seeds), ``sd`` and ``err``; else it is ``None``."""
    check_tasks(scenario, profile.tasks, trace.tasks, f"the profile {profile.name}")
    reference = observed.classified(scenario.compositions).calls
    # (each run's log is kept only when there are token figures to compare)
    logs: list[pd.DataFrame] | None = [] if observed.requests is not None else None
    tables = [compare_calls(reference, calls).set_index("group")
              for calls in simulated_runs(trace, scenario, profile, seeds, progress, logs)]
    out = tables[0].copy()
    for stat in FIGURES:
        values = np.array([t[f"{stat}_other"].reindex(out.index).to_numpy(float) for t in tables])
        out[f"{stat}_other"] = values.mean(axis=0)
        out[f"{stat}_sd"] = values.std(axis=0, ddof=1) if len(tables) > 1 else 0.0
        ref = out[f"{stat}_ref"].to_numpy(float)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[f"{stat}_err"] = np.where(ref != 0, (out[f"{stat}_other"] - ref) / ref, np.nan)
    out = out.reset_index()
    out.attrs["tokens"] = None if observed.requests is None or logs is None else token_comparison(
        token_figures(observed.requests, tokens),
        [token_figures(prompt_requests(log, scenario.deadline), tokens) for log in logs])
    return out


def token_comparison(observed: dict[str, Any], simulated: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Observed token figures against simulated runs': per timing (TTFT, ITL, TPOT, e2e) and
    statistic that the observed run has, ``observed``, ``predicted`` (mean over the runs of a
    finite value), ``sd`` (``ddof=1``; 0 for one run) and ``err = (predicted − observed) /
    observed`` (all in ms)."""
    rows = []
    for name in TOKEN_TIMINGS:
        key = f"{name}_{TOKEN_UNIT}"
        for stat, value in observed[key].items():
            if value is None:
                continue
            runs = np.array([np.nan if r[key][stat] is None else r[key][stat] for r in simulated], dtype=float)
            runs = runs[np.isfinite(runs)]
            if not runs.size:
                continue
            mean = float(runs.mean())
            rows.append({"figure": key, "stat": stat, "observed": value, "predicted": mean,
                         "sd": float(runs.std(ddof=1)) if runs.size > 1 else 0.0,
                         "err": (mean - value) / value if value else math.nan})
    return pd.DataFrame(rows, columns=["figure", "stat", "observed", "predicted", "sd", "err"])


#: a parameter counts as identified by the calls when its relative standard error is at most
#: this and every fit they cannot tell apart lies within a factor :data:`IDENTIFIED_SPREAD`
IDENTIFIED_SE = 0.5
IDENTIFIED_SPREAD = 2.0


def identified(result: CalibrationResult) -> dict[str, bool]:
    """Which fitted values the run pins down: relative standard error at most
    :data:`IDENTIFIED_SE` and the equally good fits within a factor :data:`IDENTIFIED_SPREAD`
    of each other (a value the calls do not see, or trade against another, fails one)."""
    out = {}
    for name, se in result.relative_se.items():
        values = [v[name] for v in result.ensemble_values] or [result.values[name]]
        spread = max(values) / min(values) if min(values) > 0 else math.inf
        out[name] = bool(se <= IDENTIFIED_SE and spread <= IDENTIFIED_SPREAD)
    return out


def predict_ensemble(observed: ObservedRun, trace: Trace, scenario: Scenario, profiles: list[Profile],
                     seeds: tuple[int, ...] = tuple(range(10))) -> pd.DataFrame:
    """:func:`predict` for the first (best) profile, with each figure's range over all of
    ``profiles`` (``*_low``/``*_high``: the prediction's spread over the fits the
    calibration run could not tell apart)."""
    tables = [predict(observed, trace, scenario, p, seeds).set_index("group") for p in profiles]
    out = tables[0].copy()
    for stat in ("p50", "p90", "p99", "mean"):
        values = np.array([t[f"{stat}_other"].reindex(out.index).to_numpy(float) for t in tables])
        out[f"{stat}_low"] = values.min(axis=0)
        out[f"{stat}_high"] = values.max(axis=0)
    return out.reset_index()
