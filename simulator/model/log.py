"""The per-prompt event log, built from columns: what both engines hand back.

An engine fills per-prompt arrays (its batch, finishing instants, status) and a batch table
(one row per batch: formation and start instants, device, worker, size, queue); this module
joins them into the DataFrame documented in :mod:`simulator.events`. Strings (task, queue,
status, resource) travel as small integer codes into tables of names until this one join.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.events import EVENT_COLUMNS, SERVED, STATUSES, LogColumns

if TYPE_CHECKING:
    import pandas as pd

#: Status codes: the index into :data:`simulator.events.STATUSES`.
STATUS_CODE = {name: code for code, name in enumerate(STATUSES)}


@dataclass
class PromptColumns:
    """What is known of every prompt before the run, in trace order."""

    call_ids: np.ndarray       # text: the id of each call
    call_of: np.ndarray        # int32: each prompt's call
    prompt_index: np.ndarray   # int32: its position in its call
    task_names: list[str]      # the tasks, by code
    task_of: np.ndarray        # int: each prompt's task code
    resources: list[str]       # per task code: gpu or cpu
    prompt_tokens: np.ndarray  # int32 (the fast engine's, read-only) or int64
    max_tokens: np.ndarray     # the same (after the scenario's cap)
    arrived_at: np.ndarray     # float64


@dataclass
class Outcome:
    """What a run decided: per prompt, and per batch (``batch_of`` holds batch ids)."""

    batch_of: np.ndarray        # int32 or int64, -1: never batched
    done_at: np.ndarray         # float64
    first_token_at: np.ndarray  # float64
    status: np.ndarray          # int8 codes of STATUSES
    preemptions: np.ndarray     # int, or empty: none (an engine without continuous batching)
    batch_id: np.ndarray        # int, one row per batch
    formed_at: np.ndarray
    started_at: np.ndarray
    device: np.ndarray          # GPU index, -1 on a CPU
    worker: np.ndarray
    size: np.ndarray
    queue: np.ndarray           # int codes into queue_names
    queue_names: list[str]


@functools.cache
def text_dtype() -> Any:
    """The dtype pandas gives text columns (``astype(str)``): pyarrow-backed from pandas 3 on,
    Python objects before (asked of pandas when a frame is first made, not at import)."""
    import pandas as pd

    return pd.Series(["x"]).astype(str).dtype


def text_column(names: np.ndarray | list[str] | tuple[str, ...], codes: np.ndarray) -> pd.Series:
    """The text column ``names[codes]`` in pandas' text dtype, made without a Python
    string per row where pandas holds text in pyarrow (one ``take`` in C)."""
    import pandas as pd

    if getattr(text_dtype(), "storage", None) == "pyarrow":
        import pyarrow as pa

        text = names if isinstance(names, np.ndarray) and names.dtype.kind == "T" else np.asarray(names, dtype=object)
        array = pa.array(text, pa.large_string())
        n = len(codes)
        if n == len(array) and (n == 0 or (codes[0] == 0 and bool(np.all(np.diff(codes) == 1)))):
            # every name once, in order (a trace of one-prompt calls): the names are the
            # column, with no second copy taken of them
            return pd.Series(array, dtype=text_dtype())
        return pd.Series(array.take(pa.array(codes, pa.int64())), dtype=text_dtype())
    return pd.Series(np.asarray(names, dtype=object)[codes]).astype(str)


def label_column(names: list[str] | tuple[str, ...], codes: np.ndarray) -> pd.Categorical:
    """The column ``names[codes]`` of a few distinct labels (tasks, queues, statuses) as a
    categorical of the labels present, sorted: a byte per row instead of the text's bytes
    and offsets, and the same column whichever engine (with whatever unused names) made it."""
    import pandas as pd

    labels, label_of = np.unique(np.asarray(names, dtype=object).astype(str), return_inverse=True)
    row_label = label_of.astype(np.int32)[codes]
    present = np.bincount(row_label, minlength=len(labels)) > 0
    renumber = (np.cumsum(present) - 1).astype(np.int8 if present.sum() < 127 else np.int32)
    return pd.Categorical.from_codes(renumber[row_label],
                                     categories=pd.Index(labels[present].astype(object), dtype=text_dtype()))


#: The type of the log's id and count columns (calls, prompts, workers, batches, sizes,
#: preemptions, GPUs): 32 bits, as the trace's columns, so a large replay's log is smaller
#: and the trace's columns are taken without a copy. Token counts stay 64-bit: they are summed
#: and added.
ID_INT = np.int32


#: The columns :func:`_joined` makes.
JOINED = ("queue", "batched_at", "started_at", "gpu", "worker", "batch_size", "preemptions")


def _joined(prompts: PromptColumns, outcome: Outcome, names: tuple[str, ...] = JOINED) -> dict[str, np.ndarray]:
    """The log's columns that come from each prompt's batch (its row of the batch table) and
    its status, as numpy arrays: ``batched_at``, ``started_at``, ``gpu`` (-1: none),
    ``worker``, ``batch_size``, ``preemptions``, and ``queue`` as codes into the queue names
    followed by the task names (a prompt never served is named by its task); ``names``: those
    of them to make."""
    bid = outcome.batch_of
    served = outcome.status < len(SERVED)
    if len(bid) and (bid[served] < 0).any():
        raise RuntimeError("internal error: a prompt was never batched")
    # Each prompt's row in the batch table; one extra row stands for "no batch".
    n_batches = len(outcome.batch_id)
    # (None: prompt i is in batch i, the batch table's row i: batches of one, formed in prompt order)
    row: np.ndarray | None = None
    if n_batches and (outcome.batch_id == np.arange(n_batches)).all():
        if not (n_batches >= len(bid) and bool((bid == np.arange(len(bid), dtype=bid.dtype)).all())):
            row = np.where(bid >= 0, bid, n_batches)
    else:
        order = np.argsort(outcome.batch_id, kind="stable")
        found = np.searchsorted(outcome.batch_id, bid, sorter=order)
        row = np.where(bid >= 0, order[np.minimum(found, max(n_batches - 1, 0))] if n_batches else 0, n_batches)

    def column(values: np.ndarray, missing, dtype) -> np.ndarray:
        if row is None:  # (each prompt's row is its own index: the rows, copied, without a gather)
            return np.array(values[:len(bid)], dtype=dtype)
        return np.append(np.asarray(values, dtype=dtype), np.asarray([missing], dtype=dtype))[row]

    def queue() -> np.ndarray:
        # Queues by code; a prompt never served is named by its task (codes past the queues').
        queue_code = column(outcome.queue, len(outcome.queue_names), np.int32)
        if len(queue_code) and not served.all():
            queue_code = queue_code.copy()
            queue_code[~served] = len(outcome.queue_names) + prompts.task_of[~served]
        return queue_code

    def preemptions() -> np.ndarray:
        n_prompts = len(bid)
        counts = outcome.preemptions if len(outcome.preemptions) == n_prompts else np.zeros(n_prompts, ID_INT)
        return counts.astype(ID_INT, copy=False)

    nan = float("nan")
    make = {
        "queue": queue,
        "batched_at": lambda: column(outcome.formed_at, nan, float),
        "started_at": lambda: column(outcome.started_at, nan, float),
        "gpu": lambda: column(outcome.device, -1, ID_INT),
        "worker": lambda: column(outcome.worker, -1, ID_INT),
        "batch_size": lambda: column(outcome.size, 0, ID_INT),
        "preemptions": preemptions,
    }
    return {name: make[name]() for name in names}


def build_event_log(prompts: PromptColumns, outcome: Outcome) -> pd.DataFrame:
    """The event log DataFrame (columns in :data:`simulator.events.EVENT_COLUMNS` order)."""
    import pandas as pd

    joined = _joined(prompts, outcome)
    n_tasks = len(prompts.task_names)
    task_of = prompts.task_of
    gpu = joined["gpu"]
    log = pd.DataFrame({
        "call_id": text_column(prompts.call_ids, prompts.call_of),
        "call_index": prompts.call_of.astype(ID_INT, copy=False),
        "prompt_index": prompts.prompt_index.astype(ID_INT, copy=False),
        "task": label_column(prompts.task_names, task_of) if n_tasks else label_column([""], task_of),
        "resource": label_column(prompts.resources, task_of) if n_tasks else label_column([""], task_of),
        "prompt_tokens": prompts.prompt_tokens.astype(np.int64, copy=False),
        "max_tokens": prompts.max_tokens.astype(np.int64, copy=False),
        "queue": label_column([*outcome.queue_names, *prompts.task_names], joined["queue"]),
        "status": label_column(STATUSES, outcome.status),
        "arrived_at": prompts.arrived_at.astype(float, copy=False),
        "batched_at": joined["batched_at"],
        "started_at": joined["started_at"],
        "first_token_at": outcome.first_token_at.astype(float, copy=False),
        "done_at": outcome.done_at.astype(float, copy=False),
        "gpu": pd.arrays.IntegerArray(gpu, mask=gpu < 0),
        "worker": joined["worker"],
        "batch_id": outcome.batch_of.astype(ID_INT, copy=False),
        "batch_size": joined["batch_size"],
        "preemptions": joined["preemptions"],
    }, copy=False)  # no copy into 2-D blocks: a third of a large replay's time, and its memory
    assert list(log.columns) == EVENT_COLUMNS
    return log


#: The columns of :func:`event_columns`: what a summary reads (not ``prompt_index``,
#: ``resource``, ``batched_at`` or ``worker``: 12 bytes a prompt of a large run's peak).
SUMMARY_JOINED = ("queue", "started_at", "gpu", "batch_size", "preemptions")


def event_columns(prompts: PromptColumns, outcome: Outcome) -> LogColumns:
    """The columns of the event log :func:`build_event_log` makes that a summary reads
    (:func:`simulator.metrics.summarize_columns`: those :func:`simulator.metrics.log_columns`
    takes from a frame), as numpy columns without the frame (no text column of call ids, no
    categoricals), the same values the frame holds."""
    joined = _joined(prompts, outcome, SUMMARY_JOINED)
    columns = {
        "call_index": prompts.call_of.astype(ID_INT, copy=False),
        "task": prompts.task_of,
        # the token counts as the engine holds them (the fast engine's 32-bit ones, uncopied:
        # a summary sums them in 64 bits); build_event_log's frame widens them to int64
        "prompt_tokens": prompts.prompt_tokens,
        "max_tokens": prompts.max_tokens,
        "status": outcome.status,
        "arrived_at": prompts.arrived_at.astype(float, copy=False),
        "first_token_at": outcome.first_token_at.astype(float, copy=False),
        "done_at": outcome.done_at.astype(float, copy=False),
        "batch_id": outcome.batch_of.astype(ID_INT, copy=False),
        **joined,
    }
    labels = {"task": list(prompts.task_names), "queue": [*outcome.queue_names, *prompts.task_names],
              "status": list(STATUSES)}
    return LogColumns(columns, labels)
