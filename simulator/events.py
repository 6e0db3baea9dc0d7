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
queue          the queue it waited in (``task``, ``task@i`` for split, ``task/direct``,
               ``task~g`` for the continuous engine on GPU g; with length buckets
               ``task#b`` and ``task@i#b``)
status         ``served``; ``sent_after_timeout`` (waited past its queue timeout, then
               served); ``rejected`` (its queue was full); ``dropped`` (removed at its
               queue timeout). Prompts not served have no batch and empty instants.
arrived_at     when its call arrived (router and enqueue are instantaneous)
batched_at     when its batch was formed (released by the queue); continuous: when it
               was first admitted to the running batch
started_at     when its batch started on the device (after waiting for a busy GPU);
               continuous: when its admitting iteration started
first_token_at when its first output token was ready (static batch: after the prefill
               and the first decoding iteration; continuous: end of its prefill iteration)
done_at        when it had all its tokens (static: when its batch finished)
gpu            GPU index, empty for the CPU
worker         worker id (-1 for ``direct`` and ``continuous``, which have no workers)
batch_id       batch id, unique within the run (continuous: the iteration that admitted it)
batch_size     prompts in its batch (continuous: prompts admitted in that iteration)
preemptions    times it was preempted and later recomputed (continuous, KV cache full)
=============  =====================================================================

With a replica pool (a scenario naming an ``autoscaler``, :mod:`simulator.model.replicas`)
the log has two more fields, after these, and carries the pool's replicas:

=============  =====================================================================
replica        the replica its call went to (a nullable integer; empty if turned away
               at the pool's queue); a replica's GPUs are its own ``gpu`` indices
dispatched_at  when its call left the pool's FCFS queue for that replica (its
               ``arrived_at`` if a replica had room at once)
=============  =====================================================================

With the ``disaggregated`` topology (:mod:`simulator.model.topologies.disaggregated`) the
log has three more fields; ``gpu`` is then the decode GPU (the prefill GPU of a prompt of
one output token), and the batch fields are the prefill admission's:

=============  =====================================================================
prefill_gpu    the GPU that prefilled it (a nullable integer)
decode_gpu     the GPU that decoded it (empty for a prompt of one output token, never
               transferred)
transfer_s     the time its KV cache (prompt tokens + 1) took from the prefill GPU to
               the decode GPU (NaN where not transferred)
=============  =====================================================================

``log.attrs["replicas"]`` (:class:`~simulator.model.replicas.ReplicaTable`, plain JSON
data, kept in a Parquet event log's metadata): per replica its ``replica`` number,
``requested_at`` (started), ``ready_at`` (cold start over; NaN if cancelled before),
``drain_at`` (told to stop; NaN if never) and ``stopped_at`` (its last call ended after the
drain, or the run's end); and the pool's ``gpus_per_replica``, ``min_replicas``,
``max_replicas``, ``start_at`` and ``end_at``. Without a pool (and without prefix caching
or the ``disaggregated`` topology, which add their fields) the log is exactly the fields above.

Types: ``call_id`` is text; ``task``, ``resource``, ``queue`` and ``status`` are
categoricals of the labels present (a byte a row; compare them with strings as usual);
instants are floats; ``gpu`` is a nullable integer; the rest are integers.

Durations come from :func:`with_durations` only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator import inputs
from simulator.errors import EventLogError

if TYPE_CHECKING:
    import pandas as pd

EVENT_COLUMNS = [
    "call_id", "call_index", "prompt_index", "task", "resource", "prompt_tokens", "max_tokens",
    "queue", "status", "arrived_at", "batched_at", "started_at", "first_token_at", "done_at",
    "gpu", "worker", "batch_id", "batch_size", "preemptions",
]

#: Statuses of prompts that were served (the others were turned away).
SERVED = ("served", "sent_after_timeout")
#: The fields a run with a replica pool adds, after :data:`EVENT_COLUMNS`.
POOL_COLUMNS = ["replica", "dispatched_at"]
STATUSES = (*SERVED, "rejected", "dropped")


#: The columns whose values are labels (a few distinct names): in :class:`LogColumns` as
#: integer codes into their names.
LABEL_COLUMNS = ("task", "resource", "queue", "status")


@dataclass(frozen=True)
class LogColumns:
    """The event log as numpy columns, without a DataFrame: what a summary reads
    (:func:`simulator.metrics.summarize_columns`), made by the fast engine directly (a sweep
    summarises thousands of runs and never needs the frame) or from a log frame
    (:func:`simulator.metrics.log_columns`).

    ``columns`` maps names of :data:`EVENT_COLUMNS` (and :data:`POOL_COLUMNS`) to arrays,
    one value a prompt in log order: instants as floats; ``gpu`` an integer, ``-1`` on no
    GPU; a column of :data:`LABEL_COLUMNS` holds integer codes into its ``labels`` entry (the
    names in any order; a code of ``-1`` names nothing). ``attrs`` are the log's ``attrs``.
    """

    columns: Mapping[str, np.ndarray]
    labels: Mapping[str, Sequence[str]]
    attrs: Mapping[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.columns["arrived_at"])


def with_durations(log: pd.DataFrame) -> pd.DataFrame:
    """The log with its durations added (the one place they are derived):

    * ``batching_s = batched_at − arrived_at`` (time in the micro-batch queue)
    * ``wait_s = started_at − arrived_at`` (queue wait: batching plus waiting for a GPU)
    * ``service_s = done_at − started_at`` (on the device, including processor-sharing slowdown)
    * ``latency_s = done_at − arrived_at``
    * ``ttft_s = first_token_at − arrived_at`` (time to first token)
    * ``tpot_s = (done_at − first_token_at) / (max_tokens − 1)`` (time per output token
      after the first; empty for single-token prompts)
    """
    out = log.copy()
    out["batching_s"] = log["batched_at"] - log["arrived_at"]
    out["wait_s"] = log["started_at"] - log["arrived_at"]
    out["service_s"] = log["done_at"] - log["started_at"]
    out["latency_s"] = log["done_at"] - log["arrived_at"]
    out["ttft_s"] = log["first_token_at"] - log["arrived_at"]
    out["tpot_s"] = (log["done_at"] - log["first_token_at"]) / (log["max_tokens"] - 1).where(log["max_tokens"] > 1)
    return out


FLOAT_COLUMNS = ("arrived_at", "batched_at", "started_at", "first_token_at", "done_at")

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
    """Read an event log written by :func:`write_event_log`; :class:`EventLogError` naming
    the file if it is unreadable or is not an event log (a sweep's results, say)."""
    import pandas as pd

    p = Path(path)
    suffix = Path(path).suffix.lower()
    if suffix not in EVENT_LOG_SUFFIXES:
        raise EventLogError(p, None, None, "an event log ends in .parquet or .csv (replay --events writes one)")
    try:
        if suffix == ".parquet":
            table = inputs.read_parquet(p, EventLogError, "event log")
            if b"simctl.sweep" in (table.schema.metadata or {}):
                raise EventLogError(p, None, None, "is a sweep results file, not an event log: use "
                                    "simctl compare or simctl plot heatmap on it, or replay --events for a log")
            log = table.to_pandas()
        else:
            log = inputs.read_csv(p, EventLogError, "event log",
                                  dtype={"call_id": str, "task": str, "queue": str, "status": str},
                                  keep_default_na=False, na_values={c: [""] for c in (*FLOAT_COLUMNS, "gpu")})
    except (OSError, UnicodeDecodeError, ValueError, pd.errors.ParserError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise EventLogError(p, None, None, "no such file") from None
        if isinstance(exc, IsADirectoryError):
            raise EventLogError(p, None, None, "is a folder, not an event log") from None
        raise EventLogError(p, None, None, f"not a readable event log ({type(exc).__name__}: "
                            f"{' '.join(str(exc).split())[:160]})") from None
    missing = [c for c in EVENT_COLUMNS if c not in log.columns]
    if missing:
        raise EventLogError(p, None, missing[0], f"not an event log: no column {missing[0]!r} "
                            f"(replay --events writes one)")
    if suffix == ".csv":
        log["gpu"] = log["gpu"].astype("Int64")
    return log
