"""Mooncake (FAST'25) JSONL traces: ``{"timestamp": ms, "input_length", "output_length", "hash_ids"}``.

One request per line; ``timestamp`` is milliseconds from the trace start. ``hash_ids``
(a list of integers ``>= 0``; absent, ``null`` or empty: none) are the hash ids of the
request's prompt in blocks of :data:`BLOCK_TOKENS` tokens, chained along the prompt (equal
ids: equal tokens up to that block's end; Mooncake, FAST'25, and the trace's README): each
prompt keeps them as its prefix identity (:attr:`simulator.trace.model.Prompt.prefix`), and
``meta["prefix_blocks"]`` counts them. The task is ``mooncake`` unless ``--task`` says
otherwise.
"""

from __future__ import annotations

import json
import math
from itertools import chain
from operator import attrgetter
from pathlib import Path
from typing import Annotated, Any

import msgspec
import numpy as np

from simulator import inputs
from simulator.errors import TraceError
from simulator.trace.formats._common import MAX_COUNT
from simulator.trace.formats._requests import DEFAULT_OPTIONS, TRACE_IMPORTERS, Importer, ImportOptions, bad_rows, build
from simulator.trace.model import MAX_HASH, Trace

FIELDS = ("timestamp", "input_length", "output_length")
#: Tokens per hash block of Mooncake's traces (the trace's README: blocks of 512 tokens).
BLOCK_TOKENS = 512


def looks_like(first_line: str) -> bool:
    if not first_line.startswith("{"):
        return False
    try:
        obj = json.loads(first_line)
    except (ValueError, RecursionError):  # ValueError: JSON errors, integers of over 4300 digits
        return False
    return isinstance(obj, dict) and {"timestamp", "input_length"} <= obj.keys()


class _Request(msgspec.Struct, gc=False):
    """One line as the fast reader decodes it (other keys are ignored, as the line reader does)."""

    timestamp: int | float
    input_length: int
    output_length: int
    hash_ids: list[Annotated[int, msgspec.Meta(ge=0, le=MAX_HASH)]] | None = None


def _read_columns(path: Path, options: ImportOptions) -> Trace | None:
    """The trace when every line is a valid request and none is blank, decoded by msgspec in
    one call; ``None`` otherwise, and the line reader then names the first bad line."""
    raw = inputs.read_bytes(path, TraceError, "Mooncake trace")
    try:
        with inputs.gc_paused():
            records = msgspec.json.Decoder(_Request).decode_lines(raw)
    except msgspec.DecodeError:
        return None
    # A blank line, skipped by the decoder, would shift the line numbers that name calls.
    if not records or len(records) != raw.count(b"\n") + (not raw.endswith(b"\n")):
        return None
    try:
        t = np.fromiter(map(attrgetter("timestamp"), records), dtype=float, count=len(records))
        inp = np.fromiter(map(attrgetter("input_length"), records), dtype=np.int64, count=len(records))
        out = np.fromiter(map(attrgetter("output_length"), records), dtype=np.int64, count=len(records))
    except OverflowError:  # a number past any float or int64: the line reader names it
        return None
    if not (np.all(np.isfinite(t)) and t.min() >= 0 and t.max() <= MAX_COUNT and inp.min() >= 0
            and out.min() >= 0 and inp.max() <= MAX_COUNT and out.max() <= MAX_COUNT):
        return None
    ids = [h or () for h in map(attrgetter("hash_ids"), records)]
    n = len(records)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, ids), dtype=np.int64, count=n), out=offsets[1:])
    blocks = int(offsets[-1])
    hashes = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=blocks)
    return build(path, t / 1000.0, inp, np.maximum(out, 1), (("mooncake",), np.zeros(n, dtype=np.int64)),
                 np.arange(1, n + 1), {"format": "mooncake", "prefix_blocks": blocks}, options,
                 prefix=(offsets, hashes, BLOCK_TOKENS))


