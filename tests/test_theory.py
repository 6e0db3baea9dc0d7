"""Queueing theory against the simulator: each configuration whose exact answer is known is
simulated and its mean latency compared with the formula (formulas in ``theory.py``).

Statistics (the same for every theory test):

* R independent replications; replication r draws its arrivals from its own
  ``np.random.default_rng([test seed, r])`` and runs the simulator with its own seed, so
  arrivals, service times and dispatch are all independent between replications;
* each replication starts empty; the first 10 % of prompts (by arrival) are a warm-up and
  are left out of its mean; the simulator runs every prompt to completion, so no counted
  prompt is censored;
* the test asserts |mean of the replication means − theory| < 4 SE, with
  SE = std(replication means, ddof=1) / √R, and SE / theory < 3 % (so a wrong formula
  would be caught: the power check). Each test also runs a negative control: the formula of
  a neighbouring model that the simulated system is *not* must lie outside the same
  tolerance band.

Service rates are read from the profile object under test (``service.mean(BatchShape)``),
not restated. Utilisation is kept at or below about 0.7.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
import theory

from simulator.events import with_durations
from simulator.metrics import time_average_in_system
from simulator.model import simulate
from simulator.profile import Profile, profile_from_dict
from simulator.profile.kinds import BatchShape
from simulator.scenario import Scenario, build_scenario
from simulator.trace.model import Call, Prompt, Trace, TraceColumns, id_column

WARMUP = 0.10  # fraction of prompts, by arrival, left out of each replication's mean
Z = 4.0  # tolerance in standard errors
MAX_REL_SE = 0.03  # power check: SE / theory must be below this


# -- builders --------------------------------------------------------------------------
def service_profile(**tasks: dict) -> Profile:
    """A GPU profile from ``task=service-spec`` pairs (``{"dist": ..., "mean": ...}``)."""
    return profile_from_dict({"tasks": {
        name: {"resource": "gpu", "service": {"kind": "distribution", **spec}}
        for name, spec in tasks.items()
    }})


def exponential(mean: float | dict = 1.0) -> dict:
    return {"dist": "exponential", "mean": mean}


def deterministic(mean: float | dict = 1.0) -> dict:
    return {"dist": "deterministic", "mean": mean}


def service_mean(profile: Profile, task: str = "x", size: int = 1) -> float:
    """Mean batch service time of ``size`` prompts of ``task``, from the model under test."""
    tp = profile.tasks[task]
    return tp.service.mean(BatchShape(size, tp.prompt_tokens, tp.max_tokens))


def service_rate(profile: Profile, task: str = "x", size: int = 1) -> float:
    return 1.0 / service_mean(profile, task, size)


def scenario(gpus: int = 1, sharing: str = "exclusive", **task_settings) -> Scenario:
    settings = {"flush": 0.0, "max_batch": 1, "policy": "oldest", **task_settings}
    return build_scenario(defaults=settings, run={"gpus": gpus, "gpu_sharing": sharing})


def poisson_trace(rng: np.random.Generator, n: int, lam: float,
                  tasks: Sequence[str] = ("x",), weights: Sequence[float] | None = None) -> Trace:
    """``n`` calls of one prompt each at Poisson(``lam``) instants; each call's task is drawn
    from ``tasks`` with probabilities ``weights`` (uniform if not given)."""
    times = np.cumsum(rng.exponential(1.0 / lam, size=n))
    drawn = np.zeros(n, dtype=np.int64) if len(tasks) == 1 else rng.choice(len(tasks), size=n, p=weights)
    # Made as columns, as the trace readers make them: tens of thousands of calls with no
    # Python object per call or prompt. Task names in order of first appearance, as a trace
    # made of calls numbers them.
    present, first = np.unique(drawn, return_index=True)
    order = present[np.argsort(first)]
    code = np.empty(len(tasks), dtype=np.int64)
    code[order] = np.arange(len(order))
    columns = TraceColumns.of_sizes(
        call_t=times, call_ids=id_column([str(i) for i in range(n)]), sizes=np.ones(n, dtype=np.int64),
        task_names=tuple(tasks[i] for i in order), task_of=code[drawn],
        prompt_tokens=np.full(n, -1), max_tokens=np.zeros(n, dtype=np.int64))
    return Trace(columns=columns)


# -- replications ----------------------------------------------------------------------
@dataclass(frozen=True)
class Estimate:
    """Replication means of one statistic, with their mean and standard error."""

    values: np.ndarray

    @property
    def mean(self) -> float:
        return float(self.values.mean())

    @property
    def se(self) -> float:
        return float(self.values.std(ddof=1) / np.sqrt(len(self.values)))

    def __str__(self) -> str:
        return f"{self.mean:.4f} ± {self.se:.4f} (R={len(self.values)})"


def steady(log: pd.DataFrame) -> pd.DataFrame:
    """The log with durations, minus the warm-up: the first ``WARMUP`` of prompts by arrival."""
    full = with_durations(log).sort_values(["arrived_at", "call_index", "prompt_index"], kind="stable")
    return full.iloc[int(WARMUP * len(full)):]


def mean_latency(log: pd.DataFrame) -> float:
    return float(steady(log)["latency_s"].mean())


def replicate(
    seed: int,
    reps: int,
    make_trace: Callable[[np.random.Generator], Trace],
    scen: Scenario,
    profile: Profile,
    stat: Callable[[pd.DataFrame], float | Sequence[float]] = mean_latency,
) -> list[Estimate]:
    """Run ``reps`` independent replications; one :class:`Estimate` per value of ``stat``."""
    rows = []
    for r in range(reps):
        trace = make_trace(np.random.default_rng([seed, r]))
        log = simulate(trace, scen, profile, seed=seed * 1000 + r)
        assert len(log) == trace.n_prompts and log["done_at"].notna().all()
        value = stat(log)
        rows.append(np.atleast_1d(np.asarray(value, dtype=float)))
    table = np.vstack(rows)
    return [Estimate(table[:, j]) for j in range(table.shape[1])]


def assert_matches(est: Estimate, expected: float, what: str) -> None:
    """Theory within Z standard errors, and the SE small enough for the check to mean something."""
    assert est.se / expected < MAX_REL_SE, f"{what}: too noisy to test, SE/theory = {est.se / expected:.3f}"
    assert abs(est.mean - expected) < Z * est.se, (
        f"{what}: simulated {est}, theory {expected:.4f} ({(est.mean - expected) / est.se:+.1f} SE)")


def assert_rejects(est: Estimate, wrong: float, what: str) -> None:
    """Negative control: the formula of a model the system is not lies outside the band."""
    assert abs(est.mean - wrong) >= Z * est.se, (
        f"{what}: the tolerance cannot tell the right model from the wrong one "
        f"(simulated {est}, wrong theory {wrong:.4f})")


# -- the formulas themselves (fast) -------------------------------------------------------
def test_formulas_agree_with_each_other():
    lam, mu = 0.7, 1.0
    for c in (1, 2, 3, 5):
        assert theory.erlang_c(c, lam * c) == pytest.approx(theory.erlang_c_direct(c, lam * c), rel=1e-12)
    # Special cases that reduce to M/M/1 (and M/D/1 to Pollaczek–Khinchine).
    assert theory.mmc_sojourn(lam, mu, 1) == pytest.approx(theory.mm1_sojourn(lam, mu))
    assert theory.gim1_sojourn_erlang(lam, mu, 1) == pytest.approx(theory.mm1_sojourn(lam, mu), rel=1e-9)
    assert theory.bulk_partial_sojourn_closed(lam, mu, 1) == pytest.approx(theory.mm1_sojourn(lam, mu), rel=1e-9)
    assert theory.bulk_ctmc_sojourn(lam, mu, 1) == pytest.approx(theory.mm1_sojourn(lam, mu), rel=1e-9)
    assert theory.md1_sojourn(lam, mu) == pytest.approx(theory.mg1_sojourn(lam, 1 / mu, 1 / mu**2))
    assert theory.mg1_sojourn(lam, 1 / mu, 2 / mu**2) == pytest.approx(theory.mm1_sojourn(lam, mu))
    # Bulk service: the closed form (geometric waiting count) and the truncated CTMC agree.
    for b in (2, 3, 4):
        for load in (0.3, 0.5, 0.7):
            lam_b = load * b * mu
            assert theory.bulk_ctmc_sojourn(lam_b, mu, b) == pytest.approx(
                theory.bulk_partial_sojourn_closed(lam_b, mu, b), rel=1e-9)
    # The GI/M/1 root solves its equation.
    s = theory.gim1_sigma_erlang(2.1, 1.0, 3)
    assert 0 < s < 1 and s == pytest.approx((2.1 / (2.1 + 1.0 * (1 - s))) ** 3, abs=1e-12)


# -- 1. M/M/1 and M/D/1 ---------------------------------------------------------------------
@pytest.mark.slow
def test_mm1_mean_latency():
    profile = service_profile(x=exponential(1.0))
    mu, lam = service_rate(profile), 0.7
    (est,) = replicate(101, 10, lambda rng: poisson_trace(rng, 15_000, lam), scenario(gpus=1), profile)
    assert_matches(est, theory.mm1_sojourn(lam, mu), "M/M/1")
    assert_rejects(est, theory.md1_sojourn(lam, mu), "M/M/1 vs M/D/1")


@pytest.mark.slow
def test_md1_mean_latency_pollaczek_khinchine():
    profile = service_profile(x=deterministic(1.0))
    mu, lam = service_rate(profile), 0.7
    assert profile.tasks["x"].service.variance(BatchShape(1, 1, 1)) == 0
    (est,) = replicate(102, 10, lambda rng: poisson_trace(rng, 10_000, lam), scenario(gpus=1), profile)
    assert_matches(est, theory.md1_sojourn(lam, mu), "M/D/1")
    assert_rejects(est, theory.mm1_sojourn(lam, mu), "M/D/1 vs M/M/1")


# -- 2. M/M/c: one shared queue, a worker per GPU -----------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("c", [2, 3])
def test_mmc_shared_queue_erlang_c(c):
    profile = service_profile(x=exponential(1.0))
    mu = service_rate(profile)
    lam = 0.7 * c * mu
    n = {2: 20_000, 3: 10_000}[c]  # M/M/3 at the same load is less noisy
    (est,) = replicate(200 + c, 10, lambda rng: poisson_trace(rng, n, lam),
                       scenario(gpus=c, topology="shared"), profile)
    assert_matches(est, theory.mmc_sojourn(lam, mu, c), f"M/M/{c}")
    # Negative controls: one fast server (M/M/1 at rate c*mu, same lambda) and c separate
    # queues (M/M/1 at lambda/c) are both distinguishable.
    assert_rejects(est, theory.mm1_sojourn(lam, c * mu), f"M/M/{c} vs M/M/1 with rate {c}mu")
    assert_rejects(est, theory.mm1_sojourn(lam / c, mu), f"M/M/{c} vs {c} x M/M/1")


# -- 3. split + random dispatch: c independent M/M/1 ----------------------------------------
@pytest.mark.slow
def test_split_random_dispatch_is_independent_mm1_queues():
    c = 2
    profile = service_profile(x=exponential(1.0))
    mu = service_rate(profile)
    lam = 0.7 * c * mu
    (est,) = replicate(301, 10, lambda rng: poisson_trace(rng, 15_000, lam),
                       scenario(gpus=c, topology="split", dispatch="random"), profile)
    assert_matches(est, theory.mm1_sojourn(lam / c, mu), f"split/random, {c} x M/M/1")
    assert_rejects(est, theory.mmc_sojourn(lam, mu, c), f"split/random vs M/M/{c}")


# -- 4. direct + round-robin: GI/M/1 with Erlang-c inter-arrivals --------------------------
@pytest.mark.slow
def test_direct_round_robin_is_gim1_with_erlang_arrivals():
    c = 3
    profile = service_profile(x=exponential(1.0))
    mu = service_rate(profile)
    lam = 0.7 * c * mu
    (est,) = replicate(401, 10, lambda rng: poisson_trace(rng, 15_000, lam),
                       scenario(gpus=c, topology="direct", dispatch="round-robin"), profile)
    assert_matches(est, theory.gim1_sojourn_erlang(lam, mu, c), f"direct/round-robin, E{c}/M/1")
    assert_rejects(est, theory.mm1_sojourn(lam / c, mu), "round-robin vs random split (M/M/1)")
    assert_rejects(est, theory.mmc_sojourn(lam, mu, c), f"round-robin vs M/M/{c}")


# -- 5. processor sharing ----------------------------------------------------------------
@pytest.mark.slow
def test_mm1_processor_sharing_mean_latency():
    profile = service_profile(x=exponential(1.0))
    mu, lam = service_rate(profile), 0.7

    def no_wait(log: pd.DataFrame) -> float:
        # Under processor sharing every prompt starts on arrival; its slowdown is service.
        assert (log["started_at"] == log["arrived_at"]).all()
        return mean_latency(log)

    (est,) = replicate(501, 10, lambda rng: poisson_trace(rng, 15_000, lam),
                       scenario(gpus=1, sharing="processor-sharing", topology="direct"), profile,
                       no_wait)
    assert_matches(est, theory.mm1_sojourn(lam, mu), "M/M/1-PS")
    # (FIFO has the same mean here; the size-conditional test below tells them apart.)
    assert_rejects(est, theory.md1_sojourn(lam, mu), "M/M/1-PS vs M/D/1")


@pytest.mark.slow
def test_processor_sharing_sojourn_is_linear_in_job_size():
    """M/G/1-PS with two job sizes (two tasks, deterministic service on one shared GPU):
    E[T | S = s] = s / (1 − ρ) for each size, while FIFO would give W_q + s."""
    profile = service_profile(small=deterministic(0.5), large=deterministic(2.0))
    s_small, s_large = service_mean(profile, "small"), service_mean(profile, "large")
    p_small = 2 / 3
    mean_s = p_small * s_small + (1 - p_small) * s_large
    second = p_small * s_small**2 + (1 - p_small) * s_large**2
    lam = 0.7 / mean_s

    def by_size(log: pd.DataFrame) -> tuple[float, float]:
        s = steady(log)
        return (s.loc[s["task"] == "small", "latency_s"].mean(),
                s.loc[s["task"] == "large", "latency_s"].mean())

    est_small, est_large = replicate(
        502, 10, lambda rng: poisson_trace(rng, 15_000, lam, ("small", "large"), (p_small, 1 - p_small)),
        scenario(gpus=1, sharing="processor-sharing", topology="direct"), profile, by_size)
    assert_matches(est_small, theory.mg1_ps_conditional_sojourn(lam, mean_s, s_small), "PS, E[T | small]")
    assert_matches(est_large, theory.mg1_ps_conditional_sojourn(lam, mean_s, s_large), "PS, E[T | large]")
    wq_fifo = theory.mg1_sojourn(lam, mean_s, second) - mean_s
    assert_rejects(est_small, wq_fifo + s_small, "PS vs FIFO, small jobs")
    assert_rejects(est_large, wq_fifo + s_large, "PS vs FIFO, large jobs")


# -- 6. bulk service -----------------------------------------------------------------------
@pytest.mark.slow
def test_bulk_service_partial_batches():
    """M/M^[1,b]/1: a free worker takes min(waiting, b) at once; batch time ~ Exp(mu) for any size."""
    b = 3
    profile = service_profile(x=exponential(1.0))
    mu = service_rate(profile)
    assert all(service_rate(profile, size=k) == mu for k in range(1, b + 1))
    lam = 0.5 * b * mu
    (est,) = replicate(601, 10, lambda rng: poisson_trace(rng, 10_000, lam),
                       scenario(gpus=1, topology="shared", max_batch=b), profile)
    closed = theory.bulk_partial_sojourn_closed(lam, mu, b)
    assert theory.bulk_ctmc_sojourn(lam, mu, b) == pytest.approx(closed, rel=1e-9)
    assert_matches(est, closed, f"M/M^[1,{b}]/1")
    assert_rejects(est, theory.bulk_ctmc_sojourn(lam, mu, b + 1), f"max batch {b} vs {b + 1}")
    assert_rejects(est, theory.bulk_ctmc_sojourn(lam, mu, b - 1), f"max batch {b} vs {b - 1}")


@pytest.mark.slow
def test_bulk_service_full_batches_only():
    """M/M^[b,b]/1: an infinite flush window releases only full batches of b."""
    b = 3
    profile = service_profile(x=exponential(1.0))
    mu = service_rate(profile)
    lam = 1.2
    n = 6_000
    assert n % b == 0  # otherwise the last prompts never fill a batch

    def check_full(log: pd.DataFrame) -> float:
        assert (log["batch_size"] == b).all()
        return mean_latency(log)

    (est,) = replicate(602, 10, lambda rng: poisson_trace(rng, n, lam),
                       scenario(gpus=1, topology="shared", max_batch=b, flush=float("inf")),
                       profile, check_full)
    assert_matches(est, theory.bulk_ctmc_sojourn(lam, mu, b, min_batch=b), f"M/M^[{b},{b}]/1")
    assert_rejects(est, theory.bulk_partial_sojourn_closed(lam, mu, b), f"M/M^[{b},{b}]/1 vs M/M^[1,{b}]/1")


# -- 7. Little's law on the event log --------------------------------------------------------
def time_average_by_grid(log: pd.DataFrame) -> float:
    """Number in system, averaged over [first arrival, last departure], computed another way:
    between consecutive distinct event instants N(t) is constant, so count arrivals and
    departures up to each interval's midpoint with ``searchsorted``."""
    arr = np.sort(log["arrived_at"].to_numpy(float))
    dep = np.sort(log["done_at"].to_numpy(float))
    edges = np.unique(np.concatenate([arr, dep]))
    mid = 0.5 * (edges[:-1] + edges[1:])
    n_in = np.searchsorted(arr, mid, side="right") - np.searchsorted(dep, mid, side="right")
    assert (n_in >= 0).all()
    return float(np.sum(n_in * np.diff(edges)) / (edges[-1] - edges[0]))


