"""Writing result files safely: never overwrite what the user wrote, never leave half a file,
never destroy what is not a file, never lose what another writer wrote.

Every output (trace, summary JSON or CSV, event log) goes through :func:`open_output`:

* A regular file (or a name not taken yet) is written to a temporary file beside the target
  (``.NAME.PID.XXXX.part``) and renamed into place only once it is complete; an existing
  file is refused unless the caller passes ``force=True``. A temporary file a killed process
  left is removed by the next write of the same output.
* A character device (``/dev/null``, ``/dev/stdout`` on a terminal, ``/dev/full``) or a FIFO
  is written *through*, as a shell's ``>`` would: opened for writing, never truncated,
  renamed over or removed, and no ``--force`` is needed (writing to it destroys nothing). A
  FIFO is opened without blocking: one that no process is reading is refused, so a command
  never hangs waiting for a reader. A name that stands for an open descriptor
  (``/dev/stdout``, ``/dev/fd/N``, ``/proc/self/fd/N``) redirected to a regular file is
  appended to, so what the shell redirection already holds stays. A block device, a socket
  and a folder are refused.
* The write of a regular file holds an advisory lock (``fcntl.flock``) on a sidecar file
  ``.NAME.lock`` beside it (hidden, as the temporary files are), removed afterwards, and re-checks under the lock that the file
  still may be written: of two commands writing one output at once, the second waits for the
  first (saying so through :data:`waiting`) and then, without ``force``, is refused because
  the file now exists, rather than silently replacing it. A lock a killed process held is
  released by the kernel, so no stale lock blocks anyone. The wait is bounded by
  :func:`lock_wait` (``SIMCTL_LOCK_WAIT`` seconds, default :data:`LOCK_WAIT_S`); past it the
  write is refused naming the process that holds the lock.
* A failed write (no space left, a quota, a file-size limit, a read-only folder) is an
  :class:`~simulator.errors.OutputError` naming the output (never its temporary file), with
  the temporary file removed and the previous file as it was.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from simulator.errors import OutputError


def check_writable(path: str | Path, force: bool = False, inputs: tuple[Path, ...] = ()) -> Path:
    """Validate an output path before any work is done.

    Raises :class:`OutputError` if the name is blank (``""``, ``" "``), names a folder
    (``.``, an existing folder), if the file exists (and ``force`` is false), if it is one
    of the ``inputs`` (even with ``force``), or if its folder does not exist or is not a
    folder.
    """
    check_output_name(path, "file")
    target = Path(path)
    if target.name in ("", ".", "..") or target.is_dir():
        raise OutputError(target, None, None, "is a folder; give the name of a file to write")
    if write_through(target) is not None:  # a device or a pipe: nothing there to overwrite
        return target
    for inp in inputs:
        with contextlib.suppress(OSError):
            if target.exists() and target.resolve() == Path(inp).resolve():
                raise OutputError(target, None, None, "output would overwrite an input file")
    if target.exists() and not force:
        raise OutputError(target, None, None, "file exists; pass --force to overwrite it")
    _check_parent(target)
    if target.is_symlink():  # the file it points to is written: its folder must exist too
        _check_parent(_through_links(target))
    return target


#: The figure formats simctl writes (matplotlib's, by suffix).
FIGURE_FORMATS = (".png", ".svg", ".pdf")


def check_figure(path: str | Path, force: bool = False, inputs: tuple[Path, ...] = ()) -> Path:
    """:func:`check_writable` for a figure, whose name must also end in one of
    :data:`FIGURE_FORMATS`."""
    target = check_writable(path, force=force, inputs=inputs)
    if target.suffix.lower() not in FIGURE_FORMATS:
        raise OutputError(target, None, None, f"a figure must end in {', '.join(FIGURE_FORMATS)}")
    return target


def check_output_folder(folder: str | Path, names: tuple[str, ...], force: bool = False,
                        inputs: tuple[Path, ...] = ()) -> list[Path]:
    """Validate an output folder and the files ``names`` to be written into it, before any
    work is done. Nothing is created: the caller makes the folder once its work is done.

    Raises :class:`OutputError` if the name is blank, names an existing file rather than a
    folder, if its parent folder does not exist, or if a file to be written would be
    refused by :func:`check_writable`. Returns the paths of the files."""
    check_output_name(folder, "folder")
    target = Path(folder)
    if target.exists() and not target.is_dir():
        raise OutputError(target, None, None, "is a file, not a folder; give a folder to write the figures into")
    if not target.exists():
        _check_parent(target)
    paths = [target / name for name in names]
    if target.is_dir():
        for p in paths:
            check_writable(p, force=force, inputs=inputs)
    return paths


def check_output_name(path: str | Path, what: str = "file") -> None:
    """Refuse a blank output name (:class:`OutputError`). A blank name (``""``, ``" "``, ``"out/ "``) is a slip, never a file anyone meant."""
    name = Path(path).name
    if not str(path).strip() or (name and not name.strip()):
        raise OutputError(repr(str(path)), None, None, f"blank output {what} name; give a {what} to write")


def _check_parent(target: Path) -> None:
    parent = target.parent
    if not parent.exists():
        raise OutputError(target, None, None, f"folder {parent} does not exist")
    if not parent.is_dir():
        raise OutputError(target, None, None, f"{parent} is not a folder")


@contextlib.contextmanager
def open_output(path: str | Path, mode: str = "w", force: bool = False) -> Iterator[IO]:
    """Open ``path`` for writing; see the module docstring for what each kind of path gets.

    A regular file is written through a temporary file renamed into place on success, under
    the output's lock. On any failure (the caller's, the disk's, the rename's, an
    interruption) the temporary file is removed and the target is left as it was; a failure
    of the system (disk full, read-only ...) is an :class:`OutputError` naming ``path``. A
    symbolic link is written through: the file it points to is replaced, the link stays."""
    target = check_writable(path, force=force)
    how = write_through(target)
    if how is not None:
        with reported(target), _open_through(target, how, mode) as handle:
            yield handle
        return
    real = _through_links(target)
    with reported(target, real), output_lock(real):
        # Again, under the lock: another writer may have written the file since the first check.
        check_writable(path, force=force)
        remove_stale_parts(real)
        fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.{os.getpid()}.", suffix=".part", dir=real.parent)
        try:
            with os.fdopen(fd, mode) as handle:
                yield handle
            # mkstemp creates the file 0600; give it the permissions a plain open() would.
            os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, real)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


# -- special files: written through, never replaced ----------------------------------------

#: A name that stands for an open descriptor: of this process, or of another one.
_DESCRIPTOR = re.compile(r"^/(?:proc/(self|thread-self|\d+)|dev)/fd/(\d+)$")


def write_through(target: str | Path) -> str | None:
    """How ``target`` is written if it is not to be replaced by a new file: ``"descriptor"``
    (a name of an open descriptor, ``/dev/stdout``, ``/dev/fd/N``, ``/proc/PID/fd/N``),
    ``"device"`` (a character device: ``/dev/null``, a terminal), ``"fifo"``; ``None`` for a
    regular file or a name not taken yet (written atomically). A block device or a socket,
    which simctl never writes, is an :class:`OutputError`."""
    if _descriptor(target) is not None:
        return "descriptor"
    try:
        mode = os.stat(target).st_mode
    except (OSError, ValueError):  # missing, a dangling link, a name the system refuses: a new file
        return None
    if stat.S_ISCHR(mode):
        return "device"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISBLK(mode):
        raise OutputError(target, None, None, "is a block device (a disk); give the name of a file to write")
    if stat.S_ISSOCK(mode):
        raise OutputError(target, None, None, "is a socket; give the name of a file to write")
    return None


def _descriptor(target: str | Path) -> tuple[int | None, int] | None:
    """``(pid, fd)`` if ``target`` or a symbolic link on the way from it names an open
    descriptor (``pid`` ``None`` for this process's own), else ``None``."""
    here = os.path.abspath(target)
    for _ in range(40):  # the system's own limit on links followed
        found = _DESCRIPTOR.match(here)
        if found:
            pid = found.group(1)
            own = pid is None or pid in ("self", "thread-self") or int(pid) == os.getpid()
            return (None if own else int(pid), int(found.group(2)))
        try:
            here = os.path.normpath(os.path.join(os.path.dirname(here), os.readlink(here)))
        except (OSError, ValueError):  # not a link (or unreadable): the end of the chain
            return None
    return None


@contextlib.contextmanager
def _open_through(target: Path, how: str, mode: str) -> Iterator[IO]:
    """``target`` opened for writing in place: never created, truncated or renamed over."""
    named = _descriptor(target) if how == "descriptor" else None
    if named is not None and named[0] is None:
        # Our own descriptor: write through a copy of it, at the offset the shell's
        # redirection is at, so what this process prints on it after stays after it.
        fd = os.dup(named[1])
    else:
        flags = os.O_WRONLY | getattr(os, "O_CLOEXEC", 0)
        if how == "fifo":
            flags |= os.O_NONBLOCK  # no reader: ENXIO at once, rather than waiting for one forever
        if how == "descriptor":
            flags |= os.O_APPEND  # another process's descriptor: add to what it holds
        try:
            fd = os.open(target, flags)
        except OSError as exc:
            if exc.errno == errno.ENXIO and how == "fifo":
                raise OutputError(target, None, None, "is a FIFO that no process is reading; start its "
                                  "reader first (simctl does not wait for one)") from None
            raise
        if how == "fifo":
            os.set_blocking(fd, True)  # a reader is there: writes wait for it as through a shell's pipe
    with os.fdopen(fd, mode) as handle:
        yield handle


# -- failures of the system, named after the output -----------------------------------------

_REASONS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file too large (a file-size limit such as ulimit -f, or the file system's largest file)",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}


def os_reason(exc: OSError) -> str:
    """Why the system refused a write, in words (``no space left on the device`` ...)."""
    return _REASONS.get(exc.errno or -1) or exc.strerror or " ".join(str(exc).split()) or type(exc).__name__


@contextlib.contextmanager
def reported(target: Path, real: Path | None = None) -> Iterator[None]:
    """Turn the system's refusal to write ``target`` (disk full, quota, size limit, read-only,
    a broken pipe) into an :class:`OutputError` naming ``target``, not its temporary or lock
    file. An :class:`OSError` about some other file passes unchanged."""
    existed = real is not None and real.exists()
    try:
        yield
    except OSError as exc:
        if exc.filename is not None and not _ours(Path(str(exc.filename)), real or target):
            raise
        reason = os_reason(exc)
        if real is None:
            kept = ""  # written through: what reached the device before the error stays there
        elif existed:
            kept = "; nothing was written, the file as it was is kept"
        else:
            kept = "; nothing was written"
        raise OutputError(target, None, None, f"cannot write: {reason}{kept}") from None


def _ours(path: Path, target: Path) -> bool:
    """Whether ``path`` is ``target``, its lock or one of its temporary files."""
    if path == target or path.parent != target.parent:
        return path == target
    return path.name == lock_name(target).name or (path.name.startswith(f".{target.name}.")
                                                  and path.name.endswith(".part"))


# -- one writer at a time ------------------------------------------------------------------

#: Seconds a write of one output waits for another simctl writing it (``SIMCTL_LOCK_WAIT``).
LOCK_WAIT_S = 600.0
#: Seconds between two tries of a lock another process holds.
POLL_S = 0.05
#: Called with one line when a write waits for another writer (the CLI prints it on stderr).
waiting: Callable[[str], None] | None = None
#: The outputs this process holds the lock of (a sweep holds its file's while it runs and
#: then writes it).
_HELD: set[str] = set()


def lock_wait(default: float | None = LOCK_WAIT_S) -> float | None:
    """Seconds to wait for another writer's lock: ``SIMCTL_LOCK_WAIT`` if set, else
    ``default`` (``None``: as long as it takes). :class:`OutputError` if it is not a number
    of seconds >= 0."""
    text = os.environ.get("SIMCTL_LOCK_WAIT")
    if text is None or not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (value >= 0 and value != float("inf")):
        raise OutputError(None, None, None, f"SIMCTL_LOCK_WAIT: expected seconds >= 0, got {text!r}")
    return value


@contextlib.contextmanager
def output_lock(target: str | Path, bounded: bool = True, then: str = "") -> Iterator[None]:
    """Hold the advisory lock of ``target`` (``fcntl.flock`` on :func:`lock_name` beside it,
    removed on release): one simctl writes an output at a time. Waits for another holder
    up to :func:`lock_wait` seconds (``bounded``: :data:`LOCK_WAIT_S` unless
    ``SIMCTL_LOCK_WAIT`` says otherwise; else as long as it takes), telling :data:`waiting` once
    (``then``: what happens once the other is done, appended to that line); then
    :class:`OutputError` naming the holder's process. Re-entrant within a process."""
    target = Path(target)
    key = os.path.abspath(target)
    if key in _HELD:
        yield
        return
    fd = _acquire(target, lock_name(target), lock_wait(LOCK_WAIT_S if bounded else None), then)
    _HELD.add(key)
    try:
        yield
    finally:
        _HELD.discard(key)
        if fd is not None:
            # Removed while still held: a waiter that opened this lock file finds it gone
            # once it gets it, and tries the path again.
            with contextlib.suppress(OSError):
                os.unlink(lock_name(target))
            os.close(fd)


def lock_name(target: Path) -> Path:
    """The lock file of ``target``: ``.NAME.lock`` beside it (hidden, and unlike a name a user
    would give a file of their own, since it is overwritten and removed)."""
    return target.with_name(f".{target.name}.lock")


def _acquire(target: Path, lock: Path, wait: float | None, then: str = "") -> int | None:
    import fcntl

    deadline = None if wait is None else time.monotonic() + wait
    said = False
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            if deadline is not None and time.monotonic() >= deadline:
                raise OutputError(target, None, None, f"another simctl{holder} is writing it; run again once it is "
                                  f"done (waited {wait:g} s; SIMCTL_LOCK_WAIT sets how long)") from None
            if not said and waiting is not None:
                waiting(f"{target}: waiting for another simctl{holder} writing it{then}")
                said = True
            time.sleep(POLL_S)
            continue
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                return None  # a file system without locks (some network ones): written unlocked
            raise
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(lock))
        except FileNotFoundError:
            same = False
        if not same:  # its holder removed it as we waited: lock the one at the path now
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return fd


def _holder(fd: int) -> str:
    """`` (pid N)``: the process the lock file names, if it names one."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return f" (pid {text})" if text.isdigit() else ""


def _through_links(target: Path) -> Path:
    """Where writing ``target`` lands: the file a symbolic link points to (the link stays,
    as a shell's ``>`` keeps it), else ``target``."""
    return Path(os.path.realpath(target)) if target.is_symlink() else target


def remove_stale_parts(target: Path) -> list[Path]:
    """Remove the temporary files an earlier write of ``target`` left when its process was
    killed (``.NAME.PID.XXXX.part`` whose PID is no longer running); those of a live
    process, which may be writing now, stay. Returns what was removed."""
    removed = []
    for part in target.parent.glob(f".{glob.escape(target.name)}.*.part"):
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


# -- CSV summaries: one row per (run, task) ------------------------------------------------


def flat_record(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``data`` with nested mappings flattened into dotted keys (``{"a": {"b": 1}}`` ->
    ``{"a.b": 1}``); a list becomes its JSON text, so that every value fits a CSV cell."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat_record(value, f"{name}."))
        elif isinstance(value, (list, tuple)):
            out[name] = json.dumps(value, default=str)
        else:
            out[name] = value
    return out


def task_rows(record: Mapping[str, Any], groups: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Split one run's flat record (dotted keys, as a sweep's results row or
    :func:`flat_record` of a summary) into one row per task and one ``overall`` row, in
    that order (then the rows of further ``groups``).

    A key ``tasks.T.F`` goes to task ``T``'s row as column ``F``, ``overall.F`` to the
    ``overall`` row; every other key is a column of the run, repeated on each of its rows.
    ``groups`` names further per-group prefixes and the column that names their rows
    (``{"compositions": "composition"}``: ``compositions.C.F`` goes to a row whose
    ``composition`` is ``C``); the ``task`` prefix is always ``{"tasks": "task"}``."""
    groups = {"tasks": "task", **(groups or {})}
    run: dict[str, Any] = {}
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for key, value in record.items():
        head, _, rest = key.partition(".")
        if head in groups and "." in rest:
            name, _, figure = rest.partition(".")
            rows.setdefault((groups[head], name), {})[figure] = value
        elif head == "overall" and rest:
            rows.setdefault(("task", "overall"), {})[rest] = value
        else:
            run[key] = value
    label_columns = list(dict.fromkeys(groups.values()))
    out = []
    # The tasks, then overall (as the printed tables), then the other groups.
    order = sorted(rows, key=lambda row: (row[0] != "task", row == ("task", "overall")))
    for column, name in order:
        figures = rows[(column, name)]
        labels = {c: (name if c == column else None) for c in label_columns}
        out.append({**run, **labels, **figures})
    return out


def write_csv(rows: Sequence[Mapping[str, Any]], path: str | Path, force: bool = False) -> None:
    """Write ``rows`` as one CSV table (the union of their columns, in order of first
    appearance; a cell a row lacks is empty) through :func:`open_output`."""
    import csv

    columns = list(dict.fromkeys(key for row in rows for key in row))
    with open_output(path, force=force) as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if v is None else v for k, v in row.items()})
