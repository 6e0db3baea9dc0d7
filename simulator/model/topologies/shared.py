"""``shared``: one micro-batch queue per task, drained by several workers.

By default there is one worker per device, bound to it (the design notes' InfoBench queue
with a worker per GPU). With fewer workers than GPUs, each worker takes a GPU per batch by
the task's dispatch rule (the design notes' single MMLU worker). With more workers than
GPUs, worker i is bound to GPU i mod G.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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
        workers: list[Worker] | None
        if n_workers is None:
            workers = None
        elif n_workers >= len(devices):
            workers = [Worker(run.new_worker_id(), devices[i % len(devices)]) for i in range(n_workers)]
        else:
            workers = [Worker(run.new_worker_id(), None) for _ in range(n_workers)]
        self.queue = BatchQueue(
            run, task, task, run.policy_for(config), workers,
            pick_device=run.device_picker(devices, config, task),
            unbound_device=devices[0] if len(devices) == 1 else None,
            devices=devices if run.resource_of(task) == "gpu" else None,
        )

    def accept(self, prompt_ids: list[int]) -> None:
        self.queue.add(prompt_ids)
