"""What every command shares: turning library errors into one line and exit status 2, and
the options generated from the settings schema."""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import typer
from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from simulator import settings
from simulator.cli._tables import print_table_fast
from simulator.errors import ScenarioError, SimctlError, SimctlWarning, TraceError, shown

#: Tables and progress go to stdout; errors and warnings to stderr.
console = Console()
err_console = Console(stderr=True, highlight=False, soft_wrap=True)

EXIT_INPUT_ERROR = 2
#: Exit status of a command stopped by Ctrl-C (128 + SIGINT, as a shell reports it).
EXIT_INTERRUPTED = 130
#: Whether this command line has said how it was interrupted (read by ``simctl``'s main,
#: which says it for a command interrupted anywhere else).
interrupt_reported = False


def interrupted(message: str) -> NoReturn:
    """Say on stderr, in one line, what an interrupted command kept; exit 130."""
    global interrupt_reported
    err_console.print(message, markup=False, highlight=False)
    sys.stderr.flush()
    interrupt_reported = True
    raise typer.Exit(EXIT_INTERRUPTED)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Report :class:`SimctlError` (and unreadable files) as ``error: ...`` and exit 2.

    Warnings the library issues (:class:`SimctlWarning`) are printed as ``warning: ...``;
    its notices (:mod:`simulator.notices`) at once, as they come.
    """
    from simulator import notices, outputs

    before, outputs.waiting = outputs.waiting, _say_now
    before_notice, notices.show = notices.show, _say_now
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SimctlWarning)
        try:
            with _errors_to_exit():
                yield
        finally:
            outputs.waiting = before
            notices.show = before_notice
            for w in list(caught):  # re-emitting below appends to ``caught``
                if issubclass(w.category, SimctlWarning):
                    warn(str(w.message))
                else:
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def _say_now(line: str) -> None:
    """Say a line at once on stderr: an output waits for another simctl writing it, or the
    fast engine is about to compile."""
    err_console.print(shown(line), markup=False)
    sys.stderr.flush()


@contextlib.contextmanager
def _errors_to_exit() -> Iterator[None]:
    try:
        yield
    except SimctlError as exc:
        err_console.print(f"error: {exc}", markup=False)
        raise typer.Exit(EXIT_INPUT_ERROR) from None
    except OSError as exc:
        if exc.filename is None:  # not about a file the user named: a bug, with its traceback
            raise
        # Any file the system refuses (missing, a folder, no permission, a name too long):
        # the name, shortened when it is longer than a line, and the system's reason.
        name = str(exc.filename)
        short = name if len(name) <= 200 else f"{name[:60]}...{name[-20:]} ({len(name):,} characters)"
        err_console.print(f"error: {shown(short)}: {exc.strerror}", markup=False)
        raise typer.Exit(EXIT_INPUT_ERROR) from None


def write_json(text: str, json_out: str | None, force: bool) -> bool:
    """Write the JSON ``text`` where ``--json`` says: ``-`` standard output (then the command
    prints nothing else: the return is ``True``), a file (atomically, refusing to overwrite
    without ``force``), or nowhere (``None``)."""
    if json_out == "-":
        sys.stdout.write(text + "\n")
        return True
    if json_out:
        from simulator.outputs import open_output

        with open_output(json_out, force=force) as fh:
            fh.write(text)
    return False


def csv_option(what: str = "one row per task and overall") -> Any:
    return typer.Option(None, "--csv", help=f"Write a CSV summary to FILE: {what}, flat columns.")


def summary_csv_rows(summary: Mapping[str, Any], run: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A replay summary's CSV rows: one per task, one overall and one per call composition,
    each starting with the ``run``'s columns (what names the run) and the run-wide figures
    (makespan, GPU-seconds, cost). Settings stay in the JSON summary (``--json``)."""
    from simulator.outputs import flat_record, task_rows

    kept = {k: v for k, v in summary.items() if k not in ("config", "gpus")}
    return task_rows({**run, **flat_record(kept)}, {"compositions": "composition"})


