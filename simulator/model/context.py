"""The run context: what the parts of one reference-engine run share, and nothing else.

Topologies, queues and continuous engines receive a :class:`RunContext` (never the builder,
:mod:`simulator.model.engine`). It holds:

* the clock (``env``) and the per-prompt columns (:class:`~simulator.model.prompts.PromptTable`);
* the run's ids (workers, batches) and random streams (``dispatch_rng``, ``service_rng``);
* where a task runs: its devices, batching policy and dispatch rule (named dispatch groups
  share one rule between tasks, :class:`~simulator.model.dispatch.DispatchGroups`);
* the service draw entry point (:meth:`form_batch`, :class:`~simulator.model.batching.BatchFormer`);
* the completion callbacks: :meth:`batch_done`, :meth:`turn_away` and
  :meth:`prompts_finished`, which tells the router (``on_finished``) that prompts left;
* the end of input (``input_closed``, and the queues told of it).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from simulator.errors import ScenarioError
from simulator.model.batching import BatchFormer
from simulator.model.dispatch import DISPATCH_RULES, PREFIX_RULES, DispatchGroups, DispatchRule
from simulator.model.policies import POLICIES, BatchingPolicy
from simulator.model.prompts import PromptTable
from simulator.model.resources import GPU_SHARING, Batch, Device, HostLock, RetimedGpu, ServerPool
from simulator.profile import Profile, TaskProfile
from simulator.profile.kinds import ServiceModel
from simulator.scenario import Scenario, TaskConfig

if TYPE_CHECKING:
    from simulator.model.kernel import SimEnvironment


class RunContext(PromptTable):
    """The shared state of one run (module docstring); the per-prompt columns are its own."""

    def __init__(self, scenario: Scenario, profile: Profile,
                 service_rng: Callable[[str], np.random.Generator],
                 dispatch_rng: np.random.Generator, parent: RunContext | None = None, first_gpu: int = 0) -> None:
        super().__init__()
        # A replica of a pool (simulator.model.replicas) is a context of its own (GPUs,
        # queues, dispatch) sharing its parent's clock, prompt columns, ids and batch list.
        if parent is None:
            from simulator.model.kernel import SimEnvironment  # (simpy: the reference engine's alone)

            self.env: SimEnvironment = SimEnvironment()
        else:
            self.env = parent.env
        self.source = scenario.source  # the scenario file, for errors
        self.dispatch_rng = dispatch_rng
        self.service_rng = service_rng
        self._profile = profile
        self._worker_ids: itertools.count[int] = itertools.count() if parent is None else parent._worker_ids
        self._batch_ids: itertools.count[int] = itertools.count() if parent is None else parent._batch_ids
        gpu_ids = range(first_gpu, first_gpu + scenario.gpus)
        if scenario.host_lock:
            host = HostLock()
            exclusive = scenario.gpu_sharing == "exclusive"
            self.gpus: list[Device] = [RetimedGpu(self.env, g, host, exclusive) for g in gpu_ids]
        else:
            make_gpu = GPU_SHARING.get(scenario.gpu_sharing)
            self.gpus = [make_gpu(self.env, g) for g in gpu_ids]
        self._cpu_pools: dict[str, Device] = {}
        rotation = frozenset(scenario.shared_rotation)  # the one group of the older setting

        def group_of(task: str) -> str | None:
            own = scenario.for_task(task).dispatch_group
            return own if own is not None else ("shared_rotation" if task in rotation else None)

        self.dispatch_groups = DispatchGroups(group_of)
        #: each task's configuration, in the order the tasks first appear
        self.configs: dict[str, TaskConfig] = {} if parent is None else parent.configs
        self.batches: list[Batch] = [] if parent is None else parent.batches
        self.queues: list = []  # every micro-batch queue, told when input ends
        self.input_closed = False
        #: told of every prompt that leaves the system (served or turned away)
        self.on_finished: Callable[[list[int]], None] = lambda ids: None
        if parent is not None:
            vars(self).update({name: getattr(parent, name) for name in vars(PromptTable())})
        self.former = BatchFormer(scenario, profile.tasks, self.configs, self, self.batches, service_rng,
                                  self.new_batch_id, lambda: self.env._now)

    # -- where a task runs ------------------------------------------------------------
    def task_profile(self, task: str) -> TaskProfile:
        return self._profile.tasks[task]

    def resource_of(self, task: str) -> str:
        return self.configs[task].resource or self._profile.tasks[task].resource

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

    def dispatch_rule(self, config: TaskConfig, task: str | None = None) -> DispatchRule:
        """A new rule of ``config.dispatch``, except for a task of a dispatch group: the one
        rule its group shares."""
        if config.dispatch in PREFIX_RULES and not (config.topology == "continuous" and config.prefix_caching):
            raise ScenarioError(self.source, f"tasks.{task}" if task is not None else "defaults", "dispatch",
                                f"{config.dispatch!r} places prompts by the prefixes an engine caches: it needs "
                                f"topology = \"continuous\" and prefix_caching = true")
        shared = self.dispatch_groups.rule_for(task, config.dispatch) if task is not None else None
        return shared if shared is not None else DISPATCH_RULES.get(config.dispatch)()

    def device_picker(self, devices: list[Device], config: TaskConfig, task: str | None = None) -> Callable[[], Device]:
        """A function choosing a device per batch by ``config.dispatch`` (by outstanding
        prompts or tokens, as the rule counts)."""
        if len(devices) == 1:
            only = devices[0]
            return lambda: only  # (a task of a dispatch group still advances it per call group)
        rule, rng = self.dispatch_rule(config, task), self.dispatch_rng
        return lambda: devices[rule.choose(rule.loads(devices), rng)]

    def new_worker_id(self) -> int:
        return next(self._worker_ids)

    def new_batch_id(self) -> int:
        return next(self._batch_ids)

    # -- service ----------------------------------------------------------------------
    def service_of(self, task: str) -> ServiceModel:
        """The task's service model, with the scenario's speculative-decoding overrides applied."""
        return self.former.service_of(task)

    def form_batch(self, task: str, queue: str, ids: list[int], worker: int,
                   device: Device | None = None) -> Batch:
        """Make a batch of ``ids`` now and draw its service time (:class:`BatchFormer`)."""
        return self.former.form(task, queue, ids, worker, device)

    # -- prompts finishing --------------------------------------------------------------
    def batch_done(self, batch: Batch) -> None:
        """A static batch finished: its prompts are done, their first token came after
        ``first_token_work`` of its ``work`` (stretched as the batch was, if the GPU was shared)."""
        start, end = batch.started_at, batch.done_at
        stretch = (end - start) / batch.work if batch.work > 0 else 1.0
        first = start + batch.first_token_work * stretch
        done_at, first_at = self.done_at, self.first_token_at
        for i in batch.prompts:
            done_at[i] = end
            first_at[i] = first
        self.on_finished(batch.prompts)

    def turn_away(self, ids: list[int], status: str) -> None:
        """Prompts that will never be served (``rejected`` at a full queue, ``dropped`` at
        their queue timeout)."""
        for i in ids:
            self.status[i] = status
        self.on_finished(ids)

    def prompts_finished(self, ids: list[int]) -> None:
        """Prompts left the system now (a continuous engine's finished rows)."""
        self.on_finished(ids)
