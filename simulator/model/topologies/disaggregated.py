"""``disaggregated``: prefill and decode on separate GPU pools (xPyD), as Dynamo, vLLM's
disaggregated prefill, DistServe and Splitwise serve.

A task's GPUs split into a prefill pool (the first ``prefill_gpus``) and a decode pool (the
rest, at least one); each GPU runs a continuous-batching engine
(:class:`~simulator.model.topologies.continuous.Engine`, with its waiting line, token budget,
``max_num_seqs`` and KV blocks):

1. a prompt arriving goes to a prefill engine, chosen by the task's dispatch rule over the
   prefill engines; that engine admits it as any continuous engine does and prefills it: its
   first token comes at the end of that iteration (``first_token_at``), and the prompt then
   leaves the prefill engine, its blocks freed there (a prefill engine never decodes);
2. a prompt with one output token is done there; any other's KV cache (its prompt tokens
   plus the first token) goes to a decode engine chosen by the dispatch rule over the decode
   engines at that instant. The transfer takes ``bytes / bandwidth + kv_link_latency``:
   bytes = (prompt tokens + 1) × the KV bytes per token (``kv_bytes_per_token``, else the
   profile's ``kv_cache.bytes_per_token``), bandwidth ``kv_link_gbps``, else the ``kv_link``'s
   (:data:`LINKS`). Each transfer takes that time on its own: transfers do not contend for
   a link (one link per GPU pair, each at full bandwidth);
3. when the transfer ends the prompt joins the decode engine's waiting line (an arrival at
   that instant: it joins an iteration boundary at the same instant, as an arriving prompt
   would) as a row whose prefill is done: admitted without prefill cost (a decoding row,
   one token of the budget) when the cache there has blocks for its tokens plus one, it
   decodes its remaining max tokens − 1 (preempted there, it is recomputed there, as on
   any continuous engine). Queue limits apply at the prefill engines only.

The event log gains ``prefill_gpu``, ``decode_gpu`` (empty for a one-token prompt) and
``transfer_s``; ``gpu`` is the decode GPU (the prefill GPU for a one-token prompt). The
batch fields are the prefill admission's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

from simulator.errors import ScenarioError
from simulator.model.event_order import ARRIVAL
from simulator.model.topologies.base import TOPOLOGIES, Topology
from simulator.model.topologies.continuous import Engine

if TYPE_CHECKING:
    from collections.abc import Callable

    from simulator.model.context import RunContext
    from simulator.model.dispatch import DispatchRule
    from simulator.model.resources import Device
    from simulator.scenario import TaskConfig

E = TypeVar("E", bound=Engine)

#: Bandwidth of each ``kv_link``, GB/s (10^9 bytes per second) in one direction: NVLink 4 on
#: an H100 SXM (900 GB/s in all, NVIDIA's H100 datasheet), one 400 Gb/s NDR InfiniBand port
#: (ConnectX-7: 50 GB/s), PCIe Gen5 x16 (64 GB/s, PCI-SIG).
LINKS = {"nvlink": 900.0, "infiniband": 50.0, "pcie": 64.0}


class _OneToken:
    """Every prompt's max tokens on a prefill engine: one (it leaves with its first token)."""

    def __getitem__(self, pid: int) -> int:
        return 1


class PrefillEngine(Engine):
    """A continuous engine whose rows leave after their prefill iteration, with their first
    token: a prompt with one output token is done; any other goes to ``handoff(pid)``."""

    def __init__(self, run: RunContext, task: str, config: TaskConfig, device: Device, index: int,
                 handoff: Callable[[int], None]) -> None:
        super().__init__(run, task, config, device, index, max_tokens=_OneToken())
        self.handoff = handoff

    def leave(self, finished: list[int]) -> None:
        mtoks = self.run.max_tokens
        done = [pid for pid in finished if mtoks[pid] <= 1]
        if done:
            super().leave(done)
        for pid in finished:
            if mtoks[pid] > 1:
                self.handoff(pid)


class DecodeEngine(Engine):
    """A continuous engine that takes prompts prefilled elsewhere (:meth:`join`)."""

    def __init__(self, run: RunContext, task: str, config: TaskConfig, device: Device, index: int) -> None:
        super().__init__(run, task, config, device, index)
        self.prefix = None  # the prefix cache is the prefill engines' (the KV cache arrives whole)

    def join(self, pid: int) -> None:
        """Prompt ``pid``'s KV cache (its prompt and first token) arrived now: it waits to
        decode its other tokens (no queue limit: it was admitted at the prefill side)."""
        self.waiting.append(pid)
        self.resumed[pid] = 1
        self.prefilled.add(pid)
        self.outstanding_tokens += self.max_tokens[pid] - 1
        if not self.busy:
            self._start_soon()


