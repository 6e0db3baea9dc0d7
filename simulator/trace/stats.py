"""The statistics of a trace that ``simctl validate`` prints.

Definitions (``n`` calls at instants ``t_0 <= ... <= t_{n-1}``, seconds from trace start):

* ``duration = t_{n-1} - t_0`` (first to last arrival); ``span = t_{n-1}`` (from 0).
* ``call_rate = n / span`` and ``prompt_rate = prompts / span`` (per second; ``None`` when
  ``span`` is 0).
* inter-arrival gaps ``g_i = t_i - t_{i-1}`` (``n - 1`` of them; ``None`` with < 2 calls):
  mean, median, min, max, ``std`` (sample standard deviation, ``ddof = 1``; 0 with one
  gap) and ``cv = std / mean`` (``None`` when the mean is 0).
* ``prompts_per_call``: ``{size: number of calls}``; ``task_counts`` / ``task_fractions``:
  prompts per task and their share of all prompts; ``tokens``: per task, the mean of
  ``prompt_tokens`` and of ``max_tokens`` over the prompts that give them.
* ``prefix`` (only where prompts carry block hash ids): the prompts with ids and their share
  of all prompts, the block ids in all and the distinct ones.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from simulator.trace.classify import UNKNOWN
from simulator.trace.model import Trace


@dataclass(frozen=True)
class GapStats:
    """Summary of the inter-arrival gaps (seconds)."""

    count: int
    mean: float
    median: float
    min: float
    max: float
    std: float
    cv: float | None


@dataclass(frozen=True)
class TaskTokens:
    """Token statistics of one task; means are ``None`` when no prompt gives the count."""

    prompt_tokens_mean: float | None
    prompt_tokens_known: int
    max_tokens_mean: float | None
    max_tokens_known: int


@dataclass(frozen=True)
class PrefixStats:
    """The prompts' prefix identity: tokens per hash block, prompts with ids (and their
    share of all prompts), block ids in all and distinct ones (the blocks a cache of
    unbounded size would hold at the end of the trace)."""

    block_tokens: int
    prompts_with_ids: int
    share: float
    blocks: int
    distinct_blocks: int


@dataclass(frozen=True)
class TraceStats:
    """What :func:`trace_stats` computes; see the module docstring for the definitions."""

    source: str | None
    format: str | None
    calls: int
    prompts: int
    first_arrival: float | None
    last_arrival: float | None
    duration: float
    span: float
    call_rate: float | None
    prompt_rate: float | None
    inter_arrival: GapStats | None
    prompts_per_call: dict[int, int]
    task_counts: dict[str, int]
    task_fractions: dict[str, float]
    tokens: dict[str, TaskTokens]
    unknown: int
    arrival_fit: dict[str, Any] | None = None
    prefix: PrefixStats | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain dicts, lists, numbers and strings (``json.dumps``-able); ``prefix`` only
        where the trace has prefix ids."""
        out = asdict(self)
        if self.prefix is None:
            del out["prefix"]
        return out


def _mean(values: list[int]) -> float | None:
    return float(np.mean(values)) if values else None


def trace_stats(trace: Trace, fit: bool = False) -> TraceStats:
    """The statistics of ``trace`` (an empty trace gives zeros and ``None``).

    ``fit``: also fit the inter-arrival distribution (:func:`simulator.trace.fit.fit_arrivals`).
    """
    t = trace.arrival_times()
    n = len(t)
    prompts = trace.n_prompts
    span = float(t[-1]) if n else 0.0
    duration = float(t[-1] - t[0]) if n else 0.0

    gaps: GapStats | None = None
    if n >= 2:
        g = np.diff(t)
        mean = float(g.mean())
        std = float(g.std(ddof=1)) if g.size > 1 else 0.0
        gaps = GapStats(
            count=int(g.size), mean=mean, median=float(np.median(g)), min=float(g.min()),
            max=float(g.max()), std=std, cv=std / mean if mean > 0 else None,
        )

    sizes = Counter(len(c.prompts) for c in trace.calls)
    counts = trace.task_counts()
    tasks = sorted(counts)
    tokens = {}
    for task in tasks:
        pt = [p.prompt_tokens for c in trace.calls for p in c.prompts
              if p.task == task and p.prompt_tokens is not None]
        mt = [p.max_tokens for c in trace.calls for p in c.prompts
              if p.task == task and p.max_tokens is not None]
        tokens[task] = TaskTokens(_mean(pt), len(pt), _mean(mt), len(mt))

    return TraceStats(
        source=trace.source,
        format=trace.meta.get("format"),
        calls=n,
        prompts=prompts,
        first_arrival=float(t[0]) if n else None,
        last_arrival=float(t[-1]) if n else None,
        duration=duration,
        span=span,
        call_rate=n / span if span > 0 else None,
        prompt_rate=prompts / span if span > 0 else None,
        inter_arrival=gaps,
        prompts_per_call=dict(sorted(sizes.items())),
        task_counts={task: counts[task] for task in tasks},
        task_fractions={task: counts[task] / prompts for task in tasks},
        tokens=tokens,
        unknown=counts.get(UNKNOWN, 0),
        arrival_fit=_fit(t) if fit else None,
        prefix=_prefix(trace),
    )


def _prefix(trace: Trace) -> PrefixStats | None:
    cols = trace.columns
    if cols.prefix_offsets is None or cols.prefix_hashes is None:
        return None
    with_ids = int((np.diff(cols.prefix_offsets) > 0).sum())
    return PrefixStats(block_tokens=cols.prefix_block_tokens, prompts_with_ids=with_ids,
                       share=with_ids / len(cols.task_of), blocks=len(cols.prefix_hashes),
                       distinct_blocks=len(np.unique(cols.prefix_hashes)))


def _fit(times: np.ndarray) -> dict[str, Any] | None:
    from simulator.trace.fit import fit_arrivals

    model = fit_arrivals(times)
    return None if model is None else model.to_dict()
