"""Build the modeled serving system for a scenario, run it, return the per-prompt log.

Flow of one run: the client (:mod:`simulator.model.clients`) sends each call at its arrival
instant (open loop), or keeps N calls outstanding, sending the trace's next call a think
time after one ends (closed loop); the router (:mod:`simulator.model.router`) splits the
call into per-task groups (in the order the tasks first appear in the call); each group
goes to its task's topology (queues, workers); batches (:mod:`simulator.model.batching`) run
on GPUs or CPU pools; every prompt's instants are recorded in the run's columns
(:mod:`simulator.model.context`). A call completes when its last prompt completes (derived
later from the log, see :mod:`simulator.metrics`).

The run always continues until every prompt is done (no censoring at a horizon); a
deadline is applied by the metrics.

Randomness: the named streams of :mod:`simulator.model.streams` — ``dispatch`` and one
``service`` stream per task (keyed by the task's name), so changing one task's setup does
not reshuffle another task's service times.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from simulator.errors import ScenarioError
from simulator.events import SERVED, LogColumns
from simulator.model.clients import client_for
from simulator.model.context import RunContext
from simulator.model.fast import simulate_fast, simulate_fast_columns, unsupported
from simulator.model.log import STATUS_CODE, Outcome, PromptColumns, build_event_log, event_columns
from simulator.model.replicas import ReplicaPool, add_pool_columns, check_pool_settings
from simulator.model.router import Router
from simulator.model.rules.prefix_cache import with_system_prompts
from simulator.model.streams import dispatch_stream, service_stream
from simulator.model.topologies import TOPOLOGIES
from simulator.profile import Profile
from simulator.scenario import Scenario
from simulator.trace.model import Trace

if TYPE_CHECKING:
    import pandas as pd

    from simulator.model.start import StartState


class ServiceStreams:
    """One service stream per task, keyed by the task's name (made on first use)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._streams: dict[str, np.random.Generator] = {}

    def __call__(self, task: str) -> np.random.Generator:
        rng = self._streams.get(task)
        if rng is None:
            rng = self._streams[task] = service_stream(self.seed, task)
        return rng