def read_mooncake(path: str | Path, options: ImportOptions = DEFAULT_OPTIONS) -> Trace:
    path = Path(path)
    fast = _read_columns(path, options)
    if fast is not None:
        return fast
    t, inp, out, lines, bad, blocks = [], [], [], [], [], 0
    ids: list[list[int]] = []
    why: list[tuple[str | None, str]] = []
    with inputs.open_text(path, TraceError, "Mooncake trace") as fh:
        for n, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            reason: tuple[str | None, str] | None = None  # (field, message); no field: the whole line
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                rec, reason = {}, (None, f"not valid JSON ({exc.msg})")
            except RecursionError:
                rec, reason = {}, (None, "not usable JSON (nested too deeply)")
            except ValueError as exc:  # an integer of more than 4300 digits
                rec, reason = {}, (None, f"not usable JSON ({str(exc).split(';')[0]})")
            if reason is None and not isinstance(rec, dict):
                rec, reason = {}, (None, "must be a JSON object")
            values = []
            for key in FIELDS:
                v = rec.get(key)
                # (an integer is compared before math.isfinite, which overflows past 1.8e308)
                if reason is None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v > MAX_COUNT
                                       or not math.isfinite(v) or (key != "timestamp" and v != int(v))):
                    shown = f"an integer of {len(str(v))} digits" if isinstance(v, int) and v > MAX_COUNT else json.dumps(v)
                    reason = (key, "missing" if v is None else f"must be a finite number >= 0, got {shown}")
                values.append(v if reason is None else 0)
            hash_ids = rec.get("hash_ids")
            if reason is None and hash_ids is not None:
                reason = _check_hash_ids(hash_ids)
            hash_ids = hash_ids or [] if reason is None else []
            blocks += len(hash_ids)
            ids.append(hash_ids)
            t.append(values[0] / 1000.0)
            inp.append(int(values[1]))
            out.append(int(values[2]))
            lines.append(n)
            bad.append(reason is not None)
            why.append(reason or ("", ""))
    lines_a, bad_a = np.array(lines), np.array(bad, dtype=bool)
    if bad_a.any():
        first = int(np.flatnonzero(bad_a)[0])
        field_name, message = why[first]
        mask = np.zeros_like(bad_a)
        mask[first] = True
        keep = bad_rows(path, lines_a, bad_a, [(mask, field_name, message), (bad_a, "", "malformed record")], options)
    else:
        keep = ~bad_a
    if not lines:
        raise TraceError(path, None, None, "no requests (the file is empty)")
    n = int(keep.sum())
    kept = [h for h, k in zip(ids, keep.tolist(), strict=True) if k]
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, kept), dtype=np.int64, count=n), out=offsets[1:])
    hashes = np.fromiter(chain.from_iterable(kept), dtype=np.int64, count=int(offsets[-1]))
    return build(path, np.array(t)[keep], np.array(inp)[keep], np.maximum(np.array(out)[keep], 1),
                 np.full(n, "mooncake", dtype=object), lines_a[keep],
                 {"format": "mooncake", "prefix_blocks": blocks}, options, prefix=(offsets, hashes, BLOCK_TOKENS))


def _check_hash_ids(hash_ids: Any) -> tuple[str, str] | None:
    """(field, message) where ``hash_ids`` is not a list of block hash ids; ``None`` where it is."""
    if not isinstance(hash_ids, list):
        return ("hash_ids", f"must be a list of block hash ids (integers >= 0), got {json.dumps(hash_ids)[:40]}")
    for k, h in enumerate(hash_ids):
        if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h <= MAX_HASH:
            shown = f"an integer of {len(str(h))} digits" if isinstance(h, int) and h > MAX_HASH else json.dumps(h)[:40]
            return ("hash_ids", f"element {k} must be an integer from 0 to {MAX_HASH:,}, got {shown}")
    return None


TRACE_IMPORTERS.register("mooncake")(Importer(looks_like, read_mooncake))
