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

Bookkeeping. An iteration costs in proportion to what changes in it (rows admitted,
finished, preempted, or growing into a new KV block), not to the rows running:

* where every row commits the same fixed number of tokens ``g`` per iteration (the
  ``iteration`` kind, and the batch kinds with a whole ``tokens_per_iteration``), a row's
  tokens are a function of the iteration number, so the iteration it ends in is known at
  its admission (:class:`~simulator.model.rules.continuous.FixedGainRows`: heaps keyed by that iteration, by the iteration it
  needs its next KV block, and by its length for the longest row);
* where tokens are drawn per row (``spec_decode``, a fractional ``tokens_per_iteration``),
  the rows live in numpy arrays and each iteration is a few array operations
  (:class:`~simulator.model.rules.continuous.DrawnGainRows`);
* with an unlimited cache no blocks are counted at all (nothing can be preempted).

Either way the engine's random draws are the same, call for call: one ``tokens(rows)`` per
iteration with decoding rows (where tokens are drawn), then one ``step`` per iteration.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, cast

from simulator.errors import ScenarioError
from simulator.model.event_order import TIMER
from simulator.model.resources import Batch, Device
from simulator.model.rules.continuous import EngineState, iteration_boundary
from simulator.model.rules.prefix_cache import EnginePrefixes, PrefixCache
from simulator.model.topologies.base import TOPOLOGIES, Topology

__all__ = ["Continuous", "Engine", "prefix_cache_of"]

if TYPE_CHECKING:
    from simulator.model.context import RunContext
    from simulator.scenario import TaskConfig


class _Rows:
    """What a device counts of an engine's iteration: ``len`` is its rows."""

    __slots__ = ("rows",)

    def __init__(self) -> None:
        self.rows = 0

    def __len__(self) -> int:
        return self.rows


class Engine(EngineState):
    """One continuous-batching engine: a waiting line, a running batch, a KV cache (its
    state and rules: :class:`~simulator.model.rules.continuous.EngineState`).

    ``max_tokens``: the tokens each prompt makes here (the run's max tokens unless given:
    an engine that only prefills makes one)."""

    def __init__(self, run: RunContext, task: str, config: TaskConfig, device: Device, index: int,
                 max_tokens: Any = None) -> None:
        self.run = run
        self.env = run.env
        self.device = device
        super().__init__(task, config, run.task_profile(task), run.service_of(task), run.service_rng(task), index,
                         run.prompt_tokens, run.max_tokens if max_tokens is None else max_tokens)
        # The iteration in flight (one at a time): one Batch, reused, for the device.
        self._in_flight = _Rows()
        item = Batch(-1, task, self.name, cast("list[int]", self._in_flight), -1, 0.0, 0.0)
        item.priority = self.priority
        item.host_fraction = run.task_profile(task).host_fraction
        item.on_done = self._iteration_done
        self._item = item
        self._decoding = 0          # rows that decode in the iteration in flight
        self._admitted = 0          # rows it prefills ...
        self._admitted_tokens = 0   # ... and their tokens
        self._fresh: list[int] = []  # the prompts it prefills for the first time
        self.prefix = prefix_cache_of(run, task, config, self.total_blocks)

    # -- arrivals -----------------------------------------------------------------------
    def check_fits(self, pid: int) -> int:
        """The tokens prompt ``pid`` holds here at the most (prompt and max tokens); a
        :class:`ScenarioError` where they exceed the whole KV cache (it could never run)."""
        run = self.run
        need = run.prompt_tokens[pid] + self.max_tokens[pid]
        wanted = self.blocks_needed(need)
        if wanted is not None:
            raise ScenarioError(run.source, f"tasks.{self.task}", "kv_blocks",
                                f"a prompt of {run.prompt_tokens[pid]} + {self.max_tokens[pid]} tokens "
                                f"needs {wanted} KV blocks; the cache has {self.total_blocks}")
        return need

    def add(self, pid: int) -> None:
        run = self.run
        need = self.check_fits(pid)
        if not self.enqueue(pid, need):
            run.turn_away([pid], "rejected")
            return
        timeout_at = self.limits.deadline(self.env._now)
        if timeout_at is not None:
            self.env.call_at(timeout_at, TIMER, self._on_queue_timeout, pid)
        if not self.busy:
            self._start_soon()

    def _on_queue_timeout(self, event) -> None:
        pid = event._value
        run = self.run
        if run.batch_of[pid] >= 0:
            return  # admitted in time (a preempted prompt is not timed out again)
        if self.limits.drop:
            self.drop(pid)
            run.turn_away([pid], "dropped")
        else:
            run.status[pid] = "sent_after_timeout"

    def _start_soon(self) -> None:
        # The next iteration starts at this instant but after every arrival at it (TIMER
        # comes after ARRIVAL), so prompts arriving at a boundary, or with the same call,
        # join it.
        self.busy = True
        self.env.call_at(self.env._now, TIMER, self._iterate)

    # -- one iteration --------------------------------------------------------------------
    def _iterate(self, event=None) -> None:
        run = self.run

        prefix = self.prefix

        def preempted(pid: int) -> None:
            run.preemptions[pid] += 1
            if prefix is not None:
                prefix.release(pid)

        decoding, prefill, fresh, context, capacity = iteration_boundary(self, run.prompt_tokens, preempted)
        joined = self.joined  # rows prefilled elsewhere: they decode, priced as decoding rows
        if not decoding and not prefill and not joined:
            self.busy = False
            return
        work = self.cost.step(decoding + joined, prefill, context, self.rng, capacity)
        now = self.env._now
        item = self._item
        item.id = run.new_batch_id()
        item.formed_at = now
        item.work = item.first_token_work = work
        self._in_flight.rows = decoding + len(prefill) + joined
        self._decoding = decoding
        self._admitted = len(prefill) + joined
        self._admitted_tokens = sum(prefill)
        self._fresh = fresh
        if fresh:
            # The admission record: these prompts' batch in the event log.
            record = Batch(item.id, self.task, self.name, fresh, -1, now, work)
            record.started_at = now
            record.device = self.device.gpu_id
            run.batches.append(record)
            batch_of = run.batch_of
            for p in fresh:
                batch_of[p] = item.id
        self.busy = True
        self.device.submit(item)

    def _iteration_done(self, item: Batch) -> None:
        run = self.run
        now = self.env._now
        finished = self.end_iteration(self._decoding, self._admitted, self._admitted_tokens)
        first_token_at = run.first_token_at
        for pid in self._fresh:
            first_token_at[pid] = now
        if finished:
            if self.prefix is not None:
                for pid in finished:
                    self.prefix.release(pid)
            self.leave(finished)
        self._start_soon()

    def leave(self, finished: list[int]) -> None:
        """Rows that made all their tokens here left the engine now (their blocks freed):
        they are done."""
        run = self.run
        done_at, now = run.done_at, self.env._now
        for pid in finished:
            done_at[pid] = now
        run.prompts_finished(finished)


