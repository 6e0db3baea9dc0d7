"""The in-memory trace: calls that arrive at instants, each carrying prompts of tasks.

A *call* is one API request; it carries one or more *prompts*, each of one *task*
(``graph``, ``mmlu``, ``infobench`` ...). Token counts are optional: where a trace does
not give them, the profile's task defaults apply when the trace is replayed.

A prompt may carry its *prefix identity*: the hash ids of its blocks of
``prefix_block_tokens`` tokens, chained along the prompt (vLLM's automatic prefix caching,
Mooncake's ``hash_ids``), so two prompts whose first k ids are equal share their first k
blocks of tokens. A trace gives one block size for all its prompts.

Every reader in :mod:`simulator.trace.formats` returns a :class:`Trace`; every writer
takes one. Times are seconds from the start of the trace (absolute epochs are
normalised to start at 0 by the readers).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from itertools import chain
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.errors import TraceError

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt of a call. ``None`` token counts mean "use the task's default".

    ``prefix``: the hash ids of the prompt's blocks in order (integers ``>= 0``; equal ids
    mean equal tokens up to that block's end), or ``None`` where the trace does not say.
    An empty tuple says nothing either: traces hold it as ``None``."""

    task: str
    prompt_tokens: int | None = None
    max_tokens: int | None = None
    text: str | None = None
    prefix: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Call:
    """One API call: arrives at ``t`` seconds and completes when its last prompt does."""

    id: str
    t: float
    prompts: tuple[Prompt, ...]