def batched_two_gpu_log(seed: int, n_calls: int) -> pd.DataFrame:
    """A non-trivial run: calls of 1-3 prompts of two tasks, micro-batching with a window,
    processor-shared GPUs, size-dependent gamma service times."""
    rng = np.random.default_rng([seed, 0])
    times = np.cumsum(rng.exponential(1.0 / 0.8, size=n_calls))
    calls = tuple(
        Call(str(i), float(t), tuple(Prompt(str(rng.choice(["x", "y"]))) for _ in range(rng.integers(1, 4))))
        for i, t in enumerate(times)
    )
    profile = service_profile(x={"dist": "gamma", "cv": 0.5, "mean": {"base": 0.4, "per_prompt": 0.2}},
                              y=exponential({"base": 0.2, "per_prompt": 0.3}))
    scen = build_scenario(defaults={"flush": 0.3, "max_batch": 4, "topology": "shared"},
                          tasks={"y": {"topology": "split", "dispatch": "least-loaded"}},
                          run={"gpus": 2, "gpu_sharing": "processor-sharing"})
    return simulate(Trace(calls), scen, profile, seed=seed)


def test_littles_law_on_the_event_log():
    log = batched_two_gpu_log(701, 3_000)
    full = with_durations(log)
    assert (full["batch_size"] > 1).any() and full["gpu"].nunique() == 2
    span = float(full["done_at"].max() - full["arrived_at"].min())
    L = time_average_in_system(log)
    # Every prompt arrives and leaves inside the span: L = (completed / span) * mean latency.
    assert L == pytest.approx(len(full) / span * full["latency_s"].mean(), rel=1e-9)
    assert L == pytest.approx(time_average_by_grid(log), rel=1e-9)


