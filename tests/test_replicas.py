"""The replica pool (simulator.model.replicas): hand-computed timelines of a burst with cold
starts, scale-up and scale-down; Erlang C through a pinned pool; a pool of one is the system
without a pool; the pool rules' contract over the registry; the records and their figures."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import theory
from helpers import assert_one_line_error, fixed_profile, make_trace
from test_theory import (
    assert_matches,
    assert_rejects,
    exponential,
    poisson_trace,
    replicate,
    service_profile,
    service_rate,
)
from typer.testing import CliRunner

from simulator.cli import app
from simulator.errors import ScenarioError
from simulator.events import EVENT_COLUMNS, POOL_COLUMNS, SERVED
from simulator.metrics import replica_figures, replica_timeline, summarize
from simulator.model import AUTOSCALERS, POOL_RULES, simulate
from simulator.model.replicas import cold_start_draw
from simulator.model.streams import cold_start_stream
from simulator.scenario import build_scenario
from simulator.settings import parse_cold_start
from simulator.trace.model import Call, Prompt, Trace


def pool(gpus: int = 1, **run) -> object:
    """A scenario of one-prompt batches, no waiting, with the pool settings ``run``."""
    return build_scenario(defaults={"flush": 0.0, "max_batch": 1}, run={"gpus": gpus, **run})


def rows(log: pd.DataFrame) -> list[tuple]:
    """``(call, replica, dispatched_at, started_at, done_at)`` per prompt, trace order."""
    return [(c, int(r), float(d), float(s), float(e)) for c, r, d, s, e in
            zip(log["call_id"], log["replica"], log["dispatched_at"], log["started_at"], log["done_at"], strict=True)]


def lifecycle(log: pd.DataFrame) -> list[tuple]:
    t = log.attrs["replicas"]
    return list(zip(t["replica"], t["requested_at"], t["ready_at"], t["drain_at"], t["stopped_at"], strict=True))


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


# -- hand-computed timelines --------------------------------------------------------------
def test_a_burst_scales_up_after_the_cold_start_and_down_after_the_idle_window():
    """Service 10 s, cold start 5 s, decisions every second, one call per replica.

    t=0: replica 0 warm. t=0.5: A, B, C arrive; A -> r0, B and C wait in the pool's queue.
    t=1: demand 3 (1 in flight + 2 queued), target 1 -> start r1, r2 (ready at 6).
    t=6: r1 takes B, r2 takes C. t=10.5: A done (r0 idle). t=16: B, C done.
    t=31: r0 idle 20.5 s >= 20 -> drained (stops at once). t=36: r1, r2 idle 20 s; the
    demand wants 0, min 1 -> r1 (first of the equally idle) drained. t=40: D -> r2, done 50:
    the run ends, r2 stops then."""
    trace = make_trace([(0.5, ["x"]), (0.5, ["x"]), (0.5, ["x"]), (40.0, ["x"])])
    scen = pool(autoscaler="serverless", min_replicas=1, max_replicas=3, max_inputs=1, target_inputs=1.0,
                scale_interval=1.0, scaledown_window=20.0, replica_cold_start="5")
    log = simulate(trace, scen, fixed_profile(x=10.0))
    assert rows(log) == [("0", 0, 0.5, 0.5, 10.5), ("1", 1, 6.0, 6.0, 16.0), ("2", 2, 6.0, 6.0, 16.0),
                         ("3", 2, 40.0, 40.0, 50.0)]
    nan = math.nan
    expected = [(0, 0.0, 0.0, 31.0, 31.0), (1, 1.0, 6.0, 36.0, 36.0), (2, 1.0, 6.0, nan, 50.0)]
    got = lifecycle(log)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert all(same(a, b) for a, b in zip(g, e, strict=True)), (g, e)
    assert log["gpu"].tolist() == [0, 1, 2, 2]  # a replica's GPUs are its own
    figures = summarize(log)["replicas"]
    assert figures["replica_seconds"] == 31.0 + 35.0 + 49.0
    assert figures["gpu_hours"] == pytest.approx(115.0 / 3600)
    assert (figures["started"], figures["cold_starts"], figures["peak_replicas"]) == (3, 2, 3)
    assert figures["time_at_max_s"] == 30.0  # requested 3 from 1 to 31
    assert figures["pool_wait"]["max"] == 5.5
    assert figures["cold_start_wait_s"] == 0.0  # r0 was ready all along


def test_from_zero_replicas_the_first_call_waits_for_the_cold_start():
    """min 0: A at 0.5 waits; the decision at 1 starts r0, ready at 6 (cold start 5); A runs
    6..16. No replica was ready over [0.5, 6): all 5.5 s of its wait are cold-start wait."""
    trace = make_trace([(0.5, ["x"])])
    scen = pool(autoscaler="serverless", min_replicas=0, max_replicas=1, scale_interval=1.0,
                replica_cold_start="load:16:4:1")  # 16 GB at 4 GB/s + 1 s engine start = 5 s
    log = simulate(trace, scen, fixed_profile(x=10.0))
    assert rows(log) == [("0", 0, 6.0, 6.0, 16.0)]
    figures = replica_figures(log)
    assert figures["cold_start_wait_s"] == 5.5
    assert figures["cold_start_share"] == pytest.approx(5.5 / 15.5)
    assert figures["replica_seconds"] == 15.0 and figures["cold_starts"] == 1


def test_a_full_pool_queue_rejects_and_calls_beyond_max_inputs_wait_in_order():
    """Two replicas of one call each, a pool queue of one: at t=0 five calls arrive; two are
    taken, one waits (taken at 10 by the first replica to finish), two are rejected."""
    trace = make_trace([(0.0, ["x"])] * 5)
    scen = pool(autoscaler="fixed", min_replicas=2, max_inputs=1, pool_queue=1)
    log = simulate(trace, scen, fixed_profile(x=10.0))
    assert log["status"].tolist() == ["served", "served", "served", "rejected", "rejected"]
    assert log["done_at"].tolist()[:3] == [10.0, 10.0, 20.0]
    assert log["replica"].iloc[2] == 0 and log["dispatched_at"].iloc[2] == 10.0
    assert log["replica"].isna().tolist() == [False, False, False, True, True]


# -- exact checks against theory and against the system without a pool ----------------------
def test_a_pool_pinned_at_c_replicas_of_one_call_is_mmc_erlang_c():
    """min = max = 2 replicas of 1 GPU taking one call at a time, one FCFS pool queue:
    M/M/2, whose mean sojourn is Erlang C's. Negative control: two independent M/M/1
    queues at half the rate each (random split) are 3.33 s, not 1.96 s."""
    c, lam = 2, 1.4
    profile = service_profile(x=exponential(1.0))
    mu = service_rate(profile)
    scen = pool(autoscaler="fixed", min_replicas=c, max_replicas=c, max_inputs=1, pool_rule="round-robin")
    (est,) = replicate(211, 10, lambda rng: poisson_trace(rng, 6_000, lam), scen, profile)
    assert_matches(est, theory.mmc_sojourn(lam, mu, c), "M/M/2 through a pool")
    assert_rejects(est, theory.mm1_sojourn(lam / c, mu), "pool vs split M/M/1")


def test_md1_through_a_pool_of_one_replica_taking_one_call_at_a_time():
    """Today's M/D/1 bar (Pollaczek–Khinchine) with the queue in the pool instead of the
    replica: one replica, ``max_inputs = 1``. Negative control: M/M/1."""
    from test_theory import deterministic

    profile = service_profile(x=deterministic(1.0))
    mu, lam = service_rate(profile), 0.6
    scen = pool(autoscaler="fixed", min_replicas=1, max_inputs=1)
    # M/D/1 is far less noisy than M/M/2 above: 2,000 calls a replication give SE/theory
    # about 1.1 % (the bar is 3 %) and still reject a service time 3 % too long (+4.7 SE).
    (est,) = replicate(212, 10, lambda rng: poisson_trace(rng, 2_000, lam), scen, profile)
    assert_matches(est, theory.md1_sojourn(lam, mu), "M/D/1 through a pool")
    assert_rejects(est, theory.mm1_sojourn(lam, mu), "M/D/1 vs M/M/1")


def test_a_pool_of_one_unlimited_replica_is_the_system_without_a_pool():
    """The theory bars hold through a pool because a pool of one replica taking every call
    is the same system: the same log, prompt by prompt (design-notes trace and scenario)."""
    from simulator.profile import load_profile
    from simulator.trace.formats import load_trace

    trace = load_trace("example")
    base = build_scenario(path="design-notes")
    pooled = build_scenario(path="design-notes", run={"autoscaler": "fixed"})
    profile = load_profile("seed-calibrated")
    plain = simulate(trace, base, profile, seed=3, engine="reference")
    through = simulate(trace, pooled, profile, seed=3)
    assert "replicas" not in plain.attrs and list(plain.columns) == EVENT_COLUMNS
    assert list(through.columns) == [*EVENT_COLUMNS, *POOL_COLUMNS]
    pd.testing.assert_frame_equal(plain, through[EVENT_COLUMNS], check_dtype=False)
    assert (through["dispatched_at"] == through["arrived_at"]).all()
    assert set(through["replica"]) == {0}


def test_without_a_pool_the_compiled_kernel_still_runs_and_a_pool_runs_on_the_reference_engine():
    trace = make_trace([(0.0, ["x"]), (1.0, ["x"])])
    plain = simulate(trace, pool(engine="fast"), fixed_profile(x=1.0))
    pooled = simulate(trace, pool(autoscaler="serverless"), fixed_profile(x=1.0))
    assert plain.attrs["engine"] == "fast" and "replicas" not in plain.attrs
    assert pooled.attrs["engine"] == "reference (run.autoscaler)"


# -- records and figures ---------------------------------------------------------------------
def bursty_trace(seed: int, n: int = 300, tasks: tuple[str, ...] = ("x",)) -> Trace:
    """Calls in bursts (a quiet minute, then a rush), 1–3 prompts each."""
    rng = np.random.default_rng(seed)
    rate = np.where((np.arange(n) // 50) % 2 == 0, 0.3, 4.0)
    times = np.cumsum(rng.exponential(1.0 / rate))
    return Trace(tuple(
        Call(str(i), float(t), tuple(Prompt(tasks[int(rng.integers(len(tasks)))]) for _ in range(int(rng.integers(1, 4)))))
        for i, t in enumerate(times)))


def test_replica_seconds_are_the_integral_of_the_replica_count():
    scen = pool(gpus=2, autoscaler="serverless", min_replicas=1, max_replicas=6, target_inputs=2.0,
                scaledown_window=30.0, replica_cold_start="samples:3,8,20")
    log = simulate(bursty_trace(5), scen, service_profile(x=exponential(2.0)), seed=5)
    line = replica_timeline(log.attrs["replicas"])
    integral = float(np.sum(line["up"].to_numpy()[:-1] * np.diff(line["at"].to_numpy())))
    figures = replica_figures(log)
    assert figures["cold_starts"] >= 2  # the bursts did scale the pool
    assert figures["replica_seconds"] == pytest.approx(integral, rel=1e-12)
    assert figures["gpu_hours"] == pytest.approx(integral * 2 / 3600, rel=1e-12)
    assert line["requested"].iloc[:-1].between(1, 6).all()


def test_same_seed_same_log_and_lifecycle_other_seed_other_cold_starts():
    scen = pool(autoscaler="knative", min_replicas=1, max_replicas=5, target_inputs=2.0,
                replica_cold_start="samples:1,5,9,30")
    profile = service_profile(x=exponential(2.0))
    a, b = (simulate(bursty_trace(1), scen, profile, seed=7) for _ in range(2))
    pd.testing.assert_frame_equal(a, b)
    assert a.attrs["replicas"] == b.attrs["replicas"]
    c = simulate(bursty_trace(1), scen, profile, seed=8)
    assert c.attrs["replicas"] != a.attrs["replicas"]


def test_the_lifecycle_survives_a_parquet_event_log(tmp_path):
    from simulator.events import read_event_log, write_event_log

    scen = pool(autoscaler="serverless", min_replicas=1, max_replicas=4, target_inputs=2.0)
    log = simulate(bursty_trace(2, n=120), scen, service_profile(x=exponential(2.0)), seed=1)
    write_event_log(log, tmp_path / "log.parquet")
    back = read_event_log(tmp_path / "log.parquet")
    assert summarize(back)["replicas"] == summarize(log)["replicas"]


def test_cold_start_grammar_and_draws_from_the_named_stream():
    assert parse_cold_start("12.5").mean == 12.5
    assert parse_cold_start("load:140:10:20").mean == 34.0
    spec = parse_cold_start("samples:2,4,9")
    draws = [cold_start_draw(spec, cold_start_stream(3)) for _ in range(2)]
    assert draws[0] == draws[1] and draws[0] in (2.0, 4.0, 9.0)
    rng = cold_start_stream(3)
    assert {cold_start_draw(spec, rng) for _ in range(200)} == {2.0, 4.0, 9.0}
    for bad in ("-1", "samples:", "samples:1,x", "load:1", "load:1:0", "nope:1", "inf"):
        with pytest.raises(ValueError, match="SECONDS"):
            parse_cold_start(bad)


def test_bad_pool_settings_are_one_line_errors_naming_the_field():
    with pytest.raises(ScenarioError, match="max_replicas"):
        simulate(make_trace([(0, ["x"])]), pool(autoscaler="hpa", min_replicas=3, max_replicas=2),
                 fixed_profile(x=1.0))
    with pytest.raises(ScenarioError, match="min_replicas"):
        simulate(make_trace([(0, ["x"])]), pool(autoscaler="fixed", min_replicas=0, max_replicas=2),
                 fixed_profile(x=1.0))
    runner = CliRunner()
    result = runner.invoke(app, ["replay", "example", "--autoscaler", "nope"])
    assert_one_line_error(result, "autoscaler", "serverless")
    result = runner.invoke(app, ["replay", "example", "--replica-cold-start", "load:1"])
    assert_one_line_error(result, "replica-cold-start", "load:")


def test_replay_prints_and_writes_the_pool_figures():
    runner = CliRunner()
    result = runner.invoke(app, ["replay", "example", "-c", "design-notes", "--autoscaler", "serverless",
                                 "--min-replicas", "1", "--max-replicas", "3", "--target-inputs", "2",
                                 "--replica-cold-start", "30", "--json", "-"])
    assert result.exit_code == 0, result.stderr
    import json

    figures = json.loads(result.stdout)["replicas"]
    assert figures["gpu_hours"] > 0 and figures["started"] >= 1
    table = runner.invoke(app, ["replay", "example", "-c", "design-notes", "--autoscaler", "serverless",
                                "--max-replicas", "3", "--target-inputs", "2"])
    assert table.exit_code == 0, table.stderr
    assert "GPU-hours" in table.stdout and "cold starts" in table.stdout


# -- the contract, over every pool rule and autoscaler ------------------------------------------
@pytest.mark.parametrize("autoscaler", AUTOSCALERS.names())
@pytest.mark.parametrize("rule", POOL_RULES.names())
def test_every_pool_rule_and_autoscaler_serve_every_prompt_once_within_the_bounds(rule, autoscaler):
    lo, hi, cap = 1, 4, 2
    scen = build_scenario(
        defaults={"flush": 0.2, "max_batch": 4},
        run={"gpus": 1, "autoscaler": autoscaler, "pool_rule": rule, "min_replicas": lo, "max_replicas": hi,
             "max_inputs": cap, "target_inputs": 1.5, "scaledown_window": 20.0, "stabilization_down": 20.0,
             "replica_cold_start": "samples:2,6"},
        tasks={"y": {"topology": "split"}})
    trace = bursty_trace(11, n=200, tasks=("x", "y"))
    log = simulate(trace, scen, service_profile(x=exponential(1.0), y=exponential(0.5)), seed=2)
    assert len(log) == trace.n_prompts
    assert log["status"].isin(SERVED).all() and log["done_at"].notna().all()
    assert (log["batch_id"] >= 0).all()
    assert (log["dispatched_at"] >= log["arrived_at"]).all()
    assert (log["started_at"] >= log["dispatched_at"]).all() and (log["done_at"] >= log["started_at"]).all()
    # a call's prompts all on one replica
    assert (log.groupby("call_index")["replica"].nunique() == 1).all()
    table = log.attrs["replicas"]
    line = replica_timeline(table)
    assert line["requested"].iloc[:-1].between(lo, hi).all()
    # each call was taken by a replica that was ready and not draining then
    ready = np.asarray(table["ready_at"])[log["replica"].to_numpy(int)]
    drain = np.asarray(table["drain_at"])[log["replica"].to_numpy(int)]
    assert (ready <= log["dispatched_at"].to_numpy()).all()
    assert not (drain <= log["dispatched_at"].to_numpy()).any()
    # at most max_inputs calls at once on a replica: calls as [dispatched, done of the last prompt)
    calls = log.groupby("call_index").agg(r=("replica", "first"), s=("dispatched_at", "first"), e=("done_at", "max"))
    for _, mine in calls.groupby("r"):
        t = np.concatenate([mine["s"], mine["e"]])
        step = np.concatenate([np.ones(len(mine)), -np.ones(len(mine))])
        order = np.lexsort((step, t))  # an end before a start at one instant
        assert np.cumsum(step[order]).max() <= cap


def test_plot_timeline_draws_the_replicas_of_a_pooled_log(tmp_path):
    from simulator.events import write_event_log

    scen = pool(autoscaler="serverless", min_replicas=1, max_replicas=4, target_inputs=2.0, replica_cold_start="5")
    log = simulate(bursty_trace(3, n=150), scen, service_profile(x=exponential(2.0)), seed=1)
    write_event_log(log, tmp_path / "pool.parquet")
    result = CliRunner().invoke(app, ["plot", "timeline", str(tmp_path / "pool.parquet"), "-o",
                                      str(tmp_path / "pool.png")])
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "pool.png").stat().st_size > 10_000


def test_a_closed_loop_client_and_the_run_cold_start_go_through_the_pool():
    """closed:2 keeps two calls outstanding across the pool; nothing is taken before the
    run's cold_start (5 s): calls of 1 s service on two replicas end at 6, 6, 7, 7."""
    trace = make_trace([(0.0, ["x"])] * 4)
    scen = pool(autoscaler="fixed", min_replicas=2, max_inputs=1, client="closed:2", cold_start=5.0)
    log = simulate(trace, scen, fixed_profile(x=1.0))
    assert log["done_at"].tolist() == [6.0, 6.0, 7.0, 7.0]
    assert log["replica"].tolist() == [0, 1, 0, 1]


