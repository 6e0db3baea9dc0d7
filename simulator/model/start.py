"""A run that starts from a snapshot's state instead of an empty system (reference engine).

:class:`StartState` turns a :class:`~simulator.snapshot.Snapshot` into prompts of the run,
ahead of the trace's own:

* each **waiting** prompt is a call of one prompt at t = 0, its ``arrived_at`` set back by
  its age (``-age_s``; unknown ages count as 0), oldest first, so its age counts toward its
  latency and the batching policy sees the oldest prompt's true wait (a flush window already
  over releases at once). A prompt whose snapshot names its queue joins that queue; else
  its task's front routes it as a new prompt;
* each **running** batch is a call of its prompts, placed at t = 0 on a worker of its
  task's queue (the one bound to its GPU where the snapshot says) as a batch whose service
  is what remains of it (:func:`~simulator.model.rules.state.remaining_service`); batches
  that had started go first, then those formed and waiting for their GPU. No service time
  is drawn for them, so the trace's batches draw what they would from an empty system.

A waiting prompt's ``queue_timeout`` counts from t = 0 (the run cannot know how the
server's own timer stood), and a ``max_queue`` applies to the snapshot's prompts as they join.

Same-instant order at t = 0: the running batches are placed before anything is sent; then
the waiting prompts' calls arrive, oldest first, then the trace's calls at 0, in trace
order. The event log marks the snapshot's prompts ``from_state`` (their calls' ids start
with ``state-``); every other prompt is the trace's.

Only the topologies ``shared`` and ``split`` (micro-batch queues) and ``direct`` (a running
batch goes straight to its device; a waiting prompt is formed into a batch on arrival, as
``direct`` does) take a snapshot's prompts, GPU or CPU tasks; an open-loop client without a
replica pool.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from simulator.errors import SnapshotError
from simulator.model.batching import Shaping
from simulator.model.rules.queue import Worker
from simulator.model.rules.state import remaining_service
from simulator.profile import Profile
from simulator.scenario import Scenario
from simulator.snapshot import Running, Snapshot, StatePrompt
from simulator.trace.model import Call, Prompt, Trace

if TYPE_CHECKING:
    from simulator.model.context import RunContext
    from simulator.model.queues import BatchQueue
    from simulator.model.resources import Device

#: topologies a snapshot's prompts can join: micro-batch queues, and ``direct`` (a batch per
#: call's group, formed on arrival: its running batches go straight to a device)
QUEUE_TOPOLOGIES = ("shared", "split", "direct")


@dataclass
class _Entry:
    """One call the snapshot adds: its prompts, their ages, and (running) its batch."""

    task: str
    prompts: tuple[StatePrompt, ...]
    queue: str | None
    field: str
    running: Running | None = None


class StartState:
    """The snapshot's prompts as calls ahead of ``trace``'s (:attr:`trace`), and what to do
    with them once the run's router has them (module docstring)."""

    def __init__(self, snapshot: Snapshot, trace: Trace, scenario: Scenario, profile: Profile,
                 state_task: str | None = None) -> None:
        self.snapshot = snapshot
        self.notes: list[str] = []
        where = snapshot.path or snapshot.location
        if scenario.autoscaler is not None:
            raise SnapshotError(where, None, None, "a replay from a snapshot does not model a replica pool "
                                "(the scenario names an autoscaler)")
        if scenario.client != "open":
            raise SnapshotError(where, None, None, f"a replay from a snapshot needs the open-loop client, not "
                                f"{scenario.client}")
        tasks = list(dict.fromkeys(trace.tasks))

        def task_of(task: str | None, name: str) -> str:
            if task is None:
                task = state_task if state_task is not None else (tasks[0] if len(tasks) == 1 else None)
                if task is None:
                    raise SnapshotError(where, None, f"{name}.task", "unknown (the source does not tell it) and "
                                        "the trace has several tasks: name one with --state-task")
            if task not in profile.tasks:
                raise SnapshotError(where, None, f"{name}.task", f"task {task!r} is not in the profile "
                                    f"{profile.name} (tasks: {', '.join(profile.tasks)})")
            topology = scenario.for_task(task).topology
            if topology not in QUEUE_TOPOLOGIES:
                raise SnapshotError(where, None, f"{name}.task", f"task {task} uses the {topology} topology; a "
                                    f"replay from a snapshot supports {', '.join(QUEUE_TOPOLOGIES[:-1])} and {QUEUE_TOPOLOGIES[-1]} only")
            return task

        waiting: list[tuple[float, int, _Entry]] = []
        for i, w in enumerate(snapshot.waiting):
            task = task_of(w.task, f"waiting[{i}]")
            prompts = w.prompts if w.prompts is not None else (StatePrompt(),) * w.count
            for j, p in enumerate(prompts):
                waiting.append((p.age_s or 0.0, len(waiting), _Entry(task, (p,), w.queue, f"waiting[{i}].prompts[{j}]")))
            if w.prompts is None and w.count:
                self.notes.append(f"waiting[{i}]: ages unknown, counted from the start (latencies are lower bounds)")
        # oldest first (a stable sort keeps each queue's order among equal ages)
        waiting.sort(key=lambda e: (-e[0], e[1]))
        running = sorted(((not r.started, i, r) for i, r in enumerate(snapshot.running)), key=lambda e: e[:2])
        self.running = [_Entry(task_of(r.task, f"running[{i}]"),
                               r.prompts if r.prompts is not None else (StatePrompt(),) * r.size,
                               r.queue, f"running[{i}]", r) for _, i, r in running]
        self.waiting = [e for _, _, e in waiting]
        calls = [Call(f"state-r{k}", 0.0, tuple(Prompt(e.task, p.prompt_tokens, p.max_tokens) for p in e.prompts))
                 for k, e in enumerate(self.running)]
        calls += [Call(f"state-w{k}", 0.0, (Prompt(e.task, e.prompts[0].prompt_tokens, e.prompts[0].max_tokens),))
                  for k, e in enumerate(self.waiting)]
        #: calls of the snapshot, ahead of the trace's
        self.calls = len(calls)
        self.prompts = sum(len(c.prompts) for c in calls)
        self.trace = Trace(calls=(*calls, *trace.calls), meta=dict(trace.meta, from_state=where),
                           source=trace.source, prefix_block_tokens=trace.prefix_block_tokens)

    def apply(self, run: RunContext, groups: list) -> dict[int, Callable[[], None]]:
        """Once the router has the prompts: the snapshot's prompts' ``arrived_at`` set back by
        their ages; returns, per snapshot call, what its sending does instead of starting its
        groups (nothing for a running batch, placed by :meth:`place`; joining the named
        queue for a waiting prompt that names one that exists)."""
        instead: dict[int, Callable[[], None]] = {}
        queues = {q.name: q for q in run.queues}
        for ci, entry in enumerate(self.running + self.waiting):
            ids = groups[ci][0][1]
            for i, p in zip(ids, entry.prompts, strict=True):
                age = p.age_s
                if age is None and entry.running is not None:
                    age = entry.running.elapsed_s
                run.arrived_at[i] = -(age or 0.0)
            if entry.running is not None:
                instead[ci] = _nothing
            elif entry.queue is not None and entry.queue in queues:
                queue = queues[entry.queue]
                instead[ci] = _joiner(queue, ids)
        return instead

    def place(self, run: RunContext, groups: list) -> None:
        """Put the running batches on their workers and GPUs now (t = 0)."""
        where = self.snapshot.path or self.snapshot.location
        for ci, entry in enumerate(self.running):
            r = entry.running
            assert r is not None
            ids = groups[ci][0][1]
            task = entry.task
            shape, generations = Shaping.of(run.configs[task]).shape(run.prompt_tokens, run.max_tokens, ids)
            left = remaining_service(run.former.service_of(task), shape, generations, r.elapsed_s)
            if r.elapsed_s is None:
                self.notes.append(f"{entry.field}: elapsed service unknown, its expected residual "
                                  f"{left.seconds:.3g} s used")
            cfg = run.configs[task]
            if cfg.topology == "direct":
                devices = run.devices_for(task, cfg)
                on_gpu = [d for d in devices if r.gpu is not None and d.gpu_id == r.gpu]
                target = on_gpu[0] if on_gpu else run.device_picker(devices, cfg, task)()
                batch = run.former.resumed(task, f"{task}/direct", ids, -1, left.seconds)
                batch.on_done = run.batch_done
                target.submit(batch)
                continue
            candidates = [q for q in run.queues if q.task == task]
            named = [q for q in candidates if q.name == entry.queue]
            queue: BatchQueue | None = None
            worker: Worker | None = None
            device: Device | None = None
            for q in named + candidates:
                if q.unlimited:
                    queue, worker, device = q, Worker(run.new_worker_id(), q.unbound_device), q.unbound_device
                    break
                bound = [w for w in q.idle if w.device is not None and (r.gpu is None or w.device.gpu_id == r.gpu)]
                free = [w for w in q.idle if w.device is None]
                if bound:
                    queue, worker, device = q, bound[0], bound[0].device
                    break
                if free:
                    device = (run.gpus[r.gpu] if r.gpu is not None and r.gpu < len(run.gpus)
                              else q.pick_device())
                    queue, worker = q, free[0]
                    break
            if queue is None or worker is None or device is None:
                gpu = "" if r.gpu is None else f" on GPU {r.gpu}"
                raise SnapshotError(where, None, entry.field, f"no idle worker of task {task}'s queues{gpu} is left "
                                    "for this batch: the snapshot has more running batches than the scenario has "
                                    "workers")
            queue.resume(worker, ids, device, left.seconds)


def _nothing() -> None:
    return None


def _joiner(queue: BatchQueue, ids: list[int]) -> Callable[[], None]:
    return lambda: queue.add(ids)
