"""What every trace reader shares: reading JSON, checking fields, times, ids and order.

Readers collect one :class:`CallRecord` per record of the file, then :func:`build_trace`
normalises the times, checks ids, sorts the calls and warns about what it repaired. Every
problem is a :class:`TraceError` naming the file, the record (its 0-based position in the
file's list of calls) and the field.
"""

from __future__ import annotations

import contextlib
import json
import math
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from simulator import inputs
from simulator.errors import SimctlWarning, TraceError
from simulator.trace.model import MAX_TOKENS, Call, Prompt, Trace

#: Times at or above this many seconds are absolute epochs (2001-09-09 onwards) and are
#: normalised so the trace starts at 0.
EPOCH_THRESHOLD = 1e9


def readable(path: str | Path) -> contextlib.AbstractContextManager[Path]:
    """Turn the errors of reading ``path`` as UTF-8 text into one-line :class:`TraceError`."""
    return inputs.readable(path, TraceError, "trace file")


def read_json(path: str | Path, raw: bytes | None = None) -> Any:
    """The parsed JSON content of ``path`` (whose bytes are ``raw`` when read already);
    :class:`TraceError` if unreadable or not JSON."""
    if raw is None:
        raw = inputs.read_bytes(path, TraceError, "trace file")
    text = inputs.decode_text(raw, path, TraceError)
    if not text.strip():
        raise TraceError(path, None, None, "empty file (expected a JSON list of calls)")
    return inputs.parse_json(text, path, TraceError)


