"""What a service model may look at of a batch (its own module: kinds and iteration costs
both read it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BatchShape:
    """What a service model may look at: the batch's size and its token counts.

    ``prompt_tokens`` and ``max_tokens`` are the largest in the batch: a batched
    generation runs until its longest row is done, over its longest (padded) prompt.
    """

    size: int
    prompt_tokens: int
    max_tokens: int
    #: Each row's max tokens, where a kind needs them (spec_decode: rows finish apart).
    rows_max_tokens: tuple[int, ...] | None = None

    @classmethod
    def of(cls, prompts: Sequence[tuple[int, int]]) -> BatchShape:
        """Shape of a batch given ``(prompt_tokens, max_tokens)`` per prompt."""
        return cls(
            size=len(prompts),
            prompt_tokens=max(p for p, _ in prompts),
            max_tokens=max(m for _, m in prompts),
            rows_max_tokens=tuple(m for _, m in prompts),
        )