class System:
    """One run of the reference engine: its context, router and client, built for a
    scenario; :meth:`run` runs it to completion."""

    def __init__(self, trace: Trace, scenario: Scenario, profile: Profile, seed: int,
                 initial_state: StartState | None = None) -> None:
        #: the snapshot's state the run starts from (its prompts ahead of the trace's)
        self.start = initial_state
        if initial_state is not None:
            trace = initial_state.trace
        self.trace = trace
        self.scenario = scenario
        self.profile = profile
        self.seed = seed
        self.context = RunContext(scenario, profile, ServiceStreams(seed), dispatch_stream(seed))
        caching = [cfg for task in trace.columns.task_names if (cfg := scenario.for_task(task)).prefix_caching]
        if caching:
            # (engines keep the list; it is filled once the router has the prompts' token counts)
            run, (from_trace, block_tokens) = self.context, prefix_chains(trace)
            chains: list[tuple[int, ...]] = []
            run.prefix_chains, run.prefix_from_trace = chains, from_trace is not None
            # without the trace's block size, a prefix block is a KV block
            run.prefix_block_tokens = block_tokens or min(cfg.block_size for cfg in caching)
        self.router = Router(self.context, trace, scenario, profile)
        if caching:
            system = {task: scenario.for_task(task).system_tokens for task in trace.columns.task_names}
            chains.extend(with_system_prompts(from_trace, run.task_of, run.prompt_tokens, system,
                                              run.prefix_block_tokens))
        #: per call: its task groups, each (the task's front, its prompt ids)
        self.groups = self.router.groups
        if initial_state is not None:
            self.router.instead = initial_state.apply(self.context, self.groups)
        self.client = client_for(scenario.client)
        if self.client.watches_calls:
            self.router.on_call_done = self.client.call_done
        #: the replica pool in front of copies of the system, when the scenario names an autoscaler
        self.pool = (ReplicaPool(self.context, self.router, scenario, profile, seed, len(trace.calls))
                     if scenario.autoscaler is not None else None)

    def run(self) -> pd.DataFrame:
        """Run to completion and return the per-prompt event log."""
        self._simulate()
        log = build_event_log(*self._event_parts())
        if self.context.prefix_chains is not None:
            log["cached_tokens"] = np.asarray(self.context.cached_tokens, dtype=np.int32)
        add_topology_columns(log, self.context.topology_columns)
        if self.pool is not None:
            add_pool_columns(log, self.pool, max(self.context.arrived_at, default=0.0))
        if self.start is not None:
            log["from_state"] = np.arange(len(log)) < self.start.prompts
        return log

    def run_columns(self) -> LogColumns:
        """:meth:`run`'s event log as columns (:class:`~simulator.events.LogColumns`), with no
        frame made where the log has only the columns every run has (no prefix cache, no
        topology's own fields, no replica pool, no start state): what a summary reads."""
        if (self.context.prefix_chains is not None or self.pool is not None or self.start is not None
                or self.context.topology_columns):
            from simulator.metrics import log_columns

            return log_columns(self.run())
        self._simulate()
        return event_columns(*self._event_parts())

    def _simulate(self) -> None:
        """Run to completion (the state the log is read from)."""
        if self.start is not None:
            self.start.place(self.context, self.groups)
        self.client.start(self.context, self.trace.calls, self.router.send if self.pool is None else self.pool.send)
        self.context.env.run()
        if self.pool is not None:
            self.pool.check_drained()
        self._check_stalled()

    def _check_stalled(self) -> None:
        """Nothing left to happen, yet prompts wait: only a batch that can never fill (static
        batching without a timeout, fed by a closed loop that waits for it) does this."""
        run, sent = self.context, self.router.sent
        stuck = [i for i, b in enumerate(run.batch_of)
                 if b < 0 and run.status[i] in SERVED and sent[run.call_of[i]]]
        if stuck:
            task = run.task_of[stuck[0]]
            cfg = run.configs[task]
            raise ScenarioError(self.scenario.source, f"tasks.{task}", "flush",
                                f"the run stalled: {len(stuck)} prompt(s) wait for a batch of {cfg.max_batch} "
                                f"that can never fill ({cfg.policy} policy without a timeout, client "
                                f"{self.scenario.client}, {sent.count(False)} call(s) never sent); "
                                f"give it a timeout with flush > 0")

    def _event_parts(self) -> tuple[PromptColumns, Outcome]:
        """What the run knew of each prompt and what it decided: the event log's parts."""
        run = self.context
        batches = run.batches
        names = list(run.configs)
        code = {t: i for i, t in enumerate(names)}
        queues = sorted({b.queue for b in batches})
        queue_code = {q: i for i, q in enumerate(queues)}
        outcome = Outcome(
            batch_of=np.asarray(run.batch_of, dtype=np.int64),
            done_at=np.asarray(run.done_at, dtype=float),
            first_token_at=np.asarray(run.first_token_at, dtype=float),
            status=np.array([STATUS_CODE[s] for s in run.status], dtype=np.int8),
            preemptions=np.asarray(run.preemptions, dtype=np.int64),
            batch_id=np.array([b.id for b in batches], dtype=np.int64),
            formed_at=np.array([b.formed_at for b in batches], dtype=float),
            started_at=np.array([b.started_at for b in batches], dtype=float),
            device=np.array([b.device for b in batches], dtype=np.int64),
            worker=np.array([b.worker for b in batches], dtype=np.int64),
            size=np.array([len(b.prompts) for b in batches], dtype=np.int64),
            queue=np.array([queue_code[b.queue] for b in batches], dtype=np.int64),
            queue_names=queues,
        )
        return prompt_columns(self.trace, names, code, run.task_of, [run.resource_of(t) for t in names],
                              run.prompt_tokens, run.max_tokens, run.arrived_at), outcome


def add_topology_columns(log: pd.DataFrame, columns: dict[str, tuple[type, dict[int, float]]]) -> None:
    """Add the per-prompt fields topologies recorded (:class:`~simulator.model.prompts.PromptTable`'s
    ``topology_columns``) to ``log``: an integer field is a nullable integer (empty where no
    value was given), a float field NaN there; a field ``log`` has already keeps its values
    where none was given."""
    import pandas as pd

    n = len(log)
    for name, (kind, values) in columns.items():
        rows = np.fromiter(values.keys(), dtype=np.int64, count=len(values))
        if kind is int:
            column = (log[name].to_numpy(dtype=np.int64, na_value=-1) if name in log
                      else np.full(n, -1, dtype=np.int64))
            column[rows] = np.fromiter(values.values(), dtype=np.int64, count=len(values))
            log[name] = pd.arrays.IntegerArray(column.astype(np.int32), mask=column < 0)
        else:
            out = log[name].to_numpy(dtype=float, copy=True) if name in log else np.full(n, np.nan)
            out[rows] = np.fromiter(values.values(), dtype=float, count=len(values))
            log[name] = out