def show(value: Any, limit: int = 60) -> str:
    """``value`` as it would appear in the JSON file, on one line and cut at ``limit`` chars."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def type_name(value: Any) -> str:
    """The JSON name of ``value``'s type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def is_int(value: Any) -> bool:
    """A JSON integer (``bool`` is not a number here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A JSON number (``bool`` is not a number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


#: The largest token count a trace may give: counts are held as 32-bit integers (see
#: :class:`simulator.trace.model.TraceColumns`).
MAX_COUNT = MAX_TOKENS


def check_count(path: Path, record: int | None, field: str, value: Any, minimum: int) -> int:
    """An integer token count ``>= minimum`` (and at most :data:`MAX_COUNT`), else
    :class:`TraceError`."""
    if not is_int(value) or value < minimum:
        raise TraceError(path, record, field, f"must be an integer >= {minimum}, got {show(value)}")
    if value > MAX_COUNT:
        raise TraceError(path, record, field, f"is too large (at most {MAX_COUNT:,}), got {show(value)}")
    return int(value)


def check_task(path: Path, record: int, field: str, value: Any) -> str:
    """A non-empty task name without control characters, else :class:`TraceError`."""
    if not isinstance(value, str) or not value.strip():
        raise TraceError(path, record, field, f"must be a non-empty task name, got {show(value)}")
    if why := inputs.control_character(value):
        raise TraceError(path, record, field, f"task name {show(value)} {why}")
    return value


def one_of(path: Path, record: int, obj: dict, keys: tuple[str, ...]) -> str | None:
    """Which of the synonym ``keys`` ``obj`` has (``None`` if none); two at once is an error."""
    present = [k for k in keys if k in obj]
    if len(present) > 1:
        names = ", ".join(f"'{k}'" for k in present)
        raise TraceError(path, record, present[1], f"give only one of {names} (they are synonyms)")
    return present[0] if present else None


def parse_time(path: Path, record: int, field: str, value: Any) -> tuple[float, bool]:
    """``(seconds, is_iso)`` of an arrival time: a number ``>= 0`` or an ISO-8601 string.

    ISO-8601 strings are parsed with :meth:`datetime.fromisoformat` (a time without an
    offset is taken as UTC) and returned as epoch seconds.
    """
    if is_number(value):
        try:
            t = float(value)
        except OverflowError:  # an integer past any float
            raise TraceError(path, record, field, f"is too large for a time in seconds, got {show(value)}") from None
        if math.isfinite(t) and t >= 0:
            return t, False
        raise TraceError(path, record, field, f"must be a non-negative number, got {show(value)}")
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value.strip())
        except ValueError:
            raise TraceError(
                path, record, field,
                f"must be a non-negative number or an ISO-8601 time, got {show(value)}",
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        try:
            return when.astimezone(UTC).timestamp(), True
        except (ValueError, OverflowError):  # before year 1 once in UTC
            raise TraceError(path, record, field, f"is out of the range of times in UTC, got {show(value)}") from None
    raise TraceError(path, record, field, f"must be a non-negative number, got {show(value)}")


@dataclass(frozen=True)
class CallRecord:
    """One call as read from a file, before time normalisation and sorting."""

    record: int
    id: str
    t: float
    is_iso: bool
    time_field: str
    prompts: tuple[Prompt, ...]


class UnknownFields:
    """Collects fields a reader ignored, to warn once per file."""

    def __init__(self) -> None:
        self.names: dict[str, None] = {}
        self.first: int | None = None

    def note(self, record: int, obj: dict, known: Iterable[str], prefix: str = "") -> None:
        """Remember the keys of ``obj`` outside ``known``."""
        known = set(known)
        for key in obj:
            if key not in known:
                self.names.setdefault(f"{prefix}{key}", None)
                if self.first is None:
                    self.first = record

    def warn(self, path: Path) -> None:
        """Issue one :class:`SimctlWarning` if any field was ignored."""
        if self.names:
            names = ", ".join(f"'{n}'" for n in list(self.names)[:5])
            more = f" and {len(self.names) - 5} more" if len(self.names) > 5 else ""
            warnings.warn(SimctlWarning(
                f"{path}: ignored unknown field(s) {names}{more} (first at record {self.first})"
            ), stacklevel=4)


def build_trace(
    path: Path,
    records: list[CallRecord],
    meta: dict[str, Any],
    id_field: str,
    prefix_block_tokens: int = 0,
) -> Trace:
    """The :class:`Trace` of ``records``: times normalised, ids checked, calls sorted.

    * No records: :class:`TraceError` ("no calls").
    * ISO-8601 and numeric times mixed: :class:`TraceError` at the first record that
      differs from record 0.
    * ISO-8601 times, or numeric times whose smallest is ``>= 1e9`` (absolute epoch
      seconds): the smallest is subtracted from all and kept in ``meta["epoch_start"]``
      (ISO times also keep ``meta["epoch_start_iso"]``).
    * A call id seen before: :class:`TraceError` on ``id_field``.
    * Calls out of time order: sorted stably by time, with a :class:`SimctlWarning`
      naming the first record that is earlier than its predecessor.

    ``prefix_block_tokens``: the tokens per hash block of the prompts' ``prefix`` ids.
    """
    if not records:
        raise TraceError(path, None, None, "no calls (the trace is empty)")
    meta = dict(meta)
    first_iso = records[0].is_iso
    for rec in records:
        if rec.is_iso != first_iso:
            kinds = ("ISO-8601 times", "numbers of seconds")
            a, b = kinds if first_iso else kinds[::-1]
            raise TraceError(
                path, rec.record, rec.time_field,
                f"mixes {b} with {a} (record {records[0].record} is {a[:-1]})",
            )
    times = np.array([rec.t for rec in records], dtype=float)
    start = float(times.min())
    if first_iso or start >= EPOCH_THRESHOLD:
        times = times - start
        meta["epoch_start"] = start
        if first_iso:
            meta["epoch_start_iso"] = datetime.fromtimestamp(start, UTC).isoformat()

    seen: dict[str, int] = {}
    for rec in records:
        if rec.id in seen:
            raise TraceError(
                path, rec.record, id_field,
                f"duplicate call id {show(rec.id)} (first used by record {seen[rec.id]})",
            )
        seen[rec.id] = rec.record

    calls = [Call(rec.id, float(t), rec.prompts) for rec, t in zip(records, times, strict=True)]
    out_of_order = np.flatnonzero(np.diff(times) < 0)
    if out_of_order.size:
        first = records[int(out_of_order[0]) + 1].record
        order = np.argsort(times, kind="stable")
        calls = [calls[i] for i in order]
        warnings.warn(SimctlWarning(
            f"{path}: calls not sorted by time; sorted them stably (first out of order: "
            f"record {first})"
        ), stacklevel=3)
    return Trace(calls=tuple(calls), meta=meta, source=str(path), prefix_block_tokens=prefix_block_tokens)


def json_default(value: Any) -> Any:
    """``json.dump`` fallback for numpy scalars and arrays, paths and other objects in meta."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)
