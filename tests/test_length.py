"""Length-aware batch forming (simulator.model.length): hand-computed timelines for length
buckets and for ``similar-length`` selection, the rules' own arithmetic, the registry's
contract (every prompt served once, no batch above max batch, same seed same log), and the
fallback to the reference engine."""

from __future__ import annotations

from collections import deque

import numpy as np
import pandas as pd
import pytest
from helpers import assert_one_line_error, fixed_profile, timeline
from hypothesis import HealthCheck, given, settings, strategies as st
from test_model_contracts import _check_invariants

from simulator.errors import ScenarioError
from simulator.metrics import summarize
from simulator.model import simulate
from simulator.model.fast import unsupported
from simulator.model.length import SELECTIONS, LengthBuckets, RowLengths
from simulator.scenario import build_scenario
from simulator.settings import TASK, parse_bounds
from simulator.trace.model import Call, Prompt, Trace

SHORT, LONG = (10, 10), (100, 100)   # lengths 20 and 200 (prompt + max tokens)


def length_trace(calls: list[tuple[float, tuple[int, int]]]) -> Trace:
    """One ``x`` prompt per call: ``(t, (prompt tokens, max tokens))``."""
    return Trace(tuple(Call(str(i), float(t), (Prompt("x", p, m),)) for i, (t, (p, m)) in enumerate(calls)))


def _run(trace: Trace, seconds: float = 3.0, **task) -> pd.DataFrame:
    gpus = task.pop("gpus", 1)
    return simulate(trace, build_scenario(defaults=task, run={"gpus": gpus}), fixed_profile(x=seconds), 0)


# a short(0) b long(0.5) c short(1) d long(1.5); window 2 s, max batch 10, 3 s per batch
MIXED = length_trace([(0, SHORT), (0.5, LONG), (1, SHORT), (1.5, LONG)])


def test_one_queue_batches_every_length_together():
    log = _run(MIXED, flush=2.0, max_batch=10)
    assert timeline(log) == [("0.0", 5), ("1.0", 5), ("2.0", 5), ("3.0", 5)]
    assert summarize(log)["overall"]["padding"]["waste"] == pytest.approx(1 - 440 / 800)


@pytest.mark.parametrize("buckets", [{"bucket_bounds": "100"}, {"length_buckets": 2}])
def test_length_buckets_queue_each_bucket_on_its_own_window(buckets):
    # Boundary 100 (given, or the median of 20, 200, 20, 200 = 110): a, c in x#0; b, d in x#1.
    # x#0: window from a (0) ends at 2 -> {a, c} on the GPU 2..5.
    # x#1: window from b (0.5) ends at 2.5 -> {b, d} formed at 2.5 (its own worker), waits
    #      for the exclusive GPU until 5 -> 5..8.
    log = _run(MIXED, flush=2.0, max_batch=10, **buckets)
    assert list(log["queue"]) == ["x#0", "x#1", "x#0", "x#1"]
    assert timeline(log, "batched_at") == [("0.0", 2), ("1.0", 2.5), ("2.0", 2), ("3.0", 2.5)]
    assert timeline(log, "started_at") == [("0.0", 2), ("1.0", 5), ("2.0", 2), ("3.0", 5)]
    assert timeline(log) == [("0.0", 5), ("1.0", 8), ("2.0", 5), ("3.0", 8)]
    assert summarize(log)["overall"]["padding"]["waste"] == 0.0
    assert log.attrs["engine"].startswith("reference (tasks.x.")


def test_split_buckets_have_a_queue_per_gpu_per_bucket():
    # Two GPUs, round-robin over each bucket's queues by one rule: a -> x@0#0, b -> x@1#1,
    # c -> x@0#0, d -> x@1#1. {a, c} 2..5 on GPU 0; {b, d} at 2.5 on the idle GPU 1 -> 5.5.
    log = _run(MIXED, flush=2.0, max_batch=10, topology="split", bucket_bounds="100", gpus=2)
    assert list(log["queue"]) == ["x@0#0", "x@1#1", "x@0#0", "x@1#1"]
    assert timeline(log, "started_at") == [("0.0", 2), ("1.0", 2.5), ("2.0", 2), ("3.0", 2.5)]
    assert timeline(log) == [("0.0", 5), ("1.0", 5.5), ("2.0", 5), ("3.0", 5.5)]


