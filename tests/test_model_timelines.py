"""Hand-computed timelines for the batching rules, with deterministic service times.

Each test states the timeline in a comment and asserts the whole list of
``(prompt, instant)`` pairs, so any change to the rules shows up as a diff.
"""

from __future__ import annotations

import pytest
from helpers import fixed_profile, make_trace, run, timeline

# Arrivals a..e at 0, 1, 2.5, 4, 4.5; one worker, one GPU, window 2 s, service 3 s.
ARRIVALS = make_trace([(0, ["x"]), (1, ["x"]), (2.5, ["x"]), (4, ["x"]), (4.5, ["x"])])


def test_oldest_timer_anchors_window_at_oldest_waiting_prompt():
    # t=0 a waits; t=1 b waits; t=2 a has waited 2 s -> batch {a,b} 2..5.
    # c, d, e arrive while busy; t=5 the head c (2.5) is overdue -> batch {c,d,e} 5..8.
    log = run(ARRIVALS, fixed_profile(x=3.0), gpus=1, flush=2.0, max_batch=10, policy="oldest")
    assert timeline(log, "batched_at") == [("0.0", 2), ("1.0", 2), ("2.0", 5), ("3.0", 5), ("4.0", 5)]
    assert timeline(log) == [("0.0", 5), ("1.0", 5), ("2.0", 8), ("3.0", 8), ("4.0", 8)]
    assert list(log["batch_size"]) == [2, 2, 3, 3, 3]


def test_pickup_timer_starts_window_when_free_worker_finds_prompts():
    # First batch as above ({a,b} at 2). At t=5 the freed worker finds {c,d,e} and starts
    # its window then: release at 7, done at 10.
    log = run(ARRIVALS, fixed_profile(x=3.0), gpus=1, flush=2.0, max_batch=10, policy="pickup")
    assert timeline(log, "batched_at") == [("0.0", 2), ("1.0", 2), ("2.0", 7), ("3.0", 7), ("4.0", 7)]
    assert timeline(log) == [("0.0", 5), ("1.0", 5), ("2.0", 10), ("3.0", 10), ("4.0", 10)]


@pytest.mark.parametrize("policy", ["oldest", "pickup", "adaptive"])
def test_full_batch_is_released_before_the_window_ends(policy):
    # max batch 2, window 10. a(0) b(1): full at 1 -> batch 1..4. c(2) waits; the worker
    # is free at 4 but the window is not over; d(5) fills the batch -> 5..8. e(6) alone:
    # oldest: window 6+10=16 -> 16..19; pickup: the worker frees at 8, finds e -> 18..21;
    # adaptive: a lone prompt's window is 10·(1 − 1/2) = 5 -> 11..14 (and c's ended at 7, but
    # the worker was busy until 4 and d filled the batch at 5 first).
    trace = make_trace([(0, ["x"]), (1, ["x"]), (2, ["x"]), (5, ["x"]), (6, ["x"])])
    log = run(trace, fixed_profile(x=3.0), gpus=1, flush=10.0, max_batch=2, policy=policy)
    last = {"oldest": 16.0, "pickup": 18.0, "adaptive": 11.0}[policy]
    assert timeline(log, "batched_at") == [("0.0", 1), ("1.0", 1), ("2.0", 5), ("3.0", 5), ("4.0", last)]
    assert timeline(log) == [("0.0", 4), ("1.0", 4), ("2.0", 8), ("3.0", 8), ("4.0", last + 3)]


def test_arrival_at_the_timer_instant_joins_the_batch():
    # Same-instant order: arrivals before flush timers. a(0), window 2, b arrives at 2.
    log = run(make_trace([(0, ["x"]), (2, ["x"])]), fixed_profile(x=1.0), gpus=1,
              flush=2.0, max_batch=10)
    assert timeline(log, "batched_at") == [("0.0", 2), ("1.0", 2)]
    assert list(log["batch_size"]) == [2, 2]


