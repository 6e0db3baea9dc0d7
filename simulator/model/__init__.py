"""The discrete-event model of the serving system (simpy). Nothing here imports torch."""

from simulator.model.autoscalers import AUTOSCALERS
from simulator.model.dispatch import DISPATCH_RULES
from simulator.model.engine import System, simulate
from simulator.model.policies import POLICIES
from simulator.model.replicas import POOL_RULES
from simulator.model.resources import GPU_SHARING
from simulator.model.topologies import TOPOLOGIES

__all__ = ["AUTOSCALERS", "DISPATCH_RULES", "GPU_SHARING", "POLICIES", "POOL_RULES", "TOPOLOGIES", "System", "simulate"]
