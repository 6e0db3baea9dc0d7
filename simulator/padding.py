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
from typing import Any

import numpy as np
import pandas as pd

#: The keys of the ``padding`` figures of a summary group.
PADDING_KEYS = ("batches", "padded_tokens", "actual_tokens", "waste", "mean_batch_waste")


def _labels(column: pd.Series) -> tuple[np.ndarray, list[str]]:
    """Each row's code and the labels (a categorical's own codes, else factorized)."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        return column.cat.codes.to_numpy(np.int64), [str(c) for c in column.cat.categories]
    codes, names = pd.factorize(column)
    return codes.astype(np.int64), [str(n) for n in names]


def continuous_rows(log: pd.DataFrame) -> np.ndarray:
    """Whether each row was admitted by a continuous engine: its queue is ``TASK~g``
    (decided once per distinct task and queue, not per row)."""
    task, tasks = _labels(log["task"])
    queue, queues = _labels(log["queue"])
    if not task.size:
        return np.zeros(0, dtype=bool)
    pair = task * (len(queues) + 1) + queue
    uniq, inverse = np.unique(pair, return_inverse=True)
    verdict = np.array([bool(re.fullmatch(re.escape(tasks[u // (len(queues) + 1)]) + r"~\d+",
                                          queues[u % (len(queues) + 1)]))
                        for u in uniq.tolist()], dtype=bool)
    return verdict[inverse.reshape(-1)]


def _per_batch(batch_ids: np.ndarray, prompt_tokens: np.ndarray, max_tokens: np.ndarray,
               continuous: np.ndarray) -> dict[str, np.ndarray]:
    """Per distinct batch (id order) of rows with ``batch_ids >= 0``: its id, its first row
    among those rows, size, longest prompt and output, actual and padded tokens, whether it
    pads."""
    keep = batch_ids >= 0
    ids = batch_ids[keep].astype(np.int64, copy=False)
    p = prompt_tokens[keep].astype(np.int64, copy=False)
    m = max_tokens[keep].astype(np.int64, copy=False)
    uniq, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    k = len(uniq)
    size = np.bincount(inverse, minlength=k).astype(np.int64)
    longest_prompt = np.zeros(k, dtype=np.int64)
    longest_output = np.zeros(k, dtype=np.int64)
    np.maximum.at(longest_prompt, inverse, p)
    np.maximum.at(longest_output, inverse, m)
    actual = np.zeros(k, dtype=np.int64)
    np.add.at(actual, inverse, p + m)
    pads = ~continuous[keep][first]
    padded = np.where(pads, size * (longest_prompt + longest_output), actual)
    return {"batch_id": uniq, "first": np.flatnonzero(keep)[first], "size": size,
            "longest_prompt": longest_prompt, "longest_output": longest_output,
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
    b = _per_batch(log["batch_id"].to_numpy(np.int64), log["prompt_tokens"].to_numpy(),
                   log["max_tokens"].to_numpy(), continuous_rows(log))
    rows = b["first"]
    return pd.DataFrame({
        "task": log["task"].astype(str).to_numpy(dtype=object)[rows],
        "queue": log["queue"].astype(str).to_numpy(dtype=object)[rows],
        "size": b["size"], "longest_prompt": b["longest_prompt"], "longest_output": b["longest_output"],
        "padded": b["padded"], "actual": b["actual"], "waste": _waste(b["padded"], b["actual"]),
        "pads": b["pads"],
    }, index=pd.Index(b["batch_id"], name="batch_id"))


def padding_figures(batch_ids: np.ndarray, prompt_tokens: np.ndarray, max_tokens: np.ndarray,
                    continuous: np.ndarray) -> dict[str, Any]:
    """The ``padding`` figures of one group of rows (module docstring): ``batches``,
    ``padded_tokens`` (Σ padded), ``actual_tokens`` (Σ actual), ``waste`` (Σ(padded −
    actual) / Σ padded) and ``mean_batch_waste`` (the mean of the batches' wastes); the two
    ratios are ``None`` without a batch. Rows with ``batch_ids < 0`` (turned away) are left
    out; ``continuous`` marks a continuous engine's rows (:func:`continuous_rows`)."""
    b = _per_batch(batch_ids, prompt_tokens, max_tokens, continuous)
    if not b["size"].size:
        return {"batches": 0, "padded_tokens": 0, "actual_tokens": 0, "waste": None, "mean_batch_waste": None}
    padded, actual = int(b["padded"].sum()), int(b["actual"].sum())
    return {
        "batches": int(b["size"].size),
        "padded_tokens": padded,
        "actual_tokens": actual,
        "waste": (padded - actual) / padded if padded > 0 else 0.0,
        "mean_batch_waste": float(_waste(b["padded"], b["actual"]).mean()),
    }


__all__ = ["PADDING_KEYS", "batch_padding", "continuous_rows", "padding_figures"]
