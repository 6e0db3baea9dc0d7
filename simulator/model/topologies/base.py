"""The topology base class and registry (the package imports every registered topology)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from simulator.registry import Registry

if TYPE_CHECKING:
    from simulator.model.context import RunContext
    from simulator.scenario import TaskConfig


class Topology(ABC):
    """Base class: the front end of one task inside the modeled system."""

    name = ""
    # Which task settings a topology reads is declared with the settings
    # (simulator.settings: read_by, and ignored_by(topology) for what it never reads).

    def __init__(self, run: RunContext, task: str, config: TaskConfig) -> None:
        self.run = run
        self.task = task
        self.config = config

    @abstractmethod
    def accept(self, prompt_ids: list[int]) -> None:
        """A call's prompts of this task arrive now."""


TOPOLOGIES: Registry[type[Topology]] = Registry("topology")
