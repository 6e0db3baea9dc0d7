"""Queue topologies: how a task's prompts reach workers and GPUs.

Each topology is one small class, registered by its CLI name, built once per task for a
run with the run's :class:`~simulator.model.context.RunContext`. Its one entry point is
``accept(prompt_ids)``: a call's group of prompts of this task arrives now.
"""

# isort: off
# Registration order is the order the CLI lists them.
from simulator.model.topologies.base import TOPOLOGIES, Topology
from simulator.model.topologies import shared as _shared  # noqa: F401
from simulator.model.topologies import split as _split  # noqa: F401
from simulator.model.topologies import direct as _direct  # noqa: F401
from simulator.model.topologies import continuous as _continuous  # noqa: F401
from simulator.model.topologies import disaggregated as _disaggregated  # noqa: F401
# isort: on

__all__ = ["TOPOLOGIES", "Topology"]
