"""Capacity planning: the fewest GPUs, and the configuration, that meet latency SLOs.

An SLO names a figure of the replay summary, ``TASK.FIGURE.STAT`` (``overall`` for all
tasks; e.g. ``infobench.latency.p95``, ``mmlu.wait.mean``, ``overall.call_latency.p99``) or
``TASK.COUNT`` (``infobench.timed_out``), with ``<=``, ``<``, ``>=`` or ``>`` and a number;
or a token figure (``overall.tokens.ttft_ms.p99``, ``mmlu.tokens.output_tokens_per_s``),
and ``goodput>=0.9``: at least 90 % of prompts meet the per-request SLO of ``--goodput``.

The search (every replay goes through the sweep machinery, in parallel, and is cached):

1. **GPU count by bisection.** Feasibility is taken to be monotone in the GPU count (more
   GPUs never make a configuration worse). The largest count is tried first; then the
   smallest feasible count is found by bisection over ``1 .. max_gpus``.
2. **Dominance pruning.** By the same monotonicity, a configuration that misses an SLO with
   g GPUs misses it with fewer, so it is never replayed at a smaller count; and a count is
   feasible as soon as one configuration meets every SLO there (the candidates are tried in
   order of their headroom at the larger count, best first).
3. **The recommendation**: at the smallest feasible count every surviving candidate is
   replayed and the one with the most headroom wins (the smallest worst-case ratio of figure
   to bound over the SLOs), ties broken by the overall mean latency.
4. **Highest sustainable load**: bisection on ``rate_scale`` (load taken to be monotone)
   for the recommended configuration, to 1 % relative.

With several seeds every figure is the mean over seeds.

**The cheapest configuration** (:func:`cheapest`, ``--objective cheapest``) searches GPU type
(one profile per type, priced by the price table of :mod:`simulator.cost`) × GPU count ×
every axis, for the configuration of least cost (``cost.usd``: GPUs provisioned from the
first arrival to the last completion, times the price) meeting every SLO:

1. For each GPU type, the fewest-GPUs search above (bisection, dominance pruning) finds the
   smallest count g₀ at which some configuration meets every SLO, and replays every
   surviving configuration there.
2. Cost is not monotone in the count (more GPUs can finish sooner), so larger counts are
   replayed too, while they could still be cheaper: a run that serves every prompt lasts at
   least the trace's arrival span D, so g GPUs cost at least ``price × g × D / 3600``;
   counts whose bound reaches the cheapest cost found (over every GPU type) are skipped.
3. The answer is the least ``cost.usd`` among the configurations that met every SLO (ties:
   most headroom, as above); the **Pareto front** is the set of replayed configurations, of
   every GPU type, that no other replayed configuration dominates in (cost, SLO ratio): the
   SLO ratio is the worst ratio of figure to bound over the SLOs (≤ 1: every SLO met; with
   one SLO, a monotone function of its figure, so the front is that of cost against the
   figure). Configurations that miss an SLO are on it too when nothing cheaper does better:
   the front shows what a looser SLO would save.

The profiles compared must serve one model (:func:`check_one_model`): the plan answers
"which GPU type serves this model cheapest", and a cheaper plan with a smaller model would
buy different answers. ``mixed_models=True`` (``--mixed-models``) compares them anyway.

Prompts that do not finish count as failures: every latency statistic counts them as
infinitely late (:mod:`simulator.metrics`), so an SLO on a percentile ``pX`` tolerates at
most (100 − X) % of prompts unfinished (rejected, dropped, or not done by the deadline) and an
SLO on a mean or max tolerates none. To demand that every prompt finish whatever the
percentile, add ``--slo "overall.unfinished<=0"``.

``--objective auto`` (the default) plans for the cheapest configuration when every profile
given names a GPU type the price table prices, and for the fewest GPUs otherwise (the
bundled hand-calibrated profiles name none, so their plans are unchanged).
"""

from __future__ import annotations

