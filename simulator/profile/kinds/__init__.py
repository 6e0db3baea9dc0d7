"""Service-model kinds. Each kind is one module registered by its ``kind`` name in
:data:`KINDS` (:mod:`simulator.profile.kinds.base`); importing this package registers them.
Every kind implements :class:`ServiceModel`.
"""

from __future__ import annotations

from simulator.profile.kinds import distribution, iteration, spec_decode, table  # noqa: F401  (registration)
from simulator.profile.kinds.base import KINDS, ServiceModel, TaskDefaults
from simulator.profile.shape import BatchShape

__all__ = ["KINDS", "BatchShape", "ServiceModel", "TaskDefaults"]
