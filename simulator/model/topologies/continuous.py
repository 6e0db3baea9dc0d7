"""``continuous``: iteration-level (continuous) batching, as vLLM schedules it.

Each prompt is dispatched on arrival to one engine, one per GPU (or one for a CPU pool), by
the task's dispatch rule: ``least-loaded`` compares prompts waiting or running,
``jsq-tokens`` outstanding tokens (prompt tokens still to prefill, recomputes included,
plus output tokens still to make). An engine runs one iteration after another while it holds prompts; at each
iteration boundary, in this order:

1. every running row will commit its next tokens (1, or 1 + accepted drafts with
   speculative decoding); if the KV cache lacks the blocks for them, the newest running
   row is preempted — its blocks freed, its tokens so far kept — and goes back to the head
   of the waiting line, to be recomputed later (vLLM's default); repeat until they fit;
2. if nothing was preempted, waiting prompts are admitted in order while the running batch
   has fewer than ``max_num_seqs`` rows, the iteration's token budget
   ``max_batched_tokens`` holds (a decoding row costs one token, an admitted prompt its
   prompt plus any tokens it recomputes; a prompt over budget runs only in an otherwise
   empty iteration) and the cache has blocks for its tokens plus one;
3. the iteration's time comes from the profile (:mod:`simulator.profile.iteration`); the
   iteration is submitted to the device as one unit of work, so engines of several tasks
   on one GPU take turns (``exclusive``, by priority) or share it (``processor-sharing``).

When the iteration ends, decoding rows gain their tokens, admitted rows their first token
(a recomputed row its next token); rows with all their tokens leave (``done_at``). The next
iteration starts at that instant, after any prompt arriving at it has joined the waiting
line. An engine with nothing to run is idle until a prompt arrives; then it starts at once.

Queue limits apply to an engine's waiting line: ``max_queue`` rejects a prompt that finds
that many waiting, ``queue_timeout`` drops (or marks) a prompt not admitted in time.

KV-cache capacity per engine: the task's ``kv_blocks``, else the profile's ``kv_cache``,
else unlimited; a row holds ceil(tokens in cache / ``block_size``) blocks.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

from simulator.errors import ScenarioError
from simulator.model.kernel import TIMER
from simulator.model.resources import Batch, Device
from simulator.model.topologies import TOPOLOGIES, Topology
from simulator.profile.iteration import step_cost

if TYPE_CHECKING:
    from simulator.model.engine import System
    from simulator.scenario import TaskConfig


class Engine:
    """One continuous-batching engine: a waiting line, a running batch, a KV cache."""

    def __init__(self, system: System, task: str, config: TaskConfig, device: Device, index: int) -> None:
        self.system = system
        self.env = system.env
        self.task = task
        self.device = device
        self.name = f"{task}~{index}"
        self.max_rows = config.max_num_seqs
        self.token_budget = config.max_batched_tokens
        self.block_size = config.block_size
        kv = config.kv_blocks if config.kv_blocks is not None else system.profile.tasks[task].kv_blocks(config.block_size)
        self.total_blocks = kv if kv is not None else math.inf
        self.free_blocks = self.total_blocks
        self.max_queue = config.max_queue
        self.queue_timeout = config.queue_timeout
        self.drop_on_timeout = config.timeout_action == "drop"
        self.priority = config.priority
        self.cost = step_cost(system.profile.tasks[task], system.service_of(task))
        self.rng = system.service_rng(task)
        self.waiting: deque[int] = deque()
        self.running: list[int] = []      # in admission order; the newest is preempted first
        self.generated: dict[int, int] = {}  # tokens made so far, per prompt in the engine
        self.blocks: dict[int, int] = {}     # KV blocks held, per running prompt
        self.busy = False
        self.outstanding_tokens = 0

    # -- arrivals -----------------------------------------------------------------------
    def add(self, pid: int) -> None:
        system = self.system
        need = system.prompt_tokens[pid] + system.max_tokens[pid]
        if self._blocks_for(need) > self.total_blocks:
            raise ScenarioError(system.scenario.source, f"tasks.{self.task}", "kv_blocks",
                                f"a prompt of {system.prompt_tokens[pid]} + {system.max_tokens[pid]} tokens "
                                f"needs {self._blocks_for(need)} KV blocks; the cache has {self.total_blocks}")
        if self.max_queue is not None and len(self.waiting) >= self.max_queue:
            system.turn_away([pid], "rejected")
            return
        self.waiting.append(pid)
        self.generated[pid] = 0
        self.outstanding_tokens += need
        if self.queue_timeout is not None:
            self.env.call_at(self.env._now + self.queue_timeout, TIMER, self._on_queue_timeout, pid)
        if not self.busy:
            self._start_soon()

    def _on_queue_timeout(self, event) -> None:
        pid = event._value
        system = self.system
        if system.batch_of[pid] >= 0:
            return  # admitted in time (a preempted prompt is not timed out again)
        if self.drop_on_timeout:
            self.waiting.remove(pid)
            self.outstanding_tokens -= system.prompt_tokens[pid] + system.max_tokens[pid]
            del self.generated[pid]
            system.turn_away([pid], "dropped")
        else:
            system.status[pid] = "sent_after_timeout"

    def _start_soon(self) -> None:
        # The next iteration starts at this instant but after every arrival at it (TIMER
        # comes after ARRIVAL), so prompts arriving at a boundary, or with the same call,
        # join it.
        self.busy = True
        self.env.call_at(self.env._now, TIMER, self._on_boundary)

    def _on_boundary(self, event) -> None:
        self._iterate()

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    # -- one iteration --------------------------------------------------------------------
    def _iterate(self) -> None:
        system = self.system
        ptoks, mtoks, generated = system.prompt_tokens, system.max_tokens, self.generated
        running = self.running
        # 1. tokens of the running rows, preempting the newest while the cache is short
        gains = list(map(int, self.cost.tokens(len(running), self.rng))) if running else []
        preempted = False
        while running:
            needs = [self._blocks_for(ptoks[pid] + generated[pid] + min(gain, mtoks[pid] - generated[pid]))
                     for pid, gain in zip(running, gains)]
            extra = sum(n - self.blocks[pid] for pid, n in zip(running, needs))
            if extra <= self.free_blocks:
                # Reserve them now, so admissions below cannot take them.
                for pid, n in zip(running, needs):
                    self.blocks[pid] = n
                self.free_blocks -= extra
                break
            victim = running.pop()
            gains.pop()
            self.free_blocks += self.blocks.pop(victim)
            system.preemptions[victim] += 1
            self.outstanding_tokens += ptoks[victim] + generated[victim]  # to recompute
            self.waiting.appendleft(victim)
            preempted = True
        # 2. admissions
        admitted: list[int] = []
        prefill: list[int] = []
        if not preempted:
            budget = self.token_budget - len(running)
            while self.waiting and len(running) + len(admitted) < self.max_rows:
                pid = self.waiting[0]
                tokens = ptoks[pid] + generated[pid]
                if tokens > budget and (running or admitted):
                    break
                blocks = self._blocks_for(tokens + 1)
                if blocks > self.free_blocks:
                    break
                self.waiting.popleft()
                self.free_blocks -= blocks
                self.blocks[pid] = blocks
                admitted.append(pid)
                prefill.append(tokens)
                budget -= tokens
        if not running and not admitted:
            self.busy = False
            return
        context = max((ptoks[p] + generated[p] for p in running), default=0)
        capacity = max((ptoks[p] + mtoks[p] for p in running), default=0)
        work = self.cost.step(len(running), prefill, context, self.rng, capacity)
        now = self.env._now
        item = Batch(system.new_batch_id(), self.task, self.name, running + admitted, -1, now, work)
        item.priority = self.priority
        item.host_fraction = system.profile.tasks[self.task].host_fraction
        item.on_done = self._iteration_done
        item.holder = (list(running), gains, admitted, prefill)
        if admitted:
            fresh = [p for p in admitted if system.batch_of[p] < 0]
            if fresh:
                # The admission record: these prompts' batch in the event log.
                record = Batch(item.id, self.task, self.name, fresh, -1, now, work)
                record.started_at = now
                record.device = self.device.gpu_id
                system.batches.append(record)
                for p in fresh:
                    system.batch_of[p] = item.id
        self.busy = True
        self.device.submit(item)

    def _iteration_done(self, item: Batch) -> None:
        system = self.system
        ptoks, mtoks, generated = system.prompt_tokens, system.max_tokens, self.generated
        decoded, gains, admitted, prefill = item.holder
        now = self.env._now
        finished: list[int] = []
        for pid, gain in zip(decoded, gains):
            gain = min(gain, mtoks[pid] - generated[pid])
            generated[pid] += gain
            self.outstanding_tokens -= gain
            if generated[pid] >= mtoks[pid]:
                finished.append(pid)
        for pid, tokens in zip(admitted, prefill):
            if generated[pid] == 0:
                system.first_token_at[pid] = now
            self.outstanding_tokens -= tokens + 1  # its prefill, and the token it made
            generated[pid] += 1
            if generated[pid] >= mtoks[pid]:
                finished.append(pid)
        self.running.extend(admitted)
        if finished:
            gone = set(finished)
            self.running = [p for p in self.running if p not in gone]
            for pid in finished:
                self.free_blocks += self.blocks.pop(pid)
                del generated[pid]
                system.done_at[pid] = now
            system.prompts_finished(finished)
        self._start_soon()

    @property
    def outstanding(self) -> int:
        """Prompts waiting or running here."""
        return len(self.waiting) + len(self.running)

    @property
    def waiting_count(self) -> int:
        """Prompts not yet admitted (recomputes included)."""
        return len(self.waiting)


@TOPOLOGIES.register("continuous")
class Continuous(Topology):
    """An engine per device; prompts dispatched to engines by outstanding tokens."""

    name = "continuous"

    def __init__(self, system: System, task: str, config: TaskConfig) -> None:
        super().__init__(system, task, config)
        devices = system.devices_for(task, config)
        self.engines = [Engine(system, task, config, d, i) for i, d in enumerate(devices)]
        self.rule = system.dispatch_rule(config, task)
        self.rng = system.dispatch_rng

    def accept(self, prompt_ids: list[int]) -> None:
        engines = self.engines
        for pid in prompt_ids:
            if len(engines) == 1:
                engines[0].add(pid)
            else:
                loads = self.rule.loads(engines)
                engines[self.rule.choose(loads, self.rng)].add(pid)
