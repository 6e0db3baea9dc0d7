"""Queue topologies: how a task's prompts reach workers and GPUs.

Each topology is one small class, registered by its CLI name, built once per task for a
run. Its one entry point is ``accept(prompt_ids)``: a call's group of prompts of this task
arrives now.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from simulator.registry import Registry

if TYPE_CHECKING:
    from simulator.model.engine import System
    from simulator.scenario import TaskConfig


class Topology(ABC):
    """Base class: the front end of one task inside the modeled system."""

    name = ""
    # Which task settings a topology reads is declared with the settings
    # (simulator.settings: read_by, and ignored_by(topology) for what it never reads).

    def __init__(self, system: System, task: str, config: TaskConfig) -> None:
        self.system = system
        self.task = task
        self.config = config

    @abstractmethod
    def accept(self, prompt_ids: list[int]) -> None:
        """A call's prompts of this task arrive now."""


TOPOLOGIES: Registry[type[Topology]] = Registry("topology")

# Registration order is the order the CLI lists them.
from simulator.model.topologies import shared as _shared  # noqa: E402,F401,I001
from simulator.model.topologies import split as _split  # noqa: E402,F401
from simulator.model.topologies import direct as _direct  # noqa: E402,F401
from simulator.model.topologies import continuous as _continuous  # noqa: E402,F401
