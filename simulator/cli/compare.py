"""``simctl compare``: a pivot table of one figure across sweep axes; optional plot."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
import typer
from rich.table import Table

from simulator.cli import app
from simulator.cli._common import console, user_errors
from simulator.cli._tables import print_table_fast
from simulator.errors import SweepError
from simulator.outputs import check_figure
from simulator.sweep import aggregate, axes_of, axis_order, metric_column, read_results, show_axis_value


def parse_where(items: list[str], frame: pd.DataFrame) -> pd.DataFrame:
    """Filter rows by ``axis=value`` conditions (value compared as the column's type)."""
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in frame.columns:
            raise SweepError(None, None, None, f"--where {item!r}: expected AXIS=VALUE with AXIS one of "
                             f"{', '.join(axes_of(frame)) or '(no axes)'}")
        column = frame[name]
        try:
            typed = type(column.dropna().iloc[0].item() if hasattr(column.dropna().iloc[0], "item")
                         else column.dropna().iloc[0])(value)
        except (ValueError, IndexError):
            raise SweepError(None, None, None, f"--where {item!r}: {value!r} is not a value of {name}") from None
        frame = frame[column == typed]
        if frame.empty:
            raise SweepError(None, None, None, f"--where {item!r}: no rows (values of {name}: "
                             f"{', '.join(map(str, sorted(column.unique())))})")
    return frame


@app.command("compare")
def compare_cli(
    results: Path = typer.Argument(..., help="Results file written by simctl sweep."),
    metric: str = typer.Option("overall.latency.p95", "--metric", "-m", help="Figure to compare, e.g. tasks.infobench.latency.p95."),
    by: str | None = typer.Option(None, "--by", help="One or two axes for rows (and columns); default: the varying axes."),
    where: list[str] = typer.Option([], "--where", help="Fix an axis: AXIS=VALUE (repeatable)."),
    higher_is_better: bool = typer.Option(False, "--higher-is-better", help="Best cell is the largest (e.g. throughput)."),
    plot: Path | None = typer.Option(None, "--plot", help="Write a heatmap (two axes) or lines with CI bands (one numeric axis)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing --plot or --csv file."),
    csv_out: str | None = typer.Option(None, "--csv", help="Write the cells to FILE as CSV: one row per cell, its "
                                       "axes, the metric's mean, std, seeds (n) and 95 % CI."),
    slo: list[str] = typer.Option([], "--slo", help='Also judge each cell against an SLO, e.g. "infobench.latency.p95<=180" '
                                  "(repeatable): P(met) over the cell's seeds, (k + 1) / (n + 2)."),
    confidence: float = typer.Option(0.9, "--confidence", help="The P(met) a cell needs for an --slo verdict of met (0-1)."),
) -> None:
    """Pivot one figure of a sweep across its axes, mark the best cell, optionally plot it."""
    with user_errors():
        if plot is not None:
            check_figure(plot, force=force, inputs=(results,))
        if csv_out is not None:
            from simulator.outputs import check_writable

            check_writable(csv_out, force=force, inputs=(results,))
        frame, meta = read_results(results)
        metric = metric_column(frame, metric)
        frame = parse_where(where, frame)
        varying = [a for a in axes_of(frame) if frame[a].nunique() > 1]
        axes = [a.strip().replace("-", "_") for a in by.split(",")] if by else varying
        for a in axes:
            if a not in frame.columns:
                raise SweepError(None, None, None, f"--by: {a!r} is not an axis of this sweep "
                                 f"(axes: {', '.join(axes_of(frame))})")
        if not 1 <= len(axes) <= 2:
            raise SweepError(None, None, None, f"--by: give one or two axes (varying here: {', '.join(varying) or 'none'})")
        others = [a for a in varying if a not in axes]
        if others:
            values = sorted(frame[others[0]].unique(), key=axis_order)
            raise SweepError(None, None, None, f"axis {others[0]!r} also varies "
                             f"({', '.join(map(show_axis_value, values))}); "
                             f"add it to --by or fix it with --where {others[0]}=VALUE")
        slos = _parse_slos(slo, frame, confidence)
        agg = aggregate(frame, metric, axes)
        if csv_out is not None:
            from simulator.outputs import write_csv

            write_csv([{"metric": metric, **row} for row in agg.to_dict("records")], csv_out, force=force)
        best_at = agg["mean"].idxmax() if higher_is_better else agg["mean"].idxmin()
        best = agg.astype(object).loc[best_at]
        tied = tied_with_best(agg, best_at)
        seeds = int(agg["n"].max())
        mark = ("; best marked *" if len(tied) == 1 and seeds > 1 else
                "; cells marked ≈ are indistinguishable from the best at 95 %" if seeds > 1 else "")
        table = Table(title=f"{metric} — mean over {seeds} seed(s)" + (", ± 95 % CI" if seeds > 1 else "")
                      + f" ({'higher' if higher_is_better else 'lower'} is better){mark}", title_justify="left")
        if len(axes) == 1:
            table.add_column(axes[0])
            table.add_column(metric, justify="right", no_wrap=True)
            for i, row in agg.astype(object).iterrows():
                table.add_row(show_axis_value(row[axes[0]]), _cell(row, i in tied, len(tied) > 1))
        else:
            cols = sorted(agg[axes[1]].unique(), key=axis_order)
            table.add_column(f"{axes[0]} \\ {axes[1]}")
            for c in cols:
                table.add_column(show_axis_value(c), justify="right", no_wrap=True)
            for r in sorted(agg[axes[0]].unique(), key=axis_order):
                cells = []
                for c in cols:
                    hit = agg[_same(agg[axes[0]], r) & _same(agg[axes[1]], c)]
                    cells.append(_cell(hit.iloc[0], hit.index[0] in tied, len(tied) > 1) if len(hit) else "–")
                table.add_row(show_axis_value(r), *cells)
        print_table_fast(table, console)
        where_best = ", ".join(f"{a}={show_axis_value(best[a])}" for a in axes)
        if seeds < 2:
            console.print(f"lowest: {where_best} -> {best['mean']:.3f} (one seed: no confidence interval; "
                          f"sweep with --seeds N to tell cells apart)" if not higher_is_better else
                          f"highest: {where_best} -> {best['mean']:.3f} (one seed: no confidence interval; "
                          f"sweep with --seeds N to tell cells apart)", highlight=False)
        elif len(tied) > 1:
            console.print(f"no single best: {len(tied)} of {len(agg)} cells are indistinguishable from "
                          f"{where_best} ({best['mean']:.3f}) at 95 % (Welch t-test)", highlight=False)
        else:
            console.print(f"best: {where_best} -> {best['mean']:.3f}, distinguishable from every other "
                          f"cell at 95 % (Welch t-test)", highlight=False)
        print_unfinished(frame, metric, axes)
        if slos:
            print_slo_verdicts(frame, slos, axes, confidence)
        if plot:
            from simulator import plots

            title = f"{metric} ({Path(results).name})"
            if len(axes) == 2:
                pivot = agg.pivot(index=axes[0], columns=axes[1], values="mean")
                plots.heatmap(pivot, metric, title, plot, best=(best[axes[0]], best[axes[1]]))
            elif pd.api.types.is_numeric_dtype(agg[axes[0]]):
                plots.lines(agg, axes[0], metric, title, path=plot)
            else:
                pivot = agg.set_index(axes[0])[["mean"]].rename(columns={"mean": metric})
                pivot.columns.name = ""
                plots.heatmap(pivot, metric, title, plot, best=(best[axes[0]], metric))
            console.print(f"wrote {plot}", highlight=False)


def _parse_slos(texts: list[str], frame: pd.DataFrame, confidence: float) -> list[Any]:
    """The ``--slo`` objectives, each naming a figure the sweep's rows hold."""
    if not texts:
        return []
    from simulator.plan import parse_slo
    from simulator.uncertainty import check_confidence

    check_confidence(confidence)
    tasks = sorted({c.split(".")[1] for c in frame.columns if c.startswith("tasks.") and c.count(".") >= 2})
    slos = [parse_slo(t, tasks) for t in texts]
    for s in slos:
        metric_column(frame, s.figure, option=f"--slo {s.text!r}:")  # refuses a figure the rows lack
    return slos


def print_slo_verdicts(frame: pd.DataFrame, slos: list[Any], axes: list[str], confidence: float) -> None:
    """Per cell and SLO: P(met) over the cell's rows (its seeds), met when ``p >= confidence``."""
    from simulator.uncertainty import probability_met

    table = Table(title=f"SLOs per cell: P(met) over each cell's seeds, (k + 1) / (n + 2); met at p ≥ {confidence:g}",
                  title_justify="left")
    for a in axes:
        table.add_column(a)
    for s in slos:
        table.add_column(s.text, justify="right", no_wrap=True)
    groups = frame.groupby(axes, sort=False, dropna=False)
    for key, rows in sorted(groups, key=lambda kv: tuple(axis_order(v) for v in (kv[0] if isinstance(kv[0], tuple) else (kv[0],)))):
        values = key if isinstance(key, tuple) else (key,)
        cells = []
        for s in slos:
            column = metric_column(frame, s.figure)
            p = probability_met([s.met(None if v is None or pd.isna(v) else float(v)) for v in rows[column]])
            cells.append(f"met with p = {p.p:.2f}" if p.p >= confidence else f"[red]missed, p = {p.p:.2f}[/red]")
        table.add_row(*(show_axis_value(v) for v in values), *cells)
    print_table_fast(table, console)
    console.print("p from the seeds alone (each one whole run); `simctl plan --worlds N` adds the profile's own "
                  "uncertainty", highlight=False)


def tied_with_best(agg: pd.DataFrame, best_at: Any) -> set[Any]:
    """Index labels of the cells a two-sided Welch t-test at 5 % cannot tell from the best cell
    (the best included). With one seed per cell nothing can be told apart, so every cell with
    the best's value ties and only an exactly equal value does."""
    from scipy import stats

    b = agg.loc[best_at]
    tied = set()
    for i, row in agg.iterrows():
        if i == best_at or row["mean"] == b["mean"]:
            tied.add(i)
            continue
        if min(row["n"], b["n"]) < 2:
            continue
        se2 = row["std"] ** 2 / row["n"] + b["std"] ** 2 / b["n"]
        if not se2 > 0:
            continue  # no spread on either side: the different means are told apart exactly
        t = (row["mean"] - b["mean"]) / math.sqrt(se2)
        df = se2 ** 2 / ((row["std"] ** 2 / row["n"]) ** 2 / (row["n"] - 1) + (b["std"] ** 2 / b["n"]) ** 2 / (b["n"] - 1))
        if 2 * stats.t.sf(abs(t), df) >= 0.05:
            tied.add(i)
    return tied


def print_unfinished(frame: pd.DataFrame, metric: str, axes: list[str]) -> None:
    """Say how many prompts of the metric's group did not finish, where any did not."""
    group = "overall" if metric.startswith("overall.") else ".".join(metric.split(".")[:2])
    column = f"{group}.unfinished"
    if column not in frame.columns or not metric.startswith(("overall.", "tasks.")):
        return
    late = frame.groupby(axes, sort=False, dropna=False)[[column, f"{group}.prompts"]].mean().reset_index()
    late = late[late[column] > 0]
    name = group.removeprefix("tasks.")
    if late.empty:
        console.print(f"every {name} prompt finished in every cell", highlight=False)
        return
    cells = "; ".join(", ".join(f"{a}={show_axis_value(r[a])}" for a in axes) + f": {r[column]:g} of {r[f'{group}.prompts']:g}"
                      for _, r in late.head(6).iterrows())
    more = f" (and {len(late) - 6} more cells)" if len(late) > 6 else ""
    console.print(f"{name} prompts that did not finish (infinitely late in the figures): {cells}{more}",
                  highlight=False)


def _same(column: pd.Series, value: Any) -> pd.Series:
    """Rows whose value is ``value``, where an absent value matches absent ones."""
    return column.isna() if axis_order(value)[0] == 2 else column == value


def _cell(row, tied: bool, ties: bool) -> str:
    text = f"{row['mean']:.2f}" + (f" ± {row['ci95']:.2f}" if row["n"] > 1 else "")
    if not tied or row["n"] < 2:
        return text
    return f"[bold]≈{text}[/bold]" if ties else f"[bold green]*{text}[/bold green]"
