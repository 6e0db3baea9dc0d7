"""Continuous (iteration-level) batching: hand-computed timelines, KV preemption, token
budget, limits of the model that have exact answers, and the link to static batches."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import theory
from helpers import run, timeline

from simulator.errors import ProfileError, ScenarioError
from simulator.model import simulate
from simulator.profile import profile_from_dict
from simulator.profile.iteration import batch_iterations, first_token_seconds, step_cost
from simulator.profile.kinds import BatchShape
from simulator.scenario import build_scenario
from simulator.trace.model import Call, Prompt, Trace


def iteration_profile(dist: str = "deterministic", prompt_tokens: int = 10, **step) -> object:
    return profile_from_dict({"tasks": {"x": {
        "resource": "gpu", "prompt_tokens": prompt_tokens, "max_tokens": 4,
        "service": {"kind": "iteration", "dist": dist, "step": step}}}})


def token_trace(calls: list[tuple[float, list[int]]]) -> Trace:
    """Calls of ``x`` prompts given by their max tokens."""
    return Trace(tuple(Call(str(i), float(t), tuple(Prompt("x", max_tokens=m) for m in ms))
                       for i, (t, ms) in enumerate(calls)))


def test_hand_timeline_with_row_limit_and_token_budget():
    """Iteration = 1 + 0.5·rows + 0.1·prefill tokens; prompts of 10 tokens; 2 rows at most,
    15 tokens per iteration. a(0, 3 tokens), b(0, 2 tokens), c(0.5, 1 token).

    t=0    a admitted (10 tokens; b's 10 exceed the 5 left): 1 + 0.5 + 1 = 2.5 -> a has 1
    t=2.5  a decodes (1 token), b admitted (10): 1 + 1 + 1 = 3 -> 5.5: a 2, b 1
    t=5.5  two rows, c must wait: 1 + 1 = 2 -> 7.5: a 3 (done), b 2 (done)
    t=7.5  c admitted alone: 1 + 0.5 + 1 = 2.5 -> 10: c 1 (done)
    """
    trace = token_trace([(0, [3, 2]), (0.5, [1])])
    log = run(trace, iteration_profile(base=1.0, per_row=0.5, per_prefill_token=0.1), gpus=1,
              topology="continuous", max_num_seqs=2, max_batched_tokens=15)
    assert timeline(log, "first_token_at") == [("0.0", 2.5), ("0.1", 5.5), ("1.0", 10.0)]
    assert timeline(log) == [("0.0", 7.5), ("0.1", 7.5), ("1.0", 10.0)]
    assert timeline(log, "batched_at") == [("0.0", 0.0), ("0.1", 2.5), ("1.0", 7.5)]
    assert (log["status"] == "served").all() and (log["preemptions"] == 0).all()


def test_kv_cache_full_preempts_the_newest_row_and_recomputes_it():
    """Blocks of 1 token, 8 blocks; prompts of 2 tokens; a and b want 4 tokens; iteration 1 s.

    t=0  admit a (3 blocks), b (3 blocks), 2 free -> t=1: a 1, b 1
    t=1  both grow to 4 tokens: 2 more blocks, 0 free -> t=2: a 2, b 2
    t=2  both need a 5th block, none free: preempt b (newest, frees 4); a grows -> t=3: a 3
    t=3  a grows (2 free left); b needs 2 + 2 + 1 = 5 blocks to come back: not yet -> t=4: a done
    t=4  b recomputes its 4 tokens and makes its 3rd -> t=5; its 4th -> t=6
    """
    trace = token_trace([(0, [4, 4])])
    log = run(trace, iteration_profile(base=1.0, prompt_tokens=2), gpus=1, topology="continuous",
              kv_blocks=8, block_size=1)
    assert timeline(log) == [("0.0", 4.0), ("0.1", 6.0)]
    assert timeline(log, "first_token_at") == [("0.0", 1.0), ("0.1", 1.0)]
    assert list(log["preemptions"]) == [0, 1]


def test_unlimited_capacity_and_constant_iteration_latency_is_tokens_times_iteration():
    # Arrivals on iteration boundaries (multiples of 0.25, exact in binary floating point).
    rng = np.random.default_rng(7)
    starts = np.sort(rng.integers(0, 400, size=60)) * 0.25
    tokens = rng.integers(1, 40, size=60)
    trace = token_trace([(float(t), [int(m)]) for t, m in zip(starts, tokens, strict=True)])
    log = run(trace, iteration_profile(base=0.25), gpus=1, topology="continuous",
              max_num_seqs=10_000, max_batched_tokens=10**9)
    latency = (log["done_at"] - log["arrived_at"]).to_numpy()
    assert latency.tolist() == (log["max_tokens"].to_numpy() * 0.25).tolist()
    assert ((log["first_token_at"] - log["arrived_at"]) == 0.25).all()


@pytest.mark.slow
@pytest.mark.parametrize("tokens", [1, 3])
def test_one_row_at_a_time_with_exponential_iterations_is_mg1_on_tokens(tokens):
    """Capacity 1 and exponential iterations of mean s: a prompt of n tokens is served in
    n iterations, an Erlang-n time, so the engine is M/E_n/1 (M/M/1 for n = 1):
    W = E[S] + lam·E[S^2] / (2 (1 − rho)), E[S] = n s, E[S^2] = n (n + 1) s^2."""
    from test_theory import Estimate, assert_matches, assert_rejects, steady

    s, lam = 0.5 / tokens, 0.65
    profile = iteration_profile(dist="exponential", base=s)
    scen = build_scenario(defaults={"topology": "continuous", "max_num_seqs": 1},
                          run={"gpus": 1})
    means = []
    # 2,000 calls a replication: SE/theory about 2 % (n = 1) and 1 % (n = 3), and the
    # neighbouring model of each negative control still lies 8 and 12 SE away.
    for r in range(10):
        rng = np.random.default_rng([701, tokens, r])
        times = np.cumsum(rng.exponential(1 / lam, size=2_000))
        trace = token_trace([(float(t), [tokens]) for t in times])
        log = simulate(trace, scen, profile, seed=r)
        means.append(steady(log)["latency_s"].mean())
    est = Estimate(np.array(means))
    mean, second = tokens * s, tokens * (tokens + 1) * s * s
    assert_matches(est, theory.mg1_sojourn(lam, mean, second), f"M/E_{tokens}/1 on tokens")
    if tokens == 1:
        assert theory.mg1_sojourn(lam, mean, second) == pytest.approx(theory.mm1_sojourn(lam, 1 / s))
        assert_rejects(est, theory.md1_sojourn(lam, 1 / s), "M/M/1 vs M/D/1")
    else:
        assert_rejects(est, theory.mm1_sojourn(lam, 1 / mean), "M/E_n/1 vs M/M/1")


def test_static_batch_on_iteration_costs_matches_the_sum_of_its_iterations():
    # A batch of 3 (max tokens 1, 2, 4), prompts of 10: prefill iteration 1 + 0.5·3 + 0.1·30,
    # then rows leave as they finish: 2 rows decode, then 1, then 1.
    svc = iteration_profile(base=1.0, per_row=0.5, per_prefill_token=0.1).tasks["x"].service
    shape = BatchShape(3, 10, 4, (1, 2, 4))
    expected = (1 + 1.5 + 3.0) + (1 + 0.5 * 2) + (1 + 0.5) + (1 + 0.5)
    assert svc.mean(shape) == pytest.approx(expected)
    assert svc.sample(shape, np.random.default_rng(0)) == pytest.approx(expected)
    assert svc.variance(shape) == 0
    # first token: the prefill iteration and the first decoding one
    assert svc.first_token_mean(shape) == pytest.approx((1 + 1.5 + 3.0) + (1 + 0.5 * 2))


def test_context_cost_and_rows_that_stay_by_hand():
    # Same batch (max tokens 1, 2, 4; prompts of 10), 0.01 s per row per context token.
    # Iteration i has context 10 + i. Rows that stay: 3 rows in all 4 iterations.
    ctx = iteration_profile(base=1.0, per_row=0.5, per_prefill_token=0.1, per_context_token=0.01).tasks["x"].service
    shape = BatchShape(3, 10, 4, (1, 2, 4))
    leave = (1 + 1.5 + 3.0 + 0.01 * 3 * 10) + (1 + 0.5 * 2 + 0.01 * 2 * 11) + (1 + 0.5 + 0.01 * 12) + (1 + 0.5 + 0.01 * 13)
    assert ctx.mean(shape) == pytest.approx(leave)
    stay = profile_from_dict({"tasks": {"x": {"service": {
        "kind": "iteration", "finished_rows": "stay",
        "step": {"base": 1.0, "per_row": 0.5, "per_prefill_token": 0.1, "per_context_token": 0.01}}}}}).tasks["x"].service
    expected = (1 + 1.5 + 3.0 + 0.3) + sum(1 + 1.5 + 0.03 * (10 + i) for i in (1, 2, 3))
    assert stay.mean(shape) == pytest.approx(expected)
    assert stay.to_dict()["finished_rows"] == "stay" and stay.to_dict()["step"]["per_context_token"] == 0.01
    # a continuous engine's iteration pays for its rows' context too
    cost = step_cost(profile_from_dict({"tasks": {"x": {"service": ctx.to_dict()}}}).tasks["x"], ctx)
    assert cost.step(4, [], 100, None) == pytest.approx(1 + 0.5 * 4 + 0.01 * 4 * 100)
    with pytest.raises(ProfileError, match="finished_rows"):
        profile_from_dict({"tasks": {"x": {"service": {"kind": "iteration", "finished_rows": "never",
                                                        "step": {"base": 1.0}}}}})


def test_batch_kinds_derive_iteration_costs_that_add_up_to_the_batch_mean():
    """A distribution profile's iteration of R rows is mean(R) / I, I = 1 + ceil((m − 1) / t):
    R prompts admitted together and run to the task's length take the batch's mean."""
    profile = profile_from_dict({"tasks": {"x": {
        "prompt_tokens": 100, "max_tokens": 512, "tokens_per_iteration": 3.0,
        "service": {"kind": "distribution", "dist": "gamma", "cv": 0.1,
                    "mean": {"base": 96.0, "per_prompt": 0.6}}}}})
    tp = profile.tasks["x"]
    cost = step_cost(tp, tp.service)
    assert batch_iterations(512, 3.0) == 1 + 171
    assert cost.step(4, [], 500, None) * 172 == pytest.approx(96.0 + 0.6 * 4)
    tokens = cost.tokens(1000, np.random.default_rng(0))
    assert set(tokens.tolist()) == {3}
    # static first token: prefill + first iteration = 2 of the 172 iterations' share
    assert first_token_seconds(tp, tp.service, BatchShape(1, 100, 512), 86.0) == pytest.approx(86.0 * 2 / 172)


def test_spec_decode_iteration_cost_is_the_static_batch_per_iteration_term():
    from simulator.profile.kinds.spec_decode import Cost, SpecDecodeService

    costs = {"prefill_target": Cost("prefill", (0.01, 1e-4, 0.0)), "prefill_draft": Cost("prefill", (0.005, 1e-5, 0.0)),
             "draft_step": Cost("step", (0.002, 1e-5, 1e-8)), "verify": Cost("step", (0.01, 2e-5, 1e-8)),
             "iteration": Cost("iteration", (0.001, 0.0005))}
    svc = SpecDecodeService(costs, acceptance=1.0, lookahead=3, view_step=256)
    tp = profile_from_dict({"tasks": {"x": {"service": {"kind": "iteration", "step": {"base": 1.0}}}}}).tasks["x"]
    cost = step_cost(tp, svc)
    # With acceptance 1 every iteration commits k + 1 tokens: a 1-row batch of 9 tokens runs
    # the prefill plus ceil(8 / 4) = 2 iterations, as the static batch time says.
    static = svc.time_for(1, 100, 2, 9)
    continuous = (cost.step(0, [100], 0, None) + cost.step(1, [], 101, None, 109)
                  + cost.step(1, [], 105, None, 109))
    assert continuous == pytest.approx(static)
    assert cost.tokens(5, np.random.default_rng(0)).tolist() == [4] * 5


def test_jsq_tokens_sends_a_prompt_to_the_engine_with_less_work_left():
    # GPU 0 gets a 40-token prompt, GPU 1 a 4-token one; at 0.5 s the next goes to GPU 1,
    # and (least-loaded, by prompts: a tie) to GPU 0.
    trace = token_trace([(0, [40]), (0, [4]), (0.5, [2])])
    for rule, gpu in (("jsq-tokens", 1), ("least-loaded", 0)):
        log = run(trace, iteration_profile(base=0.25), gpus=2, topology="continuous", dispatch=rule)
        assert list(log["gpu"]) == [0, 1, gpu]


def test_prompt_larger_than_the_kv_cache_is_a_scenario_error():
    trace = token_trace([(0, [100])])
    with pytest.raises(ScenarioError, match="kv_blocks"):
        run(trace, iteration_profile(base=0.25), gpus=1, topology="continuous", kv_blocks=4)


def test_kv_capacity_derived_from_the_profile_memory_and_token_size():
    profile = profile_from_dict({"tasks": {"x": {
        "service": {"kind": "iteration", "step": {"base": 1.0}},
        "kv_cache": {"memory_gib": 1.0, "bytes_per_token": 2 * 28 * 8 * 128 * 2}}}})
    # 1 GiB / (114,688 bytes per token x 16 tokens per block) = 585 blocks
    assert profile.tasks["x"].kv_blocks(16) == 2**30 // (114_688 * 16) == 585


def test_engine_queue_limits_reject_and_drop_waiting_prompts():
    # One row at a time, iteration 1 s, 3 tokens each, all at 0: a, b, c wait (the engine
    # admits at the boundary after the arrivals), d finds 3 waiting: rejected. a runs 0..3;
    # b and c are not admitted by their timeout at 2.5: dropped.
    trace = token_trace([(0, [3]), (0, [3]), (0, [3]), (0, [3])])
    log = run(trace, iteration_profile(base=1.0), gpus=1, topology="continuous", max_num_seqs=1,
              max_queue=3, queue_timeout=2.5)
    assert list(log["status"]) == ["served", "dropped", "dropped", "rejected"]
    assert timeline(log)[0] == ("0.0", 3.0)
    sent = run(trace, iteration_profile(base=1.0), gpus=1, topology="continuous", max_num_seqs=1,
               queue_timeout=2.5, timeout_action="send")
    assert list(sent["status"]) == ["served", "sent_after_timeout", "sent_after_timeout", "sent_after_timeout"]
    assert timeline(sent) == [("0.0", 3.0), ("1.0", 6.0), ("2.0", 9.0), ("3.0", 12.0)]


# -- the engine's incremental bookkeeping -----------------------------------------------------

def run_checking_blocks(trace: Trace, profile, seed: int = 0, gpus: int = 1, **settings):
    """Simulate with continuous engines, recording at every iteration start, per engine,
    ``(instant, blocks in use, sum over running rows of ceil(tokens in cache / block size))``."""
    from simulator.model.engine import System

    scenario = build_scenario(defaults={"topology": "continuous", **settings}, run={"gpus": gpus})
    system = System(trace, scenario, profile, seed)
    fronts = {id(front): front for groups in system.groups for front, _ in groups}
    seen: list[tuple[float, int, int]] = []

    def check(engine):
        iterate = engine._iterate

        def checked(event=None):
            held = sum(-(-n // engine.block_size) for n in engine.rows.lengths().values())
            seen.append((engine.env.now, engine.total_blocks - engine.free_blocks, held))
            iterate(event)
        engine._iterate = checked

    for front in fronts.values():
        for engine in front.engines:
            check(engine)
    return system.run(), seen


def test_kv_blocks_in_use_are_the_running_rows_blocks_at_every_iteration_by_hand():
    """Blocks of 4 tokens, 10 blocks; prompts of 3 tokens; iteration 1 s. a (6 tokens) and b
    (3 tokens) arrive at 0, c (2 tokens) at 0.5.

    t=0  a, b admitted: 3 + 1 tokens, 1 block each (2 in use)
    t=1  a, b grow to 5 tokens, a 2nd block each; c admitted, 1 block (5 in use)
    t=2  a, b grow to 6 tokens, c to 5 (its 2nd block) -> t=3: b, c done (a's 2 in use)
    t=3  a: 7 tokens; t=4: 8; t=5: 9 tokens, its 3rd block -> t=6: a done (none in use)
    """
    trace = token_trace([(0, [6, 3]), (0.5, [2])])
    log, seen = run_checking_blocks(trace, iteration_profile(base=1.0, prompt_tokens=3),
                                    kv_blocks=10, block_size=4)
    assert timeline(log) == [("0.0", 6.0), ("0.1", 3.0), ("1.0", 3.0)]
    assert timeline(log, "first_token_at") == [("0.0", 1.0), ("0.1", 1.0), ("1.0", 2.0)]
    assert seen == [(0.0, 0, 0), (1.0, 2, 2), (2.0, 5, 5), (3.0, 2, 2), (4.0, 2, 2), (5.0, 2, 2), (6.0, 0, 0)]


def distribution_profile(tokens_per_iteration: float) -> object:
    return profile_from_dict({"tasks": {"x": {
        "resource": "gpu", "prompt_tokens": 5, "max_tokens": 30, "tokens_per_iteration": tokens_per_iteration,
        "service": {"kind": "distribution", "dist": "gamma", "cv": 0.3, "mean": {"base": 3.0, "per_prompt": 0.5}}}}})


def spec_decode_profile() -> object:
    costs = {"prefill_target": {"form": "prefill", "coef": [0.05, 0.001, 0.0]},
             "prefill_draft": {"form": "prefill", "coef": [0.01, 0.0, 0.0]},
             "draft_step": {"form": "step", "coef": [0.01, 0.0, 0.0001]},
             "verify": {"form": "step", "coef": [0.03, 0.001, 0.0]},
             "iteration": {"form": "iteration", "coef": [0.003, 0.0]}}
    return profile_from_dict({"tasks": {"x": {
        "resource": "gpu", "prompt_tokens": 5, "max_tokens": 30,
        "service": {"kind": "spec_decode", "costs": costs, "acceptance": 0.6, "lookahead": 3, "view_step": 8}}}})


BOOKS = {
    "one token per iteration": lambda: iteration_profile(dist="exponential", prompt_tokens=5, base=0.1, per_row=0.02),
    "three tokens per iteration": lambda: distribution_profile(3.0),
    "drawn: 2.5 tokens per iteration": lambda: distribution_profile(2.5),
    "drawn: speculative decoding": spec_decode_profile,
}


@pytest.mark.parametrize("book", list(BOOKS))
def test_kv_blocks_in_use_stay_the_running_rows_blocks_through_preemptions(book):
    # 60 prompts of 5 + up to 30 tokens on 2 engines of 14 blocks of 4 tokens: rows grow
    # into new blocks, are preempted and recomputed.
    rng = np.random.default_rng(11)
    starts = np.sort(rng.uniform(0, 20, size=30))
    trace = token_trace([(float(t), [int(m) for m in rng.integers(1, 31, size=2)]) for t in starts])
    log, seen = run_checking_blocks(trace, BOOKS[book](), gpus=2, kv_blocks=14, block_size=4,
                                    max_num_seqs=8, dispatch="jsq-tokens")
    assert (log["status"] == "served").all() and log["done_at"].notna().all()
    assert log["preemptions"].sum() > 0
    assert len(seen) > 100
    assert all(in_use == held for _, in_use, held in seen)


@pytest.mark.parametrize("book", ["one token per iteration", "three tokens per iteration"])
def test_fixed_and_drawn_gain_bookkeeping_give_the_same_log(book, monkeypatch):
    """Where every row makes the same tokens per iteration, the per-row arrays (as for drawn
    tokens) and the precomputed iterations agree to the last instant and preemption (the
    reference engine's bookkeeping: the compiled kernel keeps one kind of rows)."""
    from simulator.profile import iteration

    rng = np.random.default_rng(5)
    starts = np.sort(rng.uniform(0, 20, size=30))
    trace = token_trace([(float(t), [int(m) for m in rng.integers(1, 31, size=2)]) for t in starts])
    settings = {"topology": "continuous", "gpus": 2, "kv_blocks": 14, "block_size": 4, "max_num_seqs": 8,
                "max_batched_tokens": 12, "dispatch": "jsq-tokens", "engine": "reference"}
    fixed = run(trace, BOOKS[book](), seed=3, **settings)
    # the engines now take every cost's tokens as drawn
    monkeypatch.setattr(iteration.IterationKindCost, "fixed_tokens", None)
    average_init = iteration.BatchAverageCost.__init__

    def drawn_average_init(self, *args):
        average_init(self, *args)
        self.fixed_tokens = None
    monkeypatch.setattr(iteration.BatchAverageCost, "__init__", drawn_average_init)
    drawn = run(trace, BOOKS[book](), seed=3, **settings)
    assert fixed["preemptions"].sum() > 0
    pd.testing.assert_frame_equal(fixed, drawn)
