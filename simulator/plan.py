"""Capacity planning: the fewest GPUs, and the configuration, that meet latency SLOs.

An SLO names a figure of the replay summary, ``TASK.FIGURE.STAT`` (``overall`` for all
tasks; e.g. ``infobench.latency.p95``, ``mmlu.wait.mean``, ``overall.call_latency.p99``) or
``TASK.COUNT`` (``infobench.timed_out``), with ``<=``, ``<``, ``>=`` or ``>`` and a number.

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
"""

from __future__ import annotations

import math
import operator
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from simulator.errors import PlanError
from simulator.metrics import RUN_FIGURES, FigureError, figure_key
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


def slo_figures(tasks: Iterable[str]) -> list[str]:
    """Every flattened summary key an SLO may bound, for the groups ``overall`` and ``tasks``."""
    groups = ["overall", *(f"tasks.{t}" for t in tasks)]
    return ([f"{g}.{f}.{s}" for g in groups for f in STAT_FIGURES for s in STATS]
            + [f"{g}.{c}" for g in groups for c in COUNT_FIGURES] + list(RUN_FIGURES))


def parse_slo(text: str, tasks: Iterable[str]) -> SLO:
    """Parse ``"infobench.latency.p95<=60"`` (or ``tasks.infobench.latency.p95<=60``: the
    figure grammar of :func:`simulator.metrics.figure_key`); :class:`PlanError` naming the
    fault, with the closest valid figures."""
    m = _SLO_RE.match(text)
    if not m:
        raise PlanError(None, None, None, f"--slo {text!r}: expected FIGURE<=NUMBER (or <, >=, >), "
                        f"e.g. infobench.latency.p95<=60")
    name, op, number = m.groups()
    try:
        figure = figure_key(name, slo_figures(tasks), option=f"--slo {text!r}:")
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
        workers = self.workers if self.workers is not None else (os.cpu_count() or 1)
        for row in _local_results(jobs, self.task, self.base, workers):
            sums[row["config_key"]].append(row)
        self.replays += len(jobs)
        for k, rows in sums.items():
            keys = [n for n, v in rows[0].items() if isinstance(v, (int, float)) and n != "seed"]
            self.cache[k] = {n: sum(float(r[n]) if r[n] is not None else math.nan for r in rows) / len(rows)
                             for n in keys}
        return [self.cache[config_key(c)] for c in configs]


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus, "config": self.config,
            "slos": [{"slo": s.text, "figure": s.figure, "value": self.figures.get(s.figure),
                      "met": s.met(self.figures.get(s.figure))} for s in self.slos],
            "met": self.met, "figures": self.figures, "max_rate_scale": self.max_rate_scale,
            "replays": self.replays, "search": self.search,
        }


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
         progress: Callable[[str], None] | None = None) -> PlanResult:
    """Smallest GPU count and best configuration meeting every SLO (see the module docstring)."""
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
    ev = Evaluator(base, tuple(seeds), task, workers)
    grid = SweepSpec(axis_values, tuple(seeds), task).configurations()
    failed_at: dict[int, int] = {}   # config -> largest GPU count at which it missed an SLO
    headroom: dict[int, tuple[float, float, float]] = {}
    search: list[dict[str, Any]] = []

    def at(g: int, idx: list[int]) -> list[dict[str, Any]]:
        return [{**grid[i], "gpus": g} for i in idx]

    def feasible(g: int, full: bool) -> tuple[bool, list[int]]:
        """Replay candidates at g (all, or in order of headroom until one meets every SLO)."""
        # Dominance: what misses an SLO with g' GPUs misses it with fewer, so skip it for g <= g'.
        candidates = [i for i in range(len(grid)) if failed_at.get(i, 0) < g]
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
                (passed if all(s.met(figs.get(s.figure)) for s in slos) else failed).append(i)
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
        figs = ev.evaluate(at(max_gpus, list(range(len(grid)))))
        best = min(range(len(grid)), key=lambda i: score(slos, figs[i]))
        return PlanResult(max_gpus, at(max_gpus, [best])[0], list(slos), False, _report(figs[best], slos),
                          None, ev.replays, search)
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
    return PlanResult(hi, config, list(slos), True, _report(figs_of[best], slos), max_rate, ev.replays, search)


def group_of(figure: str) -> str:
    """The summary group a flattened figure belongs to: ``tasks.infobench`` or ``overall``."""
    return "overall" if figure.startswith("overall.") else ".".join(figure.split(".")[:2])


def _report(figs: Mapping[str, float], slos: Sequence[SLO]) -> dict[str, float | None]:
    groups = dict.fromkeys([group_of(s.figure) for s in slos] + ["overall"])
    keys = [s.figure for s in slos] + ["overall.latency.mean", "overall.latency.p95", "overall.latency.p99",
                                       "overall.timed_out", "makespan_s"]
    keys += [f"{g}.{count}" for g in groups for count in ("prompts", "unfinished")]
    return {k: figs.get(k) for k in dict.fromkeys(keys)}


def meets(ev: Evaluator, config: Mapping[str, Any], slos: Sequence[SLO], rate: float) -> bool:
    figs = ev.evaluate([{**config, "rate_scale": rate}])[0]
    return all(s.met(figs.get(s.figure)) for s in slos)


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


__all__ = ["AXES", "PlanError", "PlanResult", "SLO", "load_points", "parse_slo", "plan"]
