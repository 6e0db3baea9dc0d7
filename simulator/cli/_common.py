"""What every command shares: turning library errors into one line and exit status 2."""

from __future__ import annotations

import contextlib
import sys
import warnings
from typing import Iterator

import typer
from rich.console import Console

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
