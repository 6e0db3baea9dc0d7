"""The figures of a small run's summary, every group's at once, in one compiled pass.

:func:`summary_passes` is plain Python that numba compiles: a build compiles it into the
kernel's extension (:mod:`simulator.model.extension`), and :func:`simulator.metrics.summarize_columns`
calls it there for a log of up to :data:`simulator.metrics._ONE_PASS` prompts. A sweep
summarises thousands of runs of a few hundred prompts each, and their summary done with numpy
was some two hundred array operations a run, each costing more to call than its work: half
of a sweep's time. Without the extension the same figures come from those array operations
(:func:`simulator.metrics._groups_one_pass`); ``tests/test_summary_kernel.py`` holds the two
equal, bit for bit. Nothing here is imported by a run: the extension is called, not this file.

Every figure is the numpy path's, computed with the same floating-point operations in the
same order where the order matters:

* statistics of a group are read off its values sorted: the mean is the first value plus the
  pairwise sum of the others, divided by their count (``np.add.reduceat``'s sum of a
  segment), the percentiles numpy's linear interpolation with ``+inf`` (an unfinished prompt)
  interpolated as :data:`UNFINISHED`, the max the last value (NaN sorts last);
* sums per task are taken in row (or batch) order, as ``np.bincount`` takes them; the
  overall padding waste and a GPU's prompt-seconds are pairwise sums (``ndarray.sum``);
* a GPU's busy time is the union of its rows' intervals, stretch by stretch, as
  :func:`simulator.metrics.busy_time` adds them.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from simulator.model.kernel_service import pairwise_sum
from simulator.summary_layout import (
    C_ACTUAL,
    C_BATCHED,
    C_BATCHES,
    C_CALLS,
    C_CALLS_OK,
    C_COMPLETED,
    C_CONSUMED,
    C_DROPPED,
    C_GOOD,
    C_PADDED,
    C_PREEMPTED,
    C_PRODUCED,
    C_PROMPTS,
    C_REJECTED,
    C_SENT_LATE,
    C_SERVED,
    C_WASTE,
    G_BATCHED,
    G_BATCHES,
    G_BUSY,
    G_PROMPT_SECONDS,
    GOODPUT_E2E,
    GOODPUT_TPOT,
    GOODPUT_TTFT,
    N_COUNTS,
    PER_GROUP,
    R_COUNT,
    R_MAX,
    R_MEAN,
    R_PERCENTILES,
    S_CALL_LATENCY,
    S_LATENCY,
    S_SERVICE,
    S_TOK_E2E,
    S_TOK_TPOT,
    S_TOK_TTFT,
    S_TPOT,
    S_TTFT,
    S_WAIT,
    UNFINISHED,
)


@njit
def _describe(buf, n, qs, late, scale, out):
    """Write the statistics of ``buf[:n]`` (sorted) into ``out``: ``late``, a percentile that
    interpolates towards an unfinished value is +inf; each figure but the count times ``scale``."""
    out[R_COUNT] = n
    if n == 0:
        return
    total = buf[0] if n == 1 else buf[0] + pairwise_sum(buf, 1, n - 1)
    mean = total / n
    out[R_MEAN] = mean * scale if scale != 1.0 else mean
    top = buf[n - 1]
    out[R_MAX] = top
    for j in range(len(qs)):
        vi = float(n - 1) * (qs[j] / 100)
        lo = int(math.floor(vi))
        t = vi - lo
        a = buf[lo]
        b = buf[min(lo + 1, n - 1)]
        if a == math.inf:
            a = UNFINISHED
        if b == math.inf:
            b = UNFINISHED
        diff = b - a
        pct = b - diff * (1 - t) if t >= 0.5 else a + diff * t
        if late and pct >= UNFINISHED * 1e-6:
            pct = math.inf
        if top != top:
            pct = math.nan
        out[R_PERCENTILES + j] = pct * scale if scale != 1.0 else pct


@njit
def _describe_where(values, keep, code, k, buf, qs, out):
    """Write the statistics (late) of ``values[i]`` where ``keep[i]`` and ``code[i] == k``
    into ``out``, sorting them in ``buf``."""
    m = 0
    for i in range(len(values)):
        if keep[i] and code[i] == k:
            buf[m] = values[i]
            m += 1
    part = buf[:m]
    part.sort()
    _describe(part, m, qs, True, 1.0, out)


@njit
def _before(a, b):
    """Whether ``a`` sorts before ``b`` (NaN last, as numpy and numba sort)."""
    return a < b or (b != b and a == a)


@njit
def _grouped(values, keep, code, n_codes, buf, by_code, stats, first_row, stride, qs, token_qs, token_row,
             token_finite):
    """Sort ``values[keep]`` overall and by ``code`` (0..n_codes-1); describe each group
    (late) into ``stats[first_row + g × stride]``, g 0 overall and 1 + code, and where
    ``token_row >= 0`` each group's token statistics (times 1000; ``token_finite``: of its
    finite values alone) into ``stats[token_row + g × stride]``.

    Each code's values are sorted on their own (in ``by_code``, code after code), and the
    overall order merged from theirs (into ``buf``): a sort of every value costs as much as
    those of every code together."""
    at = np.zeros(n_codes + 1, dtype=np.int64)
    for i in range(len(values)):
        if keep[i]:
            at[code[i] + 1] += 1
    for k in range(n_codes):
        at[k + 1] += at[k]
    fill = at[:n_codes].copy()
    for i in range(len(values)):
        if keep[i]:
            by_code[fill[code[i]]] = values[i]
            fill[code[i]] += 1
    n = at[n_codes]
    for k in range(n_codes):
        by_code[at[k]:at[k + 1]].sort()
    # the codes' sorted runs merged: at each step the least of their heads
    head = at[:n_codes].copy()
    for j in range(n):
        best = -1
        for k in range(n_codes):
            if head[k] < at[k + 1] and (best < 0 or _before(by_code[head[k]], by_code[head[best]])):
                best = k
        buf[j] = by_code[head[best]]
        head[best] += 1
    for g in range(n_codes + 1):
        part = buf[:n] if g == 0 else by_code[at[g - 1]:at[g]]
        m = len(part)
        _describe(part, m, qs, True, 1.0, stats[first_row + g * stride])
        if token_row >= 0:
            if token_finite:
                m = 0
                for i in range(len(part)):
                    if np.isfinite(part[i]):
                        m += 1
            _describe(part, m, token_qs, False, 1000.0, stats[token_row + g * stride])


@njit
def _max_nan(a, b):
    """``np.maximum(a, b)``: NaN where either is."""
    return a if a != a or a > b else b


@njit
def _min_nan(a, b):
    """``np.minimum(a, b)``: NaN where either is."""
    return a if a != a or a < b else b


@njit
def _busy_time(starts, ends):
    """:func:`simulator.metrics.busy_time`: the length of the union of [starts, ends)."""
    n = len(starts)
    if n == 0:
        return 0.0
    ordered = True
    for i in range(1, n):
        if not starts[i] >= starts[i - 1]:
            ordered = False
            break
    if ordered:
        s, e = starts, ends
    else:
        order = np.argsort(starts, kind="mergesort")
        s, e = starts[order], ends[order]
    # stretch by stretch: one opens where an interval starts after every earlier one ended;
    # every stretch's length but the last summed left to right, the last as (total + end) - start
    total = 0.0
    stretches = 0
    open_at = s[0]
    latest = e[0]
    for i in range(1, n):
        if s[i] > latest:
            total = total + (latest - open_at) if stretches else latest - open_at
            stretches += 1
            open_at = s[i]
        latest = _max_nan(latest, e[i])
    return total + latest - open_at


def summary_passes(arrived, started, first, done, status, served_status, turned_status, task, n_tasks,
                   call_of, n_calls, call_of_pair, task_of_pair, call_class, n_classes,
                   max_tokens, prompt_tokens, preemptions, batch_id, batch_size, gpu, queue, engine_of,
                   limit, client_timeout, gpus, late_qs, token_qs, goodput_kind, goodput_bound):
    """Every figure of a small run's summary but its assembly (:mod:`simulator.metrics`).

    Per prompt: its instants, ``status`` (codes; ``served_status[code]`` whether that status is
    served; ``turned_status``: the codes of rejected, dropped and sent-after-timeout, -2 where
    absent), ``task`` (codes 0..n_tasks-1 in sorted order of name), ``call_of`` (0..n_calls-1),
    its tokens, preemptions, batch (-1: none) and batch size, ``gpu`` (-1: none), ``queue``
    (codes; -1 none) with ``engine_of[code]`` the task whose continuous engine the queue is
    (-1: none). Per call holding a task, by task: ``call_of_pair``, ``task_of_pair``; per call
    its composition class (-1: none, of ``n_classes``). ``limit``: the deadline (+inf: none);
    ``client_timeout`` NaN for none; ``gpus`` -1 for as many as the log names. ``goodput_kind``
    and ``goodput_bound``: the goodput SLO's timings (:data:`~simulator.summary_layout.GOODPUT_TTFT` ...) and bounds, empty for
    none.

    Returns ``(counts, stats, gpu_figures, composition_counts, makespan)``: a row of
    :data:`N_COUNTS` per group, the statistics rows (:mod:`simulator.summary_layout`), a row per GPU, per
    composition class its calls and completed calls, and the makespan."""
    n = len(arrived)
    groups = n_tasks + 1
    served = np.empty(n, dtype=np.bool_)
    done_ok = np.empty(n, dtype=np.bool_)
    counts = np.zeros((groups, N_COUNTS))
    top_done = -math.inf
    least_arrived = math.inf
    any_served = False
    for i in range(n):
        s = served_status[status[i]]
        served[i] = s
        ok = s and done[i] <= limit
        done_ok[i] = ok
        if s:
            top_done = _max_nan(done[i], top_done)
            any_served = True
        least_arrived = _min_nan(arrived[i], least_arrived)
        for g in (0, task[i] + 1):
            row = counts[g]
            row[C_PROMPTS] += 1
            row[C_COMPLETED] += ok
            row[C_SERVED] += s
            row[C_REJECTED] += status[i] == turned_status[0]
            row[C_DROPPED] += status[i] == turned_status[1]
            row[C_SENT_LATE] += status[i] == turned_status[2]
        # (sums by task alone: overall's is their sum, below)
        row = counts[task[i] + 1]
        row[C_PREEMPTED] += float(preemptions[i])
        if ok:
            row[C_PRODUCED] += float(max_tokens[i])
            row[C_CONSUMED] += float(prompt_tokens[i])
    makespan = top_done - least_arrived if any_served else 0.0
    # (overall's weighted sums: the sum of the tasks' sums, as numpy sums their array)
    by_task = np.empty(n_tasks)
    for col in (C_PREEMPTED, C_PRODUCED, C_CONSUMED):
        for k in range(n_tasks):
            by_task[k] = counts[k + 1, col]
        counts[0, col] = pairwise_sum(by_task, 0, n_tasks)

    # calls: latency of the last prompt (a prompt not served: never done), completed if every prompt is
    call_done = np.full(n_calls, -math.inf)
    call_arrived = np.full(n_calls, math.inf)
    call_served = np.ones(n_calls, dtype=np.bool_)
    for i in range(n):
        c = call_of[i]
        d = done[i] if served[i] else math.inf
        call_done[c] = _max_nan(call_done[c], d)
        call_arrived[c] = _min_nan(call_arrived[c], arrived[i])
        call_served[c] = call_served[c] and served[i]
    call_latency = call_done - call_arrived
    call_ok = np.empty(n_calls, dtype=np.bool_)
    for c in range(n_calls):
        call_ok[c] = call_served[c] and call_done[c] <= limit
        if client_timeout == client_timeout:
            call_ok[c] = call_ok[c] and call_latency[c] <= client_timeout
        counts[0, C_CALLS] += 1
        counts[0, C_CALLS_OK] += call_ok[c]
    for j in range(len(call_of_pair)):
        counts[task_of_pair[j] + 1, C_CALLS] += 1
        counts[task_of_pair[j] + 1, C_CALLS_OK] += call_ok[call_of_pair[j]]

    # batches: each one's size, task, padded and actual tokens (in batch id order)
    top = 0
    for i in range(n):
        if batch_id[i] + 1 > top:
            top = batch_id[i] + 1
    size = np.zeros(top, dtype=np.int64)
    size_of = np.zeros(top, dtype=np.int64)
    longest_prompt = np.zeros(top, dtype=np.int64)
    longest_output = np.zeros(top, dtype=np.int64)
    actual = np.zeros(top, dtype=np.int64)
    pads = np.ones(top, dtype=np.bool_)
    task_of = np.zeros(top, dtype=np.int64)
    for i in range(n):
        b = batch_id[i]
        if b < 0:
            continue
        size[b] += 1
        size_of[b] = batch_size[i]
        longest_prompt[b] = max(longest_prompt[b], prompt_tokens[i])
        longest_output[b] = max(longest_output[b], max_tokens[i])
        actual[b] += np.int64(prompt_tokens[i]) + np.int64(max_tokens[i])
        q = queue[i]
        pads[b] = not (q >= 0 and engine_of[q] == task[i])
        task_of[b] = task[i]
    waste = np.empty(top)
    n_batches = 0
    for b in range(top):
        if size[b] == 0:
            continue
        padded = size[b] * (longest_prompt[b] + longest_output[b]) if pads[b] else actual[b]
        w = (padded - actual[b]) / max(padded, 1) if padded > 0 else 0.0
        waste[n_batches] = w
        n_batches += 1
        k = task_of[b] + 1
        counts[0, C_BATCHES] += 1
        counts[0, C_BATCHED] += size_of[b]
        counts[k, C_BATCHES] += 1
        counts[k, C_BATCHED] += float(size_of[b])
        counts[0, C_PADDED] += padded
        counts[0, C_ACTUAL] += actual[b]
        counts[k, C_PADDED] += float(padded)
        counts[k, C_ACTUAL] += float(actual[b])
        counts[k, C_WASTE] += w
    counts[0, C_WASTE] = pairwise_sum(waste, 0, n_batches)

    # goodput: the completed prompts that meet every bound
    if len(goodput_kind):
        for i in range(n):
            ok = done_ok[i]
            for j in range(len(goodput_kind)):
                kind = goodput_kind[j]
                if kind == GOODPUT_TTFT:
                    x = first[i] - arrived[i]
                elif kind == GOODPUT_E2E:
                    x = done[i] - arrived[i]
                else:
                    x = (done[i] - first[i]) / (max_tokens[i] - 1) if max_tokens[i] > 1 else math.nan
                ok = ok and (x <= goodput_bound[j] or (x != x and kind == GOODPUT_TPOT))
            if ok:
                counts[0, C_GOOD] += 1
                counts[task[i] + 1, C_GOOD] += 1

    # statistics, each group's values sorted
    q_width = max(len(late_qs), len(token_qs))
    stats = np.full((groups * PER_GROUP + 2 * n_classes, R_PERCENTILES + q_width), math.nan)
    buf = np.empty(max(n, n_calls, len(call_of_pair)))
    by_code = np.empty(n)
    values = np.empty(n)
    every = np.ones(n, dtype=np.bool_)
    for i in range(n):
        values[i] = done[i] - arrived[i] if done_ok[i] else math.inf
    _grouped(values, every, task, n_tasks, buf, by_code, stats, S_LATENCY, PER_GROUP, late_qs, token_qs, S_TOK_E2E, True)
    for i in range(n):
        values[i] = first[i] - arrived[i] if done_ok[i] else math.inf
    _grouped(values, every, task, n_tasks, buf, by_code, stats, S_TTFT, PER_GROUP, late_qs, token_qs, S_TOK_TTFT, True)
    for i in range(n):
        values[i] = started[i] - arrived[i]
    _grouped(values, done_ok, task, n_tasks, buf, by_code, stats, S_WAIT, PER_GROUP, late_qs, token_qs, -1, False)
    for i in range(n):
        values[i] = done[i] - started[i]
    _grouped(values, done_ok, task, n_tasks, buf, by_code, stats, S_SERVICE, PER_GROUP, late_qs, token_qs, -1, False)
    has_tpot = np.empty(n, dtype=np.bool_)
    for i in range(n):
        values[i] = (done[i] - first[i]) / (max_tokens[i] - 1) if max_tokens[i] > 1 else math.nan
        has_tpot[i] = done_ok[i] and max_tokens[i] > 1 and np.isfinite(values[i])
    _grouped(values, has_tpot, task, n_tasks, buf, by_code, stats, S_TPOT, PER_GROUP, late_qs, token_qs, S_TOK_TPOT, False)
    # call latency: every call overall; per task, the calls holding it
    call_values = np.empty(n_calls)
    for c in range(n_calls):
        call_values[c] = call_latency[c] if call_ok[c] else math.inf
    part = buf[:n_calls]
    part[:] = call_values
    part.sort()
    _describe(part, n_calls, late_qs, True, 1.0, stats[S_CALL_LATENCY])
    pair_values = call_values[call_of_pair]
    every_pair = np.ones(len(call_of_pair), dtype=np.bool_)
    for k in range(n_tasks):
        _describe_where(pair_values, every_pair, task_of_pair, k, buf, late_qs,
                        stats[(k + 1) * PER_GROUP + S_CALL_LATENCY])

    # composition classes: their completed calls' latency, and every call's censored at the timeout
    composition = np.zeros((n_classes, 2))
    if n_classes:
        censored = np.empty(n_calls)
        kept = np.empty(n_calls, dtype=np.bool_)
        for c in range(n_calls):
            censored[c] = call_latency[c] if call_ok[c] or client_timeout != client_timeout else client_timeout
            kept[c] = np.isfinite(censored[c])
            if call_class[c] >= 0:
                composition[call_class[c], 0] += 1
                composition[call_class[c], 1] += call_ok[c]
        base = groups * PER_GROUP
        for k in range(n_classes):
            _describe_where(call_latency, call_ok, call_class, k, buf, late_qs, stats[base + 2 * k])
            _describe_where(censored, kept, call_class, k, buf, late_qs, stats[base + 2 * k + 1])

    # GPUs: each one's rows (served, in log order)
    n_gpus = gpus
    if n_gpus < 0:
        n_gpus = 0
        for i in range(n):
            if served[i] and gpu[i] >= 0 and gpu[i] + 1 > n_gpus:
                n_gpus = gpu[i] + 1
    gpu_figures = np.zeros((n_gpus, 4))
    mine = np.empty(n, dtype=np.int64)
    seen = np.zeros(top, dtype=np.bool_)
    for g in range(n_gpus):
        m = 0
        for i in range(n):
            if served[i] and gpu[i] == g:
                mine[m] = i
                m += 1
        rows = mine[:m]
        busy = _busy_time(started[rows], done[rows])
        spent = np.empty(m)
        for j in range(m):
            spent[j] = done[rows[j]] - started[rows[j]]
        batches = 0
        batched = 0
        for j in range(m):
            b = batch_id[rows[j]]
            if b >= 0 and not seen[b]:
                seen[b] = True
                batches += 1
                batched += size_of[b]
        for j in range(m):
            b = batch_id[rows[j]]
            if b >= 0:
                seen[b] = False
        f = gpu_figures[g]
        f[G_BUSY] = busy
        f[G_BATCHES] = batches
        f[G_BATCHED] = batched
        f[G_PROMPT_SECONDS] = pairwise_sum(spent, 0, m)
    return counts, stats, gpu_figures, composition, makespan
