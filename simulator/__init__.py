"""simctl: a discrete-event traffic simulator and capacity planner for batched LLM serving.

The public API (what the CLI and notebooks use)::

    trace    = load_trace("traces/batch_arrivals.json")
    profile  = load_profile("seed-calibrated")
    scenario = build_scenario(path="scenarios/design-notes.toml")
    result   = replay(trace, scenario, profile, seed=0)
    result.summary["tasks"]["infobench"]["latency"]["p95"]
    result.log                    # the per-prompt event log (pandas)
"""

from simulator.errors import (
    OutputError,
    ProfileError,
    ScenarioError,
    SimctlError,
    SimctlWarning,
    TraceError,
)
from simulator.events import EVENT_COLUMNS, read_event_log, with_durations, write_event_log
from simulator.metrics import call_table, describe, summarize
from simulator.model import DISPATCH_RULES, GPU_SHARING, POLICIES, TOPOLOGIES, simulate
from simulator.profile import Profile, load_profile, profile_from_dict
from simulator.replay import ReplayResult, replay
from simulator.scenario import Scenario, TaskConfig, build_scenario
from simulator.trace.formats import load_trace, save_trace
from simulator.trace.model import Call, Prompt, Trace
from simulator.trace.stats import trace_stats
from simulator.trace.synth import SynthSpec, synthesize

__all__ = [
    "Call", "DISPATCH_RULES", "EVENT_COLUMNS", "GPU_SHARING", "OutputError", "POLICIES",
    "Profile", "ProfileError", "Prompt", "ReplayResult", "Scenario", "ScenarioError",
    "SimctlError", "SimctlWarning", "SynthSpec", "TOPOLOGIES", "TaskConfig", "Trace",
    "TraceError", "build_scenario", "call_table", "describe", "load_profile", "load_trace",
    "profile_from_dict", "read_event_log", "replay", "save_trace", "simulate", "summarize",
    "synthesize", "trace_stats", "with_durations", "write_event_log",
]