import json
import math
import operator
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from simulator.cost import PriceTable, gpu_type, gpus_per_engine, require_price
from simulator.errors import PlanError
from simulator.metrics import (
    DEFAULT_PERCENTILES,
    RUN_FIGURES,
    TOKEN_TIMINGS,
    TOKEN_UNIT,
    FigureError,
    TokenOptions,
    figure_key,
    stat_name,
)
from simulator.profile import Profile
from simulator.sweep import AXES, Base, SweepSpec, _local_results, config_key, validate

STAT_FIGURES = ("latency", "call_latency", "wait", "service", "ttft", "tpot")
STATS = ("mean", "p50", "p90", "p95", "p99", "max")
COUNT_FIGURES = ("prompts", "completed", "timed_out", "rejected", "dropped", "sent_after_timeout",
                 "preemptions", "calls", "calls_completed", "mean_batch_size", "throughput_prompts_per_s")
OPS: dict[str, Callable[[float, float], bool]] = {"<=": operator.le, "<": operator.lt,
                                                   ">=": operator.ge, ">": operator.gt}
DEFAULT_AXES: dict[str, tuple[Any, ...]] = {
    "flush": (0.0, 0.1, 0.5, 1.0, 2.0, 5.0),
    "topology": ("shared", "split", "direct", "continuous"),
    "max_batch": (1, 2, 4, 8, 10),
}
#: Cost figures of the summary (:mod:`simulator.cost`) an SLO, a metric or the front may name.
COST_FIGURES = ("cost.usd", "cost.gpu_hours", "cost.usd_per_1k_prompts")
#: What ``simctl plan`` minimises (see the module docstring).
OBJECTIVES = ("auto", "cheapest", "fewest-gpus")
_SLO_RE = re.compile(r"^\s*([^\s<>=]+?)\s*(<=|>=|<|>)\s*(\S+)\s*$")


@dataclass(frozen=True)
class SLO:
    """One objective: ``figure`` (a flattened summary key) ``op`` ``bound``."""

    text: str
    figure: str
    op: str
    bound: float

    def met(self, value: float | None) -> bool:
        return value is not None and not math.isnan(value) and OPS[self.op](value, self.bound)

    def ratio(self, value: float | None) -> float:
        """How much of the bound is used: <= 1 met (for upper bounds value/bound, else bound/value)."""
        if value is None or math.isnan(value):
            return math.inf
        if self.op in ("<=", "<"):
            return value / self.bound if self.bound > 0 else (0.0 if value <= 0 else math.inf)
        return self.bound / value if value > 0 else math.inf

    def __str__(self) -> str:
        return self.text


#: The token figures an SLO may bound (:func:`simulator.metrics.token_figures`): rates, and
#: goodput (with ``--goodput``); ``TASK.tokens.ttft_ms.p99`` and the like too.
TOKEN_RATES = ("requests_per_s", "output_tokens_per_s", "total_tokens_per_s", "goodput_per_s", "goodput_fraction")
#: ``goodput`` alone names the share of all prompts that met the goodput SLO.
GOODPUT = "overall.tokens.goodput_fraction"


def slo_figures(tasks: Iterable[str], percentiles: Iterable[float] = DEFAULT_PERCENTILES) -> list[str]:
    """Every flattened summary key an SLO may bound, for the groups ``overall`` and ``tasks``
    (token timings with the statistics of ``percentiles``)."""
    groups = ["overall", *(f"tasks.{t}" for t in tasks)]
    token_stats = ["mean", *(stat_name(p) for p in percentiles)]
    return ([f"{g}.{f}.{s}" for g in groups for f in STAT_FIGURES for s in STATS]
            + [f"{g}.{c}" for g in groups for c in COUNT_FIGURES]
            + [f"{g}.tokens.{t}_{TOKEN_UNIT}.{s}" for g in groups for t in TOKEN_TIMINGS for s in token_stats]
            + [f"{g}.tokens.{r}" for g in groups for r in TOKEN_RATES]
            + list(RUN_FIGURES) + list(COST_FIGURES))


