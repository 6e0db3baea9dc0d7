"""Writing result files safely: never overwrite what the user wrote, never leave half a file.

Every output (trace, summary JSON or CSV, event log) goes through :func:`open_output`: the data
is written to a temporary file beside the target (``.NAME.PID.XXXX.part``) and renamed into
place only once it is complete, and an existing file is refused unless the caller passes
``force=True``. A temporary file a killed process left is removed by the next write of the
same output.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
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
    """Open ``path`` for writing through a temporary file renamed into place on success.

    On any failure (the caller's, the disk's, the rename's, an interruption) the temporary
    file is removed and the target is left as it was. A symbolic link is written through:
    the file it points to is replaced, the link stays."""
    target = _through_links(check_writable(path, force=force))
    remove_stale_parts(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.{os.getpid()}.", suffix=".part", dir=target.parent)
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
