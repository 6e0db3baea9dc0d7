"""Summary figures: pure functions of the per-prompt event log.

Nothing here is accumulated during a run; everything is computed from the log, with the
formula in each docstring. The summary JSON has this one producer.

Definitions (deadline D, if given; otherwise D = ∞):

* a prompt *completed* if ``done_at ≤ D``; otherwise it *timed out*;
* a call's latency is ``max(done_at) − arrived_at`` over its prompts, and it completed if
  all its prompts did;
* ``makespan_s = max(done_at) − min(arrived_at)``: the span of the run;
* throughput = completed prompts / makespan;
* a GPU's utilisation = length of the union of its batches' [started_at, done_at)
  intervals / makespan (so processor-shared batches are not counted twice).

Latency, wait and service statistics are over completed prompts; ``call_latency`` of a
task is over the completed calls that contain that task.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np
import pandas as pd

from simulator.events import with_durations

STAT_KEYS = ("mean", "p50", "p90", "p95", "p99", "max")


def describe(values: Iterable[float] | np.ndarray) -> dict[str, float | None]:
    """``{mean, p50, p90, p95, p99, max}`` of ``values`` (linear-interpolated percentiles);
    all ``None`` when there are no values."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return {k: None for k in STAT_KEYS}
    p50, p90, p95, p99 = np.percentile(x, [50, 90, 95, 99])
    return {"mean": float(x.mean()), "p50": float(p50), "p90": float(p90),
            "p95": float(p95), "p99": float(p99), "max": float(x.max())}


def call_table(log: pd.DataFrame, deadline: float | None = None) -> pd.DataFrame:
    """One row per call: ``arrived_at``, ``done_at`` (its last prompt), ``latency_s =
    done_at − arrived_at``, ``completed`` (``done_at ≤ deadline``), ``prompts`` and its
    composition ``tasks`` (the sorted set of its tasks, '+'-joined)."""
    grouped = log.groupby("call_index", sort=True)
    codes, names = pd.factorize(log["task"], sort=True)
    # A call's task set as a bit mask: bit i is set if any of its prompts has task i.
    masks = pd.Series(0, index=grouped.size().index, dtype=np.int64)
    for i in range(len(names)):
        has = pd.Series(codes == i, index=log.index).groupby(log["call_index"], sort=True).any()
        masks += has.to_numpy(np.int64) << i
    labels = {m: "+".join(n for i, n in enumerate(names) if m >> i & 1) for m in masks.unique()}
    calls = pd.DataFrame({
        "call_id": grouped["call_id"].first(),
        "arrived_at": grouped["arrived_at"].min(),
        "done_at": grouped["done_at"].max(),
        "prompts": grouped.size(),
        "tasks": masks.map(labels),
    })
    calls["latency_s"] = calls["done_at"] - calls["arrived_at"]
    limit = math.inf if deadline is None else deadline
    calls["completed"] = calls["done_at"] <= limit
    return calls


def busy_time(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of intervals [starts[i], ends[i])."""
    if len(starts) == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    total, cur_s, cur_e = 0.0, s[0], e[0]
    for a, b in zip(s[1:], e[1:]):
        if a > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = a, b
        elif b > cur_e:
            cur_e = b
    return float(total + cur_e - cur_s)


def batch_table(log: pd.DataFrame) -> pd.DataFrame:
    """One row per batch: task, queue, gpu, size and its instants."""
    return log.groupby("batch_id", sort=True).agg(
        task=("task", "first"), queue=("queue", "first"), gpu=("gpu", "first"),
        worker=("worker", "first"), size=("batch_size", "first"),
        batched_at=("batched_at", "first"), started_at=("started_at", "first"),
        done_at=("done_at", "first"),
    )


def _group_summary(rows: pd.DataFrame, calls: pd.DataFrame, makespan: float, deadline: float | None) -> dict[str, Any]:
    limit = math.inf if deadline is None else deadline
    done = rows[rows["done_at"] <= limit]
    batch_sizes = rows.groupby("batch_id")["batch_size"].first()
    completed_calls = calls[calls["completed"]]
    return {
        "prompts": int(len(rows)),
        "completed": int(len(done)),
        "timed_out": int(len(rows) - len(done)),
        "calls": int(len(calls)),
        "calls_completed": int(len(completed_calls)),
        "latency": describe(done["latency_s"]),
        "call_latency": describe(completed_calls["latency_s"]),
        "wait": describe(done["wait_s"]),
        "service": describe(done["service_s"]),
        "mean_batch_size": float(batch_sizes.mean()) if len(batch_sizes) else None,
        "throughput_prompts_per_s": float(len(done) / makespan) if makespan > 0 else None,
    }


def summarize(log: pd.DataFrame, config: dict[str, Any] | None = None,
              deadline: float | None = None, gpus: int | None = None) -> dict[str, Any]:
    """The summary JSON of one run (stable keys: ``overall``, ``tasks.<name>``, ``gpus``,
    ``makespan_s``, ``deadline_s``, ``config``).

    ``gpus`` is the number of GPUs in the system, so that idle GPUs are listed too.
    """
    full = with_durations(log)
    calls = call_table(full, deadline)
    makespan = float(full["done_at"].max() - full["arrived_at"].min()) if len(full) else 0.0
    tasks: dict[str, Any] = {}
    for task in sorted(full["task"].unique()):
        rows = full[full["task"] == task]
        task_calls = calls.loc[rows["call_index"].unique()]
        tasks[task] = _group_summary(rows, task_calls, makespan, deadline)
    gpu_rows = []
    on_gpu = full[full["gpu"].notna()]
    n_gpus = gpus if gpus is not None else (int(on_gpu["gpu"].max()) + 1 if len(on_gpu) else 0)
    batches = batch_table(on_gpu) if len(on_gpu) else pd.DataFrame(columns=["gpu", "started_at", "done_at", "size"])
    for g in range(n_gpus):
        b = batches[batches["gpu"] == g]
        busy = busy_time(b["started_at"].to_numpy(float), b["done_at"].to_numpy(float))
        gpu_rows.append({
            "id": g,
            "utilization": busy / makespan if makespan > 0 else 0.0,
            "batches": int(len(b)),
            "mean_batch_size": float(b["size"].mean()) if len(b) else None,
        })
    return {
        "overall": _group_summary(full, calls, makespan, deadline),
        "tasks": tasks,
        "gpus": gpu_rows,
        "makespan_s": makespan,
        "deadline_s": deadline,
        "config": config or {},
    }


def time_average_in_system(log: pd.DataFrame) -> float:
    """Time-average number of prompts in the system over [min arrived_at, max done_at]:
    the integral of (arrivals so far − departures so far), by an event sweep."""
    arr = np.sort(log["arrived_at"].to_numpy(float))
    dep = np.sort(log["done_at"].to_numpy(float))
    times = np.concatenate([arr, dep])
    steps = np.concatenate([np.ones_like(arr), -np.ones_like(dep)])
    order = np.argsort(times, kind="stable")
    times, steps = times[order], steps[order]
    counts = np.cumsum(steps)
    area = float(np.sum(counts[:-1] * np.diff(times)))
    span = float(times[-1] - times[0])
    return area / span if span > 0 else 0.0