def prefix_chains(trace: Trace) -> tuple[list[tuple[int, ...]] | None, int]:
    """Each prompt's prefix block ids (trace order) and the tokens of a block; ``(None, 0)``
    for a trace without them."""
    cols = trace.columns
    if cols.prefix_hashes is None or cols.prefix_offsets is None:
        return None, 0
    ids, bounds = cols.prefix_hashes.tolist(), cols.prefix_offsets.tolist()
    return [tuple(ids[bounds[i]:bounds[i + 1]]) for i in range(len(bounds) - 1)], int(cols.prefix_block_tokens)


def prompt_columns(trace: Trace, names: list[str], code: dict[str, int], task_of: list[str],
                   resources: list[str], prompt_tokens, max_tokens, arrived_at) -> PromptColumns:
    """The :class:`PromptColumns` of a run of ``trace`` (tasks coded by ``code``)."""
    cols = trace.columns
    return PromptColumns(
        call_ids=cols.call_ids, call_of=cols.call_of, prompt_index=cols.prompt_index, task_names=names,
        task_of=np.array([code[t] for t in task_of], dtype=np.int64), resources=resources,
        prompt_tokens=np.asarray(prompt_tokens, dtype=np.int64), max_tokens=np.asarray(max_tokens, dtype=np.int64),
        arrived_at=np.asarray(arrived_at, dtype=float),
    )


def simulate(trace: Trace, scenario: Scenario, profile: Profile, seed: int = 0,
             engine: str | None = None, initial_state: StartState | None = None) -> pd.DataFrame:
    """Run ``trace`` (already rate-scaled) through the system of ``scenario``.

    Returns the per-prompt event log (see :mod:`simulator.events`); ``log.attrs["engine"]``
    says which engine computed it. ``engine`` (default: the scenario's ``run.engine``):
    ``reference`` runs the simpy model above; ``fast`` the compiled kernel
    (:mod:`simulator.model.fast`), or a :class:`ScenarioError` naming the setting it does not
    support; ``auto`` the kernel wherever it supports the scenario, unless the run is small
    enough that loading the kernel would cost more than the run (:data:`SMALL_RUN_PROMPTS`).
    Both give the same log.

    ``initial_state`` (:class:`~simulator.model.start.StartState`): the run starts from a
    snapshot's state, its prompts ahead of the trace's and marked ``from_state`` in the log;
    the reference engine only (a :class:`ScenarioError` for ``engine = "fast"``).
    """
    if initial_state is not None:
        if (engine or scenario.engine) == "fast":
            raise ScenarioError(None, "run", "engine", "the fast engine does not start from a snapshot; use "
                                "engine = \"auto\" or \"reference\"")
        _engine_choice(trace, scenario, profile, "reference")
        log = System(trace, scenario, profile, seed, initial_state).run()
        log.attrs["engine"] = "reference (a start from a snapshot)"
        return log
    reason = _engine_choice(trace, scenario, profile, engine)
    if reason is None:
        log = simulate_fast(trace, scenario, profile, seed)
        log.attrs["engine"] = "fast"
    else:
        log = System(trace, scenario, profile, seed).run()
        log.attrs["engine"] = reason
    return log


def simulate_columns(trace: Trace, scenario: Scenario, profile: Profile, seed: int = 0,
                     engine: str | None = None) -> LogColumns:
    """:func:`simulate`'s event log as numpy columns (:class:`simulator.events.LogColumns`,
    ``attrs["engine"]`` as there): where the compiled kernel runs the scenario, straight
    from its output, with no frame made (a sweep summarises each run and never needs the
    frame); on the reference engine, its columns (a frame made only for a log with more
    columns: :meth:`System.run_columns`)."""
    reason = _engine_choice(trace, scenario, profile, engine)
    if reason is None:
        return replace(simulate_fast_columns(trace, scenario, profile, seed), attrs={"engine": "fast"})
    columns = System(trace, scenario, profile, seed).run_columns()
    return replace(columns, attrs={**columns.attrs, "engine": reason})


