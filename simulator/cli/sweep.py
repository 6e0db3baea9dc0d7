"""``simctl sweep``: replay a trace under the cross product of configuration axes."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from simulator.cli import app
from simulator.cli._common import (
    GENERATED,
    GOODPUT_HELP,
    PERCENTILES_HELP,
    Flags,
    console,
    csv_option,
    interrupted,
    setting_options,
    token_options,
    user_errors,
)
from simulator.cli._tables import print_table_fast
from simulator.cost import load_prices
from simulator.metrics import TokenOptions, figure_key
from simulator.plan import slo_figures
from simulator.profile import DEFAULT_PROFILE, load_profile
from simulator.scenario import build_scenario, parse_set
from simulator.settings import LARGEST_JOBS, LARGEST_SEEDS
from simulator.sweep import (
    Base,
    SweepInterrupted,
    SweepSpec,
    aggregate,
    axes_of,
    metric_column,
    run_sweep,
    seeds_from,
    show_axis_value,
)
from simulator.trace.formats import load_trace


@app.command("sweep")
@setting_options("sweep", axis_help=lambda s: "Comma-separated values to sweep.")
def sweep_cli(
    trace: Path = typer.Argument(..., help="Trace file, or a bundled trace by name ('example')."),
    out: Path = typer.Option(..., "--out", "-o", help="Results file (.parquet); re-running resumes it."),
    config: Path | None = typer.Option(None, "--config", "-c", help="Base scenario: TOML file or bundled name "
                                          "(settings not swept; axes override it)."),
    profile: str = typer.Option(DEFAULT_PROFILE, "--profile", "-p", help="Profile file or bundled name."),
    task: str | None = typer.Option(None, "--task", help="Apply task axes to this task only "
                                       "(default: every GPU task)."),
    flags: Flags = GENERATED,  # one option per setting (simulator.settings): axes and run settings
    seeds: int = typer.Option(1, "--seeds", min=1, max=LARGEST_SEEDS, help="Seeds per configuration (0..N-1); figures get 95 % CIs."),
    set_values: list[str] = typer.Option([], "--set", help="Override any field of the base scenario: KEY=VALUE with a "
                                         "dotted KEY, e.g. tasks.graph.cpu_workers=4 (repeatable)."),
    jobs: int | None = typer.Option(None, "--jobs", "-j", min=1, max=LARGEST_JOBS, help="Local processes (default: all cores; a small sweep runs in this process)."),
    cluster: str | None = typer.Option(None, "--cluster", help="Run on a Dask cluster, e.g. tcp://HOST:8786."),
    metric: str = typer.Option("overall.latency.p95", "--metric", help="Figure to rank configurations by at the end."),
    prices: str | None = typer.Option(None, "--prices", help="Price table of the cost figures (cost.usd ...): JSON "
                                      "file or bundled name (default modal-serverless)."),
    percentiles: str = typer.Option("50,90,99", "--percentiles", help=PERCENTILES_HELP + " Columns tokens.ttft_ms.p50 ..."),
    goodput: str | None = typer.Option(None, "--goodput", help=GOODPUT_HELP + " Columns tokens.goodput_per_s, "
                                       "tokens.goodput_fraction."),
    force: bool = typer.Option(False, "--force", help="Start over: discard an existing results file (and replace the "
                               "--csv file)."),
    csv_out: str | None = csv_option("one row per replay (configuration and seed) and task, and one overall"),
) -> None:
    """Replay TRACE under every combination of the given axes, in parallel.

    Rows stream into OUT as they finish; an interrupted sweep loses nothing, and running the
    same command again resumes it.
    """
    with user_errors():
        if csv_out is not None:
            from simulator.outputs import check_writable

            check_writable(csv_out, force=force, inputs=(Path(trace), out))
        axes = flags.axis_values()
        run = flags.values("run")
        spec = SweepSpec(axes, seeds_from(seeds), task)
        loaded = load_trace(trace)
        tokens = token_options(percentiles, goodput, "ms")
        figure_key(metric, slo_figures(loaded.tasks, tokens.percentiles), "--metric")
        # (default token options: None, so results files written before keep their hashes)
        chosen = tokens if tokens != TokenOptions() else None
        base = Base(loaded, load_profile(profile),
                    build_scenario(path=config, run=run, overrides=parse_set(set_values)), load_prices(prices), chosen)
        columns = [TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("eta"), TimeRemainingColumn()]
        with Progress(*columns, console=console, transient=True) as bar:
            job = bar.add_task("sweep", total=None)

            def progress(done: int, total: int) -> None:
                bar.update(job, completed=done, total=total)

            try:
                result = run_sweep(spec, base, out, workers=jobs, cluster=cluster, force=force, progress=progress)
            except SweepInterrupted as stop:
                bar.stop()
                interrupted(f"interrupted; {stop.kept} of {stop.total} rows kept in {stop.out}; "
                            "run the same command to resume")
        console.print(f"{out}: {result.ran} replays run, {result.skipped} already in the file skipped, "
                      f"{len(result.frame)} rows", highlight=False)
        if csv_out is not None:
            from simulator.outputs import task_rows, write_csv

            write_csv([row for record in result.frame.to_dict("records") for row in task_rows(record)],
                      csv_out, force=force)
            console.print(f"wrote {csv_out}", highlight=False)
        print_best(result.frame, metric)


def print_best(frame, metric: str, top: int = 5) -> None:
    """The best configurations by ``metric`` (mean over seeds, with a 95 % CI when seeds > 1)."""
    if frame.empty:
        return
    metric = metric_column(frame, metric)
    by = axes_of(frame) or ["config_key"]
    agg = aggregate(frame, metric, by).sort_values("mean").head(top)
    table = Table(title=f"Best by {metric} (lower is better)", title_justify="left")
    for col in by:
        table.add_column(col)
    table.add_column(metric, justify="right")
    for row in agg.to_dict("records"):
        ci = f" ± {row['ci95']:.2f}" if row["n"] > 1 else ""
        table.add_row(*(show_axis_value(row[c]) for c in by), f"{row['mean']:.2f}{ci}")
    print_table_fast(table, console)
