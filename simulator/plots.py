"""Figures (matplotlib, headless): sweep heatmaps and lines, latency against load, CDFs.

Every function takes plain data (frames from :mod:`simulator.sweep` / :mod:`simulator.plan`),
returns the matplotlib Figure and, given a path, saves it (PNG, SVG or PDF by suffix).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import sys

import matplotlib

if "ipykernel" not in sys.modules:
    matplotlib.use("Agg")  # scripts and the CLI write files; notebooks keep their inline backend
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
        plt.close(fig)  # written: free it (the Figure object stays inspectable)
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


#: Line styles and markers that stay distinguishable in grayscale.
STYLES = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ((0, (5, 1)), "v"), ((0, (1, 1)), "P")]
HATCHES = ["", "//", "..", "xx", "\\\\", "++", "oo"]


def served(log: pd.DataFrame) -> pd.DataFrame:
    """The prompts that were served (those turned away by a queue limit have no instants)."""
    from simulator.events import SERVED

    return log[log["status"].isin(SERVED)] if "status" in log else log


def _style(i: int) -> dict:
    ls, marker = STYLES[i % len(STYLES)]
    return {"linestyle": ls, "marker": marker, "markevery": 0.1}


def latency_cdf(logs: dict[str, pd.DataFrame], title: str = "Latency CDF", task: str | None = None,
                path=None, log_x: bool = False, slo: float | None = None,
                percentiles: Sequence[float] = (50, 95, 99)):
    """Empirical CDFs of prompt latency (``done_at - arrived_at``), one line per named event log,
    with markers at ``percentiles`` and an optional vertical SLO line."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (name, log) in enumerate(logs.items()):
        rows = served(log if task is None else log[log["task"] == task])
        lat = np.sort((rows["done_at"] - rows["arrived_at"]).to_numpy(float))
        if lat.size == 0:
            continue
        y = np.arange(1, lat.size + 1) / lat.size
        style = _style(i)
        line, = ax.step(lat, y, where="post", label=name, linestyle=style["linestyle"])
        marks = np.percentile(lat, percentiles)
        ax.plot(marks, np.array(percentiles) / 100, linestyle="none", marker=style["marker"],
                color=line.get_color(), markersize=6)
    if slo is not None:
        ax.axvline(slo, color="black", linestyle="--", linewidth=1, label=f"SLO {slo:g} s")
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel("latency (s)" + (", log scale" if log_x else ""))
    ax.set_ylabel("fraction of prompts")
    ax.set_title(title + (f" — {task}" if task else "") + "  (markers: p" + "/p".join(f"{p:g}" for p in percentiles) + ")")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def queue_depth(log: pd.DataFrame) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per queue, the step function of prompts waiting (arrived, not yet batched) over time;
    prompts turned away are left out."""
    out = {}
    for queue, rows in served(log).groupby("queue", sort=True):
        times = np.concatenate([rows["arrived_at"].to_numpy(float), rows["batched_at"].to_numpy(float)])
        steps = np.concatenate([np.ones(len(rows)), -np.ones(len(rows))])
        order = np.lexsort((-steps, times))  # at equal times count the arrival first
        out[str(queue)] = (times[order], np.cumsum(steps[order]))
    return out


def timeline(log: pd.DataFrame, title: str = "Timeline", path=None, window: tuple[float, float] | None = None):
    """Three panels over time: waiting prompts per queue, batches per GPU (a Gantt chart coloured
    and hatched by task), and the fraction of GPUs busy."""
    fig, (q_ax, g_ax, u_ax) = plt.subplots(3, 1, figsize=(10, 8), sharex=True,
                                         gridspec_kw={"height_ratios": [2, 2, 1]})
    for i, (queue, (t, depth)) in enumerate(queue_depth(log).items()):
        q_ax.step(t, depth, where="post", label=queue, linestyle=_style(i)["linestyle"])
    q_ax.set_ylabel("prompts waiting")
    q_ax.legend(fontsize=8, ncol=3)
    q_ax.set_title(title)
    on_gpu = served(log)
    on_gpu = on_gpu[on_gpu["gpu"].notna()]
    # A continuous engine's "batch" is the prompts that joined in one iteration: its bar runs
    # until the last of them leaves.
    batches = on_gpu.groupby("batch_id").agg(task=("task", "first"), gpu=("gpu", "first"),
                                             start=("started_at", "first"), end=("done_at", "max"))
    tasks = sorted(batches["task"].unique())
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, task in enumerate(tasks):
        b = batches[batches["task"] == task]
        g_ax.barh(b["gpu"].astype(int), b["end"] - b["start"], left=b["start"], height=0.6,
                  color=colors[i % len(colors)], hatch=HATCHES[i % len(HATCHES)], edgecolor="black",
                  linewidth=0.3, alpha=0.75, label=task)
    n_gpus = int(batches["gpu"].max()) + 1 if len(batches) else 0
    g_ax.set_yticks(range(n_gpus), [f"GPU {g}" for g in range(n_gpus)])
    g_ax.set_ylabel("batches")
    if tasks:
        g_ax.legend(fontsize=8)
    # utilisation: GPUs with at least one batch running, as a fraction of all
    if len(batches):
        edges = np.unique(np.concatenate([batches["start"], batches["end"]]))
        mids = (edges[:-1] + edges[1:]) / 2
        busy = np.zeros(mids.size)
        for g in range(n_gpus):
            b = batches[batches["gpu"] == g]
            s, e = b["start"].to_numpy(), b["end"].to_numpy()
            busy += ((mids[:, None] >= s) & (mids[:, None] < e)).any(axis=1)
        u_ax.step(edges[:-1], busy / n_gpus, where="post", color="black")
    u_ax.set_ylabel("GPUs busy")
    u_ax.set_ylim(0, 1.05)
    u_ax.set_xlabel("time (s)")
    if window:
        u_ax.set_xlim(*window)
    for ax in (q_ax, g_ax, u_ax):
        ax.grid(alpha=0.3)
    return _save(fig, path)


def batch_sizes(log: pd.DataFrame, title: str = "Batch sizes", path=None):
    """Distribution of batch sizes per task (bars side by side, hatched per task)."""
    batches = served(log).groupby("batch_id").agg(task=("task", "first"), size=("batch_size", "first"))
    tasks = sorted(batches["task"].unique())
    sizes = np.arange(1, int(batches["size"].max()) + 1)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    width = 0.8 / max(len(tasks), 1)
    for i, task in enumerate(tasks):
        counts = batches[batches["task"] == task]["size"].value_counts().reindex(sizes, fill_value=0)
        ax.bar(sizes + (i - (len(tasks) - 1) / 2) * width, counts / counts.sum(), width=width,
               hatch=HATCHES[i % len(HATCHES)], edgecolor="black", linewidth=0.4, label=task)
    ax.set_xlabel("batch size (prompts)")
    ax.set_ylabel("fraction of the task's batches")
    ax.set_xticks(sizes)
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def latency_decomposition(log: pd.DataFrame, title: str = "Where the time goes", path=None):
    """Mean latency per task split into queue wait and service (stacked bars)."""
    log = served(log)
    d = log.assign(wait=log["started_at"] - log["arrived_at"], service=log["done_at"] - log["started_at"])
    means = d.groupby("task")[["wait", "service"]].mean().sort_index()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.bar(means.index, means["wait"], label="queue wait (batching + waiting for a GPU)", color="0.75",
           hatch="//", edgecolor="black")
    ax.bar(means.index, means["service"], bottom=means["wait"], label="service (on the device)",
           color="0.35", edgecolor="black")
    ax.set_ylabel("mean latency (s)")
    ax.set_title(title)
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def heatmap_panels(agg: pd.DataFrame, metric: str, rows: str, cols: str, panel: str, title: str, path=None):
    """One heatmap per value of ``panel`` (e.g. topology), cells ``rows`` × ``cols``, shared colour scale."""
    values = sorted(agg[panel].unique())
    fig, axes = plt.subplots(1, len(values), figsize=(4.2 * len(values) + 1, 4), squeeze=False)
    lo, hi = agg["mean"].min(), agg["mean"].max()
    im = None
    for ax, v in zip(axes[0], values):
        table = agg[agg[panel] == v].pivot(index=rows, columns=cols, values="mean")
        im = ax.imshow(table.to_numpy(float), cmap="viridis_r", vmin=lo, vmax=hi, aspect="auto")
        ax.set_xticks(range(table.shape[1]), [str(c) for c in table.columns])
        ax.set_yticks(range(table.shape[0]), [str(i) for i in table.index])
        ax.set_xlabel(cols)
        ax.set_ylabel(rows)
        ax.set_title(f"{panel} = {v}")
        for i in range(table.shape[0]):
            for j in range(table.shape[1]):
                x = table.iat[i, j]
                if np.isfinite(x):
                    light = hi == lo or (x - lo) / (hi - lo) < 0.5
                    ax.text(j, i, f"{x:.3g}", ha="center", va="center", fontsize=7, color="k" if light else "w")
    fig.colorbar(im, ax=axes[0].tolist(), label=metric_label(metric))
    fig.suptitle(title)
    return _save(fig, path)


def runs_cdf(runs: dict[str, pd.DataFrame], title: str = "Call latency", path=None,
             timeout: float | None = None):
    """Empirical CDFs of call latency of several runs (per-call tables, failed calls at their
    censored value), overlaid, with the client timeout marked."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (name, calls) in enumerate(runs.items()):
        lat = np.sort(calls["latency_censored_s"].to_numpy(float))
        if lat.size == 0:
            continue
        style = _style(i)
        ax.step(lat, np.arange(1, lat.size + 1) / lat.size, where="post", label=name,
                linestyle=style["linestyle"])
    if timeout is not None:
        ax.axvline(timeout, color="black", linestyle=":", linewidth=1, label=f"client timeout {timeout:g} s")
    ax.set_xlabel("call latency (s; failed calls at the timeout)")
    ax.set_ylabel("fraction of calls")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def calls_scatter(reference: pd.DataFrame, other: pd.DataFrame, names: tuple[str, str],
                  title: str = "Per-call latency", path=None):
    """One point per call: latency in ``other`` against ``reference`` (matched by call id),
    marked by composition class, with the diagonal."""
    merged = reference.merge(other, on="call_id", suffixes=("_a", "_b"))
    fig, ax = plt.subplots(figsize=(6, 6))
    markers = "osD^v"
    for i, (comp, rows) in enumerate(merged.groupby("composition_a", sort=True)):
        ax.scatter(rows["latency_censored_s_a"], rows["latency_censored_s_b"], s=18,
                   marker=markers[i % len(markers)], label=comp, alpha=0.8)
    top = float(np.nanmax(merged[["latency_censored_s_a", "latency_censored_s_b"]].to_numpy())) if len(merged) else 1.0
    ax.plot([0, top], [0, top], color="black", linewidth=0.8, linestyle="--", label="equal")
    ax.set_xlabel(f"{names[0]} call latency (s)")
    ax.set_ylabel(f"{names[1]} call latency (s)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)