def parse_slo(text: str, tasks: Iterable[str], tokens: TokenOptions | None = None) -> SLO:
    """Parse ``"infobench.latency.p95<=60"`` (or ``tasks.infobench.latency.p95<=60``: the
    figure grammar of :func:`simulator.metrics.figure_key`); ``goodput>=0.9`` bounds
    :data:`GOODPUT`, the share of prompts meeting ``tokens.goodput`` (``--goodput``), which
    it needs. :class:`PlanError` naming the fault, with the closest valid figures."""
    m = _SLO_RE.match(text)
    if not m:
        raise PlanError(None, None, None, f"--slo {text!r}: expected FIGURE<=NUMBER (or <, >=, >), "
                        f"e.g. infobench.latency.p95<=60")
    name, op, number = m.groups()
    if name == "goodput":
        name = GOODPUT
    if "goodput" in name and (tokens is None or tokens.goodput is None):
        raise PlanError(None, None, None, f"--slo {text!r}: goodput needs its per-request SLO, "
                        "e.g. --goodput ttft:200ms,tpot:50ms")
    try:
        percentiles = tokens.percentiles if tokens is not None else DEFAULT_PERCENTILES
        figure = figure_key(name, slo_figures(tasks, percentiles), option=f"--slo {text!r}:")
    except FigureError as exc:
        raise PlanError(None, None, None, exc.message) from None
    try:
        bound = float(number)
    except ValueError:
        raise PlanError(None, None, None, f"--slo {text!r}: bound {number!r} is not a number") from None
    if not math.isfinite(bound):
        raise PlanError(None, None, None, f"--slo {text!r}: the bound must be a finite number")
    if bound < 0:
        raise PlanError(None, None, None, f"--slo {text!r}: figures are never negative; the bound must be >= 0")
    return SLO(text.strip(), figure, op, bound)


@dataclass
class Evaluator:
    """Replays configurations (cached, parallel), averaging figures over seeds."""

    base: Base
    seeds: tuple[int, ...]
    task: str | None
    workers: int | None = None
    cache: dict[str, dict[str, float]] = field(default_factory=dict)
    replays: int = 0

    def evaluate(self, configs: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
        todo = {config_key(c): dict(c) for c in configs if config_key(c) not in self.cache}
        jobs = [(k, c, s) for k, c in todo.items() for s in self.seeds]
        sums: dict[str, list[dict[str, Any]]] = {k: [] for k in todo}
        for rows, _ in _local_results(jobs, self.task, self.base, self.workers, lines=False):
            for row in rows:
                sums[row["config_key"]].append(row)
        self.replays += len(jobs)
        for k, rows in sums.items():
            keys = [n for n, v in rows[0].items() if isinstance(v, (int, float)) and n != "seed"]
            self.cache[k] = {n: sum(float(r[n]) if r[n] is not None else math.nan for r in rows) / len(rows)
                             for n in keys}
        return [self.cache[config_key(c)] for c in configs]

    def passes(self, config: Mapping[str, Any], figures: Mapping[str, float], slos: Sequence[SLO]) -> bool:
        """Whether ``config`` (with its ``figures``) meets every SLO: here its mean figures
        meet each bound; :class:`simulator.uncertainty.WorldsEvaluator` asks a probability."""
        return all(s.met(figures.get(s.figure)) for s in slos)

    def verdicts(self, config: Mapping[str, Any], slos: Sequence[SLO]) -> list[Any] | None:
        """Each SLO's verdict over worlds, where this evaluator draws them (``None`` here)."""
        return None

    def uncertainty(self, config: Mapping[str, Any], slos: Sequence[SLO]) -> dict[str, Any] | None:
        """The uncertainty block of a plan's result for ``config``, where this evaluator draws
        worlds (``None`` here)."""
        return None


@dataclass
class PlanResult:
    """What :func:`plan` found; :meth:`to_dict` is the ``--json`` document."""

    gpus: int
    config: dict[str, Any]
    slos: list[SLO]
    met: bool
    figures: dict[str, float | None]
    max_rate_scale: float | None
    replays: int
    search: list[dict[str, Any]]
    #: with worlds (:mod:`simulator.uncertainty`): each SLO's verdict for the recommended
    #: configuration, the confidence asked and what varied between the worlds
    uncertainty: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus, "config": self.config,
            "slos": _slo_rows(self.slos, self.figures, self.uncertainty),
            "met": self.met, "figures": self.figures, "max_rate_scale": self.max_rate_scale,
            "replays": self.replays, "search": self.search,
            **({"uncertainty": {k: v for k, v in self.uncertainty.items() if k != "verdicts"}}
               if self.uncertainty else {}),
        }