def test_time_average_in_system_on_a_hand_made_log():
    # Arrivals 0, 1, 1, 4; departures 2, 3, 5, 5 -> N: 1 on [0,1), 3 on [1,2), 2 on [2,3),
    # 1 on [3,4), 2 on [4,5): area 1 + 3 + 2 + 1 + 2 = 9 over [0, 5].
    log = pd.DataFrame({"arrived_at": [0.0, 1.0, 1.0, 4.0], "done_at": [2.0, 3.0, 5.0, 5.0]})
    assert time_average_in_system(log) == pytest.approx(9 / 5)
    assert time_average_by_grid(log) == pytest.approx(9 / 5)


@pytest.mark.slow
def test_littles_law_matches_theory_for_mm1():
    """Time-average number in system of M/M/1 against L = lam W = rho / (1 - rho).

    The whole span is averaged (the metric has no warm-up), so runs are long enough that
    the start from empty biases L by well under one SE."""
    profile = service_profile(x=exponential(1.0))
    mu, lam = service_rate(profile), 0.6
    (est,) = replicate(703, 8, lambda rng: poisson_trace(rng, 15_000, lam), scenario(gpus=1), profile,
                       time_average_in_system)
    rho = lam / mu
    assert_matches(est, rho / (1 - rho), "M/M/1 time-average number in system")
    assert_rejects(est, lam * theory.md1_sojourn(lam, mu), "M/M/1 L vs M/D/1 L")
