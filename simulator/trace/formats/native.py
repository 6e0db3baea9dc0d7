"""simctl's own trace format, ``simctl-trace/1`` (JSON).

The file is either a bare list of calls or the wrapped form the writer produces::

    {"format": "simctl-trace/1",
     "prefix_block_tokens": 512,
     "meta": {...free-form provenance...},
     "calls": [
        {"id": "0", "t": 3.09, "prompts": [
            {"task": "mmlu", "prompt_tokens": 190, "max_tokens": 2048, "hash_ids": [0, 1]},
            "graph"]},
        ...]}

A call is ``{"id": str (optional; default its index in the list, as a string), "t":
seconds, "prompts": [prompt, ...]}``; ``timestamp``, ``arrival_time`` and ``time`` are
synonyms of ``t``. A prompt is ``{"task": str, "prompt_tokens": int >= 0 (optional),
"max_tokens": int >= 1 (optional), "text": str (optional), "hash_ids": [int >= 0, ...]
(optional)}``, with ``task_type`` and ``type`` synonyms of ``task``, or a bare string, which
is the task name. ``null`` token counts mean "absent".

``hash_ids`` are the prompt's prefix identity: the hash ids of its blocks of
``prefix_block_tokens`` tokens, chained along the prompt (:attr:`Prompt.prefix`; ``null``
or ``[]``: none). ``prefix_block_tokens`` (an integer >= 1) is a key of the wrapped form,
required when any prompt has ``hash_ids`` (a bare list cannot carry them).

Times are seconds ``>= 0`` or ISO-8601 strings; absolute times (ISO, or numbers whose
smallest is ``>= 1e9``) are shifted to start at 0, the original start kept in
``meta["epoch_start"]``. See :func:`simulator.trace.formats._common.build_trace`.
"""

from __future__ import annotations

import io
import json
import os
import stat
from itertools import chain
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any

import msgspec
import numpy as np

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
from simulator.trace.formats.native_scan import AFTER_ID, AFTER_TIME, ID_HEAD, PROMPTS_HEAD, SHORT_FIELD, T_HEAD
from simulator.trace.model import MAX_HASH, PROMPT_INT, Prompt, Trace, TraceColumns, id_column

if TYPE_CHECKING:
    pass

FORMAT_NAME = "simctl-trace/1"
TIME_KEYS = ("t", "timestamp", "arrival_time", "time")
TASK_KEYS = ("task", "task_type", "type")
_CALL_KEYS = ("id", "prompts", *TIME_KEYS)
_PROMPT_KEYS = ("prompt_tokens", "max_tokens", "text", "hash_ids", *TASK_KEYS)
#: In the bytes of a file or a block: where it is absent, no prompt has ids (nothing to look for).
_HASH_KEY = b'"hash_ids"'



# The canonical form of the format (what write_native writes), as typed records that
# msgspec decodes and checks in one pass: read_native_fast. Anything else (synonyms, ISO
# times, integer ids, unknown fields, unsorted calls, any invalid value) is left to
# read_native, which accepts what the format allows and names what is wrong.
_Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
_Positive = Annotated[int, msgspec.Meta(ge=1, le=MAX_COUNT)]
_Hash = Annotated[int, msgspec.Meta(ge=0, le=MAX_HASH)]


