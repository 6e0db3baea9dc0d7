"""simctl: a discrete-event traffic simulator and capacity planner for batched LLM serving.

The public API (what the CLI and notebooks use)::

    trace    = load_trace("example")           # a bundled trace by name, or any path
    profile  = load_profile("seed-calibrated")
    scenario = build_scenario(path="design-notes")
    result   = replay(trace, scenario, profile, seed=0)
    result.summary["tasks"]["infobench"]["latency"]["p95"]
    result.log                    # the per-prompt event log (pandas)

    # the rest of a trace, starting from what a live server holds now
    now    = take_snapshot("http://127.0.0.1:8000")               # see docs/snapshots.md
    result = replay(trace, scenario, profile, initial_state=now, start=600)

    # service times grounded in a GPU's measured per-op tables
    data = grounded_profile(profile.to_dict(), load_gpu("a100-sxm"), ...)   # see docs/hardware.md
"""

import sys
import types
from typing import Any

from simulator.lazy_names import on_first_use

# Names are imported on first use (PEP 562), so that ``import simulator.harness`` on a GPU
# machine without simpy, or ``import simulator.trace`` in a light script, pulls in only what
# it needs.
_EXPORTS = {
    "simulator.errors": ["OutputError", "ProfileError", "ScenarioError", "SimctlError",
                         "SimctlWarning", "SnapshotError", "TraceError"],
    "simulator.calibrate": ["calibrate", "predict", "simulate_figures"],
    "simulator.hardware": ["load_gpu"],
    "simulator.hardware.grounded": ["GpuTask", "grounded_profile"],
    "simulator.events": ["EVENT_COLUMNS", "LogColumns", "read_event_log", "with_durations", "write_event_log"],
    "simulator.metrics": ["call_table", "describe", "replica_figures", "replica_timeline", "summarize",
                          "summarize_columns"],
    "simulator.model": ["AUTOSCALERS", "DISPATCH_RULES", "GPU_SHARING", "POLICIES", "POOL_RULES", "TOPOLOGIES",
                        "simulate"],
    "simulator.profile": ["Profile", "load_profile", "profile_from_dict"],
    "simulator.replay": ["ReplayResult", "replay"],
    "simulator.sweep": ["Base", "SweepSpec", "read_results", "run_sweep"],
    "simulator.plan": ["SLO", "cheapest", "parse_slo", "plan"],
    "simulator.uncertainty": ["assess", "predict_worlds", "profile_worlds"],
    "simulator.cost": ["PriceTable", "load_prices"],
    "simulator.scenario": ["Scenario", "TaskConfig", "build_scenario"],
    "simulator.snapshot": ["Snapshot", "load_snapshot", "save_snapshot", "take_snapshot"],
    "simulator.trace.formats": ["load_trace", "save_trace"],
    "simulator.trace.model": ["Call", "Prompt", "Trace"],
    "simulator.trace.stats": ["trace_stats"],
    "simulator.trace.synth": ["SynthSpec", "synthesize"],
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


__getattr__, __dir__ = on_first_use("simulator", _EXPORTS, globals())


class _Package(types.ModuleType):
    """Keeps ``simulator.replay`` (and ``plan``) the functions once their modules are imported.

    Importing ``simulator.replay`` would otherwise bind the package attribute ``replay`` to
    the module, shadowing the function of the same name; the modules stay reachable through
    ``from simulator.replay import ...`` and ``sys.modules``.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and name in _MODULE_OF:
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
