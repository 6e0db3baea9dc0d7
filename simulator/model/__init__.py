"""The discrete-event model of the serving system (simpy). Nothing here imports torch.

Names are imported on first use (PEP 562), as the package ``simulator``'s are: a module of
the package that needs none of them (the compiled kernel's loader, which the native trace
reader also calls) is imported without the reference engine and simpy.
"""

import importlib
from typing import Any

_EXPORTS = {
    "simulator.model.autoscalers": ["AUTOSCALERS"],
    "simulator.model.dispatch": ["DISPATCH_RULES"],
    "simulator.model.engine": ["System", "simulate"],
    "simulator.model.policies": ["POLICIES"],
    "simulator.model.replicas": ["POOL_RULES"],
    "simulator.model.resources": ["GPU_SHARING"],
    "simulator.model.topologies": ["TOPOLOGIES"],
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'simulator.model' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
