"""What the compiled summary pass (:mod:`simulator.summary_kernel`) returns: the rows and
columns of its arrays, which :func:`simulator.metrics.summarize_columns` reads into the
summary.

This module imports no numba: the summary reads these arrays in a process that calls the
kernel's extension and never loads numba.
"""

from __future__ import annotations

#: Stand-in for +inf inside the percentile arithmetic (see :func:`simulator.metrics.describe`).
UNFINISHED = 1e300

#: The columns of the counts array, a row per group (overall, then each task code): prompts,
#: completed, served, rejected, dropped, sent after timeout, preemptions, calls holding the
#: group's prompts and how many completed, batches and the prompts in them, padding's
#: padded and actual tokens and summed per-batch waste, output and input tokens of completed
#: prompts, prompts that meet the goodput SLO.
(C_PROMPTS, C_COMPLETED, C_SERVED, C_REJECTED, C_DROPPED, C_SENT_LATE, C_PREEMPTED, C_CALLS, C_CALLS_OK,
 C_BATCHES, C_BATCHED, C_PADDED, C_ACTUAL, C_WASTE, C_PRODUCED, C_CONSUMED, C_GOOD) = range(17)
N_COUNTS = 17

#: The statistics rows of a group, in this order (row ``group × PER_GROUP + kind``): latency,
#: call latency, wait, service, TTFT, TPOT as :func:`simulator.metrics.describe` gives them,
#: then the token figures' TTFT, TPOT and end-to-end latency in milliseconds. The composition
#: classes' rows follow every group's, two a class (its completed calls' latency, then the
#: latency censored at the client timeout).
(S_LATENCY, S_CALL_LATENCY, S_WAIT, S_SERVICE, S_TTFT, S_TPOT, S_TOK_TTFT, S_TOK_TPOT, S_TOK_E2E) = range(9)
PER_GROUP = 9
#: A statistics row: how many values it describes, their mean, their max, then the percentiles
#: asked (NaN past them).
R_COUNT, R_MEAN, R_MAX, R_PERCENTILES = 0, 1, 2, 3

#: The goodput SLO's timings: first token, end to end, per output token (TPOT and ITL: a
#: prompt without a gap after its first token meets it).
GOODPUT_TTFT, GOODPUT_E2E, GOODPUT_TPOT = 0, 1, 2

#: The columns of the GPU array, a row per GPU: busy seconds, batches, the prompts in them,
#: and the seconds its prompts spent on it.
(G_BUSY, G_BATCHES, G_BATCHED, G_PROMPT_SECONDS) = range(4)
