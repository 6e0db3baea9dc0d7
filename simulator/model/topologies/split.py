"""``split``: one micro-batch queue per task per GPU, each with one worker bound to its GPU.

Each prompt is dispatched on arrival to one queue by the task's rule (``round-robin``,
``least-loaded`` by outstanding prompts, ``jsq-tokens`` by outstanding tokens,
``shortest-waiting`` by prompts waiting in the queue only, or ``random``), or with
``dispatch_per = "group"`` each call's group of this task as a whole). For a task on the CPU there is one
queue per CPU server, so ``cpu_workers`` must be set.

With length buckets (``length_buckets``, ``bucket_bounds``: :mod:`simulator.model.length`)
there is such a queue per bucket per GPU (``task@i#b``); a prompt (or a group's part in one
bucket) is dispatched among its bucket's queues by the one rule of the task.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator.errors import ScenarioError
from simulator.model.length import Bucketing
from simulator.model.queues import BatchQueue, Worker
from simulator.model.topologies.base import TOPOLOGIES, Topology

if TYPE_CHECKING:
    from simulator.model.context import RunContext
    from simulator.scenario import TaskConfig


@TOPOLOGIES.register("split")
class SplitQueues(Topology):
    """A queue per GPU; prompts dispatched to queues one by one on arrival."""

    name = "split"

    def __init__(self, run: RunContext, task: str, config: TaskConfig) -> None:
        super().__init__(run, task, config)
        devices = run.devices_for(task, config)
        if run.resource_of(task) == "cpu":
            servers = run.cpu_servers(task)
            if servers is None:
                raise ScenarioError(run.source, f"tasks.{task}", "cpu_workers",
                                    f"task {task} runs on the CPU, where the split topology needs a queue per "
                                    f"CPU worker: give it cpu_workers (--set tasks.{task}.cpu_workers=4) or "
                                    f"another topology (--set tasks.{task}.topology=direct)")
            devices = devices * servers
        self.bucketing = Bucketing(run, task, config, run.source)
        count = self.bucketing.count
        #: per bucket, its queue on each device
        self.buckets = [
            [BatchQueue(run, task, f"{task}@{i}" if count == 1 else f"{task}@{i}#{b}", run.policy_for(config),
                        [Worker(run.new_worker_id(), device)],
                        devices=devices if run.resource_of(task) == "gpu" else None)
             for i, device in enumerate(devices)]
            for b in range(count)
        ]
        self.queues = self.buckets[0]
        self.rule = run.dispatch_rule(config, task)
        self.rng = run.dispatch_rng
        self.per_group = config.dispatch_per == "group"

    def accept(self, prompt_ids: list[int]) -> None:
        if len(self.buckets) == 1:
            self._dispatch(self.queues, prompt_ids)
            return
        for bucket, ids in self.bucketing.split(prompt_ids):
            self._dispatch(self.buckets[bucket], ids)

    def _dispatch(self, queues: list[BatchQueue], prompt_ids: list[int]) -> None:
        # dispatch_per = "group": the call's prompts of this task all go to one queue.
        for part in ([prompt_ids] if self.per_group else [[p] for p in prompt_ids]):
            loads = self.rule.loads(queues)
            queues[self.rule.choose(loads, self.rng)].add(part)
