"""The continuous engine's rules: the running rows' bookkeeping, and what happens at an
iteration boundary (preemption while the KV cache is short, else admission), over an
engine's plain state (:class:`EngineState`).

The reference engine (:mod:`simulator.model.topologies.continuous`, whose module docstring
is the spec) and the live server's engine (:mod:`simulator.serve.runtime`) both keep their
state in an :class:`EngineState` and call :func:`iteration_boundary` and
:meth:`EngineState.end_iteration`, so the two cannot drift apart.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from heapq import heapify, heappop, heappush
from typing import Any

import numpy as np

from simulator.model.rules.prefix_cache import EnginePrefixes
from simulator.model.rules.queue import QueueLimits
from simulator.profile.iteration import StepCost, step_cost


def kv_blocks(tokens: int, block_size: int) -> int:
    """KV blocks that hold ``tokens`` tokens."""
    return -(-tokens // block_size)


def admits(work: int, budget: int, busy: bool, counts_blocks: bool, blocks: int, free_blocks: float) -> bool:
    """Whether the head of the waiting line joins this iteration: its ``work`` (the tokens its
    prefill computes) fits what is left of the token budget, unless nothing else runs or
    joined (``busy`` false: a prompt longer than the budget still runs, alone), and, where the
    engine counts its KV cache, its ``blocks`` (its tokens and the next one's) are free. A
    plain function of numbers: :func:`iteration_boundary` calls it and the compiled kernel
    compiles it."""
    if work > budget and busy:
        return False
    return not counts_blocks or blocks <= free_blocks


def preempt_newest(more: Any, held: Any, rows: int, extra: int, free: int) -> tuple[int, int]:
    """Which rows an iteration preempts: while the KV blocks the decoding rows grow into this
    iteration (``extra``, row ``i``'s share ``more[i]``) exceed the ``free`` blocks, the
    newest row goes, giving back the ``held[i]`` blocks it holds. Rows are indexed in
    admission order; returns the rows left (rows from there on are preempted) and the blocks
    free once the rest have grown. A plain function of numbers: the running rows' ``reserve``
    calls it and the compiled kernel compiles it."""
    while extra > free:
        rows -= 1
        extra -= more[rows]
        free += held[rows]
    return rows, free - extra


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
            more = kv_blocks(length + min(g, mtoks[pid] - made), bs) - kv_blocks(length, bs)
            growing[pid] = more
            extra += more
        victims: list[tuple[int, int]] = []
        if extra > free:
            # preempting: the rows in admission order, their tokens and blocks (only now: O(rows))
            order = list(stint)
            made_by = [origin[pid] + g * (j - 1) for pid in order]
            held = [kv_blocks(ptoks[pid] + m, bs) for pid, m in zip(order, made_by, strict=True)]
            left, free = preempt_newest([growing.get(pid, 0) for pid in order], held, len(order), extra, free)
            for k in range(len(order) - 1, left - 1, -1):  # newest first
                pid = order[k]
                del stint[pid]
                del origin[pid]
                growing.pop(pid, None)
                victims.append((pid, made_by[k]))
        else:
            free -= extra
        for pid in growing:
            made = origin[pid] + g * (j - 1)
            if mtoks[pid] - made > g:  # (a row that ends in this iteration grows no more)
                self._push_growth(pid, stint[pid], j + 1, ptoks[pid] + made + g)
        return free, victims

    def _push_growth(self, pid: int, number: int, iteration: int, length: int) -> None:
        """A row that starts ``iteration`` with ``length`` tokens in its blocks: the first
        iteration from there whose tokens reach past its last block (none if it ends first)."""
        bs = self.block_size
        first_new = kv_blocks(length, bs) * bs + 1  # the first token of its next block
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
        left, free = preempt_newest(more, held, rows, int(more.sum()), free)
        victims: list[tuple[int, int]] = []
        for k in range(rows - 1, left - 1, -1):  # newest first
            pid = self.prompts.pop()
            victims.append((pid, int(length[k]) - self.prompt_tokens[pid]))
            self._widest = None
        return int(free), victims

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
            blocks = kv_blocks(tokens + 1, bs) if engine.counts_blocks else 0
            if not admits(work, budget, bool(decoding or prefill or joined), engine.counts_blocks, blocks,
                          engine.free_blocks):
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


class EngineState:
    """What a continuous engine holds between iterations, for the rules here: its limits
    (``max_rows`` = ``max_num_seqs``, ``token_budget`` = ``max_batched_tokens``, KV blocks
    of ``block_size``: ``total_blocks`` from the task's ``kv_blocks``, else the profile's
    cache, else unlimited, and then not counted), its step cost and service stream, its
    waiting line (``resumed``: tokens made before preemption, per preempted waiting prompt;
    ``prefilled``: waiting prompts prefilled elsewhere), its running rows and the prompts'
    token columns it reads (``prompt_tokens``, ``max_tokens``, indexed by prompt number)."""

    def __init__(self, task: str, config: Any, task_profile: Any, service: Any, rng: np.random.Generator,
                 index: int, prompt_tokens: Any, max_tokens: Any) -> None:
        self.task = task
        self.name = f"{task}~{index}"
        self.max_rows = config.max_num_seqs
        self.token_budget = config.max_batched_tokens
        self.block_size = config.block_size
        kv = config.kv_blocks if config.kv_blocks is not None else task_profile.kv_blocks(config.block_size)
        self.total_blocks: float = kv if kv is not None else math.inf
        self.free_blocks: float = self.total_blocks
        self.counts_blocks = kv is not None  # an unlimited cache never preempts: nothing to count
        self.limits = QueueLimits.of(config)
        self.priority = config.priority
        self.cost = step_cost(task_profile, service)
        self.reads_lengths = self.cost.reads_lengths
        self.rng = rng
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.waiting: deque[int] = deque()
        self.resumed: dict[int, int] = {}
        self.rows = self.new_rows()
        self.prefix: EnginePrefixes | None = None  # (iteration_boundary)
        self.prefilled: set[int] = set()
        self.joined = 0  # of the prefilled, those admitted to the iteration in flight
        self.running = 0  # rows running, as the dispatch rules count them (not those being prefilled)
        self.busy = False
        self.outstanding_tokens = 0

    def new_rows(self) -> FixedGainRows | DrawnGainRows:
        """Empty running rows for this engine (:func:`new_rows`)."""
        return new_rows(self.cost, self.prompt_tokens, self.max_tokens, self.block_size, self.counts_blocks)

    def blocks_needed(self, need: int) -> int | None:
        """The KV blocks a prompt holding ``need`` tokens at the most takes, where they exceed
        the whole cache (it could never run); ``None`` where it fits."""
        wanted = kv_blocks(need, self.block_size)
        return wanted if wanted > self.total_blocks else None

    def enqueue(self, pid: int, need: int) -> bool:
        """Prompt ``pid`` (``need`` tokens at the most) arrives: whether it joins the waiting
        line (not when the line is full, ``max_queue``)."""
        if self.limits.room(len(self.waiting), 1) == 0:
            return False
        self.waiting.append(pid)
        self.outstanding_tokens += need
        return True

    def drop(self, pid: int) -> None:
        """Waiting prompt ``pid`` leaves the line unserved (``queue_timeout`` with ``drop``)."""
        self.waiting.remove(pid)
        self.outstanding_tokens -= self.prompt_tokens[pid] + self.max_tokens[pid]

    def end_iteration(self, decoding: int, admitted: int, admitted_tokens: int) -> list[int]:
        """The iteration in flight ended (``decoding`` rows decoded, ``admitted`` rows of
        ``admitted_tokens`` prefill tokens were admitted): the rows gain their tokens, and
        those with all their tokens leave, their blocks freed; they are returned, in
        admission order."""
        made, finished = self.rows.finish(decoding)
        # decoding rows' tokens; each admitted row's prefill and the token it made
        self.outstanding_tokens -= made + admitted_tokens + admitted
        self.running = len(self.rows)
        if finished and self.counts_blocks:
            ptoks, mtoks, bs = self.prompt_tokens, self.max_tokens, self.block_size
            # a row ends with its prompt and max tokens (one token if it has none)
            self.free_blocks += sum(kv_blocks(ptoks[p] + max(mtoks[p], 1), bs) for p in finished)
        return finished

    @property
    def outstanding(self) -> int:
        """Prompts waiting or running here (what ``least-loaded`` compares)."""
        return len(self.waiting) + self.running

    @property
    def waiting_count(self) -> int:
        """Prompts not yet admitted (recomputes included)."""
        return len(self.waiting)
