"""``shared``: one micro-batch queue per task, drained by several workers.

By default there is one worker per device, bound to it (the design notes' InfoBench queue
with a worker per GPU). With fewer workers than GPUs, each worker takes a GPU per batch by
the task's dispatch rule (the design notes' single MMLU worker). With more workers than
GPUs, worker i is bound to GPU i mod G.

With length buckets (``length_buckets``, ``bucket_bounds``: :mod:`simulator.model.length`)
the task has such a queue, with such workers, per bucket (named ``task#b``); a prompt joins
its bucket's queue.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator.model.length import Bucketing
from simulator.model.queues import BatchQueue, Worker
from simulator.model.topologies.base import TOPOLOGIES, Topology

if TYPE_CHECKING:
    from simulator.model.context import RunContext
    from simulator.scenario import TaskConfig


@TOPOLOGIES.register("shared")
class SharedQueue(Topology):
    """One queue per task; workers bound to GPUs, or choosing one per batch."""

    name = "shared"

    def __init__(self, run: RunContext, task: str, config: TaskConfig) -> None:
        super().__init__(run, task, config)
        devices = run.devices_for(task, config)
        n_workers = config.workers
        if run.resource_of(task) == "cpu" and n_workers is None:
            n_workers = run.cpu_servers(task)  # None: a worker per request, unlimited
        elif n_workers is None:
            n_workers = len(devices)
        self.bucketing = Bucketing(run, task, config, run.source)

        def workers() -> list[Worker] | None:
            if n_workers is None:
                return None
            if n_workers >= len(devices):
                return [Worker(run.new_worker_id(), devices[i % len(devices)]) for i in range(n_workers)]
            return [Worker(run.new_worker_id(), None) for _ in range(n_workers)]

        count = self.bucketing.count
        self.queues = [
            BatchQueue(
                run, task, task if count == 1 else f"{task}#{b}", run.policy_for(config), workers(),
                pick_device=run.device_picker(devices, config, task),
                unbound_device=devices[0] if len(devices) == 1 else None,
                devices=devices if run.resource_of(task) == "gpu" else None,
            )
            for b in range(count)
        ]
        self.queue = self.queues[0]

    def accept(self, prompt_ids: list[int]) -> None:
        if len(self.queues) == 1:
            self.queue.add(prompt_ids)
            return
        for bucket, ids in self.bucketing.split(prompt_ids):
            self.queues[bucket].add(ids)