def test_completion_before_arrival_at_the_same_instant():
    # Same-instant order: a completion frees the worker before an arrival at that instant
    # is queued. flush 0: a 0..2; calls b and c both at 2 are taken in trace order: b is
    # released alone at 2 (2..4) and c waits for the worker (4..6).
    trace = make_trace([(0, ["x"]), (2, ["x"]), (2, ["x"])])
    log = run(trace, fixed_profile(x=2.0), gpus=1, flush=0.0, max_batch=5)
    assert timeline(log, "batched_at") == [("0.0", 0), ("1.0", 2), ("2.0", 4)]
    assert timeline(log) == [("0.0", 2), ("1.0", 4), ("2.0", 6)]


def test_call_group_is_batched_together_and_call_completes_with_last_prompt():
    # One call of 3 prompts, flush 0, max batch 2: batch {0,1} then {2} after it (1 GPU).
    log = run(make_trace([(1, ["x", "x", "x"])]), fixed_profile(x=2.0), gpus=1, max_batch=2)
    assert timeline(log) == [("0.0", 3), ("0.1", 3), ("0.2", 5)]


def test_split_round_robin_dispatches_prompt_by_prompt():
    # 2 GPUs, a queue each, flush 0, service 3. Call 0 at t=0 has 3 prompts: p0->q0,
    # p1->q1, p2->q0 (waits for q0's worker: 3..6). Call 1 at t=1: p3->q1 (3..6).
    trace = make_trace([(0, ["x", "x", "x"]), (1, ["x"])])
    log = run(trace, fixed_profile(x=3.0), gpus=2, topology="split", dispatch="round-robin",
              flush=0.0, max_batch=4)
    assert list(log["queue"]) == ["x@0", "x@1", "x@0", "x@1"]
    assert list(log["gpu"]) == [0, 1, 0, 1]
    assert timeline(log, "started_at") == [("0.0", 0), ("0.1", 0), ("0.2", 3), ("1.0", 3)]
    assert timeline(log) == [("0.0", 3), ("0.1", 3), ("0.2", 6), ("1.0", 6)]


def test_split_with_a_window_batches_each_queue_separately():
    # flush 1, max batch 4, round robin: call at 0 with 4 prompts -> q0 {0,2}, q1 {1,3},
    # both released at 1 as batches of 2.
    log = run(make_trace([(0, ["x"] * 4)]), fixed_profile(x=3.0), gpus=2, topology="split",
              flush=1.0, max_batch=4)
    assert list(log["batch_size"]) == [2, 2, 2, 2]
    assert timeline(log) == [("0.0", 4), ("0.1", 4), ("0.2", 4), ("0.3", 4)]


def test_shared_queue_two_workers_bound_to_gpus():
    # flush 0, max batch 1, 2 GPUs: a(0) on the longest-idle worker (GPU 0), b(0.5) on
    # GPU 1, c(1) waits until 3 for the first free worker (GPU 0).
    trace = make_trace([(0, ["x"]), (0.5, ["x"]), (1, ["x"])])
    log = run(trace, fixed_profile(x=3.0), gpus=2, flush=0.0, max_batch=1)
    assert list(log["gpu"]) == [0, 1, 0]
    assert timeline(log) == [("0.0", 3), ("1.0", 3.5), ("2.0", 6)]


def test_single_worker_takes_a_gpu_per_batch_round_robin():
    # shared, 1 worker, 2 GPUs: each batch goes to the next GPU in turn.
    trace = make_trace([(0, ["x"]), (5, ["x"]), (10, ["x"])])
    log = run(trace, fixed_profile(x=1.0), gpus=2, workers=1)
    assert list(log["gpu"]) == [0, 1, 0]


def test_direct_exclusive_gpu_holds_batches_in_fifo_line():
    # direct, 1 GPU exclusive: a (service 5) at 0, b (service 1) at 1 waits until 5.
    trace = make_trace([(0, ["a"]), (1, ["b"])])
    log = run(trace, fixed_profile(a=5.0, b=1.0), gpus=1, topology="direct")
    assert timeline(log, "batched_at") == [("0.0", 0), ("1.0", 1)]
    assert timeline(log, "started_at") == [("0.0", 0), ("1.0", 5)]
    assert timeline(log) == [("0.0", 5), ("1.0", 6)]


