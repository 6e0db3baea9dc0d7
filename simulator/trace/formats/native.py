"""simctl's own trace format, ``simctl-trace/1`` (JSON).

The file is either a bare list of calls or the wrapped form the writer produces::

    {"format": "simctl-trace/1",
     "meta": {...free-form provenance...},
     "calls": [
        {"id": "0", "t": 3.09, "prompts": [
            {"task": "mmlu", "prompt_tokens": 190, "max_tokens": 2048},
            "graph"]},
        ...]}

A call is ``{"id": str (optional; default its index in the list, as a string), "t":
seconds, "prompts": [prompt, ...]}``; ``timestamp``, ``arrival_time`` and ``time`` are
synonyms of ``t``. A prompt is ``{"task": str, "prompt_tokens": int >= 0 (optional),
"max_tokens": int >= 1 (optional), "text": str (optional)}``, with ``task_type`` and
``type`` synonyms of ``task``, or a bare string, which is the task name. ``null`` token
counts mean "absent".

Times are seconds ``>= 0`` or ISO-8601 strings; absolute times (ISO, or numbers whose
smallest is ``>= 1e9``) are shifted to start at 0, the original start kept in
``meta["epoch_start"]``. See :func:`simulator.trace.formats._common.build_trace`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Annotated, Any

import msgspec
import numpy as np
import pandas as pd

from simulator.errors import TraceError
from simulator.inputs import control_character
from simulator.trace.formats._common import (
    EPOCH_THRESHOLD,
    MAX_COUNT,
    CallRecord,
    UnknownFields,
    build_trace,
    check_count,
    check_task,
    is_int,
    json_default,
    one_of,
    parse_time,
    show,
    type_name,
)
from simulator.trace.model import PROMPT_INT, Prompt, Trace, TraceColumns, id_column

FORMAT_NAME = "simctl-trace/1"
TIME_KEYS = ("t", "timestamp", "arrival_time", "time")
TASK_KEYS = ("task", "task_type", "type")
_CALL_KEYS = ("id", "prompts", *TIME_KEYS)
_PROMPT_KEYS = ("prompt_tokens", "max_tokens", "text", *TASK_KEYS)


# The canonical form of the format (what write_native writes), as typed records that
# msgspec decodes and checks in one pass: read_native_fast. Anything else (synonyms, ISO
# times, integer ids, unknown fields, unsorted calls, any invalid value) is left to
# read_native, which accepts what the format allows and names what is wrong.
_Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
_Positive = Annotated[int, msgspec.Meta(ge=1, le=MAX_COUNT)]


class _Prompt(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    task: str
    prompt_tokens: _Count | None = None
    max_tokens: _Positive | None = None
    text: str | None = None


class _Call(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    t: Annotated[float, msgspec.Meta(ge=0)]
    prompts: Annotated[list[str | _Prompt], msgspec.Meta(min_length=1)]
    # (absent, not null: a null id is an error the general reader names)
    id: Annotated[str, msgspec.Meta(min_length=1)] | msgspec.UnsetType = msgspec.UNSET


class _File(msgspec.Struct):
    calls: list[_Call]
    format: str = FORMAT_NAME
    meta: dict[str, Any] = {}


_DECODER = msgspec.json.Decoder(list[_Call] | _File)
_CALLS = msgspec.json.Decoder(list[_Call])
_HEADER = msgspec.json.Decoder(_File)
#: Calls decoded at a time when a file is read a block of lines at a time.
BLOCK_CALLS = 20_000
#: The most header (format and meta) a file read a block at a time may have.
MAX_HEADER_BYTES = 1 << 24


class _ColumnBlocks:
    """Columns made from decoded calls, a block at a time (task codes shared by all blocks)."""

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}
        self.blocks: list[tuple[np.ndarray, ...]] = []
        self.texts: list[tuple[int, list[str | None]]] = []  # (first prompt, texts) of blocks with any
        self.n_calls = 0
        self.n_prompts = 0

    def add(self, calls: list[_Call]) -> None:
        n_calls = len(calls)
        first = self.n_calls
        call_t = np.fromiter((c.t for c in calls), dtype=float, count=n_calls)
        call_ids = id_column([str(first + i) if c.id is msgspec.UNSET else c.id for i, c in enumerate(calls)])
        sizes = np.fromiter((len(c.prompts) for c in calls), dtype=np.int64, count=n_calls)
        prompts = [p for c in calls for p in c.prompts]
        n = len(prompts)
        codes = self.codes
        task_of = np.fromiter((codes.setdefault(p if p.__class__ is str else p.task, len(codes))  # type: ignore[union-attr]
                               for p in prompts), dtype=PROMPT_INT, count=n)
        records = [p for p in prompts if p.__class__ is _Prompt]
        prompt_tokens = np.full(n, -1, dtype=PROMPT_INT)
        max_tokens = np.zeros(n, dtype=PROMPT_INT)
        if records:
            at = np.fromiter((i for i, p in enumerate(prompts) if p.__class__ is _Prompt), dtype=np.int64,
                             count=len(records))
            prompt_tokens[at] = np.fromiter((-1 if p.prompt_tokens is None else p.prompt_tokens for p in records),
                                            dtype=PROMPT_INT, count=len(records))
            max_tokens[at] = np.fromiter((p.max_tokens or 0 for p in records), dtype=PROMPT_INT, count=len(records))
            if any(p.text is not None for p in records):
                self.texts.append((self.n_prompts, [None if p.__class__ is str else p.text  # type: ignore[union-attr]
                                                    for p in prompts]))
        self.blocks.append((call_t, call_ids, sizes, task_of, prompt_tokens, max_tokens))
        self.n_calls += n_calls
        self.n_prompts += n

    def trace(self, meta: dict[str, Any], path: str | Path) -> Trace | None:
        """The trace of the calls added, or ``None`` where the general reader must look
        (no calls, unsorted times, a repeated id, a blank task name or one holding a control
        character)."""
        if not self.n_calls or any(not name.strip() or control_character(name) for name in self.codes):
            return None
        call_t, call_ids, sizes, task_of, prompt_tokens, max_tokens = (
            np.concatenate(part) for part in zip(*self.blocks, strict=True))
        self.blocks.clear()
        if not np.isfinite(call_t).all() or (np.diff(call_t) < 0).any():
            return None
        if pd.Series(call_ids).duplicated().any():
            return None
        meta = {**meta, "format": "native"}
        start = float(call_t.min())
        if start >= EPOCH_THRESHOLD:
            call_t = call_t - start
            meta["epoch_start"] = start
        texts = None
        if self.texts:
            texts = np.full(self.n_prompts, None, dtype=object)
            for first, block in self.texts:
                texts[first:first + len(block)] = block
        columns = TraceColumns.of_sizes(call_t=call_t, call_ids=call_ids, sizes=sizes, task_names=tuple(self.codes),
                                        task_of=task_of, prompt_tokens=prompt_tokens, max_tokens=max_tokens,
                                        texts=texts)
        return Trace(columns=columns, meta=meta, source=str(path))


def read_native_fast(raw: bytes, path: str | Path) -> Trace | None:
    """The trace in ``raw`` (the bytes of ``path``) when it is in the canonical form of the
    format, sorted and valid, read straight into columns; ``None`` for anything else, which
    :func:`read_native` then reads (and reports on).

    The same trace as :func:`read_native` gives, at a tenth of the cost: no Python object per
    prompt outlives the read.
    """
    try:
        decoded = _DECODER.decode(raw)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return None  # (the general reader reports it)
    meta: dict[str, Any] = {}
    if isinstance(decoded, _File):
        if decoded.format != FORMAT_NAME:
            return None
        meta.update(decoded.meta)
        calls = decoded.calls
    else:
        calls = decoded
    blocks = _ColumnBlocks()
    blocks.add(calls)
    return blocks.trace(meta, path)


def read_native_lines(handle: IO[bytes], path: str | Path) -> Trace | None:
    """The trace in the open file ``handle`` when it is laid out as :func:`write_native`
    writes it (one call a line) and valid, decoded :data:`BLOCK_CALLS` lines at a time, so
    that neither the file nor its decoded calls are held whole; ``None`` for any other
    layout or content (then :func:`read_native_fast` or :func:`read_native` reads it)."""
    if handle.readline().rstrip() != b"{":
        return None
    header = [b"{"]
    size = 0
    for line in handle:
        if line.rstrip() == b'  "calls": [':
            break
        header.append(line)
        size += len(line)
        if size > MAX_HEADER_BYTES:
            return None
    else:
        return None
    try:
        head = _HEADER.decode(b"".join(header) + b'"calls": []}')
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return None
    if head.format != FORMAT_NAME:
        return None
    blocks = _ColumnBlocks()
    chunk: list[bytes] = []
    closed = False
    for line in handle:
        record = line.strip()
        if record == b"]":
            closed = True
            break
        chunk.append(record[:-1] if record.endswith(b",") else record)
        if len(chunk) == BLOCK_CALLS:
            if not _add_lines(blocks, chunk):
                return None
            chunk = []
    if not closed or (chunk and not _add_lines(blocks, chunk)):
        return None
    if handle.read().strip() != b"}":
        return None
    return blocks.trace(dict(head.meta), path)


def _add_lines(blocks: _ColumnBlocks, lines: list[bytes]) -> bool:
    try:
        blocks.add(_CALLS.decode(b"[" + b",".join(lines) + b"]"))
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return False
    return True


def read_native(obj: Any, path: str | Path) -> Trace:
    """The :class:`Trace` of parsed JSON ``obj`` read from ``path`` (used in messages).

    Raises :class:`TraceError` for any invalid record; warns (:class:`SimctlWarning`)
    about unsorted calls and ignored fields.
    """
    path = Path(path)
    meta: dict[str, Any] = {}
    if isinstance(obj, dict):
        fmt = obj.get("format", FORMAT_NAME)
        if fmt != FORMAT_NAME:
            raise TraceError(path, None, "format", f"unsupported format {show(fmt)} (expected {FORMAT_NAME!r})")
        if "calls" not in obj:
            raise TraceError(path, None, "calls", "missing (expected a list of calls)")
        file_meta = obj.get("meta", {})
        if not isinstance(file_meta, dict):
            raise TraceError(path, None, "meta", f"must be an object, got {type_name(file_meta)}")
        meta.update(file_meta)
        obj = obj["calls"]
        if not isinstance(obj, list):
            raise TraceError(path, None, "calls", f"must be a list of calls, got {type_name(obj)}")
    elif not isinstance(obj, list):
        raise TraceError(
            path, None, None,
            f"expected a JSON list of calls or a {FORMAT_NAME} object, got {type_name(obj)}",
        )
    meta["format"] = "native"

    unknown = UnknownFields()
    records = [_read_call(path, i, rec, unknown) for i, rec in enumerate(obj)]
    unknown.warn(path)
    return build_trace(path, records, meta, id_field="id")


def _read_call(path: Path, i: int, rec: Any, unknown: UnknownFields) -> CallRecord:
    if not isinstance(rec, dict):
        raise TraceError(path, i, None, f"must be an object with 't' and 'prompts', got {show(rec)}")
    unknown.note(i, rec, _CALL_KEYS)

    call_id = rec.get("id", str(i))
    if is_int(call_id):
        call_id = str(call_id)
    if not isinstance(call_id, str) or not call_id:
        raise TraceError(path, i, "id", f"must be a non-empty string or an integer, got {show(call_id)}")

    time_key = one_of(path, i, rec, TIME_KEYS)
    if time_key is None:
        raise TraceError(path, i, "t", "missing (give the arrival time as 't', 'timestamp', 'arrival_time' or 'time')")
    t, is_iso = parse_time(path, i, time_key, rec[time_key])

    if "prompts" not in rec:
        raise TraceError(path, i, "prompts", "missing (a call needs at least one prompt)")
    raw = rec["prompts"]
    if not isinstance(raw, list):
        raise TraceError(path, i, "prompts", f"must be a list of prompts, got {type_name(raw)}")
    if not raw:
        raise TraceError(path, i, "prompts", "is empty (a call needs at least one prompt)")
    prompts = tuple(_read_prompt(path, i, j, p, unknown) for j, p in enumerate(raw))
    return CallRecord(i, call_id, t, is_iso, time_key, prompts)


def _read_prompt(path: Path, i: int, j: int, p: Any, unknown: UnknownFields) -> Prompt:
    where = f"prompts[{j}]"
    if isinstance(p, str):
        return Prompt(check_task(path, i, where, p))
    if not isinstance(p, dict):
        raise TraceError(path, i, where, f"must be a task name or an object with 'task', got {show(p)}")
    unknown.note(i, p, _PROMPT_KEYS, prefix="prompts[].")
    task_key = one_of(path, i, p, TASK_KEYS)
    if task_key is None:
        raise TraceError(path, i, f"{where}.task", "missing (give the prompt's task as 'task')")
    task = check_task(path, i, f"{where}.{task_key}", p[task_key])
    prompt_tokens = p.get("prompt_tokens")
    if prompt_tokens is not None:
        prompt_tokens = check_count(path, i, f"{where}.prompt_tokens", prompt_tokens, 0)
    max_tokens = p.get("max_tokens")
    if max_tokens is not None:
        max_tokens = check_count(path, i, f"{where}.max_tokens", max_tokens, 1)
    text = p.get("text")
    if text is not None and not isinstance(text, str):
        raise TraceError(path, i, f"{where}.text", f"must be a string, got {type_name(text)}")
    return Prompt(task, prompt_tokens, max_tokens, text)


def write_native(trace: Trace, handle: IO[str]) -> None:
    """Write ``trace`` to ``handle`` in the wrapped ``simctl-trace/1`` form, one call a line.

    ``meta`` is written as given, except its ``format`` key (which records the format the
    trace was read from). Token counts and texts that are ``None`` are left out.
    """
    meta = {k: v for k, v in trace.meta.items() if k != "format"}
    handle.write("{\n")
    handle.write(f'  "format": "{FORMAT_NAME}",\n')
    handle.write('  "meta": ' + _dumps(meta, indent=2).replace("\n", "\n  ") + ",\n")
    handle.write('  "calls": [')
    for n, call in enumerate(trace.calls):
        prompts = []
        for p in call.prompts:
            entry: dict[str, Any] = {"task": p.task}
            if p.prompt_tokens is not None:
                entry["prompt_tokens"] = p.prompt_tokens
            if p.max_tokens is not None:
                entry["max_tokens"] = p.max_tokens
            if p.text is not None:
                entry["text"] = p.text
            prompts.append(entry)
        record = {"id": call.id, "t": call.t, "prompts": prompts}
        handle.write(("\n    " if n == 0 else ",\n    ") + _dumps(record))
    handle.write("\n  ]\n}\n")


def _dumps(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, indent=indent, default=json_default, allow_nan=True)
