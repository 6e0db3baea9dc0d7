"""``simctl plot``: figures from replay event logs and sweep results (PNG, SVG or PDF)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import typer

from simulator.cli import app
from simulator.cli._common import console, user_errors
from simulator.errors import PlotError
from simulator.outputs import check_figure, check_output_folder

plot_app = typer.Typer(help="Draw figures from event logs (replay --events) and sweep results.",
                       no_args_is_help=True, rich_markup_mode="markdown")
app.add_typer(plot_app, name="plot")

#: The figures ``replay --plot DIR`` writes.
STANDARD_SET = ("cdf.png", "timeline.png", "batch_sizes.png", "decomposition.png")


def _output(path: Path, force: bool) -> Path:
    return check_figure(path, force=force)


def _logs(paths: list[Path], labels: list[str] | None = None) -> dict[str, pd.DataFrame]:
    """The event logs by legend label: ``labels`` in order, else each file's name."""
    from simulator.events import read_event_log

    labels = list(labels or [])
    if labels and len(labels) != len(paths):
        raise PlotError(None, None, None, f"--label: give one per input ({len(paths)}), got {len(labels)}")
    names = labels or [p.stem for p in paths]
    # Equal names (the same file twice, or run/a.parquet and run2/a.parquet) are numbered.
    names = [n if names.count(n) == 1 else f"{n} ({names[:i].count(n) + 1})" for i, n in enumerate(names)]
    return {name: read_event_log(p) for name, p in zip(names, paths, strict=True)}


def _task(logs: dict[str, pd.DataFrame], task: str | None) -> str | None:
    if task is None:
        return None
    tasks = sorted(set().union(*(set(log["task"].unique()) for log in logs.values())))
    if task not in tasks:
        raise PlotError(None, None, None, f"--task: no task {task!r} in the event log(s); valid: {', '.join(tasks)}")
    return task


def write_standard_set(log: pd.DataFrame, folder: Path, name: str, force: bool = False) -> list[Path]:
    """The figures ``replay --plot DIR`` writes for one run."""
    from simulator import plots

    paths = check_output_folder(folder, STANDARD_SET, force=force)
    folder.mkdir(exist_ok=True)
    plots.latency_cdf({t: log[log["task"] == t] for t in sorted(log["task"].unique())},
                      title=f"Latency CDF per task — {name}", path=paths[0])
    plots.timeline(log, title=f"Timeline — {name}", path=paths[1])
    plots.batch_sizes(log, title=f"Batch sizes — {name}", path=paths[2])
    plots.latency_decomposition(log, title=f"Where the time goes — {name}", path=paths[3])
    return paths


@plot_app.command("cdf")
def cdf_cli(
    logs: list[Path] = typer.Argument(..., help="Event logs (.parquet/.csv), overlaid."),
    output: Path = typer.Option(..., "-o", "--output", help="Figure to write (.png, .svg, .pdf)."),
    label: list[str] = typer.Option([], "--label", help="Legend label of each log, in order (repeat; default: file names)."),
    task: str | None = typer.Option(None, "--task", help="Only this task's prompts."),
    log_x: bool = typer.Option(False, "--log-x", help="Logarithmic latency axis."),
    slo: float | None = typer.Option(None, "--slo", help="Draw an SLO line at this latency (s)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing figure."),
) -> None:
    """Latency CDFs of one or more runs, with p50/p95/p99 markers."""
    with user_errors():
        from simulator import plots

        _output(output, force)
        loaded = _logs(logs, label)
        plots.latency_cdf(loaded, task=_task(loaded, task), log_x=log_x, slo=slo, path=output)
        console.print(f"wrote {output}", highlight=False)


def _one_log(log: Path, output: Path, force: bool, draw, title: str) -> None:
    with user_errors():
        _output(output, force)
        loaded = next(iter(_logs([log]).values()))
        draw(loaded, f"{title} — {log.stem}", output)
        console.print(f"wrote {output}", highlight=False)


@plot_app.command("timeline")
def timeline_cli(log: Path = typer.Argument(..., help="Event log."),
                 output: Path = typer.Option(..., "-o", "--output"),
                 force: bool = typer.Option(False, "--force")) -> None:
    """Queue depth per queue, batches per GPU (Gantt, by task) and GPU utilisation over time; for
    a run with a replica pool, the replicas (up, requested, ready) against the calls arriving and
    in flight."""
    from simulator import plots

    def draw(d, t, p):
        return plots.replica_timeline(d, t, p) if "replicas" in d.attrs else plots.timeline(d, t, p)

    _one_log(log, output, force, draw, "Timeline")


