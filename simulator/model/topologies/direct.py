"""``direct``: no micro-batching. Each call's group of this task goes at once, as batches of
at most ``max_batch`` prompts, to a device chosen by the dispatch rule; a busy device holds
it in its own line (exclusive GPUs) or shares itself (processor sharing)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator.model.topologies.base import TOPOLOGIES, Topology

if TYPE_CHECKING:
    from simulator.model.context import RunContext
    from simulator.scenario import TaskConfig


@TOPOLOGIES.register("direct")
class Direct(Topology):
    """Batches formed from each call's group on arrival, dispatched straight to devices."""

    name = "direct"

    def __init__(self, run: RunContext, task: str, config: TaskConfig) -> None:
        super().__init__(run, task, config)
        self.pick = run.device_picker(run.devices_for(task, config), config, task)
        self.max_batch = config.max_batch

    def accept(self, prompt_ids: list[int]) -> None:
        size = self.max_batch
        for start in range(0, len(prompt_ids), size):
            device = self.pick()
            batch = self.run.form_batch(self.task, f"{self.task}/direct", prompt_ids[start:start + size], -1, device)
            batch.on_done = self.run.batch_done
            device.submit(batch)
