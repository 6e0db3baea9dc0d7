"""Micro-batch queues and the workers that drain them.

A :class:`BatchQueue` holds waiting prompts of one task in FIFO order. Whenever it is
non-empty and one of its workers is idle it asks its batching policy what to do: release
a batch to the idle worker, or wait (a timer re-asks at the instant the policy named). The
batch is the first prompts, or those the task's ``batch_selection`` rule picks
(:mod:`simulator.model.length`; it always takes the oldest). A worker hands its batch to a GPU (its own, or one chosen per batch by
the dispatch rule) and is busy until the batch is done.

Idle workers are served longest-idle first, as ``threading.Condition.notify`` wakes the
longest waiter in the real worker loops.

Queue limits as Triton's queue policy has them: with ``max_queue`` a prompt that finds that
many waiting is rejected; with ``queue_timeout`` a prompt still waiting that long after it
arrived is dropped (``timeout_action = "drop"``) or stays and is served, marked
``sent_after_timeout`` (``"send"``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from simulator.model.batching import BATCH_FORMING
from simulator.model.kernel import TIMER
from simulator.model.length import SELECTIONS, RowLengths
from simulator.model.policies import BatchingPolicy, ReleaseNow
from simulator.model.resources import Batch, Device

if TYPE_CHECKING:
    from simpy.events import Event

    from simulator.model.context import RunContext
    from simulator.model.kernel import SimEnvironment
    from simulator.scenario import TaskConfig


@dataclass(frozen=True)
class QueueLimits:
    """Triton's queue policy, for a micro-batch queue and a continuous engine's waiting line
    alike: at most ``max_queue`` prompts wait (one that finds the line full is rejected); a
    prompt waits at most ``timeout`` seconds, then it is dropped (``drop``) or marked
    ``sent_after_timeout`` and still served."""

    max_queue: int | None = None
    timeout: float | None = None
    drop: bool = True

    @classmethod
    def of(cls, config: TaskConfig) -> QueueLimits:
        return cls(config.max_queue, config.queue_timeout, config.timeout_action == "drop")

    def room(self, waiting: int, arriving: int) -> int:
        """How many of ``arriving`` prompts join a line of ``waiting`` (the rest are rejected)."""
        if self.max_queue is None:
            return arriving
        return min(arriving, max(self.max_queue - waiting, 0))

    def watch(self, env: SimEnvironment, handler: Callable[[Event], Any], joined: Any) -> None:
        """Call ``handler`` when prompts that ``joined`` now have waited ``timeout`` (if any)."""
        if self.timeout is not None:
            env.call_at(env._now + self.timeout, TIMER, handler, joined)


class Worker:
    """A batch worker: bound to one device, or (``device is None``) picking one per batch."""

    __slots__ = ("id", "device")

    def __init__(self, id: int, device: Device | None) -> None:
        self.id = id
        self.device = device


class BatchQueue:
    """One micro-batch queue with its workers.

    ``workers=None`` means unlimited workers (a new one appears whenever all are busy),
    which is how a thread-per-request CPU path behaves. ``pick_device`` chooses a device
    for a batch of a worker that is not bound to one.
    """

    def __init__(
        self,
        run: RunContext,
        task: str,
        name: str,
        policy: BatchingPolicy,
        workers: list[Worker] | None,
        pick_device: Callable[[], Device] | None = None,
        unbound_device: Device | None = None,
        devices: list[Device] | None = None,
    ) -> None:
        self.run = run
        self.env = run.env
        self.task = task
        self.name = name
        self.policy = policy
        self.waiting: deque[int] = deque()
        self.unlimited = workers is None
        self.idle: deque[Worker] = deque(workers or ())
        self.pick_device = pick_device
        self.unbound_device = unbound_device
        self.pickup_at: float | None = None
        self.timer_at: float | None = None
        self.in_service = 0
        self.outstanding_tokens = 0  # prompt + max tokens of prompts waiting or in service
        self.devices = devices or []
        config = run.configs[task]
        self.limits = QueueLimits.of(config)
        self.sticky = config.sticky_gpu
        self.forming = BATCH_FORMING.get(config.batch_forming)()
        self.selection = SELECTIONS.get(config.batch_selection)()
        self.fifo = config.batch_selection == "fifo"
        self._length: RowLengths | None = None
        if self.forming.watches_devices:
            for device in {id(d): d for d in [w.device for w in self.idle if w.device is not None]}.values():
                device.watchers.append(self.poll)
        run.queues.append(self)

    @property
    def outstanding(self) -> int:
        """Prompts waiting here plus prompts in this queue's batches being served."""
        return len(self.waiting) + self.in_service

    def add(self, prompt_ids: list[int]) -> None:
        """Prompts join the queue now (a call's group for this task)."""
        room = self.limits.room(len(self.waiting), len(prompt_ids))
        if room < len(prompt_ids):
            self.run.turn_away(prompt_ids[room:], "rejected")
            prompt_ids = prompt_ids[:room]
        if not prompt_ids:
            return
        self.waiting.extend(prompt_ids)
        run = self.run
        self.outstanding_tokens += sum(run.prompt_tokens[i] + run.max_tokens[i] for i in prompt_ids)
        self.limits.watch(self.env, self._on_queue_timeout, prompt_ids)
        self.poll()

    @property
    def waiting_count(self) -> int:
        """Prompts waiting (not yet in a batch): what ``shortest-waiting`` compares."""
        return len(self.waiting)

    def _idle_share(self, chosen: Device | None) -> float:
        """Share of the queue's GPUs other than ``chosen`` with nothing to run."""
        others = [d for d in self.devices if d is not chosen]
        if not others:
            return 0.0
        return sum(d.outstanding == 0 for d in others) / len(others)

    def poll(self) -> None:
        """Release batches while prompts wait, a worker is idle and the policy says so."""
        arrived_at = self.run.arrived_at
        while self.waiting and (self.idle or self.unlimited):
            now = self.env._now
            if self.pickup_at is None:
                self.pickup_at = now
            worker = None
            if self.idle:
                worker = self.forming.worker(self.idle)
                if worker is None:
                    return  # no idle worker may form a batch yet (batch_forming)
            idle_share = self._idle_share(worker.device if worker is not None else None) if self.devices else 0.0
            decision = self.policy.release(len(self.waiting), arrived_at[self.waiting[0]], now,
                                           self.pickup_at, idle_share)
            if not isinstance(decision, ReleaseNow):
                at = decision.at
                if at == float("inf") and self.run.input_closed:
                    # Nothing more will arrive: a batch waiting to fill never would.
                    decision = ReleaseNow(min(len(self.waiting), self.policy.max_batch))
                else:
                    if at != self.timer_at and at != float("inf"):
                        self.timer_at = at
                        self.env.call_at(at, TIMER, self._on_timer, at)
                    return
            if self.fifo:
                ids = [self.waiting.popleft() for _ in range(decision.count)]
            else:
                if self._length is None:
                    self._length = RowLengths(self.run.prompt_tokens, self.run.max_tokens)
                ids = self.selection.take(self.waiting, decision.count, self._length)
            self.pickup_at = None
            self.timer_at = None
            if worker is not None:
                self.idle.remove(worker)
            else:
                worker = Worker(self.run.new_worker_id(), self.unbound_device)
            self._dispatch(worker, ids)

    def _dispatch(self, worker: Worker, ids: list[int]) -> None:
        device = worker.device if worker.device is not None else self.pick_device()  # type: ignore[misc]
        if self.sticky and worker.device is None:
            worker.device = device  # keeps the GPU of its first batch from now on
        batch = self.run.form_batch(self.task, self.name, ids, worker.id, device)
        self.in_service += len(ids)
        batch.holder = worker
        batch.on_done = self._batch_done
        device.submit(batch)

    def _on_queue_timeout(self, event: Event) -> None:
        run = self.run
        late = [i for i in event._value if run.batch_of[i] < 0 and run.status[i] == "served"]
        if not late:
            return
        if self.limits.drop:
            gone = set(late)
            self.waiting = deque(i for i in self.waiting if i not in gone)
            self.outstanding_tokens -= sum(run.prompt_tokens[i] + run.max_tokens[i] for i in late)
            run.turn_away(late, "dropped")
            if not self.waiting:
                self.pickup_at = None
            self.poll()
        else:
            for i in late:
                run.status[i] = "sent_after_timeout"

    def _batch_done(self, batch: Batch) -> None:
        self.run.batch_done(batch)
        self.in_service -= len(batch.prompts)
        self.outstanding_tokens -= batch.tokens
        self.idle.append(batch.holder)
        self.poll()

    def _on_timer(self, event: Event) -> None:
        if event._value != self.timer_at:
            return  # superseded: the batch was released earlier or the window moved
        self.timer_at = None
        self.poll()
