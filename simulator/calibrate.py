"""Calibration: fit a profile's free parameters so that simulated call latencies match an
observed run's.

The free parameters are listed in the starting profile's ``meta.calibrate``::

    {"name": "infobench.pass_base", "task": "infobench", "path": "service.costs.verify.coef.0",
     "min": 1e-4, "max": 5.0, "ties": [{"path": "service.costs.draft_step.coef.0", "factor": 0.3}]}

(``path`` is a dotted path into the task's profile; ``ties`` move other values with it).
The fit works on log-parameters with ``scipy.optimize.least_squares`` (soft-L1 loss, robust
to a few badly modelled calls) on the per-call residuals ``log(sim) − log(obs)``, where
``sim`` is the call's latency averaged over the seeds (the same seeds at every step: common
random numbers, so the objective is smooth enough for finite differences) and both sides
are floored at 0.05 s. Simulated latencies are not censored (the model serves every call, so
the residuals keep their slope however slow a candidate is); an observed call that failed at
the client timeout counts only if the simulated one is shorter than the timeout. Standard errors come from the
Gauss–Newton covariance ``s² (JᵀJ)⁻¹`` at the optimum, in log space (so they are relative).

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
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pandas as pd

from simulator.errors import ProfileError
from simulator.metrics import client_calls
from simulator.model import simulate
from simulator.observed import ObservedRun, compare_calls
from simulator.profile import Profile, profile_from_dict
from simulator.scenario import Scenario
from simulator.trace.model import Trace

FLOOR = 0.05  # seconds: latencies below this are compared as this (graph calls are ~0.1 s)


@dataclass(frozen=True)
class FreeParameter:
    name: str
    task: str
    path: str
    low: float
    high: float
    ties: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class CalibrationResult:
    profile: dict[str, Any]           # the fitted profile, as JSON data
    values: dict[str, float]
    relative_se: dict[str, float]     # standard error of log(value): relative uncertainty
    correlation: np.ndarray
    errors: pd.DataFrame              # compare_calls(observed, fitted simulation)
    cost: float
    evaluations: int


def free_parameters(data: dict[str, Any], where: str) -> list[FreeParameter]:
    raw = (data.get("meta") or {}).get("calibrate")
    if not isinstance(raw, list) or not raw:
        raise ProfileError(where, None, "meta.calibrate", "the starting profile lists no free parameters")
    out = []
    for i, p in enumerate(raw):
        try:
            out.append(FreeParameter(str(p["name"]), str(p["task"]), str(p["path"]), float(p["min"]), float(p["max"]),
                                     tuple((str(t["path"]), float(t["factor"])) for t in p.get("ties", ()))))
        except (KeyError, TypeError, ValueError):
            raise ProfileError(where, f"meta.calibrate[{i}]", None,
                               "needs name, task, path, min, max (and optional ties of path, factor)") from None
        _get(data, out[-1].task, out[-1].path, where)
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
    for p, v in zip(params, values):
        _set(out, p.task, p.path, float(v))
        for path, factor in p.ties:
            _set(out, p.task, path, float(v) * factor)
    return out


def calibrate(observed: ObservedRun, trace: Trace, scenario: Scenario, start: dict[str, Any],
              seeds: tuple[int, ...] = (0, 1, 2), max_evaluations: int = 120,
              progress: Callable[[int, float], None] | None = None, where: str = "<profile>") -> CalibrationResult:
    """Fit ``start``'s free parameters to ``observed`` (a run of ``trace`` under ``scenario``)."""
    from scipy.optimize import least_squares

    params = free_parameters(start, where)
    timeout = scenario.client_timeout
    obs = observed.calls.set_index("call_id")
    call_ids = [c.id for c in trace.calls]
    y = np.log(np.maximum(obs["latency_censored_s"].reindex(call_ids).to_numpy(float), FLOOR))
    failed = ~obs["ok"].reindex(call_ids).to_numpy(bool)
    low = np.log([p.low for p in params])
    high = np.log([p.high for p in params])
    x0 = np.clip(np.log([_get(start, p.task, p.path, where) for p in params]), low + 1e-9, high - 1e-9)
    count = [0]

    def simulated(x: np.ndarray) -> np.ndarray:
        profile = profile_from_dict(_with_values(start, params, np.exp(x)), where)
        runs = []
        for seed in seeds:
            calls = client_calls(simulate(trace, scenario, profile, seed), None)
            runs.append(np.log(np.maximum(calls["latency_censored_s"].to_numpy(float), FLOOR)))
        return np.mean(runs, axis=0)

    def residuals(x: np.ndarray) -> np.ndarray:
        count[0] += 1
        r = simulated(x) - y
        # A call the client gave up on took at least the timeout: only a shorter simulated
        # latency is an error.
        r[failed] = np.minimum(r[failed], 0.0)
        if progress:
            progress(count[0], float(np.mean(np.abs(r))))
        return r

    fit = least_squares(residuals, x0, bounds=(low, high), loss="soft_l1", f_scale=0.3,
                        diff_step=0.1, max_nfev=max_evaluations, x_scale=1.0)
    n, k = len(y), len(params)
    J = fit.jac
    s2 = float(np.sum(fit.fun ** 2) / max(n - k, 1))
    # A parameter the calls do not see (a zero column of J) gets an infinite error.
    seen = np.abs(J).sum(axis=0) > 0
    se = np.full(k, math.inf)
    corr = np.full((k, k), np.nan)
    if seen.any():
        Js = J[:, seen]
        cov = np.linalg.pinv(Js.T @ Js) * s2
        se_seen = np.sqrt(np.clip(np.diag(cov), 0, None))
        se[seen] = se_seen
        idx = np.flatnonzero(seen)
        with np.errstate(invalid="ignore", divide="ignore"):
            corr[np.ix_(idx, idx)] = cov / np.outer(se_seen, se_seen)
    fitted = _with_values(start, params, np.exp(fit.x))
    profile = profile_from_dict(fitted, where)
    final = client_calls(simulate(trace, scenario, profile, seeds[0]), timeout)
    final["call_id"] = final["call_id"].astype(str)
    return CalibrationResult(
        profile=fitted, values={p.name: float(v) for p, v in zip(params, np.exp(fit.x))},
        relative_se={p.name: float(s) for p, s in zip(params, se)}, correlation=corr,
        errors=compare_calls(observed.calls, final), cost=float(fit.cost), evaluations=count[0])


def predict(observed: ObservedRun, trace: Trace, scenario: Scenario, profile: Profile,
            seeds: tuple[int, ...] = (0, 1, 2)) -> pd.DataFrame:
    """Errors of a profile's prediction of an observed run: the simulated per-call latency
    (censored at the client timeout) averaged over seeds, against the observed one."""
    runs = [client_calls(simulate(trace, scenario, profile, s), scenario.client_timeout) for s in seeds]
    calls = runs[0].copy()
    calls["latency_censored_s"] = np.mean([r["latency_censored_s"].to_numpy(float) for r in runs], axis=0)
    calls["call_id"] = calls["call_id"].astype(str)
    return compare_calls(observed.calls, calls)