# a(20) alone at 0 (flush 0) 0..3; while it runs b(200) c(30) d(210) e(25) arrive.
BACKLOG = length_trace([(0, (10, 10)), (1, (100, 100)), (1.5, (15, 15)), (2, (105, 105)), (2.5, (12, 13))])


def test_fifo_takes_the_oldest():
    # t=3: four wait, max batch 2 -> {b, c} 3..6, then {d, e} 6..9.
    log = _run(BACKLOG, flush=0.0, max_batch=2)
    assert timeline(log) == [("0.0", 3), ("1.0", 6), ("2.0", 6), ("3.0", 9), ("4.0", 9)]
    # waste: 0 + (400 − 230) + (420 − 235) over 20 + 400 + 420
    assert summarize(log)["overall"]["padding"]["waste"] == pytest.approx(355 / 840, rel=1e-12)


def test_similar_length_takes_the_oldest_and_its_nearest():
    # t=3: the head b (200) and its nearest d (210) -> {b, d} 3..6; then {c, e} 6..9.
    log = _run(BACKLOG, flush=0.0, max_batch=2, batch_selection="similar-length")
    assert timeline(log, "batched_at") == [("0.0", 0), ("1.0", 3), ("2.0", 6), ("3.0", 3), ("4.0", 6)]
    assert timeline(log) == [("0.0", 3), ("1.0", 6), ("2.0", 9), ("3.0", 6), ("4.0", 9)]
    assert list(log["batch_id"]) == [0, 1, 2, 1, 2]
    # waste: 0 + (420 − 410) + (60 − 55) over 20 + 420 + 60
    assert summarize(log)["overall"]["padding"]["waste"] == pytest.approx(15 / 500, rel=1e-12)


def test_similar_length_breaks_ties_to_the_older_and_keeps_arrival_order():
    waiting = deque([7, 3, 9, 4, 5])
    length = {7: 100, 3: 90, 9: 110, 4: 100, 5: 300}
    assert SELECTIONS.get("similar-length")().take(waiting, 3, length) == [7, 3, 4]   # 4 (0), then 3 (10) before 9 (10)
    assert list(waiting) == [9, 5]
    assert SELECTIONS.get("similar-length")().take(waiting, 2, length) == [9, 5]
    assert not waiting
    fifo = deque([1, 2, 3])
    assert SELECTIONS.get("fifo")().take(fifo, 2, length) == [1, 2] and list(fifo) == [3]
    assert RowLengths([5, 6], [10, 20])[1] == 26


def test_quantile_buckets_split_lengths_in_equal_counts():
    lengths = np.arange(1, 101)  # 1..100
    buckets = LengthBuckets.from_quantiles(lengths, 4)
    assert buckets.bounds == (26, 51, 76)  # ceil of 25.75, 50.5, 75.25
    assert np.bincount([buckets.of(int(v)) for v in lengths]).tolist() == [25, 25, 25, 25]
    assert LengthBuckets.from_quantiles(lengths, 1).count == 1
    # one distinct length: equal boundaries, every prompt in the last bucket, the others empty
    assert {LengthBuckets.from_quantiles([50] * 9, 3).of(50)} == {2}


def test_bucket_bounds_grammar():
    assert parse_bounds("600,1500") == (600, 1500)
    for bad in ("1500,600", "0,5", "a,b", "5,5"):
        with pytest.raises(ValueError):
            parse_bounds(bad)
    with pytest.raises(ScenarioError, match="bucket_bounds"):
        build_scenario(defaults={"bucket_bounds": "10,5"})


