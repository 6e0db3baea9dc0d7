"""The compiled kernel's arguments and tables, as lowering (:mod:`simulator.model.fast`)
writes them and the kernel (:mod:`simulator.model.batch_kernel`,
:mod:`simulator.model.kernel_service`) reads them.

This module imports no numba: lowering, the extension's entry points
(:mod:`simulator.model.compiled`) and the event log read these codes in a process that never
loads numba (a replay on the extension).
"""

from __future__ import annotations

import numpy as np

#: ``run_kernel``'s parameters, in order (``tests/test_compiled_kernel.py`` holds it to the
#: kernel's signature): the lowered scenario, the run's streams, the continuous engines'.
RUN_ARGS = ("call_t", "call_g0", "g_start", "g_front", "order", "call_of", "ptok", "mtok", "FI", "QI", "QF", "WDEV",
            "WID", "DI", "DF", "DEVLIST", "RULES", "TK", "TMEAN", "TSCALE", "NOISE", "NOISE0", "TPI", "GRID", "GLEN",
            "GVAL", "GAXIS", "cold_until", "n_workers0", "rng", "SI", "SF", "SRNG", "EI", "CTI", "CTF", "CSTEP",
            "R_PID", "CS")
#: Where the tasks' service streams are in :data:`RUN_ARGS`: lowering puts a list of
#: generators there, which the entry point hands on as the kernel it runs takes them.
SRNG_ARG = RUN_ARGS.index("SRNG")

# Columns of the batch table BI (int32: ids and sizes below 2**31, a trace holds fewer
# prompts) and BF, one row per batch: what the event log reads of it after the run.
BI_NAME, BI_SIZE, BI_WORKER_ID, BI_DEVICE = range(4)
BF_FORMED, BF_STARTED = range(2)

# Columns of the continuous engines' state EI.
EI_TASK, EI_DEVICE, EI_NAME, EI_MAXROWS, EI_BUDGET, EI_BS, EI_TOTAL, EI_FREE, EI_MAXQ, EI_BUSY, EI_OUT_TOKENS, \
    EI_RUNNING, EI_WHEAD, EI_WTAIL, EI_WAITING, EI_R0, EI_ROWS, EI_DECODING, EI_ADMITTED, EI_ADMITTED_TOKENS, \
    EI_RECORD, EI_SEQ = range(22)
EI_WIDTH = 22

# A task's service as the kernel's parameter rows SI and SF (lower_service), priced by
# simulator.model.kernel_service.
# Kind codes (SI_KIND).
SK_BATCH, SK_ITERATION, SK_SPEC_DECODE = 0, 1, 2
# Integer parameters of a task's service.
SI_KIND, SI_DIST, SI_STAY, SI_ENGINE, SI_OVERLAP, SI_LOOKAHEAD, SI_LOCKSTEP, SI_VIEW_STEP, \
    SI_KV_CACHE = range(9)
N_SI = 9
# Float parameters: the iteration kind's step, the gamma shape, the engine's host seconds
# per pass (its step_s + launch_s × kernels of that pass) and per row, the acceptance rate,
# then the spec_decode costs' coefficients.
SF_BASE, SF_PER_ROW, SF_PER_PREFILL, SF_PER_CONTEXT, SF_GAMMA_K, SF_ROW_S, SF_HOST_STEP, SF_HOST_PREFILL, \
    SF_HOST_DRAFT, SF_HOST_VERIFY, SF_ACCEPTANCE = range(11)
SF_PREFILL_TARGET, SF_PREFILL_DRAFT, SF_DRAFT_STEP, SF_VERIFY, SF_ITERATION = 11, 14, 17, 20, 23
N_SF = 25
# The iteration kind's dist (SI_DIST).
D_DETERMINISTIC, D_EXPONENTIAL, D_GAMMA = 0, 1, 2
ITERATION_DISTS = {"deterministic": D_DETERMINISTIC, "exponential": D_EXPONENTIAL, "gamma": D_GAMMA}
HOST_COLUMNS = {"step": SF_HOST_STEP, "prefill": SF_HOST_PREFILL, "draft": SF_HOST_DRAFT, "verify": SF_HOST_VERIFY}
COST_COLUMNS = {"prefill_target": SF_PREFILL_TARGET, "prefill_draft": SF_PREFILL_DRAFT,
                "draft_step": SF_DRAFT_STEP, "verify": SF_VERIFY, "iteration": SF_ITERATION}


def lower_service(service) -> tuple[np.ndarray, np.ndarray]:
    """A task's service model (its scenario overrides applied) as the kernel's parameter rows
    ``(SI, SF)``; ``SK_BATCH`` for the kinds the kernel prices itself."""
    from simulator.profile.kinds.iteration import IterationService
    from simulator.profile.kinds.spec_decode import SpecDecodeService

    si = np.zeros(N_SI, dtype=np.int64)
    sf = np.zeros(N_SF)
    engine = getattr(service, "engine", None)
    if engine is not None:
        si[SI_ENGINE], si[SI_OVERLAP] = 1, int(engine.overlap)
        sf[SF_ROW_S] = engine.row_s
        for name, column in HOST_COLUMNS.items():
            # EngineOverhead.host(name, 0) less its row term, as the engine computes it
            sf[column] = engine.step_s + engine.launch_s * engine.kernels.get(name, engine.kernels.get("step", 0.0))
    if isinstance(service, IterationService):
        si[SI_KIND], si[SI_DIST] = SK_ITERATION, ITERATION_DISTS[service.dist]
        si[SI_STAY] = int(service.finished_rows == "stay")
        sf[SF_BASE], sf[SF_PER_ROW] = service.base, service.per_row
        sf[SF_PER_PREFILL], sf[SF_PER_CONTEXT] = service.per_prefill_token, service.per_context_token
        if service.dist == "gamma":
            sf[SF_GAMMA_K] = 1.0 / service._cv ** 2
    elif isinstance(service, SpecDecodeService):
        si[SI_KIND], si[SI_LOOKAHEAD] = SK_SPEC_DECODE, service.lookahead
        si[SI_LOCKSTEP] = int(service.discipline == "lockstep")
        si[SI_VIEW_STEP], si[SI_KV_CACHE] = service.view_step, int(service.kv_cache)
        sf[SF_ACCEPTANCE] = service.acceptance
        for op, column in COST_COLUMNS.items():
            coef = service.costs[op].coef
            sf[column:column + len(coef)] = coef
    elif getattr(service, "kind", "") in ("distribution", "table"):
        si[SI_KIND] = SK_BATCH
    else:
        raise TypeError(f"the compiled kernel has no {getattr(service, 'kind', service)!r} service kind")
    return si, sf


def draws(si: np.ndarray, sf: np.ndarray) -> bool:
    """Whether a task of these kinds draws from its service stream (a deterministic iteration
    kind, or an acceptance of 0 or 1, draws nothing)."""
    if si[SI_KIND] == SK_ITERATION:
        return bool(si[SI_DIST] != D_DETERMINISTIC)
    return bool(si[SI_KIND] == SK_SPEC_DECODE and 0 < sf[SF_ACCEPTANCE] < 1)