@TOPOLOGIES.register("disaggregated")
class Disaggregated(Topology):
    """A prefill pool and a decode pool of continuous engines, KV caches moved between them."""

    name = "disaggregated"

    def __init__(self, run: RunContext, task: str, config: TaskConfig) -> None:
        super().__init__(run, task, config)
        where = f"tasks.{task}"
        if run.resource_of(task) != "gpu":
            raise ScenarioError(run.source, where, "topology",
                                "disaggregated serving splits GPUs into prefill and decode pools; this task runs "
                                "on the CPU")
        devices = run.devices_for(task, config)
        x = config.prefill_gpus
        if x >= len(devices):
            raise ScenarioError(run.source, where, "prefill_gpus",
                                f"{x} prefill GPU(s) of {len(devices)} leave none to decode; it must be at most "
                                f"{len(devices) - 1}")
        self.bytes_per_token = kv_bytes_per_token(run, task, config)
        self.gbps = config.kv_link_gbps if config.kv_link_gbps is not None else LINKS[config.kv_link]
        self.latency = config.kv_link_latency
        self.prefill = [PrefillEngine(run, task, config, d, i, self._handoff) for i, d in enumerate(devices[:x])]
        self.decode = [DecodeEngine(run, task, config, d, x + i) for i, d in enumerate(devices[x:])]
        self.prefill_rule = run.dispatch_rule(config, task)
        self.decode_rule = run.dispatch_rule(config, task)
        self.rng = run.dispatch_rng
        columns = run.topology_columns
        self._prefill_gpu = columns.setdefault("prefill_gpu", (int, {}))[1]
        self._decode_gpu = columns.setdefault("decode_gpu", (int, {}))[1]
        self._transfer_s = columns.setdefault("transfer_s", (float, {}))[1]
        self._gpu = columns.setdefault("gpu", (int, {}))[1]

    def transfer_seconds(self, pid: int) -> float:
        """How long prompt ``pid``'s KV cache (prompt tokens + 1) takes to cross the link."""
        size = (self.run.prompt_tokens[pid] + 1) * self.bytes_per_token
        return size / (self.gbps * 1e9) + self.latency

    def accept(self, prompt_ids: list[int]) -> None:
        engines, mtoks = self.prefill, self.run.max_tokens
        for pid in prompt_ids:
            if mtoks[pid] > 1:
                self.decode[0].check_fits(pid)  # (the decode engines are alike)
            engine = self._choose(engines, self.prefill_rule, pid)
            self._prefill_gpu[pid] = self._gpu[pid] = engine.device.gpu_id
            engine.add(pid)

    def _choose(self, engines: Sequence[E], rule: DispatchRule, pid: int) -> E:
        """The engine of ``engines`` that ``rule`` gives prompt ``pid`` (the only one without
        a draw)."""
        return engines[0] if len(engines) == 1 else engines[rule.choose(rule.loads(engines, pid), self.rng)]

    def _handoff(self, pid: int) -> None:
        """Prompt ``pid`` left its prefill engine now: send its KV cache to a decode engine."""
        engine = self._choose(self.decode, self.decode_rule, pid)
        seconds = self.transfer_seconds(pid)
        self._decode_gpu[pid] = self._gpu[pid] = engine.device.gpu_id
        self._transfer_s[pid] = seconds
        env = self.run.env
        env.call_at(env._now + seconds, ARRIVAL, lambda event: engine.join(event._value), pid)


def kv_bytes_per_token(run: RunContext, task: str, config: TaskConfig) -> float:
    """The KV-cache bytes of one token of ``task``: ``kv_bytes_per_token``, else its profile's
    ``kv_cache.bytes_per_token``; a :class:`ScenarioError` naming the setting without either."""
    if config.kv_bytes_per_token is not None:
        return float(config.kv_bytes_per_token)
    kv = run.task_profile(task).kv_cache
    if kv and "bytes_per_token" in kv:
        return float(kv["bytes_per_token"])
    raise ScenarioError(run.source, f"tasks.{task}", "kv_bytes_per_token",
                        "disaggregated serving moves each prompt's KV cache between GPUs and needs its size: set "
                        "kv_bytes_per_token (e.g. 131072 for Llama-3.1-8B in 16 bits), or give the profile's "
                        "kv_cache a bytes_per_token")
