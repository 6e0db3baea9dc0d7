"""Continuous-batching engines in the compiled event loop (:mod:`simulator.model.batch_kernel`).

The reference engine (:mod:`simulator.model.topologies.continuous`) written again over
arrays, for the kinds that price whole batches (``distribution`` and ``table``, whose
iteration costs :class:`~simulator.profile.iteration.BatchAverageCost` gives): the same
admission order, token budget, ``max_num_seqs``, KV blocks and preemption, the same draws
and the same order of operations, so the event log is the reference's exactly.

* An engine is a row of ``EI`` (one per GPU of a continuous task, or one on its CPU pool).
  Its waiting line is a singly linked list over prompts (``CW_NEXT``): prompts join at the
  tail, a preempted prompt goes back to the head. Its running rows sit in admission order
  in its own segment of ``R_PID``/``R_LEN``/``R_LIM`` (tokens in the cache, and prompt plus
  max tokens), as :class:`~simulator.model.topologies.continuous.DrawnGainRows` keeps them.
* An iteration is submitted to its device as the engine's own slot in the batch table (the
  last ``EI`` rows of ``BI``/``BF``): the device functions of the kernel start, line up and
  re-time it like any batch, and hand it back here when it ends (``_batch_done``).
* Batch ids come from one counter in event order, as in the reference; an iteration that
  admits no new prompt takes an id but leaves no row in the batch table, so it is counted
  in ``SKIP`` (skipped ids before each row), from which the caller rebuilds the ids.
* Where ``tokens_per_iteration`` is fractional, each decoding row's tokens are drawn per
  iteration (``whole + (u < frac)``) from the task's service stream; the uniforms ``u`` are
  drawn in bulk before the run (numpy's bulk ``random`` equals its one-by-one draws) into
  the task's segment of ``NOISE``. If a run needs more than were drawn it stops with
  ``CS[0] = 1`` and the caller runs it again with more.

This module and :mod:`~simulator.model.batch_kernel` call each other's functions, which
numba compiles into each caller; its cache checks only the caller's own file, so after
editing one of the two, touch the other (or clear their ``__pycache__``).
"""

from __future__ import annotations

from numba import njit

from simulator.model.batch_kernel import (
    BF_FORMED,
    BF_STARTED,
    BF_WORK,
    BI_DEVICE,
    BI_NAME,
    BI_OFF,
    BI_QUEUE,
    BI_SIZE,
    BI_TASK,
    BI_TOKENS,
    BI_WORKER,
    BI_WORKER_ID,
    FI_Q0,
    FI_Q1,
    FI_RULE,
    R_RANDOM,
    R_ROUND_ROBIN,
    S_REJECTED,
    TIMER,
    U_PROMPTS,
    U_TOKENS,
    _submit,
)

# Columns of the engine state EI.
EI_TASK, EI_DEVICE, EI_NAME, EI_MAXROWS, EI_BUDGET, EI_BS, EI_TOTAL, EI_FREE, EI_MAXQ, EI_BUSY, EI_OUT_TOKENS, \
    EI_RUNNING, EI_WHEAD, EI_WTAIL, EI_WAITING, EI_R0, EI_ROWS, EI_DECODING, EI_ADMITTED, EI_ADMITTED_TOKENS, \
    EI_RECORD, EI_SEQ = range(22)
EI_WIDTH = 22
# Columns of the per-task state CTI (ints) and CTF (floats).
CT_WHOLE = 0   # CTI: the whole tokens a decoding row commits per iteration
CT_FRAC = 0    # CTF: the fraction of one more token (0: none drawn)


@njit(cache=True, inline="always")
def _blocks(tokens, block_size):
    return (tokens + block_size - 1) // block_size


@njit(cache=True, inline="always")
def _slot0(st):
    """The batch-table row of engine 0's iteration slot."""
    return st.BI.shape[0] - st.EI.shape[0]