@TOPOLOGIES.register("continuous")
class Continuous(Topology):
    """An engine per device; prompts dispatched to engines by outstanding tokens."""

    name = "continuous"

    def __init__(self, run: RunContext, task: str, config: TaskConfig) -> None:
        super().__init__(run, task, config)
        devices = run.devices_for(task, config)
        self.engines = [Engine(run, task, config, d, i) for i, d in enumerate(devices)]
        self.rule = run.dispatch_rule(config, task)
        self.rng = run.dispatch_rng

    def accept(self, prompt_ids: list[int]) -> None:
        engines = self.engines
        for pid in prompt_ids:
            if len(engines) == 1:
                engines[0].add(pid)
            else:
                loads = self.rule.loads(engines, pid)
                engines[self.rule.choose(loads, self.rng)].add(pid)


def prefix_cache_of(run: RunContext, task: str, config: TaskConfig, kv_blocks: float) -> EnginePrefixes | None:
    """The prefix cache of one of ``task``'s engines (``None`` without ``prefix_caching``):
    ``prefix_cache_size`` of capacity, else the KV cache's (``kv_blocks`` of
    ``block_size``), else unlimited, in the trace's prefix blocks."""
    if not config.prefix_caching:
        return None
    chains, block_tokens = run.prefix_chains, run.prefix_block_tokens
    if chains is None or not (run.prefix_from_trace or config.system_tokens):
        raise ScenarioError(run.source, f"tasks.{task}", "prefix_caching",
                            "needs the prompts' prefix block ids, and the trace has none (Mooncake traces carry "
                            "them as hash_ids; simctl-trace/1 prompts as \"hash_ids\"), or a shared system "
                            "prompt (system_tokens)")
    if config.prefix_cache_size is not None:
        capacity: float = config.prefix_cache_size // block_tokens
    elif kv_blocks != math.inf:
        capacity = int(kv_blocks) * config.block_size // block_tokens
    else:
        capacity = math.inf
    return EnginePrefixes(PrefixCache(capacity, block_tokens), chains, run)