class _Prompt(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    task: str
    prompt_tokens: _Count | None = None
    max_tokens: _Positive | None = None
    text: str | None = None
    hash_ids: list[_Hash] | None = None


class _Call(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    t: Annotated[float, msgspec.Meta(ge=0)]
    prompts: Annotated[list[str | _Prompt], msgspec.Meta(min_length=1)]
    # (absent, not null: a null id is an error the general reader names)
    id: Annotated[str, msgspec.Meta(min_length=1)] | msgspec.UnsetType = msgspec.UNSET


class _File(msgspec.Struct):
    calls: list[_Call]
    format: str = FORMAT_NAME
    meta: dict[str, Any] = {}
    prefix_block_tokens: _Positive | None = None


_DECODER = msgspec.json.Decoder(list[_Call] | _File)
_CALLS = msgspec.json.Decoder(list[_Call])
_HEADER = msgspec.json.Decoder(_File)
#: Bytes read at a time when a file is read a block of lines at a time (some 13,000 calls:
#: a block's temporaries are several times its bytes, and a larger block reads no faster).
BLOCK_BYTES = 1 << 20
#: The most header (format and meta) a file read a block at a time may have.
MAX_HEADER_BYTES = 1 << 24


class _ColumnBlocks:
    """Columns made from decoded calls, a block at a time (task codes shared by all blocks)."""

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}
        self.blocks: list[tuple[np.ndarray, ...]] = []
        self.texts: list[tuple[int, Any]] = []  # (first prompt, texts) of blocks with any
        self.prefixes: list[tuple[int, np.ndarray, np.ndarray]] = []  # (first prompt, ids per prompt, ids)
        self.n_calls = 0
        self.n_prompts = 0
        #: the ids as integers (their bytes) while every block's ids fit 8 bytes of ASCII
        self.id_keys: list[np.ndarray] | None = []

    def add(self, calls: list[_Call], hash_ids: bool = False) -> None:
        """Add decoded ``calls`` (``hash_ids``: whether any prompt may have them; where
        ``False`` they are not looked for)."""
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
            if hash_ids:
                lengths = np.zeros(n, dtype=np.int64)
                lengths[at] = np.fromiter((len(p.hash_ids or ()) for p in records), dtype=np.int64,
                                          count=len(records))
                ids = np.fromiter(chain.from_iterable(p.hash_ids for p in records if p.hash_ids), dtype=np.int64,
                                  count=int(lengths.sum()))
                if ids.size:
                    self.prefixes.append((self.n_prompts, lengths, ids))
        self.blocks.append((call_t, call_ids, sizes, task_of, prompt_tokens, max_tokens))
        self.id_keys = None
        self.n_calls += n_calls
        self.n_prompts += n

    def add_columns(self, call_t: np.ndarray, call_ids: np.ndarray, sizes: np.ndarray, task_names: tuple[str, ...],
                    task_of: np.ndarray, prompt_tokens: np.ndarray, max_tokens: np.ndarray,
                    texts: np.ndarray | None, id_keys: np.ndarray | None) -> None:
        """Add a block already in columns (its task codes index its own ``task_names``; its
        ``call_ids`` may be ASCII bytes (``S`` arrays); ``id_keys``: its ids as integers,
        distinct exactly where the ids are, or ``None``)."""
        if self.id_keys is not None and id_keys is not None:
            self.id_keys.append(id_keys)
        else:
            self.id_keys = None
        codes = self.codes
        recode = np.array([codes.setdefault(name, len(codes)) for name in task_names], dtype=PROMPT_INT)
        if texts is not None:
            self.texts.append((self.n_prompts, texts))
        self.blocks.append((call_t, call_ids, sizes, recode[task_of] if len(recode) else task_of,
                            prompt_tokens, max_tokens))
        self.n_calls += len(call_t)
        self.n_prompts += len(task_of)

    def trace(self, meta: dict[str, Any], path: str | Path, prefix_block_tokens: int | None = None) -> Trace | None:
        """The trace of the calls added, or ``None`` where the general reader must look
        (no calls, unsorted times, a repeated id, a blank task name or one holding a control
        character, block hash ids without ``prefix_block_tokens``)."""
        if self.prefixes and prefix_block_tokens is None:
            return None
        if not self.n_calls or any(not name.strip() or control_character(name) for name in self.codes):
            return None
        # column by column, each one's blocks freed once joined: the trace's columns, not
        # twice them, at the peak
        parts: list[Any] = list(zip(*self.blocks, strict=True))
        self.blocks.clear()
        for i, part in enumerate(parts):
            parts[i] = None
            if i == 1:  # the ids: bytes joined and made text at once (per block, the text is made twice)
                as_text = np.dtypes.StringDType()
                if any(ids.dtype.kind != "S" for ids in part):
                    part = [ids.astype(as_text) for ids in part]
                parts[i] = np.concatenate(part).astype(as_text, copy=False)
            else:
                parts[i] = np.concatenate(part)
            del part
        call_t, call_ids, sizes, task_of, prompt_tokens, max_tokens = parts
        del parts
        if not np.isfinite(call_t).all() or (np.diff(call_t) < 0).any():
            return None
        if self.id_keys is not None:
            keys = np.sort(np.concatenate(self.id_keys))
            if (keys[1:] == keys[:-1]).any():
                return None
        else:
            import pandas as pd  # (a hash table: ids of any text)

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
        prefix: dict[str, Any] = {}
        if self.prefixes:
            lengths = np.zeros(self.n_prompts, dtype=np.int64)
            for first, block, _ in self.prefixes:
                lengths[first:first + len(block)] = block
            offsets = np.zeros(self.n_prompts + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            prefix = {"prefix_offsets": offsets, "prefix_hashes": np.concatenate([ids for _, _, ids in self.prefixes]),
                      "prefix_block_tokens": prefix_block_tokens}
        columns = TraceColumns.of_sizes(call_t=call_t, call_ids=call_ids, sizes=sizes, task_names=tuple(self.codes),
                                        task_of=task_of, prompt_tokens=prompt_tokens, max_tokens=max_tokens,
                                        texts=texts, **prefix)
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
    block_tokens = None
    if isinstance(decoded, _File):
        if decoded.format != FORMAT_NAME:
            return None
        meta.update(decoded.meta)
        calls = decoded.calls
        block_tokens = decoded.prefix_block_tokens
    else:
        calls = decoded
    blocks = _ColumnBlocks()
    blocks.add(calls, hash_ids=_HASH_KEY in raw)
    return blocks.trace(meta, path, block_tokens)


def read_native_lines(handle: IO[bytes], path: str | Path) -> Trace | None:
    """The trace in the open file ``handle`` when it is laid out as :func:`write_native`
    writes it (one call a line) and valid, read :data:`BLOCK_BYTES` at a time, so that
    neither the file nor its decoded calls are held whole; ``None`` for any other layout or
    content (then :func:`read_native_fast` or :func:`read_native` reads it).

    Each block's lines are taken apart at once (:func:`_split_lines`): their fields are found
    in one compiled pass over the bytes where the extension is usable, else by array
    operations (:func:`_line_fields`); the ids and times are converted as columns, and each
    distinct ``prompts`` list is decoded once, so no Python object is made per call. A block whose
    lines are not exactly the writer's is decoded whole by msgspec instead."""
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
    fd = _file_of(handle)
    if fd is not None:
        added = _add_file_blocks(blocks, fd, handle.tell())
        if added is not None:  # (None: read below, as a stream)
            return blocks.trace(dict(head.meta), path, head.prefix_block_tokens) if added else None
    held = b""     # whole lines not yet read into columns
    partial = b""  # the start of a line whose end is not read yet
    pieces: list[bytes] = []  # (a long line's reads, joined once its end is read: no quadratic copying)
    while data := handle.read(BLOCK_BYTES):
        if b"\n" not in data:
            pieces.append(data)
            continue
        buffer = b"".join([partial, *pieces, data])
        pieces.clear()
        cut = buffer.rfind(b"\n") + 1
        # A block is read only once the file is known to go on well past it: the closing
        # lines ("  ]", "}") are then never in it.
        if held and len(buffer) >= _TAIL_BYTES:
            if not _add_block(blocks, held, last=False):
                return None
            held = b""
        held, partial = held + buffer[:cut], buffer[cut:]
    tail = b"".join([held, partial, *pieces]).rstrip(b" \t\r\n")
    if not tail.endswith(_CLOSE):
        return None
    calls = tail[:len(tail) - len(_CLOSE) + 1]
    if calls and (calls[-1:] != b"\n" or not _add_block(blocks, calls, last=True)):
        return None
    return blocks.trace(dict(head.meta), path, head.prefix_block_tokens)


#: The end of the file as the writer writes it (after the last call's line; whitespace may follow).
_CLOSE = b"\n  ]\n}"
#: How far past a block the file must go before the block is read (the closing lines and
#: trailing whitespace fit in it).
_TAIL_BYTES = 64


def _file_of(handle: IO[bytes]) -> int | None:
    """The descriptor of the regular file ``handle`` reads; ``None`` for anything else (a
    pipe, an in-memory file), or where the platform has no positioned reads into buffers
    (``os.preadv``: Windows, older macOS), which is then read a block at a time through ``handle``."""
    if not hasattr(os, "preadv"):
        return None
    try:
        fd = handle.fileno()
        return fd if stat.S_ISREG(os.fstat(fd).st_mode) else None
    except (OSError, ValueError, io.UnsupportedOperation):
        return None


#: The most of the file's end :func:`_add_file_blocks` reads to find the closing lines (more
#: whitespace after them leaves the file to the block-at-a-time read).
_TAIL_LOOK = 1 << 16


def _add_file_blocks(blocks: _ColumnBlocks, fd: int, start: int) -> bool | None:
    """Add the call lines of the regular file ``fd``, from byte ``start`` (just after the
    ``"calls": [`` line) to the closing lines, as :func:`read_native_lines` adds those it
    reads; ``False`` where the file does not end as the writer ends it, a block is not
    valid calls, or the file changed size while read; ``None`` where the whitespace after
    the closing lines fills the :data:`_TAIL_LOOK` bytes read to find them.

    The end is found first, from the file's last bytes; then the lines are read, about
    :data:`BLOCK_BYTES` of whole lines at a time, into one buffer, each block a view of it and
    the part line after a block moved to its start (reading into fresh bytes, joining them and
    cutting at the last newline, as the stream is read, touches three new bytes of memory for
    each byte of the file)."""
    end = os.fstat(fd).st_size
    look = min(end - start, _TAIL_LOOK)
    tail = os.pread(fd, look, end - look)
    body = tail.rstrip(b" \t\r\n")
    if len(body) < len(_CLOSE) and look == _TAIL_LOOK:
        return None
    if not body.endswith(_CLOSE):
        return False
    calls_end = end - (len(tail) - len(body)) - len(_CLOSE) + 1  # (the last call line's newline included)
    buffer = bytearray(BLOCK_BYTES)
    view = memoryview(buffer)
    try:
        at, carried = start, 0  # the file offset of the buffer's start; the part line there
        while at + carried < calls_end:
            wanted = min(len(buffer) - carried, calls_end - at - carried)
            if os.preadv(fd, [view[carried:carried + wanted]], at + carried) != wanted:
                return False  # (cut short while read)
            filled = carried + wanted
            last = at + filled == calls_end
            cut = filled if last else buffer.rfind(b"\n", 0, filled) + 1
            if cut == 0:  # a line longer than the buffer: a buffer twice as long
                view.release()
                buffer.extend(bytes(len(buffer)))
                view = memoryview(buffer)
                carried = filled
                continue
            if not _add_block(blocks, view[:cut], last):
                return False
            carried = filled - cut
            buffer[:carried] = buffer[cut:filled]
            at += cut
    finally:
        view.release()
    return True


def _add_block(blocks: _ColumnBlocks, lines: bytes | memoryview, last: bool) -> bool:
    """Add the calls of ``lines`` (whole lines, each ending in a newline; every call line but
    the file's last ends in a comma) to ``blocks``; ``False`` where they are not valid calls."""
    columns = _split_lines(lines, last)
    if columns is not None:
        blocks.add_columns(*columns)
        return True
    lines = bytes(lines)  # (a view of the reading buffer: msgspec and the checks below take bytes)
    body = lines.rstrip()
    if last == body.endswith(b","):
        return False
    try:
        blocks.add(_CALLS.decode(b"[" + (body if last else body[:-1]) + b"]"), hash_ids=_HASH_KEY in lines)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return False
    return True


#: A block's times, as one JSON list: each a JSON number (RFC 8259), as :data:`_Call` reads a time.
_TIMES = msgspec.json.Decoder(list[float])
_PROMPT_LIST = msgspec.json.Decoder(Annotated[list[str | _Prompt], msgspec.Meta(min_length=1)])


def _words(lines: bytes | memoryview) -> np.ndarray:
    """Every 8 bytes of ``lines`` as one little-endian integer, one per byte offset (a view:
    element ``i`` is bytes ``i`` to ``i + 7``), so that comparing 8 bytes at n offsets is one
    gather of n integers."""
    return np.ndarray(shape=(max(len(lines) - 7, 0),), dtype="<u8", buffer=lines, strides=(1,))


def _matches(words: np.ndarray, at: np.ndarray, expected: bytes) -> bool:
    """Whether ``expected`` (8 to 16 bytes) is in the bytes at every offset of ``at``."""
    head = int.from_bytes(expected[:8], "little")
    tail_at = len(expected) - 8
    tail = int.from_bytes(expected[tail_at:], "little")
    return bool((words[at] == head).all() and (words[at + tail_at] == tail).all())


_ONES = np.uint64(0x0101010101010101)
_HIGHS = np.uint64(0x8080808080808080)


def _find(words: np.ndarray, start: np.ndarray, byte: int) -> np.ndarray | None:
    """The offset of the first ``byte`` at or after each of ``start``, looked for 8 bytes at
    a time (a byte equal to ``byte`` is a zero byte of ``word ^ pattern``; the lowest set
    bit of the classic zero-byte test marks the first); ``None`` when one is not within
    :data:`SHORT_FIELD` bytes or the block's end."""
    pattern = _ONES * np.uint64(byte)
    found = np.full(len(start), -1, dtype=np.int64)
    pending = np.arange(len(start))
    for k in range(0, SHORT_FIELD, 8):
        at = start[pending] + k
        if at.size and at.max() >= len(words):
            return None
        x = words[at] ^ pattern
        zero = (x - _ONES) & ~x & _HIGHS
        hit = zero != 0
        low = zero[hit] & (~zero[hit] + np.uint64(1))
        found[pending[hit]] = at[hit] + (np.frexp(low.astype(np.float64))[1] - 1) // 8
        pending = pending[~hit]
        if not pending.size:
            return found
    return None


def _gather(buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bytes of ``buf[start[i]:end[i]]`` for every ``i``, one after another, and their offsets."""
    lengths = end - start
    offsets = np.zeros(len(start) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    index = np.arange(int(offsets[-1]), dtype=np.int64) + np.repeat(start - offsets[:-1], lengths)
    return buf[index], offsets


#: The multiplier of :func:`_distinct`'s polynomial hash (odd: every power is odd, none zero).
_HASH_BASE = np.uint64(0x100000001B3)


def _distinct(data: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The distinct byte strings among ``data[offsets[i]:offsets[i + 1]]`` (each at least a
    byte): each string's number, numbered in order of first appearance, and the index of
    each number's first string; ``None`` if two different strings share a hash (then the
    caller leaves the block to msgspec). A wrapping 64-bit polynomial hash per string, one
    sort of the hashes, and every string compared byte for byte with its number's first."""
    lengths = np.diff(offsets)
    if (lengths == lengths[0]).all():
        rows = data.reshape(len(lengths), int(lengths[0]))
        if (rows == rows[0]).all():  # one list (a trace of one task and no lengths): no hashing
            return np.zeros(len(lengths), dtype=np.int64), np.zeros(1, dtype=np.int64)
    starts = offsets[:-1]
    position = np.arange(len(data), dtype=np.int64) - np.repeat(starts, lengths)
    powers = np.cumprod(np.full(int(lengths.max(initial=1)), _HASH_BASE, dtype=np.uint64))
    with np.errstate(over="ignore"):
        hashes = np.add.reduceat(data.astype(np.uint64) * powers[position], starts) ^ lengths.astype(np.uint64)
    _, first, code = np.unique(hashes, return_index=True, return_inverse=True)
    appearance = np.argsort(first, kind="stable")  # numbers in order of first appearance
    number = np.empty_like(appearance)
    number[appearance] = np.arange(len(appearance))
    which = number[code.ravel()]
    firsts = first[appearance]
    rep = firsts[which]
    if (lengths[rep] != lengths).any() or (data[np.repeat(starts[rep], lengths) + position] != data).any():
        return None
    return which, firsts


def _line_fields(lines: bytes | memoryview, last: bool) -> tuple[Any, ...] | None:
    """The fields of the call lines in ``lines`` as :func:`~simulator.trace.formats.native_scan.scan_call_lines`
    gives them (``(id_start, id_end, times, prompts, prompt_offsets, same)``), or ``None``
    where a line is not as the writer writes a call: by the extension's compiled pass where it
    is usable, else by array operations over the whole block (the times then converted by
    msgspec, as one JSON list)."""
    from simulator.model.compiled import extension

    module = extension()
    if module is not None:
        ok, id_start, id_end, times, p_bytes, p_offsets, same = module.scan_call_lines(
            np.frombuffer(lines, dtype=np.uint8), last)
        return (id_start, id_end, times, p_bytes, p_offsets, same) if ok else None
    return _line_fields_by_arrays(lines, last)


def _line_fields_by_arrays(lines: bytes | memoryview, last: bool) -> tuple[Any, ...] | None:
    """:func:`_line_fields` by array operations (the same checks, in several passes)."""
    buf = np.frombuffer(lines, dtype=np.uint8)
    ends = np.flatnonzero(buf == 10)
    if not ends.size or (buf < 32).sum() != ends.size or (buf == 127).any():
        return None  # (a tab, a carriage return or a control character is not the writer's)
    starts = np.concatenate(([0], ends[:-1] + 1))
    words = _words(lines)
    if ((ends - starts) < AFTER_ID).any() or not _matches(words, starts, ID_HEAD):
        return None
    id_start = starts + len(ID_HEAD)
    id_end = _find(words, id_start, ord('"'))
    if id_end is None or (id_end <= id_start).any() or (id_end + AFTER_ID > ends).any() \
            or not _matches(words, id_end, T_HEAD):
        return None
    t_start = id_end + len(T_HEAD)
    t_end = _find(words, t_start, ord(","))
    if t_end is None or (t_end + AFTER_TIME > ends).any() or not _matches(words, t_end, PROMPTS_HEAD):
        return None
    closing = ends - 2  # the call's "}": each line ends "},", the file's last call's "}" alone
    if last:
        closing[-1] += 1
    commas_after = closing[:-1] if last else closing
    if (buf[closing] != ord("}")).any() or (buf[commas_after + 1] != ord(",")).any():
        return None
    gathered, _ = _gather(buf, id_start, id_end)
    if ((gathered == ord("\\")) | (gathered > 127)).any():
        return None
    # the times with the comma after each, the last comma made the list's end: one JSON list,
    # read as the typed reader reads a time (a JSON number, nothing else)
    t_bytes, _ = _gather(buf, t_start, t_end + 1)
    t_bytes[-1] = ord("]")
    try:
        times = np.array(_TIMES.decode(b"[" + t_bytes.tobytes()), dtype=np.float64)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return None
    p_bytes, p_offsets = _gather(buf, t_end + len(PROMPTS_HEAD) - 1, closing)  # (from each list's "[")
    return id_start, id_end, times, p_bytes, p_offsets, False


def _split_lines(lines: bytes | memoryview, last: bool) -> tuple[Any, ...] | None:
    """The columns of ``lines`` when every one is exactly as :func:`write_native` writes a
    call (``    {"id": "ID", "t": NUMBER, "prompts": [...]},``) with an id of printable ASCII
    and no escape; ``None`` otherwise (then msgspec decodes the block, and names nothing:
    the general reader does).

    The structure around the fields is checked byte for byte, the time against JSON's
    number grammar, and each distinct prompts list is decoded by msgspec as the typed reader
    decodes it: what is accepted here is what :func:`read_native_fast` accepts."""
    fields = _line_fields(lines, last)
    if fields is None:
        return None
    id_start, id_end, call_t, p_bytes, p_offsets, same = fields
    # (the key can only be in a list of prompts: an id ends at its first quote)
    if _HASH_KEY in p_bytes.tobytes():
        return None  # (prompts with ids are all distinct: decoding each distinct list would gain nothing)
    # ids: printable ASCII without a backslash (an escape: both passes reject one), so their
    # bytes are the id itself
    lengths = id_end - id_start
    width = int(lengths.max())
    if width <= 8:  # (one word each: the id's bytes, the rest zeroed)
        keep = np.where(lengths == 8, ~np.uint64(0), (np.uint64(1) << (8 * lengths).astype(np.uint64)) - np.uint64(1))
        id_words = _words(lines)[id_start] & keep
        call_ids = id_words.view("S8")  # (made text with every block's at once: see _ColumnBlocks.trace)
        id_keys = id_words
    else:
        id_keys = None
        gathered, _ = _gather(np.frombuffer(lines, dtype=np.uint8), id_start, id_end)
        padded = np.zeros((len(id_start), width), dtype=np.uint8)
        padded[np.arange(width)[None, :] < lengths[:, None]] = gathered
        call_ids = padded.view(f"S{width}").ravel()
    if len(call_t) != len(id_start) or not (call_t >= 0).all():
        return None
    distinct = (np.zeros(len(id_start), dtype=np.int64), np.zeros(1, dtype=np.int64)) if same \
        else _distinct(p_bytes, p_offsets)
    if distinct is None:
        return None
    which, firsts = distinct
    names: dict[str, int] = {}
    u_size: list[int] = []
    u_task: list[int] = []
    u_pt: list[int] = []
    u_mt: list[int] = []
    u_text: list[str | None] = []
    for f in firsts:
        raw = p_bytes[p_offsets[f]:p_offsets[f + 1]].tobytes()
        try:
            prompts = _PROMPT_LIST.decode(raw)
        except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
            return None
        u_size.append(len(prompts))
        for p in prompts:
            if isinstance(p, str):
                u_task.append(names.setdefault(p, len(names)))
                u_pt.append(-1)
                u_mt.append(0)
                u_text.append(None)
            else:
                u_task.append(names.setdefault(p.task, len(names)))
                u_pt.append(-1 if p.prompt_tokens is None else p.prompt_tokens)
                u_mt.append(p.max_tokens or 0)
                u_text.append(p.text)
    n_calls = len(id_start)
    if len(firsts) == 1:  # every call's list the same (a trace of one kind of call): each column that list, repeated
        sizes = np.full(n_calls, u_size[0], dtype=np.int64)

        def column(values: list, dtype: Any) -> np.ndarray:
            return np.full(n_calls, values[0], dtype=dtype) if len(values) == 1 else np.tile(np.array(values, dtype), n_calls)
    else:
        size_of = np.array(u_size, dtype=np.int64)
        first_of = np.cumsum(size_of) - size_of
        sizes = size_of[which]
        if (sizes == 1).all():
            index = first_of[which]
        else:
            index = np.repeat(first_of[which] - (np.cumsum(sizes) - sizes), sizes) + np.arange(int(sizes.sum()))

        def column(values: list, dtype: Any) -> np.ndarray:
            return np.array(values, dtype=dtype)[index]
    texts = column(u_text, object) if any(x is not None for x in u_text) else None
    return (call_t, call_ids, sizes, tuple(names), column(u_task, PROMPT_INT), column(u_pt, PROMPT_INT),
            column(u_mt, PROMPT_INT), texts, id_keys)


def read_native(obj: Any, path: str | Path) -> Trace:
    """The :class:`Trace` of parsed JSON ``obj`` read from ``path`` (used in messages).

    Raises :class:`TraceError` for any invalid record; warns (:class:`SimctlWarning`)
    about unsorted calls and ignored fields.
    """
    path = Path(path)
    meta: dict[str, Any] = {}
    block_tokens = 0
    wrapped = isinstance(obj, dict)
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
        if obj.get("prefix_block_tokens") is not None:
            block_tokens = check_count(path, None, "prefix_block_tokens", obj["prefix_block_tokens"], 1)
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
    if not block_tokens:
        with_ids = next((rec.record for rec in records if any(p.prefix for p in rec.prompts)), None)
        if with_ids is not None:
            how = ("the wrapped form gives it at its top level; a bare list of calls cannot" if not wrapped
                   else "give the tokens per hash block at the file's top level, an integer >= 1")
            raise TraceError(path, None, "prefix_block_tokens", f"missing, and record {with_ids} has hash_ids ({how})")
    return build_trace(path, records, meta, id_field="id", prefix_block_tokens=block_tokens)


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
    hash_ids = p.get("hash_ids")
    if hash_ids is not None:
        if not isinstance(hash_ids, list):
            raise TraceError(path, i, f"{where}.hash_ids",
                             f"must be a list of block hash ids (integers >= 0), got {show(hash_ids)}")
        for k, h in enumerate(hash_ids):
            if not is_int(h) or not 0 <= h <= MAX_HASH:
                shown = f"an integer of {len(str(h))} digits" if is_int(h) and h > MAX_HASH else show(h)
                raise TraceError(path, i, f"{where}.hash_ids[{k}]",
                                 f"must be an integer from 0 to {MAX_HASH:,}, got {shown}")
    return Prompt(task, prompt_tokens, max_tokens, text, tuple(hash_ids) if hash_ids else None)


def write_native(trace: Trace, handle: IO[str]) -> None:
    """Write ``trace`` to ``handle`` in the wrapped ``simctl-trace/1`` form, one call a line
    (with ``prefix_block_tokens`` and each prompt's ``hash_ids`` where it has prefix ids).

    ``meta`` is written as given, except its ``format`` key (which records the format the
    trace was read from). Token counts and texts that are ``None`` are left out.
    """
    meta = {k: v for k, v in trace.meta.items() if k != "format"}
    handle.write("{\n")
    handle.write(f'  "format": "{FORMAT_NAME}",\n')
    if trace.has_prefixes:
        handle.write(f'  "prefix_block_tokens": {trace.prefix_block_tokens},\n')
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
            if p.prefix:
                entry["hash_ids"] = p.prefix
            prompts.append(entry)
        record = {"id": call.id, "t": call.t, "prompts": prompts}
        handle.write(("\n    " if n == 0 else ",\n    ") + _dumps(record))
    handle.write("\n  ]\n}\n")


def _dumps(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, indent=indent, default=json_default, allow_nan=True)
