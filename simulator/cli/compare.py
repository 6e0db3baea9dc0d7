"""``simctl compare``: a pivot table of one figure across sweep axes; optional plot."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import pandas as pd
import typer
from rich.table import Table

from simulator.cli import app
from simulator.cli._common import console, user_errors
from simulator.sweep import SweepError, aggregate, axes_of, read_results


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
    by: Optional[str] = typer.Option(None, "--by", help="One or two axes for rows (and columns); default: the varying axes."),
    where: list[str] = typer.Option([], "--where", help="Fix an axis: AXIS=VALUE (repeatable)."),
    higher_is_better: bool = typer.Option(False, "--higher-is-better", help="Best cell is the largest (e.g. throughput)."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a heatmap (two axes) or lines with CI bands (one numeric axis)."),
) -> None:
    """Pivot one figure of a sweep across its axes, mark the best cell, optionally plot it."""
    with user_errors():
        frame, meta = read_results(results)
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
            raise SweepError(None, None, None, f"axis {others[0]!r} also varies "
                             f"({', '.join(map(str, sorted(frame[others[0]].unique())))}); "
                             f"add it to --by or fix it with --where {others[0]}=VALUE")
        agg = aggregate(frame, metric, axes)
        best_at = agg["mean"].idxmax() if higher_is_better else agg["mean"].idxmin()
        best = agg.astype(object).loc[best_at]
        seeds = int(agg["n"].max())
        table = Table(title=f"{metric} — mean over {seeds} seed(s)" + (", ± 95 % CI" if seeds > 1 else "")
                      + f"; best {'max' if higher_is_better else 'min'} marked *", title_justify="left")
        if len(axes) == 1:
            table.add_column(axes[0])
            table.add_column(metric, justify="right")
            for i, row in agg.astype(object).iterrows():
                table.add_row(str(row[axes[0]]), _cell(row, i == best_at))
        else:
            cols = sorted(agg[axes[1]].unique())
            table.add_column(f"{axes[0]} \\ {axes[1]}")
            for c in cols:
                table.add_column(str(c), justify="right")
            for r in sorted(agg[axes[0]].unique()):
                cells = []
                for c in cols:
                    hit = agg[(agg[axes[0]] == r) & (agg[axes[1]] == c)]
                    cells.append(_cell(hit.iloc[0], hit.index[0] == best_at) if len(hit) else "–")
                table.add_row(str(r), *cells)
        console.print(table)
        console.print("best: " + ", ".join(f"{a}={best[a]}" for a in axes) + f" -> {best['mean']:.3f}", highlight=False)
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


def _cell(row, is_best: bool) -> str:
    text = f"{row['mean']:.2f}" + (f" ± {row['ci95']:.2f}" if row["n"] > 1 else "")
    return f"[bold green]*{text}[/bold green]" if is_best else text
