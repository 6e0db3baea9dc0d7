"""Writing result files safely: never overwrite what the user wrote, never leave half a file.

Every output (trace, summary JSON, event log) goes through :func:`open_output`: the data
is written to a temporary file beside the target (``.NAME.PID.XXXX.part``) and renamed into
place only once it is complete, and an existing file is refused unless the caller passes
``force=True``. A temporary file a killed process left is removed by the next write of the
same output.
"""

from __future__ import annotations

import contextlib
import glob
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
    remove_stale_parts(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.{os.getpid()}.", suffix=".part", dir=target.parent or ".")
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


def remove_stale_parts(target: Path) -> list[Path]:
    """Remove the temporary files an earlier write of ``target`` left when its process was
    killed (``.NAME.PID.XXXX.part`` whose PID is no longer running); those of a live
    process, which may be writing now, stay. Returns what was removed."""
    removed = []
    for part in (target.parent or Path(".")).glob(f".{glob.escape(target.name)}.*.part"):
        pid = part.name[len(target.name) + 2:].split(".", 1)[0]
        if pid.isdigit() and not _running(int(pid)):
            with contextlib.suppress(OSError):
                part.unlink()
                removed.append(part)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _umask() -> int:
    """The process umask (reading it means setting it, so set it straight back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
