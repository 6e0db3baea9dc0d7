"""The in-memory trace: calls that arrive at instants, each carrying prompts of tasks.

A *call* is one API request; it carries one or more *prompts*, each of one *task*
(``graph``, ``mmlu``, ``infobench`` ...). Token counts are optional: where a trace does
not give them, the profile's task defaults apply when the trace is replayed.

Every reader in :mod:`simulator.trace.formats` returns a :class:`Trace`; every writer
takes one. Times are seconds from the start of the trace (absolute epochs are
normalised to start at 0 by the readers).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt of a call. ``None`` token counts mean "use the task's default"."""

    task: str
    prompt_tokens: int | None = None
    max_tokens: int | None = None
    text: str | None = None


@dataclass(frozen=True, slots=True)
class Call:
    """One API call: arrives at ``t`` seconds and completes when its last prompt does."""

    id: str
    t: float
    prompts: tuple[Prompt, ...]


@dataclass(frozen=True)
class TraceColumns:
    """A trace as numpy columns: one entry per call, or per prompt in trace order.

    Absent token counts are ``-1`` (prompt tokens) and ``0`` (max tokens), as a replay reads
    them: the task's default applies."""

    call_t: np.ndarray         # float64, per call
    call_ids: np.ndarray       # object, per call
    call_of: np.ndarray        # int64, per prompt: its call
    prompt_index: np.ndarray   # int64, per prompt: its position in its call
    task_names: tuple[str, ...]  # in order of first appearance
    task_of: np.ndarray        # int64, per prompt: index into task_names
    prompt_tokens: np.ndarray  # int64, -1: absent
    max_tokens: np.ndarray     # int64, 0: absent


@dataclass(frozen=True)
class Trace:
    """An arrival trace: calls sorted by arrival time (stable for equal times).

    ``meta`` carries free-form provenance (source file, generator command, format);
    ``source`` is the path the trace was read from, if any.
    """

    calls: tuple[Call, ...]
    meta: dict[str, Any] = field(default_factory=dict)
    source: str | None = None

    def __len__(self) -> int:
        return len(self.calls)

    def __iter__(self) -> Iterator[Call]:
        return iter(self.calls)

    @property
    def n_prompts(self) -> int:
        """Total number of prompts over all calls."""
        return sum(len(c.prompts) for c in self.calls)

    @property
    def tasks(self) -> list[str]:
        """Task names in order of first appearance."""
        return list(self.columns.task_names)

    def task_counts(self) -> Counter[str]:
        """Number of prompts per task."""
        return Counter(p.task for c in self.calls for p in c.prompts)

    def arrival_times(self) -> np.ndarray:
        """Arrival instants of the calls, in trace order."""
        return np.fromiter((c.t for c in self.calls), dtype=float, count=len(self.calls))

    @cached_property
    def columns(self) -> TraceColumns:
        """The trace as :class:`TraceColumns` (computed once per trace object)."""
        calls = self.calls
        sizes = np.fromiter((len(c.prompts) for c in calls), dtype=np.int64, count=len(calls))
        n = int(sizes.sum())
        codes: dict[str, int] = {}
        task_of = np.fromiter((codes.setdefault(p.task, len(codes)) for c in calls for p in c.prompts),
                              dtype=np.int64, count=n)
        prompt_tokens = np.fromiter((-1 if p.prompt_tokens is None else p.prompt_tokens
                                     for c in calls for p in c.prompts), dtype=np.int64, count=n)
        max_tokens = np.fromiter((p.max_tokens or 0 for c in calls for p in c.prompts), dtype=np.int64, count=n)
        starts = np.cumsum(sizes) - sizes
        return TraceColumns(
            call_t=np.fromiter((c.t for c in calls), dtype=float, count=len(calls)),
            call_ids=np.array([c.id for c in calls], dtype=object),
            call_of=np.repeat(np.arange(len(calls), dtype=np.int64), sizes),
            prompt_index=np.arange(n, dtype=np.int64) - np.repeat(starts, sizes),
            task_names=tuple(codes), task_of=task_of, prompt_tokens=prompt_tokens, max_tokens=max_tokens)

    def scaled(self, rate_scale: float) -> Trace:
        """The same calls with inter-arrival times scaled by ``1 / rate_scale``.

        ``rate_scale`` 2 doubles the arrival rate (halves every gap); 0.5 halves it.
        Times are scaled about the trace start (0), so the first call moves too.
        """
        if not rate_scale > 0:
            raise ValueError(f"rate_scale must be > 0, got {rate_scale}")
        if rate_scale == 1:
            return self
        calls = tuple(replace(c, t=c.t / rate_scale) for c in self.calls)
        meta = dict(self.meta, rate_scale=rate_scale * float(self.meta.get("rate_scale", 1.0)))
        scaled = Trace(calls=calls, meta=meta, source=self.source)
        if "columns" in self.__dict__:  # computed already: the same columns at the new times
            scaled.__dict__["columns"] = replace(self.columns, call_t=self.columns.call_t / rate_scale)
        return scaled

    def renamed(self, task_map: Mapping[str, str]) -> Trace:
        """The same calls with each task named by ``task_map`` (names it lacks are kept)."""
        if not any(t in task_map for t in self.tasks):
            return self
        calls = tuple(replace(c, prompts=tuple(replace(p, task=task_map.get(p.task, p.task)) for p in c.prompts))
                      for c in self.calls)
        return Trace(calls=calls, meta=dict(self.meta, task_map=dict(task_map)), source=self.source)

    def to_frame(self) -> pd.DataFrame:
        """One row per prompt: call_index, call_id, t, prompt_index, task, tokens."""
        rows = [
            (ci, c.id, c.t, pi, p.task, p.prompt_tokens, p.max_tokens)
            for ci, c in enumerate(self.calls)
            for pi, p in enumerate(c.prompts)
        ]
        frame = pd.DataFrame(
            rows,
            columns=[
                "call_index", "call_id", "t", "prompt_index", "task",
                "prompt_tokens", "max_tokens",
            ],
        )
        for col in ("prompt_tokens", "max_tokens"):
            frame[col] = frame[col].astype("Int64")
        return frame
