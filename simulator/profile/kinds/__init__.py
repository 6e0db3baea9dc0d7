"""Service-model kinds. Each kind is one module registered here by its ``kind`` name.

A service model answers, for a batch of prompts of one task, how long the batch keeps its
device busy (seconds of exclusive use). Every kind implements :class:`ServiceModel`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from simulator.profile.shape import BatchShape
from simulator.registry import Registry

if TYPE_CHECKING:
    from simulator.profile import TaskProfile
    from simulator.profile.iteration import StepCost


class ServiceModel(Protocol):
    """Batch service time of one task. ``mean``/``variance`` let theory tests read the
    parameters from the object under test; ``sample`` draws one service time.

    What a kind can do beyond that is declared, never probed: ``draws_acceptance`` (its
    draws also give each row's draft acceptance rate, :meth:`sample_detail`, so a
    lookahead can adapt to them); :meth:`host_fraction` (``None`` where the kind does not
    compute one); its iteration costs for continuous batching (:meth:`step_cost`) and its
    first token's offset in a static batch (:meth:`first_token_seconds`), see
    :mod:`simulator.profile.iteration`."""

    draws_acceptance: ClassVar[bool]

    @property
    def kind(self) -> str:
        """The profile's name of the kind (read-only: services are frozen dataclasses)."""
        ...

    def mean(self, shape: BatchShape) -> float: ...

    def variance(self, shape: BatchShape) -> float: ...

    def sample(self, shape: BatchShape, rng: np.random.Generator) -> float: ...

    def to_dict(self) -> dict[str, Any]: ...

    def host_fraction(self, shape: BatchShape) -> float | None:
        """Share of a batch's time that holds the host's interpreter lock, where the kind
        computes one (an engine block); ``None``: the task's figure applies."""
        ...

    def step_cost(self, task_profile: TaskProfile) -> StepCost:
        """The iteration costs of a continuous-batching engine of this service."""
        ...

    def first_token_seconds(self, task_profile: TaskProfile, shape: BatchShape, work: float) -> float:
        """Seconds of exclusive device time from a static batch's start to its first token,
        for a batch that drew ``work`` seconds in all."""
        ...


#: kind name -> parser ``(spec: dict, where: Where) -> ServiceModel``
KINDS: Registry[Callable[..., ServiceModel]] = Registry("profile service kind")

# Each kind registers itself in KINDS when imported, so the imports come after it.
from simulator.profile.kinds import distribution, iteration, spec_decode, table  # noqa: E402, F401

__all__ = ["KINDS", "BatchShape", "ServiceModel"]
