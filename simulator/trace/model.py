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
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from simulator.errors import TraceError


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


#: The integer type of the per-prompt columns, and the largest token count a trace may give.
PROMPT_INT = np.dtype(np.int32)
MAX_TOKENS = int(np.iinfo(PROMPT_INT).max)


@dataclass(frozen=True)
class TraceColumns:
    """A trace as numpy columns: one entry per call, or per prompt in trace order.

    Absent token counts are ``-1`` (prompt tokens) and ``0`` (max tokens), as a replay reads
    them: the task's default applies. ``texts`` holds the prompts' texts (``None`` where a
    prompt has none), or is ``None`` when no prompt has one.

    The per-prompt integers are 32-bit (:data:`PROMPT_INT`): a trace holds fewer than 2**31
    prompts, and token counts are at most 2**31 − 1 (the readers refuse larger ones); the
    columns of a large trace are then 4 bytes a value instead of 8. Sums of them are taken
    in 64 bits (numpy's default for ``sum``)."""

    call_t: np.ndarray         # float64, per call
    call_ids: np.ndarray       # text (numpy StringDType: no Python object per id), per call
    call_of: np.ndarray        # int32, per prompt: its call
    prompt_index: np.ndarray   # int32, per prompt: its position in its call
    task_names: tuple[str, ...]  # in order of first appearance
    task_of: np.ndarray        # int32, per prompt: index into task_names
    prompt_tokens: np.ndarray  # int32, -1: absent
    max_tokens: np.ndarray     # int32, 0: absent
    texts: np.ndarray | None = None  # object, per prompt

    def __post_init__(self) -> None:
        for name in ("call_of", "prompt_index", "task_of", "prompt_tokens", "max_tokens"):
            values = getattr(self, name)
            if values.dtype != PROMPT_INT:  # (readers that made 64-bit columns: one copy)
                object.__setattr__(self, name, np.asarray(values).astype(PROMPT_INT))

    @classmethod
    def of_calls(cls, calls: tuple[Call, ...]) -> TraceColumns:
        """The columns of ``calls``."""
        sizes = np.fromiter((len(c.prompts) for c in calls), dtype=np.int64, count=len(calls))
        n = int(sizes.sum())
        codes: dict[str, int] = {}
        task_of = np.fromiter((codes.setdefault(p.task, len(codes)) for c in calls for p in c.prompts),
                              dtype=PROMPT_INT, count=n)
        prompt_tokens = np.fromiter((-1 if p.prompt_tokens is None else p.prompt_tokens
                                     for c in calls for p in c.prompts), dtype=np.int64, count=n)
        max_tokens = np.fromiter((p.max_tokens or 0 for c in calls for p in c.prompts), dtype=np.int64, count=n)
        too_large = (prompt_tokens > MAX_TOKENS) | (max_tokens > MAX_TOKENS)
        if too_large.any():  # (a Trace made in code; the readers refuse these with the record)
            raise TraceError(None, int(np.argmax(too_large)), "tokens", f"token counts are at most {MAX_TOKENS:,}")
        texts = None
        if any(p.text is not None for c in calls for p in c.prompts):
            texts = np.empty(n, dtype=object)
            texts[:] = [p.text for c in calls for p in c.prompts]
        call_ids = id_column([c.id for c in calls])
        return cls.of_sizes(
            call_t=np.fromiter((c.t for c in calls), dtype=float, count=len(calls)), call_ids=call_ids, sizes=sizes,
            task_names=tuple(codes), task_of=task_of, prompt_tokens=prompt_tokens, max_tokens=max_tokens, texts=texts)

    @classmethod
    def of_sizes(cls, call_t: np.ndarray, call_ids: np.ndarray, sizes: np.ndarray, task_names: tuple[str, ...],
                 task_of: np.ndarray, prompt_tokens: np.ndarray, max_tokens: np.ndarray,
                 texts: np.ndarray | None = None) -> TraceColumns:
        """The columns of calls of ``sizes`` prompts each (the per-prompt columns in trace order)."""
        n = len(task_of)
        starts = np.cumsum(sizes) - sizes
        return cls(call_t=call_t, call_ids=call_ids,
                   call_of=np.repeat(np.arange(len(call_t), dtype=PROMPT_INT), sizes),
                   prompt_index=(np.arange(n, dtype=PROMPT_INT) - np.repeat(starts.astype(PROMPT_INT), sizes)),
                   task_names=task_names, task_of=task_of, prompt_tokens=prompt_tokens, max_tokens=max_tokens,
                   texts=texts)

    def calls(self) -> tuple[Call, ...]:
        """The calls these columns hold."""
        names = self.task_names
        texts = self.texts.tolist() if self.texts is not None else [None] * len(self.task_of)
        prompts = [Prompt(names[k], None if pt < 0 else pt, mt or None, text)
                   for k, pt, mt, text in zip(self.task_of.tolist(), self.prompt_tokens.tolist(),
                                              self.max_tokens.tolist(), texts, strict=True)]
        ends = np.cumsum(np.bincount(self.call_of, minlength=len(self.call_t))).tolist()
        starts = [0, *ends[:-1]]
        return tuple(Call(i, t, tuple(prompts[a:b]))
                     for i, t, a, b in zip(self.call_ids.tolist(), self.call_t.tolist(), starts, ends, strict=True))


