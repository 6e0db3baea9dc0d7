"""What every command shares: turning library errors into one line and exit status 2."""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from simulator.errors import SimctlError, SimctlWarning

#: Tables and progress go to stdout; errors and warnings to stderr.
console = Console()
err_console = Console(stderr=True, highlight=False, soft_wrap=True)

EXIT_INPUT_ERROR = 2


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Report :class:`SimctlError` (and unreadable files) as ``error: ...`` and exit 2.

    Warnings the library issues (:class:`SimctlWarning`) are printed as ``warning: ...``.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SimctlWarning)
        try:
            with _errors_to_exit():
                yield
        finally:
            for w in list(caught):  # re-emitting below appends to ``caught``
                if issubclass(w.category, SimctlWarning):
                    warn(str(w.message))
                else:
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


@contextlib.contextmanager
def _errors_to_exit() -> Iterator[None]:
    try:
        yield
    except SimctlError as exc:
        err_console.print(f"error: {exc}", markup=False)
        raise typer.Exit(EXIT_INPUT_ERROR) from None
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        err_console.print(f"error: {exc.filename}: {exc.strerror}", markup=False)
        raise typer.Exit(EXIT_INPUT_ERROR) from None


def warn(message: str) -> None:
    """Print a one-line warning on stderr."""
    err_console.print(f"warning: {message}", markup=False)
    sys.stderr.flush()


def _cell_width(cell: object) -> int:
    return Text.from_markup(cell).cell_len if isinstance(cell, str) else len(str(cell))


def print_table(table: Table, out: Console | None = None) -> None:
    """Print ``table`` whole: numbers are never cut or wrapped.

    Every column keeps the width of its widest cell. When the console is too narrow for all
    of them (an 80-column pipe, a CI log), the columns after the first (the row labels) are
    split over several tables, each repeating the labels, rather than squeezed.
    """
    out = out or console
    widths = [max([_cell_width(c.header)] + [_cell_width(x) for x in c._cells]) for c in table.columns]
    for column, width in zip(table.columns, widths, strict=True):
        column.min_width = width
        column.no_wrap = True
    pad = 3  # a column's padding and its border
    if sum(widths) + pad * len(widths) + 1 <= out.width or len(widths) < 3:
        out.print(table)
        return
    chunks: list[list[int]] = [[]]
    room = out.width - widths[0] - 2 * pad - 1
    used = 0
    for i in range(1, len(widths)):
        if chunks[-1] and used + widths[i] + pad > room:
            chunks.append([])
            used = 0
        chunks[-1].append(i)
        used += widths[i] + pad
    for n, chunk in enumerate(chunks):
        part = Table(title=(f"{table.title} ({n + 1}/{len(chunks)})" if table.title else None),
                     title_justify=table.title_justify, box=table.box, padding=table.padding,
                     pad_edge=table.pad_edge, show_header=table.show_header)
        for i in [0, *chunk]:
            col = table.columns[i]
            part.add_column(col.header, justify=col.justify, min_width=widths[i], no_wrap=True)
        for r in range(table.row_count):
            part.add_row(*(table.columns[i]._cells[r] for i in [0, *chunk]))
        out.print(part)
