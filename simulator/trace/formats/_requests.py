"""What the production-trace importers share: a table of requests -> a :class:`Trace`.

Importers read their file into columns (arrival time, prompt tokens, output tokens, task;
the file line of each row), check them vectorised, and hand them to :func:`build`, which
applies the :class:`ImportOptions`: task names, a time window, grouping of requests that
arrive close together into one call, and the handling of bad rows.
"""

from __future__ import annotations

import csv
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator import inputs
from simulator.errors import SimctlWarning, TraceError
from simulator.registry import Registry
from simulator.trace.formats._common import EPOCH_THRESHOLD
from simulator.trace.model import PROMPT_INT, Trace, TraceColumns, take_prefixes

if TYPE_CHECKING:
    import pandas as pd


def read_csv_table(path: Path) -> pd.DataFrame:
    """A CSV file with a header as text columns; :class:`TraceError` naming the first line
    whose field count differs from the header's (pandas would otherwise take a longer first
    row's extra field as an index, shifting every column, or drop it)."""
    import pandas as pd

    with warnings.catch_warnings():
        warnings.simplefilter("error", pd.errors.ParserWarning)
        try:
            return inputs.read_csv(path, TraceError, "trace file", dtype=str, keep_default_na=False,
                                   skipinitialspace=True, index_col=False)
        except (pd.errors.ParserWarning, pd.errors.ParserError):
            ragged = _first_ragged_line(path)
            if ragged is None:
                raise
            line, fields, expected = ragged
            raise TraceError(path, f"line {line}", None, f"has {fields} fields; the header has {expected}") from None


