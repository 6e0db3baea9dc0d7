"""Writing result files safely: never overwrite what the user wrote, never leave half a file.

Every output (trace, summary JSON, event log) goes through :func:`open_output`: the data
is written to a temporary file beside the target and renamed into place only once it is
complete, and an existing file is refused unless the caller passes ``force=True``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from simulator.errors import OutputError


def check_writable(path: str | Path, force: bool = False, inputs: tuple[Path, ...] = ()) -> Path:
    """Validate an output path before any work is done.

    Raises :class:`OutputError` if the file exists (and ``force`` is false), if it is one
    of the ``inputs`` (even with ``force``), or if its folder does not exist.
    """
    target = Path(path)
    for inp in inputs:
        with contextlib.suppress(OSError):
            if target.exists() and target.resolve() == Path(inp).resolve():
                raise OutputError(target, None, None, "output would overwrite an input file")
    if target.exists() and not force:
        raise OutputError(target, None, None, "file exists; pass --force to overwrite it")
    if target.parent and not target.parent.exists():
        raise OutputError(target, None, None, f"folder {target.parent} does not exist")
    return target


@contextlib.contextmanager
def open_output(path: str | Path, mode: str = "w", force: bool = False) -> Iterator[IO]:
    """Open ``path`` for writing through a temporary file renamed into place on success."""
    target = check_writable(path, force=force)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent or ".")
    try:
        with os.fdopen(fd, mode) as handle:
            yield handle
        # mkstemp creates the file 0600; give it the permissions a plain open() would.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    """The process umask (reading it means setting it, so set it straight back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
