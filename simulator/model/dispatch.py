"""Dispatch rules: which of several places (queues or GPUs) gets the next prompt or batch.

Each rule is a small class with one decision method, ``choose(loads, rng) -> index``,
where ``loads[i]`` is the outstanding work at place i (waiting plus in service), in the
rule's ``unit``: prompts, or tokens (prompt plus max output tokens of each outstanding
prompt; a continuous engine counts only what is left to do). A rule
instance belongs to one decision site (one task's router), so round-robin state is not
shared between tasks, except within a named dispatch group (:class:`DispatchGroups`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from operator import attrgetter

import numpy as np

from simulator.registry import Registry


class DispatchRule(ABC):
    """Base class of dispatch rules."""

    name = ""
    unit = "prompts"

    def loads(self, places: Sequence, pid: int | None = None) -> list:
        """The load of each place in this rule's unit: every place (queue, device or engine)
        has ``outstanding``, ``outstanding_tokens`` and ``waiting_count``. ``pid`` is the
        prompt being placed, where one is (a rule that reads the prompt needs it)."""
        return list(map(_LOAD_ATTRIBUTE[self.unit], places))

    @abstractmethod
    def choose(self, loads: Sequence[int], rng: np.random.Generator) -> int:
        """Index of the chosen place."""


_LOAD_ATTRIBUTE = {unit: attrgetter(name) for unit, name in
                   {"prompts": "outstanding", "tokens": "outstanding_tokens", "waiting": "waiting_count"}.items()}


# The choices themselves, as functions of plain numbers: the rule classes below call them and
# the compiled kernel compiles these same functions (simulator.model.batch_kernel).

def round_robin_index(turn: int, places: int) -> int:
    """The place a rotation standing at ``turn`` picks among ``places`` (it then stands at the
    index plus one)."""
    return turn % places


def least_loaded_index(loads: Sequence[int], places: int) -> int:
    """The first of ``places`` places with the least load (``loads[i]``): ties go to the lowest index."""
    best = 0
    for i in range(1, places):
        if loads[i] < loads[best]:
            best = i
    return best

DISPATCH_RULES: Registry[type[DispatchRule]] = Registry("dispatch rule")


@DISPATCH_RULES.register("round-robin")
class RoundRobin(DispatchRule):
    """Places in turn: 0, 1, ..., n-1, 0, ..."""

    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, loads: Sequence[int], rng: np.random.Generator) -> int:
        index = round_robin_index(self._next, len(loads))
        self._next = index + 1
        return index


@DISPATCH_RULES.register("least-loaded")
class LeastLoaded(DispatchRule):
    """The place with the fewest outstanding prompts; ties go to the lowest index."""

    name = "least-loaded"

    def choose(self, loads: Sequence[int], rng: np.random.Generator) -> int:
        return least_loaded_index(loads, len(loads))


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


@DISPATCH_RULES.register("cache-aware")
class CacheAware(DispatchRule):
    """The engine holding the longest cached prefix of the prompt; ties (no engine holds
    any, say) go to the fewest outstanding tokens, then the lowest index: llm-d's KV-cache
    aware routing, scoring prefix hits first and load second. Only continuous engines
    with ``prefix_caching`` hold prefixes (:data:`PREFIX_RULES`)."""

    name = "cache-aware"
    unit = "prefix"

    def loads(self, places: Sequence, pid: int | None = None) -> list:
        assert pid is not None, "cache-aware dispatch places prompts, one at a time"
        return [(-place.prefix.hit_blocks(pid), place.outstanding_tokens) for place in places]

    def choose(self, loads: Sequence, rng: np.random.Generator) -> int:
        return min(range(len(loads)), key=loads.__getitem__)


#: Dispatch rules that read the prompt's cached prefix: continuous engines with prefix caching only.
PREFIX_RULES = frozenset({"cache-aware"})


class DispatchGroups:
    """Named dispatch groups: the tasks of one group share one round-robin rotation (a
    server's iterator over its GPUs that every request group advances).

    A task of a group whose dispatch rule is ``round-robin`` takes its places from the
    group's rotation (:meth:`rule_for`); every call's group of prompts of a task that takes
    nothing from it (a task on the CPU, or of another rule) still advances it by one turn
    when it starts (:meth:`group_started`). ``group_of`` names a task's group (``None``:
    none)."""

    def __init__(self, group_of: Callable[[str], str | None]) -> None:
        self._group_of = group_of
        self._groups: dict[str, str | None] = {}
        self._rotations: dict[str, RoundRobin] = {}
        self._takers: set[str] = set()  # tasks whose dispatch draws from their group's rotation

    def group(self, task: str) -> str | None:
        """The dispatch group of ``task``, if any."""
        if task not in self._groups:
            self._groups[task] = self._group_of(task)
        return self._groups[task]

    def _rotation(self, group: str) -> RoundRobin:
        rotation = self._rotations.get(group)
        if rotation is None:
            rotation = self._rotations[group] = RoundRobin()
        return rotation

    def rule_for(self, task: str, dispatch: str) -> DispatchRule | None:
        """The rotation ``task`` takes from (its rule being ``dispatch``), else ``None``."""
        group = self.group(task)
        if group is None or dispatch != "round-robin":
            return None
        self._takers.add(task)
        return self._rotation(group)

    def group_started(self, task: str, places: int, rng: np.random.Generator) -> None:
        """A call's group of prompts of ``task`` starts: a task that does not take from its
        group's rotation advances it over ``places`` places."""
        group = self.group(task)
        if group is not None and task not in self._takers:
            self._rotation(group).choose(range(places), rng)