def _engine_choice(trace: Trace, scenario: Scenario, profile: Profile, engine: str | None) -> str | None:
    """``None`` where the compiled kernel runs the run, else the reference engine's
    ``attrs["engine"]`` (``reference``, or ``reference (the setting the kernel lacks)``);
    a :class:`ScenarioError` for an unknown topology, or for ``fast`` where it cannot."""
    for task in trace.tasks:
        cfg = scenario.for_task(task)
        if cfg.topology not in TOPOLOGIES:
            raise ScenarioError(scenario.source, f"tasks.{task}", "topology", f"unknown topology '{cfg.topology}'")
    check_pool_settings(scenario)
    engine = engine or scenario.engine
    reason = None if engine == "reference" else unsupported(trace, scenario, profile)
    if engine == "fast" and reason is not None:
        raise ScenarioError(None, "run", "engine",
                            f"the fast engine does not model {reason}; use engine = \"auto\" or \"reference\"")
    if engine == "auto" and reason is None:
        global _small_run_prompts
        work = reference_work(trace.n_prompts, scenario.gpus)
        if auto_takes_kernel(work, _small_run_prompts, kernel_loaded()):
            return None
        _small_run_prompts += work
        return SMALL_RUN
    if engine != "reference" and reason is None:
        return None
    return "reference" if reason is None else f"reference ({reason})"


#: Prompts a process replays on the reference engine before ``auto`` loads the compiled
#: kernel through numba, where the kernel's extension is unusable (:mod:`simulator.model.compiled`;
#: with it, ``auto`` takes the kernel at once). Loading it (numba and its type registries, then
#: the cached machine code) costs about 1.1 CPU-seconds in a fresh process (``benchmarks/first_run.py``), the time the
#: reference engine takes for 25,000-45,000 prompts (``benchmarks/engine_speed.py``'s
#: library table); both engines give the same event log, so the choice changes the speed
#: alone. Counting the prompts already run keeps a process of many small runs (a sweep, a
#: calibration) from paying more than this before the kernel takes over: at most about
#: twice the better choice made in hindsight (the ski-rental rule).
SMALL_RUN_PROMPTS = 20_000
#: ``attrs["engine"]`` of a run ``auto`` gave the reference engine for its size.
SMALL_RUN = "reference (a small run: loading the compiled kernel would cost more)"
_small_run_prompts = 0


#: GPUs whose per-dispatch scans (a least-loaded rule reads every place's load) double what
#: a prompt costs the reference engine, and GPUs that cost it one prompt's time to build and
#: report (measured with ``simctl replay example --set run.gpus=99999``: about 15 ms a
#: dispatch over 99,999 GPUs, 10 µs a GPU besides, against 25-45 µs a prompt).
GPUS_PER_PROMPT_COST, GPUS_PER_PROMPT = 200, 3


def reference_work(prompts: int, gpus: int) -> int:
    """A run's cost to the reference engine in prompts' worth (what :data:`SMALL_RUN_PROMPTS`
    counts): its prompts, each dearer by the GPUs a dispatch scans, and its GPUs."""
    return int(prompts * (1 + gpus / GPUS_PER_PROMPT_COST) + gpus / GPUS_PER_PROMPT)


def auto_takes_kernel(prompts: int, small_run_prompts: int, loaded: bool) -> bool:
    """Whether ``auto`` runs a run of ``prompts`` on the compiled kernel (where it models
    the scenario), ``small_run_prompts`` having run on the reference engine in this process
    already: when the kernel is loaded, or when this run would take the reference
    engine's total past :data:`SMALL_RUN_PROMPTS`."""
    return loaded or small_run_prompts + prompts > SMALL_RUN_PROMPTS


def kernel_loaded() -> bool:
    """Whether a run on the compiled kernel costs this process no more than the run: the
    extension is usable (no numba to load), or numba's kernel is loaded already."""
    from simulator.model.compiled import ready

    return ready()


def expect_prompts(prompts: int) -> None:
    """Say that this process (and those it forks) is about to run ``prompts`` in all, over
    many runs (a sweep's grid): where they are more than :data:`SMALL_RUN_PROMPTS`, ``auto``
    takes the kernel from the first run on instead of renting the reference engine first."""
    global _small_run_prompts
    if prompts > SMALL_RUN_PROMPTS:
        _small_run_prompts = max(_small_run_prompts, SMALL_RUN_PROMPTS)
