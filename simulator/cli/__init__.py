"""The ``simctl`` command line: a thin typer layer over the library.

Each command lives in its own module and only parses options, calls a library function
and prints its result. Library errors (:class:`simulator.errors.SimctlError`) become one
line on stderr and exit status 2, with no traceback.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="simctl",
    help="Discrete-event simulator and capacity planner for batched LLM inference serving.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)

# Command modules register themselves on ``app`` when imported. A command whose core
# dependency is missing on this machine (a GPU box may have torch but not simpy) is still
# listed, and says what to install instead of breaking every other command.
_COMMANDS = ("replay", "validate", "synth", "import", "profile", "sweep", "compare", "plan", "plot",
             "observed", "calibrate")


def _unavailable(name: str, missing: str) -> None:
    @app.command(name, help=f"(unavailable here: needs the Python package '{missing}')",
                 context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def _command() -> None:
        from simulator.cli._common import err_console

        err_console.print(f"error: simctl {name} needs the Python package '{missing}': pip install simctl")
        raise typer.Exit(2)


for _name in _COMMANDS:
    try:
        # "import" is a keyword, so its module is cli/importer.py
        importlib.import_module(f"simulator.cli.{'importer' if _name == 'import' else _name}")
    except ModuleNotFoundError as _exc:
        if _exc.name is None or _exc.name.startswith("simulator"):
            raise
        _unavailable(_name, _exc.name)


def main() -> None:
    """Console-script entry point."""
    app()