def _slo_rows(slos: Sequence[SLO], figures: Mapping[str, float | None],
              uncertainty: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The ``slos`` of a plan's JSON: each SLO's (mean) value and whether it is met; with
    worlds, met means ``p >= confidence``, and ``p``, ``p_se``, the interval come along."""
    rows = []
    for i, s in enumerate(slos):
        row = {"slo": s.text, "figure": s.figure, "value": figures.get(s.figure), "met": s.met(figures.get(s.figure))}
        if uncertainty:
            verdict = uncertainty["verdicts"][i]
            row.update({k: v for k, v in verdict.items() if k not in ("slo", "figure")},
                       met=verdict["p"] >= uncertainty["confidence"])
        rows.append(row)
    return rows


def score(slos: Sequence[SLO], figures: Mapping[str, float]) -> tuple[float, float, float]:
    """(worst ratio to bound, prompts that did not finish, overall mean latency): smaller is
    better. The count ranks configurations whose latency figures are all infinite."""
    worst = max(s.ratio(figures.get(s.figure)) for s in slos)
    unfinished = figures.get("overall.unfinished", math.inf)
    mean = figures.get("overall.latency.mean", math.inf)
    return worst, unfinished if unfinished == unfinished else math.inf, mean if mean == mean else math.inf


def plan(base: Base, slos: Sequence[SLO], axes: Mapping[str, Sequence[Any]] | None = None, *,
         max_gpus: int = 8, seeds: Sequence[int] = (0,), task: str | None = None,
         workers: int | None = None, load_tolerance: float = 0.01, find_max_rate: bool = True,
         progress: Callable[[str], None] | None = None, evaluator: Evaluator | None = None) -> PlanResult:
    """Smallest GPU count and best configuration meeting every SLO (see the module docstring).
    ``evaluator``: replay through this one (its cache then holds every replay of the search)."""
    if not slos:
        raise PlanError(None, None, None, "give at least one --slo")
    if max_gpus < 1:
        raise PlanError(None, None, None, f"--max-gpus must be >= 1, got {max_gpus}")
    axis_values = {name: tuple(values) for name, values in {**DEFAULT_AXES, **(axes or {})}.items()}
    for name in ("gpus", "rate_scale"):
        if name in axis_values:
            raise PlanError(None, None, None, f"--{name.replace('_', '-')} is what plan searches; do not fix it")
    validate(SweepSpec(axis_values, tuple(seeds), task), base)
    say = progress or (lambda _m: None)
    ev = evaluator if evaluator is not None else Evaluator(base, tuple(seeds), task, workers)
    grid = SweepSpec(axis_values, tuple(seeds), task).configurations()
    failed_at: dict[int, int] = {}   # config -> largest GPU count at which it missed an SLO
    headroom: dict[int, tuple[float, float, float]] = {}
    search: list[dict[str, Any]] = []

    def runs_on(config: dict[str, Any], g: int) -> bool:
        """Whether ``config`` can run on ``g`` GPUs: a disaggregated task needs a decode GPU
        beside its prefill pool (fewer GPUs do not make that configuration worse: it does
        not exist there)."""
        for t in base.swept_tasks(task):
            cfg = base.scenario.for_task(t)
            if (config.get("topology", cfg.topology) == "disaggregated"
                    and config.get("prefill_gpus", cfg.prefill_gpus) >= g):
                return False
        return True

    def at(g: int, idx: list[int]) -> list[dict[str, Any]]:
        return [{**grid[i], "gpus": g} for i in idx]

    def feasible(g: int, full: bool) -> tuple[bool, list[int]]:
        """Replay candidates at g (all, or in order of headroom until one meets every SLO)."""
        # Dominance: what misses an SLO with g' GPUs misses it with fewer, so skip it for g <= g'.
        candidates = [i for i in range(len(grid)) if failed_at.get(i, 0) < g and runs_on(grid[i], g)]
        order = sorted(candidates, key=lambda i: headroom.get(i, (0.0, 0.0, 0.0)))
        passed: list[int] = []
        failed: list[int] = []
        tried = 0
        step = max(1, len(order) if full else (workers or os.cpu_count() or 2) * 4)
        for start in range(0, len(order), step):
            chunk = order[start:start + step]
            for i, figs in zip(chunk, ev.evaluate(at(g, chunk)), strict=True):
                tried += 1
                headroom[i] = score(slos, figs)
                (passed if ev.passes(at(g, [i])[0], figs, slos) else failed).append(i)
            if passed and not full:
                break
        for i in failed:
            failed_at[i] = max(failed_at.get(i, 0), g)
        search.append({"gpus": g, "candidates": len(candidates), "replayed": tried, "met": len(passed)})
        say(f"{g} GPU(s): {len(passed)} of {tried} configurations meet every SLO")
        return bool(passed), passed

    ok, _ = feasible(max_gpus, full=True)
    if not ok:
        # Report the closest configuration at the largest count.
        runnable = [i for i in range(len(grid)) if runs_on(grid[i], max_gpus)]
        if not runnable:
            raise PlanError(None, None, "prefill_gpus", f"no configuration leaves a decode GPU on {max_gpus} GPU(s); "
                            f"raise --max-gpus or lower --prefill-gpus")
        figs = dict(zip(runnable, ev.evaluate(at(max_gpus, runnable)), strict=True))
        best = min(runnable, key=lambda i: score(slos, figs[i]))
        closest = at(max_gpus, [best])[0]
        return PlanResult(max_gpus, closest, list(slos), False, _report(figs[best], slos),
                          None, ev.replays, search, ev.uncertainty(closest, slos))
    lo, hi = 0, max_gpus           # lo infeasible (0 GPUs), hi feasible
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok, _ = feasible(mid, full=False)
        if ok:
            hi = mid
        else:
            lo = mid
    _, passed = feasible(hi, full=True)
    figs_of = dict(zip(passed, ev.evaluate(at(hi, passed)), strict=True))
    best = min(passed, key=lambda i: score(slos, figs_of[i]))
    config = at(hi, [best])[0]
    max_rate = max_rate_scale(ev, config, slos, load_tolerance, say) if find_max_rate else None
    return PlanResult(hi, config, list(slos), True, _report(figs_of[best], slos), max_rate, ev.replays, search,
                      ev.uncertainty(config, slos))


def group_of(figure: str) -> str:
    """The summary group a flattened figure belongs to: ``tasks.infobench`` or ``overall``."""
    return "overall" if figure.startswith("overall.") else ".".join(figure.split(".")[:2])


def _report(figs: Mapping[str, float], slos: Sequence[SLO]) -> dict[str, float | None]:
    groups = dict.fromkeys([group_of(s.figure) for s in slos] + ["overall"])
    keys = [s.figure for s in slos] + ["overall.latency.mean", "overall.latency.p95", "overall.latency.p99",
                                       "overall.timed_out", "makespan_s", *COST_FIGURES]
    keys += [f"{g}.{count}" for g in groups for count in ("prompts", "unfinished")]
    return {k: figs.get(k) for k in dict.fromkeys(keys)}


def meets(ev: Evaluator, config: Mapping[str, Any], slos: Sequence[SLO], rate: float) -> bool:
    at_rate = {**config, "rate_scale": rate}
    return ev.passes(at_rate, ev.evaluate([at_rate])[0], slos)


def max_rate_scale(ev: Evaluator, config: Mapping[str, Any], slos: Sequence[SLO],
                   tolerance: float = 0.01, say: Callable[[str], None] = lambda _m: None,
                   ceiling: float = 64.0) -> float:
    """Highest load multiplier ``config`` sustains within the SLOs (doubling, then bisection)."""
    lo, hi = 1.0, 2.0
    while meets(ev, config, slos, hi):
        lo, hi = hi, hi * 2
        if hi > ceiling:
            return lo
    while hi / lo - 1 > tolerance:
        mid = math.sqrt(lo * hi)
        if meets(ev, config, slos, mid):
            lo = mid
        else:
            hi = mid
    say(f"sustains up to {lo:.3g}x the trace's load")
    return lo


def load_points(ev: Evaluator, config: Mapping[str, Any], slos: Sequence[SLO], top: float, n: int = 10):
    """Figures of ``config`` at ``n`` loads from ``top / n`` to ``top`` (for the load plot)."""
    import pandas as pd

    rates = [top * (i + 1) / n for i in range(n)]
    figs = ev.evaluate([{**config, "rate_scale": r} for r in rates])
    return pd.DataFrame([{"rate_scale": r, **{s.figure: f.get(s.figure) for s in slos}} for r, f in zip(rates, figs, strict=True)])


def worst_ratio(slos: Sequence[SLO], figures: Mapping[str, float]) -> float:
    """The SLO ratio of a configuration: the largest :meth:`SLO.ratio` over ``slos`` (<= 1:
    every SLO met)."""
    return max(s.ratio(figures.get(s.figure)) for s in slos)


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices (ascending) of the points no other point dominates, both coordinates to be
    minimised: j dominates i when ``x_j <= x_i`` and ``y_j <= y_i`` with one of them strict.
    Equal points do not dominate each other (all are kept); NaN counts as +inf."""
    def clean(v: float) -> float:
        return math.inf if v != v else v

    pts = [(clean(x), clean(y)) for x, y in points]
    order = sorted(range(len(pts)), key=lambda i: pts[i])
    front: list[int] = []
    best_y = math.inf        # least y among points of smaller x
    k = 0
    while k < len(order):
        x = pts[order[k]][0]
        group = [i for i in order[k:] if pts[i][0] == x]
        least = min(pts[i][1] for i in group)
        # Within one x only the least y survives; across x, a point survives when its y is
        # below every y of a smaller x (equal y at a smaller x dominates it).
        if k == 0 or least < best_y:
            front += [i for i in group if pts[i][1] == least]
        best_y = min(best_y, least)
        k += len(group)
    return sorted(front)


@dataclass
class CheapestResult:
    """What :func:`cheapest` found; :meth:`to_dict` is the ``--json`` document. ``points``:
    every configuration replayed (GPU type, count, settings, cost, SLO ratio, figures);
    ``front``: the indices of ``points`` on the Pareto front, by increasing cost."""

    gpu_type: str
    profile: str
    gpus: int
    config: dict[str, Any]
    slos: list[SLO]
    met: bool
    figures: dict[str, float | None]
    price: dict[str, Any]
    points: list[dict[str, Any]]
    front: list[int]
    replays: int
    search: list[dict[str, Any]]
    #: as :attr:`PlanResult.uncertainty`
    uncertainty: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "objective": "cheapest", "gpu_type": self.gpu_type, "profile": self.profile, "gpus": self.gpus,
            "config": self.config,
            "slos": _slo_rows(self.slos, self.figures, self.uncertainty),
            "met": self.met, "figures": self.figures, "price": self.price,
            "pareto_front": [self.points[i] for i in self.front], "configurations_replayed": len(self.points),
            "replays": self.replays, "search": self.search,
            **({"uncertainty": {k: v for k, v in self.uncertainty.items() if k != "verdicts"}}
               if self.uncertainty else {}),
        }


