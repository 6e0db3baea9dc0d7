"""``replay``: push a trace through a modeled serving system and summarise what happened."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, overload

import pandas as pd

from simulator.cost import PriceTable, cost_summary, load_prices
from simulator.metrics import TokenOptions, log_columns, summarize_columns
from simulator.model import simulate
from simulator.model.engine import simulate_columns
from simulator.profile import DEFAULT_PROFILE, Profile, load_profile
from simulator.profile.grid import outside_grid
from simulator.profile.identity import describe
from simulator.scenario import Scenario, build_scenario, check_tasks
from simulator.trace.model import Trace


@dataclass(frozen=True)
class ReplayResult:
    """What one replay produced: the per-prompt event ``log`` and its ``summary`` (the
    summary JSON, with the full resolved configuration under ``config``)."""

    log: pd.DataFrame
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
    check_tasks(scenario, profile.tasks, trace.tasks, f"the profile {profile.name}")
    log, summary = simulate_and_summarize(trace, scenario, profile, seed,
                                          resolved_config(trace, scenario, profile, seed), prices=prices,
                                          tokens=tokens)
    # where the run left the grid a composed profile was fitted on (simulator.profile.grid)
    summary["config"]["profile"]["outside_grid"] = [o.to_dict() for o in outside_grid(profile, log)]
    return ReplayResult(log=log, summary=summary, scenario=scenario, profile=profile, seed=seed)


@overload
def simulate_and_summarize(trace: Trace, scenario: Scenario, profile: Profile, seed: int,
                           config: dict[str, Any] | None = None, prices: PriceTable | None = None,
                           tokens: TokenOptions | None = None,
                           keep_log: Literal[True] = True) -> tuple[pd.DataFrame, dict[str, Any]]: ...


@overload
def simulate_and_summarize(trace: Trace, scenario: Scenario, profile: Profile, seed: int,
                           config: dict[str, Any] | None = None, prices: PriceTable | None = None,
                           tokens: TokenOptions | None = None,
                           *, keep_log: Literal[False]) -> tuple[None, dict[str, Any]]: ...


def simulate_and_summarize(trace: Trace, scenario: Scenario, profile: Profile, seed: int,
                           config: dict[str, Any] | None = None,
                           prices: PriceTable | None = None,
                           tokens: TokenOptions | None = None,
                           keep_log: bool = True) -> tuple[pd.DataFrame | None, dict[str, Any]]:
    """The one way a run becomes figures (replay, every sweep row): ``trace`` scaled by the
    scenario's ``rate_scale``, simulated, and summarised with the scenario's deadline, GPU
    count, client timeout and composition classes; ``config`` goes into the summary as is.
    The summary's ``cost`` is priced by ``prices`` (``None``: the default table); ``tokens``
    chooses the token figures' percentiles and goodput SLO (:func:`simulator.metrics.token_figures`).
    ``keep_log=False`` (a sweep's rows): no event log frame is made where the compiled kernel
    runs the scenario (its columns are summarised as they come) and ``None`` is returned
    for it; the summary is the same."""
    scaled = trace.scaled(scenario.rate_scale)
    log = simulate(scaled, scenario, profile, seed) if keep_log else None
    columns = log_columns(log) if log is not None else simulate_columns(scaled, scenario, profile, seed)
    # with a replica pool the GPUs are those of every replica started (ids in the log)
    gpus = scenario.gpus if scenario.autoscaler is None else None
    summary = summarize_columns(columns, config, deadline=scenario.deadline, gpus=gpus,
                                client_timeout=scenario.client_timeout, compositions=scenario.compositions,
                                tokens=tokens)
    del columns
    config_part = summary.pop("config")
    summary["cost"] = cost_summary(summary, scenario, profile, prices if prices is not None else load_prices())
    summary["config"] = config_part
    return log, summary
