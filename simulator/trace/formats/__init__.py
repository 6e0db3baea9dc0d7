"""Reading and writing trace files; the one place that recognises a file's format.

Three formats of simctl's own (one module each):

* ``client`` — the users' load-testing client's ``batch_arrivals.json``
  (:mod:`simulator.trace.formats.client`): prompt *texts*, classified into tasks by
  keyword rules;
* ``native`` — simctl's own ``simctl-trace/1`` (:mod:`simulator.trace.formats.native`):
  task names and optional token counts;
* ``parquet`` — the same as a Parquet table, one row per prompt
  (:mod:`simulator.trace.formats.parquet`), read as columns.

:func:`load_trace` detects the format from the content (:func:`detect_format`), never
from the file name.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from simulator import bundled, heap, inputs
from simulator.errors import TraceError
from simulator.outputs import open_output
from simulator.trace.classify import DEFAULT_CLASSIFIER, KeywordClassifier
from simulator.trace.formats import azure, burstgpt, mooncake, servegen  # noqa: F401  (each registers its format)
from simulator.trace.formats._common import read_json
from simulator.trace.formats._requests import DEFAULT_OPTIONS, TRACE_IMPORTERS, ImportOptions
from simulator.trace.formats.client import read_client, write_client
from simulator.trace.formats.native import read_native, read_native_fast, read_native_lines, write_native
from simulator.trace.formats.parquet import is_parquet, read_parquet_trace, write_parquet
from simulator.trace.model import Trace

#: Names of the formats :func:`save_trace` writes.
FORMATS = ("native", "client", "parquet")
#: Production formats :func:`load_trace` reads (and ``simctl import`` names): name -> reader,
#: each registered by its module (imported above, in the order :func:`sniff` tries them).
IMPORTERS = {name: TRACE_IMPORTERS.get(name).read for name in TRACE_IMPORTERS}

#: Keys only the client format has: a list whose first record has one of them (and whose
#: prompts are not objects) is a client-format file.
_CLIENT_KEYS = frozenset({"batch_id", "batch_size", "prompt_idxs", "max_length"})


def detect_format(obj: Any) -> str:
    """``"client"`` or ``"native"``: the format of parsed JSON ``obj``.

    Client: a JSON list whose first object record has a client key (``batch_id``,
    ``batch_size``, ``prompt_idxs`` or ``max_length``) and whose ``prompts`` is not a list
    holding objects (in the client format it is a list of texts). Everything else is
    native, whose reader then reports what is wrong with it.
    """
    if isinstance(obj, list):
        first = next((rec for rec in obj if isinstance(rec, dict)), None)
        if first is not None and _CLIENT_KEYS & first.keys():
            prompts = first.get("prompts")
            if not (isinstance(prompts, list) and any(isinstance(p, dict) for p in prompts)):
                return "client"
    return "native"


#: The most of a file :func:`sniff` reads to find its first line: a first line longer than
#: this is no production format's (their first lines are a header or one short record).
SNIFF_BYTES = 1 << 20


def sniff(path: str | Path) -> str:
    """The format of the file at ``path`` from its first line: a production format's name,
    or ``"json"`` for the JSON formats (told apart by :func:`detect_format`).

    Only the file's head is read: a binary file, or one whose first character begins neither
    a JSON document nor a format's first line, is refused here (:class:`TraceError` naming
    the file) before the whole of it is read."""
    with inputs.readable(path, TraceError, "trace file") as p:
        if is_parquet(inputs.head(p, 4)):
            return "parquet"
        inputs.check_head(p, TraceError, "trace file (JSON, JSON lines, CSV or Parquet)")
        text = inputs.head(p, SNIFF_BYTES).decode("utf-8", errors="replace")
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    for name in TRACE_IMPORTERS:
        if TRACE_IMPORTERS.get(name).looks_like(first):
            return name
    return "json"


def load_trace(path: str | Path, classifier: KeywordClassifier = DEFAULT_CLASSIFIER,
               options: ImportOptions = DEFAULT_OPTIONS, format: str | None = None) -> Trace:
    """Read the trace at ``path`` in whichever format it is in (see :func:`detect_format`).

    ``path`` may also name a bundled trace (``"example"``, see :mod:`simulator.bundled`).

    ``classifier`` gives the tasks of prompt texts (client format). The result's calls are
    sorted by time with times starting from the trace's own zero (absolute epochs shifted
    to 0), ``meta["format"]`` names the format read and ``source`` is ``str(path)``.

    Raises :class:`~simulator.errors.TraceError` (one line naming file, record and field)
    for a missing, unreadable or invalid file; issues
    :class:`~simulator.errors.SimctlWarning` for what it repaired (unsorted calls) or
    could not classify.
    """
    trace = _load(path, classifier, options, format)
    if trace.n_prompts >= heap.TRIM_FROM_PROMPTS:
        heap.give_back_freed_memory()
    return trace


def _load(path: str | Path, classifier: KeywordClassifier, options: ImportOptions, format: str | None) -> Trace:
    """:func:`load_trace`'s reading."""
    path = bundled.resolve("traces", path, TraceError)
    kind = format or sniff(path)
    if kind in IMPORTERS:
        import pandas as pd  # (the production formats' readers are pandas')

        try:
            return IMPORTERS[kind](path, options)
        except pd.errors.ParserError as exc:
            raise _csv_error(Path(path), kind, exc) from None
        except (UnicodeDecodeError, pd.errors.EmptyDataError, ValueError, TypeError,
                KeyError, IndexError) as exc:
            # A file that is not the production format it was taken for (binary, ragged rows,
            # other columns): the readers check the records of files that are, and name them.
            raise TraceError(path, None, None, f"not a readable {kind} trace ({type(exc).__name__}: "
                             f"{' '.join(str(exc).split())[:160]})") from None
    if kind not in ("json", *FORMATS):
        raise ValueError(f"unknown trace format {kind!r}")
    if kind == "parquet":
        return read_parquet_trace(path)
    with inputs.readable(path, TraceError, "trace file") as p:
        inputs.check_head(p, TraceError, "trace file", json=True)
    with inputs.gc_paused():
        with inputs.open_binary(path, TraceError, "trace file") as handle:
            trace = read_native_lines(handle, path)
        if trace is not None:
            return trace
        raw = inputs.read_bytes(path, TraceError, "trace file")
        trace = read_native_fast(raw, path)
        if trace is not None:
            return trace
        obj = read_json(path, raw)
        if detect_format(obj) == "client":
            return read_client(obj, path, classifier)
        return read_native(obj, path)


