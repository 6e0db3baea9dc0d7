"""Length-aware batch forming: which waiting prompts a released batch takes, and length buckets.

A static batch pads every row to its longest prompt and runs until its longest output is
done (:mod:`simulator.padding`), so a batch of rows of similar length wastes less. Two rules
make batches of similar rows; both read a prompt's *length*, ``prompt tokens + max tokens``
(its row's span in the padded rectangle, and what the waste formula counts).

``batch_selection`` (:data:`SELECTIONS`): when a queue releases a batch of ``count``
prompts (its batching policy decides when, and how many), which of its waiting prompts:

* ``fifo``: the ``count`` oldest, in arrival order (every queue's behaviour before these
  rules; the default);
* ``similar-length``: the oldest waiting prompt (the head, whose wait anchors the flush
  window, so no prompt is passed over for ever) plus the ``count − 1`` other waiting
  prompts closest to it in length, ``|length − head's length|`` smallest, ties to the
  older prompt. With W waiting and B = max batch: a window that fills B at once takes the
  head and its B − 1 nearest, leaving the rest waiting; when the window ends with fewer
  than B waiting, every waiting prompt goes, as with ``fifo``.

``length_buckets`` / ``bucket_bounds`` (:class:`LengthBuckets`): one micro-batch queue per
length bucket, each with the task's batching policy, flush window, max batch and workers
(``shared``: a worker per GPU in each bucket's queue; ``split``: a queue per bucket per GPU,
the dispatch rule choosing among the bucket's queues). A prompt joins the queue of its
bucket on arrival. Bucket ``i`` holds lengths ``L`` with ``b[i-1] <= L < b[i]``, for
boundaries ``b`` either given (``bucket_bounds = "600,1500"``: three buckets) or, for ``k =
length_buckets``, the task's length quantiles in the trace: ``b[j] = ceil(q(j / k))``,
``j = 1 .. k−1`` (numpy's linear-interpolated quantile over every prompt of the task in the
trace, known before the run as an operator knows last week's lengths); equal boundaries
leave a bucket empty (a task of few distinct lengths), its queue unused. One bucket (the
default) is the task's single queue, unchanged. A call's group of the task is split by
bucket; the parts join their queues in bucket order, at the call's instant.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from simulator.errors import ScenarioError
from simulator.registry import Registry
from simulator.settings import parse_bounds

if TYPE_CHECKING:
    from pathlib import Path

    from simulator.model.prompts import PromptTable
    from simulator.scenario import TaskConfig


class Lengths(Protocol):
    """Prompt ``i``'s length as ``lengths[i]``."""

    def __getitem__(self, i: int, /) -> int: ...


class RowLengths:
    """Prompt ``i``'s length, ``prompt tokens + max tokens``, from the run's columns."""

    __slots__ = ("prompt_tokens", "max_tokens")

    def __init__(self, prompt_tokens: Sequence[int], max_tokens: Sequence[int]) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens

    def __getitem__(self, i: int, /) -> int:
        return self.prompt_tokens[i] + self.max_tokens[i]


class Selection:
    """Which ``count`` of a queue's waiting prompts (oldest first) form the batch released
    now (``batch_selection``): ``fifo``, the ``count`` oldest."""

    def take(self, waiting: deque[int], count: int, length: Lengths) -> list[int]:
        """Remove the batch's prompts from ``waiting`` (arrival order, kept for the rest) and
        return them in arrival order; ``length[i]`` is prompt ``i``'s length. ``count`` is
        between 1 and ``len(waiting)``."""
        return [waiting.popleft() for _ in range(count)]


SELECTIONS: Registry[type[Selection]] = Registry("batch selection rule")
SELECTIONS.register("fifo")(Selection)


@SELECTIONS.register("similar-length")
class SimilarLength(Selection):
    """The oldest waiting prompt plus the ``count − 1`` others closest to it in length
    (ties: the older first), in arrival order (module docstring)."""

    def take(self, waiting: deque[int], count: int, length: Lengths) -> list[int]:
        if count >= len(waiting):
            taken = list(waiting)
            waiting.clear()
            return taken
        head = waiting[0]
        anchor = length[head]
        # positions 1.. of the others, nearest length first, the older first among equals
        nearest = heapq.nsmallest(count - 1, range(1, len(waiting)),
                                  key=lambda k: (abs(length[waiting[k]] - anchor), k))
        chosen = sorted([0, *nearest])
        taken = [waiting[k] for k in chosen]
        keep = set(chosen)
        rest = [p for k, p in enumerate(waiting) if k not in keep]
        waiting.clear()
        waiting.extend(rest)
        return taken


@dataclass(frozen=True)
class LengthBuckets:
    """Length buckets by their boundaries (module docstring): ``len(bounds) + 1`` buckets."""

    bounds: tuple[int, ...] = ()

    @property
    def count(self) -> int:
        return len(self.bounds) + 1

    def of(self, length: int) -> int:
        """The bucket of a prompt of ``length`` tokens: how many boundaries are <= it."""
        return bisect.bisect_right(self.bounds, length)

    @classmethod
    def from_quantiles(cls, lengths: Sequence[int] | np.ndarray, k: int) -> LengthBuckets:
        """``k`` buckets of about equal counts of ``lengths``: boundaries ``ceil(q(j/k))``,
        ``j = 1 .. k−1`` (non-decreasing; an equal pair leaves the bucket between empty)."""
        x = np.asarray(lengths, dtype=float)
        if k <= 1:
            return cls()
        if not x.size:
            return cls((1,) * (k - 1))
        return cls(tuple(math.ceil(c) for c in np.quantile(x, np.arange(1, k) / k).tolist()))


class Bucketing:
    """A task's length buckets in a run: how many (known when the topology is built, so its
    queues are too) and, from the task's first call on (when the router has read every
    prompt of the trace into the run's columns ``run``), which bucket each prompt joins.
    ``source`` is the scenario file, for errors."""

    def __init__(self, run: PromptTable, task: str, config: TaskConfig, source: str | Path | None = None) -> None:
        if config.bucket_bounds is not None and config.length_buckets != 1:
            raise ScenarioError(source, f"tasks.{task}", "bucket_bounds",
                                f"give length_buckets ({config.length_buckets}) or bucket_bounds, not both")
        self.run = run
        self.task = task
        self.given = None if config.bucket_bounds is None else LengthBuckets(parse_bounds(config.bucket_bounds))
        self.count = self.given.count if self.given is not None else config.length_buckets
        self._buckets = self.given

    @property
    def buckets(self) -> LengthBuckets:
        """The boundaries: given, or the quantiles of the task's prompt lengths in the trace."""
        if self._buckets is None:
            run, task = self.run, self.task
            lengths = [p + m for t, p, m in zip(run.task_of, run.prompt_tokens, run.max_tokens, strict=True)
                       if t == task]
            self._buckets = LengthBuckets.from_quantiles(lengths, self.count)
        return self._buckets

    def split(self, prompt_ids: list[int]) -> list[tuple[int, list[int]]]:
        """``prompt_ids`` by bucket, ``(bucket, ids in their order)`` in bucket order."""
        if self.count == 1:
            return [(0, prompt_ids)]
        buckets, run = self.buckets, self.run
        parts: dict[int, list[int]] = {}
        for i in prompt_ids:
            parts.setdefault(buckets.of(run.prompt_tokens[i] + run.max_tokens[i]), []).append(i)
        return sorted(parts.items())


__all__ = ["SELECTIONS", "Bucketing", "Lengths", "RowLengths", "LengthBuckets", "Selection", "SimilarLength"]
