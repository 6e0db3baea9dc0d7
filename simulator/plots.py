"""Figures (matplotlib, headless): sweep heatmaps and lines, latency against load, CDFs.

Every function takes plain data (frames from :mod:`simulator.sweep` / :mod:`simulator.plan`),
returns the matplotlib Figure and, given a path, saves it (PNG, SVG or PDF by suffix).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

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


def _finish(fig, ax, xlabel: str, ylabel: str, title: str, path, legend: bool = True):
    """The labels, title, light grid and legend every single-axes figure has; then save."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend()
    return _save(fig, path)


def readable(x: float) -> str:
    """A number as a person writes it: ``1,100``, ``42.5``, ``0.25``; never ``1.1e+03``;
    ``∞`` for prompts that did not finish."""
    if not np.isfinite(x):
        return "∞" if x > 0 else "–"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 1:
        return f"{x:.1f}"
    return np.format_float_positional(float(f"{x:.2g}"), trim="-")


def tick(value) -> str:
    """An axis value as a tick label (numbers without scientific notation)."""
    if isinstance(value, (float, np.floating)):
        return np.format_float_positional(float(value), trim="-")
    return str(value)


def colour_scale(values: np.ndarray):
    """A norm that keeps a few extreme cells from flattening the rest, and what it did.

    Cells beyond Tukey's far fence (Q3 + 3 IQR) and over twice the largest cell within it
    (a backlog that ran away, say) take the 'over' colour and the scale stops at the largest
    ordinary cell; otherwise finite values spanning more than 30× (all positive) get a log
    scale. Infinite cells (prompts that did not finish) take the 'over' colour too."""
    from matplotlib.colors import LogNorm, Normalize

    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return Normalize(0, 1), ""
    lo, hi = float(finite.min()), float(finite.max())
    q1, q3 = np.percentile(finite, [25, 75])
    ordinary = finite[finite <= q3 + 3 * (q3 - q1)]
    top = float(ordinary.max()) if ordinary.size else hi
    if hi > 2 * top and top > lo:
        return Normalize(lo, top), f" (scale stops at {readable(top)}; larger cells in dark red)"
    if lo > 0 and hi / lo > 30:
        return LogNorm(lo, hi), " (log scale)"
    return Normalize(lo, hi if hi > lo else lo + 1), ""


def _cmap():
    return plt.get_cmap("viridis_r").with_extremes(over="darkred", bad="darkred")


def _annotate(ax, values: np.ndarray, norm, fontsize: int = 8) -> None:
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            x = values[i, j]
            if np.isnan(x):
                continue
            shade = float(np.clip(norm(x), 0, 1)) if np.isfinite(x) else 1.0
            over = not np.isfinite(x) or shade >= 1 and x > norm.vmax
            ax.text(j, i, readable(x), ha="center", va="center", fontsize=fontsize,
                    color="w" if over or shade >= 0.5 else "k")  # viridis_r: low values are light


def heatmap(table: pd.DataFrame, metric: str, title: str, path=None, best: tuple | None = None):
    """A pivot table (index × columns of means) as an annotated heatmap; ``best`` cell outlined."""
    from matplotlib.ticker import FuncFormatter

    fig, ax = plt.subplots(figsize=(1.3 * table.shape[1] + 3, 0.6 * table.shape[0] + 2), constrained_layout=True)
    values = table.to_numpy(dtype=float)
    norm, note = colour_scale(values)
    im = ax.imshow(values, cmap=_cmap(), norm=norm, aspect="auto")
    ax.set_xticks(range(table.shape[1]), [tick(c) for c in table.columns])
    ax.set_yticks(range(table.shape[0]), [tick(i) for i in table.index])
    ax.set_xlabel(table.columns.name)
    ax.set_ylabel(table.index.name)
    _annotate(ax, values, norm)
    if best is not None:
        i, j = list(table.index).index(best[0]), list(table.columns).index(best[1])
        ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2.5))
    bar = fig.colorbar(im, ax=ax, label=metric_label(metric) + note, extend="max" if note.startswith(" (scale") else "neither")
    bar.formatter = FuncFormatter(lambda v, _pos: readable(v))
    bar.update_ticks()
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
    return _finish(fig, ax, x, metric_label(metric), title, path, legend=group is not None)