# -- the pool rules, without simpy ----------------------------------------------------------------
def fake(index: int, in_flight: int = 0) -> object:
    from simulator.model.replicas import Replica

    r = Replica.__new__(Replica)
    r.index, r.in_flight = index, in_flight
    return r


def test_pool_rules_choose_by_their_definition():
    from simulator.model.replicas import LeastLoaded, PrefixAffinity, RoundRobin

    reps = [fake(0, 2), fake(3, 1), fake(5, 1)]
    rr = RoundRobin()
    assert [reps[rr.choose(0, reps)].index for _ in range(4)] == [0, 3, 5, 0]
    assert rr.choose(0, [fake(1), fake(4)]) == 0  # after 0: the next index up is 1
    assert LeastLoaded().choose(0, reps) == 1     # fewest calls, the first such
    affinity = PrefixAffinity()
    assert affinity.choose(7, reps) == affinity.choose(7, reps) == 7 % 3


def test_hpa_on_utilisation_scales_a_busy_pool_up():
    scen = pool(autoscaler="hpa", hpa_metric="utilization", target_utilization=0.5, min_replicas=1,
                max_replicas=4, scale_interval=5.0, stabilization_down=60.0, max_inputs=1)
    rng = np.random.default_rng(4)
    log = simulate(poisson_trace(rng, 400, 1.5), scen, service_profile(x=exponential(1.0)), seed=4)
    figures = replica_figures(log)
    assert figures["peak_replicas"] == 4 and figures["cold_starts"] >= 3
    assert log["status"].isin(SERVED).all()


