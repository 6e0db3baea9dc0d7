"""The ``simctl`` command line: a thin typer layer over the library.

Each command lives in its own module and only parses options, calls a library function
and prints its result. Library errors (:class:`simulator.errors.SimctlError`) become one
line on stderr and exit status 2, with no traceback.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="simctl",
    help="Discrete-event simulator and capacity planner for batched LLM inference serving.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)

# Command modules register themselves on ``app`` when imported.
from simulator.cli import replay as _replay  # noqa: E402,F401
from simulator.cli import synth as _synth  # noqa: E402,F401
from simulator.cli import validate as _validate  # noqa: E402,F401


def main() -> None:
    """Console-script entry point."""
    app()
