"""The fast engine: a scenario lowered to integer-coded arrays and run by the compiled kernel
(:mod:`simulator.model.batch_kernel`), giving the reference engine's event log exactly.

What it runs: the ``shared``, ``split``, ``direct`` and ``continuous`` topologies (continuous
engines in :mod:`simulator.model.batch_kernel`'s own section: admission, token budget, row limit, KV
blocks and preemption, their iterations on the same devices as micro-batches); every
registered batching policy and dispatch rule; exclusive and processor-sharing GPUs; CPU
pools; queue limits by ``max_queue``; priorities; a cold start; every service kind of a
micro-batched task: ``distribution`` and ``table`` (their draws made in bulk, before the run,
from each task's own stream: the noise of each batch, or a continuous engine's uniforms that
round a fractional ``tokens_per_iteration``), ``iteration`` and ``spec_decode`` (every option
of theirs, and the scenario's ``acceptance``, ``lookahead`` and ``discipline``; priced by
:mod:`simulator.model.kernel_service`, drawing from each task's own stream as its batches
form); continuous engines of the ``distribution`` and ``table`` kinds. Everything else — the
host lock, closed-loop clients, queue timeouts, continuous engines of the ``iteration`` and
``spec_decode`` kinds, and the behaviours of :class:`~simulator.scenario.TaskConfig` marked
for real servers (``adaptive_lookahead`` among them) — runs on the reference engine;
:func:`unsupported` names the first setting that needs it (settings declare it:
``reference_only`` in :mod:`simulator.settings`), and a service kind the kernel lacks
(:data:`KERNEL_KINDS`, :data:`CONTINUOUS_KINDS`).

Policies and dispatch rules are coded in :data:`POLICY_CODES` and :data:`RULE_CODES`; a name
registered in the model but missing here makes :func:`unsupported` say so (and the contract
test fail), so a new rule can never run as another.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np

from simulator.events import LogColumns
from simulator.interrupts import sigint_deferred
from simulator.memo import Memo
from simulator.model.dispatch import DISPATCH_RULES
from simulator.model.log import Outcome, PromptColumns, build_event_log, event_columns
from simulator.model.policies import POLICIES
from simulator.model.streams import dispatch_stream, service_stream
from simulator.profile import Profile, noise
from simulator.profile.iteration import step_cost
from simulator.profile.kinds.distribution import DistributionService
from simulator.profile.kinds.spec_decode import SpecDecodeService
from simulator.profile.kinds.table import AXES as TABLE_AXIS_NAMES, TableService
from simulator.scenario import Scenario
from simulator.settings import RUN, TASK, service_overrides
from simulator.trace.model import PROMPT_INT, Trace, TraceColumns

if TYPE_CHECKING:
    import pandas as pd

#: Batching policies the kernel implements (its integer codes).
POLICY_CODES = {name: POLICIES.get(name).code for name in ("oldest", "pickup", "adaptive", "static")}
#: Dispatch rules the kernel implements: kernel rule (0 round robin, 1 least by load,
#: 2 random); the unit of load comes from the registered class.
RULE_CODES = {"round-robin": 0, "least-loaded": 1, "jsq-tokens": 1, "shortest-waiting": 1, "random": 2}
UNIT_CODES = {"prompts": 0, "tokens": 1, "waiting": 2}
#: Topologies the kernel implements (its front codes); the others run on the reference engine.
TOPOLOGY_CODES = {"shared": 0, "split": 1, "direct": 2, "continuous": 3}
#: Service kinds the kernel's continuous engines price iterations of (the others' iteration
#: costs run on the reference engine).
CONTINUOUS_KINDS = ("distribution", "table")
SHARING_CODES = {"exclusive": 0, "processor-sharing": 1}
#: Service kinds the kernel implements: distribution and table in its own ``_form``, the
#: others in simulator.model.kernel_service.
KERNEL_KINDS = ("distribution", "table", "iteration", "spec_decode")
#: The table kind's axes, coded in the order simulator.profile.kinds.table.AXES lists them.
TABLE_AXES = {axis: code for code, axis in enumerate(TABLE_AXIS_NAMES)}


def unsupported(trace: Trace, scenario: Scenario, profile: Profile) -> str | None:
    """Why the kernel cannot run this scenario (the setting, as the user names it), or
    ``None`` when it can."""
    for spec in RUN.values():
        if spec.reference_only and getattr(scenario, spec.name) != spec.default:
            return f"run.{spec.name}"
    if scenario.gpu_sharing not in SHARING_CODES:
        return f"run.gpu_sharing = {scenario.gpu_sharing!r}"
    for task in trace.tasks:
        cfg = scenario.for_task(task)
        where = f"tasks.{task}"
        if cfg.topology not in TOPOLOGY_CODES:
            return f"{where}.topology = {cfg.topology!r}"
        if cfg.topology not in ("direct", "continuous") and cfg.policy not in POLICY_CODES:
            return f"{where}.policy = {cfg.policy!r} (registered, but not in the compiled kernel)"
        if cfg.dispatch not in RULE_CODES:
            return f"{where}.dispatch = {cfg.dispatch!r} (registered, but not in the compiled kernel)"
        for spec in TASK.values():
            if spec.reference_only and getattr(cfg, spec.name) != spec.default:
                return f"{where}.{spec.name}"
        task_profile = profile.tasks.get(task)
        own = scenario.tasks.get(task, {})
        for key in service_overrides():
            # a spec_decode service takes them (service_of); on another kind the reference
            # engine reports a task's own one
            if own.get(key) is not None and not isinstance(getattr(task_profile, "service", None), SpecDecodeService):
                return f"{where}.{key}"
        if task_profile is None:
            return None  # the reference engine reports the missing task
        kind = task_profile.service.kind
        if cfg.topology == "continuous" and kind not in CONTINUOUS_KINDS:
            return f"{where}.topology = 'continuous' with the {kind} service model"
        if kind not in KERNEL_KINDS:
            return f"the {kind} service model of task {task}"
        resource = cfg.resource or task_profile.resource
        if cfg.topology == "split" and resource == "cpu" and cfg.cpu_workers is None:
            return f"{where}.cpu_workers"  # the reference engine reports what is missing
    return None


@dataclass
class _Lowered:
    """The arrays of one run, in the kernel's argument order."""

    args: tuple
    queue_names: list[str]
    gpu_of_device: np.ndarray
    out_of_draws: np.ndarray  # set by the kernel when a continuous task needs more draws
    columns: TraceColumns
    names: list[str]
    resources: list[str]
    prompt_tokens: np.ndarray  # (32-bit; kept for the next run of the trace: never written)
    max_tokens: np.ndarray

    def prompts(self) -> PromptColumns:
        """What the event log knows of every prompt, made after the run (the kernel's peak
        then holds none of it: the arrival instants, the 64-bit token counts, which are
        copies, never the arrays lowering keeps; the call instants themselves, read-only,
        where each call is one prompt)."""
        cols = self.columns
        if cols.one_prompt_a_call():
            # one prompt a call: its arrival is its call's instant, read through a read-only view
            # (no column a prompt long made)
            arrived_at = cols.call_t.view()
            arrived_at.flags.writeable = False
        else:
            arrived_at = cols.call_t[cols.call_of]
        # the token counts lowering keeps, 32-bit, through read-only views (a 64-bit copy of
        # each was 16 bytes a prompt of a large replay's peak; the frame widens them)
        prompt_tokens, max_tokens = self.prompt_tokens.view(), self.max_tokens.view()
        prompt_tokens.flags.writeable = max_tokens.flags.writeable = False
        return PromptColumns(call_ids=cols.call_ids, call_of=cols.call_of, prompt_index=cols.prompt_index,
                             task_names=self.names, task_of=cols.task_of, resources=self.resources,
                             prompt_tokens=prompt_tokens, max_tokens=max_tokens, arrived_at=arrived_at)


