"""simctl's columnar trace format: ``simctl-trace/1`` as a Parquet table, one row per prompt.

Columns (in trace order; the rows of a call are consecutive):

* ``call_id`` (text): the call's id on its first row, null on its other rows (a call starts
  at each row with an id);
* ``t`` (float64): the call's arrival, seconds, on its first row (null on the others);
* ``task`` (text, dictionary-encoded): the prompt's task;
* ``prompt_tokens``, ``max_tokens`` (int32, null: absent): the prompt's token counts;
* ``text`` (text, null: none; written only when a prompt has one): the prompt's text;
* ``hash_ids`` (list<int64>, null or empty: none; written only when a prompt has them): the
  prompt's block hash ids (its prefix identity, :attr:`simulator.trace.model.Prompt.prefix`).

The schema's metadata key ``simctl`` holds ``{"format": "simctl-trace/1", "meta": {...}}``,
and ``"prefix_block_tokens": int >= 1`` (the tokens per hash block) where a prompt has
``hash_ids``.
The checks are
those of the JSON format (:mod:`simulator.trace.formats.native`), and an error names the
record (the call's position in the file) and the field. Reading is column operations only:
no Python object is made per call or per prompt (except the texts, where there are any).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import IO, Any

import numpy as np

from simulator import inputs
from simulator.errors import SimctlWarning, TraceError
from simulator.trace.formats._common import EPOCH_THRESHOLD, MAX_COUNT, check_count, json_default, show
from simulator.trace.model import MAX_HASH, PROMPT_INT, Trace, TraceColumns, take_prefixes

FORMAT_NAME = "simctl-trace/1"
#: Parquet's magic number: the first (and last) four bytes of every Parquet file.
MAGIC = b"PAR1"
METADATA_KEY = b"simctl"
COLUMNS = ("call_id", "t", "task", "prompt_tokens", "max_tokens", "text", "hash_ids")


def is_parquet(head: bytes) -> bool:
    """Whether a file whose first bytes are ``head`` is a Parquet file."""
    return head[:4] == MAGIC


def write_parquet(trace: Trace, handle: IO[bytes]) -> None:
    """Write ``trace`` to the binary ``handle`` as a Parquet trace (see the module docstring).

    ``meta`` is written as given, except its ``format`` key (which records the format the
    trace was read from)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = trace.columns
    first = cols.prompt_index == 0
    ids = np.full(len(cols.call_of), None, dtype=object)
    ids[first] = cols.call_ids.astype(object)
    names = pa.array(list(cols.task_names), type=pa.string())
    data = {
        "call_id": pa.array(ids, type=pa.string()),
        "t": pa.array(cols.call_t[cols.call_of], mask=~first, type=pa.float64()),
        "task": pa.DictionaryArray.from_arrays(pa.array(cols.task_of), names),
        "prompt_tokens": pa.array(cols.prompt_tokens, mask=cols.prompt_tokens < 0, type=pa.int32()),
        "max_tokens": pa.array(cols.max_tokens, mask=cols.max_tokens <= 0, type=pa.int32()),
    }
    if cols.texts is not None:
        data["text"] = pa.array(cols.texts, type=pa.string())
    header_fields: dict[str, Any] = {"format": FORMAT_NAME}
    if cols.prefix_offsets is not None and cols.prefix_hashes is not None:
        # (64-bit offsets where the ids outnumber 32-bit ones: the same list<int64> values)
        kind = pa.LargeListArray if cols.prefix_offsets[-1] > np.iinfo(np.int32).max else pa.ListArray
        data["hash_ids"] = kind.from_arrays(pa.array(cols.prefix_offsets), pa.array(cols.prefix_hashes, pa.int64()),
                                            mask=pa.array(np.diff(cols.prefix_offsets) == 0))
        header_fields["prefix_block_tokens"] = cols.prefix_block_tokens
    meta = {k: v for k, v in trace.meta.items() if k != "format"}
    header = json.dumps({**header_fields, "meta": meta}, default=json_default, allow_nan=True)
    table = pa.table(data).replace_schema_metadata({METADATA_KEY: header.encode()})
    pq.write_table(table, handle)