def id_column(ids: list[str]) -> np.ndarray:
    """Call ids as a column: numpy's variable-width text, which holds short ids inline
    instead of as a Python object each (a million objects would stay scattered over the
    interpreter's memory long after the file that made them is read)."""
    return np.array(ids, dtype=np.dtypes.StringDType())


class Trace:
    """An arrival trace: calls sorted by arrival time (stable for equal times).

    ``meta`` carries free-form provenance (source file, generator command, format);
    ``source`` is the path the trace was read from, if any.

    A trace is held as its calls or as its columns (:class:`TraceColumns`), whichever it
    was made from; the other is computed when first asked for. A replay reads only the
    columns, so a trace read into columns never makes an object per prompt. Traces are
    immutable: the methods that change one return a new trace.
    """

    __slots__ = ("__dict__", "meta", "source")
    meta: dict[str, Any]
    source: str | None

    def __init__(self, calls: tuple[Call, ...] | None = None, meta: dict[str, Any] | None = None,
                 source: str | None = None, *, columns: TraceColumns | None = None) -> None:
        if (calls is None) == (columns is None):
            raise TypeError("give a trace its calls or its columns (exactly one)")
        if calls is not None:
            self.__dict__["calls"] = tuple(calls)
        else:
            self.__dict__["columns"] = columns
        object.__setattr__(self, "meta", {} if meta is None else meta)
        object.__setattr__(self, "source", source)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a Trace is immutable (cannot set {name!r})")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trace):
            return NotImplemented
        return (self.calls, self.meta, self.source) == (other.calls, other.meta, other.source)

    __hash__ = None  # type: ignore[assignment]  # meta is a dict: no hash, as before

    def __repr__(self) -> str:
        return f"Trace({len(self):,} calls, {self.n_prompts:,} prompts, source={self.source!r})"

    def __getstate__(self) -> dict[str, Any]:
        # Columns travel (to sweep workers) without the calls computed from them.
        held = {"columns": self.__dict__["columns"]} if "columns" in self.__dict__ else {"calls": self.calls}
        return {**held, "meta": self.meta, "source": self.source}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key in ("calls", "columns"):
            if key in state:
                self.__dict__[key] = state[key]
        object.__setattr__(self, "meta", state["meta"])
        object.__setattr__(self, "source", state["source"])

    def __len__(self) -> int:
        if "columns" in self.__dict__:
            return len(self.columns.call_t)
        return len(self.calls)

    def __iter__(self) -> Iterator[Call]:
        return iter(self.calls)

    @cached_property
    def calls(self) -> tuple[Call, ...]:
        """The calls, in time order (computed from the columns when the trace was read into them)."""
        return self.columns.calls()

    @cached_property
    def columns(self) -> TraceColumns:
        """The trace as :class:`TraceColumns` (computed once per trace object)."""
        return TraceColumns.of_calls(self.calls)

    @property
    def n_prompts(self) -> int:
        """Total number of prompts over all calls."""
        if "columns" in self.__dict__:
            return len(self.columns.task_of)
        return sum(len(c.prompts) for c in self.calls)

    @property
    def tasks(self) -> list[str]:
        """Task names in order of first appearance."""
        return list(self.columns.task_names)

    def task_counts(self) -> Counter[str]:
        """Number of prompts per task."""
        cols = self.columns
        counts = np.bincount(cols.task_of, minlength=len(cols.task_names)).tolist()
        return Counter({name: n for name, n in zip(cols.task_names, counts, strict=True) if n})

    def arrival_times(self) -> np.ndarray:
        """Arrival instants of the calls, in trace order."""
        return self.columns.call_t.copy()

    def scaled(self, rate_scale: float) -> Trace:
        """The same calls with inter-arrival times scaled by ``1 / rate_scale``.

        ``rate_scale`` 2 doubles the arrival rate (halves every gap); 0.5 halves it.
        Times are scaled about the trace start (0), so the first call moves too.
        """
        if not rate_scale > 0:
            raise ValueError(f"rate_scale must be > 0, got {rate_scale}")
        if rate_scale == 1:
            return self
        meta = dict(self.meta, rate_scale=rate_scale * float(self.meta.get("rate_scale", 1.0)))
        if "columns" in self.__dict__:
            cols = self.columns
            return Trace(columns=replace(cols, call_t=cols.call_t / rate_scale), meta=meta, source=self.source)
        calls = tuple(replace(c, t=c.t / rate_scale) for c in self.calls)
        return Trace(calls=calls, meta=meta, source=self.source)

    def head(self, n: int) -> Trace:
        """The first ``n`` calls (all of them when the trace has no more), in a trace whose
        ``meta`` records ``first_calls = n``. Its tasks are those of the calls kept."""
        if n < 0:
            raise ValueError(f"a trace's first n calls need n >= 0, got {n}")
        if n >= len(self):
            return self
        meta = dict(self.meta, first_calls=n)
        if "columns" not in self.__dict__:
            return Trace(calls=self.calls[:n], meta=meta, source=self.source)
        cols = self.columns
        m = int(np.searchsorted(cols.call_of, n))  # prompts are in call order: the first m
        task_of = cols.task_of[:m]
        codes, first = np.unique(task_of, return_index=True)
        kept = codes[np.argsort(first)]  # the kept tasks, in order of first appearance
        remap = np.zeros(len(cols.task_names), dtype=task_of.dtype)
        remap[kept] = np.arange(len(kept), dtype=task_of.dtype)
        head = TraceColumns(
            call_t=cols.call_t[:n], call_ids=cols.call_ids[:n], call_of=cols.call_of[:m],
            prompt_index=cols.prompt_index[:m], task_names=tuple(cols.task_names[k] for k in kept.tolist()),
            task_of=remap[task_of], prompt_tokens=cols.prompt_tokens[:m], max_tokens=cols.max_tokens[:m],
            texts=None if cols.texts is None else cols.texts[:m])
        return Trace(columns=head, meta=meta, source=self.source)

    def renamed(self, task_map: Mapping[str, str]) -> Trace:
        """The same calls with each task named by ``task_map`` (names it lacks are kept)."""
        if not any(t in task_map for t in self.tasks):
            return self
        meta = dict(self.meta, task_map=dict(task_map))
        cols = self.columns
        # Task names stay in order of first appearance: a name two old names map to takes
        # the place of the first of them.
        mapped = [task_map.get(t, t) for t in cols.task_names]
        names = tuple(dict.fromkeys(mapped))
        code = np.array([names.index(m) for m in mapped], dtype=np.int64)
        return Trace(columns=replace(cols, task_names=names, task_of=code[cols.task_of]), meta=meta,
                     source=self.source)

    def to_frame(self) -> pd.DataFrame:
        """One row per prompt: call_index, call_id, t, prompt_index, task, tokens."""
        cols = self.columns
        names = np.array(cols.task_names, dtype=object)
        frame = pd.DataFrame({
            "call_index": cols.call_of, "call_id": cols.call_ids[cols.call_of], "t": cols.call_t[cols.call_of],
            "prompt_index": cols.prompt_index, "task": names[cols.task_of] if len(names) else [],
            # tokens in 64 bits, as in the event log: a user sums and adds them
            "prompt_tokens": pd.arrays.IntegerArray(cols.prompt_tokens.astype(np.int64), cols.prompt_tokens < 0),
            "max_tokens": pd.arrays.IntegerArray(cols.max_tokens.astype(np.int64), cols.max_tokens <= 0),
        })
        return frame
