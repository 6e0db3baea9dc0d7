"""Figures (matplotlib, headless): sweep heatmaps and lines, latency against load, CDFs.

Every function takes plain data (frames from :mod:`simulator.sweep` / :mod:`simulator.plan`),
returns the matplotlib Figure and, given a path, saves it (PNG, SVG or PDF by suffix).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

UNITS = {"latency": "s", "call_latency": "s", "wait": "s", "service": "s", "makespan_s": "s",
         "throughput_prompts_per_s": "prompts/s", "utilization": "fraction"}


def metric_label(metric: str) -> str:
    """``tasks.infobench.latency.p95`` -> ``infobench latency p95 (s)``."""
    parts = metric.split(".")
    if parts[0] == "tasks":
        parts = parts[1:]
    unit = next((u for k, u in UNITS.items() if k in metric.split(".")), "")
    return " ".join(parts) + (f" ({unit})" if unit else "")


def _save(fig, path: str | Path | None):
    if path is not None:
        from simulator.outputs import open_output

        suffix = Path(path).suffix.lstrip(".") or "png"
        with open_output(path, "wb", force=True) as fh:
            fig.savefig(fh, format=suffix, dpi=120, bbox_inches="tight")
    return fig


def heatmap(table: pd.DataFrame, metric: str, title: str, path=None, best: tuple | None = None):
    """A pivot table (index × columns of means) as an annotated heatmap; ``best`` cell outlined."""
    fig, ax = plt.subplots(figsize=(1.2 * table.shape[1] + 3, 0.6 * table.shape[0] + 2))
    values = table.to_numpy(dtype=float)
    im = ax.imshow(values, cmap="viridis_r", aspect="auto")
    ax.set_xticks(range(table.shape[1]), [str(c) for c in table.columns])
    ax.set_yticks(range(table.shape[0]), [str(i) for i in table.index])
    ax.set_xlabel(table.columns.name)
    ax.set_ylabel(table.index.name)
    lo, hi = np.nanmin(values), np.nanmax(values)
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            if np.isfinite(values[i, j]):
                light = hi == lo or (values[i, j] - lo) / (hi - lo) < 0.5  # viridis_r: low is light
                ax.text(j, i, f"{values[i, j]:.3g}", ha="center", va="center",
                        color="k" if light else "w", fontsize=8)
    if best is not None:
        i, j = list(table.index).index(best[0]), list(table.columns).index(best[1])
        ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2.5))
    fig.colorbar(im, ax=ax, label=metric_label(metric))
    ax.set_title(title)
    return _save(fig, path)


def lines(agg: pd.DataFrame, x: str, metric: str, title: str, group: str | None = None, path=None):
    """Mean of ``metric`` against numeric axis ``x`` with a 95 % CI band, one line per ``group``."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups = [(None, agg)] if group is None else list(agg.groupby(group, sort=True))
    for name, g in groups:
        g = g.sort_values(x)
        label = None if name is None else f"{group} = {name[0] if isinstance(name, tuple) else name}"
        ax.plot(g[x], g["mean"], marker="o", label=label)
        if g["ci95"].notna().any():
            ax.fill_between(g[x], g["mean"] - g["ci95"], g["mean"] + g["ci95"], alpha=0.2)
    ax.set_xlabel(x)
    ax.set_ylabel(metric_label(metric))
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if group is not None:
        ax.legend()
    return _save(fig, path)


def load_curve(points: pd.DataFrame, slos: Sequence, title: str, path=None):
    """Each SLO's figure against the load multiplier (``rate_scale``), with its bound."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for slo in slos:
        line, = ax.plot(points["rate_scale"], points[slo.figure], marker="o", label=str(slo))
        ax.axhline(slo.bound, color=line.get_color(), linestyle="--", alpha=0.7)
    ax.set_xlabel("load (rate scale: 1 = the trace as recorded)")
    ax.set_ylabel("figure (s, or count)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def latency_cdf(logs: dict[str, pd.DataFrame], title: str = "Latency CDF", task: str | None = None, path=None):
    """Empirical CDFs of prompt latency, one line per named event log."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, log in logs.items():
        rows = log if task is None else log[log["task"] == task]
        lat = np.sort((rows["done_at"] - rows["arrived_at"]).to_numpy())
        ax.step(lat, np.arange(1, lat.size + 1) / lat.size, where="post", label=name)
    ax.set_xlabel("latency (s)")
    ax.set_ylabel("fraction of prompts")
    ax.set_title(title + (f" — {task}" if task else ""))
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)
