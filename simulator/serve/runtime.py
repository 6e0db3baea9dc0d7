"""The modeled server, run for real: a scenario's router, task groups, micro-batch queues,
workers, dispatch rules, GPU locks and queue limits on asyncio, with real timers.

The decisions are the simulator's own objects, called here in real time: a queue asks the
task's registered batching policy (:data:`simulator.model.policies.POLICIES`) whether to
release a batch or wait until an instant; split queues and workers that take a GPU per batch
ask the registered dispatch rule (:data:`simulator.model.dispatch.DISPATCH_RULES`, named
dispatch groups through :class:`~simulator.model.dispatch.DispatchGroups`); the worker that
forms a batch is the task's forming rule's (:data:`simulator.model.batching.BATCH_FORMING`);
a queue's limits are :class:`~simulator.model.queues.QueueLimits`; a batch's rows are the
task's :class:`~simulator.model.batching.Shaping`. What this module adds is only the plumbing
the simulator's event heap does there: futures, timers and locks.

Clock: every instant is in *server seconds*, seconds of the event loop's clock since the
runtime started times ``time_scale`` (1 for a real backend). The loop's clock is the one its
timers are set on (asyncio's is :func:`time.monotonic`: real seconds), so a timer set for a
server instant fires when :meth:`Clock.now` reads that instant, and a loop whose clock is
virtual (the tests') runs the server on virtual time. A sleep backend with ``time_scale`` 100 runs the
modeled system 100 times faster than real time: flush windows, queue timeouts and service
times all shrink by that factor, so decisions are those of the model at its own instants.
A flush window's end and a queue timeout are timers at a server instant
(:meth:`Runtime.call_at`): timers of one instant share one loop deadline and fire in the
order they were set, as the model's same-instant events do.

Topologies: ``shared`` (one queue per task; a worker per GPU bound to it, or fewer workers
taking a GPU per batch by the dispatch rule), ``split`` (a queue per GPU, each prompt (or
call group, ``dispatch_per``) dispatched on arrival) and ``direct`` (each call's group goes at
once as batches of at most max batch to the GPU the rule picks) and ``continuous`` (an
iteration-level engine per device, :class:`ServeEngine`, on the sleep backend only: each
prompt dispatched on arrival, admitted, preempted and costed per iteration by the model's
own rules and objects).

GPUs: with ``gpu_sharing = "exclusive"`` each GPU has a lock that batches take in priority
order (higher first, FIFO within a class) after they are formed, as the users' per-GPU
``threading.Lock`` taken after dequeuing; with ``processor-sharing`` batches run on a GPU
concurrently (a sleep backend stretches them as the model does, a real one shares its GPU).
A task on the CPU runs on its own pool of ``cpu_workers`` (unlimited by default).

Failures: every prompt's future ends with its text or a :class:`PromptFailed` whose
``reason`` says why (``rejected`` by a full queue, ``dropped`` at its queue timeout,
``shutdown``, ``backend`` error, ``timeout`` of a stalled batch, ``unknown-task``).

Tasks: a prompt goes to the task the users' keyword rules give it; one whose task this server
does not serve (no rule matches, or the rule's task is not the profile's) goes to the
runtime's ``default_task`` where there is one (:func:`first_gpu_task` is ``simctl serve``'s
default), else fails with ``unknown-task``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
import traceback
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from simulator.errors import ScenarioError, ServeError
from simulator.model.batching import BATCH_FORMING, Shaping
from simulator.model.dispatch import DISPATCH_RULES, DispatchGroups, DispatchRule
from simulator.model.engine import ServiceStreams
from simulator.model.policies import POLICIES, BatchingPolicy
from simulator.model.rules.continuous import EngineState, iteration_boundary
from simulator.model.rules.queue import BatchRelease, QueueLimits, Release, Worker
from simulator.model.rules.service import TaskServices
from simulator.model.streams import dispatch_stream
from simulator.profile import Profile
from simulator.profile.kinds import BatchShape, ServiceModel
from simulator.scenario import Scenario, TaskConfig
from simulator.trace.classify import DEFAULT_CLASSIFIER, KeywordClassifier, estimate_tokens

#: Topologies the runtime serves.
SERVED_TOPOLOGIES = ("shared", "split", "direct", "continuous")
#: Why a prompt failed -> a one-line account (the HTTP layer maps reasons to status codes).
REASONS = ("rejected", "dropped", "shutdown", "backend", "timeout", "unknown-task")


class PromptFailed(Exception):
    """A prompt was not served: ``reason`` (one of :data:`REASONS`) and a one-line message;
    ``detail`` holds a backend's traceback where there is one."""

    def __init__(self, reason: str, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.detail = detail


class Backend(Protocol):
    """What serves a formed batch on its free device (:mod:`simulator.serve.backends` has
    the registered ones; the runtime needs only this)."""

    name: str

    def check(self, scenario: Scenario) -> None: ...

    async def start(self, runtime: Runtime) -> None: ...

    async def close(self) -> None: ...

    async def run(self, runtime: Runtime, batch: ServeBatch) -> list[str]: ...

    def planned_text(self, job: PromptJob) -> str | None: ...


class Clock:
    """Server seconds: seconds of ``timer`` since the start, times ``scale``.

    ``timer`` is the serving event loop's clock (:meth:`asyncio.AbstractEventLoop.time`; the
    runtime passes its loop's), the clock that loop's timers (``call_at``, ``asyncio.sleep``)
    are set on, so the two cannot disagree. Before a loop is bound it is
    :func:`time.monotonic`, which is what asyncio's own loops read."""

    def __init__(self, scale: float = 1.0, timer: Callable[[], float] = time.monotonic) -> None:
        if not scale > 0:
            raise ValueError(f"time scale must be > 0, got {scale}")
        self.scale = float(scale)
        self.timer = timer
        self.t0 = timer()

    def now(self) -> float:
        return (self.timer() - self.t0) * self.scale

    def real(self, seconds: float) -> float:
        """Loop (real) seconds that ``seconds`` of server time take."""
        return max(seconds, 0.0) / self.scale


@dataclass(eq=False)
class PromptJob:
    """One prompt in the server: its call, task, lengths, instants (server seconds, the event
    log's fields) and the future its call awaits (its generated text)."""

    id: int
    call_id: int
    index: int
    task: str
    text: str
    prompt_tokens: int
    max_tokens: int
    arrived_at: float
    future: asyncio.Future
    #: set when its batch starts: (started_at, first_token_at, done_at) as planned (server
    #: seconds; first token and done ``None`` where the backend cannot tell in advance)
    started: asyncio.Future
    queue: str = ""
    status: str = "waiting"
    batched_at: float | None = None
    started_at: float | None = None
    first_token_at: float | None = None
    done_at: float | None = None
    gpu: int | None = None
    worker: int = -1
    batch_id: int = -1
    batch_size: int = 0
    sent_after_timeout: bool = False

    def record(self) -> dict[str, Any]:
        """The prompt's row of the server's event log (the simulator's field names)."""
        return {"call_id": self.call_id, "prompt_index": self.index, "task": self.task, "queue": self.queue,
                "status": self.status, "prompt_tokens": self.prompt_tokens, "max_tokens": self.max_tokens,
                "arrived_at": self.arrived_at, "batched_at": self.batched_at, "started_at": self.started_at,
                "first_token_at": self.first_token_at, "done_at": self.done_at, "gpu": self.gpu,
                "worker": self.worker, "batch_id": self.batch_id, "batch_size": self.batch_size}


@dataclass(eq=False)
class ServeBatch:
    """A batch formed by a queue (or a direct front): its prompts, task, shape (the task's
    :class:`~simulator.model.batching.Shaping`: rows and generations) and device."""

    id: int
    task: str
    queue: str
    jobs: list[PromptJob]
    shape: BatchShape
    generations: int
    worker: int
    device: Device
    priority: int = 0
    tokens: int = 0

    def plan(self, runtime: Runtime, first_token_in: float | None, done_in: float | None) -> None:
        """The backend tells, as the batch starts, when its first token and its end come
        (server seconds from now; ``None``: unknown)."""
        now = runtime.clock.now()
        first = None if first_token_in is None else now + first_token_in
        done = None if done_in is None else now + done_in
        for job in self.jobs:
            if not job.started.done():
                job.started.set_result((now, first, done))


class PriorityLock:
    """An exclusive GPU's lock: waiters get it by priority (higher first), FIFO within one."""

    def __init__(self) -> None:
        self.held = False
        self._waiters: list[tuple[int, int, asyncio.Future]] = []
        self._order = itertools.count()

    @property
    def waiting(self) -> int:
        return sum(not f.done() for _, _, f in self._waiters)

    async def acquire(self, priority: int = 0) -> None:
        if not self.held and not self._waiters:
            self.held = True
            return
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (-priority, next(self._order), future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # it was handed the lock as it was cancelled: pass it on
            raise

    def release(self) -> None:
        while self._waiters:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                future.set_result(None)  # the lock passes on, still held
                return
        self.held = False


class Device:
    """A GPU (``gpu_id`` >= 0) or a task's CPU pool (-1): what the dispatch rules compare
    (``outstanding`` prompts, ``outstanding_tokens``, ``waiting_count``) and how a batch gets
    to run on it (the exclusive GPU's lock, the CPU pool's servers)."""

    def __init__(self, gpu_id: int, exclusive: bool, servers: int | None = None) -> None:
        self.gpu_id = gpu_id
        self.exclusive = exclusive
        self.lock = PriorityLock() if exclusive else None
        self.pool = asyncio.Semaphore(servers) if servers is not None else None
        self.outstanding = 0
        self.outstanding_tokens = 0
        self.running = 0
        #: called after every batch finishes (queues that form batches only on a free GPU)
        self.watchers: list[Callable[[], None]] = []

    @property
    def waiting_count(self) -> int:
        return self.outstanding

    def is_free(self) -> bool:
        return self.outstanding == 0


class ServeQueue:
    """One micro-batch queue with its workers: :class:`simulator.model.queues.BatchQueue`'s
    loop, on asyncio. Whenever it holds prompts and a worker is idle it asks the policy; a
    ``WaitUntil`` becomes a timer that asks again then (or earlier, at an arrival or a freed
    worker)."""

    def __init__(self, runtime: Runtime, task: str, name: str, config: TaskConfig, workers: list[Worker] | None,
                 pick_device: Callable[[], Device] | None = None, unbound_device: Device | None = None,
                 devices: list[Device] | None = None) -> None:
        self.runtime = runtime
        self.task = task
        self.name = name
        self.policy: BatchingPolicy = POLICIES.get(config.policy)(config.flush, config.max_batch)
        self.waiting: deque[PromptJob] = deque()
        self.unlimited = workers is None
        self.idle: deque[Worker] = deque(workers or ())
        self.pick_device = pick_device
        self.unbound_device = unbound_device
        self.devices = devices or []
        self._timer: Timer | None = None
        self.in_service = 0
        self.outstanding_tokens = 0
        self.limits = QueueLimits.of(config)
        self.sticky = config.sticky_gpu
        self.forming = BATCH_FORMING.get(config.batch_forming)()
        self.release: BatchRelease[Worker] = BatchRelease(self.policy, self.forming, self.devices)
        if self.forming.watches_devices:
            for device in {id(w.device): w.device for w in self.idle if w.device is not None}.values():
                device.watchers.append(self.poll)
        runtime.queues.append(self)

    @property
    def outstanding(self) -> int:
        return len(self.waiting) + self.in_service

    @property
    def waiting_count(self) -> int:
        return len(self.waiting)

    def add(self, jobs: list[PromptJob]) -> None:
        """Prompts join the queue now; those that find it full are rejected."""
        room = self.limits.room(len(self.waiting), len(jobs))
        for job in jobs[room:]:
            self.runtime.fail(job, PromptFailed("rejected", f"queue {self.name} is full "
                                                            f"(max_queue {self.limits.max_queue})"), "rejected")
        jobs = jobs[:room]
        if not jobs:
            return
        for job in jobs:
            job.queue = self.name
        self.waiting.extend(jobs)
        self.outstanding_tokens += sum(j.prompt_tokens + j.max_tokens for j in jobs)
        timeout_at = self.limits.deadline(jobs[0].arrived_at)
        if timeout_at is not None:
            self.runtime.call_at(timeout_at, self._on_queue_timeout, jobs)
        self.poll()

    def poll(self) -> None:
        """Release batches while prompts wait, a worker is idle and the release rule says so."""
        runtime = self.runtime
        while self.waiting and (self.idle or self.unlimited) and not runtime.closing:
            step = self.release.next(len(self.waiting), self.waiting[0].arrived_at, runtime.clock.now(), self.idle)
            if not isinstance(step, Release):
                if step is not None:
                    if self._timer is not None:
                        self._timer.cancel()
                    self._timer = runtime.call_at(step, self._on_timer, step)
                return
            worker, count = step
            jobs = [self.waiting.popleft() for _ in range(count)]
            if worker is None:
                worker = Worker(runtime.new_worker_id(), self.unbound_device)
            self._dispatch(worker, jobs)

    def _dispatch(self, worker: Worker, jobs: list[PromptJob]) -> None:
        device = worker.device if worker.device is not None else self.pick_device()  # type: ignore[misc]
        if self.sticky and worker.device is None:
            worker.device = device
        batch = self.runtime.form_batch(self.task, self.name, jobs, worker.id, device)
        self.in_service += len(jobs)
        self.runtime.spawn(self._serve(worker, batch))

    async def _serve(self, worker: Worker, batch: ServeBatch) -> None:
        try:
            await self.runtime.run_batch(batch)
        finally:
            self.in_service -= len(batch.jobs)
            self.outstanding_tokens -= batch.tokens
            self.idle.append(worker)
            self.poll()

    def _on_queue_timeout(self, jobs: list[PromptJob]) -> None:
        late = [j for j in jobs if j.status == "waiting"]
        if not late:
            return
        if self.limits.drop:
            gone = set(map(id, late))
            self.waiting = deque(j for j in self.waiting if id(j) not in gone)
            self.outstanding_tokens -= sum(j.prompt_tokens + j.max_tokens for j in late)
            for job in late:
                self.runtime.fail(job, PromptFailed("dropped", f"waited longer than queue_timeout "
                                                               f"{self.limits.timeout:g} s in queue {self.name}"),
                                  "dropped")
            self.release.dropped(len(self.waiting))
            self.poll()
        else:
            for job in late:
                job.sent_after_timeout = True

    def _on_timer(self, at: float) -> None:
        if self.release.fired(at):
            self._timer = None
            self.poll()

    def drain(self, error: PromptFailed) -> None:
        """Every waiting prompt fails with ``error`` (shutdown)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self.waiting:
            self.runtime.fail(self.waiting.popleft(), error, "shutdown")


class Front(ABC):
    """A task's front end in the runtime (one per served topology)."""

    def __init__(self, runtime: Runtime, task: str, config: TaskConfig) -> None:
        self.runtime = runtime
        self.task = task
        self.config = config

    @abstractmethod
    def accept(self, jobs: list[PromptJob]) -> None:
        """Take the prompts of one call into the topology's queues."""


class SharedFront(Front):
    """``shared``: one queue, workers bound to devices or taking one per batch
    (:class:`simulator.model.topologies.shared.SharedQueue`)."""

    def __init__(self, runtime: Runtime, task: str, config: TaskConfig) -> None:
        super().__init__(runtime, task, config)
        devices = runtime.devices_for(task, config)
        n = config.workers
        if runtime.resource_of(task) == "cpu" and n is None:
            n = config.cpu_workers
        elif n is None:
            n = len(devices)
        workers: list[Worker] | None
        if n is None:
            workers = None
        elif n >= len(devices):
            workers = [Worker(runtime.new_worker_id(), devices[i % len(devices)]) for i in range(n)]
        else:
            workers = [Worker(runtime.new_worker_id(), None) for _ in range(n)]
        self.queue = ServeQueue(runtime, task, task, config, workers,
                                pick_device=runtime.device_picker(devices, config, task),
                                unbound_device=devices[0] if len(devices) == 1 else None,
                                devices=devices if runtime.resource_of(task) == "gpu" else None)

    def accept(self, jobs: list[PromptJob]) -> None:
        self.queue.add(jobs)


class SplitFront(Front):
    """``split``: a queue per GPU, prompts (or the call's group) dispatched on arrival by
    the task's rule (:class:`simulator.model.topologies.split.SplitQueues`)."""

    def __init__(self, runtime: Runtime, task: str, config: TaskConfig) -> None:
        super().__init__(runtime, task, config)
        devices = runtime.devices_for(task, config)
        if runtime.resource_of(task) == "cpu":
            if config.cpu_workers is None:
                raise ScenarioError(runtime.scenario.source, f"tasks.{task}", "cpu_workers",
                                    f"task {task} runs on the CPU, where the split topology needs a queue per "
                                    f"CPU worker: give it cpu_workers or another topology")
            devices = devices * config.cpu_workers
        self.queues = [ServeQueue(runtime, task, f"{task}@{i}", config, [Worker(runtime.new_worker_id(), d)],
                                  devices=devices if runtime.resource_of(task) == "gpu" else None)
                       for i, d in enumerate(devices)]
        self.rule = runtime.dispatch_rule(config, task)
        self.per_group = config.dispatch_per == "group"

    def accept(self, jobs: list[PromptJob]) -> None:
        for part in ([jobs] if self.per_group else [[j] for j in jobs]):
            loads = self.rule.loads(self.queues)
            self.queues[self.rule.choose(loads, self.runtime.dispatch_rng)].add(part)


class DirectFront(Front):
    """``direct``: the call's group goes at once, as batches of at most max batch, to the
    device the rule picks (:class:`simulator.model.topologies.direct.Direct`)."""

    def __init__(self, runtime: Runtime, task: str, config: TaskConfig) -> None:
        super().__init__(runtime, task, config)
        self.pick = runtime.device_picker(runtime.devices_for(task, config), config, task)

    def accept(self, jobs: list[PromptJob]) -> None:
        size = self.config.max_batch
        for start in range(0, len(jobs), size):
            part = jobs[start:start + size]
            for job in part:
                job.queue = f"{self.task}/direct"
            batch = self.runtime.form_batch(self.task, f"{self.task}/direct", part, -1, self.pick())
            self.runtime.spawn(self.runtime.run_batch(batch))



class ServeEngine(EngineState):
    """One continuous-batching engine on asyncio: the loop of
    :class:`simulator.model.topologies.continuous.Engine` (its module docstring is the
    spec), with the model's own parts: the running rows' bookkeeping
    (:class:`~simulator.model.rules.continuous.FixedGainRows` or
    :class:`~simulator.model.rules.continuous.DrawnGainRows`: tokens, KV blocks,
    preemption of the newest row), the task's :class:`~simulator.profile.iteration.StepCost`
    drawn from the task's service stream, and :class:`~simulator.model.queues.QueueLimits`.

    While it holds prompts, one iteration follows another: preempt while the cache is short,
    else admit waiting prompts in order (``max_num_seqs``, the token budget, KV blocks), then
    run the iteration on the device for its step cost (an exclusive GPU's lock by priority, a
    processor-sharing GPU's shared time, a CPU server), as one unit of work among the
    device's micro-batches. Its instants are the real ones of the scaled clock.

    Lag: an iteration's sleep ends a little late (the event loop wakes on millisecond
    timers, and other work runs first). Iterations run back to back on a device, so the
    engine keeps to its own schedule: the device seconds one iteration ran past its work
    (the backend's ``serve_work`` tells; on a processor-sharing GPU in solo seconds, its
    stretch by other work not counted) are taken off the next one's (never below zero; the
    rest is carried), so lag does not add up over an engine's hundreds of iterations. It is
    forgotten when the engine goes idle.
    """

    def __init__(self, runtime: Runtime, task: str, config: TaskConfig, device: Device, index: int) -> None:
        self.runtime = runtime
        self.device = device
        # Engine-local prompt numbers index the token columns (the rows' bookkeeping reads
        # them by number). No prefix caching here, nor prompts prefilled elsewhere
        # (check_served refuses both).
        super().__init__(task, config, runtime.profile.tasks[task], runtime.service_of(task),
                         runtime.service_rng(task), index, [], [])
        self.jobs: dict[int, PromptJob] = {}
        self.iterations = 0
        self._late = 0.0  # server seconds the engine is behind its own schedule
        runtime.engines.append(self)

    # -- arrivals -------------------------------------------------------------------------
    def add(self, job: PromptJob) -> None:
        """A prompt joins the waiting line now (rejected if the line is full or the cache
        could never hold it); an idle engine starts an iteration once the call's prompts
        have all joined."""
        runtime = self.runtime
        need = job.prompt_tokens + job.max_tokens
        job.queue = self.name
        wanted = self.blocks_needed(need)
        if wanted is not None:
            runtime.fail(job, PromptFailed("rejected", f"a prompt of {job.prompt_tokens} + {job.max_tokens} tokens "
                                                       f"needs {wanted} KV blocks; engine "
                                                       f"{self.name} has {self.total_blocks}"), "rejected")
            return
        pid = len(self.prompt_tokens)
        if not self.enqueue(pid, need):
            runtime.fail(job, PromptFailed("rejected", f"engine {self.name} is full (max_queue "
                                                       f"{self.limits.max_queue})"), "rejected")
            return
        self.prompt_tokens.append(job.prompt_tokens)
        self.max_tokens.append(job.max_tokens)
        self.jobs[pid] = job
        timeout_at = self.limits.deadline(job.arrived_at)
        if timeout_at is not None:
            runtime.call_at(timeout_at, self._on_queue_timeout, pid)
        if not self.busy:
            # as the model's TIMER after ARRIVAL: the iteration starts after this call's
            # other prompts have joined
            self.busy = True
            self.runtime.spawn(self._loop())

    def _on_queue_timeout(self, pid: int) -> None:
        job = self.jobs.get(pid)
        if job is None or job.status != "waiting":
            return  # admitted in time (a preempted prompt is not timed out again), or gone
        if self.limits.drop:
            self.drop(pid)
            del self.jobs[pid]
            self.runtime.fail(job, PromptFailed("dropped", f"waited longer than queue_timeout "
                                                           f"{self.limits.timeout:g} s in engine {self.name}"),
                              "dropped")
        else:
            job.sent_after_timeout = True

    def drain(self, error: PromptFailed) -> None:
        """Every waiting prompt not yet admitted fails with ``error`` (shutdown); running rows
        finish."""
        keep: deque[int] = deque()
        while self.waiting:
            pid = self.waiting.popleft()
            if pid in self.resumed:
                keep.append(pid)  # preempted: it has a reply under way; it finishes
                continue
            job = self.jobs.pop(pid)
            self.outstanding_tokens -= job.prompt_tokens + job.max_tokens
            self.runtime.fail(job, error, "shutdown")
        self.waiting = keep

    # -- iterations ---------------------------------------------------------------------------
    def plan(self) -> tuple[float, int, list[int], int, list[int]] | None:
        """Steps 1 and 2 of the model's iteration boundary: preemptions, admissions, the
        step cost. ``(work, decoding rows, prefilled token counts, their tokens, the prompts
        prefilled for the first time)``, or ``None`` when there is nothing to run."""
        def preempted(pid: int) -> None:
            self.jobs[pid].status = "preempted"

        decoding, prefill, fresh, context, capacity = iteration_boundary(self, self.prompt_tokens, preempted)
        if not decoding and not prefill:
            return None
        work = float(self.cost.step(decoding, prefill, context, self.rng, capacity))
        return work, decoding, prefill, sum(prefill), fresh

    def _admitted(self, fresh: list[int], work: float) -> None:
        """The admission record: the prompts prefilled for the first time are this
        iteration's batch in the event log (as the model logs them)."""
        runtime = self.runtime
        jobs = [self.jobs[p] for p in fresh]
        now = runtime.clock.now()
        shape = BatchShape(len(jobs), max(j.prompt_tokens for j in jobs), max(j.max_tokens for j in jobs))
        batch = ServeBatch(next(runtime._batch_ids), self.task, self.name, jobs, shape, 1, -1, self.device,
                           priority=self.priority, tokens=sum(j.prompt_tokens + j.max_tokens for j in jobs))
        for job in jobs:
            job.status = "running"
            job.batched_at = job.started_at = now
            job.batch_id, job.batch_size, job.worker = batch.id, len(jobs), -1
            job.gpu = self.device.gpu_id if self.device.gpu_id >= 0 else None
            if not job.started.done():
                # a streaming reply: first token at the end of this iteration; the end unknown
                job.started.set_result((now, now + work, None))
        for observer in runtime.on_batch:
            observer(batch)

    async def _loop(self) -> None:
        """Iterations while the engine holds prompts (one busy period)."""
        current = asyncio.current_task()
        if current is not None:
            self.runtime._batches_running.add(current)
        try:
            while True:
                planned = self.plan()
                if planned is None:
                    break
                work, decoding, prefill, prefill_tokens, fresh = planned
                self.iterations += 1
                if fresh:
                    self._admitted(fresh, work)
                rows = decoding + len(prefill)
                await self._on_device(work, rows)
                self._iteration_done(decoding, len(prefill), prefill_tokens, fresh)
        except asyncio.CancelledError:
            self._fail_all(PromptFailed("shutdown", "the server shut down before the prompt finished"))
            raise
        except Exception as exc:  # a backend's error is the engine's prompts' error
            self._fail_all(PromptFailed("backend", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        finally:
            self.busy = False
            self._late = 0.0
            if current is not None:
                self.runtime._batches_running.discard(current)

    async def _on_device(self, work: float, rows: int) -> None:
        """Run one iteration of ``work`` server seconds on the device (module docstring)."""
        runtime, device = self.runtime, self.device
        if device.lock is not None:
            await device.lock.acquire(self.priority)
        elif device.pool is not None:
            await device.pool.acquire()
        device.running += 1
        device.outstanding += rows
        try:
            owed = min(self._late, work)
            late = await runtime.backend.serve_work(runtime, device, work - owed)  # type: ignore[attr-defined]
            self._late = self._late - owed + float(late)
        finally:
            device.outstanding -= rows
            device.running -= 1
            if device.lock is not None:
                device.lock.release()
            elif device.pool is not None:
                device.pool.release()

    def _iteration_done(self, decoding: int, admitted: int, admitted_tokens: int, fresh: list[int]) -> None:
        runtime = self.runtime
        now = runtime.clock.now()
        finished = self.end_iteration(decoding, admitted, admitted_tokens)
        for pid in fresh:
            self.jobs[pid].first_token_at = now
        if finished:
            for pid in finished:
                job = self.jobs.pop(pid)
                job.done_at = now
                runtime.finish(job, runtime.backend.planned_text(job) or "")
        for watcher in self.device.watchers:
            watcher()

    def _fail_all(self, error: PromptFailed) -> None:
        """Every prompt here fails with ``error``; the engine starts afresh (empty cache)."""
        for pid, job in list(self.jobs.items()):
            if not job.future.done():
                self.runtime.fail(job, error, "failed")
            del self.jobs[pid]
        self.waiting.clear()
        self.resumed.clear()
        self.rows = self.new_rows()
        self.free_blocks = self.total_blocks
        self.running = 0
        self.outstanding_tokens = 0


class ContinuousFront(Front):
    """``continuous``: an engine per device (:class:`ServeEngine`); each prompt dispatched
    on arrival by the task's rule (:class:`simulator.model.topologies.continuous.Continuous`)."""

    def __init__(self, runtime: Runtime, task: str, config: TaskConfig) -> None:
        super().__init__(runtime, task, config)
        devices = runtime.devices_for(task, config)
        self.engines = [ServeEngine(runtime, task, config, d, i) for i, d in enumerate(devices)]
        self.rule = runtime.dispatch_rule(config, task)

    def accept(self, jobs: list[PromptJob]) -> None:
        engines = self.engines
        for job in jobs:
            if len(engines) == 1:
                engines[0].add(job)
            else:
                engines[self.rule.choose(self.rule.loads(engines), self.runtime.dispatch_rng)].add(job)


FRONTS: dict[str, type[Front]] = {"shared": SharedFront, "split": SplitFront, "direct": DirectFront,
                                 "continuous": ContinuousFront}


def check_served(scenario: Scenario, tasks: Sequence[str], backend: str = "sleep",
                 resource_of: Callable[[str], str] | None = None) -> None:
    """A :class:`ScenarioError` naming the first setting the runtime does not serve (on
    ``backend``: only the sleep backend runs continuous engines on the GPUs, from the
    profile's iteration costs; every backend serves a CPU task from them)."""
    if scenario.host_lock:
        raise ScenarioError(scenario.source, "run", "host_lock", "simctl serve does not emulate the host lock "
                            "(a real backend has its own); set it to false")
    for task in tasks:
        cfg = scenario.for_task(task)
        if cfg.topology not in SERVED_TOPOLOGIES:
            raise ScenarioError(scenario.source, f"tasks.{task}", "topology",
                                f"simctl serve runs the {', '.join(SERVED_TOPOLOGIES)} topologies, not "
                                f"{cfg.topology!r}")
        if (cfg.topology == "continuous" and backend != "sleep"
                and (resource_of is None or resource_of(task) == "gpu")):
            raise ScenarioError(scenario.source, f"tasks.{task}", "topology",
                                f"the {backend} backend runs whole batches, not continuous engines: use "
                                f"--backend sleep, or run a continuous engine such as vLLM behind "
                                f"--backend openai:URL with another topology")
        if cfg.adaptive_lookahead:
            raise ScenarioError(scenario.source, f"tasks.{task}", "adaptive_lookahead",
                                "simctl serve does not pick lookaheads; set it to false")
        if cfg.prefix_caching:
            raise ScenarioError(scenario.source, f"tasks.{task}", "prefix_caching",
                                "simctl serve does not cache prefixes (requests carry no prefix block ids); "
                                "replay models it; set it to false")
        for key, plain in (("batch_selection", "fifo"), ("length_buckets", 1), ("bucket_bounds", None)):
            if getattr(cfg, key) != plain:
                raise ScenarioError(scenario.source, f"tasks.{task}", key,
                                    "simctl serve forms batches in arrival order from one queue per task "
                                    "(no length buckets or selection by length); leave it unset")


@dataclass
class Timer:
    """A callback set for a server instant (:meth:`Runtime.call_at`); ``cancel`` keeps it
    from running."""

    callback: Callable[..., Any]
    args: tuple[Any, ...]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


def first_gpu_task(scenario: Scenario, profile: Profile) -> str | None:
    """The first of ``profile``'s tasks (in its order) that runs on a GPU in ``scenario``
    (else its first task; ``None`` for a profile without tasks): where ``simctl serve``
    sends a prompt no rule gives a served task, a benchmark client's synthetic text."""
    tasks = list(profile.tasks)
    for task in tasks:
        if (scenario.for_task(task).resource or profile.tasks[task].resource) == "gpu":
            return task
    return tasks[0] if tasks else None


class Runtime:
    """The served system for one scenario, profile and backend (module docstring).

    Build it anywhere; it binds to the running event loop on first use (:meth:`start`).
    :meth:`submit_call` takes a call's prompt texts and returns, per prompt, its text or a
    :class:`PromptFailed`; :meth:`submit_prompt` one prompt's job (the OpenAI endpoints).
    :meth:`shutdown` fails every queued prompt and refuses new ones; in-flight batches finish.
    """

    def __init__(self, scenario: Scenario, profile: Profile, backend: Backend, *, seed: int = 0,
                 time_scale: float = 1.0, classifier: KeywordClassifier = DEFAULT_CLASSIFIER,
                 batch_timeout: float | None = None, log_size: int = 100_000,
                 default_task: str | None = None) -> None:
        self.scenario = scenario
        self.profile = profile
        self.backend = backend
        self.seed = seed
        self.time_scale = time_scale
        self.classifier = classifier
        #: server seconds a batch may take on its backend before its prompts fail (stall guard)
        self.batch_timeout = batch_timeout
        self.tasks = list(profile.tasks)
        if default_task is not None and default_task not in self.tasks:
            raise ServeError(None, None, "default_task", f"unknown task {default_task!r}; the tasks of profile "
                             f"{profile.name}: {', '.join(self.tasks)}")
        #: where a prompt whose task this server does not serve goes (``None``: it fails)
        self.default_task = default_task
        check_served(scenario, self.tasks, backend.name,
                     lambda t: scenario.for_task(t).resource or profile.tasks[t].resource)
        backend.check(scenario)
        self.configs = {t: scenario.for_task(t) for t in self.tasks}
        self.clock = Clock(time_scale)
        self.dispatch_rng = dispatch_stream(seed)
        self.service_rng = ServiceStreams(seed)
        rotation = frozenset(scenario.shared_rotation)

        def group_of(task: str) -> str | None:
            own = scenario.for_task(task).dispatch_group
            return own if own is not None else ("shared_rotation" if task in rotation else None)

        self.dispatch_groups = DispatchGroups(group_of)
        self._ids = itertools.count()
        self._call_ids = itertools.count()
        self._worker_ids = itertools.count()
        self._batch_ids = itertools.count()
        self._services = TaskServices(scenario, profile.tasks)
        #: the timers of each loop instant, in the order they were set (see call_at)
        self._instants: dict[float, list[Timer]] = {}
        self._shaping = {t: Shaping.of(c) for t, c in self.configs.items()}
        self.queues: list[ServeQueue] = []
        self.engines: list[ServeEngine] = []
        self.gpus: list[Device] = []
        self._cpu_pools: dict[str, Device] = {}
        self.fronts: dict[str, Front] = {}
        self.closing = False
        self.started = False
        self.calls_in_flight = 0
        #: the event log of finished prompts (most recent ``log_size``)
        self.log: deque[dict[str, Any]] = deque(maxlen=log_size)
        self._tasks: set[asyncio.Task] = set()
        self._batches_running: set[asyncio.Task] = set()
        #: batches formed and not finished, by id (what :meth:`state` reports as running)
        self._open_batches: dict[int, ServeBatch] = {}
        #: observers: (job) when a prompt finishes; (batch) when a batch is formed
        self.on_prompt_done: list[Callable[[PromptJob], None]] = []
        self.on_batch: list[Callable[[ServeBatch], None]] = []

    # -- start and stop ------------------------------------------------------------------
    async def start(self) -> None:
        """Bind to the running loop: make devices and fronts, start the backend (idempotent)."""
        if self.started:
            return
        self.started = True
        self.clock = Clock(self.time_scale, asyncio.get_running_loop().time)
        exclusive = self.scenario.gpu_sharing == "exclusive"
        self.gpus = [Device(g, exclusive) for g in range(self.scenario.gpus)]
        for task in self.tasks:
            self.fronts[task] = FRONTS[self.configs[task].topology](self, task, self.configs[task])
        await self.backend.start(self)

    async def shutdown(self, grace: float | None = None) -> None:
        """Stop taking prompts; fail every queued one; let in-flight batches finish (at most
        ``grace`` real seconds, then they are cancelled and their prompts fail); stop the
        backend."""
        self.closing = True
        error = PromptFailed("shutdown", "the server is shutting down; the prompt was not served")
        for queue in self.queues:
            queue.drain(error)
        for engine in self.engines:
            engine.drain(error)
        running = [t for t in self._batches_running if not t.done()]
        if running:
            done, pending = await asyncio.wait(running, timeout=grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5)
        await self.backend.close()

    # -- the parts' helpers (as the simulator's run context gives them) -----------------
    def new_worker_id(self) -> int:
        return next(self._worker_ids)

    def resource_of(self, task: str) -> str:
        return self.configs[task].resource or self.profile.tasks[task].resource

    def devices_for(self, task: str, config: TaskConfig) -> list[Device]:
        if self.resource_of(task) == "gpu":
            return self.gpus
        pool = self._cpu_pools.get(task)
        if pool is None:
            pool = self._cpu_pools[task] = Device(-1, False, config.cpu_workers)
        return [pool]

    def dispatch_rule(self, config: TaskConfig, task: str) -> DispatchRule:
        shared = self.dispatch_groups.rule_for(task, config.dispatch)
        return shared if shared is not None else DISPATCH_RULES.get(config.dispatch)()

    def device_picker(self, devices: list[Device], config: TaskConfig, task: str) -> Callable[[], Device]:
        if len(devices) == 1:
            only = devices[0]
            return lambda: only
        rule, rng = self.dispatch_rule(config, task), self.dispatch_rng
        return lambda: devices[rule.choose(rule.loads(devices), rng)]

    def service_of(self, task: str) -> ServiceModel:
        """The task's service model, made once (as the model's)."""
        return self._services.of(task)

    def call_later(self, seconds: float, callback: Callable[..., Any], *args: Any) -> asyncio.TimerHandle:
        """Call ``callback(*args)`` after ``seconds`` of server time."""
        return asyncio.get_running_loop().call_later(self.clock.real(seconds), callback, *args)

    def call_at(self, at: float, callback: Callable[..., Any], *args: Any) -> Timer:
        """Call ``callback(*args)`` at the server instant ``at``. The timers of one instant
        share one loop timer that runs them in the order they were set (as the model's
        same-instant events, in creation order): the loop's own timers of one deadline come
        off its heap in no set order, and its millisecond rounding would split them."""
        loop = asyncio.get_running_loop()
        when = self.clock.t0 + max(at, 0.0) / self.clock.scale
        timers = self._instants.get(when)
        if timers is None:
            timers = self._instants[when] = []
            loop.call_at(when, self._fire, when)
        timer = Timer(callback, args)
        timers.append(timer)
        return timer

    def _fire(self, when: float) -> None:
        """Run the timers of loop instant ``when`` in the order they were set (one that
        raises is reported as the loop reports a failed callback; the others still run)."""
        for timer in self._instants.pop(when, []):
            if timer.cancelled:
                continue
            try:
                timer.callback(*timer.args)
            except Exception as exc:  # noqa: BLE001  (as asyncio's own handles: report, go on)
                asyncio.get_running_loop().call_exception_handler(
                    {"message": f"exception in timer {timer.callback!r}", "exception": exc})

    def spawn(self, coroutine: Any) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def form_batch(self, task: str, queue: str, jobs: list[PromptJob], worker: int, device: Device) -> ServeBatch:
        """A batch of ``jobs`` released now to ``device`` (its shape by the task's shaping)."""
        shape, generations = self._shaping[task].shape([j.prompt_tokens for j in jobs],
                                                       [j.max_tokens for j in jobs], list(range(len(jobs))))
        now = self.clock.now()
        batch = ServeBatch(next(self._batch_ids), task, queue, jobs, shape, generations, worker, device,
                           priority=self.configs[task].priority,
                           tokens=sum(j.prompt_tokens + j.max_tokens for j in jobs))
        for job in jobs:
            job.status = "batched"
            job.batched_at = now
            job.batch_id, job.batch_size, job.worker = batch.id, len(jobs), worker
            job.gpu = device.gpu_id if device.gpu_id >= 0 else None
        device.outstanding += len(jobs)
        device.outstanding_tokens += batch.tokens
        self._open_batches[batch.id] = batch
        for observer in self.on_batch:
            observer(batch)
        return batch

    async def run_batch(self, batch: ServeBatch) -> None:
        """Run ``batch`` on its device: take the GPU's lock (by priority) or a CPU server,
        then the backend; every prompt's future ends with its text or the failure."""
        device = batch.device
        current = asyncio.current_task()
        if current is not None:
            self._batches_running.add(current)
        try:
            if device.lock is not None:
                await device.lock.acquire(batch.priority)
            elif device.pool is not None:
                await device.pool.acquire()
            device.running += 1
            try:
                now = self.clock.now()
                for job in batch.jobs:
                    job.started_at = now
                    job.status = "running"
                coroutine = self.backend.run(self, batch)
                if self.batch_timeout is not None:
                    async with asyncio.timeout(self.clock.real(self.batch_timeout)):
                        texts = await coroutine
                else:
                    texts = await coroutine
            finally:
                device.running -= 1
                if device.lock is not None:
                    device.lock.release()
                elif device.pool is not None:
                    device.pool.release()
            now = self.clock.now()
            for job, text in zip(batch.jobs, texts, strict=True):
                job.done_at = now
                if job.first_token_at is None:
                    planned = job.started.result()[1] if job.started.done() else None
                    job.first_token_at = min(planned, now) if planned is not None else now
                self.finish(job, text)
        except TimeoutError:
            error = PromptFailed("timeout", f"batch {batch.id} of task {batch.task} took longer than "
                                            f"{self.batch_timeout:g} s on its backend")
            for job in batch.jobs:
                self.fail(job, error, "failed")
        except asyncio.CancelledError:
            error = PromptFailed("shutdown", "the server shut down before the batch finished")
            for job in batch.jobs:
                self.fail(job, error, "failed")
            raise
        except Exception as exc:  # a backend's error is the batch's prompts' error
            error = PromptFailed("backend", f"{type(exc).__name__}: {exc}", traceback.format_exc())
            for job in batch.jobs:
                self.fail(job, error, "failed")
        finally:
            self._open_batches.pop(batch.id, None)
            device.outstanding -= len(batch.jobs)
            device.outstanding_tokens -= batch.tokens
            for watcher in device.watchers:
                watcher()
            if current is not None:
                self._batches_running.discard(current)

    def finish(self, job: PromptJob, text: str) -> None:
        job.status = "sent_after_timeout" if job.sent_after_timeout else "served"
        if not job.future.done():
            job.future.set_result(text)
        if not job.started.done():
            job.started.set_result((job.started_at, job.first_token_at, job.done_at))
        self._finished(job)

    def fail(self, job: PromptJob, error: PromptFailed, status: str) -> None:
        job.status = status
        if not job.future.done():
            job.future.set_exception(error)
            job.future.exception()  # retrieved: a call that already failed need not await it
        if not job.started.done():
            job.started.set_exception(error)
            job.started.exception()
        self._finished(job)

    def _finished(self, job: PromptJob) -> None:
        self.log.append(job.record())
        for observer in self.on_prompt_done:
            observer(job)

    # -- calls ---------------------------------------------------------------------------
    def classify(self, text: str) -> str:
        """The task this server routes ``text`` to: the users' keyword rules' task, or the
        default task where the rules give none this server serves."""
        task = self.classifier.classify(text)
        if self.default_task is not None and task not in self.profile.tasks:
            return self.default_task
        return task

    def _jobs(self, texts: Sequence[str], max_tokens: int | None, tasks: Sequence[str] | None = None) -> list[PromptJob]:
        loop = asyncio.get_running_loop()
        call_id = next(self._call_ids)
        now = self.clock.now()
        jobs = []
        for index, text in enumerate(texts):
            task = tasks[index] if tasks is not None else self.classify(text)
            if task in self.profile.tasks:
                cap = self.configs[task].max_tokens
                mt = max_tokens or self.profile.tasks[task].max_tokens
                mt = min(mt, cap) if cap is not None else mt
            else:
                mt = max_tokens or 1
            jobs.append(PromptJob(next(self._ids), call_id, index, task, text, estimate_tokens(text), mt, now,
                                  loop.create_future(), loop.create_future()))
        return jobs

    async def submit_call(self, texts: Sequence[str], max_tokens: int | None = None,
                          tasks: Sequence[str] | None = None) -> list[str | PromptFailed]:
        """Serve one call: its prompts routed by task into groups (in ``group_order``, at
        most ``max_concurrent_groups`` at a time), each group to its task's front; returns,
        in prompt order, each prompt's text or its failure."""
        await self.start()
        jobs = self._jobs(texts, max_tokens, tasks)
        self.calls_in_flight += 1
        try:
            await self._admit(jobs)
            results = await asyncio.gather(*(j.future for j in jobs), return_exceptions=True)
        finally:
            self.calls_in_flight -= 1
        return [r if isinstance(r, str | PromptFailed) else PromptFailed("backend", str(r)) for r in results]

    async def submit_prompt(self, text: str, max_tokens: int | None = None, task: str | None = None) -> PromptJob:
        """Admit one prompt (a call of one); await its ``future`` (and ``started``)."""
        await self.start()
        jobs = self._jobs([text], max_tokens, None if task is None else [task])
        await self._admit(jobs)
        return jobs[0]

    async def _admit(self, jobs: list[PromptJob]) -> None:
        cold = self.scenario.cold_start - self.clock.now()
        if cold > 0 and not self.closing:
            await asyncio.sleep(self.clock.real(cold))
        by_task: dict[str, list[PromptJob]] = {}
        for job in jobs:
            by_task.setdefault(job.task, []).append(job)
        for task, group in list(by_task.items()):
            if task not in self.fronts:
                known = ", ".join(self.tasks)
                for job in group:
                    self.fail(job, PromptFailed("unknown-task", f"prompt {job.index}: no task of this server matches "
                                                                f"it (classified {task!r}; tasks: {known})"), "rejected")
                del by_task[task]
        if self.closing:
            for job in jobs:
                if not job.future.done():
                    self.fail(job, PromptFailed("shutdown", "the server is shutting down"), "rejected")
            return
        order = {t: r for r, t in enumerate(self.scenario.group_order)}
        tasks = sorted(by_task, key=lambda t: order.get(t, len(order))) if order else list(by_task)
        limit = self.scenario.max_concurrent_groups
        if limit is None or len(tasks) <= limit:
            for task in tasks:
                self._start_group(task, by_task[task])
        else:
            self.spawn(self._groups_limited([by_task[t] for t in tasks], limit))

    def _start_group(self, task: str, group: list[PromptJob]) -> None:
        self.dispatch_groups.group_started(task, len(self.gpus), self.dispatch_rng)
        self.fronts[task].accept(group)

    async def _groups_limited(self, groups: list[list[PromptJob]], limit: int) -> None:
        """Start a call's groups at most ``limit`` at a time, the next when one ends."""
        running: set[asyncio.Future] = set()
        for group in groups:
            while len(running) >= limit:
                _, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            if self.closing:
                for job in group:
                    self.fail(job, PromptFailed("shutdown", "the server is shutting down"), "rejected")
                continue
            self._start_group(group[0].task, group)
            running.add(asyncio.ensure_future(asyncio.gather(*(j.future for j in group), return_exceptions=True)))

    # -- what the metrics read -----------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """What waits and runs now, in :mod:`simulator.snapshot`'s structure (server seconds):
        ``taken_at`` (now), per queue its waiting prompts oldest first (age, tokens), per
        batch formed and not finished its task, queue, GPU, size, whether it has started on
        its GPU, its elapsed service and its prompts. A continuous engine's prompts are
        counted per engine (waiting, and running as one entry), without ages or elapsed
        service."""
        now = self.clock.now()

        def prompt(job: PromptJob) -> dict[str, Any]:
            return {"age_s": max(now - job.arrived_at, 0.0), "prompt_tokens": job.prompt_tokens,
                    "max_tokens": job.max_tokens}

        waiting: list[dict[str, Any]] = [
            {"task": q.task, "queue": q.name, "count": len(q.waiting), "prompts": [prompt(j) for j in q.waiting]}
            for q in self.queues if q.waiting]
        running: list[dict[str, Any]] = []
        for batch in self._open_batches.values():
            started = [j.started_at for j in batch.jobs if j.started_at is not None]
            running.append({"task": batch.task, "queue": batch.queue,
                            "gpu": batch.device.gpu_id if batch.device.gpu_id >= 0 else None,
                            "size": len(batch.jobs), "started": bool(started),
                            "elapsed_s": max(now - min(started), 0.0) if started else 0.0,
                            "prompts": [prompt(j) for j in batch.jobs]})
        unknown = []
        for engine in self.engines:
            if engine.waiting:
                waiting.append({"task": engine.task, "queue": engine.name, "count": len(engine.waiting),
                                "prompts": None})
            rows = len(engine.jobs) - len(engine.waiting)
            if rows > 0:
                running.append({"task": engine.task, "queue": engine.name,
                                "gpu": engine.device.gpu_id if engine.device.gpu_id >= 0 else None,
                                "size": rows, "started": True, "elapsed_s": None, "prompts": None})
        if self.engines:
            unknown.append("continuous engines: their prompts' ages and tokens and their rows' elapsed service")
        unknown.append("kv_cache_usage, prefix_cache_hit_rate: not modelled by simctl serve")
        return {"taken_at": now, "waiting": waiting, "running": running, "kv_cache_usage": None,
                "prefix_cache_hit_rate": None, "unknown": unknown}

    def queue_depths(self) -> dict[str, int]:
        """Prompts waiting per queue."""
        depths = {q.name: len(q.waiting) for q in self.queues}
        depths.update((e.name, len(e.waiting)) for e in self.engines)
        return depths
