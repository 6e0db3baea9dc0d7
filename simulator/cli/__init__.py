"""The ``simctl`` command line: a thin typer layer over the library.

Each command lives in its own module and only parses options, calls a library function
and prints its result. Library errors (:class:`simulator.errors.SimctlError`) become one
line on stderr and exit status 2, with no traceback.

Commands are loaded lazily: ``simctl --help`` lists them from :data:`COMMANDS` without
importing any command module (and so none of pandas, scipy, simpy, matplotlib), and a
command's module is imported only when that command runs or shows its own help.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
from typing import Any

import typer
from typer.core import TyperGroup

#: The distribution on PyPI (``pip install simctl-llm``): its command is ``simctl``, its
#: import package ``simulator`` (the name ``simctl`` there is an unrelated project's).
DISTRIBUTION = "simctl-llm"

#: Every command: its module under ``simulator.cli`` and its one-line help for the listing
#: (a test holds each equal to the first line of the command's own help).
COMMANDS: dict[str, tuple[str, str]] = {
    "replay": ("replay", "Replay TRACE through micro-batching queues, workers and GPUs."),
    "validate": ("validate", "Check a trace and print its statistics."),
    "synth": ("synth", "Write a synthetic trace drawn from stated statistics."),
    "import": ("importer", "Convert a production trace to a simctl trace (every command also reads these files directly)."),
    "profile": ("profile", "Write a profile: measured by the harness on a device, or composed from a GPU's per-op tables."),
    "sweep": ("sweep", "Replay TRACE under every combination of the given axes, in parallel."),
    "compare": ("compare", "Pivot one figure of a sweep across its axes, mark the best cell, optionally plot it."),
    "plan": ("plan", "Find the cheapest configuration (GPU type, count, settings) meeting every SLO, or the fewest GPUs."),
    "plot": ("plot", "Draw figures from event logs (replay --events) and sweep results."),
    "observed": ("observed", "Summarise an observed run per call composition and overall, as replay does."),
    "compare-runs": ("observed", "Compare two runs call by call."),
    "calibrate": ("calibrate", "Fit the free parameters of a profile so that simulated call latencies match RUN's."),
    "serve": ("serve", "Serve SCENARIO over HTTP: its queues, workers, dispatch and GPU locks, for real."),
    "predict": ("predict", "Predict call latency per call composition from a profile, averaged over simulated runs."),
    "load": ("load", "Replay TRACE against a live endpoint in real time and record what it did."),
    "snapshot": ("snapshot", "Take a snapshot of a running system (what waits and runs now) as JSON."),
}


class _LazyCommand(typer.core.TyperCommand):
    """A listing entry that becomes the real command when the command line reaches it."""

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None,
                     **extra: Any) -> Any:
        real = _load(self.name or "")
        return real.make_context(info_name, args, parent=parent, **extra)


class _LazyGroup(TyperGroup):
    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, windows_expand_args: bool = True, **extra: Any) -> Any:
        """Run the command line; a usage error (an option's value that does not parse, an
        unknown option, a missing argument) is one ``error:`` line and exit 2, like every
        other bad input, instead of click's framed box."""
        from typer._click.exceptions import ClickException

        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        from simulator.cli import _common
        from simulator.cli._coercion import plain_values

        plain_values(self)  # (this group's own options: typer builds the group at each run)
        _adopt_registered()  # (a command module the last run imported late)
        _common.interrupt_reported = False
        try:
            code = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        except ClickException as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # bare `simctl`: the help, as before
                typer.echo(exc.format_message())
            else:
                ctx = getattr(exc, "ctx", None)
                where = f"{ctx.command_path}: " if ctx is not None else ""
                message = " ".join(exc.format_message().split())
                typer.echo(f"error: {where}{message}", err=True)
            sys.exit(exc.exit_code)
        if code == _common.EXIT_INTERRUPTED and not _common.interrupt_reported:
            _say_interrupted()
        sys.exit(code if isinstance(code, int) else 0)

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in COMMANDS:
            return None
        return _LOADED.get(cmd_name) or _LazyCommand(cmd_name, help=COMMANDS[cmd_name][1])


app = typer.Typer(
    name="simctl",
    help="Discrete-event simulator and capacity planner for batched LLM inference serving.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
    cls=_LazyGroup,
)

_LOADED: dict[str, Any] = {}


def _load(name: str) -> Any:
    """The click command ``name``, importing its module (and building it) on first use."""
    if name in _LOADED:
        return _LOADED[name]
    module = COMMANDS[name][0]
    try:
        importlib.import_module(f"simulator.cli.{module}")
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.startswith("simulator"):
            raise
        _unavailable(name, exc.name)
    finally:
        _resume_collection()
    _adopt_registered()
    return _LOADED[name]


