"""Reading the user's files: every way a read can fail becomes one line naming the file.

The counterpart of :mod:`simulator.outputs`. Traces, profiles, scenarios and results files
are all read through :func:`read_text`, :func:`read_json` or :func:`read_toml`, each taking
the error class of the kind of file (``TraceError``, ``ProfileError``...) so the message
says what was being read. Reading is never the place a traceback starts: missing files,
folders, permissions, symlink loops, bytes that are not UTF-8 and documents nested too
deeply for the parser all get their own message.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from simulator.errors import SimctlError


@contextlib.contextmanager
def readable(path: str | Path, error: type[SimctlError], what: str = "file") -> Iterator[Path]:
    """Turn the errors of reading ``path`` into one-line ``error(path, ...)``; ``what`` names
    the kind of file expected (``"trace file"``) in the folder message."""
    p = Path(path)
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


def read_text(path: str | Path, error: type[SimctlError], what: str = "file") -> str:
    """The UTF-8 text of ``path``."""
    with readable(path, error, what) as p:
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


def read_json(path: str | Path, error: type[SimctlError], what: str = "JSON file") -> Any:
    """The parsed JSON content of ``path``; an empty file is an error too."""
    text = read_text(path, error, what)
    if not text.strip():
        raise error(path, None, None, f"empty file (expected a {what})")
    return parse_json(text, path, error)


def read_toml(path: str | Path, error: type[SimctlError], what: str = "TOML file") -> dict[str, Any]:
    """The parsed TOML content of ``path``."""
    text = read_text(path, error, what)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(path, None, None, f"not valid TOML: {exc}") from None
    except RecursionError:
        raise error(path, None, None, "not usable TOML: nested too deeply") from None
