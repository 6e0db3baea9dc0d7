"""The discrete-event model of the serving system (simpy). Nothing here imports torch.

Names are imported on first use (PEP 562), as the package ``simulator``'s are: a module of
the package that needs none of them (the compiled kernel's loader, which the native trace
reader also calls) is imported without the reference engine and simpy.
"""

from simulator.lazy_names import on_first_use

_EXPORTS = {
    "simulator.model.autoscalers": ["AUTOSCALERS"],
    "simulator.model.dispatch": ["DISPATCH_RULES"],
    "simulator.model.engine": ["System", "simulate"],
    "simulator.model.policies": ["POLICIES"],
    "simulator.model.replicas": ["POOL_RULES"],
    "simulator.model.resources": ["GPU_SHARING"],
    "simulator.model.topologies": ["TOPOLOGIES"],
}
__all__ = sorted(name for names in _EXPORTS.values() for name in names)
__getattr__, __dir__ = on_first_use("simulator.model", _EXPORTS, globals())
