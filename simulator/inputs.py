"""Reading the user's files: every way a read can fail becomes one line naming the file.

The counterpart of :mod:`simulator.outputs`, and the only module that opens a file the user
named: traces in every format, profiles, scenarios, observed runs and other tools' results,
sweep results and journals, event logs, model configs are all read through
:func:`read_text`, :func:`read_bytes`, :func:`open_text`, :func:`read_json`,
:func:`read_toml`, :func:`read_csv` or :func:`read_parquet`, each taking the error class of
the kind of file (``TraceError``, ``ProfileError``...) so the message says what was being
read (``tests/test_inputs_layer.py`` scans the package so no reader bypasses them).

Reading is never the place a traceback starts, a hang, or a silent wrong number:

* the path: missing files, dangling symbolic links (named with their target), symlink
  loops, folders, permissions, and things that are not regular files (a FIFO or a device
  such as ``/dev/zero`` would block or never end) each get their own message;
* the size: a file over :data:`MAX_INPUT_BYTES` is refused before it is read;
* the head: a text reader first reads the file's first :data:`HEAD_BYTES` and refuses a
  binary file (a NUL byte, or bytes that are not UTF-8, there) at once, and
  :func:`read_json` one whose first character can start no JSON value, before a gigabyte of
  it is read (:func:`check_head`);
* the encoding: bytes that are not UTF-8 are named by their offset;
* the structure: JSON and TOML nested deeper than the parser (or :data:`MAX_DEPTH`, for the
  small configuration documents) are refused;
* the numbers: an integer of more digits than Python converts (4300) is refused at parse,
  and :func:`finite` is the one check of a field that needs a finite number in a range
  (NaN, infinities, floats past 1.8e308, integers past 64 bits);
* the names: a task, queue or class name holding a control character (a newline, a NUL, an
  escape) would break every line that prints it; :func:`control_character` says so.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import math
import os
import re
import stat
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from simulator.errors import SimctlError

#: The largest file simctl reads (16 GiB): every reader holds the file's content, or the
#: columns it becomes, in memory; a bigger file would exhaust the machine part-way.
MAX_INPUT_BYTES = 16 * 2**30
#: The deepest nesting of a configuration document (profile, scenario, observed run): the
#: deepest file simctl writes nests 6 levels; code walking deeper ones could recurse out.
MAX_DEPTH = 64
#: The largest integer a count in an input file may hold: it becomes a 64-bit integer.
INT64_MAX = 2**63 - 1
#: How much of a text file is read to tell whether it can be the text expected, before the
#: whole of it is: a file of zeros or a binary file is refused from this much.
HEAD_BYTES = 4096
#: The characters that can begin a JSON document (Python's parser reads ``NaN`` and
#: ``Infinity`` too), after any whitespace.
JSON_STARTS = frozenset('{["-0123456789tfnNI')
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def control_character(name: str) -> str | None:
    """Why ``name`` cannot name a task, queue or class (it holds a control character: a
    newline, tab, NUL, escape or DEL), or ``None``. Such a name would split or garble every
    table, log line and message that prints it."""
    found = _CONTROL.search(name)
    if found is None:
        return None
    return f"holds a control character ({found.group()!r} at position {found.start()}); names must be printable"


def check_source(path: str | Path, error: type[SimctlError], what: str = "file") -> Path:
    """``path`` if it names a regular file simctl can read whole; ``error`` naming the file
    otherwise (dangling link, loop, folder, FIFO or device, over :data:`MAX_INPUT_BYTES`)."""
    p = Path(path)
    try:
        info = p.stat()
    except FileNotFoundError:
        if p.is_symlink():
            raise error(p, None, None, f"symbolic link to a missing file ({os.readlink(p)})") from None
        raise error(p, None, None, "no such file") from None
    except PermissionError:
        raise error(p, None, None, "permission denied") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise error(p, None, None, "symbolic link loop") from None
        raise error(p, None, None, exc.strerror or str(exc)) from None
    if stat.S_ISDIR(info.st_mode):
        raise error(p, None, None, f"is a folder, not a {what}")
    if not stat.S_ISREG(info.st_mode):
        raise error(p, None, None, f"is not a regular file (a pipe, socket or device), not a {what}")
    if info.st_size > MAX_INPUT_BYTES:
        raise error(p, None, None, f"is {info.st_size / 2**30:.1f} GiB; the largest file simctl reads is "
                    f"{MAX_INPUT_BYTES // 2**30} GiB (it is held in memory while read)")
    return p


@contextlib.contextmanager
def readable(path: str | Path, error: type[SimctlError], what: str = "file") -> Iterator[Path]:
    """Check ``path`` (:func:`check_source`) and turn the errors of reading it inside the
    block into one-line ``error(path, ...)``; ``what`` names the kind of file expected
    (``"trace file"``) in the messages."""
    p = check_source(path, error, what)
    try:
        yield p
    except FileNotFoundError:
        raise error(p, None, None, "no such file") from None
    except IsADirectoryError:
        raise error(p, None, None, f"is a folder, not a {what}") from None
    except PermissionError:
        raise error(p, None, None, "permission denied") from None
    except UnicodeDecodeError as exc:
        raise error(p, None, None, f"not a UTF-8 text file (bad byte at offset {exc.start})") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise error(p, None, None, "symbolic link loop") from None
        raise error(p, None, None, exc.strerror or str(exc)) from None


@contextlib.contextmanager
def open_text(path: str | Path, error: type[SimctlError], what: str = "file", errors: str = "strict",
              newline: str | None = None) -> Iterator[IO[str]]:
    """``path`` open as UTF-8 text, for readers that stream it line by line; a byte that is
    not UTF-8 met while iterating is reported like one met by :func:`read_text`."""
    with readable(path, error, what) as p:
        check_head(p, error, what)
        with open(p, encoding="utf-8", errors=errors, newline=newline) as fh:
            yield fh


@contextlib.contextmanager
def open_binary(path: str | Path, error: type[SimctlError], what: str = "file") -> Iterator[IO[bytes]]:
    """``path`` open for reading bytes (checked by :func:`check_source`)."""
    with readable(path, error, what) as p, open(p, "rb") as fh:
        yield fh


def head(path: Path, size: int = HEAD_BYTES) -> bytes:
    """The first ``size`` bytes of ``path`` (a checked regular file)."""
    with open(path, "rb") as fh:
        return fh.read(size)


def check_head(path: Path, error: type[SimctlError], what: str = "file", json: bool = False) -> None:
    """Refuse ``path`` from its first :data:`HEAD_BYTES` when it cannot be the text file
    expected: a NUL byte (no text format simctl reads has one: the file is binary, or
    zeros), a byte that is not UTF-8, or, with ``json``, a first character that begins no
    JSON value. The rest of the file is not read: a sparse file of zeros the size of the
    disk is refused at once, not after its gigabytes were read into memory."""
    first = head(path)
    nul = first.find(b"\0")
    if nul >= 0:
        raise error(path, None, None, f"not a text file (a NUL byte at offset {nul}); expected a {what}")
    try:
        first.decode("utf-8")
    except UnicodeDecodeError as exc:
        if len(first) < HEAD_BYTES or exc.start < len(first) - 3:  # (not a character the head's end cut)
            raise error(path, None, None, f"not a UTF-8 text file (bad byte at offset {exc.start})") from None
    if json:
        # (a byte-order mark is left to the parser, which names it)
        stripped = first.lstrip(b" \t\r\n")
        if stripped and not stripped.startswith(b"\xef\xbb\xbf") and chr(stripped[0]) not in JSON_STARTS:
            before = first[:len(first) - len(stripped)]
            line, column = before.count(b"\n") + 1, len(before) - (before.rfind(b"\n") + 1) + 1
            raise error(path, None, None, f"not valid JSON: Expecting value at line {line}, column {column}")


def read_head(path: str | Path, size: int = 4096) -> str | None:
    """The first ``size`` characters of ``path`` (undecodable bytes replaced), to tell its
    format; ``None`` if it is not a readable regular file (the reader then says why)."""
    try:
        p = check_source(path, SimctlError)
        with open(p, encoding="utf-8", errors="replace") as fh:
            return fh.read(size)
    except (SimctlError, OSError):
        return None


def read_csv(path: str | Path, error: type[SimctlError], what: str = "CSV file", **options: Any) -> Any:
    """``pandas.read_csv(path, **options)``; the file checked and its read errors named as
    :func:`readable` does (parse errors are the caller's to word)."""
    import pandas as pd

    with readable(path, error, what) as p:
        check_head(p, error, what)
        return pd.read_csv(p, **options)


def read_csv_arrow(path: str | Path, error: type[SimctlError], what: str = "CSV file",
                   column_types: dict[str, Any] | None = None) -> Any:
    """The CSV file as a ``pyarrow.Table`` (columns of ``column_types`` parsed as those
    types), checked as :func:`read_csv` checks it; a file pyarrow cannot read as asked
    raises ``pyarrow.ArrowInvalid`` for the caller, which reads it again the slow way."""
    import pyarrow.csv as pa_csv

    with readable(path, error, what) as p:
        check_head(p, error, what)
        return pa_csv.read_csv(p, convert_options=pa_csv.ConvertOptions(column_types=column_types or {},
                                                                         strings_can_be_null=False))


def read_parquet(path: str | Path, error: type[SimctlError], what: str = "Parquet file") -> Any:
    """The ``pyarrow.Table`` in the Parquet file ``path``; ``error`` if it is not one."""
    import pyarrow.parquet as pq

    with readable(path, error, what) as p:
        try:
            return pq.read_table(p)
        except OSError:
            raise
        except Exception as exc:  # noqa: BLE001 - arrow's errors for a file that is not Parquet vary
            raise error(p, None, None, f"not a readable Parquet file ({' '.join(str(exc).split())[:160]})") from None


def finite(value: Any, low: float = -math.inf, high: float = math.inf, integer: bool = False) -> str | None:
    """Why ``value`` is not a finite number in ``[low, high]`` (an integer if ``integer``), or
    ``None`` if it is. The one check of a number read from a file: NaN and the infinities
    (``NaN``/``Infinity`` in JSON, ``1e999``), booleans, integers past 64 bits."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be a number, got {type(value).__name__}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value}"
    if integer and value != int(value):
        return f"must be a whole number, got {value}"
    if abs(value) > INT64_MAX and (integer or isinstance(value, int)):
        return "is too large (more than 64 bits)"
    if not low <= value <= high:
        return f"must be in [{low:g}, {high:g}], got {value:g}"
    return None


def depth(obj: Any, limit: int = MAX_DEPTH) -> int:
    """How deep ``obj`` (parsed JSON or TOML) nests, counted up to ``limit + 1`` (walked
    without recursion, so any depth is safe to measure)."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, level)
            if deepest > limit:
                return deepest
            stack.extend((child, level + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def read_text(path: str | Path, error: type[SimctlError], what: str = "file", json: bool = False) -> str:
    """The UTF-8 text of ``path``, once its head is that of a text file (of JSON, with
    ``json``; :func:`check_head`)."""
    with readable(path, error, what) as p:
        check_head(p, error, what, json=json)
        return p.read_text(encoding="utf-8")


def read_bytes(path: str | Path, error: type[SimctlError], what: str = "file") -> bytes:
    """The bytes of ``path``."""
    with readable(path, error, what) as p:
        return p.read_bytes()


def decode_text(raw: bytes, path: str | Path, error: type[SimctlError]) -> str:
    """``raw`` (the bytes of ``path``) as UTF-8 text."""
    with readable(path, error):
        return raw.decode("utf-8")


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a large file becomes objects.

    Parsing makes millions of containers and no cycles; each collection the allocations set
    off walks all of them, which made reading a trace three times slower."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def parse_json(text: str, path: str | Path | None, error: type[SimctlError]) -> Any:
    """``text`` parsed as JSON; :class:`error` if it is not valid or nests too deeply."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(path, None, None, f"not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    except RecursionError:
        raise error(path, None, None, "not usable JSON: nested too deeply") from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise error(path, None, None, f"not usable JSON: {str(exc).split(';')[0]}") from None


def check_depth(obj: Any, path: str | Path | None, error: type[SimctlError], limit: int = MAX_DEPTH) -> Any:
    """``obj``, if it nests no deeper than ``limit``; ``error`` naming the file otherwise."""
    if depth(obj, limit) > limit:
        raise error(path, None, None, f"nested more than {limit} levels deep; no simctl file nests so deep")
    return obj


def read_json(path: str | Path, error: type[SimctlError], what: str = "JSON file",
              max_depth: int | None = MAX_DEPTH) -> Any:
    """The parsed JSON content of ``path``; an empty file is an error too, and so is one
    nested deeper than ``max_depth`` (``None``: as deep as the parser goes)."""
    text = read_text(path, error, what, json=True)
    if not text.strip():
        raise error(path, None, None, f"empty file (expected a {what})")
    obj = parse_json(text, path, error)
    return obj if max_depth is None else check_depth(obj, path, error, max_depth)


def read_toml(path: str | Path, error: type[SimctlError], what: str = "TOML file") -> dict[str, Any]:
    """The parsed TOML content of ``path``."""
    text = read_text(path, error, what)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(path, None, None, f"not valid TOML: {exc}") from None
    except RecursionError:
        raise error(path, None, None, "not usable TOML: nested too deeply") from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise error(path, None, None, f"not usable TOML: {str(exc).split(';')[0]}") from None
    return check_depth(data, path, error)