def load_curve(points: pd.DataFrame, slos: Sequence, title: str, path=None):
    """Each SLO's figure against the load multiplier (``rate_scale``), with its bound."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for slo in slos:
        line, = ax.plot(points["rate_scale"], points[slo.figure], marker="o", label=str(slo))
        ax.axhline(slo.bound, color=line.get_color(), linestyle="--", alpha=0.7)
    return _finish(fig, ax, "load (rate scale: 1 = the trace as recorded)", "figure (s, or count)", title, path)


def pareto(points: Sequence[dict], front: Sequence[int], title: str, path=None):
    """Cost (US $) against the SLO ratio (worst figure / bound; <= 1: every SLO met) of every
    configuration a cheapest plan replayed, one marker per GPU type, the Pareto front joined
    by a step line, the bound at 1. Points with an infinite ratio (prompts that did not
    finish under a latency SLO) are drawn at the top edge."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    finite = [p["slo_ratio"] for p in points if p["usd"] is not None and np.isfinite(p["slo_ratio"])]
    top = max([1.0, *finite]) * 1.15
    types = list(dict.fromkeys(p["gpu_type"] for p in points))
    for i, gpu in enumerate(types):
        mine = [p for p in points if p["gpu_type"] == gpu and p["usd"] is not None]
        ax.scatter([p["usd"] for p in mine], [min(p["slo_ratio"], top) for p in mine],
                   marker=STYLES[i % len(STYLES)][1], alpha=0.55, label=gpu)
    on = sorted((points[i] for i in front if points[i]["usd"] is not None), key=lambda p: p["usd"])
    if on:
        ax.step([p["usd"] for p in on], [min(p["slo_ratio"], top) for p in on], where="post", color="black",
                linewidth=1.2, label="Pareto front")
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="SLO bound")
    ax.set_ylim(0, top * 1.02)
    return _finish(fig, ax, "cost of the run (US $)", "SLO ratio (figure / bound, worst SLO)", title, path)


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
    marked = "  (markers: p" + "/p".join(f"{p:g}" for p in percentiles) + ")"
    return _finish(fig, ax, "latency (s)" + (", log scale" if log_x else ""), "fraction of prompts",
                   title + (f" — {task}" if task else "") + marked, path)


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


#: Past this many calls a whole-run timeline is noise: the plot shows a window of the run,
#: the span of its first TIMELINE_WINDOW calls.
TIMELINE_CALLS = 500
TIMELINE_WINDOW = 200


def timeline(log: pd.DataFrame, title: str = "Timeline", path=None, window: tuple[float, float] | None = None):
    """Three panels over time: waiting prompts per queue, batches per GPU (a Gantt chart coloured
    and hatched by task), and the fraction of GPUs busy.

    A run of more than :data:`TIMELINE_CALLS` calls is shown over a window (the span of its
    first :data:`TIMELINE_WINDOW` calls, unless ``window`` is given), and the title says so."""
    if window is None:
        arrivals = np.sort(log.groupby("call_index")["arrived_at"].min().to_numpy(float))
        if arrivals.size > TIMELINE_CALLS:
            window = (float(arrivals[0]), float(arrivals[TIMELINE_WINDOW - 1]))
            title = f"{title}: first {TIMELINE_WINDOW} of {arrivals.size:,} calls"
    if window is not None:
        lo, hi = window
        log = log[(log["arrived_at"] <= hi) & (log["done_at"].fillna(np.inf) >= lo)]
    fig, (q_ax, g_ax, u_ax) = plt.subplots(3, 1, figsize=(11, 8), sharex=True, constrained_layout=True,
                                         gridspec_kw={"height_ratios": [2, 2, 1]})
    for i, (queue, (t, depth)) in enumerate(queue_depth(log).items()):
        q_ax.step(t, depth, where="post", label=queue, linestyle=_style(i)["linestyle"])
    q_ax.set_ylabel("prompts waiting")
    q_ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside, never over the data
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
        g_ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
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