@njit(cache=True)
def accept(st, f, lo, hi, now):
    """Prompts ``order[lo:hi]`` (a call's group of a continuous task) go to engines now, one
    by one, each to the engine the task's dispatch rule chooses."""
    e0, e1 = st.FI[f, FI_Q0], st.FI[f, FI_Q1]
    rule = st.FI[f, FI_RULE]
    for k in range(lo, hi):
        e = e0 if e1 - e0 == 1 else e0 + _choose(st, rule, e0, e1 - e0)
        _add(st, e, st.order[k], now)


@njit(cache=True, inline="always")
def _choose(st, rule, e0, n):
    """The dispatch rule's choice among engines ``e0 .. e0 + n - 1`` (as DispatchRule.choose
    over the engines' loads)."""
    code = st.RULES[rule, 0]
    if code == R_ROUND_ROBIN:
        index = st.RULES[rule, 1] % n
        st.RULES[rule, 1] = index + 1
        return index
    if code == R_RANDOM:
        return st.rng.integers(0, n)
    unit = st.RULES[rule, 2]
    best = 0
    best_load = 0
    for i in range(n):
        e = e0 + i
        if unit == U_PROMPTS:
            load = st.EI[e, EI_WAITING] + st.EI[e, EI_RUNNING]
        elif unit == U_TOKENS:
            load = st.EI[e, EI_OUT_TOKENS]
        else:  # waiting
            load = st.EI[e, EI_WAITING]
        if i == 0 or load < best_load:
            best, best_load = i, load
    return best


@njit(cache=True)
def _add(st, e, p, now):
    """Prompt ``p`` joins engine ``e``'s waiting line (Engine.add)."""
    if st.EI[e, EI_MAXQ] >= 0 and st.EI[e, EI_WAITING] >= st.EI[e, EI_MAXQ]:
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
    not in it; the event loop takes whichever of the two comes first (:func:`iteration_first`)."""
    st.EI[e, EI_BUSY] = 1
    n = st.FIFO.shape[0]
    st.FIFO[(st.CS[1] + st.CS[2]) % n] = e
    st.CS[2] += 1
    st.FIFO_T[e] = now
    st.EI[e, EI_SEQ] = st.S[0]
    st.S[0] += 1


@njit(cache=True)
def iteration_first(st):
    """Whether the FIFO's first iteration comes before the heap's first event."""
    if len(st.heap) == 0:
        return True
    e = st.FIFO[st.CS[1]]
    top = st.heap[0]
    at = st.FIFO_T[e]
    if top[0] != at:
        return at < top[0]
    if top[1] != TIMER:
        return TIMER < top[1]
    return st.EI[e, EI_SEQ] < top[2]


@njit(cache=True)
def iterate_next(st):
    """Run the FIFO's first iteration boundary."""
    e = st.FIFO[st.CS[1]]
    st.CS[1] = (st.CS[1] + 1) % st.FIFO.shape[0]
    st.CS[2] -= 1
    iterate(st, e, st.FIFO_T[e])


