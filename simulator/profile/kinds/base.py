"""What every service-model kind is: the :class:`ServiceModel` protocol and the
:data:`KINDS` registry each kind's module registers itself in.

A service model answers, for a batch of prompts of one task, how long the batch keeps its
device busy (seconds of exclusive use).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from simulator.profile.shape import BatchShape
from simulator.registry import Registry

if TYPE_CHECKING:
    from simulator.profile.iteration import StepCost


class TaskDefaults(Protocol):
    """What a kind reads of its task's profile: the lengths a prompt without its own has,
    and the tokens a row commits per decoding iteration."""

    prompt_tokens: int
    max_tokens: int
    tokens_per_iteration: float


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

    def step_cost(self, task_profile: TaskDefaults) -> StepCost:
        """The iteration costs of a continuous-batching engine of this service."""
        ...

    def first_token_seconds(self, task_profile: TaskDefaults, shape: BatchShape, work: float) -> float:
        """Seconds of exclusive device time from a static batch's start to its first token,
        for a batch that drew ``work`` seconds in all."""
        ...


#: kind name -> parser ``(spec: dict, where: Where) -> ServiceModel``
KINDS: Registry[Callable[..., ServiceModel]] = Registry("profile service kind")