def _rule_slot(rules: list[tuple[int, int, int]], name: str) -> int:
    rules.append((RULE_CODES[name], 0, UNIT_CODES[DISPATCH_RULES.get(name).unit]))
    return len(rules) - 1


#: Uniforms drawn before the run for a continuous task with fractional tokens per iteration:
#: this many times its prompts' max tokens (a decoding row takes one per iteration, and makes
#: a token or more with it), plus :data:`DRAW_SLACK` (for rows preempted after their draw);
#: a run that needs more is run again with four times as many.
FIRST_DRAW_FACTOR = 1.0
DRAW_SLACK = 256


def lower(trace: Trace, scenario: Scenario, profile: Profile, seed: int,
          draw_factor: float = FIRST_DRAW_FACTOR) -> _Lowered:
    """The kernel's arrays for a run (the scenario must be :func:`supported <unsupported>`).

    A continuous task with fractional ``tokens_per_iteration`` gets ``draw_factor`` times its
    prompts' max tokens of uniforms, plus :data:`DRAW_SLACK`."""
    cols = trace.columns
    names = list(cols.task_names)
    configs = [scenario.for_task(t) for t in names]
    task_profiles = [profile.task(t) for t in names]  # fails early on a task the profile lacks
    n_tasks = len(names)
    task_of = cols.task_of
    ptok, mtok, counts = _token_counts(cols, task_profiles, configs)
    order, g_start, g_front, call_g0 = _groups(cols, scenario.group_order)

    # Devices: the GPUs, then a CPU pool per CPU task (built as the reference builds them).
    gpus = scenario.gpus
    sharing = SHARING_CODES[scenario.gpu_sharing]
    devices: list[tuple[int, int, int]] = [(sharing, 1, g) for g in range(gpus)]  # kind, servers, gpu id
    fronts: list[list[int]] = []
    queues: list[list[int]] = []
    workers: list[int] = []
    rules: list[tuple[int, int, int]] = []
    devlist: list[int] = []
    queue_names: list[str] = []
    engines: list[tuple[int, int, int]] = []  # continuous engines: task, device, name

    def device_list(ids: list[int]) -> tuple[int, int]:
        devlist.extend(ids)
        return len(devlist) - len(ids), len(devlist)

    def new_queue(task: int, name: str, cfg, worker_devices: list[int] | None, picker: tuple[int, int],
                  rule: int, unbound: int, share: tuple[int, int]) -> int:
        w0 = len(workers)
        workers.extend(worker_devices or [])
        queue_names.append(name)
        queues.append([POLICY_CODES[cfg.policy], cfg.max_batch, int(worker_devices is None), picker[0], picker[1],
                       rule, unbound, w0, len(workers), -1 if cfg.max_queue is None else cfg.max_queue,
                       int(cfg.sticky_gpu), task, len(queue_names) - 1, 0, 0, 0, 0, 0, 0, 0, share[0], share[1]])
        return len(queues) - 1

    for t, (task, cfg, tp) in enumerate(zip(names, configs, task_profiles, strict=True)):
        resource = cfg.resource or tp.resource
        if resource == "gpu":
            task_devices = list(range(gpus))
        else:
            devices.append((0, -1 if cfg.cpu_workers is None else cfg.cpu_workers, -1))
            task_devices = [len(devices) - 1]
        share = device_list(task_devices) if resource == "gpu" else (0, 0)
        if cfg.topology == "shared":
            n_workers = cfg.workers
            if resource == "cpu" and n_workers is None:
                n_workers = cfg.cpu_workers
            elif n_workers is None:
                n_workers = len(task_devices)
            if n_workers is None:
                bound = None
            elif n_workers >= len(task_devices):
                bound = [task_devices[i % len(task_devices)] for i in range(n_workers)]
            else:
                bound = [-1] * n_workers
            picker = device_list(task_devices)
            rule = _rule_slot(rules, cfg.dispatch)
            q = new_queue(t, task, cfg, bound, picker, rule, task_devices[0] if len(task_devices) == 1 else -1, share)
            fronts.append([0, q, q + 1, rule, 0, 0, 0, cfg.max_batch, 0, t])
        elif cfg.topology == "split":
            if resource == "gpu":
                per_queue = task_devices
            else:
                assert cfg.cpu_workers is not None  # unsupported() leaves a split CPU task without it to the reference
                per_queue = task_devices * cfg.cpu_workers
            share = device_list(per_queue) if resource == "gpu" else (0, 0)
            q0 = len(queues)
            for i, device in enumerate(per_queue):
                new_queue(t, f"{task}@{i}", cfg, [device], device_list([device]), -1, -1, share)
            rule = _rule_slot(rules, cfg.dispatch)
            fronts.append([1, q0, len(queues), rule, int(cfg.dispatch_per == "group"), 0, 0, cfg.max_batch, 0, t])
        elif cfg.topology == "continuous":  # an engine per device (batch_kernel's continuous engines)
            rule = _rule_slot(rules, cfg.dispatch)
            e0 = len(engines)
            for i, device in enumerate(task_devices):
                queue_names.append(f"{task}~{i}")
                engines.append((t, device, len(queue_names) - 1))
            fronts.append([3, e0, len(engines), rule, 0, 0, 0, cfg.max_batch, 0, t])
        else:  # direct
            dl0, dl1 = device_list(task_devices)
            rule = _rule_slot(rules, cfg.dispatch)
            queue_names.append(f"{task}/direct")
            fronts.append([2, -1, -1, rule, 0, dl0, dl1, cfg.max_batch, len(queue_names) - 1, t])

    # Service: per task its kind, mean per batch size (or grid) and pre-drawn noise.
    max_size = min(max([c.max_batch for c in configs] + [1]), max(len(task_of), 1))  # no batch outgrows the trace
    TK = np.zeros((n_tasks, 4), dtype=np.int64)            # dist, table?, dims, priority
    TMEAN = np.zeros((n_tasks, max_size + 1))
    TSCALE = np.zeros((n_tasks, 2))
    TPI = np.array([tp.tokens_per_iteration for tp in task_profiles], dtype=float)
    GRID = np.zeros((n_tasks, 3, 1 + max([_grid_size(tp.service) for tp in task_profiles] + [1])))
    GLEN = np.zeros((n_tasks, 3), dtype=np.int64)
    GAXIS = np.zeros((n_tasks, 3), dtype=np.int64)
    gvals: list[np.ndarray] = []
    draws: list[np.ndarray] = []
    SI, SF, SRNG = _lower_services(names, configs, task_profiles, seed)
    for t, (task, cfg, tp) in enumerate(zip(names, configs, task_profiles, strict=True)):
        service = tp.service
        if not isinstance(service, (DistributionService, TableService)):
            # iteration and spec_decode: priced by kernel_service from SI, SF and SRNG
            TK[t, 3] = cfg.priority
            gvals.append(np.zeros(1))
            draws.append(np.zeros(0))
            continue
        cv = service.cv
        dist = 0 if noise.is_noiseless(service.dist, cv) else noise.CODES[service.dist]
        if isinstance(service, TableService):
            TK[t, 1], TK[t, 2] = 1, len(service.axes)
            TMEAN[t, 0] = service.floor
            for a, (axis, grid) in enumerate(zip(service.axes, service.grid, strict=True)):
                GAXIS[t, a] = TABLE_AXES[axis]
                GLEN[t, a] = len(grid)
                GRID[t, a, :len(grid)] = grid
            gvals.append(np.ascontiguousarray(service.seconds, dtype=float).ravel())
        else:
            gvals.append(np.zeros(1))
            TMEAN[t, 1:max_size + 1] = _batch_means(service, max_size)
        TK[t, 0], TK[t, 3] = dist, cfg.priority
        TSCALE[t] = noise.parameters(service.dist, cv)
        if cfg.topology == "continuous":
            # the uniforms that round a fractional tokens_per_iteration (BatchAverageCost.tokens)
            frac = tp.tokens_per_iteration - math.floor(tp.tokens_per_iteration)
            n_draws = int(draw_factor * int(mtok[task_of == t].sum())) + DRAW_SLACK if frac else 0
            draws.append(service_stream(seed, task).random(n_draws))
        else:
            draws.append(_noise_draws(cols, seed, task, service.dist, cv, int(counts[t])))
    NOISE0 = np.concatenate([[0], np.cumsum([len(x) for x in draws])]).astype(np.int64)
    GVAL = np.zeros((n_tasks, max([len(v) for v in gvals] + [1])))
    for t, v in enumerate(gvals):
        GVAL[t, :len(v)] = v

    # Workers: the scenario's, plus at most one new worker per prompt of an unlimited queue.
    unlimited_prompts = sum(int(counts[q[11]]) for q in queues if q[2])
    worker_device = np.full(len(workers) + unlimited_prompts, -1, dtype=np.int64)
    worker_device[:len(workers)] = workers

    def int_table(rows: list, width: int) -> np.ndarray:
        return np.array(rows, dtype=np.int64).reshape(len(rows), width)

    QI = int_table(queues, 22)
    QF = np.zeros((len(queues), 4))
    QF[:, 0] = [configs[q[11]].flush for q in queues]
    n_dev = len(devices)
    DI = np.zeros((n_dev, 10), dtype=np.int64)
    DI[:, :3] = np.array(devices, dtype=np.int64).reshape(n_dev, 3)
    dispatch_rng = dispatch_stream(seed)
    engine_arrays = _engines(scenario, configs, task_profiles, names, engines, counts, ptok, mtok, task_of,
                             order)
    args = (
        cols.call_t, call_g0, g_start, g_front, order, cols.call_of, ptok, mtok, int_table(fronts, 10), QI, QF, worker_device,
        np.arange(len(worker_device), dtype=np.int64), DI, np.zeros((n_dev, 1)), np.array(devlist, dtype=np.int64),
        int_table(rules, 3), TK, TMEAN, TSCALE,
        np.concatenate(draws) if draws else np.zeros(0), NOISE0, TPI, GRID, GLEN, GVAL, GAXIS,
        float(scenario.cold_start), len(workers), dispatch_rng, SI, SF, SRNG, *engine_arrays,
    )
    resources = [c.resource or tp.resource for c, tp in zip(configs, task_profiles, strict=True)]
    return _Lowered(args, queue_names, DI[:, 2].copy(), engine_arrays[-1], cols, names, resources, ptok, mtok)


