"""Service-model kinds. Each kind is one module registered here by its ``kind`` name.

A service model answers, for a batch of prompts of one task, how long the batch keeps its
device busy (seconds of exclusive use). Every kind implements :class:`ServiceModel`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from simulator.registry import Registry


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


class ServiceModel(Protocol):
    """Batch service time of one task. ``mean``/``variance`` let theory tests read the
    parameters from the object under test; ``sample`` draws one service time."""

    @property
    def kind(self) -> str:
        """The profile's name of the kind (read-only: services are frozen dataclasses)."""
        ...

    def mean(self, shape: BatchShape) -> float: ...

    def variance(self, shape: BatchShape) -> float: ...

    def sample(self, shape: BatchShape, rng: np.random.Generator) -> float: ...

    def to_dict(self) -> dict[str, Any]: ...


#: kind name -> parser ``(spec: dict, where: Where) -> ServiceModel``
KINDS: Registry[Callable[..., ServiceModel]] = Registry("profile service kind")

# Each kind registers itself in KINDS when imported, so the imports come after it.
from simulator.profile.kinds import distribution, iteration, spec_decode, table  # noqa: E402, F401