@njit(cache=True)
def iterate(st, e, now):
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
            extra += _blocks(length + min(st.R_GAIN[i], st.R_LIM[i] - length), bs) - _blocks(length, bs)
        free = st.EI[e, EI_FREE]
        while extra > free:
            rows -= 1
            i = r0 + rows
            length = st.R_LEN[i]
            held = _blocks(length, bs)
            extra -= _blocks(length + min(st.R_GAIN[i], st.R_LIM[i] - length), bs) - held
            free += held
            # newest first, each to the head of the line: the oldest ends up first
            p = st.R_PID[i]
            made = length - st.ptok[p]
            st.PREEMPT[p] += 1
            st.EI[e, EI_OUT_TOKENS] += st.ptok[p] + made  # to recompute
            st.RESUMED[p] = made
            st.CW_NEXT[p] = st.EI[e, EI_WHEAD]
            st.EI[e, EI_WHEAD] = p
            if st.EI[e, EI_WTAIL] < 0:
                st.EI[e, EI_WTAIL] = p
            st.EI[e, EI_WAITING] += 1
            preempted = True
        st.EI[e, EI_FREE] = free - extra
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
            if tokens > budget and (decoding > 0 or admitted > 0):
                break
            if counts:
                blocks = _blocks(tokens + 1, bs)
                if blocks > st.EI[e, EI_FREE]:
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
    st.BF[slot, BF_WORK] = work
    st.EI[e, EI_DECODING] = decoding
    st.EI[e, EI_ADMITTED] = admitted
    st.EI[e, EI_ADMITTED_TOKENS] = admitted_tokens
    if fresh > 0:
        # The admission record: these prompts' batch in the event log.
        b = st.S[1]
        st.S[1] += 1
        st.S[3] += fresh
        st.BI[b, BI_TASK] = t
        st.BI[b, BI_NAME] = st.EI[e, EI_NAME]
        st.BI[b, BI_OFF] = off
        st.BI[b, BI_SIZE] = fresh
        st.BI[b, BI_WORKER_ID] = -1
        st.BI[b, BI_WORKER] = -1
        st.BI[b, BI_DEVICE] = st.EI[e, EI_DEVICE]
        st.BI[b, BI_QUEUE] = -1
        st.BI[b, BI_TOKENS] = 0
        st.BF[b, BF_FORMED] = now
        st.BF[b, BF_STARTED] = now
        st.BF[b, BF_WORK] = work
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
    while len(st.heap) > 0:
        st.heap.pop()


@njit(cache=True)
def iteration_done(st, e, now):
    """Engine ``e``'s iteration ended on its device (Engine._iteration_done)."""
    r0 = st.EI[e, EI_R0]
    rows = st.EI[e, EI_ROWS]
    decoding = st.EI[e, EI_DECODING]
    made = 0
    for i in range(r0, r0 + rows):
        if i - r0 < decoding:
            step = min(st.R_GAIN[i], st.R_LIM[i] - st.R_LEN[i])
            st.R_LEN[i] += step
            made += step
        else:
            st.R_LEN[i] += 1
    st.EI[e, EI_OUT_TOKENS] -= made + st.EI[e, EI_ADMITTED_TOKENS] + st.EI[e, EI_ADMITTED]
    b = st.EI[e, EI_RECORD]
    if b >= 0:
        off = st.BI[b, BI_OFF]
        for k in range(off, off + st.BI[b, BI_SIZE]):
            st.first_at[st.bp[k]] = now
    # rows with all their tokens leave, in admission order; the others keep their order
    counts = st.EI[e, EI_TOTAL] >= 0
    bs = st.EI[e, EI_BS]
    kept = r0
    for i in range(r0, r0 + rows):
        if st.R_LEN[i] >= st.R_LIM[i]:
            p = st.R_PID[i]
            st.done_at[p] = now
            if counts:
                # a row ends with its prompt and max tokens (one token if it has none)
                st.EI[e, EI_FREE] += _blocks(st.ptok[p] + max(st.mtok[p], 1), bs)
        else:
            if kept != i:
                st.R_PID[kept] = st.R_PID[i]
                st.R_LEN[kept] = st.R_LEN[i]
                st.R_LIM[kept] = st.R_LIM[i]
            kept += 1
    st.EI[e, EI_ROWS] = kept - r0
    st.EI[e, EI_RUNNING] = kept - r0
    _start_soon(st, e, now)


@njit(cache=True)
def init(st):
    """The engines' iteration slots in the batch table, before the run."""
    slot0 = _slot0(st)
    for e in range(st.EI.shape[0]):
        st.BI[slot0 + e, BI_TASK] = st.EI[e, EI_TASK]
        st.BI[slot0 + e, BI_TOKENS] = 0
        st.BI[slot0 + e, BI_QUEUE] = -1
        st.BI[slot0 + e, BI_WORKER] = -1
        st.BI[slot0 + e, BI_WORKER_ID] = -1
