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
from typing import TYPE_CHECKING

from simulator.model.batching import BATCH_FORMING
from simulator.model.event_order import TIMER
from simulator.model.length import SELECTIONS, RowLengths
from simulator.model.policies import BatchingPolicy
from simulator.model.resources import Batch, Device
from simulator.model.rules.queue import BatchRelease, QueueLimits, Release, Worker

__all__ = ["BatchQueue", "QueueLimits", "Worker"]

if TYPE_CHECKING:
    from simpy.events import Event

    from simulator.model.context import RunContext


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
        self.in_service = 0
        self.outstanding_tokens = 0  # prompt + max tokens of prompts waiting or in service
        self.devices = devices or []
        config = run.configs[task]
        self.limits = QueueLimits.of(config)
        self.sticky = config.sticky_gpu
        self.forming = BATCH_FORMING.get(config.batch_forming)()
        self.release: BatchRelease[Worker] = BatchRelease(policy, self.forming, self.devices)
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
        timeout_at = self.limits.deadline(self.env._now)
        if timeout_at is not None:
            self.env.call_at(timeout_at, TIMER, self._on_queue_timeout, prompt_ids)
        self.poll()

    @property
    def waiting_count(self) -> int:
        """Prompts waiting (not yet in a batch): what ``shortest-waiting`` compares."""
        return len(self.waiting)

    def poll(self) -> None:
        """Release batches while prompts wait, a worker is idle and the release rule says so."""
        arrived_at = self.run.arrived_at
        release = self.release
        while self.waiting and (self.idle or self.unlimited):
            step = release.next(len(self.waiting), arrived_at[self.waiting[0]], self.env._now, self.idle,
                                self.run.input_closed)
            if not isinstance(step, Release):
                if step is not None:
                    self.env.call_at(step, TIMER, self._on_timer, step)
                return
            worker, count = step
            if self.fifo:
                ids = [self.waiting.popleft() for _ in range(count)]
            else:
                if self._length is None:
                    self._length = RowLengths(self.run.prompt_tokens, self.run.max_tokens)
                ids = self.selection.take(self.waiting, count, self._length)
            if worker is None:
                worker = Worker(self.run.new_worker_id(), self.unbound_device)
            self._dispatch(worker, ids)

    def _dispatch(self, worker: Worker, ids: list[int]) -> None:
        device = worker.device if worker.device is not None else self.pick_device()  # type: ignore[misc]
        if self.sticky and worker.device is None:
            worker.device = device  # keeps the GPU of its first batch from now on
        self._start(worker, self.run.form_batch(self.task, self.name, ids, worker.id, device), device)

    def _start(self, worker: Worker, batch: Batch, device: Device) -> None:
        """``worker`` runs ``batch`` on ``device``: its prompts count as in service until it ends."""
        self.in_service += len(batch.prompts)
        batch.holder = worker
        batch.on_done = self._batch_done
        device.submit(batch)

    def resume(self, worker: Worker, ids: list[int], device: Device, work: float) -> None:
        """A batch of ``ids`` already running when the run starts (a snapshot's,
        :mod:`simulator.model.start`): ``worker`` (taken off the idle line) holds it on
        ``device`` for the ``work`` seconds of service it has left."""
        if worker in self.idle:
            self.idle.remove(worker)
        run = self.run
        self.outstanding_tokens += sum(run.prompt_tokens[i] + run.max_tokens[i] for i in ids)
        self._start(worker, run.former.resumed(self.task, self.name, ids, worker.id, work), device)

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
            self.release.dropped(len(self.waiting))
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
        if self.release.fired(event._value):
            self.poll()