def read_parquet_trace(path: str | Path) -> Trace:
    """The :class:`Trace` in the Parquet trace at ``path``.

    Raises :class:`TraceError` (file, record, field) for anything the JSON format refuses;
    warns (:class:`SimctlWarning`) about unsorted calls, which are sorted stably."""
    import pyarrow as pa
    import pyarrow.compute as pc

    path = Path(path)
    table = inputs.read_parquet(path, TraceError, "trace file")
    meta, block_tokens = _file_meta(path, table.schema.metadata or {})
    unknown = [name for name in table.column_names if name not in COLUMNS]
    if unknown:
        raise TraceError(path, None, unknown[0], f"unknown column (a Parquet trace has {', '.join(COLUMNS)})")
    for name in ("call_id", "t", "task"):
        if name not in table.column_names:
            raise TraceError(path, None, name, "missing column")
    if table.num_rows == 0:
        raise TraceError(path, None, None, "no calls (the trace is empty)")

    ids = _column(path, table, "call_id", (pa.types.is_string, pa.types.is_large_string, pa.types.is_integer))
    changed = ids.is_valid().to_numpy(zero_copy_only=False)
    if not changed[0]:
        raise TraceError(path, 0, "call_id", "missing on the first row (a call's id is on its first row)")
    firsts = np.flatnonzero(changed)
    call_of = np.cumsum(changed) - 1
    n_calls = len(firsts)
    call_ids_arrow = ids.drop_null()
    numbers = _integer_ids(call_ids_arrow)
    if numbers is not None:
        call_ids = numbers.astype(np.dtypes.StringDType())
        ascending = bool((np.diff(numbers) > 0).all())
        if not ascending and (np.diff(np.sort(numbers)) == 0).any():
            _duplicate(path, call_ids)
    else:
        call_ids = call_ids_arrow.to_numpy(zero_copy_only=False).astype(np.dtypes.StringDType())
        # arrow's lengths: numpy's str_len stops at a NUL, and "\x00" is an id JSON keeps
        empty = np.flatnonzero(pc.utf8_length(call_ids_arrow).to_numpy(zero_copy_only=False) == 0)
        if empty.size:
            raise TraceError(path, int(empty[0]), "call_id", "must be a non-empty string or an integer, got \"\"")
        if len(pc.unique(call_ids_arrow)) != n_calls:
            _duplicate(path, call_ids)

    t_col = _column(path, table, "t", (pa.types.is_floating, pa.types.is_integer))
    given = t_col.is_valid().to_numpy(zero_copy_only=False)
    if (given != changed).any():
        row = int(np.argmax(given != changed))
        raise TraceError(path, int(call_of[row]), "t", "missing (null)" if changed[row] else
                         "given on a row that is not its call's first (call_id is null there)")
    call_t = t_col.drop_null().to_numpy().astype(np.float64)
    bad = ~np.isfinite(call_t) | (call_t < 0)
    if bad.any():
        record = int(np.argmax(bad))
        raise TraceError(path, record, "t", f"must be a non-negative number, got {show(float(call_t[record]))}")

    task_col = _column(path, table, "task", (pa.types.is_string, pa.types.is_large_string, pa.types.is_dictionary))
    if not pa.types.is_dictionary(task_col.type):
        task_col = task_col.dictionary_encode()
    _no_nulls(path, task_col, "task", call_of)
    task_col = task_col.unify_dictionaries() if isinstance(task_col, pa.ChunkedArray) else task_col
    chunks = task_col.chunks if isinstance(task_col, pa.ChunkedArray) else [task_col]
    dictionary = chunks[0].dictionary if chunks else pa.array([], pa.string())
    codes = np.concatenate([c.indices.to_numpy(zero_copy_only=False) for c in chunks]).astype(np.int64)
    # Task names in order of first appearance, as the JSON readers give them.
    used, first = np.unique(codes, return_index=True)
    order = used[np.argsort(first)]
    names = [str(x) for x in dictionary.take(pa.array(order)).to_pylist()]
    remap = np.zeros(len(dictionary), dtype=np.int64)
    remap[order] = np.arange(len(order))
    task_of = remap[codes]
    for k, name in enumerate(names):
        why = None if name.strip() else f"must be a non-empty task name, got {show(name)}"
        why = why or ((c := inputs.control_character(name)) and f"task name {show(name)} {c}")
        if why:
            row = int(np.argmax(task_of == k))
            raise TraceError(path, int(call_of[row]), "task", why)

    prompt_tokens = _counts(path, table, "prompt_tokens", 0, -1, call_of)
    max_tokens = _counts(path, table, "max_tokens", 1, 0, call_of)
    texts = None
    if "text" in table.column_names:
        text_col = _column(path, table, "text", (pa.types.is_string, pa.types.is_large_string, pa.types.is_null))
        if text_col.null_count < len(text_col):
            texts = text_col.to_numpy(zero_copy_only=False).astype(object)
    offsets, hashes = _hash_ids(path, table, call_of, block_tokens)

    meta["format"] = "parquet"
    start = float(call_t.min())
    if start >= EPOCH_THRESHOLD:
        call_t = call_t - start
        meta["epoch_start"] = start
    sizes = np.diff(np.append(firsts, table.num_rows))
    if (np.diff(call_t) < 0).any():
        first_late = int(np.argmax(np.diff(call_t) < 0)) + 1
        warnings.warn(SimctlWarning(f"{path}: calls not sorted by time; sorted them stably (first out of order: "
                                    f"record {first_late})"), stacklevel=3)
        order = np.argsort(call_t, kind="stable")
        starts = firsts[order]
        sizes = sizes[order]
        new_starts = np.cumsum(sizes) - sizes
        rows = np.repeat(starts - new_starts, sizes) + np.arange(table.num_rows)
        call_t, call_ids = call_t[order], call_ids[order]
        task_of, prompt_tokens, max_tokens = task_of[rows], prompt_tokens[rows], max_tokens[rows]
        texts = None if texts is None else texts[rows]
        offsets, hashes = take_prefixes(offsets, hashes, rows)
    columns = TraceColumns.of_sizes(call_t=call_t, call_ids=call_ids, sizes=sizes, task_names=tuple(names),
                                    task_of=task_of.astype(PROMPT_INT), prompt_tokens=prompt_tokens,
                                    max_tokens=max_tokens, texts=texts, prefix_offsets=offsets, prefix_hashes=hashes,
                                    prefix_block_tokens=block_tokens if offsets is not None else 0)
    return Trace(columns=columns, meta=meta, source=str(path))