def _csv_error(path: Path, kind: str, exc: Exception) -> TraceError:
    """The :class:`TraceError` of a CSV the parser gave up on, naming the line where it did."""
    text = " ".join(str(exc).split())
    if found := re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", text):
        expected, line, saw = found.groups()
        return TraceError(path, f"line {line}", None, f"has {saw} fields; the lines before it have {expected}")
    if found := re.search(r"EOF inside string starting at row (\d+)", text):
        # (pandas counts rows from 0, the header included: row N is line N + 1)
        return TraceError(path, f"line {int(found.group(1)) + 1}", None,
                          "a quoted field (opened with \") is never closed")
    return TraceError(path, None, None, f"not a readable {kind} trace (not CSV: {text[:160]})")


def save_trace(
    trace: Trace,
    path: str | Path,
    format: str = "native",
    force: bool = False,
    classifier: KeywordClassifier = DEFAULT_CLASSIFIER,
) -> Path:
    """Write ``trace`` to ``path`` in ``format`` (``"native"``, ``"client"`` or ``"parquet"``);
    return the path.

    The file is written atomically and an existing file is refused
    (:class:`~simulator.errors.OutputError`) unless ``force``. ``classifier`` is used by
    the client writer to invent prompt texts for prompts without one. Raises
    :class:`ValueError` for an unknown format.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown trace format {format!r} (expected one of {', '.join(FORMATS)})")
    if format == "parquet":
        with open_output(path, mode="wb", force=force) as binary:
            write_parquet(trace, binary)
        return Path(path)
    with open_output(path, force=force) as handle:
        if format == "client":
            write_client(trace, handle, classifier)
        else:
            write_native(trace, handle)
    return Path(path)


__all__ = ["FORMATS", "IMPORTERS", "ImportOptions", "detect_format", "load_trace", "save_trace", "sniff"]
