"""Service times of the ``iteration`` and ``spec_decode`` kinds in the compiled engine.

The compiled kernel (:mod:`simulator.model.batch_kernel`, ``_form``) asks
:func:`batch_service` for a batch's service time and the offset of its first token, from
the task's parameters lowered by :func:`lower_service` to one row of integers (``SI_*``)
and one of floats (``SF_*``), and from the task's own random stream (a
``numpy.random.Generator`` in the same state as the reference engine's, numba's draws being
numpy's). It repeats the reference's computation operation by operation, so both engines
get the same floats:

* ``iteration`` (:class:`~simulator.profile.kinds.iteration.IterationService`): each
  iteration's mean as ``_iteration_means`` computes it, one standard variate per iteration
  (exponential: ``mean × z``; gamma: ``(mean / k) × z``), summed as numpy sums an array
  (:func:`pairwise_sum`); the first token after ``work × (first two means) / (all means)``
  (:func:`~simulator.profile.iteration.first_token_seconds`);
* ``spec_decode`` (:class:`~simulator.profile.kinds.spec_decode.SpecDecodeService`): the
  accepted drafts of every iteration and row drawn in the reference's order (a truncated
  geometric), the iterations until the slowest row is done (``ragged`` or ``lockstep``),
  the batch time of ``time_for`` (or, without a KV cache, of ``_sample_no_cache``) and the
  first token after the prefill and the first decoding iteration. The cost forms are the
  kind's own functions (:func:`~simulator.profile.kinds.spec_decode.prefill_form` ...),
  compiled here.

The ``distribution`` and ``table`` kinds stay in the kernel's own ``_form`` (their noise
drawn in bulk before the run); their rows here say ``SK_BATCH`` and nothing else.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.extending import overload

from simulator.model import kernel_cache  # noqa: F401  (the cache keyed on every kernel source)
from simulator.model.kernel_layout import (
    D_DETERMINISTIC,
    D_EXPONENTIAL,
    SF_ACCEPTANCE,
    SF_BASE,
    SF_DRAFT_STEP,
    SF_GAMMA_K,
    SF_HOST_DRAFT,
    SF_HOST_PREFILL,
    SF_HOST_STEP,
    SF_HOST_VERIFY,
    SF_ITERATION,
    SF_PER_CONTEXT,
    SF_PER_PREFILL,
    SF_PER_ROW,
    SF_PREFILL_DRAFT,
    SF_PREFILL_TARGET,
    SF_ROW_S,
    SF_VERIFY,
    SI_DIST,
    SI_ENGINE,
    SI_KIND,
    SI_KV_CACHE,
    SI_LOCKSTEP,
    SI_LOOKAHEAD,
    SI_OVERLAP,
    SI_STAY,
    SI_VIEW_STEP,
    SK_ITERATION,
)
from simulator.profile.kinds.spec_decode import (
    iteration_form as _iteration_form_py,
    prefill_form as _prefill_form_py,
    step_form as _step_form_py,
)

#: The spec_decode kind's cost forms, compiled: the same functions the reference engine calls.
prefill_form = njit(cache=True)(_prefill_form_py)
step_form = njit(cache=True)(_step_form_py)
iteration_form = njit(cache=True)(_iteration_form_py)

def task_stream(srng, task):
    """Task ``task``'s service stream in the kernel: ``srng[task]`` of a typed list, or the
    one generator (see :func:`simulator.model.compiled.run_kernel`)."""
    raise NotImplementedError("compiled only")


@overload(task_stream)
def _task_stream(srng, task):
    if isinstance(srng, types.ListType):
        return lambda srng, task: srng[task]
    return lambda srng, task: srng


@njit(cache=True, inline="always")
def _block_sum(a, lo, n):
    """numpy's sum of at most 128 contiguous float64 values: eight running partial sums."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    end = n - n % 8
    while i < end:
        j = lo + i
        r0 += a[j]
        r1 += a[j + 1]
        r2 += a[j + 2]
        r3 += a[j + 3]
        r4 += a[j + 4]
        r5 += a[j + 5]
        r6 += a[j + 6]
        r7 += a[j + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@njit(cache=True)
def pairwise_sum(a, lo, n):
    """``a[lo:lo+n].sum()`` as numpy sums a contiguous float64 array (its ``pairwise_sum``):
    blocks of at most 128 values in eight running partial sums; a longer run is split in two
    (the first part a multiple of 8 long) and the parts' sums added. The recursion runs on an
    explicit stack (numba's cache does not keep recursive functions safely)."""
    if n <= 128:
        return _block_sum(a, lo, n)
    los = np.empty(64, dtype=np.int64)
    ns = np.empty(64, dtype=np.int64)
    phase = np.zeros(64, dtype=np.int64)   # 0: not split yet, 1: left part running, 2: right part running
    left = np.empty(64)
    sp = 0
    los[0], ns[0] = lo, n
    while True:
        m = ns[sp]
        if m > 128:
            half = m // 2
            half -= half % 8
            phase[sp] = 1
            sp += 1
            los[sp], ns[sp], phase[sp] = los[sp - 1], half, 0
            continue
        value = _block_sum(a, los[sp], m)
        sp -= 1
        while True:  # hand the value up
            if phase[sp] == 1:
                left[sp] = value
                phase[sp] = 2
                half = ns[sp] // 2
                half -= half % 8
                los[sp + 1], ns[sp + 1], phase[sp + 1] = los[sp] + half, ns[sp] - half, 0
                sp += 1
                break
            value = left[sp] + value
            sp -= 1
            if sp < 0:
                return value


@njit(cache=True)
def iteration_means(si, sf, rows, P):
    """Each iteration's mean seconds of a static batch (IterationService._iteration_means)."""
    size = len(rows)
    longest = 0
    for m in rows:
        longest = max(longest, m)
    running = np.empty(longest, dtype=np.int64)
    if si[SI_STAY]:
        running[:] = size
    else:
        # rows still running in iteration i: those with more than i tokens to make
        ending = np.zeros(longest + 1, dtype=np.int64)
        for m in rows:
            if m > 0:
                ending[m] += 1
        left = np.sum(ending)  # rows with m > 0
        for i in range(longest):
            left -= ending[i]
            running[i] = left
    means = np.empty(longest)
    base, per_row, per_context = sf[SF_BASE], sf[SF_PER_ROW], sf[SF_PER_CONTEXT]
    for i in range(longest):
        means[i] = base + per_row * running[i]
    if per_context != 0.0:
        for i in range(longest):
            means[i] = means[i] + per_context * running[i] * (P + i)
    if longest > 0:
        means[0] += sf[SF_PER_PREFILL] * size * P
    if si[SI_ENGINE]:
        row_s = sf[SF_ROW_S]
        for i in range(longest):
            host = (sf[SF_HOST_PREFILL] if i == 0 else sf[SF_HOST_STEP]) + row_s * float(running[i])
            means[i] = _combine(si, means[i], host)
    return means


@njit(cache=True, inline="always")
def _combine(si, gpu, host):
    """EngineOverhead.combine: ``max(host, gpu)`` with overlap, else ``gpu + host``."""
    if si[SI_OVERLAP]:
        return max(gpu, host)
    return gpu + host


@njit(cache=True, inline="always")
def _passes(si, sf, column, gpu):
    """SpecDecodeService.passes: a pass of ``gpu`` kernel seconds with the engine's host time
    for that pass (``column``: SF_HOST_*; no per-row term)."""
    if si[SI_ENGINE] == 0:
        return gpu
    return _combine(si, gpu, sf[column] + sf[SF_ROW_S] * 0.0)


@njit(cache=True, inline="always")
def _round_overhead(si, sf, rows):
    return 0.0 if si[SI_ENGINE] == 0 else sf[SF_ROW_S] * float(rows)


@njit(cache=True)
def iteration_batch(si, sf, rng, rows, P):
    """(work, first-token offset) of an iteration-kind batch (IterationService.sample and
    first_token_seconds)."""
    means = iteration_means(si, sf, rows, P)
    n = len(means)
    dist = si[SI_DIST]
    if dist == D_DETERMINISTIC:
        work = pairwise_sum(means, 0, n)
    else:
        drawn = np.empty(n)
        if dist == D_EXPONENTIAL:
            for i in range(n):
                drawn[i] = means[i] * rng.standard_exponential()
        else:
            k = sf[SF_GAMMA_K]
            for i in range(n):
                drawn[i] = (means[i] / k) * rng.standard_gamma(k)
        work = pairwise_sum(drawn, 0, n)
    first_mean = pairwise_sum(means, 0, min(n, 2))
    share = first_mean / pairwise_sum(means, 0, n)
    return work, work * share


@njit(cache=True)
def draw_accepted(sf, k, rng, horizon, size):
    """Accepted drafts ``[iteration, row]`` (spec_decode.draw_accepted), drawn row-major."""
    alpha = sf[SF_ACCEPTANCE]
    accepted = np.empty((horizon, size), dtype=np.int64)
    if alpha >= 1:
        accepted[:, :] = k
    elif alpha <= 0:
        accepted[:, :] = 0
    else:
        p = 1.0 - alpha
        for i in range(horizon):
            for b in range(size):
                accepted[i, b] = min(rng.geometric(p) - 1, k)
    return accepted


@njit(cache=True)
def iterations_needed(needs, accepted, lockstep):
    """spec_decode.iterations_needed: iterations until every row has its ``needs``."""
    size = len(needs)
    horizon = accepted.shape[0]
    most = 0
    for b in range(size):
        most = max(most, needs[b])
    if most <= 0:
        return 0
    if not lockstep:
        its = 0
        for b in range(size):
            if needs[b] <= 0:
                continue
            made = 0
            done_at = 0  # np.argmax of no True
            for i in range(horizon):
                made += accepted[i, b] + 1
                if made >= needs[b]:
                    done_at = i
                    break
            its = max(its, done_at + 1)
        return its
    # lockstep: all unfinished rows commit min(n) + 1; go from one finishing row to the next
    remaining = needs.copy()
    t = 0
    while True:
        least = -1
        for b in range(size):
            if remaining[b] > 0 and (least < 0 or remaining[b] < least):
                least = remaining[b]
        if least < 0:
            return t
        progress = 0
        first = -1
        first_progress = 0
        if t >= horizon:  # every iteration commits a token to every row: unreachable
            raise ValueError("spec_decode lockstep: rows left after the last drawn iteration")
        for j in range(t, horizon):
            step = -1
            for b in range(size):
                if remaining[b] > 0 and (step < 0 or accepted[j, b] < step):
                    step = accepted[j, b]
            progress += step + 1
            if j == t:
                first_progress = progress
            if progress >= least:
                first = j - t
                break
        if first < 0:  # np.argmax of no True: the first step
            first, progress = 0, first_progress
        for b in range(size):
            if remaining[b] > 0:
                remaining[b] -= progress
        t += first + 1


@njit(cache=True)
def spec_decode_time_for(si, sf, B, P, iterations, max_new):
    """SpecDecodeService.time_for: seconds of a batch that ran ``iterations`` iterations."""
    k = si[SI_LOOKAHEAD]
    Bf, Pf = float(B), float(P)
    t = _passes(si, sf, SF_HOST_PREFILL, prefill_form(sf[SF_PREFILL_TARGET:], Bf, Pf)) \
        + _passes(si, sf, SF_HOST_DRAFT, prefill_form(sf[SF_PREFILL_DRAFT:], Bf, Pf))
    if iterations == 0:
        return t
    s_max = float(P + max_new + 2 * (k + 1))
    view_step = si[SI_VIEW_STEP]
    per_iter = np.empty(iterations)
    for i in range(iterations):
        bound = min(P + i * (k + 1), P + max_new + k + 1)
        view = min(s_max, view_step * np.ceil((bound + k + 1) / view_step))
        per_iter[i] = _decode_seconds(si, sf, Bf, view)
    return t + pairwise_sum(per_iter, 0, iterations)


@njit(cache=True, inline="always")
def _decode_seconds(si, sf, rows, view):
    """One decoding iteration of ``rows`` rows at cache view ``view`` (time_for's per-iteration
    terms; SpecDecodeCost._decode_seconds)."""
    k = si[SI_LOOKAHEAD]
    return (_passes(si, sf, SF_HOST_DRAFT, step_form(sf[SF_DRAFT_STEP:], rows, 2.0, view))
            + (k - 1) * _passes(si, sf, SF_HOST_DRAFT, step_form(sf[SF_DRAFT_STEP:], rows, 1.0, view))
            + _passes(si, sf, SF_HOST_VERIFY, step_form(sf[SF_VERIFY:], rows, float(k + 1), view))
            + iteration_form(sf[SF_ITERATION:], float(k)) + _round_overhead(si, sf, rows))


@njit(cache=True)
def spec_decode_no_cache(si, sf, rng, needs, P):
    """SpecDecodeService._sample_no_cache: ragged rounds without a KV cache."""
    k = si[SI_LOOKAHEAD]
    size = len(needs)
    # counters start as int64, not the literal 0: numba would compile a callee for the literal too
    horizon = np.int64(0)
    for b in range(size):
        horizon = max(horizon, needs[b])
    if horizon <= 0:
        return 0.0
    accepted = draw_accepted(sf, k, rng, horizon, size)
    made = np.zeros(size, dtype=np.int64)   # tokens before the round (capped at needs)
    t = np.empty(horizon)
    rounds = np.int64(0)
    for i in range(horizon):
        active = 0
        longest = 0
        for b in range(size):
            if made[b] < needs[b]:
                active += 1
                longest = max(longest, made[b])
        if active == 0:
            break
        R = float(active)
        V = P + float(longest)
        t[i] = (k * _passes(si, sf, SF_HOST_DRAFT, step_form(sf[SF_DRAFT_STEP:], R, V, V))
                + _passes(si, sf, SF_HOST_VERIFY, step_form(sf[SF_VERIFY:], R, V + k, V + k))
                + iteration_form(sf[SF_ITERATION:], float(k)) + _round_overhead(si, sf, R))
        rounds += 1
        for b in range(size):
            made[b] = min(made[b] + accepted[i, b] + 1, needs[b])
    return pairwise_sum(t, 0, rounds)


@njit(cache=True)
def spec_decode_batch(si, sf, rng, rows, P):
    """(work, first-token offset) of a spec_decode batch (SpecDecodeService.sample and
    first_token_seconds)."""
    size = len(rows)
    k = si[SI_LOOKAHEAD]
    max_new = np.int64(0)  # (int64, not the literal 0: one compiled draw_accepted and time_for)
    for m in rows:
        max_new = max(max_new, m)
    if si[SI_KV_CACHE]:
        needs = rows - 1  # the prefill gives every row its first token
        horizon = max(max_new - 1, 0)
        accepted = draw_accepted(sf, k, rng, horizon, size)
        its = iterations_needed(needs, accepted, si[SI_LOCKSTEP]) if horizon else np.int64(0)
        work = spec_decode_time_for(si, sf, size, P, its, max_new)
    else:
        work = spec_decode_no_cache(si, sf, rng, rows, P)
    # first token: the prefill, then the first decoding iteration (SpecDecodeCost.step)
    Bf, Pf = float(size), float(P)
    first = 0.0
    first += _passes(si, sf, SF_HOST_PREFILL, prefill_form(sf[SF_PREFILL_TARGET:], Bf, Pf)) \
        + _passes(si, sf, SF_HOST_DRAFT, prefill_form(sf[SF_PREFILL_DRAFT:], Bf, Pf))
    if max_new > 1:
        view_step = si[SI_VIEW_STEP]
        view = min(view_step * math.ceil((P + k + 1) / view_step), P + max_new + 2 * (k + 1))
        first += _decode_seconds(si, sf, Bf, float(view))
    return work, min(work, first)


@njit(cache=True)
def batch_service(si, sf, rng, rows, P):
    """(work, first-token offset) of a batch of rows of max tokens ``rows`` (in the batch's
    order), longest prompt ``P``, for a task whose kind is SK_ITERATION or SK_SPEC_DECODE."""
    if si[SI_KIND] == SK_ITERATION:
        return iteration_batch(si, sf, rng, rows, P)
    return spec_decode_batch(si, sf, rng, rows, P)