#: Whether :func:`main` paused the cyclic garbage collector for the imports.
_collection_paused = False


def _pause_collection() -> None:
    """Pause the cyclic garbage collector while the command's modules are imported. Imports
    make hundreds of thousands of objects and free almost none, so the collections they set
    off (one every 700 objects, each now and then over every object) find nothing to free:
    some tenth of a short command's CPU time. Only :func:`main` pauses it (a test or notebook
    calling the command in its own process keeps its collector as it was)."""
    global _collection_paused
    if gc.isenabled():
        gc.disable()
        _collection_paused = True


def _resume_collection() -> None:
    """Once the command's module is imported: collect again, with every object made so far
    (modules, classes, functions: they live as long as the process) frozen out of the
    collector's reach, so that no later collection walks them again."""
    global _collection_paused
    if _collection_paused:
        _collection_paused = False
        gc.freeze()
        gc.enable()


def _adopt_registered() -> None:
    """Build every command registered so far (a command's own, and any a module imported
    since registered) once, to be served from _LOADED by the group: left registered, typer
    would build it again (every option, every help text) each time the app is turned into a
    click group, which typer's CliRunner does on every invocation (milliseconds a command)."""
    from simulator.cli._coercion import plain_values

    for info in app.registered_commands:
        if info.name is not None and info.name not in _LOADED:
            _LOADED[info.name] = typer.main.get_command_from_info(
                info, pretty_exceptions_short=True, rich_markup_mode="markdown")
            plain_values(_LOADED[info.name])
    for group in app.registered_groups:
        if group.name is not None and group.name not in _LOADED:
            _LOADED[group.name] = typer.main.get_group_from_info(
                group, pretty_exceptions_short=True, suggest_commands=True, rich_markup_mode="markdown")
            plain_values(_LOADED[group.name])
    app.registered_commands[:] = [i for i in app.registered_commands if i.name not in _LOADED]
    app.registered_groups[:] = [g for g in app.registered_groups if g.name not in _LOADED]


def _unavailable(name: str, missing: str) -> None:
    """Register ``name`` as a command that says which package to install (a GPU box may have
    torch but not simpy): it is still listed, and every other command keeps working."""
    @app.command(name, help=f"(unavailable here: needs the Python package '{missing}')",
                 context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def _command() -> None:
        from simulator.cli._common import err_console

        err_console.print(f"error: simctl {name} needs the Python package '{missing}': pip install simctl-llm")
        raise typer.Exit(2)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            number = version(DISTRIBUTION)
        except PackageNotFoundError:  # a bare checkout on sys.path, not installed
            number = "unknown (not installed)"
        typer.echo(f"simctl {number}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print simctl's version and exit.")) -> None:
    """Discrete-event simulator and capacity planner for batched LLM inference serving."""


def _one_blas_thread() -> None:
    """Have numpy's OpenBLAS start one thread, not one a core, unless the user said how many.
    A command's array work is elementwise or small linear algebra, which BLAS threads do not
    speed up; started at numpy's import, they cost about 0.1 CPU-second each time and then
    spin waiting for work (CPU time a replay, and each sweep worker beside another, pays).
    Set before numpy is imported (no command module is imported yet); child processes
    (sweep workers) inherit it."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _say_interrupted() -> None:
    """A Ctrl-C outside the part of a command that reports it (while loading, or once its
    work was done): every file written is whole (:mod:`simulator.outputs`)."""
    typer.echo("interrupted; every file written is complete, none half-written; run the same command again to finish",
               err=True)


def _file_size_limit_as_error() -> None:
    """Have a write past the file-size limit (``ulimit -f``) fail with EFBIG, reported in one
    line naming the output, rather than kill the process (SIGXFSZ's default) with a
    half-written temporary file left behind. (CPython ignores SIGXFSZ already; an embedding
    interpreter may not.)"""
    import signal

    if hasattr(signal, "SIGXFSZ"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def main() -> None:
    """Console-script entry point. A Ctrl-C after the command line has ended (as the process
    exits) is said in one line and exit status 130, as one during the command."""
    try:
        _pause_collection()
        from simulator.heap import map_large_allocations
        from simulator.interrupts import carry_lost_interrupts

        carry_lost_interrupts()
        _one_blas_thread()
        map_large_allocations()
        _file_size_limit_as_error()
        app()
    except KeyboardInterrupt:
        from simulator.cli import _common

        if not _common.interrupt_reported:
            _say_interrupted()
        sys.exit(_common.EXIT_INTERRUPTED)
