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
  its admission (:class:`FixedGainRows`: heaps keyed by that iteration, by the iteration it
  needs its next KV block, and by its length for the longest row);
* where tokens are drawn per row (``spec_decode``, a fractional ``tokens_per_iteration``),
  the rows live in numpy arrays and each iteration is a few array operations
  (:class:`DrawnGainRows`);
* with an unlimited cache no blocks are counted at all (nothing can be preempted).

Either way the engine's random draws are the same, call for call: one ``tokens(rows)`` per
iteration with decoding rows (where tokens are drawn), then one ``step`` per iteration.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from heapq import heapify, heappop, heappush
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from simulator.errors import ScenarioError
from simulator.model.kernel import TIMER
from simulator.model.queues import QueueLimits
from simulator.model.resources import Batch, Device
from simulator.model.rules.prefix_cache import EnginePrefixes, PrefixCache
from simulator.model.topologies.base import TOPOLOGIES, Topology
from simulator.profile.iteration import StepCost, step_cost

if TYPE_CHECKING:
    from simulator.model.context import RunContext
    from simulator.scenario import TaskConfig


def _blocks(tokens: int, block_size: int) -> int:
    """KV blocks that hold ``tokens`` tokens."""
    return -(-tokens // block_size)


class FixedGainRows:
    """The running rows of an engine whose rows each commit ``gain`` tokens per iteration
    (a row's last iteration commits what it still lacks).

    Iterations are numbered from 1 by :meth:`start`. A row admitted (prefilled) in iteration
    ``a`` with ``d`` tokens already made has, after iteration ``i >= a``, made
    ``origin + gain·i`` tokens with ``origin = d + 1 − gain·a``, until it has them all; so
    the iteration it ends in, and the iterations its length crosses into a new KV block,
    are known when it is admitted. Rows are kept in admission order (the newest is
    preempted first); each admission is a new *stint* (a number increasing in admission
    order), and heap entries of a stint that ended (finished or preempted) are skipped
    when they surface. No work is done per running row per iteration.
    """

    def __init__(self, gain: int, prompt_tokens: list[int], max_tokens: list[int], block_size: int,
                 counts_blocks: bool) -> None:
        self.gain = gain
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.block_size = block_size
        self.counts_blocks = counts_blocks
        self.iteration = 0
        self.stint: dict[int, int] = {}   # running rows, in admission order -> their stint
        self.origin: dict[int, int] = {}  # tokens made after iteration i: origin + gain * i
        self._next_stint = 0
        self._first_new = 0  # the first stint admitted in the current iteration
        self._ends: list[tuple[int, int, int]] = []     # (iteration it ends in, stint, prompt)
        self._grows: list[tuple[int, int, int]] = []    # (iteration it needs another block, stint, prompt)
        self._longest: list[tuple[int, int, int]] = []  # (-(prompt tokens + origin), stint, prompt)
        self._widest: list[tuple[int, int, int]] = []   # (-(prompt tokens + max tokens), stint, prompt)

    def __len__(self) -> int:
        return len(self.stint)

    def start(self, rng: np.random.Generator) -> int:
        """Begin the next iteration; the rows that decode in it."""
        self.iteration += 1
        self._first_new = self._next_stint
        return len(self.stint)

    def reserve(self, free: int) -> tuple[int, list[tuple[int, int]]]:
        """Reserve the KV blocks the decoding rows grow into this iteration, preempting the
        newest rows while ``free`` blocks do not suffice: the blocks then free, and the
        preempted rows, newest first, as ``(prompt, tokens made)``."""
        j, g, bs = self.iteration, self.gain, self.block_size
        ptoks, mtoks, stint, origin = self.prompt_tokens, self.max_tokens, self.stint, self.origin
        grows = self._grows
        growing: dict[int, int] = {}
        extra = 0
        while grows and grows[0][0] <= j:
            _, number, pid = heappop(grows)
            if stint.get(pid) != number:
                continue
            made = origin[pid] + g * (j - 1)
            length = ptoks[pid] + made
            more = _blocks(length + min(g, mtoks[pid] - made), bs) - _blocks(length, bs)
            growing[pid] = more
            extra += more
        victims: list[tuple[int, int]] = []
        while extra > free:
            pid, _ = stint.popitem()
            extra -= growing.pop(pid, 0)
            made = origin.pop(pid) + g * (j - 1)
            free += _blocks(ptoks[pid] + made, bs)
            victims.append((pid, made))
        for pid in growing:
            made = origin[pid] + g * (j - 1)
            if mtoks[pid] - made > g:  # (a row that ends in this iteration grows no more)
                self._push_growth(pid, stint[pid], j + 1, ptoks[pid] + made + g)
        return free - extra, victims

    def _push_growth(self, pid: int, number: int, iteration: int, length: int) -> None:
        """A row that starts ``iteration`` with ``length`` tokens in its blocks: the first
        iteration from there whose tokens reach past its last block (none if it ends first)."""
        bs = self.block_size
        first_new = _blocks(length, bs) * bs + 1  # the first token of its next block
        if first_new <= self.prompt_tokens[pid] + self.max_tokens[pid]:
            heappush(self._grows, (iteration + (first_new - length - 1) // self.gain, number, pid))

    def bounds(self) -> tuple[int, int]:
        """The longest decoding row's tokens now, and the longest any of them may grow to."""
        if not self.stint:
            return 0, 0
        longest = self._top(self._longest)
        widest = self._top(self._widest)
        return self.gain * (self.iteration - 1) - longest, -widest

    def _top(self, heap: list[tuple[int, int, int]]) -> int:
        stint = self.stint
        if len(heap) > 2 * len(stint) + 64:
            # Drop the entries of ended stints now and then, so the heap stays O(rows).
            heap[:] = [e for e in heap if stint.get(e[2]) == e[1]]
            heapify(heap)
        while stint.get(heap[0][2]) != heap[0][1]:
            heappop(heap)
        return heap[0][0]

    def admit(self, pid: int, tokens: int, made: int) -> None:
        """Prefill a row of ``tokens`` tokens (``made`` of them generated before) this
        iteration; it makes its next token with it."""
        j, g = self.iteration, self.gain
        number = self._next_stint
        self._next_stint += 1
        self.stint[pid] = number
        made += 1
        self.origin[pid] = origin = made - g * j
        max_tokens = self.max_tokens[pid]
        ends = j if made >= max_tokens else j + -(-(max_tokens - made) // g)
        heappush(self._ends, (ends, number, pid))
        ptoks = self.prompt_tokens[pid]
        heappush(self._longest, (-(ptoks + origin), number, pid))
        heappush(self._widest, (-(ptoks + max_tokens), number, pid))
        if self.counts_blocks:
            self._push_growth(pid, number, j + 1, tokens + 1)

    def lengths(self) -> dict[int, int]:
        """Tokens in the cache (prompt and generated) of each running row between
        iterations, in admission order (O(rows): for inspection, not used per iteration)."""
        made = self.gain * self.iteration
        return {pid: self.prompt_tokens[pid] + self.origin[pid] + made for pid in self.stint}

    def finish(self, decoding: int) -> tuple[int, list[int]]:
        """The iteration ended: the tokens the ``decoding`` rows made, and the rows that now
        have all their tokens, in admission order (they leave)."""
        j, g = self.iteration, self.gain
        made = g * decoding
        finished: list[int] = []
        ends, stint, origin = self._ends, self.stint, self.origin
        while ends and ends[0][0] <= j:
            _, number, pid = heappop(ends)
            if stint.get(pid) != number:
                continue
            finished.append(pid)
            if number < self._first_new:  # a decoding row: its last gain is what it lacked
                made -= g - (self.max_tokens[pid] - origin[pid] - g * (j - 1))
            del stint[pid]
            del origin[pid]
        return made, finished


class DrawnGainRows:
    """The running rows of an engine whose rows' tokens per iteration are drawn (``tokens``
    of its :class:`StepCost`), in admission order, as numpy arrays of their tokens in the
    cache and their limit (prompt plus max tokens): each iteration is a few array
    operations, whatever the rows."""

    def __init__(self, cost: StepCost, prompt_tokens: list[int], max_tokens: list[int],
                 block_size: int) -> None:
        self.cost = cost
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.block_size = block_size
        self.prompts: list[int] = []
        self.length = np.zeros(16, dtype=np.int64)
        self.limit = np.zeros(16, dtype=np.int64)
        self.gains = np.zeros(0, dtype=np.int64)
        self._widest: int | None = 0  # the largest limit of the rows; None: to recompute

    def __len__(self) -> int:
        return len(self.prompts)

    def start(self, rng: np.random.Generator) -> int:
        """Begin the next iteration: draw the tokens each decoding row commits in it."""
        rows = len(self.prompts)
        if rows:
            self.gains = self.cost.tokens(rows, rng)
        return rows

    def reserve(self, free: int) -> tuple[int, list[tuple[int, int]]]:
        """As :meth:`FixedGainRows.reserve`."""
        rows, bs = len(self.prompts), self.block_size
        length = self.length[:rows]
        held = -(-length // bs)
        more = -(-(length + np.minimum(self.gains, self.limit[:rows] - length)) // bs) - held
        extra = int(more.sum())
        victims: list[tuple[int, int]] = []
        while extra > free:
            rows -= 1
            extra -= int(more[rows])
            free += int(held[rows])
            pid = self.prompts.pop()
            victims.append((pid, int(length[rows]) - self.prompt_tokens[pid]))
            self._widest = None
        return free - extra, victims

    def bounds(self) -> tuple[int, int]:
        """As :meth:`FixedGainRows.bounds`."""
        rows = len(self.prompts)
        if not rows:
            return 0, 0
        if self._widest is None:
            self._widest = int(self.limit[:rows].max())
        return int(self.length[:rows].max()), self._widest

    def admit(self, pid: int, tokens: int, made: int) -> None:
        """As :meth:`FixedGainRows.admit`."""
        rows = len(self.prompts)
        if rows == len(self.length):
            self.length = np.concatenate([self.length, np.zeros_like(self.length)])
            self.limit = np.concatenate([self.limit, np.zeros_like(self.limit)])
        self.length[rows] = tokens
        self.limit[rows] = self.prompt_tokens[pid] + self.max_tokens[pid]
        self.prompts.append(pid)
        self._widest = None

    def lengths(self) -> dict[int, int]:
        """As :meth:`FixedGainRows.lengths`."""
        return dict(zip(self.prompts, self.length[:len(self.prompts)].tolist(), strict=True))

    def finish(self, decoding: int) -> tuple[int, list[int]]:
        """As :meth:`FixedGainRows.finish`."""
        rows = len(self.prompts)
        length, limit = self.length, self.limit
        made = 0
        if decoding:
            step = np.minimum(self.gains[:decoding], limit[:decoding] - length[:decoding])
            length[:decoding] += step
            made = int(step.sum())
        if rows > decoding:
            length[decoding:rows] += 1
        done = length[:rows] >= limit[:rows]
        if not done.any():
            return made, []
        keep = ~done
        finished = [self.prompts[i] for i in np.flatnonzero(done).tolist()]
        kept = rows - len(finished)
        length[:kept] = length[:rows][keep]
        limit[:kept] = limit[:rows][keep]
        self.prompts = [p for p, k in zip(self.prompts, keep.tolist(), strict=True) if k]
        self._widest = None
        return made, finished


class _Rows:
    """What a device counts of an engine's iteration: ``len`` is its rows."""

    __slots__ = ("rows",)

    def __init__(self) -> None:
        self.rows = 0

    def __len__(self) -> int:
        return self.rows


def new_rows(cost: StepCost, ptoks: Any, mtoks: Any, block_size: int,
             counts_blocks: bool) -> FixedGainRows | DrawnGainRows:
    """An engine's running rows: kept by iteration number where every row commits a fixed
    number of tokens, in arrays where they are drawn (see the module docstring)."""
    gain = cost.fixed_tokens
    if gain is not None:
        return FixedGainRows(gain, ptoks, mtoks, block_size, counts_blocks)
    return DrawnGainRows(cost, ptoks, mtoks, block_size)


def iteration_boundary(engine: Any, ptoks: Any, on_preempt: Callable[[int], None]
                       ) -> tuple[int, list[int], list[int], int, int]:
    """Steps 1 and 2 of an iteration boundary (see the module docstring), for the model's
    engine and for the live server's alike (:mod:`simulator.serve.runtime`), so the two
    cannot drift apart: the running rows' tokens, preempting the newest while the cache is
    short (``on_preempt(pid)`` for each), else admissions. ``engine`` holds ``rows``,
    ``rng``, ``counts_blocks``, ``free_blocks``, ``outstanding_tokens``, ``resumed``,
    ``waiting``, ``block_size``, ``token_budget``, ``max_rows``, ``reads_lengths``,
    ``running``, ``prefix`` (an :class:`EnginePrefixes`, or ``None`` without prefix
    caching: an admitted prompt then prefills only what the cache lacks) and ``prefilled``
    (waiting prompts whose prefill ran on another engine, their KV cache transferred here:
    each joins as a decoding row, one token of the budget, no prefill; their number is left
    in ``engine.joined``). Returns ``(decoding rows, prefilled token counts, prompts
    prefilled for the first time, context, capacity)``."""
    rows = engine.rows
    # 1. tokens of the running rows, preempting the newest while the cache is short
    decoding = rows.start(engine.rng)
    preempted = False
    if decoding and engine.counts_blocks:
        engine.free_blocks, victims = rows.reserve(int(engine.free_blocks))
        if victims:
            preempted = True
            for pid, made in victims:  # newest first: the oldest ends up at the head
                on_preempt(pid)
                engine.outstanding_tokens += ptoks[pid] + made  # to recompute
                engine.resumed[pid] = made
                engine.waiting.appendleft(pid)
            decoding = len(rows)
    engine.running = decoding
    context, capacity = rows.bounds() if engine.reads_lengths else (0, 0)
    # 2. admissions
    prefill: list[int] = []
    fresh: list[int] = []
    joined = 0
    if not preempted:
        waiting, resumed, bs = engine.waiting, engine.resumed, engine.block_size
        budget = engine.token_budget - decoding
        room = engine.max_rows - decoding
        prefix, prefilled = engine.prefix, engine.prefilled
        while waiting and len(prefill) + joined < room:
            pid = waiting[0]
            made = resumed.get(pid, 0)
            tokens = ptoks[pid] + made
            moved = pid in prefilled
            if moved:
                cached, work = 0, 1  # it decodes: one token of the budget
            else:
                # what the prefill computes: the tokens not found in the prefix cache
                cached = prefix.cached_tokens(pid, tokens) if prefix is not None else 0
                work = tokens - cached
            if work > budget and (decoding or prefill or joined):
                break
            if engine.counts_blocks:
                blocks = _blocks(tokens + 1, bs)
                if blocks > engine.free_blocks:
                    break
                engine.free_blocks -= blocks
            waiting.popleft()
            if made:
                del resumed[pid]
            else:
                fresh.append(pid)
            rows.admit(pid, tokens, made)
            budget -= work
            if moved:
                prefilled.discard(pid)
                joined += 1
                if engine.reads_lengths:  # it decodes in this iteration: its length counts
                    context = max(context, tokens)
                    capacity = max(capacity, ptoks[pid] + rows.max_tokens[pid])
                continue
            if prefix is not None:
                prefix.admit(pid, cached, first=not made)
                engine.outstanding_tokens -= cached
            prefill.append(work)
    engine.joined = joined
    return decoding, prefill, fresh, context, capacity


class Engine:
    """One continuous-batching engine: a waiting line, a running batch, a KV cache.

    ``max_tokens``: the tokens each prompt makes here (the run's max tokens unless given:
    an engine that only prefills makes one)."""

    def __init__(self, run: RunContext, task: str, config: TaskConfig, device: Device, index: int,
                 max_tokens: Any = None) -> None:
        self.run = run
        self.max_tokens = run.max_tokens if max_tokens is None else max_tokens
        self.env = run.env
        self.task = task
        self.device = device
        self.name = f"{task}~{index}"
        self.max_rows = config.max_num_seqs
        self.token_budget = config.max_batched_tokens
        self.block_size = config.block_size
        kv = config.kv_blocks if config.kv_blocks is not None else run.task_profile(task).kv_blocks(config.block_size)
        self.total_blocks = kv if kv is not None else math.inf
        self.free_blocks = self.total_blocks
        self.counts_blocks = kv is not None  # an unlimited cache never preempts: nothing to count
        self.limits = QueueLimits.of(config)
        self.priority = config.priority
        self.cost = step_cost(run.task_profile(task), run.service_of(task))
        self.reads_lengths = self.cost.reads_lengths
        self.rng = run.service_rng(task)
        self.waiting: deque[int] = deque()
        self.resumed: dict[int, int] = {}  # tokens made before preemption, per preempted waiting prompt
        self.rows = new_rows(self.cost, run.prompt_tokens, self.max_tokens, config.block_size, self.counts_blocks)
        self.prefilled: set[int] = set()  # waiting prompts prefilled elsewhere (iteration_boundary)
        self.joined = 0  # of them, those admitted to the iteration in flight
        self.running = 0  # rows running, as the dispatch rules count them (not those being prefilled)
        self.busy = False
        self.outstanding_tokens = 0
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
        if _blocks(need, self.block_size) > self.total_blocks:
            raise ScenarioError(run.source, f"tasks.{self.task}", "kv_blocks",
                                f"a prompt of {run.prompt_tokens[pid]} + {self.max_tokens[pid]} tokens "
                                f"needs {_blocks(need, self.block_size)} KV blocks; the cache has {self.total_blocks}")
        return need

    def add(self, pid: int) -> None:
        run = self.run
        need = self.check_fits(pid)
        if self.limits.room(len(self.waiting), 1) == 0:
            run.turn_away([pid], "rejected")
            return
        self.waiting.append(pid)
        self.outstanding_tokens += need
        self.limits.watch(self.env, self._on_queue_timeout, pid)
        if not self.busy:
            self._start_soon()

    def _on_queue_timeout(self, event) -> None:
        pid = event._value
        run = self.run
        if run.batch_of[pid] >= 0:
            return  # admitted in time (a preempted prompt is not timed out again)
        if self.limits.drop:
            self.waiting.remove(pid)
            self.outstanding_tokens -= run.prompt_tokens[pid] + self.max_tokens[pid]
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
        made, finished = self.rows.finish(self._decoding)
        # decoding rows' tokens; each admitted row's prefill and the token it made
        self.outstanding_tokens -= made + self._admitted_tokens + self._admitted
        first_token_at = run.first_token_at
        for pid in self._fresh:
            first_token_at[pid] = now
        self.running = len(self.rows)
        if finished:
            if self.prefix is not None:
                for pid in finished:
                    self.prefix.release(pid)
            if self.counts_blocks:
                ptoks, mtoks, bs = run.prompt_tokens, self.max_tokens, self.block_size
                # a row ends with its prompt and max tokens (one token if it has none)
                self.free_blocks += sum(_blocks(ptoks[p] + max(mtoks[p], 1), bs) for p in finished)
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

    @property
    def outstanding(self) -> int:
        """Prompts waiting or running here."""
        return len(self.waiting) + self.running

    @property
    def waiting_count(self) -> int:
        """Prompts not yet admitted (recomputes included)."""
        return len(self.waiting)


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
