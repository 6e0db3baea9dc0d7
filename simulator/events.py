"""The per-prompt event log: one flat record per prompt of every call.

Instants end in ``_at`` (seconds from trace start), durations in ``_s``.

=============  =====================================================================
field          meaning
=============  =====================================================================
call_id        the call's id from the trace
call_index     the call's position in the (sorted) trace
prompt_index   the prompt's position within its call
task           the prompt's task
resource       ``gpu`` or ``cpu``
prompt_tokens  prompt length used by the service model
max_tokens     max output tokens after the scenario's cap
queue          the queue it waited in (``task``, ``task@i`` for split, ``task/direct``)
arrived_at     when its call arrived (router and enqueue are instantaneous)
batched_at     when its batch was formed (released by the queue)
started_at     when its batch started on the device (after waiting for a busy GPU)
done_at        when its batch finished
gpu            GPU index, empty for the CPU
worker         worker id (-1 for ``direct``, which has no workers)
batch_id       batch id, unique within the run
batch_size     prompts in its batch
=============  =====================================================================

Durations come from :func:`with_durations` only.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

EVENT_COLUMNS = [
    "call_id", "call_index", "prompt_index", "task", "resource", "prompt_tokens", "max_tokens",
    "queue", "arrived_at", "batched_at", "started_at", "done_at", "gpu", "worker", "batch_id",
    "batch_size",
]

DURATION_COLUMNS = ["batching_s", "wait_s", "service_s", "latency_s"]


def with_durations(log: pd.DataFrame) -> pd.DataFrame:
    """The log with its durations added (the one place they are derived):

    * ``batching_s = batched_at − arrived_at`` (time in the micro-batch queue)
    * ``wait_s = started_at − arrived_at`` (queue wait: batching plus waiting for a GPU)
    * ``service_s = done_at − started_at`` (on the device, including processor-sharing slowdown)
    * ``latency_s = done_at − arrived_at``
    """
    out = log.copy()
    out["batching_s"] = log["batched_at"] - log["arrived_at"]
    out["wait_s"] = log["started_at"] - log["arrived_at"]
    out["service_s"] = log["done_at"] - log["started_at"]
    out["latency_s"] = log["done_at"] - log["arrived_at"]
    return out


EVENT_LOG_SUFFIXES = (".parquet", ".csv")


def event_log_suffix(path: str | Path) -> str:
    """``.parquet`` or ``.csv``: the format of an event log path; :class:`OutputError` otherwise."""
    from simulator.errors import OutputError

    suffix = Path(path).suffix.lower()
    if suffix not in EVENT_LOG_SUFFIXES:
        raise OutputError(path, None, None, "an event log must end in .parquet or .csv")
    return suffix


def write_event_log(log: pd.DataFrame, path: str | Path, force: bool = False) -> None:
    """Write the log as Parquet (``.parquet``) or CSV (``.csv``), atomically."""
    from simulator.outputs import open_output

    if event_log_suffix(path) == ".parquet":
        with open_output(path, "wb", force=force) as fh:
            log.to_parquet(fh, index=False)
    else:
        with open_output(path, "w", force=force) as fh:
            # 17 significant digits round-trip every float64 exactly.
            log.to_csv(fh, index=False, float_format="%.17g")


def read_event_log(path: str | Path) -> pd.DataFrame:
    """Read an event log written by :func:`write_event_log`."""
    if event_log_suffix(path) == ".parquet":
        return pd.read_parquet(path)
    log = pd.read_csv(path, dtype={"call_id": str, "task": str})
    log["gpu"] = log["gpu"].astype("Int64")
    return log
