"""The compiled event loop: the micro-batching model as integer-coded arrays, run by numba.

It is the reference engine (:mod:`simulator.model.engine`) written again over arrays, for
the configurations users sweep most (see :mod:`simulator.model.fast` for what it supports
and how a scenario is lowered to its arrays). It must give the reference's event log
exactly, so it copies the reference's order of operations, not just its rules:

* events are ordered by (instant, priority, order scheduled), the same three keys as
  :mod:`simulator.model.kernel` — ``COMPLETION`` < ``ARRIVAL`` < ``TIMER`` at one instant;
* a queue polls, times out and dispatches as :class:`~simulator.model.queues.BatchQueue`;
  a device starts and finishes batches as :class:`~simulator.model.resources.ServerPool`
  (exclusive GPUs, CPU pools) and :class:`~simulator.model.resources.RetimedGpu`
  (processor sharing), with the same floating-point operations in the same order;
* service draws take the task's pre-drawn standard variates in batch-formation order,
  which is the order the reference draws them from the task's stream (numpy's bulk draws
  equal its one-by-one draws); the iteration and spec_decode kinds draw from the task's
  stream itself as each batch forms (:mod:`simulator.model.kernel_service`); random
  dispatch draws from the run's dispatch stream.

Continuous-batching engines are a section of their own below (``EI`` and the functions
after it): their iterations are batches on these devices (an engine's own row of the batch
table), their iteration boundaries events of this loop.

Policies, dispatch rules and topologies are integer codes (``POLICY``, ``RULE``, ``FRONT``
in :mod:`simulator.model.fast`); a new one is added here and there, or the kernel refuses
the scenario (never a silent fallback to another rule).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.experimental import structref

from simulator.model import (
    dispatch,
    kernel_cache,  # noqa: F401  (the cache keyed on every kernel source)
)
from simulator.model.event_order import ARRIVAL, COMPLETION, TIMER
from simulator.model.kernel_layout import (
    BF_FORMED,
    BF_STARTED,
    BI_DEVICE,
    BI_NAME,
    BI_SIZE,
    BI_WORKER_ID,
    EI_ADMITTED,
    EI_ADMITTED_TOKENS,
    EI_BS,
    EI_BUDGET,
    EI_BUSY,
    EI_DECODING,
    EI_DEVICE,
    EI_FREE,
    EI_MAXQ,
    EI_MAXROWS,
    EI_NAME,
    EI_OUT_TOKENS,
    EI_R0,
    EI_RECORD,
    EI_ROWS,
    EI_RUNNING,
    EI_SEQ,
    EI_TASK,
    EI_TOTAL,
    EI_WAITING,
    EI_WHEAD,
    EI_WTAIL,
    SI_KIND,
    SK_BATCH,
)
from simulator.model.kernel_service import batch_service, task_stream
from simulator.model.rules import continuous as rules_continuous, queue as rules_queue
from simulator.profile.kinds.table import grid_mean as _grid_mean_py

#: The table kind's interpolation, compiled: the same function the reference engine calls.
grid_mean = njit(cache=True)(_grid_mean_py)
#: The batching policies' release rule, compiled: the functions BatchRelease calls.
window_end = njit(cache=True, inline="always")(rules_queue.window_end)
release_step = njit(cache=True, inline="always")(rules_queue.release_step)
#: The continuous engine's admission and preemption rules and block count, compiled: the functions the
#: reference's iteration boundary calls.
admits = njit(cache=True, inline="always")(rules_continuous.admits)
preempt_newest = njit(cache=True, inline="always")(rules_continuous.preempt_newest)
kv_blocks = njit(cache=True, inline="always")(rules_continuous.kv_blocks)
#: The queue limit, compiled: the function QueueLimits calls (its source is a kernel source too).
queue_room = njit(cache=True, inline="always")(rules_queue.queue_room)
#: The dispatch rules' choices, compiled: the functions the rule classes call.
round_robin_index = njit(cache=True, inline="always")(dispatch.round_robin_index)
least_loaded_index = njit(cache=True, inline="always")(dispatch.least_loaded_index)

# Event kinds; their priorities at one instant are simulator.model.kernel's (the reference's).
EV_ARRIVE, EV_SEND, EV_TIMER, EV_POOL_DONE, EV_SHARED_DONE = 0, 1, 2, 3, 4

# Codes shared with simulator.model.fast.
P_OLDEST, P_PICKUP, P_ADAPTIVE, P_STATIC = rules_queue.OLDEST, rules_queue.PICKUP, rules_queue.ADAPTIVE, rules_queue.STATIC
R_ROUND_ROBIN, R_LEAST_LOADED, R_RANDOM = 0, 1, 2
U_PROMPTS, U_TOKENS, U_WAITING = 0, 1, 2
F_SHARED, F_SPLIT, F_DIRECT, F_CONTINUOUS = 0, 1, 2, 3
D_POOL, D_SHARED = 0, 1
K_DETERMINISTIC, K_EXPONENTIAL, K_GAMMA, K_LOGNORMAL = 0, 1, 2, 3
S_SERVED, S_AFTER_TIMEOUT, S_REJECTED, S_DROPPED = 0, 1, 2, 3

# Columns of the queue state QI (ints) and QF (floats).
QI_POLICY, QI_MAXB, QI_UNLIMITED, QI_DL0, QI_DL1, QI_RULE, QI_UNBOUND, QI_IDLE0, QI_IDLE1, \
    QI_MAXQ, QI_STICKY, QI_TASK, QI_NAME, QI_HEAD, QI_TAIL, QI_WAITING, QI_IN_SERVICE, \
    QI_TOKENS, QI_WHEAD, QI_WTAIL, QI_SHARE0, QI_SHARE1 = range(22)
QF_FLUSH, QF_PICKUP, QF_TIMER, QF_TIMEOUT = range(4)
# Columns of the front state FI.
FI_KIND, FI_Q0, FI_Q1, FI_RULE, FI_PER_GROUP, FI_DL0, FI_DL1, FI_MAXB, FI_NAME, FI_TASK = range(10)
# Columns of the device state DI and DF.
DI_KIND, DI_SERVERS, DI_GPU, DI_BUSY, DI_OUT, DI_OUT_TOKENS, DI_VERSION, DI_RUN_HEAD, DI_RUN_TAIL, \
    DI_RUN_COUNT = range(10)
DF_UPDATED = 0
# Columns of the batch table BI and BF: simulator.model.kernel_layout.
# Columns of the working tables WI (int32), WF and WTOK (int64: a batch's tokens can pass
# 2**31): one row a slot, which a batch holds from its formation to its end and then frees
# for the next (SLOT: each batch's slot). At one batch a prompt (batches of one) a row per
# batch of these would be most of a large replay's memory; the slots in use at once are few.
WI_TASK, WI_OFF, WI_WORKER, WI_QUEUE, WI_NEXT, WI_PREV = range(6)
WF_WORK, WF_FIRST, WF_REMAINING = range(3)
#: Working slots allocated at the start (the tables double when every slot is held).
FIRST_SLOTS = 64
#: Events the heap holds at the start (its arrays double when full).
FIRST_EVENTS = 64
#: Events are ordered by instant, then by ``priority * ORDER_SPAN + order``: the priority,
#: then the order scheduled (below 2**56 events), as one integer.
ORDER_SPAN = 1 << 56


@structref.register
class RunType(types.StructRef):
    """The numba type of :class:`Run`."""

    def preprocess_fields(self, fields):
        return tuple((name, types.unliteral(typ)) for name, typ in fields)


class Run(structref.StructRefProxy):
    """The state of one kernel run, one object the kernel's functions share. Its arrays are
    read as ``st.QI[...]`` where they are used, not bound to local names: numba then pairs
    each reference count with its release in the same block and drops both (a local name
    held through a function costs an atomic count and release per call, which was most of
    the kernel's time)."""


#: Run's fields: the lowered scenario (see simulator.model.fast), then the run's state.
RUN_FIELDS = ("HT", "HK", "HKIND", "HA", "HB",  # the events (see _push)
              "S", "call_t", "call_g0", "g_start", "g_front", "order", "call_of", "ptok", "mtok", "FI",
              "QI", "QF", "WDEV", "WID", "W_NEXT", "DI", "DF", "DEVLIST", "RULES", "TK", "TMEAN", "TSCALE",
              "NOISE", "NOISE0", "noise_used", "TPI", "GRID", "GLEN", "GVAL", "GAXIS", "cold_until", "n_calls",
              "nxt", "bp", "BI", "BF", "SLOT", "WI", "WF", "WTOK", "FREE", "batch_of", "status", "done_at", "first_at", "rng",
              # the iteration and spec_decode kinds (simulator.model.kernel_service): per task
              # its parameters and its own service stream
              "SI", "SF", "SRNG",
              # continuous engines (their section below)
              "EI", "CTI", "CTF", "CSTEP", "RESUMED", "PREEMPT", "CW_NEXT", "R_PID", "R_LEN", "R_LIM", "R_GAIN",
              "R_MORE", "R_HELD", "SKIP", "CS", "FIFO", "FIFO_T",
              # scratch: the places' loads a least-loaded dispatch rule compares
              "LOADS")
structref.define_proxy(Run, RunType, list(RUN_FIELDS))


@njit(cache=True, inline="always")
def _mean(st, task, size, max_prompt, max_out):
    """The batch's mean service time: the distribution kind's table by size, or the table
    kind's interpolation (:func:`grid_mean`)."""
    if st.TK[task, 1] == 0:
        return st.TMEAN[task, size]
    point = np.zeros(3)
    for a in range(st.TK[task, 2]):
        code = st.GAXIS[task, a]
        point[a] = size if code == 0 else (max_prompt if code == 1 else max_out)
    return grid_mean(st.TK[task, 2], st.GRID[task], st.GLEN[task], st.GVAL[task], point, st.TMEAN[task, 0])


@njit(cache=True, inline="always")
def _rule_choice(st, rule, n):
    """Rule ``rule``'s choice among ``n`` places, by the rule's own functions
    (:mod:`simulator.model.dispatch`); a least-loaded rule reads the loads from ``LOADS``."""
    code = st.RULES[rule, 0]
    if code == R_ROUND_ROBIN:
        index = round_robin_index(st.RULES[rule, 1], n)
        st.RULES[rule, 1] = index + 1
        return index
    if code == R_RANDOM:
        return st.rng.integers(0, n)
    return least_loaded_index(st.LOADS, n)


@njit(cache=True, inline="always")
def _choose(st, rule, unit, places, n, loads_of_queue):
    """A dispatch rule's choice among ``places`` (queue or device indices), over their loads
    in the rule's unit."""
    code = st.RULES[rule, 0]
    if code != R_ROUND_ROBIN and code != R_RANDOM:
        for i in range(n):
            p = places[i]
            if loads_of_queue:
                if unit == U_PROMPTS:
                    st.LOADS[i] = st.QI[p, QI_WAITING] + st.QI[p, QI_IN_SERVICE]
                elif unit == U_TOKENS:
                    st.LOADS[i] = st.QI[p, QI_TOKENS]
                else:
                    st.LOADS[i] = st.QI[p, QI_WAITING]
            else:
                st.LOADS[i] = st.DI[p, DI_OUT_TOKENS] if unit == U_TOKENS else st.DI[p, DI_OUT]
    return _rule_choice(st, rule, n)


@njit(cache=True)
def run_kernel(call_t, call_g0, g_start, g_front, order, call_of, ptok, mtok, FI, QI, QF, WDEV, WID,
               DI, DF, DEVLIST, RULES, TK, TMEAN, TSCALE, NOISE, NOISE0, TPI, GRID, GLEN, GVAL, GAXIS,
               cold_until, n_workers0, rng, SI, SF, SRNG, EI, CTI, CTF, CSTEP, R_PID, CS):
    """Run to completion; returns the batch table and per-prompt outcome arrays (then the
    continuous engines': preemptions per prompt, skipped batch ids per row)."""
    n_prompts = len(call_of)
    n_calls = len(call_t)
    nan = math.nan
    # Per prompt: int32 where the values are prompt or batch ids (memory per prompt is what
    # bounds the largest trace).
    batch_of = np.full(n_prompts, -1, dtype=np.int32)
    done_at = np.full(n_prompts, nan)
    first_at = np.full(n_prompts, nan)
    status = np.zeros(n_prompts, dtype=np.int8)
    nxt = np.full(n_prompts, -1, dtype=np.int32)      # the queue's next waiting prompt
    bp = np.empty(n_prompts, dtype=np.int32)          # prompts of batch b: bp[off:off+size]
    # A batch holds at least one prompt: at most n_prompts batches (no growth needed); then
    # one row per continuous engine, its iteration in flight.
    BI = np.empty((max(n_prompts, 1) + EI.shape[0], 4), dtype=np.int32)
    BF = np.empty((max(n_prompts, 1) + EI.shape[0], 2))
    SLOT = np.empty(max(n_prompts, 1) + EI.shape[0], dtype=np.int32)
    slots = FIRST_SLOTS + EI.shape[0]
    FREE = np.arange(slots - 1, -1, -1).astype(np.int32)  # a stack, slot 0 on top
    W_NEXT = np.full(len(WDEV), -1, dtype=np.int64)   # next idle worker in its queue
    noise_used = np.zeros(TK.shape[0], dtype=np.int64)
    # Events, a binary heap in arrays (see _push): instant, priority and order, kind, a, b.
    S = np.zeros(7, dtype=np.int64)  # 0 event order, 1 batches, 2 workers, 3 bp used, 4 input closed,
    S[5] = slots                     # 5 free working slots (on FREE), 6 events on the heap
    S[2] = n_workers0
    n_queues = QI.shape[0]
    # The continuous engines' per-prompt state (none without engines: no memory per prompt):
    # preemptions and tokens made before the last, batch ids without a row before each row,
    # waiting lines.
    n_waiting = n_prompts if EI.shape[0] > 0 else 0
    preemptions = np.zeros(n_waiting, dtype=np.int32)
    resumed = np.zeros(n_waiting, dtype=np.int64)
    skipped = np.zeros(n_waiting + 1, dtype=np.int32)
    waiting_next = np.full(n_waiting, -1, dtype=np.int32)
    st = Run(np.empty(FIRST_EVENTS), np.empty(FIRST_EVENTS, dtype=np.int64), np.empty(FIRST_EVENTS, dtype=np.int64),
             np.empty(FIRST_EVENTS, dtype=np.int64), np.empty(FIRST_EVENTS),
             S, call_t, call_g0, g_start, g_front, order, call_of, ptok, mtok, FI, QI, QF, WDEV, WID, W_NEXT,
             DI, DF, DEVLIST, RULES, TK, TMEAN, TSCALE, NOISE, NOISE0, noise_used, TPI, GRID, GLEN, GVAL, GAXIS,
             cold_until, n_calls, nxt, bp, BI, BF, SLOT, np.empty((slots, 6), dtype=np.int32), np.empty((slots, 3)),
             np.empty(slots, dtype=np.int64), FREE, batch_of, status, done_at, first_at, rng, SI, SF, SRNG,
             EI, CTI, CTF, CSTEP, resumed, preemptions,
             waiting_next, R_PID, np.zeros(len(R_PID), dtype=np.int64),
             np.zeros(len(R_PID), dtype=np.int64), np.zeros(len(R_PID), dtype=np.int64),
             np.zeros(len(R_PID), dtype=np.int64), np.zeros(len(R_PID), dtype=np.int64), skipped, CS,
             np.zeros(max(EI.shape[0], 1), dtype=np.int64), np.zeros(max(EI.shape[0], 1)),
             np.zeros(max(len(DEVLIST), QI.shape[0], EI.shape[0], 1), dtype=np.int64))
    _continuous_init(st)

    # initial idle workers: each queue's range of worker indices, in order
    for q in range(n_queues):
        QI[q, QI_HEAD] = -1
        QI[q, QI_TAIL] = -1
        QI[q, QI_WHEAD] = -1
        QI[q, QI_WTAIL] = -1
        QF[q, QF_PICKUP] = nan
        QF[q, QF_TIMER] = nan
        for w in range(QI[q, QI_IDLE0], QI[q, QI_IDLE1]):
            _idle_push(st, q, w)
    for d in range(DI.shape[0]):
        DI[d, DI_RUN_HEAD] = -1
        DI[d, DI_RUN_TAIL] = -1

    if n_calls > 0:
        _push(st, call_t[0], ARRIVAL, EV_ARRIVE, 0, 0.0)
    while S[6] > 0 or CS[2] > 0:
        if CS[2] > 0 and _iteration_first(st):  # continuous engines' boundaries at this instant
            _iterate_next(st)
            continue
        now, kind, a, b = _pop(st)
        if kind == EV_ARRIVE:
            _send(st, a, now)
            if a + 1 < n_calls:
                _push(st, call_t[a + 1], ARRIVAL, EV_ARRIVE, a + 1, 0.0)
        elif kind == EV_SEND:
            _send(st, a, now)
        elif kind == EV_TIMER:
            if not (b == QF[a, QF_TIMER]):
                continue  # superseded: released earlier or the window moved
            QF[a, QF_TIMER] = nan
            _poll(st, a, now)
        elif kind == EV_POOL_DONE:
            _pool_finish(st, a, now)
        else:  # EV_SHARED_DONE
            if b != DI[a, DI_VERSION]:
                continue
            _shared_finish(st, a, now)
    # The tables as allocated, with their row count: the caller takes views of the rows used
    # (the pages of rows never written were never resident; a copy would double the rest).
    return BI, BF, S[1], batch_of, done_at, first_at, status, preemptions, skipped


@njit(cache=True, inline="always")
def _push(st, at, priority, kind, a, b):
    """Schedule an event: at instant ``at``, of ``priority`` (``COMPLETION`` < ``ARRIVAL`` <
    ``TIMER``), after every event scheduled before it with the same two; ``kind`` says what it
    is, ``a`` and ``b`` what it concerns.

    The heap is arrays (``HT`` instants, ``HK`` priority and order, ``HKIND``, ``HA``, ``HB``;
    ``S[6]`` events), one entry of each per event: numba's ``heapq`` over a list of tuples was
    about a sixth of a run. No two events have the same order, so events leave in the same
    sequence whatever heap holds them."""
    n = st.S[6]
    if n == st.HT.shape[0]:
        _grow_events(st)
    key = priority * ORDER_SPAN + st.S[0]
    st.S[0] += 1
    i = n
    while i > 0:  # (up from the new leaf while the parent comes later)
        up = (i - 1) >> 1
        if at < st.HT[up] or (at == st.HT[up] and key < st.HK[up]):
            _move_event(st, up, i)
            i = up
        else:
            break
    st.HT[i] = at
    st.HK[i] = key
    st.HKIND[i] = kind
    st.HA[i] = a
    st.HB[i] = b
    st.S[6] = n + 1


@njit(cache=True, inline="always")
def _pop(st):
    """Take the first event: ``(instant, kind, a, b)``."""
    at, kind, a, b = st.HT[0], st.HKIND[0], st.HA[0], st.HB[0]
    n = st.S[6] - 1
    st.S[6] = n
    if n > 0:  # the last entry sifted down from the top
        t, key = st.HT[n], st.HK[n]
        i = 0
        while True:
            c = 2 * i + 1
            if c >= n:
                break
            if c + 1 < n and (st.HT[c + 1] < st.HT[c] or (st.HT[c + 1] == st.HT[c] and st.HK[c + 1] < st.HK[c])):
                c += 1
            if st.HT[c] < t or (st.HT[c] == t and st.HK[c] < key):
                _move_event(st, c, i)
                i = c
            else:
                break
        _move_event(st, n, i)
    return at, kind, a, b


@njit(cache=True, inline="always")
def _move_event(st, source, target):
    st.HT[target] = st.HT[source]
    st.HK[target] = st.HK[source]
    st.HKIND[target] = st.HKIND[source]
    st.HA[target] = st.HA[source]
    st.HB[target] = st.HB[source]


@njit(cache=True)
def _grow_events(st):
    """The heap is full: double its arrays."""
    n = st.HT.shape[0]
    HT = np.empty(2 * n)
    HK = np.empty(2 * n, dtype=np.int64)
    HKIND = np.empty(2 * n, dtype=np.int64)
    HA = np.empty(2 * n, dtype=np.int64)
    HB = np.empty(2 * n)
    HT[:n] = st.HT
    HK[:n] = st.HK
    HKIND[:n] = st.HKIND
    HA[:n] = st.HA
    HB[:n] = st.HB
    st.HT = HT
    st.HK = HK
    st.HKIND = HKIND
    st.HA = HA
    st.HB = HB


@njit(cache=True, inline="always")
def _idle_push(st, q, w):
    st.W_NEXT[w] = -1
    if st.QI[q, QI_WTAIL] < 0:
        st.QI[q, QI_WHEAD] = w
    else:
        st.W_NEXT[st.QI[q, QI_WTAIL]] = w
    st.QI[q, QI_WTAIL] = w


@njit(cache=True)
def _send(st, ci, now):
    """A call is taken in: its groups go to their fronts (after the cold start)."""
    if now < st.cold_until:
        _push(st, st.cold_until, ARRIVAL, EV_SEND, ci, 0.0)
        st.S[0] += 1
        return
    for g in range(st.call_g0[ci], st.call_g0[ci + 1]):
        f = st.g_front[g]
        # int64 like every other prompt range: one compiled _add (and _continuous_accept) for all
        lo, hi = np.int64(st.g_start[g]), np.int64(st.g_start[g + 1])
        fk = st.FI[f, FI_KIND]
        if fk == F_SHARED:
            _add(st, st.FI[f, FI_Q0], lo, hi, now)
        elif fk == F_SPLIT:
            q0, q1 = st.FI[f, FI_Q0], st.FI[f, FI_Q1]
            places = np.arange(q0, q1)
            rule = st.FI[f, FI_RULE]
            if st.FI[f, FI_PER_GROUP]:
                q = q0 + _choose(st, rule, st.RULES[rule, 2], places, q1 - q0, True)
                _add(st, q, lo, hi, now)
            else:
                for k in range(lo, hi):
                    q = q0 + _choose(st, rule, st.RULES[rule, 2], places, q1 - q0, True)
                    _add(st, q, k, k + 1, now)
        elif fk == F_CONTINUOUS:
            _continuous_accept(st, f, lo, hi, now)
        else:  # F_DIRECT: batches of at most max_batch, each to a device chosen now
            size = st.FI[f, FI_MAXB]
            dl0, dl1 = st.FI[f, FI_DL0], st.FI[f, FI_DL1]
            for start in range(lo, hi, size):
                stop = min(start + size, hi)
                if dl1 - dl0 == 1:
                    device = st.DEVLIST[dl0]
                else:
                    rule = st.FI[f, FI_RULE]
                    device = st.DEVLIST[dl0 + _choose(st, rule, st.RULES[rule, 2], st.DEVLIST[dl0:dl1], dl1 - dl0, False)]
                for k in range(start, stop):
                    st.bp[st.S[3] + k - start] = st.order[k]
                b = _form(st, st.FI[f, FI_TASK], st.FI[f, FI_NAME], stop - start, -1, -1, -1, now)
                _submit(st, b, device, now)
    if ci == st.n_calls - 1:
        st.S[4] = 1
        for q in range(st.QI.shape[0]):
            _poll(st, q, now)


@njit(cache=True)
def _add(st, q, lo, hi, now):
    """Prompts ``order[lo:hi]`` join queue ``q`` now (as BatchQueue.add)."""
    room = queue_room(st.QI[q, QI_MAXQ], st.QI[q, QI_WAITING], hi - lo)
    if room < hi - lo:
        for k in range(lo + room, hi):
            st.status[st.order[k]] = S_REJECTED
        hi = lo + room
    if hi <= lo:
        return
    for k in range(lo, hi):
        p = st.order[k]
        if st.QI[q, QI_TAIL] < 0:
            st.QI[q, QI_HEAD] = p
        else:
            st.nxt[st.QI[q, QI_TAIL]] = p
        st.nxt[p] = -1
        st.QI[q, QI_TAIL] = p
        st.QI[q, QI_TOKENS] += st.ptok[p] + st.mtok[p]
    st.QI[q, QI_WAITING] += hi - lo
    _poll(st, q, now)


@njit(cache=True)
def _poll(st, q, now):
    """Release batches while prompts wait, a worker is idle and the policy says so."""
    while st.QI[q, QI_WAITING] > 0 and (st.QI[q, QI_WHEAD] >= 0 or st.QI[q, QI_UNLIMITED]):
        if math.isnan(st.QF[q, QF_PICKUP]):
            st.QF[q, QF_PICKUP] = now
        worker = st.QI[q, QI_WHEAD]
        waiting = st.QI[q, QI_WAITING]
        maxb = st.QI[q, QI_MAXB]
        flush = st.QF[q, QF_FLUSH]
        policy = st.QI[q, QI_POLICY]
        oldest = st.call_t[st.call_of[st.QI[q, QI_HEAD]]]
        share = 0.0
        if policy == P_ADAPTIVE and st.QI[q, QI_SHARE1] > st.QI[q, QI_SHARE0]:
            # only the adaptive window reads it
            share = _idle_share(st, q, -1 if worker < 0 else st.WDEV[worker])
        end = window_end(policy, flush, maxb, waiting, oldest, st.QF[q, QF_PICKUP], share)
        count, timer = release_step(waiting, maxb, end, now, st.QF[q, QF_TIMER], st.S[4] != 0)
        if count == 0:
            if not math.isnan(timer):
                st.QF[q, QF_TIMER] = timer
                _push(st, timer, TIMER, EV_TIMER, q, timer)
            return
        # release the first ``count`` waiting prompts
        off = st.S[3]
        p = st.QI[q, QI_HEAD]
        for k in range(count):
            st.bp[off + k] = p
            p = st.nxt[p]
        st.QI[q, QI_HEAD] = p
        if p < 0:
            st.QI[q, QI_TAIL] = -1
        st.QI[q, QI_WAITING] -= count
        st.QF[q, QF_PICKUP] = math.nan
        st.QF[q, QF_TIMER] = math.nan
        if worker >= 0:
            st.QI[q, QI_WHEAD] = st.W_NEXT[worker]
            if st.W_NEXT[worker] < 0:
                st.QI[q, QI_WTAIL] = -1
        else:  # a new worker of an unlimited queue
            worker = st.S[2]  # worker indices are the reference's worker ids
            st.S[2] += 1
            st.WID[worker] = worker
            st.WDEV[worker] = st.QI[q, QI_UNBOUND]
        device = st.WDEV[worker]
        if device < 0:
            rule = st.QI[q, QI_RULE]
            dl0, dl1 = st.QI[q, QI_DL0], st.QI[q, QI_DL1]
            if dl1 - dl0 == 1:
                device = st.DEVLIST[dl0]
            else:
                device = st.DEVLIST[dl0 + _choose(st, rule, st.RULES[rule, 2], st.DEVLIST[dl0:dl1], dl1 - dl0, False)]
            if st.QI[q, QI_STICKY]:
                st.WDEV[worker] = device
        b = _form(st, st.QI[q, QI_TASK], st.QI[q, QI_NAME], count, st.WID[worker], worker, q, now)
        st.QI[q, QI_IN_SERVICE] += count
        _submit(st, b, device, now)


@njit(cache=True, inline="always")
def _idle_share(st, q, chosen):
    """Share of the queue's GPUs other than ``chosen`` with nothing to run."""
    others = 0
    idle = 0
    for k in range(st.QI[q, QI_SHARE0], st.QI[q, QI_SHARE1]):
        d = st.DEVLIST[k]
        if d == chosen:
            continue
        others += 1
        if st.DI[d, DI_OUT] == 0:
            idle += 1
    if others == 0:
        return 0.0
    return idle / others


@njit(cache=True)
def _grow_slots(st):
    """Every working slot is held: double the working tables, the new slots on FREE."""
    n = st.WI.shape[0]
    WI = np.empty((2 * n, st.WI.shape[1]), dtype=np.int32)
    WI[:n] = st.WI
    WF = np.empty((2 * n, st.WF.shape[1]))
    WF[:n] = st.WF
    WTOK = np.empty(2 * n, dtype=np.int64)
    WTOK[:n] = st.WTOK
    FREE = np.empty(2 * n, dtype=np.int32)
    for k in range(n):
        FREE[k] = 2 * n - 1 - k  # (slot n on top)
    st.WI = WI
    st.WF = WF
    st.WTOK = WTOK
    st.FREE = FREE
    st.S[5] = n


@njit(cache=True, inline="always")
def _take_slot(st, b):
    """Give batch ``b`` a working slot: a freed one, else one of the grown tables'."""
    if st.S[5] == 0:
        _grow_slots(st)
    st.S[5] -= 1
    st.SLOT[b] = st.FREE[st.S[5]]


@njit(cache=True, inline="always")
def _free_slot(st, b):
    """Batch ``b`` has ended: its working slot goes back on FREE."""
    st.FREE[st.S[5]] = st.SLOT[b]
    st.S[5] += 1


@njit(cache=True, inline="always")
def _form(st, task, name, size, worker_id, worker, q, now):
    """Make a batch of ``bp[S[3]:S[3]+size]`` now and draw its service time."""
    b = st.S[1]
    st.S[1] += 1
    _take_slot(st, b)
    off = st.S[3]
    st.S[3] += size
    # typed int64 from the start, not the literal 0: numba would compile batch_service once
    # for the literal as well
    max_prompt = np.int64(0)
    max_out = np.int64(0)
    tokens = 0
    for k in range(off, off + size):
        p = st.bp[k]
        st.batch_of[p] = b
        if st.ptok[p] > max_prompt:
            max_prompt = st.ptok[p]
        if st.mtok[p] > max_out:
            max_out = st.mtok[p]
        tokens += st.ptok[p] + st.mtok[p]
    if st.SI[task, SI_KIND] != SK_BATCH:
        # iteration and spec_decode kinds: drawn now from the task's stream, rows in batch order
        rows = np.empty(size, dtype=np.int64)
        for k in range(size):
            rows[k] = st.mtok[st.bp[off + k]]
        work, first = batch_service(st.SI[task], st.SF[task], task_stream(st.SRNG, task), rows, max_prompt)
    else:
        work, first = _batch_kind_service(st, task, size, max_prompt, max_out)
    st.WI[st.SLOT[b], WI_TASK] = task
    st.BI[b, BI_NAME] = name
    st.WI[st.SLOT[b], WI_OFF] = off
    st.BI[b, BI_SIZE] = size
    st.BI[b, BI_WORKER_ID] = worker_id
    st.WI[st.SLOT[b], WI_WORKER] = worker
    st.BI[b, BI_DEVICE] = -1
    st.WI[st.SLOT[b], WI_QUEUE] = q
    st.WTOK[st.SLOT[b]] = tokens
    st.BF[b, BF_FORMED] = now
    st.BF[b, BF_STARTED] = math.nan
    st.WF[st.SLOT[b], WF_WORK] = work
    st.WF[st.SLOT[b], WF_FIRST] = first
    return b


@njit(cache=True, inline="always")
def _batch_kind_service(st, task, size, max_prompt, max_out):
    """(work, first-token offset) of a distribution or table batch: its mean, the noise of
    simulator.profile.noise.sample from the task's standard variates drawn in bulk, and the
    first token after the prefill and the first decoding iteration."""
    mean = _mean(st, task, size, max_prompt, max_out)
    dist = st.TK[task, 0]
    if dist == K_DETERMINISTIC:
        work = mean
    else:
        z = st.NOISE[st.NOISE0[task] + st.noise_used[task]]
        st.noise_used[task] += 1
        if dist == K_EXPONENTIAL:
            work = mean * z
        elif dist == K_GAMMA:
            work = (mean / st.TSCALE[task, 0]) * z
        else:  # lognormal: exp(log(mean) - s2/2 + sigma z)
            work = math.exp((math.log(mean) - st.TSCALE[task, 0] / 2.0) + st.TSCALE[task, 1] * z)
    iterations = math.ceil(max(max_out - 1, 0) / st.TPI[task]) + 1
    return work, work * min(2, iterations) / iterations


@njit(cache=True, inline="always")
def _link_insert(st, d, b, after):
    """Put batch ``b`` after ``after`` (-1: first) in device ``d``'s list (its line, or its
    running batches)."""
    before = st.DI[d, DI_RUN_HEAD] if after < 0 else st.WI[st.SLOT[after], WI_NEXT]
    st.WI[st.SLOT[b], WI_PREV] = after
    st.WI[st.SLOT[b], WI_NEXT] = before
    if after < 0:
        st.DI[d, DI_RUN_HEAD] = b
    else:
        st.WI[st.SLOT[after], WI_NEXT] = b
    if before < 0:
        st.DI[d, DI_RUN_TAIL] = b
    else:
        st.WI[st.SLOT[before], WI_PREV] = b
    st.DI[d, DI_RUN_COUNT] += 1


@njit(cache=True, inline="always")
def _link_remove(st, d, b):
    prev, nxt = st.WI[st.SLOT[b], WI_PREV], st.WI[st.SLOT[b], WI_NEXT]
    if prev < 0:
        st.DI[d, DI_RUN_HEAD] = nxt
    else:
        st.WI[st.SLOT[prev], WI_NEXT] = nxt
    if nxt < 0:
        st.DI[d, DI_RUN_TAIL] = prev
    else:
        st.WI[st.SLOT[nxt], WI_PREV] = prev
    st.DI[d, DI_RUN_COUNT] -= 1


@njit(cache=True, inline="always")
def _submit(st, b, d, now):
    """Device ``d`` takes batch ``b`` now (ServerPool.submit / RetimedGpu.submit)."""
    st.BI[b, BI_DEVICE] = d
    st.DI[d, DI_OUT] += st.BI[b, BI_SIZE]
    st.DI[d, DI_OUT_TOKENS] += st.WTOK[st.SLOT[b]]
    if st.DI[d, DI_KIND] == D_POOL:
        if st.DI[d, DI_SERVERS] < 0 or st.DI[d, DI_BUSY] < st.DI[d, DI_SERVERS]:
            _pool_start(st, b, d, now)
        else:
            # the line: by priority (higher first), FIFO within one
            after = st.DI[d, DI_RUN_TAIL]
            while after >= 0 and st.TK[st.WI[st.SLOT[after], WI_TASK], 3] < st.TK[st.WI[st.SLOT[b], WI_TASK], 3]:
                after = st.WI[st.SLOT[after], WI_PREV]
            _link_insert(st, d, b, after)
        return
    _shared_advance(st, d, now)
    st.BF[b, BF_STARTED] = now
    st.WF[st.SLOT[b], WF_REMAINING] = st.WF[st.SLOT[b], WF_WORK]
    _link_insert(st, d, b, st.DI[d, DI_RUN_TAIL])
    _shared_reschedule(st, d, now)


@njit(cache=True, inline="always")
def _pool_start(st, b, d, now):
    st.DI[d, DI_BUSY] += 1
    st.BF[b, BF_STARTED] = now
    _push(st, now + st.WF[st.SLOT[b], WF_WORK], COMPLETION, EV_POOL_DONE, b, 0.0)


@njit(cache=True, inline="always")
def _shared_advance(st, d, now):
    """Bring the remaining work of the device's running batches up to now."""
    n = st.DI[d, DI_RUN_COUNT]
    if n > 0:
        done = (now - st.DF[d, DF_UPDATED]) * (1.0 / n)
        b = st.DI[d, DI_RUN_HEAD]
        while b >= 0:
            st.WF[st.SLOT[b], WF_REMAINING] -= done
            b = st.WI[st.SLOT[b], WI_NEXT]
    st.DF[d, DF_UPDATED] = now


@njit(cache=True, inline="always")
def _shared_least(st, d):
    b = st.DI[d, DI_RUN_HEAD]
    least = st.WF[st.SLOT[b], WF_REMAINING]
    b = st.WI[st.SLOT[b], WI_NEXT]
    while b >= 0:
        if st.WF[st.SLOT[b], WF_REMAINING] < least:
            least = st.WF[st.SLOT[b], WF_REMAINING]
        b = st.WI[st.SLOT[b], WI_NEXT]
    return least


@njit(cache=True, inline="always")
def _shared_reschedule(st, d, now):
    st.DI[d, DI_VERSION] += 1
    n = st.DI[d, DI_RUN_COUNT]
    if n > 0:
        least = _shared_least(st, d)
        at = now + max(least, 0.0) / (1.0 / n)
        _push(st, at, COMPLETION, EV_SHARED_DONE, d, float(st.DI[d, DI_VERSION]))


# -- continuous engines ---------------------------------------------------------------------
# The reference engine's continuous batching (simulator/model/topologies/continuous.py)
# written again over arrays, for the kinds that price whole batches (``distribution`` and
# ``table``: the iteration costs of BatchAverageCost): the same admission order, token budget,
# ``max_num_seqs``, KV blocks and preemption, the same draws and the same order of operations,
# so the event log is the reference's exactly.
#
# * An engine is a row of ``EI`` (one per GPU of a continuous task, or one on its CPU pool).
#   Its waiting line is a singly linked list over prompts (``CW_NEXT``): prompts join at the
#   tail, a preempted prompt goes back to the head. Its running rows sit in admission order
#   in its own segment of ``R_PID``/``R_LEN``/``R_LIM`` (tokens in the cache, and prompt plus
#   max tokens), as the reference's ``DrawnGainRows`` keeps them.
# * An iteration is submitted to its device as the engine's own slot in the batch table (the
#   last ``EI`` rows of ``BI``/``BF``): the device functions above start, line up and re-time
#   it like any batch, and hand it back when it ends (``_batch_done``).
# * Its iteration boundaries are events ``(now, TIMER, order)``, always at the current
#   instant: they wait in a FIFO beside the heap, and the event loop takes whichever comes first.
# * Batch ids come from one counter in event order, as in the reference; an iteration that
#   admits no new prompt takes an id but leaves no row in the batch table, so it is counted
#   in ``SKIP`` (skipped ids before each row), from which the caller rebuilds the ids.
# * Where ``tokens_per_iteration`` is fractional, each decoding row's tokens are drawn per
#   iteration (``whole + (u < frac)``) from the task's service stream; the uniforms ``u`` are
#   drawn in bulk before the run (numpy's bulk ``random`` equals its one-by-one draws) into
#   the task's segment of ``NOISE``. If a run needs more than were drawn it stops with
#   ``CS[0] = 1`` and the caller runs it again with more.


# Columns of the engine state EI: simulator.model.kernel_layout.
# Columns of the per-task state CTI (ints) and CTF (floats).
CT_WHOLE = 0   # CTI: the whole tokens a decoding row commits per iteration
CT_FRAC = 0    # CTF: the fraction of one more token (0: none drawn)


@njit(cache=True, inline="always")
def _slot0(st):
    """The batch-table row of engine 0's iteration slot."""
    return st.BI.shape[0] - st.EI.shape[0]


@njit(cache=True)
def _continuous_accept(st, f, lo, hi, now):
    """Prompts ``order[lo:hi]`` (a call's group of a continuous task) go to engines now, one
    by one, each to the engine the task's dispatch rule chooses."""
    e0, e1 = st.FI[f, FI_Q0], st.FI[f, FI_Q1]
    rule = st.FI[f, FI_RULE]
    for k in range(lo, hi):
        e = e0 if e1 - e0 == 1 else e0 + _choose_engine(st, rule, e0, e1 - e0)
        _engine_add(st, e, st.order[k], now)


@njit(cache=True, inline="always")
def _choose_engine(st, rule, e0, n):
    """The dispatch rule's choice among engines ``e0 .. e0 + n - 1`` (as DispatchRule.choose
    over the engines' loads)."""
    code = st.RULES[rule, 0]
    if code != R_ROUND_ROBIN and code != R_RANDOM:
        unit = st.RULES[rule, 2]
        for i in range(n):
            e = e0 + i
            if unit == U_PROMPTS:
                st.LOADS[i] = st.EI[e, EI_WAITING] + st.EI[e, EI_RUNNING]
            elif unit == U_TOKENS:
                st.LOADS[i] = st.EI[e, EI_OUT_TOKENS]
            else:  # waiting
                st.LOADS[i] = st.EI[e, EI_WAITING]
    return _rule_choice(st, rule, n)


@njit(cache=True)
def _engine_add(st, e, p, now):
    """Prompt ``p`` joins engine ``e``'s waiting line (Engine.add)."""
    if queue_room(st.EI[e, EI_MAXQ], st.EI[e, EI_WAITING], 1) == 0:
        st.status[p] = S_REJECTED
        return
    st.CW_NEXT[p] = -1
    if st.EI[e, EI_WTAIL] < 0:
        st.EI[e, EI_WHEAD] = p
    else:
        st.CW_NEXT[st.EI[e, EI_WTAIL]] = p
    st.EI[e, EI_WTAIL] = p
    st.EI[e, EI_WAITING] += 1
    st.EI[e, EI_OUT_TOKENS] += st.ptok[p] + st.mtok[p]
    if st.EI[e, EI_BUSY] == 0:
        _start_soon(st, e, now)


@njit(cache=True, inline="always")
def _start_soon(st, e, now):
    """The next iteration starts at this instant, after every arrival at it: an event
    ``(now, TIMER, order)``. Such events are always at the current instant, so they wait in
    order in a FIFO beside the heap (``FIFO``, ``CS[1]`` its head, ``CS[2]`` its length),
    not in it; the event loop takes whichever of the two comes first (:func:`_iteration_first`)."""
    st.EI[e, EI_BUSY] = 1
    n = st.FIFO.shape[0]
    st.FIFO[(st.CS[1] + st.CS[2]) % n] = e
    st.CS[2] += 1
    st.FIFO_T[e] = now
    st.EI[e, EI_SEQ] = st.S[0]
    st.S[0] += 1


@njit(cache=True, inline="always")
def _iteration_first(st):
    """Whether the FIFO's first iteration comes before the heap's first event."""
    if st.S[6] == 0:
        return True
    e = st.FIFO[st.CS[1]]
    at = st.FIFO_T[e]
    if st.HT[0] != at:
        return at < st.HT[0]
    return TIMER * ORDER_SPAN + st.EI[e, EI_SEQ] < st.HK[0]


@njit(cache=True, inline="always")
def _iterate_next(st):
    """Run the FIFO's first iteration boundary."""
    e = st.FIFO[st.CS[1]]
    st.CS[1] = (st.CS[1] + 1) % st.FIFO.shape[0]
    st.CS[2] -= 1
    _iterate(st, e, st.FIFO_T[e])


@njit(cache=True)
def _iterate(st, e, now):
    """An iteration boundary of engine ``e`` (Engine._iterate)."""
    t = st.EI[e, EI_TASK]
    r0 = st.EI[e, EI_R0]
    rows = st.EI[e, EI_ROWS]
    bs = st.EI[e, EI_BS]
    counts = st.EI[e, EI_TOTAL] >= 0
    # 1. the tokens each running row commits this iteration (drawn where fractional) ...
    decoding = rows
    whole = st.CTI[t, CT_WHOLE]
    frac = st.CTF[t, CT_FRAC]
    if frac > 0.0 and rows > 0:
        used = st.noise_used[t]
        base = st.NOISE0[t]
        if base + used + rows > st.NOISE0[t + 1]:
            _out_of_draws(st)
            return
        for i in range(rows):
            st.R_GAIN[r0 + i] = whole + (1 if st.NOISE[base + used + i] < frac else 0)
        st.noise_used[t] = used + rows
    else:
        for i in range(rows):
            st.R_GAIN[r0 + i] = whole
    # ... preempting the newest rows while the cache lacks the blocks they grow into
    preempted = False
    if decoding > 0 and counts:
        extra = 0
        for i in range(r0, r0 + rows):
            length = st.R_LEN[i]
            held = kv_blocks(length, bs)
            st.R_HELD[i] = held
            st.R_MORE[i] = kv_blocks(length + min(st.R_GAIN[i], st.R_LIM[i] - length), bs) - held
            extra += st.R_MORE[i]
        left, free = preempt_newest(st.R_MORE[r0:r0 + rows], st.R_HELD[r0:r0 + rows], rows, extra, st.EI[e, EI_FREE])
        for i in range(r0 + rows - 1, r0 + left - 1, -1):
            # newest first, each to the head of the line: the oldest ends up first
            p = st.R_PID[i]
            made = st.R_LEN[i] - st.ptok[p]
            st.PREEMPT[p] += 1
            st.EI[e, EI_OUT_TOKENS] += st.ptok[p] + made  # to recompute
            st.RESUMED[p] = made
            st.CW_NEXT[p] = st.EI[e, EI_WHEAD]
            st.EI[e, EI_WHEAD] = p
            if st.EI[e, EI_WTAIL] < 0:
                st.EI[e, EI_WTAIL] = p
            st.EI[e, EI_WAITING] += 1
            preempted = True
        rows = left
        st.EI[e, EI_FREE] = free
        st.EI[e, EI_ROWS] = rows
        decoding = rows
    st.EI[e, EI_RUNNING] = decoding
    # 2. admissions, in line order, while rows, the token budget and the cache allow
    admitted = 0
    admitted_tokens = 0
    fresh = 0
    off = st.S[3]
    if not preempted:
        budget = st.EI[e, EI_BUDGET] - decoding
        room = st.EI[e, EI_MAXROWS] - decoding
        while st.EI[e, EI_WAITING] > 0 and admitted < room:
            p = st.EI[e, EI_WHEAD]
            made = st.RESUMED[p]
            tokens = st.ptok[p] + made
            blocks = kv_blocks(tokens + 1, bs) if counts else 0
            if not admits(tokens, budget, decoding > 0 or admitted > 0, counts, blocks, st.EI[e, EI_FREE]):
                break
            st.EI[e, EI_FREE] -= blocks
            head = st.CW_NEXT[p]
            st.EI[e, EI_WHEAD] = head
            if head < 0:
                st.EI[e, EI_WTAIL] = -1
            st.EI[e, EI_WAITING] -= 1
            if made:
                st.RESUMED[p] = 0
            else:
                st.bp[off + fresh] = p
                fresh += 1
            i = r0 + decoding + admitted
            st.R_PID[i] = p
            st.R_LEN[i] = tokens
            st.R_LIM[i] = st.ptok[p] + st.mtok[p]
            admitted += 1
            admitted_tokens += tokens
            budget -= tokens
        st.EI[e, EI_ROWS] = decoding + admitted
    if decoding == 0 and admitted == 0:
        st.EI[e, EI_BUSY] = 0
        return
    work = st.CSTEP[t, decoding + admitted]
    slot = _slot0(st) + e
    st.BI[slot, BI_SIZE] = decoding + admitted
    st.BF[slot, BF_FORMED] = now
    st.WF[st.SLOT[slot], WF_WORK] = work
    st.EI[e, EI_DECODING] = decoding
    st.EI[e, EI_ADMITTED] = admitted
    st.EI[e, EI_ADMITTED_TOKENS] = admitted_tokens
    if fresh > 0:
        # The admission record: these prompts' batch in the event log.
        b = st.S[1]
        st.S[1] += 1
        _take_slot(st, b)
        st.S[3] += fresh
        st.WI[st.SLOT[b], WI_TASK] = t
        st.BI[b, BI_NAME] = st.EI[e, EI_NAME]
        st.WI[st.SLOT[b], WI_OFF] = off
        st.BI[b, BI_SIZE] = fresh
        st.BI[b, BI_WORKER_ID] = -1
        st.WI[st.SLOT[b], WI_WORKER] = -1
        st.BI[b, BI_DEVICE] = st.EI[e, EI_DEVICE]
        st.WI[st.SLOT[b], WI_QUEUE] = -1
        st.WTOK[st.SLOT[b]] = 0
        st.BF[b, BF_FORMED] = now
        st.BF[b, BF_STARTED] = now
        st.WF[st.SLOT[b], WF_WORK] = work
        for k in range(off, off + fresh):
            st.batch_of[st.bp[k]] = b
        st.EI[e, EI_RECORD] = b
    else:
        st.SKIP[st.S[1]] += 1  # an id with no row: the next row's id is one higher
        st.EI[e, EI_RECORD] = -1
    st.EI[e, EI_BUSY] = 1
    _submit(st, slot, st.EI[e, EI_DEVICE], now)


@njit(cache=True)
def _out_of_draws(st):
    st.CS[0] = 1
    st.CS[2] = 0
    st.S[6] = 0  # (every event dropped)


@njit(cache=True)
def _iteration_done(st, e, now):
    """Engine ``e``'s iteration ended on its device (Engine._iteration_done)."""
    r0 = st.EI[e, EI_R0]
    rows = st.EI[e, EI_ROWS]
    decoding = st.EI[e, EI_DECODING]
    b = st.EI[e, EI_RECORD]
    if b >= 0:
        off = st.WI[st.SLOT[b], WI_OFF]
        for k in range(off, off + st.BI[b, BI_SIZE]):
            st.first_at[st.bp[k]] = now
        _free_slot(st, b)  # (the admission record: nothing reads its slot after)
    # decoding rows gain their tokens, admitted rows one; rows with all their tokens leave,
    # the others keep their order
    counts = st.EI[e, EI_TOTAL] >= 0
    bs = st.EI[e, EI_BS]
    made = 0
    kept = r0
    for i in range(r0, r0 + rows):
        length = st.R_LEN[i]
        if i - r0 < decoding:
            step = min(st.R_GAIN[i], st.R_LIM[i] - length)
            length += step
            made += step
        else:
            length += 1
        if length >= st.R_LIM[i]:
            p = st.R_PID[i]
            st.done_at[p] = now
            if counts:
                # a row ends with its prompt and max tokens (one token if it has none)
                st.EI[e, EI_FREE] += kv_blocks(st.ptok[p] + max(st.mtok[p], 1), bs)
        else:
            if kept != i:
                st.R_PID[kept] = st.R_PID[i]
                st.R_LIM[kept] = st.R_LIM[i]
            st.R_LEN[kept] = length
            kept += 1
    st.EI[e, EI_OUT_TOKENS] -= made + st.EI[e, EI_ADMITTED_TOKENS] + st.EI[e, EI_ADMITTED]
    st.EI[e, EI_ROWS] = kept - r0
    st.EI[e, EI_RUNNING] = kept - r0
    _start_soon(st, e, now)


@njit(cache=True)
def _continuous_init(st):
    """The engines' iteration slots in the batch table, before the run."""
    slot0 = _slot0(st)
    for e in range(st.EI.shape[0]):
        _take_slot(st, slot0 + e)
        st.WI[st.SLOT[slot0 + e], WI_TASK] = st.EI[e, EI_TASK]
        st.WTOK[st.SLOT[slot0 + e]] = 0
        st.WI[st.SLOT[slot0 + e], WI_QUEUE] = -1
        st.WI[st.SLOT[slot0 + e], WI_WORKER] = -1
        st.BI[slot0 + e, BI_WORKER_ID] = -1


# -- end of continuous engines -----------------------------------------------------------------


@njit(cache=True)
def _batch_done(st, b, now):
    """A batch finished: its prompts are done; its worker goes back to its queue's idle line."""
    if b >= st.BI.shape[0] - st.EI.shape[0]:  # a continuous engine's iteration
        _iteration_done(st, b - (st.BI.shape[0] - st.EI.shape[0]), now)
        return
    s = st.SLOT[b]
    start = st.BF[b, BF_STARTED]
    work = st.WF[s, WF_WORK]
    stretch = (now - start) / work if work > 0 else 1.0
    first = start + st.WF[s, WF_FIRST] * stretch
    off = st.WI[s, WI_OFF]
    for k in range(off, off + st.BI[b, BI_SIZE]):
        st.done_at[st.bp[k]] = now
        st.first_at[st.bp[k]] = first
    q = np.int64(st.WI[s, WI_QUEUE])  # (int64 as every queue index _poll gets: one compiled _poll)
    worker = st.WI[s, WI_WORKER]
    tokens = st.WTOK[s]
    _free_slot(st, b)  # (before _poll, which may form batches into it)
    if q < 0:
        return
    st.QI[q, QI_IN_SERVICE] -= st.BI[b, BI_SIZE]
    st.QI[q, QI_TOKENS] -= tokens
    _idle_push(st, q, worker)
    _poll(st, q, now)


@njit(cache=True)
def _pool_finish(st, b, now):
    d = st.BI[b, BI_DEVICE]
    st.DI[d, DI_BUSY] -= 1
    st.DI[d, DI_OUT] -= st.BI[b, BI_SIZE]
    st.DI[d, DI_OUT_TOKENS] -= st.WTOK[st.SLOT[b]]
    # The next waiting batch starts before the finished batch's worker is told.
    head = st.DI[d, DI_RUN_HEAD]
    if head >= 0:
        _link_remove(st, d, head)
        _pool_start(st, head, d, now)
    _batch_done(st, b, now)


@njit(cache=True)
def _shared_finish(st, d, now):
    _shared_advance(st, d, now)
    least = _shared_least(st, d)
    tolerance = 1e-9 * max(1.0, abs(least))
    finished = np.empty(st.DI[d, DI_RUN_COUNT], dtype=np.int64)
    n = 0
    b = st.DI[d, DI_RUN_HEAD]
    while b >= 0:
        following = st.WI[st.SLOT[b], WI_NEXT]
        if st.WF[st.SLOT[b], WF_REMAINING] <= least + tolerance:
            finished[n] = b
            n += 1
            _link_remove(st, d, b)
            st.DI[d, DI_OUT] -= st.BI[b, BI_SIZE]
            st.DI[d, DI_OUT_TOKENS] -= st.WTOK[st.SLOT[b]]
        b = following
    _shared_reschedule(st, d, now)
    for k in range(n):
        _batch_done(st, finished[k], now)


@njit(cache=True)
def group_prompts(call_start, task_of, rank, n_tasks):
    """The task groups of every call, in one pass over the prompts.

    A call's prompts of one task form a group; a call's groups come in the order of their
    tasks' ``rank`` (the scenario's group order), ties in the order the tasks first appear
    in the call; a group's prompts keep their order in the call. Returns the prompts in
    group order, each group's first index into that order (and the end), each group's task,
    and each call's first group (and the number of groups)."""
    n = len(task_of)
    n_calls = len(call_start) - 1
    order = np.empty(n, dtype=np.int32)  # (prompt and group ids: 32 bits, as batch_of)
    g_start = np.empty(n + 1, dtype=np.int32)
    g_front = np.empty(n, dtype=np.int32)
    call_g0 = np.empty(n_calls + 1, dtype=np.int32)
    seen = np.full(max(n_tasks, 1), -1, dtype=np.int64)  # the last call each task was seen in
    tasks = np.empty(max(n_tasks, 1), dtype=np.int64)
    k = 0
    g = 0
    for c in range(n_calls):
        call_g0[c] = g
        s = call_start[c]
        e = call_start[c + 1]
        d = 0
        for i in range(s, e):
            t = task_of[i]
            if seen[t] != c:
                seen[t] = c
                tasks[d] = t
                d += 1
        for a in range(1, d):  # stable insertion sort by rank: d is at most the task count
            x = tasks[a]
            b = a - 1
            while b >= 0 and rank[tasks[b]] > rank[x]:
                tasks[b + 1] = tasks[b]
                b -= 1
            tasks[b + 1] = x
        for j in range(d):
            t = tasks[j]
            g_start[g] = k
            g_front[g] = t
            g += 1
            for i in range(s, e):
                if task_of[i] == t:
                    order[k] = i
                    k += 1
    call_g0[n_calls] = g
    g_start[g] = k
    return order, g_start[:g + 1].copy(), g_front[:g].copy(), call_g0