def _file_meta(path: Path, metadata: dict[bytes, bytes]) -> tuple[dict[str, Any], int]:
    """The file's ``meta`` and its tokens per hash block (0: not given)."""
    raw = metadata.get(METADATA_KEY)
    if raw is None:
        return {}, 0
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError):
        raise TraceError(path, None, "meta", "the file's simctl metadata is not JSON") from None
    if not isinstance(header, dict):
        raise TraceError(path, None, "meta", "the file's simctl metadata must be an object")
    if header.get("format", FORMAT_NAME) != FORMAT_NAME:
        raise TraceError(path, None, "format", f"unsupported format {show(header.get('format'))} "
                         f"(expected {FORMAT_NAME!r})")
    meta = header.get("meta", {})
    if not isinstance(meta, dict):
        raise TraceError(path, None, "meta", "must be an object")
    block_tokens = header.get("prefix_block_tokens")
    if block_tokens is not None:
        block_tokens = check_count(path, None, "prefix_block_tokens", block_tokens, 1)
    return dict(meta), block_tokens or 0


def _hash_ids(path: Path, table: Any, call_of: np.ndarray, block_tokens: int) -> tuple[Any, Any]:
    """The ``hash_ids`` column as prefix columns (offsets, hashes) by array operations;
    ``(None, None)`` where the file has none."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if "hash_ids" not in table.column_names:
        return None, None
    col = _column(path, table, "hash_ids", (pa.types.is_list, pa.types.is_large_list, pa.types.is_null))
    if pa.types.is_null(col.type):
        return None, None
    if not pa.types.is_integer(col.type.value_type) and not pa.types.is_null(col.type.value_type):
        raise TraceError(path, None, "hash_ids", f"column has type {col.type}; block hash ids are integers")
    lengths = pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    values = pc.list_flatten(col)  # (the values of the non-null lists only)
    if not len(values):
        return None, None
    owner = np.repeat(np.arange(len(lengths)), lengths)
    if values.null_count:
        row = int(owner[int(np.argmax(values.is_null().to_numpy(zero_copy_only=False)))])
        raise TraceError(path, int(call_of[row]), "hash_ids", "holds a null id (ids are integers >= 0)")
    hashes = values.to_numpy()
    if hashes.dtype == np.uint64:
        too_large = hashes > MAX_HASH
        if too_large.any():
            row = int(owner[int(np.argmax(too_large))])
            raise TraceError(path, int(call_of[row]), "hash_ids",
                             f"must be integers from 0 to {MAX_HASH:,}, got {int(hashes[np.argmax(too_large)])}")
    hashes = hashes.astype(np.int64)
    if (hashes < 0).any():
        at = int(np.argmax(hashes < 0))
        raise TraceError(path, int(call_of[int(owner[at])]), "hash_ids",
                         f"must be integers from 0 to {MAX_HASH:,}, got {int(hashes[at])}")
    if not block_tokens:
        raise TraceError(path, None, "prefix_block_tokens", "missing from the file's simctl metadata, and prompts "
                         "have hash_ids (give the tokens per hash block, an integer >= 1)")
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets, hashes


def _column(path: Path, table: Any, name: str, kinds: tuple[Any, ...]) -> Any:
    """Column ``name`` as one array, if its type is one of ``kinds``."""
    col = table.column(name)
    if not any(kind(col.type) for kind in kinds):
        raise TraceError(path, None, name, f"column has type {col.type}, which a trace's {name} cannot have")
    return col.combine_chunks()


def _no_nulls(path: Path, col: Any, name: str, call_of: np.ndarray) -> None:
    if col.null_count:
        row = int(np.argmax(col.is_null().to_numpy(zero_copy_only=False)))
        raise TraceError(path, int(call_of[row]), name, "missing (null)")


def _counts(path: Path, table: Any, name: str, minimum: int, absent: int, call_of: np.ndarray) -> np.ndarray:
    """A token count column as :data:`PROMPT_INT`, ``absent`` where null."""
    import pyarrow as pa

    if name not in table.column_names:
        return np.full(table.num_rows, absent, dtype=PROMPT_INT)
    col = _column(path, table, name, (pa.types.is_integer, pa.types.is_null))
    if pa.types.is_null(col.type):
        return np.full(table.num_rows, absent, dtype=PROMPT_INT)
    values = col.to_numpy(zero_copy_only=False) if col.null_count else col.to_numpy()
    null = np.isnan(values) if col.null_count else np.zeros(len(values), dtype=bool)
    filled = np.where(null, minimum, values).astype(np.int64) if col.null_count else values.astype(np.int64)
    bad = (filled < minimum) | (filled > MAX_COUNT)
    if bad.any():
        row = int(np.argmax(bad))
        value = int(filled[row])
        message = (f"must be an integer >= {minimum}, got {value}" if value < minimum
                   else f"is too large (at most {MAX_COUNT:,}), got {value}")
        raise TraceError(path, int(call_of[row]), name, message)
    return np.where(null, absent, filled).astype(PROMPT_INT)


def _integer_ids(ids: Any) -> np.ndarray | None:
    """The ids as integers when every one is an integer written as Python writes it (no
    sign but a minus, no leading zero), else ``None``: then their checks are on integers."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_integer(ids.type):
        return ids.to_numpy().astype(np.int64)
    try:
        numbers = pc.cast(ids, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if not pc.all(pc.equal(pc.cast(numbers, ids.type), ids)).as_py():
        return None
    return numbers.to_numpy()


def _duplicate(path: Path, call_ids: np.ndarray) -> None:
    import pandas as pd

    repeated = pd.Series(call_ids.astype(object)).duplicated()
    later = int(np.argmax(repeated.to_numpy()))
    first = int(np.argmax(call_ids == call_ids[later]))
    raise TraceError(path, later, "call_id",
                     f"duplicate call id {show(str(call_ids[later]))} (first used by record {first})")