def test_a_pool_setting_without_a_pool_is_an_error_naming_it():
    from simulator.model.replicas import POOL_SETTINGS
    from simulator.settings import RUN

    assert set(POOL_SETTINGS) <= set(RUN)
    after = list(RUN)[list(RUN).index("autoscaler") + 1:]
    assert list(POOL_SETTINGS) == after  # every setting declared in the pool block, and only those
    with pytest.raises(ScenarioError, match="max_inputs"):
        simulate(make_trace([(0, ["x"])]), pool(max_inputs=2), fixed_profile(x=1.0))


def test_a_pooled_run_is_priced_by_its_replica_seconds():
    """The burst above: 115 replica-seconds of 1 GPU, priced at the table's rate; without a
    pool the same trace is priced by its span (first arrival to last completion)."""
    from simulator.cost import cost_summary, price_table, provisioned_gpu_seconds
    from simulator.metrics import summarize
    from simulator.profile import profile_from_dict

    trace = make_trace([(0.5, ["x"]), (0.5, ["x"]), (0.5, ["x"]), (40.0, ["x"])])
    scen = pool(autoscaler="serverless", min_replicas=1, max_replicas=3, max_inputs=1, target_inputs=1.0,
                scale_interval=1.0, scaledown_window=20.0, replica_cold_start="5")
    profile = fixed_profile(x=10.0)
    summary = summarize(simulate(trace, scen, profile))
    assert provisioned_gpu_seconds(summary, scen) == 115.0
    prices = price_table({"name": "test", "gpus": {"h100-sxm": {"usd_per_gpu_hour": 3.6}}})
    priced = profile_from_dict({"meta": {"gpu": "h100-sxm"}, "tasks": {"x": {
        "resource": "gpu", "service": {"kind": "distribution", "dist": "deterministic", "mean": 10.0}}}})
    cost = cost_summary(summary, scen, priced, prices)
    assert cost["gpu_hours"] == pytest.approx(115.0 / 3600) and cost["usd"] == pytest.approx(0.115)
    fixed = summarize(simulate(trace, pool(), profile))
    assert provisioned_gpu_seconds(fixed, pool()) == 50.0 - 0.5