def read_csv_columns(path: Path, types: Mapping[str, str]) -> dict[str, np.ndarray] | None:
    """The named columns of a CSV file parsed at once by pyarrow (``types``: column -> ``int``,
    ``float``, ``timestamp`` (as int64 nanoseconds) or ``text`` (as task codes and names)), when every
    row holds a value of its column's type and no text has the leading blanks
    :func:`read_csv_table` strips; ``None`` otherwise, and the caller reads the file with
    :func:`read_csv_table` to name the first bad row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arrow = {"int": pa.int64(), "float": pa.float64(), "timestamp": pa.timestamp("ns"), "text": pa.string()}
    try:
        table = inputs.read_csv_arrow(path, TraceError, "trace file", {c: arrow[k] for c, k in types.items()})
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if any(c not in table.column_names for c in types) or table.num_rows == 0:
        return None
    out: dict[str, Any] = {}
    for name, kind in types.items():
        column = table.column(name)
        if column.null_count or column.type != arrow[kind]:
            return None
        if kind == "text":
            if pc.any(pc.match_substring_regex(column, r"^\s|^$")).as_py():
                return None
            coded = column.dictionary_encode().combine_chunks()  # codes in order of first appearance
            out[name] = (tuple(coded.dictionary.to_pylist()), coded.indices.to_numpy())
        elif kind == "timestamp":
            out[name] = column.cast(pa.int64()).to_numpy()
        else:
            out[name] = column.to_numpy()
    return out


def _first_ragged_line(path: Path) -> tuple[int, int, int] | None:
    """(line, fields, header's fields) of the first row whose field count is not the header's."""
    with inputs.open_text(path, TraceError, "trace file", newline="") as fh:
        rows = csv.reader(fh)
        header = next(rows, None)
        if header is None:
            return None
        for row in rows:
            if row and len(row) != len(header):
                return rows.line_num, len(row), len(header)
    return None


@dataclass(frozen=True)
class Importer:
    """A production trace format: how to tell its files (from their first non-empty line)
    and how to read one."""

    looks_like: Callable[[str], bool]
    read: Callable[..., Trace]  # (path, ImportOptions) -> Trace


#: Production trace formats by name (what ``simctl import`` and ``--format`` accept), in the
#: order :func:`~simulator.trace.formats.sniff` tries them. A format is one module that
#: registers its :class:`Importer`, imported by :mod:`simulator.trace.formats`.
TRACE_IMPORTERS: Registry[Importer] = Registry("trace format")


@dataclass(frozen=True)
class ImportOptions:
    """How a production trace becomes a simctl trace.

    * ``task``: every request gets this task (default: the format's own naming, see each
      importer); ``task_map``: rename source names (a BurstGPT model, a file's default) to tasks;
    * ``start`` / ``end``: keep requests arriving in ``[start, end)`` seconds after the
      trace's first request, shifted so the window starts at 0;
    * ``group_gap``: a request arriving within ``group_gap`` seconds of the first request of
      the current call joins it (up to ``max_prompts`` prompts); default: one call each;
    * ``skip_bad``: skip malformed rows (counted in a warning) instead of stopping at the first;
    * ``include_failed``: keep BurstGPT's failed requests (zero response tokens), excluded by default;
    * ``seed``, ``dataset``: ServeGen only (arrivals are synthesised; the length PDFs file).
    """

    task: str | None = None
    task_map: Mapping[str, str] = field(default_factory=dict)
    start: float | None = None
    end: float | None = None
    group_gap: float | None = None
    max_prompts: int = 8
    skip_bad: bool = False
    include_failed: bool = False
    seed: int = 0
    dataset: str | None = None


DEFAULT_OPTIONS = ImportOptions()


def bad_rows(path: Path, lines: np.ndarray, bad: np.ndarray, reasons: list[tuple[np.ndarray, str | None, str]],
             options: ImportOptions) -> np.ndarray:
    """Rows to keep. ``reasons``: (mask, field, message) in check order. Without ``skip_bad``
    the first bad row (by line) raises a :class:`TraceError` naming line and field."""
    if not bad.any():
        return ~bad
    first = int(np.flatnonzero(bad)[0])
    field_name, message = next((f, m) for mask, f, m in reasons if mask[first])
    if not options.skip_bad:
        raise TraceError(path, f"line {int(lines[first])}", field_name,
                         f"{message} (use --skip-bad to skip bad rows)")
    warnings.warn(SimctlWarning(
        f"{path}: skipped {int(bad.sum())} bad row(s) (first: line {int(lines[first])}, "
        f"field '{field_name}': {message})"), stacklevel=3)
    return ~bad


def build(path: Path, t: np.ndarray, prompt_tokens: np.ndarray | None, max_tokens: np.ndarray | None,
          tasks: np.ndarray | tuple[tuple[str, ...], np.ndarray], lines: np.ndarray, meta: dict[str, Any],
          options: ImportOptions, prefix: tuple[np.ndarray, np.ndarray, int] | None = None) -> Trace:
    """The trace of request columns (already valid), with ``options`` applied, as
    :class:`TraceColumns` made by array operations (no object per request).

    ``tasks``: a task name per request, or (names, an index into them per request) where
    the reader has them coded already. A call's id is the file line of its first request.
    ``prefix``: the requests' block hash ids as (offsets, hashes, tokens per block), laid
    out as :class:`TraceColumns` holds them; they travel with their requests."""
    import pandas as pd

    if t.size == 0:
        raise TraceError(path, None, None, "no requests (the trace is empty)")
    t = np.asarray(t, dtype=float)
    if isinstance(tasks, tuple):
        names, codes = tasks
    else:
        codes_, uniques = pd.factorize(tasks, sort=False)  # codes in order of first appearance
        names, codes = tuple(uniques.tolist()), codes_
    codes = np.asarray(codes, dtype=PROMPT_INT)
    meta = dict(meta)
    offsets, hashes, block_tokens = (None, None, 0) if prefix is None else prefix
    origin = float(t.min())
    if origin >= EPOCH_THRESHOLD or meta.pop("absolute", False):
        meta["epoch_start"] = origin
    t = t - origin
    if np.any(t[1:] < t[:-1]):
        order = np.argsort(t, kind="stable")  # equal times keep file order
        meta["resorted"] = True
        t, lines, codes = t[order], lines[order], codes[order]
        prompt_tokens = None if prompt_tokens is None else prompt_tokens[order]
        max_tokens = None if max_tokens is None else max_tokens[order]
        offsets, hashes = take_prefixes(offsets, hashes, order)

    if options.start is not None or options.end is not None:
        lo = options.start or 0.0
        hi = np.inf if options.end is None else options.end
        if hi <= lo:
            raise TraceError(path, None, "window", f"--end ({hi:g}) must be after --start ({lo:g})")
        keep = (t >= lo) & (t < hi)
        if not keep.any():
            raise TraceError(path, None, "window", f"no request arrives in [{lo:g}, {hi:g}) s "
                             f"(the trace spans 0 to {t.max():g} s)")
        t, lines, codes = t[keep] - lo, lines[keep], codes[keep]
        prompt_tokens = None if prompt_tokens is None else prompt_tokens[keep]
        max_tokens = None if max_tokens is None else max_tokens[keep]
        offsets, hashes = take_prefixes(offsets, hashes, np.flatnonzero(keep))
        meta["window"] = [lo, None if options.end is None else hi]

    if options.task is not None:
        names, codes = (options.task,), np.zeros(t.size, dtype=PROMPT_INT)
    else:
        # Only the tasks of the requests kept, in order of their first appearance.
        present, first = np.unique(codes, return_index=True)
        kept = present[np.argsort(first)]
        mapped = [options.task_map.get(names[k], names[k]) for k in kept.tolist()]
        new_names = tuple(dict.fromkeys(mapped))  # two names mapped to one: the first's place
        remap = np.zeros(len(names), dtype=PROMPT_INT)
        remap[kept] = [new_names.index(m) for m in mapped]
        names, codes = new_names, remap[codes]

    n = t.size
    if options.group_gap is None:
        starts = np.arange(n)
    else:
        starts = group_starts(t, options.group_gap, options.max_prompts)
        meta["group_gap"] = options.group_gap
    sizes = np.diff(np.append(starts, n))
    columns = TraceColumns.of_sizes(
        call_t=t[starts], call_ids=lines[starts].astype(np.dtypes.StringDType()), sizes=sizes, task_names=names,
        task_of=codes, prompt_tokens=np.full(n, -1, PROMPT_INT) if prompt_tokens is None else prompt_tokens,
        max_tokens=np.zeros(n, PROMPT_INT) if max_tokens is None else max_tokens,
        prefix_offsets=offsets, prefix_hashes=hashes, prefix_block_tokens=block_tokens)
    meta["requests"] = int(n)
    return Trace(columns=columns, meta=meta, source=str(path))


def group_starts(t: np.ndarray, gap: float, cap: int) -> np.ndarray:
    """The first request of each call when requests (sorted by time ``t``) are grouped: a
    request joins the current call when it arrives within ``gap`` seconds of the call's first
    request (``t[j] - t[start] <= gap``, in floating point) and the call has fewer than ``cap``
    prompts."""
    n = t.size
    # Where each request's call would end on time alone: the first later request past the
    # gap. ``t + gap`` can round across that boundary, so the candidate is corrected by the
    # exact test the definition uses (a few steps: only requests within rounding of it move).
    idx = np.arange(n)
    end = np.maximum(np.searchsorted(t, t + gap, side="right"), idx + 1)
    while True:
        back = (end > idx + 1) & (t[np.maximum(end - 1, 0)] - t > gap)
        forward = (end < n) & (t[np.minimum(end, n - 1)] - t <= gap)
        if not (back.any() or forward.any()):
            break
        end = end - back + forward
    nxt = np.minimum(end, idx + max(cap, 1)).tolist()
    # The calls chain from the first request: a walk of one step per call.
    starts, s = [], 0
    while s < n:
        starts.append(s)
        s = nxt[s]
    return np.array(starts, dtype=np.int64)
