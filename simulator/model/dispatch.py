"""Dispatch rules: which of several places (queues or GPUs) gets the next prompt or batch.

Each rule is a small class with one decision method, ``choose(loads, rng) -> index``,
where ``loads[i]`` is the outstanding work at place i (waiting plus in service), in the
rule's ``unit``: prompts, or tokens (prompt plus max output tokens of each outstanding
prompt; a continuous engine counts only what is left to do). A rule
instance belongs to one decision site (one task's router), so round-robin state is not
shared between tasks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np

from simulator.registry import Registry


class DispatchRule(ABC):
    """Base class of dispatch rules."""

    name = ""
    unit = "prompts"

    def loads(self, places: Sequence) -> list[int]:
        """The load of each place in this rule's unit: every place (queue, device or engine)
        has ``outstanding``, ``outstanding_tokens`` and ``waiting_count``."""
        attr = _LOAD_ATTRIBUTE[self.unit]
        return [getattr(place, attr) for place in places]

    @abstractmethod
    def choose(self, loads: Sequence[int], rng: np.random.Generator) -> int:
        """Index of the chosen place."""


_LOAD_ATTRIBUTE = {"prompts": "outstanding", "tokens": "outstanding_tokens", "waiting": "waiting_count"}

DISPATCH_RULES: Registry[type[DispatchRule]] = Registry("dispatch rule")


@DISPATCH_RULES.register("round-robin")
class RoundRobin(DispatchRule):
    """Places in turn: 0, 1, ..., n-1, 0, ..."""

    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, loads: Sequence[int], rng: np.random.Generator) -> int:
        index = self._next % len(loads)
        self._next = index + 1
        return index


@DISPATCH_RULES.register("least-loaded")
class LeastLoaded(DispatchRule):
    """The place with the fewest outstanding prompts; ties go to the lowest index."""

    name = "least-loaded"

    def choose(self, loads: Sequence[int], rng: np.random.Generator) -> int:
        best = 0
        for i in range(1, len(loads)):
            if loads[i] < loads[best]:
                best = i
        return best


@DISPATCH_RULES.register("jsq-tokens")
class ShortestByTokens(LeastLoaded):
    """Join the shortest queue by outstanding tokens; ties go to the lowest index."""

    name = "jsq-tokens"
    unit = "tokens"


@DISPATCH_RULES.register("shortest-waiting")
class ShortestWaiting(LeastLoaded):
    """The queue with the fewest prompts *waiting* (batches formed or running are not
    counted, as a server comparing ``len(queue)`` does); ties go to the lowest index. Where
    the places are GPUs or engines, which have no waiting line of prompts, it compares
    outstanding prompts like ``least-loaded``."""

    name = "shortest-waiting"
    unit = "waiting"


@DISPATCH_RULES.register("random")
class UniformRandom(DispatchRule):
    """A place drawn uniformly at random (from the run's dispatch stream)."""

    name = "random"

    def choose(self, loads: Sequence[int], rng: np.random.Generator) -> int:
        return int(rng.integers(len(loads)))
