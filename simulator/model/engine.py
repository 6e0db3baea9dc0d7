"""Build the modeled serving system for a scenario, run it, return the per-prompt log.

Flow of one run: the client releases each call at its arrival instant (open loop); the
router splits the call into per-task groups (in the order the tasks first appear in the
call); each group goes to its task's topology (queues, workers); batches run on GPUs or
CPU pools; every prompt's instants are recorded on its batch. A call completes when its
last prompt completes (derived later from the log, see :mod:`simulator.metrics`).

The run always continues until every prompt is done (no censoring at a horizon); a
deadline is applied by the metrics.

Randomness: one ``SeedSequence`` per run, spawned into named streams — ``dispatch`` and
one ``service`` stream per task (keyed by the task's name), so changing one task's setup
does not reshuffle another task's service times.
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Callable

import numpy as np
import pandas as pd

from simulator.errors import ScenarioError
from simulator.model.dispatch import DISPATCH_RULES, DispatchRule
from simulator.model.kernel import ARRIVAL, SimEnvironment
from simulator.model.policies import POLICIES, BatchingPolicy
from simulator.model.resources import GPU_SHARING, Batch, Device, ServerPool
from simulator.model.topologies import TOPOLOGIES, Topology
from simulator.profile import Profile
from simulator.profile.kinds import BatchShape
from simulator.scenario import Scenario, TaskConfig
from simulator.trace.model import Trace


def _task_key(task: str) -> int:
    """A stable integer for a task name (Python's ``hash`` is salted per process)."""
    return int.from_bytes(hashlib.sha256(task.encode()).digest()[:4], "little")


class System:
    """The state of one run: clock, devices, per-prompt columns and the batch table."""

    def __init__(self, trace: Trace, scenario: Scenario, profile: Profile, seed: int) -> None:
        self.trace = trace
        self.scenario = scenario
        self.profile = profile
        self.seed = seed
        self.env = SimEnvironment()
        root = np.random.SeedSequence(seed)
        self.dispatch_rng = np.random.default_rng(root.spawn(1)[0])
        self._service_rngs: dict[str, np.random.Generator] = {}
        self._services: dict[str, object] = {}
        self._worker_ids = itertools.count()
        self._batch_ids = itertools.count()
        make_gpu = GPU_SHARING.get(scenario.gpu_sharing)
        self.gpus: list[Device] = [make_gpu(self.env, g) for g in range(scenario.gpus)]
        self._cpu_pools: dict[str, Device] = {}
        self.batches: list[Batch] = []

        # Per-prompt columns, indexed by the prompt's position in trace order.
        self.arrived_at: list[float] = []
        self.call_of: list[int] = []
        self.task_of: list[str] = []
        self.prompt_tokens: list[int] = []
        self.max_tokens: list[int] = []
        self.batch_of: list[int] = []
        self.configs: dict[str, TaskConfig] = {}
        self.groups: list[list[tuple[Topology, list[int]]]] = []
        self._build(trace)

    # -- construction -----------------------------------------------------------------
    def _build(self, trace: Trace) -> None:
        fronts: dict[str, Topology] = {}
        # Per task: its front end, default prompt tokens, default max tokens and cap.
        info: dict[str, tuple[Topology, int, int, int | None]] = {}
        arrived_at, call_of, task_of = self.arrived_at, self.call_of, self.task_of
        ptoks, mtoks = self.prompt_tokens, self.max_tokens
        index = 0
        for ci, call in enumerate(trace.calls):
            by_task: dict[str, list[int]] = {}
            for prompt in call.prompts:
                task = prompt.task
                task_info = info.get(task)
                if task_info is None:
                    self.configs[task] = cfg = self.scenario.for_task(task)
                    tp = self.profile.task(task)  # fails early on a task the profile lacks
                    task_info = info[task] = (self._front(fronts, task), tp.prompt_tokens,
                                              tp.max_tokens, cfg.max_tokens)
                max_tokens = prompt.max_tokens or task_info[2]
                if task_info[3] is not None and max_tokens > task_info[3]:
                    max_tokens = task_info[3]
                ptoks.append(task_info[1] if prompt.prompt_tokens is None else prompt.prompt_tokens)
                mtoks.append(max_tokens)
                arrived_at.append(call.t)
                call_of.append(ci)
                task_of.append(task)
                group = by_task.get(task)
                if group is None:
                    by_task[task] = [index]
                else:
                    group.append(index)
                index += 1
            self.groups.append([(info[t][0], ids) for t, ids in by_task.items()])
        self.batch_of = [-1] * index

    def _front(self, fronts: dict[str, Topology], task: str) -> Topology:
        front = fronts.get(task)
        if front is None:
            cfg = self.configs[task]
            front = fronts[task] = TOPOLOGIES.get(cfg.topology)(self, task, cfg)
        return front

    # -- services for topologies --------------------------------------------------------
    def resource_of(self, task: str) -> str:
        cfg = self.configs[task]
        return cfg.resource or self.profile.tasks[task].resource

    def cpu_servers(self, task: str) -> int | None:
        return self.configs[task].cpu_workers

    def devices_for(self, task: str, config: TaskConfig) -> list[Device]:
        """The GPUs, or the task's own CPU pool, that serve ``task``."""
        if self.resource_of(task) == "gpu":
            return self.gpus
        pool = self._cpu_pools.get(task)
        if pool is None:
            pool = self._cpu_pools[task] = ServerPool(self.env, -1, config.cpu_workers)
        return [pool]

    def policy_for(self, config: TaskConfig) -> BatchingPolicy:
        return POLICIES.get(config.policy)(config.flush, config.max_batch)

    def dispatch_rule(self, config: TaskConfig) -> DispatchRule:
        return DISPATCH_RULES.get(config.dispatch)()

    def device_picker(self, devices: list[Device], config: TaskConfig) -> Callable[[], Device]:
        """A function choosing a device per batch by ``config.dispatch`` (by outstanding prompts)."""
        if len(devices) == 1:
            only = devices[0]
            return lambda: only
        rule, rng = self.dispatch_rule(config), self.dispatch_rng
        return lambda: devices[rule.choose([d.outstanding for d in devices], rng)]

    def new_worker_id(self) -> int:
        return next(self._worker_ids)

    def service_rng(self, task: str) -> np.random.Generator:
        rng = self._service_rngs.get(task)
        if rng is None:
            rng = self._service_rngs[task] = np.random.default_rng([self.seed, 1, _task_key(task)])
        return rng

    def service_of(self, task: str):
        """The task's service model, with the scenario's speculative-decoding overrides applied."""
        service = self._services.get(task)
        if service is None:
            service = self.profile.tasks[task].service
            cfg = self.scenario.for_task(task)
            overrides = {k: getattr(cfg, k) for k in ("acceptance", "lookahead", "discipline")
                         if getattr(cfg, k) is not None}
            if overrides and not hasattr(service, "with_overrides"):
                # Defaults (CLI flags, [defaults]) apply where they can; a task's own setting
                # that cannot apply is a mistake worth stopping for.
                own = [k for k in overrides if k in self.scenario.tasks.get(task, {})]
                if own:
                    raise ScenarioError(self.scenario.source, f"tasks.{task}", own[0],
                                        f"applies to spec_decode profiles only; task '{task}' has a "
                                        f"'{service.kind}' service model")
                overrides = {}
            if overrides:
                service = service.with_overrides(**overrides)
            self._services[task] = service
        return service

    def form_batch(self, task: str, queue: str, ids: list[int], worker: int) -> Batch:
        """Make a batch of ``ids`` now and draw its service time."""
        if len(ids) == 1:
            i = ids[0]
            shape = BatchShape(1, self.prompt_tokens[i], self.max_tokens[i])
        else:
            rows = tuple(map(self.max_tokens.__getitem__, ids))
            shape = BatchShape(len(ids), max(map(self.prompt_tokens.__getitem__, ids)), max(rows), rows)
        work = self.service_of(task).sample(shape, self.service_rng(task))
        batch = Batch(next(self._batch_ids), task, queue, ids, worker, self.env._now, work)
        self.batches.append(batch)
        batch_of = self.batch_of
        for i in ids:
            batch_of[i] = batch.id
        return batch

    # -- running ------------------------------------------------------------------------
    def run(self) -> pd.DataFrame:
        """Run to completion and return the per-prompt event log."""
        calls = self.trace.calls
        groups = self.groups
        env = self.env

        def arrive(event) -> None:  # one event per call, each scheduling the next
            ci = event._value
            for front, ids in groups[ci]:
                front.accept(ids)
            if ci + 1 < len(calls):
                env.call_at(calls[ci + 1].t, ARRIVAL, arrive, ci + 1)

        if calls:
            env.call_at(calls[0].t, ARRIVAL, arrive, 0)
        env.run()
        return self._event_log()

    def _event_log(self) -> pd.DataFrame:
        from simulator.events import EVENT_COLUMNS

        batches = self.batches
        bid = np.asarray(self.batch_of, dtype=np.int64)
        if len(bid) and (bid < 0).any():
            raise RuntimeError("internal error: a prompt was never batched")
        b_formed = np.array([b.formed_at for b in batches], dtype=float)
        b_started = np.array([b.started_at for b in batches], dtype=float)
        b_done = np.array([b.done_at for b in batches], dtype=float)
        b_device = np.array([b.device for b in batches], dtype=np.int64)
        b_worker = np.array([b.worker for b in batches], dtype=np.int64)
        b_size = np.array([len(b.prompts) for b in batches], dtype=np.int64)
        b_queue = np.array([b.queue for b in batches], dtype=object)
        calls = self.trace.calls
        call_of = np.asarray(self.call_of, dtype=np.int64)
        call_ids = np.array([c.id for c in calls], dtype=object)
        prompt_index = np.concatenate([np.arange(len(c.prompts)) for c in calls]) if calls else np.zeros(0, np.int64)
        resource = {t: self.resource_of(t) for t in self.configs}
        task = np.asarray(self.task_of, dtype=object)
        gpu = b_device[bid] if len(bid) else np.zeros(0, np.int64)
        log = pd.DataFrame({
            "call_id": call_ids[call_of] if len(call_of) else call_ids[:0],
            "call_index": call_of,
            "prompt_index": prompt_index.astype(np.int64),
            "task": task,
            "resource": np.array([resource[t] for t in self.task_of], dtype=object),
            "prompt_tokens": np.asarray(self.prompt_tokens, dtype=np.int64),
            "max_tokens": np.asarray(self.max_tokens, dtype=np.int64),
            "queue": b_queue[bid] if len(bid) else b_queue[:0],
            "arrived_at": np.asarray(self.arrived_at, dtype=float),
            "batched_at": b_formed[bid] if len(bid) else b_formed[:0],
            "started_at": b_started[bid] if len(bid) else b_started[:0],
            "done_at": b_done[bid] if len(bid) else b_done[:0],
            "gpu": pd.arrays.IntegerArray(gpu, mask=gpu < 0),
            "worker": b_worker[bid] if len(bid) else b_worker[:0],
            "batch_id": bid,
            "batch_size": b_size[bid] if len(bid) else b_size[:0],
        })
        for col in ("task", "resource", "queue", "call_id"):
            log[col] = log[col].astype(str)
        return log[EVENT_COLUMNS]


def simulate(trace: Trace, scenario: Scenario, profile: Profile, seed: int = 0) -> pd.DataFrame:
    """Run ``trace`` (already rate-scaled) through the system of ``scenario``.

    Returns the per-prompt event log (see :mod:`simulator.events`).
    """
    for task in trace.tasks:
        cfg = scenario.for_task(task)
        if cfg.topology not in TOPOLOGIES:
            raise ScenarioError(scenario.source, f"tasks.{task}", "topology", f"unknown topology '{cfg.topology}'")
    return System(trace, scenario, profile, seed).run()