def _arrival_span(base: Base) -> float:
    """Seconds from the first to the last arrival of the trace at the base scenario's load."""
    times = base.trace.columns.call_t
    return float(times.max() - times.min()) / base.scenario.rate_scale if times.size else 0.0


def _fewest_replicas(base: Base, grid: Sequence[Mapping[str, Any]]) -> int:
    """The fewest replicas any configuration of ``grid`` holds through the run: 1 without a
    replica pool, else its ``min_replicas`` (an autoscaler may scale down to it, never below)."""
    fewest = None
    for config in grid:
        pooled = config.get("autoscaler", base.scenario.autoscaler) is not None
        held = int(config.get("min_replicas", base.scenario.min_replicas)) if pooled else 1
        fewest = held if fewest is None else min(fewest, held)
    return 1 if fewest is None else fewest


def check_one_model(profiles: Sequence[Profile]) -> None:
    """:class:`PlanError` naming two profiles and their models when ``profiles`` do not all
    serve the same target model (:func:`simulator.profile.identity.describe`): a plan across
    GPU types compares the cost of one model; another model answers differently, so its cost
    is not the price of the same answers. A profile that states no model is not compared."""
    from simulator.profile.identity import NOT_STATED, describe

    stated = [(p.name, describe(p).model) for p in profiles]
    stated = [(name, model) for name, model in stated if model != NOT_STATED]
    for name, model in stated[1:]:
        first, first_model = stated[0]
        if model != first_model:
            raise PlanError(None, None, "--profile", f"{first} serves {first_model} and {name} serves {model}: a plan "
                            "across GPU types compares one model (a different model gives different answers, so its "
                            "cost is not the price of the same work); compose both for one model "
                            "(simctl profile --gpu NAME --model M), or give --mixed-models to compare them anyway")


