"""``replay``: push a trace through a modeled serving system and summarise what happened."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from simulator.cost import PriceTable, cost_summary, load_prices
from simulator.errors import SnapshotError
from simulator.metrics import TokenOptions, log_columns, summarize_columns
from simulator.model import simulate
from simulator.model.engine import simulate_columns
from simulator.profile import DEFAULT_PROFILE, Profile, load_profile
from simulator.profile.grid import outside_grid
from simulator.profile.identity import describe
from simulator.scenario import Scenario, build_scenario, check_tasks
from simulator.trace.model import Trace

if TYPE_CHECKING:
    import pandas as pd

    from simulator.model.start import StartState
    from simulator.snapshot import Snapshot


@dataclass(frozen=True)
class ReplayResult:
    """What one replay produced: the per-prompt event ``log`` (``None`` for a replay asked
    not to keep it) and its ``summary`` (the summary JSON, with the full resolved
    configuration under ``config``)."""

    log: pd.DataFrame | None
    summary: dict[str, Any]
    scenario: Scenario
    profile: Profile
    seed: int


def resolved_config(trace: Trace, scenario: Scenario, profile: Profile, seed: int) -> dict[str, Any]:
    """Everything that determined a run, as JSON-ready data (written beside results)."""
    tasks = trace.tasks
    return {
        "scenario": scenario.to_dict(),
        "tasks": {
            t: dict(asdict(scenario.for_task(t)),
                    resource=scenario.for_task(t).resource or profile.task(t).resource)
            for t in tasks
        },
        "profile": {"name": profile.name, "path": profile.path, "source": profile.source,
                    "identity": describe(profile).to_dict()},
        "trace": {"source": trace.source, "calls": len(trace), "prompts": trace.n_prompts},
        "seed": seed,
    }


def replay(
    trace: Trace | str | Path,
    scenario: Scenario | None = None,
    profile: Profile | str | Path = DEFAULT_PROFILE,
    seed: int = 0,
    prices: PriceTable | str | Path | None = None,
    tokens: TokenOptions | None = None,
    initial_state: Snapshot | str | Path | None = None,
    start: float | None = None,
    state_task: str | None = None,
    keep_log: bool = True,
) -> ReplayResult:
    """Replay ``trace`` through ``scenario`` with service times from ``profile``.

    ``trace`` may be a path (any supported format) and ``profile`` a path or the name of a
    bundled profile. The scenario's ``rate_scale`` scales inter-arrival times by 1/x and its
    ``deadline`` marks prompts not done by then as timed out. ``prices`` (a table, a file or
    a bundled name; default the bundled default) prices the summary's ``cost``
    (:mod:`simulator.cost`). The summary's ``config.profile`` carries the profile's
    ``identity`` (:func:`simulator.profile.identity.describe`) and ``outside_grid``: where the
    run's batches or contexts left the grid a composed profile was fitted on
    (:func:`simulator.profile.grid.outside_grid`). ``tokens`` chooses the percentiles and
    goodput SLO of the summary's token figures. Same inputs and seed give the same event log.

    ``initial_state`` (a :class:`~simulator.snapshot.Snapshot` or its file): the run starts
    from that state instead of an empty system (:mod:`simulator.model.start`; the reference
    engine) and the trace is "the rest": its calls at or after ``start`` seconds (default the
    snapshot's ``taken_at``, else 0), shifted to start at 0, then rate-scaled.
    ``state_task``: the task of the snapshot's prompts whose source does not tell it. The
    summary's figures are then the trace's calls' alone; the snapshot's prompts are its
    ``from_state`` entry (:func:`from_state_summary`) and the log's ``from_state`` rows.
    """
    if not isinstance(trace, Trace):
        from simulator.trace.formats import load_trace

        trace = load_trace(trace)
    if scenario is None:
        scenario = build_scenario()
    if not isinstance(profile, Profile):
        profile = load_profile(profile)
    if not isinstance(prices, PriceTable):
        prices = load_prices(prices)
    snapshot = None
    if initial_state is not None:
        from simulator.snapshot import Snapshot, load_snapshot  # (a run from a state only)

        snapshot = initial_state if isinstance(initial_state, Snapshot) else load_snapshot(initial_state)
        start = start if start is not None else (snapshot.taken_at or 0.0)
        if not start >= 0:
            raise SnapshotError(snapshot.path or snapshot.location, None, "start",
                                f"must be a number of seconds of at least 0, got {start!r}")
        trace = trace.after(start)
        if not len(trace):
            raise SnapshotError(trace.source, None, "start", f"the trace has no calls at or after {start:g} s")
    check_tasks(scenario, profile.tasks, trace.tasks, f"the profile {profile.name}")
    config = resolved_config(trace, scenario, profile, seed)
    if snapshot is not None:
        config["from_state"] = {"snapshot": snapshot.path or snapshot.location, "source": snapshot.source_kind,
                                "taken_at": snapshot.taken_at, "start": start, "state_task": state_task}
    log, summary = simulate_and_summarize(trace, scenario, profile, seed, config, prices=prices, tokens=tokens,
                                          keep_log=keep_log, initial_state=snapshot, state_task=state_task)
    return ReplayResult(log=log, summary=summary, scenario=scenario, profile=profile, seed=seed)


@overload
def simulate_and_summarize(trace: Trace, scenario: Scenario, profile: Profile, seed: int,
                           config: dict[str, Any] | None = None, prices: PriceTable | None = None,
                           tokens: TokenOptions | None = None,
                           keep_log: Literal[True] = True, initial_state: Snapshot | None = None,
                           state_task: str | None = None) -> tuple[pd.DataFrame, dict[str, Any]]: ...


@overload
def simulate_and_summarize(trace: Trace, scenario: Scenario, profile: Profile, seed: int,
                           config: dict[str, Any] | None = None, prices: PriceTable | None = None,
                           tokens: TokenOptions | None = None,
                           *, keep_log: Literal[False], initial_state: Snapshot | None = None,
                           state_task: str | None = None) -> tuple[None, dict[str, Any]]: ...


@overload
def simulate_and_summarize(trace: Trace, scenario: Scenario, profile: Profile, seed: int,
                           config: dict[str, Any] | None = None, prices: PriceTable | None = None,
                           tokens: TokenOptions | None = None,
                           *, keep_log: bool, initial_state: Snapshot | None = None,
                           state_task: str | None = None) -> tuple[pd.DataFrame | None, dict[str, Any]]: ...


def simulate_and_summarize(trace: Trace, scenario: Scenario, profile: Profile, seed: int,
                           config: dict[str, Any] | None = None,
                           prices: PriceTable | None = None,
                           tokens: TokenOptions | None = None,
                           keep_log: bool = True, initial_state: Snapshot | None = None,
                           state_task: str | None = None) -> tuple[pd.DataFrame | None, dict[str, Any]]:
    """The one way a run becomes figures (replay, every sweep row): ``trace`` scaled by the
    scenario's ``rate_scale``, simulated, and summarised with the scenario's deadline, GPU
    count, client timeout and composition classes. ``config`` (a replay's resolved
    configuration) goes into the summary with two facts of the run added: ``engine``, the
    engine that ran it (the log's ``attrs["engine"]``), and ``profile.outside_grid``, where its
    batches or contexts left the grid a composed profile was fitted on
    (:func:`simulator.profile.grid.outside_grid`).
    The summary's ``cost`` is priced by ``prices`` (``None``: the default table); ``tokens``
    chooses the token figures' percentiles and goodput SLO (:func:`simulator.metrics.token_figures`).
    ``keep_log=False`` (a sweep's rows): no event log frame is made where the compiled kernel
    runs the scenario (its columns are summarised as they come) and ``None`` is returned
    for it; the summary is the same. ``initial_state``: the run starts from that snapshot's
    state (the log is always made); the figures are the trace's prompts', the snapshot's
    are the summary's ``from_state``."""
    scaled = trace.scaled(scenario.rate_scale)
    state = None
    if initial_state is not None:
        from simulator.model.start import StartState

        state = StartState(initial_state, scaled, scenario, profile, state_task)
        log = simulate(scaled, scenario, profile, seed, initial_state=state)
        keep_log = True
    else:
        log = simulate(scaled, scenario, profile, seed) if keep_log else None
    if state is not None and log is not None:
        columns = log_columns(new_traffic(log, state.calls))
    else:
        columns = log_columns(log) if log is not None else simulate_columns(scaled, scenario, profile, seed)
    # with a replica pool the GPUs are those of every replica started (ids in the log)
    gpus = scenario.gpus if scenario.autoscaler is None else None
    summary = summarize_columns(columns, config, deadline=scenario.deadline, gpus=gpus,
                                client_timeout=scenario.client_timeout, compositions=scenario.compositions,
                                tokens=tokens)
    if config is not None:
        summary["config"]["engine"] = columns.attrs.get("engine")
        if isinstance(summary["config"].get("profile"), dict):
            summary["config"]["profile"]["outside_grid"] = [o.to_dict() for o in outside_grid(profile, columns)]
    del columns
    config_part = summary.pop("config")
    summary["cost"] = cost_summary(summary, scenario, profile, prices if prices is not None else load_prices())
    summary["config"] = config_part
    if state is not None and log is not None:
        summary["from_state"] = from_state_summary(log, state)
    return log if keep_log else None, summary


def new_traffic(log: pd.DataFrame, state_calls: int) -> pd.DataFrame:
    """The rows of ``log`` that are the trace's own prompts (not a snapshot's), their calls
    numbered from 0 again (``state_calls`` snapshot calls came first)."""
    new = log[~log["from_state"].to_numpy(bool)].copy()
    new["call_index"] = new["call_index"] - state_calls
    new.attrs = dict(log.attrs)
    return new.reset_index(drop=True)


def from_state_summary(log: pd.DataFrame, state: StartState) -> dict[str, Any]:
    """The snapshot's prompts in a run that started from it: how many waited and ran, their
    latency (``done_at − arrived_at``, ``arrived_at`` set back by their age at the snapshot:
    mean, p50, p90, max) and when the last of them was done (``cleared_at``), with what the
    snapshot could not tell (``unknown``) and how the run filled it in (``notes``)."""
    import numpy as np

    rows = log[log["from_state"].to_numpy(bool)]
    latency = (rows["done_at"] - rows["arrived_at"]).to_numpy(float)
    done = latency[np.isfinite(latency)]
    snapshot = state.snapshot

    def figure(f: Any) -> float | None:
        return float(f(done)) if done.size else None

    return {
        "prompts": int(len(rows)), "waiting": snapshot.waiting_prompts, "running": snapshot.running_prompts,
        "running_batches": len(snapshot.running), "done": int(done.size),
        "latency": {"mean": figure(np.mean), "p50": figure(lambda x: np.percentile(x, 50)),
                    "p90": figure(lambda x: np.percentile(x, 90)), "max": figure(np.max)},
        "cleared_at": float(np.nanmax(rows["done_at"].to_numpy(float))) if done.size else None,
        "source": snapshot.source_kind, "taken_at": snapshot.taken_at,
        "kv_cache_usage": snapshot.kv_cache_usage, "prefix_cache_hit_rate": snapshot.prefix_cache_hit_rate,
        "unknown": list(snapshot.unknown), "notes": list(state.notes),
    }