def test_buckets_given_twice_is_an_error():
    with pytest.raises(ScenarioError, match="length_buckets .* or bucket_bounds, not both"):
        _run(MIXED, length_buckets=2, bucket_bounds="100")


def test_the_fast_engine_names_the_length_settings_it_lacks():
    for key, value in (("batch_selection", "similar-length"), ("length_buckets", 4), ("bucket_bounds", "100")):
        assert TASK[key].reference_only
        scenario = build_scenario(defaults={key: value})
        assert unsupported(MIXED, scenario, fixed_profile(x=1.0)) == f"tasks.x.{key}"
        with pytest.raises(ScenarioError, match=key):
            simulate(MIXED, build_scenario(defaults={key: value}, run={"engine": "fast"}), fixed_profile(x=1.0))


def test_serve_refuses_length_rules():
    from simulator.serve.runtime import check_served

    with pytest.raises(ScenarioError, match="length_buckets"):
        check_served(build_scenario(defaults={"length_buckets": 2}), ["x"])


def test_the_cli_takes_the_length_flags_and_names_a_bad_one(tmp_path):
    from typer.testing import CliRunner

    from simulator.cli import app

    runner = CliRunner()
    ok = runner.invoke(app, ["replay", "example", "--length-buckets", "2", "--batch-selection", "similar-length",
                             "--json", str(tmp_path / "s.json")])
    assert ok.exit_code == 0, ok.stdout + ok.stderr
    assert "Padding waste per task" in ok.stdout
    bad = runner.invoke(app, ["replay", "example", "--batch-selection", "shortest"])
    assert_one_line_error(bad, "--batch-selection", "similar-length")
    bad = runner.invoke(app, ["replay", "example", "--set", "tasks.mmlu.bucket_bounds=9,3"])
    assert_one_line_error(bad, "bucket_bounds", "increasing")


lengths = st.tuples(st.integers(1, 400), st.integers(1, 200))
length_calls = st.lists(
    st.tuples(st.floats(min_value=0, max_value=40, allow_nan=False).map(lambda t: round(t, 1)),
              st.lists(st.tuples(st.sampled_from(["x", "y"]), lengths), min_size=1, max_size=6)),
    min_size=1, max_size=20).map(lambda cs: sorted(cs, key=lambda c: c[0]))
length_settings = st.fixed_dictionaries({
    "topology": st.sampled_from(["shared", "split"]),
    "policy": st.sampled_from(["oldest", "pickup", "adaptive", "static"]),
    "batch_selection": st.sampled_from(SELECTIONS.names()),
    "length_buckets": st.sampled_from([1, 2, 3, 8]),
    "flush": st.sampled_from([0.0, 0.5, 3.0]),
    "max_batch": st.integers(1, 5),
    "max_queue": st.sampled_from([None, 3]),
    "queue_timeout": st.sampled_from([None, 2.0]),
    "batch_forming": st.sampled_from(["eager", "gpu-free"]),
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls=length_calls, x=length_settings, y=length_settings, gpus=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_length_rules_keep_the_invariants(calls, x, y, gpus, seed):
    trace = Trace(tuple(Call(str(i), t, tuple(Prompt(task, p, m) for task, (p, m) in prompts))
                        for i, (t, prompts) in enumerate(calls)))
    scenario = build_scenario(run={"gpus": gpus}, tasks={"x": x, "y": y})
    profile = fixed_profile(x={"base": 1.0, "per_prompt": 0.5}, y=2.0)
    log = simulate(trace, scenario, profile, seed)
    _check_invariants(log, trace, {"x": x, "y": y}, "exclusive")
    pd.testing.assert_frame_equal(log, simulate(trace, scenario, profile, seed))
    # a prompt's queue is its bucket's
    for task, cfg in (("x", x), ("y", y)):
        rows = log[(log["task"] == task) & log["status"].isin(["served", "sent_after_timeout"])]
        if cfg["length_buckets"] > 1 and len(rows):
            assert rows["queue"].astype(str).str.contains("#").all()
