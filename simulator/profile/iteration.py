"""Iteration-level costs of every service kind, for continuous batching and for TTFT.

A continuous-batching engine runs one iteration at a time: the rows already running decode,
the rows admitted this iteration prefill their prompt (and make their first token). It
asks its :class:`StepCost` two things per iteration: how long it takes, and how many
tokens each decoding row commits.

* ``iteration`` kind: its own per-iteration costs; one token per row.
* ``spec_decode`` kind: the prefill of the admitted rows (``prefill_target + prefill_draft``
  at their longest prompt) plus, when rows decode, one speculative step —
  ``draft_step(R, 2, V) + (k − 1)·draft_step(R, 1, V) + verify(R, k + 1, V) + iteration(k)``
  at the batch's longest context ``V`` (rounded up to the profile's view step, at most the
  longest row's prompt + max tokens + 2(k + 1)), exactly the per-iteration terms of its
  static batch time. Each decoding row commits ``1 + n`` tokens,
  ``n`` drawn per row from the truncated geometric of the acceptance rate.
* ``distribution`` and ``table`` kinds price whole batches only. An iteration of R rows
  takes ``mean(batch of R at the task's default lengths) / I`` with
  ``I = ceil((max_tokens − 1) / tokens_per_iteration) + 1`` the iterations such a batch
  runs (one prefill iteration, then decoding at ``tokens_per_iteration`` tokens per row);
  so R prompts admitted together and run to the task's default length take, in total,
  exactly the batch's mean time. The prefill is folded into that average (admitted
  tokens count against the token budget, not the clock), and a row commits
  ``tokens_per_iteration`` tokens per iteration (randomly rounded when fractional).

For a static batch, the first token is counted after the prefill and the first decoding
iteration (a static batch streams nothing before its decoding loop runs); its offset from
the batch's start is :func:`first_token_seconds`. In a continuous engine a row's first
token comes at the end of the iteration that prefills it.

Each kind owns its costs: its service class answers ``step_cost(task_profile)`` and
``first_token_seconds(task_profile, shape, work)`` (the whole-batch kinds through
:class:`WholeBatchIterations`); :func:`step_cost` and :func:`first_token_seconds` only ask it.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

from simulator.profile.acceptance import draw_accepted
from simulator.profile.shape import BatchShape


class StepCost(Protocol):
    """Iteration time and tokens of a continuous-batching engine of one task."""

    def step(self, decode_rows: int, prefill_prompts: list[int], context: int,
             rng: np.random.Generator, capacity: int | None = None) -> float:
        """Seconds of one iteration: ``decode_rows`` rows decode, ``prefill_prompts`` (their
        token counts) are prefilled; ``context`` is the longest row's length now and
        ``capacity`` the longest a decoding row may grow (prompt plus max tokens)."""

    def tokens(self, rows: int, rng: np.random.Generator) -> np.ndarray:
        """Tokens each of ``rows`` decoding rows commits this iteration (each >= 1)."""

    #: The tokens every decoding row commits per iteration where that is fixed, so
    #: :meth:`tokens` draws nothing and need not be called; ``None`` where they are drawn.
    fixed_tokens: int | None
    #: Whether :meth:`step` reads ``context`` and ``capacity`` (else any value will do).
    reads_lengths: bool


class IterationKindCost:
    fixed_tokens: int | None = 1
    reads_lengths: bool = True

    def __init__(self, service) -> None:
        self.service = service

    def step(self, decode_rows, prefill_prompts, context, rng, capacity=None):
        mean = self.service.step_mean(decode_rows + len(prefill_prompts), sum(prefill_prompts), context)
        return self.service.draw(mean, rng)

    def tokens(self, rows, rng):
        return np.ones(rows, dtype=np.int64)


class SpecDecodeCost:
    fixed_tokens: int | None = None
    reads_lengths: bool = True

    def __init__(self, service) -> None:
        self.service = service
        # The prefill term depends on (prompts, longest prompt) only and the decoding term
        # on (rows, view) only: each is computed once per distinct key and reused, the same
        # float every time.
        self._prefill: dict[tuple[int, int], float] = {}
        self._decode: dict[tuple[int, int], float] = {}
        self._draw_accepted = draw_accepted

    def step(self, decode_rows, prefill_prompts, context, rng, capacity=None):
        s = self.service
        k = s.lookahead
        t = 0.0
        if prefill_prompts:
            key = (len(prefill_prompts), max(prefill_prompts))
            prefill = self._prefill.get(key)
            if prefill is None:
                prefill = self._prefill[key] = self._prefill_seconds(*key)
            t += prefill
        if decode_rows:
            view = s.view_step * math.ceil((context + k + 1) / s.view_step)
            if capacity is not None:
                # The cache a row gets holds its prompt, its max tokens and two rounds of drafts.
                view = min(view, capacity + 2 * (k + 1))
            key = (decode_rows, view)
            decode = self._decode.get(key)
            if decode is None:
                decode = self._decode[key] = self._decode_seconds(*key)
            t += decode
        return t

    def _prefill_seconds(self, n: int, longest: int) -> float:
        s, c = self.service, self.service.costs
        return float(s.passes("prefill", c["prefill_target"](n, longest)) + s.passes("draft", c["prefill_draft"](n, longest)))

    def _decode_seconds(self, rows: int, view: int) -> float:
        s, c, k = self.service, self.service.costs, self.service.lookahead
        return float(s.passes("draft", c["draft_step"](rows, 2, view))
                     + (k - 1) * s.passes("draft", c["draft_step"](rows, 1, view))
                     + s.passes("verify", c["verify"](rows, k + 1, view)) + c["iteration"](k)
                     + s.round_overhead(rows))

    def tokens(self, rows, rng):
        return self._draw_accepted(rng, self.service.acceptance, self.service.lookahead, rows) + 1


class BatchAverageCost:
    reads_lengths: bool = False

    def __init__(self, service, prompt_tokens: int, max_tokens: int, tokens_per_iteration: float) -> None:
        self.service = service
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.per_iteration = tokens_per_iteration
        self.iterations = batch_iterations(max_tokens, tokens_per_iteration)
        self._means: dict[int, float] = {}
        self._whole = math.floor(tokens_per_iteration)
        self._frac = tokens_per_iteration - self._whole
        self.fixed_tokens = self._whole if self._frac == 0 else None

    def step(self, decode_rows, prefill_prompts, context, rng, capacity=None):
        rows = decode_rows + len(prefill_prompts)
        mean = self._means.get(rows)
        if mean is None:
            mean = self._means[rows] = self.service.mean(BatchShape(rows, self.prompt_tokens, self.max_tokens)) / self.iterations
        return mean

    def tokens(self, rows, rng):
        whole, frac = self._whole, self._frac
        if frac == 0:
            return np.full(rows, whole, dtype=np.int64)
        return whole + (rng.random(rows) < frac).astype(np.int64)


def batch_iterations(max_tokens: int, tokens_per_iteration: float) -> int:
    """Iterations a batch of rows of ``max_tokens`` runs: a prefill, then decoding."""
    return math.ceil(max(max_tokens - 1, 0) / tokens_per_iteration) + 1


class WholeBatchIterations:
    """The iteration costs of a kind that prices whole batches only (``distribution``,
    ``table``): :class:`BatchAverageCost`, and a first token after the prefill and the first
    decoding iteration of the batch's iterations (module docstring)."""

    def step_cost(self, task_profile) -> StepCost:
        return BatchAverageCost(self, task_profile.prompt_tokens, task_profile.max_tokens,
                                task_profile.tokens_per_iteration)

    def first_token_seconds(self, task_profile, shape: BatchShape, work: float) -> float:
        iterations = batch_iterations(shape.max_tokens, task_profile.tokens_per_iteration)
        # The prefill iteration and the first decoding iteration (where there is one).
        return work * min(2, iterations) / iterations


def step_cost(task_profile, service) -> StepCost:
    """The :class:`StepCost` of ``service`` (the task's, with scenario overrides applied)."""
    return service.step_cost(task_profile)


def first_token_seconds(task_profile, service, shape: BatchShape, work: float) -> float:
    """Seconds of exclusive device time from a static batch's start to its first token,
    for a batch that drew ``work`` seconds in all."""
    return service.first_token_seconds(task_profile, shape, work)