def warn(message: str) -> None:
    """Print a one-line warning on stderr."""
    err_console.print(f"warning: {shown(message)}", markup=False)
    sys.stderr.flush()


def _cell_width(cell: object) -> int:
    if not isinstance(cell, str):
        return len(str(cell))
    # markup ("[bold]", ":emoji:") takes no width: parsed only where a cell may hold some
    return Text.from_markup(cell).cell_len if "[" in cell or ":" in cell else cell_len(cell)


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
        print_table_fast(table, out)
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
        print_table_fast(part, out)


# -- options generated from the settings ---------------------------------------------------


@dataclass(frozen=True)
class Flags:
    """The setting flags of one command line: setting name -> what was given (``None``: the
    flag was not given). Axis flags (sweep, plan) hold their text (``"0,0.5"``)."""

    given: Mapping[str, Any]
    axes: frozenset[str] = frozenset()

    def values(self, scope: str) -> dict[str, Any]:
        """The single-valued flags given of ``scope`` (``task`` or ``run``), checked;
        :class:`ScenarioError` naming the flag (``--max-batch: must be ...``)."""
        out = {}
        for name, value in self.given.items():
            setting = settings.SCOPES[scope].get(name)
            if setting is None or value is None or name in self.axes:
                continue
            try:
                out[name] = setting.check(value)
            except ScenarioError as exc:
                raise ScenarioError(None, None, None, f"{setting.flag}: {exc.message}") from None
        return out

    def axis_values(self) -> dict[str, tuple[Any, ...]]:
        """The axis flags given, parsed by their settings' types (``{"flush": (0.0, 0.5)}``)."""
        from simulator.sweep import axes_from_options

        return axes_from_options({name: self.given[name] for name in self.axes})


#: The default of a command's ``flags`` parameter, which :func:`setting_options` replaces by
#: the generated options.
GENERATED = Flags({})