@plot_app.command("batches")
def batches_cli(log: Path = typer.Argument(..., help="Event log."),
                output: Path = typer.Option(..., "-o", "--output"),
                force: bool = typer.Option(False, "--force")) -> None:
    """Batch-size distribution per task."""
    from simulator import plots

    _one_log(log, output, force, lambda d, t, p: plots.batch_sizes(d, t, p), "Batch sizes")


@plot_app.command("decomposition")
def decomposition_cli(log: Path = typer.Argument(..., help="Event log."),
                      output: Path = typer.Option(..., "-o", "--output"),
                      force: bool = typer.Option(False, "--force")) -> None:
    """Mean latency per task split into queue wait and service."""
    from simulator import plots

    _one_log(log, output, force, lambda d, t, p: plots.latency_decomposition(d, t, p), "Where the time goes")


@plot_app.command("heatmap")
def heatmap_cli(
    results: Path = typer.Argument(..., help="Sweep results (.parquet)."),
    output: Path = typer.Option(..., "-o", "--output"),
    metric: str = typer.Option("overall.latency.p95", "--metric", "-m"),
    rows: str = typer.Option("flush", "--rows"), cols: str = typer.Option("max_batch", "--cols"),
    panel: str = typer.Option("topology", "--panel", help="One panel per value of this axis."),
    where: list[str] = typer.Option([], "--where", help="Fix another axis: AXIS=VALUE."),
    force: bool = typer.Option(False, "--force"),
) -> None:
    """Heatmaps of a sweep figure (rows × cols), one panel per value of --panel."""
    with user_errors():
        from simulator import plots
        from simulator.cli.compare import parse_where
        from simulator.sweep import aggregate, axes_of, read_results

        _output(output, force)
        frame = parse_where(where, read_results(results)[0])
        axes = [rows, cols, panel]
        for a in axes:
            if a not in axes_of(frame):
                raise PlotError(None, None, None, f"{a!r} is not an axis of this sweep (axes: {', '.join(axes_of(frame))})")
        others = [a for a in axes_of(frame) if a not in axes and frame[a].nunique() > 1]
        if others:
            raise PlotError(None, None, None, f"axis {others[0]!r} also varies; fix it with --where {others[0]}=VALUE")
        plots.heatmap_panels(aggregate(frame, metric, axes), metric, rows, cols, panel,
                             f"{metric} ({results.name})", output)
        console.print(f"wrote {output}", highlight=False)


@plot_app.command("load")
def load_cli(
    results: Path = typer.Argument(..., help="Sweep results with a rate_scale axis (.parquet)."),
    output: Path = typer.Option(..., "-o", "--output"),
    metric: str = typer.Option("overall.latency.p95", "--metric", "-m"),
    group: str | None = typer.Option(None, "--group", help="One line per value of this axis."),
    where: list[str] = typer.Option([], "--where", help="Fix another axis: AXIS=VALUE."),
    force: bool = typer.Option(False, "--force"),
) -> None:
    """A figure against load (rate_scale), mean over seeds with 95 % CI bands."""
    with user_errors():
        from simulator import plots
        from simulator.cli.compare import parse_where
        from simulator.sweep import aggregate, axes_of, read_results

        _output(output, force)
        frame = parse_where(where, read_results(results)[0])
        if "rate_scale" not in frame.columns:
            raise PlotError(results, None, None, "has no rate_scale axis (sweep with --rate-scale 0.5,1,2,...)")
        by = ["rate_scale"] + ([group] if group is not None else [])
        if group is not None and group not in axes_of(frame):
            raise PlotError(None, None, None, f"--group: {group!r} is not an axis (axes: {', '.join(axes_of(frame))})")
        others = [a for a in axes_of(frame) if a not in by and frame[a].nunique() > 1]
        if others:
            raise PlotError(None, None, None, f"axis {others[0]!r} also varies; add --group {others[0]} or --where {others[0]}=VALUE")
        plots.lines(aggregate(frame, metric, by), "rate_scale", metric, f"{metric} against load ({results.name})",
                    group=group, path=output)
        console.print(f"wrote {output}", highlight=False)