def test_processor_sharing_slows_concurrent_batches():
    # a (work 5) from 0; b (work 1) from 1. In [1, 3) each runs at rate 1/2, so b is done
    # at 3; a had 4 left at 1, 3 left at 3, and finishes alone at 6.
    trace = make_trace([(0, ["a"]), (1, ["b"])])
    log = run(trace, fixed_profile(a=5.0, b=1.0), gpus=1, topology="direct",
              gpu_sharing="processor-sharing")
    assert timeline(log, "started_at") == [("0.0", 0), ("1.0", 1)]
    assert timeline(log) == [("0.0", pytest.approx(6)), ("1.0", pytest.approx(3))]


def test_direct_splits_large_groups_into_max_batch_chunks():
    log = run(make_trace([(0, ["x"] * 5)]), fixed_profile(x=2.0), gpus=2, topology="direct",
              max_batch=2)
    assert list(log["batch_size"]) == [2, 2, 2, 2, 1]
    assert list(log["gpu"]) == [0, 0, 1, 1, 0]
    assert timeline(log) == [("0.0", 2), ("0.1", 2), ("0.2", 2), ("0.3", 2), ("0.4", 4)]


def test_cpu_task_with_unlimited_pool_never_waits():
    trace = make_trace([(0, ["cpu_g"]), (0, ["cpu_g"]), (0.1, ["cpu_g", "cpu_g"])])
    log = run(trace, fixed_profile(cpu_g=1.0), gpus=1, topology="direct")
    assert log["gpu"].isna().all()
    assert (log["started_at"] == log["arrived_at"]).all()
    assert timeline(log) == [("0.0", 1), ("1.0", 1), ("2.0", 1.1), ("2.1", 1.1)]


def test_cpu_pool_with_one_server_queues_batches():
    trace = make_trace([(0, ["cpu_g"]), (0, ["cpu_g"])])
    log = run(trace, fixed_profile(cpu_g=1.0), gpus=1, topology="direct", cpu_workers=1)
    assert timeline(log) == [("0.0", 1), ("1.0", 2)]


def test_adaptive_window_shrinks_as_the_batch_fills():
    """W = 4 s, B = 4, service 3 s, one GPU. a at 0: window 4·(1 − 1/4) = 3 s, to t = 3; b at 1:
    two waiting, window 2 s from a, to t = 2 (earlier than the first timer): {a, b} at 2, done
    at 5. c at 5.5 alone: window 3 s, to 8.5; d at 6, e at 6.5: three waiting, 1 s from c,
    i.e. 6.5, reached at e's arrival: {c, d, e} at 6.5, done at 9.5. The fixed `oldest`
    window would release {a, b} at 4 and {c, d, e} at 9.5."""
    trace = make_trace([(0, ["x"]), (1, ["x"]), (5.5, ["x"]), (6, ["x"]), (6.5, ["x"])])
    log = run(trace, fixed_profile(x=3.0), gpus=1, flush=4.0, max_batch=4, policy="adaptive")
    assert timeline(log, "batched_at") == [("0.0", 2.0), ("1.0", 2.0), ("2.0", 6.5), ("3.0", 6.5), ("4.0", 6.5)]
    assert timeline(log) == [("0.0", 5.0), ("1.0", 5.0), ("2.0", 9.5), ("3.0", 9.5), ("4.0", 9.5)]
    fixed = run(trace, fixed_profile(x=3.0), gpus=1, flush=4.0, max_batch=4, policy="oldest")
    assert timeline(fixed, "batched_at") == [("0.0", 4.0), ("1.0", 4.0), ("2.0", 9.5), ("3.0", 9.5), ("4.0", 9.5)]
