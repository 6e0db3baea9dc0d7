"""Build the modeled serving system for a scenario, run it, return the per-prompt log.

Flow of one run: the client releases each call at its arrival instant (open loop), or keeps
N calls outstanding, sending the trace's next call a think time after one ends (closed
loop); the router splits the call into per-task groups (in the order the tasks first appear in the
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

import itertools
from collections import deque
from collections.abc import Callable

import numpy as np
import pandas as pd

from simulator.errors import ScenarioError
from simulator.events import SERVED
from simulator.model.dispatch import DISPATCH_RULES, DispatchRule
from simulator.model.fast import simulate_fast, task_key, unsupported
from simulator.model.kernel import ARRIVAL, SimEnvironment
from simulator.model.log import STATUS_CODE, Outcome, PromptColumns, build_event_log
from simulator.model.policies import POLICIES, BatchingPolicy
from simulator.model.resources import GPU_SHARING, Batch, Device, HostLock, RetimedGpu, ServerPool
from simulator.model.topologies import TOPOLOGIES, Topology
from simulator.profile import Profile
from simulator.profile.iteration import first_token_seconds
from simulator.profile.kinds import BatchShape
from simulator.profile.kinds.spec_decode import SpecDecodeService
from simulator.scenario import Scenario, TaskConfig
from simulator.settings import service_overrides
from simulator.trace.model import Trace


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
        if scenario.host_lock:
            host = HostLock()
            exclusive = scenario.gpu_sharing == "exclusive"
            self.gpus: list[Device] = [RetimedGpu(self.env, g, host, exclusive) for g in range(scenario.gpus)]
        else:
            make_gpu = GPU_SHARING.get(scenario.gpu_sharing)
            self.gpus = [make_gpu(self.env, g) for g in range(scenario.gpus)]
        self._cpu_pools: dict[str, Device] = {}
        # One round-robin counter shared by the tasks of scenario.shared_rotation (a server's
        # pair iterator that every request group advances).
        self.shared_rotation = DISPATCH_RULES.get("round-robin")()
        self._shared_tasks = frozenset(scenario.shared_rotation)
        self._rotation_takers: set[str] = set()  # shared tasks whose dispatch draws from it
        self.batches: list[Batch] = []
        self._acceptance: dict[tuple[str, int], deque] = {}  # per (task, GPU): recent row acceptance rates
        self.queues: list = []  # every micro-batch queue, told when input ends
        self.input_closed = False

        # Per-prompt columns, indexed by the prompt's position in trace order.
        self.arrived_at: list[float] = []
        self.call_of: list[int] = []
        self.task_of: list[str] = []
        self.prompt_tokens: list[int] = []
        self.max_tokens: list[int] = []
        self.batch_of: list[int] = []
        # Filled as prompts finish (or are turned away); see _event_log for the columns.
        self.done_at: list[float] = []
        self.first_token_at: list[float] = []
        self.status: list[str] = []
        self.preemptions: list[int] = []
        self.configs: dict[str, TaskConfig] = {}
        self.groups: list[list[tuple[Topology, list[int]]]] = []
        self._build(trace)

    # -- construction -----------------------------------------------------------------
    def _build(self, trace: Trace) -> None:
        # Groups start in the scenario's group order (tasks it does not list keep their
        # order of first appearance, after the listed ones).
        self._group_rank = {t: r for r, t in enumerate(self.scenario.group_order)}
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
            order = self._group_rank
            tasks = sorted(by_task, key=lambda t: order.get(t, len(order))) if order else list(by_task)
            self.groups.append([(info[t][0], by_task[t]) for t in tasks])
        nan = float("nan")
        self.batch_of = [-1] * index
        self.done_at = [nan] * index
        self.first_token_at = [nan] * index
        self.status = ["served"] * index
        self.preemptions = [0] * index
        self._left_in_call = [len(c.prompts) for c in trace.calls]
        self._sent = [False] * len(trace.calls)
        # With at most N groups of a call at a time: the groups not started yet, and prompts
        # left per running group (keyed by the group's first prompt).
        self._waiting_groups: dict[int, deque] = {}
        self._left_in_group: dict[int, int] = {}
        self._group_head = [0] * index
        for call_groups in self.groups:
            for _, ids in call_groups:
                for i in ids:
                    self._group_head[i] = ids[0]
        self._on_call_done: Callable[[int], None] | None = None

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

    def dispatch_rule(self, config: TaskConfig, task: str | None = None) -> DispatchRule:
        """A new rule of ``config.dispatch``, except for a round-robin task of the run's
        ``shared_rotation``: the one rotation those tasks share."""
        if task in self._shared_tasks and config.dispatch == "round-robin":
            self._rotation_takers.add(task)
            return self.shared_rotation
        return DISPATCH_RULES.get(config.dispatch)()

    def device_picker(self, devices: list[Device], config: TaskConfig, task: str | None = None) -> Callable[[], Device]:
        """A function choosing a device per batch by ``config.dispatch`` (by outstanding
        prompts or tokens, as the rule counts)."""
        if len(devices) == 1:
            only = devices[0]
            return lambda: only  # (a task of a shared rotation still advances it per group)
        rule, rng = self.dispatch_rule(config, task), self.dispatch_rng
        return lambda: devices[rule.choose(rule.loads(devices), rng)]

    def new_worker_id(self) -> int:
        return next(self._worker_ids)

    def service_rng(self, task: str) -> np.random.Generator:
        rng = self._service_rngs.get(task)
        if rng is None:
            rng = self._service_rngs[task] = np.random.default_rng([self.seed, 1, task_key(task)])
        return rng

    def service_of(self, task: str):
        """The task's service model, with the scenario's speculative-decoding overrides applied."""
        service = self._services.get(task)
        if service is None:
            service = self.profile.tasks[task].service
            cfg = self.scenario.for_task(task)
            overrides = {k: getattr(cfg, k) for k in service_overrides()
                         if getattr(cfg, k) is not None}
            if overrides and isinstance(service, SpecDecodeService):
                service = service.with_overrides(**overrides)
            elif overrides:
                # Defaults (CLI flags, [defaults]) apply where they can; a task's own setting
                # that cannot apply is a mistake worth stopping for.
                own = [k for k in overrides if k in self.scenario.tasks.get(task, {})]
                if own:
                    raise ScenarioError(self.scenario.source, f"tasks.{task}", own[0],
                                        f"applies to spec_decode profiles only; task '{task}' has a "
                                        f"'{service.kind}' service model")
            self._services[task] = service
        return service

    def form_batch(self, task: str, queue: str, ids: list[int], worker: int,
                   device: Device | None = None) -> Batch:
        """Make a batch of ``ids`` now, for ``device`` where it is known, and draw its service time.

        A prompt takes ``rows_per_prompt`` rows (best-of-n); a lone prompt with
        ``single_prompt = "sequential"`` runs its rows as that many one-row generations, one
        after another. With ``adaptive_lookahead`` the lookahead comes from the device's
        acceptance history, which the batch's rows then extend."""
        cfg = self.configs[task]
        n = cfg.rows_per_prompt
        rows = tuple(m for m in map(self.max_tokens.__getitem__, ids) for _ in range(n))
        shape = BatchShape(len(rows), max(map(self.prompt_tokens.__getitem__, ids)), max(rows), rows)
        service = self.service_of(task)
        history = None
        if cfg.adaptive_lookahead and hasattr(service, "sample_detail"):
            from simulator.profile.kinds.spec_decode import adaptive_lookahead

            history = self._acceptance.setdefault((task, -1 if device is None else device.gpu_id), deque(maxlen=100))
            k = adaptive_lookahead(service.lookahead, sum(history) / len(history) if history else None)
            service = service.with_overrides(lookahead=k)
        rng = self.service_rng(task)
        if len(ids) == 1 and n > 1 and cfg.single_prompt == "sequential":
            one = BatchShape(1, shape.prompt_tokens, rows[0], rows[:1])
            draws = [self._draw(service, one, rng, history) for _ in range(n)]
            work = float(sum(draws))
            shape = one
        else:
            work = self._draw(service, shape, rng, history)
        batch = Batch(next(self._batch_ids), task, queue, ids, worker, self.env._now, work)
        batch.priority = self.configs[task].priority
        # an engine block computes the batch's own share of host time; else the task's figure
        computed = service.host_fraction(shape) if hasattr(service, "host_fraction") else None
        batch.host_fraction = self.profile.tasks[task].host_fraction if computed is None else computed
        batch.tokens = sum(self.prompt_tokens[i] + self.max_tokens[i] for i in ids)
        batch.first_token_work = first_token_seconds(self.profile.tasks[task], service, shape, work)
        self.batches.append(batch)
        batch_of = self.batch_of
        for i in ids:
            batch_of[i] = batch.id
        return batch

    @staticmethod
    def _draw(service, shape: BatchShape, rng: np.random.Generator, history: deque | None) -> float:
        if history is None:
            return service.sample(shape, rng)
        work, rates = service.sample_detail(shape, rng)
        history.extend(rates.tolist())
        return work

    def new_batch_id(self) -> int:
        return next(self._batch_ids)

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
        self.prompts_finished(batch.prompts)

    def turn_away(self, ids: list[int], status: str) -> None:
        """Prompts that will never be served (``rejected`` at a full queue, ``dropped`` at
        their queue timeout)."""
        for i in ids:
            self.status[i] = status
        self.prompts_finished(ids)

    def prompts_finished(self, ids: list[int]) -> None:
        """Prompts left the system now: a call's next task group may start (at most N at a
        time); a closed-loop client learns when a call is over."""
        if self._waiting_groups:
            for i in ids:
                head = self._group_head[i]
                left = self._left_in_group.get(head)
                if left is None:
                    continue
                if left > 1:
                    self._left_in_group[head] = left - 1
                    continue
                del self._left_in_group[head]
                pending = self._waiting_groups.get(self.call_of[i])
                if pending:
                    self._start_group(*pending.popleft())
        if self._on_call_done is None:
            return
        left_in_call, call_of = self._left_in_call, self.call_of
        for i in ids:
            ci = call_of[i]
            left_in_call[ci] -= 1
            if left_in_call[ci] == 0:
                self._on_call_done(ci)

    # -- running ------------------------------------------------------------------------
    def run(self) -> pd.DataFrame:
        """Run to completion and return the per-prompt event log."""
        from simulator.scenario import parse_client

        calls = self.trace.calls
        groups = self.groups
        env = self.env
        closed = parse_client(self.scenario.client)

        cold_until = self.scenario.cold_start
        limit = self.scenario.max_concurrent_groups

        def send(ci: int) -> None:
            if env._now < cold_until:
                # Nothing serves before the cold start ends: the call is taken in then.
                env.call_at(cold_until, ARRIVAL, lambda event: send(event._value), ci)
                return
            self._sent[ci] = True
            call_groups = groups[ci]
            if limit is not None and len(call_groups) > limit:
                self._waiting_groups[ci] = deque(call_groups[limit:])
                call_groups = call_groups[:limit]
            for front, ids in call_groups:
                self._start_group(front, ids)
            if ci == len(calls) - 1:
                self.input_closed = True
                for queue in self.queues:
                    queue.poll()

        if closed is None:
            def arrive(event) -> None:  # one event per call, each scheduling the next
                ci = event._value
                send(ci)
                if ci + 1 < len(calls):
                    env.call_at(calls[ci + 1].t, ARRIVAL, arrive, ci + 1)

            if calls:
                env.call_at(calls[0].t, ARRIVAL, arrive, 0)
        else:
            # Calls go in trace order; a call's prompts arrive when it is sent.
            next_call = iter(range(len(calls)))
            start = calls[0].t if calls else 0.0
            arrived_at, first_prompt = self.arrived_at, np.cumsum([0] + [len(c.prompts) for c in calls])

            def issue(event) -> None:
                ci = event._value
                now = env._now
                for i in range(first_prompt[ci], first_prompt[ci + 1]):
                    arrived_at[i] = now
                send(ci)

            def call_done(ci: int) -> None:
                nxt = next(next_call, None)
                if nxt is not None:
                    env.call_at(env._now + closed.think, ARRIVAL, issue, nxt)

            self._on_call_done = call_done
            for _ in range(min(closed.calls, len(calls))):
                env.call_at(start, ARRIVAL, issue, next(next_call))
        env.run()
        self._check_stalled()
        return self._event_log()

    def _start_group(self, front: Topology, ids: list[int]) -> None:
        if self._waiting_groups:
            self._left_in_group[ids[0]] = len(ids)
        task = self.task_of[ids[0]]
        if task in self._shared_tasks and task not in self._rotation_takers:
            # A group that does not take a GPU from the rotation (a CPU task) still advances it.
            self.shared_rotation.choose(range(len(self.gpus)), self.dispatch_rng)
        front.accept(ids)

    def _check_stalled(self) -> None:
        """Nothing left to happen, yet prompts wait: only a batch that can never fill (static
        batching without a timeout, fed by a closed loop that waits for it) does this."""
        stuck = [i for i, b in enumerate(self.batch_of)
                 if b < 0 and self.status[i] in SERVED and self._sent[self.call_of[i]]]
        if stuck:
            task = self.task_of[stuck[0]]
            cfg = self.configs[task]
            raise ScenarioError(self.scenario.source, f"tasks.{task}", "flush",
                                f"the run stalled: {len(stuck)} prompt(s) wait for a batch of {cfg.max_batch} "
                                f"that can never fill ({cfg.policy} policy without a timeout, client "
                                f"{self.scenario.client}, {self._sent.count(False)} call(s) never sent); "
                                f"give it a timeout with flush > 0")

    def _event_log(self) -> pd.DataFrame:
        batches = self.batches
        names = list(self.configs)
        code = {t: i for i, t in enumerate(names)}
        queues = sorted({b.queue for b in batches})
        queue_code = {q: i for i, q in enumerate(queues)}
        outcome = Outcome(
            batch_of=np.asarray(self.batch_of, dtype=np.int64),
            done_at=np.asarray(self.done_at, dtype=float),
            first_token_at=np.asarray(self.first_token_at, dtype=float),
            status=np.array([STATUS_CODE[s] for s in self.status], dtype=np.int8),
            preemptions=np.asarray(self.preemptions, dtype=np.int64),
            batch_id=np.array([b.id for b in batches], dtype=np.int64),
            formed_at=np.array([b.formed_at for b in batches], dtype=float),
            started_at=np.array([b.started_at for b in batches], dtype=float),
            device=np.array([b.device for b in batches], dtype=np.int64),
            worker=np.array([b.worker for b in batches], dtype=np.int64),
            size=np.array([len(b.prompts) for b in batches], dtype=np.int64),
            queue=np.array([queue_code[b.queue] for b in batches], dtype=np.int64),
            queue_names=queues,
        )
        return build_event_log(prompt_columns(self.trace, names, code, self.task_of,
                                              [self.resource_of(t) for t in names],
                                              self.prompt_tokens, self.max_tokens, self.arrived_at), outcome)


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
             engine: str | None = None) -> pd.DataFrame:
    """Run ``trace`` (already rate-scaled) through the system of ``scenario``.

    Returns the per-prompt event log (see :mod:`simulator.events`); ``log.attrs["engine"]``
    says which engine computed it. ``engine`` (default: the scenario's ``run.engine``):
    ``reference`` runs the simpy model above; ``fast`` the compiled kernel
    (:mod:`simulator.model.fast`), or a :class:`ScenarioError` naming the setting it does not
    support; ``auto`` the kernel wherever it supports the scenario. Both give the same log.
    """
    for task in trace.tasks:
        cfg = scenario.for_task(task)
        if cfg.topology not in TOPOLOGIES:
            raise ScenarioError(scenario.source, f"tasks.{task}", "topology", f"unknown topology '{cfg.topology}'")
    engine = engine or scenario.engine
    reason = None if engine == "reference" else unsupported(trace, scenario, profile)
    if engine == "fast" and reason is not None:
        raise ScenarioError(None, "run", "engine",
                            f"the fast engine does not model {reason}; use engine = \"auto\" or \"reference\"")
    if engine != "reference" and reason is None:
        log = simulate_fast(trace, scenario, profile, seed)
        log.attrs["engine"] = "fast"
    else:
        log = System(trace, scenario, profile, seed).run()
        log.attrs["engine"] = "reference" if reason is None else f"reference ({reason})"
    return log
