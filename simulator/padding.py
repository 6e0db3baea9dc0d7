"""Padding waste of static batches: pure functions of the per-prompt event log.

A static batch (topologies ``shared``, ``split`` and ``direct``) runs as one rectangular
tensor: every row is padded to the batch's longest prompt and decodes until the batch's
longest output is done. For a batch ``b`` of ``n_b`` prompts with prompt tokens ``p_i``
and max tokens ``m_i``::

    padded_b = n_b × (max_i p_i + max_i m_i)      # the rectangle the GPU computes
    actual_b = Σ_i (p_i + m_i)                     # the tokens the prompts need
    waste_b  = (padded_b − actual_b) / padded_b    # the batching lab's definition

A batch of equal rows wastes nothing; one long row among short ones wastes most of the
rectangle. Over a group of batches (a task, or the run)::

    waste            = Σ_b (padded_b − actual_b) / Σ_b padded_b   # share of computed tokens
    mean_batch_waste = mean over batches of waste_b

Continuous batching (the ``continuous`` topology, queues named ``task~g``) pads nothing by
construction: each row leaves when its own tokens are done and prompts are prefilled
unpadded, so its admission groups count with ``padded_b = actual_b`` (waste 0).

Counted in prompts, not rows: best-of-n (``rows_per_prompt`` = n) multiplies both work
figures by n, leaving the waste unchanged. Prompts turned away (no batch) count nowhere.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

#: The keys of the ``padding`` figures of a summary group.
PADDING_KEYS = ("batches", "padded_tokens", "actual_tokens", "waste", "mean_batch_waste")


def continuous_rows(log: pd.DataFrame) -> np.ndarray:
    """Whether each row was admitted by a continuous engine: its queue is ``TASK~g`` for its
    own task (:func:`continuous_of` of the log's label codes)."""
    import pandas as pd

    if not len(log):
        return np.zeros(0, dtype=bool)
    queue = log["queue"].astype("category") if not isinstance(log["queue"].dtype, pd.CategoricalDtype) \
        else log["queue"]
    task = log["task"].astype("category") if not isinstance(log["task"].dtype, pd.CategoricalDtype) \
        else log["task"]
    return continuous_of(queue.cat.codes.to_numpy(), list(queue.cat.categories), task.cat.codes.to_numpy(),
                         list(task.cat.categories))


def continuous_of(queue_codes: np.ndarray, queue_names: Sequence[str], task_codes: np.ndarray,
                  task_names: Sequence[str]) -> np.ndarray:
    """Whether each row (its queue and task as codes into their names; ``-1``: none) was
    admitted by a continuous engine: its queue is ``TASK~g`` for its own task (decided once
    per distinct queue name, then looked up by the row's code: a byte a row, no sort)."""
    if not len(queue_codes):
        return np.zeros(0, dtype=bool)
    return engine_of(tuple(str(q) for q in queue_names), tuple(str(t) for t in task_names))[queue_codes] == task_codes


@lru_cache(maxsize=64)
def engine_of(queue_names: tuple[str, ...], tasks: tuple[str, ...]) -> np.ndarray:
    """Per queue name (then ``-1`` for code -1, no name), the task code whose continuous
    engine it names, else -1 (a sweep's runs share a few sets of names: matched once each)."""
    # A queue name names at most one task's engine; which task a row has is checked by the caller.
    engine_of = np.array([next((i for i, t in enumerate(tasks) if re.fullmatch(re.escape(t) + r"~\d+", q)), -1)
                          for q in queue_names] + [-1], dtype=np.int64)
    engine_of.flags.writeable = False  # (shared by every caller of these names)
    return engine_of


def _per_batch(batch_ids: np.ndarray, prompt_tokens: np.ndarray, max_tokens: np.ndarray,
               continuous: np.ndarray, detail: bool = True) -> dict[str, Any]:
    """Per distinct batch (id order) of rows with ``batch_ids >= 0``: its id, size, longest
    prompt and output, actual and padded tokens, whether it pads. Batch ids are dense (an
    engine numbers its batches 0, 1, ...), so each batch is a slot of arrays as long as the
    largest id: one pass over the rows, no sort.

    ``detail=False``: ``padded`` and ``actual`` alone (with ``batch_id`` ``None`` where every
    id up to the largest has a batch), with a third of the temporaries: a large replay's
    summary holds an array a batch for each of them at its peak; ``rows_in_order`` where
    every row is batched, row ``i`` in batch ``i`` (batches of one)."""
    keep = batch_ids >= 0
    if keep.all():  # (nothing turned away: the columns themselves, uncopied)
        ids, p, m, cont = batch_ids, prompt_tokens, max_tokens, continuous
    else:
        ids, p, m, cont = batch_ids[keep], prompt_tokens[keep], max_tokens[keep], continuous[keep]
    if not ids.size:
        empty = np.zeros(0, dtype=np.int64)
        return {"batch_id": empty, "size": empty, "longest_prompt": empty, "longest_output": empty,
                "padded": empty, "actual": empty, "pads": np.zeros(0, dtype=bool)}
    top = int(ids.max()) + 1
    size = np.bincount(ids, minlength=top)
    if not detail and size.max() == 1:
        # batches of one prompt (a queue that never waits to fill one): a batch's padded
        # tokens are its actual ones (one array for both), its prompt's, and nothing pads
        if ids is batch_ids and top == ids.size and np.array_equal(ids, np.arange(top, dtype=ids.dtype)):
            # (every row batched, row i in batch i: the rows' own order, no scatter)
            actual = np.add(p, m, dtype=np.int64)
            return {"batch_id": None, "padded": actual, "actual": actual, "rows_in_order": True}
        actual = np.zeros(top, dtype=np.int64)
        actual[ids] = p
        actual[ids] += m  # (each id once: no update lost)
        kept = None if size.all() else np.flatnonzero(size)
        del size
        if kept is not None:
            actual = actual[kept]
        return {"batch_id": kept, "padded": actual, "actual": actual}
    # Each batch's rows side by side (one stable sort of the ids, none where they are in
    # order already), reduced per batch: ``ufunc.at`` took several times as long on a
    # sweep's small runs. (Maxima and sums of integers: the same whichever order.)
    order = None if bool((ids[1:] >= ids[:-1]).all()) else np.argsort(ids, kind="stable")
    by_batch = ids if order is None else ids[order]
    starts = np.flatnonzero(np.concatenate([[True], by_batch[1:] != by_batch[:-1]]))
    present_ids = by_batch[starts]
    del by_batch
    p_by, m_by = (p, m) if order is None else (p[order], m[order])
    longest_prompt = np.zeros(top, dtype=np.int64)
    longest_output = np.zeros(top, dtype=np.int64)
    longest_prompt[present_ids] = np.maximum.reduceat(p_by, starts)
    longest_output[present_ids] = np.maximum.reduceat(m_by, starts)
    actual = np.zeros(top, dtype=np.int64)
    actual[present_ids] = np.add.reduceat(np.add(p_by, m_by, dtype=np.int64), starts)
    del p_by, m_by, order, starts, present_ids
    pads = np.ones(top, dtype=bool)
    pads[ids] = ~cont  # (a batch's rows share one queue)
    if not detail:
        # padded = size × (longest prompt + longest output) in the longest prompts' array
        padded = np.add(longest_prompt, longest_output, out=longest_prompt)
        del longest_output
        padded *= size
        np.copyto(padded, actual, where=~pads)
        if size.all():
            return {"batch_id": None, "padded": padded, "actual": actual}
        kept = np.flatnonzero(size)
        return {"batch_id": kept, "padded": padded[kept], "actual": actual[kept]}
    if size.all():  # (every id has a batch: the engines' logs)
        present: np.ndarray | slice = slice(None)
        batch_id = np.arange(top)
    else:
        present = batch_id = np.flatnonzero(size)
        size, longest_prompt, longest_output, actual, pads = (
            x[present] for x in (size, longest_prompt, longest_output, actual, pads))
    # padded = size × (longest prompt + longest output), in place; actual where it pads not
    padded = np.add(longest_prompt, longest_output)
    padded *= size
    padded[~pads] = actual[~pads]
    return {"batch_id": batch_id, "size": size, "longest_prompt": longest_prompt, "longest_output": longest_output,
            "padded": padded, "actual": actual, "pads": pads}


def _waste(padded: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """Per batch ``(padded − actual) / padded`` (0 for a batch of no tokens)."""
    return np.where(padded > 0, (padded - actual) / np.maximum(padded, 1), 0.0)


def batch_padding(log: pd.DataFrame) -> pd.DataFrame:
    """The event log's view of padding: one row per batch (indexed by ``batch_id``, in id
    order) with ``task``, ``queue``, ``size`` (its prompts), ``longest_prompt`` and
    ``longest_output`` (the max of its prompt and max tokens), ``padded`` and ``actual``
    tokens and ``waste = (padded − actual) / padded`` (module docstring). ``pads`` is False
    for a continuous engine's admission group (``padded`` = ``actual``, ``waste`` 0)."""
    import pandas as pd

    batch_ids = log["batch_id"].to_numpy()
    b = _per_batch(batch_ids, log["prompt_tokens"].to_numpy(), log["max_tokens"].to_numpy(), continuous_rows(log))
    # each batch's first row (its task and queue)
    first = np.full(int(batch_ids.max(initial=-1)) + 1, len(batch_ids), dtype=np.int64)
    rows = np.flatnonzero(batch_ids >= 0)
    np.minimum.at(first, batch_ids[rows], rows)
    rows = first[b["batch_id"]]
    return pd.DataFrame({
        "task": log["task"].astype(str).to_numpy(dtype=object)[rows],
        "queue": log["queue"].astype(str).to_numpy(dtype=object)[rows],
        "size": b["size"], "longest_prompt": b["longest_prompt"], "longest_output": b["longest_output"],
        "padded": b["padded"], "actual": b["actual"], "waste": _waste(b["padded"], b["actual"]),
        "pads": b["pads"],
    }, index=pd.Index(b["batch_id"], name="batch_id"))


def batch_work(batch_ids: np.ndarray, prompt_tokens: np.ndarray, max_tokens: np.ndarray,
               continuous: np.ndarray, label: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per batch (id order) of the rows with ``batch_ids >= 0``: its padded and actual tokens
    (module docstring) and the ``label`` of its rows (a task code: every row of a batch has
    its batch's task)."""
    b = _per_batch(batch_ids, prompt_tokens, max_tokens, continuous, detail=False)
    present = b["batch_id"]  # (None: every id has a batch, and label_of is in their order)
    top = len(b["padded"]) if present is None else (len(present) and int(present[-1]) + 1)
    if b.get("rows_in_order"):  # (row i is batch i)
        return b["padded"], b["actual"], label.copy()
    label_of = np.zeros(top, dtype=label.dtype)
    served = batch_ids >= 0
    if served.all():
        label_of[batch_ids] = label
    else:
        label_of[batch_ids[served]] = label[served]
    return b["padded"], b["actual"], label_of if present is None else label_of[present]


def padding_totals(padded: np.ndarray, actual: np.ndarray) -> dict[str, Any]:
    """The ``padding`` figures of a group of batches given their padded and actual tokens
    (module docstring): ``batches``, ``padded_tokens`` (Σ padded), ``actual_tokens``
    (Σ actual), ``waste`` (Σ(padded − actual) / Σ padded) and ``mean_batch_waste`` (the
    mean of the batches' wastes); the two ratios are ``None`` without a batch."""
    if not padded.size:
        return {"batches": 0, "padded_tokens": 0, "actual_tokens": 0, "waste": None, "mean_batch_waste": None}
    total_padded = int(padded.sum())
    total_actual = total_padded if actual is padded else int(actual.sum())
    return {
        "batches": int(padded.size),
        "padded_tokens": total_padded,
        "actual_tokens": total_actual,
        "waste": (total_padded - total_actual) / total_padded if total_padded > 0 else 0.0,
        # (nothing pads where the two are one array: every batch's waste is 0)
        "mean_batch_waste": 0.0 if actual is padded else float(_waste(padded, actual).mean()),
    }


def padding_figures(batch_ids: np.ndarray, prompt_tokens: np.ndarray, max_tokens: np.ndarray,
                    continuous: np.ndarray) -> dict[str, Any]:
    """The ``padding`` figures (:func:`padding_totals`) of one group of rows. Rows with
    ``batch_ids < 0`` (turned away) are left out; ``continuous`` marks a continuous engine's
    rows (:func:`continuous_rows`)."""
    b = _per_batch(batch_ids, prompt_tokens, max_tokens, continuous, detail=False)
    return padding_totals(b["padded"], b["actual"])


__all__ = ["PADDING_KEYS", "batch_padding", "batch_work", "continuous_of", "continuous_rows", "engine_of", "padding_figures",
           "padding_totals"]