def replica_timeline(log: pd.DataFrame, title: str = "Replicas", path=None, bins: int = 200):
    """Two panels over the whole run of a log with a replica pool (``log.attrs["replicas"]``):
    the replicas up (started, not stopped), requested (not draining) and ready (serving), as
    steps (:func:`simulator.metrics.replica_timeline`); and the load: calls arriving per
    second (in ``bins`` bins) and calls in flight (arrived, not done)."""
    from simulator.metrics import replica_timeline as counts

    line = counts(log.attrs["replicas"])
    fig, (r_ax, l_ax) = plt.subplots(2, 1, figsize=(11, 6), sharex=True, constrained_layout=True)
    for i, name in enumerate(("up", "requested", "ready")):
        r_ax.step(line["at"], line[name], where="post", label=name, linestyle=_style(i)["linestyle"])
    r_ax.axhline(int(log.attrs["replicas"]["max_replicas"]), color="grey", linewidth=0.8, linestyle=":",
                 label="max_replicas")
    r_ax.set_ylabel("replicas")
    r_ax.set_title(title)
    r_ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    calls = log.groupby("call_index").agg(arrived=("arrived_at", "min"), done=("done_at", "max"))
    arrived = calls["arrived"].to_numpy(float)
    done = calls["done"].to_numpy(float)
    if arrived.size:
        hi = float(line["at"].max()) if len(line) else float(np.nanmax(done))
        edges = np.linspace(0.0, max(hi, 1e-9), bins + 1)
        per_bin, _ = np.histogram(arrived, edges)
        l_ax.step(edges[:-1], per_bin / np.diff(edges), where="post", label="calls arriving / s")
        finished = done[~np.isnan(done)]
        t = np.concatenate([arrived, finished])
        step = np.concatenate([np.ones(arrived.size), -np.ones(finished.size)])
        order = np.lexsort((step, t))
        l_ax.step(t[order], np.cumsum(step[order]), where="post", label="calls in flight", linestyle="--")
    l_ax.set_ylabel("calls")
    l_ax.set_xlabel("time (s)")
    l_ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    for ax in (r_ax, l_ax):
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
    # Below the axes, so it can never cover a bar.
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, fontsize=8, frameon=False)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return _save(fig, path)


def heatmap_panels(agg: pd.DataFrame, metric: str, rows: str, cols: str, panel: str, title: str, path=None):
    """One heatmap per value of ``panel`` (e.g. topology), cells ``rows`` × ``cols``, one colour
    scale for all panels (robust to a few extreme cells, see :func:`colour_scale`)."""
    from matplotlib.ticker import FuncFormatter

    values = sorted(agg[panel].dropna().unique(), key=str)
    fig, axes = plt.subplots(1, len(values), figsize=(4.6 * len(values) + 1.5, 4.4), squeeze=False,
                             constrained_layout=True)
    norm, note = colour_scale(agg["mean"].to_numpy(float))
    im = None
    for ax, v in zip(axes[0], values, strict=True):
        table = agg[agg[panel] == v].pivot(index=rows, columns=cols, values="mean")
        grid = table.to_numpy(float)
        im = ax.imshow(grid, cmap=_cmap(), norm=norm, aspect="auto")
        ax.set_xticks(range(table.shape[1]), [tick(c) for c in table.columns])
        ax.set_yticks(range(table.shape[0]), [tick(i) for i in table.index])
        ax.set_xlabel(cols)
        ax.set_ylabel(rows)
        ax.set_title(f"{panel} = {tick(v)}", fontsize=10)
        _annotate(ax, grid, norm, fontsize=7)
    assert im is not None  # at least one panel (subplots refuses none)
    bar = fig.colorbar(im, ax=axes[0].tolist(), label=metric_label(metric) + note,
                       extend="max" if note.startswith(" (scale") else "neither")
    bar.formatter = FuncFormatter(lambda x, _pos: readable(x))
    bar.update_ticks()
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
    return _finish(fig, ax, "call latency (s; failed calls at the timeout)", "fraction of calls", title, path)


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
    return _finish(fig, ax, f"{names[0]} call latency (s)", f"{names[1]} call latency (s)", title, path)
