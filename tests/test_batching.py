"""Batch forming (simulator/model/batching.py): the shaping hook, the forming rules, the
adaptive-lookahead decorator; and named dispatch groups."""

from __future__ import annotations

import numpy as np
import pandas as pd
from helpers import fixed_profile, make_trace, run
from test_spec_decode_kind import spec_profile

from simulator.model.batching import BATCH_FORMING, AdaptiveLookahead, Shaping
from simulator.model.resources import ServerPool
from simulator.profile.kinds import BatchShape
from simulator.profile.kinds.spec_decode import adaptive_lookahead


def test_rows_per_prompt_shape_a_batch_by_hand():
    ptoks, mtoks = [10, 30, 20], [5, 2, 7]
    assert Shaping().shape(ptoks, mtoks, [0, 1]) == (BatchShape(2, 30, 5, (5, 2)), 1)
    assert Shaping(3).shape(ptoks, mtoks, [0, 2]) == (BatchShape(6, 20, 7, (5, 5, 5, 7, 7, 7)), 1)
    # a lone prompt runs its rows one generation after another
    assert Shaping(3, sequential_single=True).shape(ptoks, mtoks, [2]) == (BatchShape(1, 20, 7, (7,)), 3)
    assert Shaping(3, sequential_single=True).shape(ptoks, mtoks, [1, 2])[1] == 1


def test_forming_rules_pick_the_worker_that_forms_the_batch():
    class W:
        def __init__(self, device):
            self.device = device

    busy, free = ServerPool(None, 0, 1), ServerPool(None, 1, 1)  # type: ignore[arg-type]
    busy.outstanding = 1
    idle = [W(busy), W(free)]
    assert BATCH_FORMING.get("eager")().worker(idle) is idle[0]
    assert BATCH_FORMING.get("gpu-free")().worker(idle) is idle[1]
    assert BATCH_FORMING.get("gpu-free")().worker(idle[:1]) is None
    assert BATCH_FORMING.get("gpu-free")().worker([W(None)]).device is None
    assert BATCH_FORMING.get("gpu-free").watches_devices and not BATCH_FORMING.get("eager").watches_devices


def test_adaptive_lookahead_follows_each_devices_recorded_acceptance():
    service = spec_profile(acceptance=1.0, lookahead=3).tasks["gen"].service
    adaptive = AdaptiveLookahead(service)
    gpu0, gpu1 = ServerPool(None, 0, 1), ServerPool(None, 1, 1)  # type: ignore[arg-type]
    first = adaptive.for_batch(gpu0)
    assert first.service.lookahead == 3  # no history yet: the profile's
    rng = np.random.default_rng(0)
    first.sample(BatchShape(2, 8, 6), rng)  # every draft accepted: rates of 1.0 recorded
    assert adaptive.for_batch(gpu0).service.lookahead == adaptive_lookahead(3, 1.0) == 5
    assert adaptive.for_batch(gpu1).service.lookahead == 3  # another device, its own history
    # the decorated service draws what the service with that lookahead draws
    again = adaptive.for_batch(gpu1)
    shape = BatchShape(2, 8, 6)
    assert again.sample(shape, np.random.default_rng(4)) == service.sample(shape, np.random.default_rng(4))


def test_adaptive_lookahead_changes_a_runs_batches():
    trace = make_trace([(t * 0.1, ["gen", "gen"]) for t in range(20)])
    fixed = run(trace, spec_profile(acceptance=0.9), gpus=1)
    adaptive = run(trace, spec_profile(acceptance=0.9), gpus=1, adaptive_lookahead=True)
    assert not fixed["done_at"].equals(adaptive["done_at"])


def test_a_named_dispatch_group_is_what_shared_rotation_was():
    trace = make_trace([(0, ["cpu_graph"]), (1, ["x"]), (2, ["cpu_graph"]), (3, ["x"])])
    profile = fixed_profile(x=0.5, cpu_graph=0.1)
    tasks = {"x": {"topology": "split", "dispatch": "round-robin", "dispatch_per": "group"},
             "cpu_graph": {"topology": "direct"}}
    old = run(trace, profile, gpus=2, tasks=tasks, shared_rotation=["cpu_graph", "x"])
    named = {t: {**v, "dispatch_group": "server"} for t, v in tasks.items()}
    new = run(trace, profile, gpus=2, tasks=named)
    pd.testing.assert_frame_equal(old, new)
    assert list(new[new["task"] == "x"]["gpu"]) == [1, 1]
    # two groups rotate apart: x alone alternates again
    apart = run(trace, profile, gpus=2, tasks={"x": {**tasks["x"], "dispatch_group": "a"},
                                               "cpu_graph": {**tasks["cpu_graph"], "dispatch_group": "b"}})
    assert list(apart[apart["task"] == "x"]["gpu"]) == [0, 1]


def test_a_dispatch_group_runs_on_the_reference_engine():
    from simulator.model.fast import unsupported
    from simulator.scenario import build_scenario
    from simulator.settings import TASK

    assert TASK["dispatch_group"].reference_only
    trace = make_trace([(0, ["x"])])
    scenario = build_scenario(tasks={"x": {"dispatch_group": "server"}})
    assert "dispatch_group" in (unsupported(trace, scenario, fixed_profile(x=1.0)) or "")
    log = run(trace, fixed_profile(x=1.0), tasks={"x": {"dispatch_group": "server"}})
    assert log.attrs["engine"].startswith("reference")