def setting_options(command: str, axis_help: Callable[[settings.Setting], str] | None = None
                    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give ``command`` one option per setting that it takes as a flag (``Setting.cli``), in
    place of its parameter ``flags``, which receives them all as one :class:`Flags`.

    Each option is the setting's flag, its help the setting's (with the valid names and the
    default). With ``axis_help`` (sweep, plan) a sweepable setting's option takes
    comma-separated values, its help ending with ``axis_help(setting)``; every other option
    takes one value of the setting's type."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(func, eval_str=True)
        chosen = settings.for_command(command)
        axes = frozenset(s.name for s in chosen if axis_help is not None and s.sweepable)
        generated = [
            inspect.Parameter(s.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                              annotation=str | None if s.name in axes else s.value_type | None,
                              default=typer.Option(None, s.flag,
                                                   help=_option_help(command, s, axis_help, s.name in axes)))
            for s in chosen
        ]
        params = []
        for param in signature.parameters.values():
            params.extend(generated if param.name == "flags" else [param])

        @functools.wraps(func)
        def command_with_settings(**kwargs: Any) -> Any:
            given = {s.name: kwargs.pop(s.name) for s in chosen}
            return func(**kwargs, flags=Flags(given, axes))

        command_with_settings.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        command_with_settings.__annotations__ = {p.name: p.annotation for p in params}
        return command_with_settings

    return decorate


def _option_help(command: str, setting: settings.Setting, axis_help: Callable[[settings.Setting], str] | None,
                 axis: bool) -> str:
    """A setting's help as ``command`` shows it: what it sets (for every GPU task, in replay),
    the valid names where the help does not list them, who reads it where not everyone does,
    then how to give a list (an axis) or the default."""
    text = setting.help
    if setting.scope == "task" and command == "replay":
        text += ", every GPU task"
    names = setting.names()
    if names and not all(n in setting.help for n in names):
        text += ": " + ", ".join(names)
    text += "."
    if setting.read_by or setting.kinds:
        text += f" Read by {setting.readers()}."
    if axis and axis_help is not None:
        return f"{text} {axis_help(setting)}"
    return f"{text} [default: {setting.default_text()}]"


# -- the token figures: options and tables shared by the commands that show them -----------

PERCENTILES_HELP = "Percentiles of TTFT, ITL, TPOT and end-to-end latency, comma-separated (mean too)."
GOODPUT_HELP = ("Per-request SLO for goodput, e.g. ttft:200ms,tpot:50ms,e2e:2s (itl too; ms or s): a request is "
                "good if it meets every bound given.")
UNITS_HELP = "Unit of TTFT, ITL, TPOT and end-to-end latency in tables: ms or s (JSON is always ms, keys *_ms)."
TIMING_LABELS = {"ttft": "TTFT", "itl": "ITL", "tpot": "TPOT", "e2e": "E2E"}


def token_options(percentiles: str, goodput: str | None, units: str):
    """The :class:`~simulator.metrics.TokenOptions` of ``--percentiles`` and ``--goodput``,
    ``--units`` checked; :class:`~simulator.errors.FigureError` naming the option."""
    from simulator.errors import FigureError
    from simulator.metrics import TokenOptions, parse_goodput, parse_percentiles

    if units not in ("ms", "s"):
        raise FigureError(None, None, None, f"--units {units!r}: must be ms or s")
    return TokenOptions(parse_percentiles(percentiles), None if goodput is None else parse_goodput(goodput))


def print_token_figures(groups: list[tuple[str, dict[str, Any]]], units: str, what: str = "requests") -> None:
    """Two tables of the groups' token figures (:func:`simulator.metrics.token_figures`):
    TTFT, ITL, TPOT and end-to-end latency (in ``units``) per group, then requests and token
    throughputs and, with an SLO, goodput."""
    from simulator.metrics import TOKEN_TIMINGS

    if not groups:
        return
    scale = 1.0 if units == "ms" else 1e-3
    digits = 1 if units == "ms" else 4
    stats = list(groups[0][1][f"{TOKEN_TIMINGS[0]}_ms"])
    timings = Table(title=f"Token timings per {what[:-1]} ({units}; over completed {what})", title_justify="left",
                    box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for col in ("group", "figure", *stats):
        timings.add_column(col, justify="left" if col in ("group", "figure") else "right")
    for label, tok in groups:
        for i, name in enumerate(TOKEN_TIMINGS):
            values = tok[f"{name}_ms"]
            timings.add_row(label if i == 0 else "", TIMING_LABELS[name],
                            *("–" if values[s] is None else f"{values[s] * scale:,.{digits}f}" for s in stats),
                            end_section=i == len(TOKEN_TIMINGS) - 1)
    print_table(timings)
    slo = groups[0][1].get("goodput")
    span = groups[0][1]["span_s"]
    rates = Table(title=f"Throughput over the run's span ({span:,.1f} s, first send to last completion)",
                  title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    cols = [what, "done", f"{what[:3]}/s", "output tok/s", "total tok/s"]
    if slo is not None:
        cols += ["good", "goodput/s"]
    for col in ("group", *cols):
        rates.add_column(col, justify="left" if col == "group" else "right")

    def rate(x: float | None, d: int = 2) -> str:
        return "–" if x is None else f"{x:,.{d}f}"

    for label, tok in groups:
        row = [str(tok["requests"]), str(tok["completed"]), rate(tok["requests_per_s"], 3),
               rate(tok["output_tokens_per_s"], 1), rate(tok["total_tokens_per_s"], 1)]
        if slo is not None:
            fraction = tok["goodput_fraction"]
            row += [f"{tok['good']} ({'–' if fraction is None else f'{100 * fraction:.1f} %'})",
                    rate(tok["goodput_per_s"], 3)]
        rates.add_row(label, *row)
    print_table(rates)
    if slo is not None:
        bounds = ", ".join(f"{TIMING_LABELS[k.removesuffix('_ms')]} <= {v:g} ms" for k, v in slo.items())
        console.print(f"good: completed with {bounds}", highlight=False)
# -- the load flags of serving benchmarks -------------------------------------------------
#
# ``--request-rate``, ``--max-concurrency`` and ``--num-requests`` are the names serving
# benchmarks (vLLM's, SGLang's) give these knobs. Each only translates into what the trace
# and the settings already say (the first N calls; ``rate_scale``; ``client = closed:N``),
# here, once, for every command that takes them.


def request_rate_option() -> Any:
    return typer.Option(None, "--request-rate", help="Send calls at this mean rate (calls/s): scales the trace's "
                        "arrival rate (calls / last arrival instant, as validate reports it) to it. Instead of "
                        "--rate-scale.")


def max_concurrency_option() -> Any:
    return typer.Option(None, "--max-concurrency", min=1, max=settings.LARGEST_COUNT,
                        help="Keep N calls outstanding (closed loop): the same as --client closed:N.")


def num_requests_option() -> Any:
    # A trace's prompts are indexed in 32 bits, so no trace holds more calls than this.
    return typer.Option(None, "--num-requests", min=1, max=settings.LARGEST_TOKENS,
                        help="Use the trace's first N calls only.")


def load_flags(trace: Any, *, request_rate: float | None, max_concurrency: int | None,
               num_requests: int | None, rate_scale_from: str | None = None,
               client: str | None = None) -> tuple[Any, dict[str, Any]]:
    """The trace to run and the settings that ``--request-rate``, ``--max-concurrency`` and
    ``--num-requests`` stand for: ``(first N calls of trace, {"rate_scale": R / its call
    rate, "client": "closed:N"})``, holding only what was given.

    ``rate_scale_from`` names the option that already set the rate scale (``--rate-scale``),
    if one did; ``client`` is the ``--client`` given, if any. Giving the rate twice, or a
    client other than ``closed:N`` with ``--max-concurrency N``, is a :class:`ScenarioError`,
    as are a rate that is not a positive number and more calls than the trace holds."""
    out: dict[str, Any] = {}
    if num_requests is not None:
        if num_requests > len(trace):
            raise ScenarioError(trace.source, None, None, f"--num-requests: the trace has {len(trace):,} calls, "
                                f"fewer than {num_requests:,}")
        trace = trace.head(num_requests)
    if max_concurrency is not None:
        closed = f"closed:{max_concurrency}"
        try:
            same = client is None or settings.parse_client(client) == settings.parse_client(closed)
        except ValueError as exc:
            raise ScenarioError(None, None, None, f"--client: {exc}") from None
        if not same:
            raise ScenarioError(None, None, None, f"--max-concurrency {max_concurrency} means --client {closed}; "
                                f"it contradicts --client {client}: give one of them")
        out["client"] = closed
    if request_rate is not None:
        if rate_scale_from is not None:
            raise ScenarioError(None, None, None, f"--request-rate and {rate_scale_from} both set the arrival rate; "
                                "give one of them")
        if not (math.isfinite(request_rate) and request_rate > 0):
            raise ScenarioError(None, None, None, f"--request-rate: must be a number of calls per second > 0, "
                                f"got {request_rate:g}")
        from simulator.trace.stats import trace_stats  # (the rate to scale from: only here)

        rate = trace_stats(trace).call_rate
        if rate is None:
            raise ScenarioError(trace.source, None, None, "--request-rate: every call of the trace arrives at 0 s; "
                                "it has no arrival rate to scale")
        out["rate_scale"] = request_rate / rate
    return trace, out


def parse_task_map(text: str | None) -> dict[str, str]:
    """``"ChatGPT=mmlu,GPT-4=infobench"`` -> ``{"ChatGPT": "mmlu", "GPT-4": "infobench"}``."""
    if not text:
        return {}
    out = {}
    for item in text.split(","):
        source, sep, task = item.partition("=")
        if not sep or not source.strip() or not task.strip():
            raise TraceError(None, None, None, f"--task-map: expected SOURCE=TASK,..., got {item!r}")
        out[source.strip()] = task.strip()
    return out