#: The integer type of the per-prompt columns, and the largest token count a trace may give.
PROMPT_INT = np.dtype(np.int32)
MAX_TOKENS = int(np.iinfo(PROMPT_INT).max)
#: The largest block hash id a trace may give (ids are held as int64).
MAX_HASH = int(np.iinfo(np.int64).max)
_NO_IDS = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class TraceColumns:
    """A trace as numpy columns: one entry per call, or per prompt in trace order.

    Absent token counts are ``-1`` (prompt tokens) and ``0`` (max tokens), as a replay reads
    them: the task's default applies. ``texts`` holds the prompts' texts (``None`` where a
    prompt has none), or is ``None`` when no prompt has one.

    The per-prompt integers are 32-bit (:data:`PROMPT_INT`): a trace holds fewer than 2**31
    prompts, and token counts are at most 2**31 − 1 (the readers refuse larger ones); the
    columns of a large trace are then 4 bytes a value instead of 8. Sums of them are taken
    in 64 bits (numpy's default for ``sum``).

    Prefix identity (see :class:`Prompt`) is two int64 columns in CSR layout: prompt ``i``'s
    block hash ids are ``prefix_hashes[prefix_offsets[i]:prefix_offsets[i + 1]]`` (none
    where the slice is empty), and ``prefix_block_tokens`` is the tokens per block. A trace
    in which no prompt has ids holds ``None``, ``None`` and ``0``: it costs nothing."""

    call_t: np.ndarray         # float64, per call
    call_ids: np.ndarray       # text (numpy StringDType: no Python object per id), per call
    call_of: np.ndarray        # int32, per prompt: its call
    prompt_index: np.ndarray   # int32, per prompt: its position in its call
    task_names: tuple[str, ...]  # in order of first appearance
    task_of: np.ndarray        # int32, per prompt: index into task_names
    prompt_tokens: np.ndarray  # int32, -1: absent
    max_tokens: np.ndarray     # int32, 0: absent
    texts: np.ndarray | None = None  # object, per prompt
    prefix_offsets: np.ndarray | None = None  # int64, n_prompts + 1
    prefix_hashes: np.ndarray | None = None   # int64, the ids of all prompts one after another
    prefix_block_tokens: int = 0              # tokens per hash block; 0: no prompt has ids

    def __post_init__(self) -> None:
        for name in ("call_of", "prompt_index", "task_of", "prompt_tokens", "max_tokens"):
            values = getattr(self, name)
            if values.dtype != PROMPT_INT:  # (readers that made 64-bit columns: one copy)
                object.__setattr__(self, name, np.asarray(values).astype(PROMPT_INT))
        offsets, hashes = self.prefix_offsets, self.prefix_hashes
        if (offsets is None) != (hashes is None):
            raise ValueError("give prefix_offsets and prefix_hashes together (or neither)")
        if offsets is None or not len(hashes):  # type: ignore[arg-type]
            # No prompt has ids (a slice without any, say): the columns of a trace without prefixes.
            for name, value in (("prefix_offsets", None), ("prefix_hashes", None), ("prefix_block_tokens", 0)):
                object.__setattr__(self, name, value)
            return
        if len(offsets) != len(self.task_of) + 1 or offsets[0] != 0 or offsets[-1] != len(hashes):  # type: ignore[arg-type]
            raise ValueError(f"prefix_offsets must run from 0 to len(prefix_hashes) over {len(self.task_of)} prompts "
                             f"(one more entry than prompts), got {len(offsets)} entries")
        if not self.prefix_block_tokens >= 1:
            raise TraceError(None, None, "prefix_block_tokens",
                             f"must be >= 1 where prompts have block hash ids, got {self.prefix_block_tokens}")
        for name in ("prefix_offsets", "prefix_hashes"):
            values = getattr(self, name)
            if values.dtype != np.int64:
                object.__setattr__(self, name, np.asarray(values).astype(np.int64))

    def one_prompt_a_call(self) -> bool:
        """Whether each call holds one prompt, prompt ``i`` of call ``i`` (production traces):
        per-prompt and per-call columns then line up as they are."""
        n = len(self.call_of)
        return n == len(self.call_t) and (n == 0 or (int(self.call_of[0]) == 0 and int(self.call_of[-1]) == n - 1
                                                     and bool((self.call_of[1:] > self.call_of[:-1]).all())))

    def prefix_of(self, i: int) -> np.ndarray:
        """Prompt ``i``'s block hash ids (int64; empty where it has none)."""
        if self.prefix_offsets is None or self.prefix_hashes is None:
            return _NO_IDS
        return self.prefix_hashes[self.prefix_offsets[i]:self.prefix_offsets[i + 1]]

    def prefix_rows(self, rows: np.ndarray) -> dict[str, Any]:
        """The prefix columns of the prompts ``rows`` (an index array, in the order given), as
        keyword arguments of :class:`TraceColumns` (or :meth:`of_sizes`)."""
        offsets, hashes = take_prefixes(self.prefix_offsets, self.prefix_hashes, rows)
        return {"prefix_offsets": offsets, "prefix_hashes": hashes, "prefix_block_tokens": self.prefix_block_tokens}

    @classmethod
    def of_calls(cls, calls: tuple[Call, ...], prefix_block_tokens: int = 0) -> TraceColumns:
        """The columns of ``calls`` (``prefix_block_tokens``: the tokens per block of their
        prompts' prefix ids; required where a prompt has ids)."""
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
        prefix: dict[str, Any] = {}
        if any(p.prefix for c in calls for p in c.prompts):
            if not prefix_block_tokens >= 1:
                raise TraceError(None, None, "prefix_block_tokens",
                                 f"must be >= 1 where prompts have block hash ids, got {prefix_block_tokens}")
            lengths = np.fromiter((len(p.prefix or ()) for c in calls for p in c.prompts), dtype=np.int64, count=n)
            offsets = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            try:
                hashes = np.fromiter(chain.from_iterable(p.prefix for c in calls for p in c.prompts if p.prefix),
                                     dtype=np.int64, count=int(offsets[-1]))
            except (OverflowError, TypeError, ValueError):
                hashes = np.full(1, -1)
            if (hashes < 0).any():
                prompts = (p for c in calls for p in c.prompts)
                first = next(i for i, p in enumerate(prompts) if p.prefix and not all(
                    isinstance(h, (int, np.integer)) and not isinstance(h, bool) and 0 <= h <= MAX_HASH
                    for h in p.prefix))
                raise TraceError(None, None, "prefix", f"prompt {first}'s block hash ids must be integers "
                                 f"from 0 to {MAX_HASH:,}")
            prefix = {"prefix_offsets": offsets, "prefix_hashes": hashes, "prefix_block_tokens": prefix_block_tokens}
        call_ids = id_column([c.id for c in calls])
        return cls.of_sizes(
            call_t=np.fromiter((c.t for c in calls), dtype=float, count=len(calls)), call_ids=call_ids, sizes=sizes,
            task_names=tuple(codes), task_of=task_of, prompt_tokens=prompt_tokens, max_tokens=max_tokens, texts=texts,
            **prefix)

    @classmethod
    def of_sizes(cls, call_t: np.ndarray, call_ids: np.ndarray, sizes: np.ndarray, task_names: tuple[str, ...],
                 task_of: np.ndarray, prompt_tokens: np.ndarray, max_tokens: np.ndarray,
                 texts: np.ndarray | None = None, prefix_offsets: np.ndarray | None = None,
                 prefix_hashes: np.ndarray | None = None, prefix_block_tokens: int = 0) -> TraceColumns:
        """The columns of calls of ``sizes`` prompts each (the per-prompt columns in trace order)."""
        n = len(task_of)
        if n == len(call_t) and bool((sizes == 1).all()):  # one prompt a call (production traces): no prompt-long temporaries
            call_of, prompt_index = np.arange(n, dtype=PROMPT_INT), np.zeros(n, dtype=PROMPT_INT)
        else:
            call_of = np.repeat(np.arange(len(call_t), dtype=PROMPT_INT), sizes)
            prompt_index = np.arange(n, dtype=PROMPT_INT)
            prompt_index -= np.repeat((np.cumsum(sizes) - sizes).astype(PROMPT_INT), sizes)
        return cls(call_t=call_t, call_ids=call_ids, call_of=call_of, prompt_index=prompt_index,
                   task_names=task_names, task_of=task_of, prompt_tokens=prompt_tokens, max_tokens=max_tokens,
                   texts=texts, prefix_offsets=prefix_offsets, prefix_hashes=prefix_hashes,
                   prefix_block_tokens=prefix_block_tokens)

    def calls(self) -> tuple[Call, ...]:
        """The calls these columns hold."""
        names = self.task_names
        n = len(self.task_of)
        texts = self.texts.tolist() if self.texts is not None else [None] * n
        prefixes: list[tuple[int, ...] | None] = [None] * n
        if self.prefix_offsets is not None and self.prefix_hashes is not None:
            hashes = self.prefix_hashes.tolist()
            bounds = self.prefix_offsets.tolist()
            prefixes = [tuple(hashes[a:b]) if b > a else None for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        prompts = [Prompt(names[k], None if pt < 0 else pt, mt or None, text, prefix)
                   for k, pt, mt, text, prefix in zip(self.task_of.tolist(), self.prompt_tokens.tolist(),
                                                      self.max_tokens.tolist(), texts, prefixes, strict=True)]
        ends = np.cumsum(np.bincount(self.call_of, minlength=len(self.call_t))).tolist()
        starts = [0, *ends[:-1]] if ends else []  # (a trace of no calls: head(0))
        return tuple(Call(i, t, tuple(prompts[a:b]))
                     for i, t, a, b in zip(self.call_ids.tolist(), self.call_t.tolist(), starts, ends, strict=True))


def take_prefixes(offsets: np.ndarray | None, hashes: np.ndarray | None,
                  rows: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The prefix columns (``offsets``, ``hashes``; see :class:`TraceColumns`) of the prompts
    ``rows`` (an index array: a selection, a reordering or both), by array operations;
    ``(None, None)`` where the prompts have none."""
    if offsets is None or hashes is None:
        return None, None
    rows = np.asarray(rows, dtype=np.int64)
    starts = offsets[rows]
    lengths = offsets[rows + 1] - starts
    new = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new[1:])
    index = np.repeat(starts - new[:-1], lengths) + np.arange(int(new[-1]), dtype=np.int64)
    return new, hashes[index]


def concat_prefixes(parts: list[tuple[int, np.ndarray | None, np.ndarray | None]]
                    ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The prefix columns of blocks of prompts one after another: ``parts`` holds each
    block's (number of prompts, offsets, hashes), offsets and hashes ``None`` where its
    prompts have no ids; ``(None, None)`` where no block has any."""
    if all(offsets is None for _, offsets, _ in parts):
        return None, None
    lengths = [np.zeros(n, dtype=np.int64) if offsets is None else np.diff(offsets) for n, offsets, _ in parts]
    new = np.zeros(sum(n for n, _, _ in parts) + 1, dtype=np.int64)
    np.cumsum(np.concatenate(lengths), out=new[1:])
    return new, np.concatenate([_NO_IDS] + [h for _, _, h in parts if h is not None])


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

    The tokens per prefix block (see :class:`Prompt`) live in the columns
    (:attr:`TraceColumns.prefix_block_tokens`); a trace made from calls whose prompts carry
    ``prefix`` ids is given it as ``prefix_block_tokens=`` (a :class:`TraceError` where it
    is missing), and :attr:`prefix_block_tokens` reads it either way.
    """

    __slots__ = ("__dict__", "_block_tokens", "meta", "source")
    meta: dict[str, Any]
    source: str | None
    _block_tokens: int

    def __init__(self, calls: tuple[Call, ...] | None = None, meta: dict[str, Any] | None = None,
                 source: str | None = None, *, columns: TraceColumns | None = None,
                 prefix_block_tokens: int = 0) -> None:
        if (calls is None) == (columns is None):
            raise TypeError("give a trace its calls or its columns (exactly one)")
        if calls is not None:
            calls = tuple(calls)
            self.__dict__["calls"] = calls
            if not any(p.prefix for c in calls for p in c.prompts):
                prefix_block_tokens = 0  # (the block size of no blocks is not kept: 0 means none)
            elif isinstance(prefix_block_tokens, bool) or not isinstance(prefix_block_tokens, int) \
                    or prefix_block_tokens < 1:
                raise TraceError(None, None, "prefix_block_tokens", "a trace whose prompts have block hash ids "
                                 f"needs the tokens per block (an integer >= 1), got {prefix_block_tokens!r}")
        else:
            assert columns is not None
            if prefix_block_tokens not in (0, columns.prefix_block_tokens):
                raise TypeError("a trace made from columns takes its prefix_block_tokens from them")
            self.__dict__["columns"] = columns
            prefix_block_tokens = columns.prefix_block_tokens
        object.__setattr__(self, "_block_tokens", int(prefix_block_tokens))
        object.__setattr__(self, "meta", {} if meta is None else meta)
        object.__setattr__(self, "source", source)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a Trace is immutable (cannot set {name!r})")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trace):
            return NotImplemented
        return ((self.calls, self.meta, self.source, self._block_tokens)
                == (other.calls, other.meta, other.source, other._block_tokens))

    __hash__ = None  # type: ignore[assignment]  # meta is a dict: no hash, as before

    def __repr__(self) -> str:
        return f"Trace({len(self):,} calls, {self.n_prompts:,} prompts, source={self.source!r})"

    def __getstate__(self) -> dict[str, Any]:
        # Columns travel (to sweep workers) without the calls computed from them.
        held = {"columns": self.__dict__["columns"]} if "columns" in self.__dict__ else {"calls": self.calls}
        return {**held, "meta": self.meta, "source": self.source, "prefix_block_tokens": self._block_tokens}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key in ("calls", "columns"):
            if key in state:
                self.__dict__[key] = state[key]
        object.__setattr__(self, "meta", state["meta"])
        object.__setattr__(self, "source", state["source"])
        object.__setattr__(self, "_block_tokens", state.get("prefix_block_tokens", 0))

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
        return TraceColumns.of_calls(self.calls, self._block_tokens)

    @property
    def prefix_block_tokens(self) -> int:
        """Tokens per prefix hash block of the prompts' ``prefix`` ids; 0 where no prompt has any."""
        return self._block_tokens

    @property
    def has_prefixes(self) -> bool:
        """Whether any prompt carries block hash ids (:attr:`Prompt.prefix`)."""
        return self._block_tokens > 0

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
        return Trace(calls=calls, meta=meta, source=self.source, prefix_block_tokens=self._block_tokens)

    def after(self, start: float) -> Trace:
        """The calls arriving at or after ``start``, shifted to start at 0 (the traffic after
        a snapshot taken ``start`` seconds into the trace), in a trace whose ``meta`` records
        ``start``."""
        if start == 0:
            return self
        calls = tuple(replace(c, t=c.t - start) for c in self.calls if c.t >= start)
        return Trace(calls=calls, meta=dict(self.meta, start=start), source=self.source,
                     prefix_block_tokens=self.prefix_block_tokens if calls else 0)

    def head(self, n: int) -> Trace:
        """The first ``n`` calls (all of them when the trace has no more), in a trace whose
        ``meta`` records ``first_calls = n``. Its tasks are those of the calls kept."""
        if n < 0:
            raise ValueError(f"a trace's first n calls need n >= 0, got {n}")
        if n >= len(self):
            return self
        meta = dict(self.meta, first_calls=n)
        if "columns" not in self.__dict__:
            return Trace(calls=self.calls[:n], meta=meta, source=self.source, prefix_block_tokens=self._block_tokens)
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
            texts=None if cols.texts is None else cols.texts[:m],
            # (the first m prompts' ids are the first offsets[m] ids: views, no copy)
            prefix_offsets=None if cols.prefix_offsets is None else cols.prefix_offsets[:m + 1],
            prefix_hashes=None if cols.prefix_offsets is None or cols.prefix_hashes is None
            else cols.prefix_hashes[:int(cols.prefix_offsets[m])],
            prefix_block_tokens=cols.prefix_block_tokens)
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
        import pandas as pd

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