def cheapest(bases: Sequence[Base], slos: Sequence[SLO], prices: PriceTable,
             axes: Mapping[str, Sequence[Any]] | None = None, *, max_gpus: int = 8, seeds: Sequence[int] = (0,),
             task: str | None = None, workers: int | None = None,
             progress: Callable[[str], None] | None = None, mixed_models: bool = False,
             evaluator_for: Callable[[Base], Evaluator] | None = None) -> CheapestResult:
    """The cheapest GPU type (one base per profile), GPU count and configuration meeting every
    SLO, and the Pareto front of cost against the SLO ratio (see the module docstring).
    ``evaluator_for(base)``: the evaluator of each profile's replays (default: the mean over
    ``seeds``; :meth:`simulator.uncertainty.WorldsEvaluator.build` asks a probability).
    :class:`simulator.errors.PriceError` when a profile has no GPU type or no price;
    :class:`PlanError` when two profiles serve different models (:func:`check_one_model`)
    unless ``mixed_models``."""
    from dataclasses import replace as with_field

    if not bases:
        raise PlanError(None, None, None, "give at least one --profile")
    if not slos:
        raise PlanError(None, None, None, "give at least one --slo")
    if not mixed_models:
        check_one_model([b.profile for b in bases])
    say = progress or (lambda _m: None)
    types = [gpu_type(b.profile) for b in bases]
    price_of = [require_price(b.profile, prices) for b in bases]
    evaluators = [(evaluator_for or (lambda base: Evaluator(base, tuple(seeds), task, workers)))(
        with_field(b, prices=prices)) for b in bases]
    axis_values = {name: tuple(values) for name, values in {**DEFAULT_AXES, **(axes or {})}.items()}
    search: list[dict[str, Any]] = []
    lowest: list[int | None] = []
    for b, ev, gpu in zip(bases, evaluators, types, strict=True):
        def tagged(message: str, gpu: str | None = gpu) -> None:
            say(f"{gpu}: {message}")

        found = plan(b, slos, axes, max_gpus=max_gpus, seeds=seeds, task=task, workers=workers,
                     find_max_rate=False, evaluator=ev, progress=tagged)
        lowest.append(found.gpus if found.met else None)
        search.append({"gpu_type": gpu, "profile": b.profile.name, "fewest_gpus": found.gpus if found.met else None,
                       "counts": list(dict.fromkeys(s["gpus"] for s in found.search))})
    grid = SweepSpec(axis_values, tuple(seeds), task).configurations()

    def met_points() -> list[float]:
        return [figs["cost.usd"] for ev in evaluators for key, figs in list(ev.cache.items())
                if "rate_scale" not in key and ev.passes(json.loads(key), figs, slos)
                and figs.get("cost.usd") is not None]

    # Larger counts, while their lower bound on cost is below the cheapest found: g GPUs (a
    # replica's, with a pool) times the fewest replicas held, through the arrivals at least.
    for k, (b, ev, price) in enumerate(zip(bases, evaluators, price_of, strict=True)):
        start = lowest[k]
        if start is None:
            continue
        span = _arrival_span(b) * _fewest_replicas(b, grid)
        g = start + 1
        while g <= max_gpus:
            found_costs = met_points()
            best = min(found_costs) if found_costs else math.inf
            if price.usd_per_gpu_hour * g * gpus_per_engine(b.profile) * span / 3600.0 >= best:
                break
            ev.evaluate([{**c, "gpus": g} for c in grid])
            search[k]["counts"].append(g)
            say(f"{types[k]}: {g} GPU(s) replayed (could still be cheaper)")
            g += 1

    points: list[dict[str, Any]] = []
    for k, (b, ev, gpu, price) in enumerate(zip(bases, evaluators, types, price_of, strict=True)):
        for key, figs in list(ev.cache.items()):
            config = json.loads(key)
            if "rate_scale" in config:
                continue
            met = ev.passes(config, figs, slos)
            points.append({"gpu_type": gpu, "profile": b.profile.name, "gpus": config.pop("gpus"),
                           "gpus_per_engine": gpus_per_engine(b.profile), "config": config,
                           "usd_per_gpu_hour": price.usd_per_gpu_hour, "usd": figs.get("cost.usd"),
                           "gpu_hours": figs.get("cost.gpu_hours"),
                           "usd_per_1k_prompts": figs.get("cost.usd_per_1k_prompts"),
                           "slo_ratio": worst_ratio(slos, figs),
                           "met": met,
                           "figures": {s.figure: figs.get(s.figure) for s in slos}, "_figs": figs, "_k": k})
    usd = [p["usd"] if p["usd"] is not None else math.inf for p in points]
    front = sorted(pareto_front([(u, p["slo_ratio"]) for u, p in zip(usd, points, strict=True)]),
                   key=lambda i: (usd[i], points[i]["slo_ratio"]))
    passing = [i for i, p in enumerate(points) if p["met"]]
    if passing:
        best = min(passing, key=lambda i: (usd[i], *score(slos, points[i]["_figs"])))
    else:
        best = min(range(len(points)), key=lambda i: (score(slos, points[i]["_figs"]), usd[i]))
    chosen = points[best]
    figures = _report(chosen["_figs"], slos)
    price = price_of[chosen["_k"]]
    chosen_ev = evaluators[chosen["_k"]]
    for p in points:
        del p["_figs"], p["_k"]
    return CheapestResult(chosen["gpu_type"], chosen["profile"], chosen["gpus"], {**chosen["config"], "gpus": chosen["gpus"]},
                          list(slos), bool(passing), figures,
                          {"gpu_type": price.gpu, "usd_per_gpu_hour": price.usd_per_gpu_hour, "prices": prices.name,
                           "offering": price.offering, "source": price.source, "read_on": price.read_on},
                          points, front, sum(ev.replays for ev in evaluators), search,
                          chosen_ev.uncertainty({**chosen["config"], "gpus": chosen["gpus"]}, slos))


__all__ = ["AXES", "COST_FIGURES", "OBJECTIVES", "CheapestResult", "PlanError", "PlanResult", "SLO", "cheapest",
           "check_one_model",
           "load_points", "pareto_front", "parse_slo", "plan", "worst_ratio"]
