"""``simctl validate``: check a trace and print its statistics."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from simulator.cli import app
from simulator.cli._common import console, user_errors
from simulator.cli._tables import print_table_fast
from simulator.trace.formats import load_trace
from simulator.trace.stats import TraceStats, trace_stats


@app.command("validate")
def validate_cli(
    trace: Path = typer.Argument(..., help="Trace file (users' batch_arrivals.json or simctl-trace/1)."),
    json_out: bool = typer.Option(False, "--json", help="Print the statistics as JSON on stdout instead of tables."),
) -> None:
    """Check a trace and print its statistics.

    Reads every record, field and time of TRACE, then prints calls, prompts, duration,
    inter-arrival times, prompts per call and task mix. Exit status 2 if it is not a
    valid trace.
    """
    with user_errors():
        stats = trace_stats(load_trace(trace), fit=True)
        if json_out:
            typer.echo(json.dumps(stats.to_dict(), indent=2))
        else:
            print_stats(stats)


def _num(x: float | None, digits: int = 2, unit: str = "") -> str:
    return "–" if x is None else f"{x:,.{digits}f}{unit}"


def print_stats(stats: TraceStats) -> None:
    """Rich tables: overview, inter-arrival times, prompts per call, task mix."""
    console.print(f"[bold]{stats.source}[/bold]: valid {stats.format or ''} trace", highlight=False)

    overview = Table(title="Trace", title_justify="left", show_header=False)
    overview.add_column("", justify="left")
    overview.add_column("", justify="right")
    overview.add_row("calls", f"{stats.calls:,}")
    overview.add_row("prompts", f"{stats.prompts:,}")
    overview.add_row("first arrival", _num(stats.first_arrival, unit=" s"))
    overview.add_row("last arrival (span from 0)", _num(stats.span, unit=" s"))
    overview.add_row("duration (first to last)", _num(stats.duration, unit=" s"))
    overview.add_row("call rate", _num(stats.call_rate, 4, " /s"))
    overview.add_row("prompt rate", _num(stats.prompt_rate, 4, " /s"))
    if stats.prefix is not None:
        pre = stats.prefix
        overview.add_row("prompts with prefix ids", f"{pre.prompts_with_ids:,} ({100 * pre.share:.1f} %)")
        overview.add_row(f"prefix blocks ({pre.block_tokens} tokens)", f"{pre.blocks:,} ({pre.distinct_blocks:,} distinct)")
    print_table_fast(overview, console)

    gaps = stats.inter_arrival
    if gaps is not None:
        table = Table(title=f"Inter-arrival times (s), {gaps.count} gaps", title_justify="left")
        for col in ("mean", "median", "min", "max", "std", "CV"):
            table.add_column(col, justify="right")
        table.add_row(_num(gaps.mean), _num(gaps.median), _num(gaps.min), _num(gaps.max),
                      _num(gaps.std), _num(gaps.cv, 3))
        print_table_fast(table, console)

    fit = stats.arrival_fit
    if fit is not None:
        table = Table(title=f"Fitted inter-arrival model (maximum likelihood on {fit['gaps'] - fit['zero_gaps']} "
                            f"positive gaps; best by AIC: {fit['best']})", title_justify="left")
        for col in ("model", "parameters", "mean", "CV", "AIC", "KS distance"):
            table.add_column(col, justify="left" if col in ("model", "parameters") else "right")
        for c in fit["candidates"]:
            params = ", ".join(f"{k} {v:.4g}" for k, v in c["params"].items())
            name = f"[bold]{c['family']}[/bold]" if c["family"] == fit["best"] else c["family"]
            table.add_row(name, params, _num(c["mean"], 3), _num(c["cv"], 3), f"{c['aic']:,.1f}", _num(c["ks"], 4))
        print_table_fast(table, console)
        if fit["zero_gaps"]:
            console.print(f"{fit['zero_gaps']} of {fit['gaps']} gaps are 0 (simultaneous arrivals); "
                          "the model describes the others", highlight=False)

    sizes = Table(title="Prompts per call", title_justify="left")
    for col in ("prompts", "calls", "share"):
        sizes.add_column(col, justify="right")
    for size, count in stats.prompts_per_call.items():
        sizes.add_row(str(size), str(count), f"{100 * count / stats.calls:.1f} %")
    print_table_fast(sizes, console)

    mix = Table(title="Task mix", title_justify="left")
    for col in ("task", "prompts", "share", "mean prompt tokens", "mean max tokens"):
        mix.add_column(col, justify="left" if col == "task" else "right")
    for task, count in stats.task_counts.items():
        tok = stats.tokens[task]
        mix.add_row(task, str(count), f"{100 * stats.task_fractions[task]:.1f} %",
                    _num(tok.prompt_tokens_mean, 1), _num(tok.max_tokens_mean, 1))
    print_table_fast(mix, console)