#: Traces of at most this many prompts have the arrays lowered from their prompt columns
#: alone kept for the next run of the same columns (:func:`_kept`); a larger replay's are
#: not held after it.
KEPT_PROMPTS = 1 << 16
#: What :func:`_kept` keeps: at most 64 MiB of arrays (those made and the trace's columns
#: they were made from), whatever the number of traces, seeds and tasks a process runs.
_KEPT = Memo(256, max_bytes=64 << 20)


def _kept(key: tuple, sources: tuple[np.ndarray, ...], make):
    """``make()``, kept for the next call with ``key`` on the same ``sources`` arrays (the
    trace's prompt columns): a sweep lowers thousands of runs of one trace, rate-scaled (new
    call times, the same prompt columns), and would otherwise redo the same arrays for each.
    What is kept is never written: the kernel reads these arrays only, and the event log
    takes copies of those it holds (:func:`lower`)."""
    if len(sources[0]) > KEPT_PROMPTS:
        return make()
    return _KEPT.get(sources, key, make)


def _token_counts(cols, task_profiles: list, configs: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per prompt its prompt and max tokens (the trace's, else the task's defaults; max tokens
    capped by the task's ``max_tokens``), and the prompts per task."""
    defaults = tuple((tp.prompt_tokens, tp.max_tokens) for tp in task_profiles)
    caps = tuple(c.max_tokens for c in configs)

    def make() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n_tasks, task_of = len(task_profiles), cols.task_of
        # 32-bit as the trace's columns (a profile's defaults and a cap are below 2**31): half
        # the memory a prompt of the kernel's inputs, which a large replay's peak holds
        default_prompt = np.array([p for p, _ in defaults], dtype=PROMPT_INT)
        default_max = np.array([m for _, m in defaults], dtype=PROMPT_INT)
        cap = np.array([c if c is not None else np.iinfo(PROMPT_INT).max for c in caps], dtype=PROMPT_INT)
        if n_tasks == 1:  # (one task: its values as they are, no per-prompt gather)
            default_prompt, default_max, cap = default_prompt[0], default_max[0], cap[0]
        else:
            default_prompt, default_max, cap = default_prompt[task_of], default_max[task_of], cap[task_of]
        ptok = np.where(cols.prompt_tokens < 0, default_prompt, cols.prompt_tokens) if n_tasks else cols.prompt_tokens
        mtok = np.where(cols.max_tokens <= 0, default_max, cols.max_tokens) if n_tasks else cols.max_tokens
        if n_tasks:
            mtok = np.minimum(mtok, cap)
        counts = np.bincount(task_of, minlength=n_tasks) if n_tasks > 1 else np.full(n_tasks, len(task_of), np.int64)
        return ptok, mtok, counts

    return _kept(("tokens", defaults, caps), (cols.task_of, cols.prompt_tokens, cols.max_tokens), make)


def _groups(cols, group_order: tuple[str, ...] | list[str]) -> tuple[np.ndarray, ...]:
    """Groups: per call, the prompts of one task, in the scenario's group order, else in the
    order the tasks first appear in the call; prompts in call order within a group
    (``group_prompts``' arrays)."""
    names = tuple(cols.task_names)
    rank_of = {t: r for r, t in enumerate(group_order)}
    rank = tuple(rank_of.get(t, len(rank_of)) for t in names)

    def make() -> tuple[np.ndarray, ...]:
        from simulator.model.compiled import group_prompts

        if cols.one_prompt_a_call():
            # each call is one group of its one prompt: prompts, groups and calls share their
            # numbers, and no pass is needed
            n = len(cols.call_of)
            numbers = np.arange(n + 1, dtype=np.int32)
            return numbers[:n], numbers, cols.task_of.astype(np.int32), numbers.copy()
        call_start = np.concatenate([[0], np.cumsum(np.bincount(cols.call_of, minlength=len(cols.call_t)))])
        return group_prompts(call_start.astype(np.int64), cols.task_of, np.array(rank, dtype=np.int64), len(names))

    return _kept(("groups", names, rank, len(cols.call_t)), (cols.task_of, cols.call_of), make)


def _noise_draws(cols, seed: int, task: str, dist: str, cv: float, n: int) -> np.ndarray:
    """The ``n`` standard variates of a task's batch noise, from its service stream."""
    return _kept(("noise", seed, task, dist, cv, n), (cols.task_of,),
                 lambda: noise.standard_draws(dist, cv, n, service_stream(seed, task)))


#: Mean service seconds by batch size, per service (see :func:`_batch_means`).
_BATCH_MEANS = Memo(64)


def _batch_means(service: DistributionService, sizes: int) -> np.ndarray:
    """A distribution service's mean seconds of a batch of 1..``sizes`` prompts, kept per
    (frozen) service for the next run of it."""
    return _BATCH_MEANS.get((service,), (sizes,), lambda: np.array(
        [service.batch_mean(size) for size in range(1, sizes + 1)], dtype=float))


#: Iteration seconds by rows, per task profile (see :func:`_iteration_seconds`).
_ITERATION_SECONDS = Memo(64)


def _iteration_seconds(tp, rows: int) -> np.ndarray:
    """Seconds of an iteration of 0..``rows`` rows of a task (its profile's service: unsupported()
    admits no overrides), as the reference engine's step cost gives them; the batch-average
    kinds' iteration costs draw nothing. Kept per (frozen) service for the next run of it."""
    service = tp.service

    def make() -> np.ndarray:
        cost = step_cost(tp, service)
        return np.array([0.0] + [cost.step(r, [], 0, cast(np.random.Generator, None)) for r in range(1, rows + 1)])

    return _ITERATION_SECONDS.get((service,), (tp.prompt_tokens, tp.max_tokens, tp.tokens_per_iteration, rows), make)


def _engines(scenario: Scenario, configs: list, task_profiles: list, names: list[str],
             engines: list[tuple[int, int, int]], counts: np.ndarray, ptok: np.ndarray, mtok: np.ndarray,
             task_of: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, ...]:
    """The continuous engines' arrays (see batch_kernel's continuous engines): EI, CTI, CTF,
    CSTEP, R_PID (their rows' room) and CS."""
    from simulator.errors import ScenarioError
    from simulator.model.kernel_layout import EI_R0, EI_RECORD, EI_TASK, EI_WIDTH

    n_tasks = len(names)
    cap = np.zeros(n_tasks, dtype=np.int64)  # rows an engine of the task can hold
    total = np.full(n_tasks, -1, dtype=np.int64)  # KV blocks per engine, -1: unlimited
    CTI = np.zeros((n_tasks, 1), dtype=np.int64)
    CTF = np.zeros((n_tasks, 1))
    steps: dict[int, np.ndarray] = {}
    too_large: tuple[int, int, int, int] | None = None  # (position in order, task, blocks, cache)
    for t, (cfg, tp) in enumerate(zip(configs, task_profiles, strict=True)):
        if cfg.topology != "continuous":
            continue
        cap[t] = min(cfg.max_num_seqs, int(counts[t]))
        steps[t] = _iteration_seconds(tp, int(cap[t]))
        whole = math.floor(tp.tokens_per_iteration)
        CTI[t, 0], CTF[t, 0] = whole, tp.tokens_per_iteration - whole
        kv = cfg.kv_blocks if cfg.kv_blocks is not None else tp.kv_blocks(cfg.block_size)
        if kv is not None:
            total[t] = kv
            need = -(-(ptok[order] + mtok[order]) // cfg.block_size)
            over = np.flatnonzero((task_of[order] == t) & (need > kv))
            if len(over) and (too_large is None or over[0] < too_large[0]):
                too_large = (int(over[0]), t, int(need[over[0]]), kv)
    if too_large is not None:
        # Engine.add refuses a prompt the whole cache cannot hold: the first one to arrive
        k, t, need_k, kv = too_large
        p = order[k]
        raise ScenarioError(scenario.source, f"tasks.{names[t]}", "kv_blocks",
                            f"a prompt of {ptok[p]} + {mtok[p]} tokens needs {need_k} KV blocks; the cache has {kv}")
    CSTEP = np.zeros((n_tasks, int(cap.max(initial=0)) + 1))
    for t, values in steps.items():
        CSTEP[t, :len(values)] = values
    EI = np.zeros((len(engines), EI_WIDTH), dtype=np.int64)
    r0 = 0
    for e, (t, device, name) in enumerate(engines):
        cfg = configs[t]
        EI[e, :EI_R0 + 1] = [t, device, name, cfg.max_num_seqs, cfg.max_batched_tokens, cfg.block_size, total[t],
                             max(total[t], 0), -1 if cfg.max_queue is None else cfg.max_queue, 0, 0, 0, -1, -1, 0, r0]
        EI[e, EI_RECORD] = -1
        r0 += int(cap[t])
    assert EI_TASK == 0
    return EI, CTI, CTF, CSTEP, np.zeros(r0, dtype=np.int64), np.zeros(3, dtype=np.int64)


def _lower_services(names: list[str], configs: list, task_profiles: list, seed: int) -> tuple:
    """Per task, the iteration and spec_decode kinds' parameters (``SI``, ``SF``: see
    :mod:`simulator.model.kernel_service`) and its service stream, in the state the reference
    engine's starts in (``service_rng``); the service with the scenario's overrides applied
    as the reference engine applies them (``service_of``)."""
    from simulator.model.kernel_layout import N_SF, N_SI, draws, lower_service

    SI = np.zeros((len(names), N_SI), dtype=np.int64)
    SF = np.zeros((len(names), N_SF))
    keys = service_overrides()
    for t, (cfg, tp) in enumerate(zip(configs, task_profiles, strict=True)):
        service = tp.service
        overrides = {k: getattr(cfg, k) for k in keys if getattr(cfg, k) is not None}
        if overrides and isinstance(service, SpecDecodeService):
            SI[t], SF[t] = lower_service(service.with_overrides(**overrides))
        else:
            SI[t], SF[t] = _lowered_service(service)
    drawing = [draws(SI[t], SF[t]) for t in range(len(names))]
    # The streams as simulator.model.compiled hands them to the kernel: every task's where
    # several draw, else the lone one drawn from (or none: no other is made).
    if sum(drawing) > 1:
        return SI, SF, [service_stream(seed, task) for task in names]
    return SI, SF, [service_stream(seed, task) for task, d in zip(names, drawing, strict=True) if d]


#: A service's kernel parameter rows, per service (see :func:`_lowered_service`).
_LOWERED_SERVICES = Memo(64)


def _lowered_service(service) -> tuple[np.ndarray, np.ndarray]:
    """``lower_service(service)``, kept per (frozen) service for the next run of it."""
    from simulator.model.kernel_layout import lower_service

    return _LOWERED_SERVICES.get((service,), (), lambda: lower_service(service))


def _grid_size(service) -> int:
    return max((len(g) for g in service.grid), default=1) if service.kind == "table" else 1


def simulate_fast(trace: Trace, scenario: Scenario, profile: Profile, seed: int) -> pd.DataFrame:
    """The event log of a supported scenario, computed by the compiled kernel."""
    return build_event_log(*_run(trace, scenario, profile, seed))


def simulate_fast_columns(trace: Trace, scenario: Scenario, profile: Profile, seed: int) -> LogColumns:
    """:func:`simulate_fast`'s event log as numpy columns, no frame made (what a summary reads)."""
    return event_columns(*_run(trace, scenario, profile, seed))


def _run(trace: Trace, scenario: Scenario, profile: Profile, seed: int) -> tuple[PromptColumns, Outcome]:
    """The kernel's run of a supported scenario: the prompts' columns and what it decided."""
    from simulator.model.compiled import run_kernel
    from simulator.model.kernel_layout import BF_FORMED, BF_STARTED, BI_DEVICE, BI_NAME, BI_SIZE, BI_WORKER_ID

    draw_factor = FIRST_DRAW_FACTOR
    with sigint_deferred():
        while True:
            lowered = lower(trace, scenario, profile, seed, draw_factor)
            BI, BF, nb, batch_of, done_at, first_at, status, preemptions, skipped = run_kernel(lowered.args)
            if not lowered.out_of_draws[0]:
                break
            draw_factor *= 4  # preemptions took more token draws than were drawn: again, with more
    lowered.args = ()  # the run's inputs, freed before the log is built beside its outputs
    BI, BF, skipped = BI[:nb], BF[:nb], skipped[:nb]
    # Batch ids: the rows' order, plus the ids of continuous iterations that admitted no new
    # prompt (they have no row).
    batch_id = np.arange(len(BI), dtype=np.int32)  # (fewer batches than prompts: below 2**31)
    if skipped.any():
        batch_id = batch_id + np.cumsum(skipped, dtype=np.int64)[:len(BI)]
        batch_of = np.where(batch_of >= 0, batch_id[np.maximum(batch_of, 0)] if len(BI) else -1, -1)
    # The batch table's columns the log reads, copied out so that the kernel's whole table
    # (its working columns too) is freed before the log's columns are made.
    formed_at, started_at = BF[:, BF_FORMED].copy(), BF[:, BF_STARTED].copy()
    device = lowered.gpu_of_device.astype(np.int32)[BI[:, BI_DEVICE]]
    worker, size, queue = BI[:, BI_WORKER_ID].copy(), BI[:, BI_SIZE].copy(), BI[:, BI_NAME].copy()
    del BI, BF
    outcome = Outcome(
        batch_of=batch_of, done_at=done_at, first_token_at=first_at, status=status,
        preemptions=preemptions, batch_id=batch_id, formed_at=formed_at, started_at=started_at, device=device,
        worker=worker, size=size, queue=queue, queue_names=lowered.queue_names,
    )
    return lowered.prompts(), outcome
