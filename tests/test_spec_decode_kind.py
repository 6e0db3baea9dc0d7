"""The spec_decode profile kind (replay side, no torch): iterations, times, overrides, errors."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import make_trace, run

from simulator.errors import ProfileError, ScenarioError
from simulator.profile import profile_from_dict
from simulator.profile.kinds import BatchShape
from simulator.profile.kinds.spec_decode import draw_accepted, iterations_needed

COSTS = {
    "prefill_target": {"form": "prefill", "coef": [0.5, 0.01, 0.0]},
    "prefill_draft": {"form": "prefill", "coef": [0.1, 0.0, 0.0]},
    "draft_step": {"form": "step", "coef": [0.01, 0.0, 0.001]},
    "verify": {"form": "step", "coef": [0.05, 0.002, 0.0]},
    "iteration": {"form": "iteration", "coef": [0.003, 0.0]},
}


def spec_profile(**service) -> object:
    svc = {"kind": "spec_decode", "costs": COSTS, "acceptance": 1.0, "lookahead": 3, "view_step": 8, **service}
    return profile_from_dict({"tasks": {"gen": {"resource": "gpu", "service": svc},
                                        "other": {"resource": "gpu", "service": {
                                            "kind": "distribution", "dist": "deterministic", "mean": 1.0}}}})


def test_ragged_iterations_by_hand():
    accepted = np.array([[1, 0], [0, 0], [2, 0]])
    # row 0 commits 2, 1, 3 (cumulative 2, 3, 6: reaches 4 in iteration 2); row 1 needs 1
    assert iterations_needed(np.array([4, 1]), accepted, "ragged") == 3


def test_lockstep_iterations_by_hand():
    accepted = np.array([[2, 0], [1, 3], [0, 0], [3, 3]])
    # min over unfinished rows: 0, 1, 0 (row 0 done: 1+2+1 = 4), then row 1 alone: 3
    assert iterations_needed(np.array([4, 6]), accepted, "lockstep") == 4


def test_truncated_geometric_draws():
    rng = np.random.default_rng(0)
    n = draw_accepted(rng, 0.6, 3, 200_000)
    pmf = [0.4, 0.24, 0.144, 0.216]
    assert np.bincount(n, minlength=4) / n.size == pytest.approx(pmf, abs=0.005)


def test_full_acceptance_service_time_by_hand():
    """alpha 1, k 3: every iteration commits 4 tokens; 9 max tokens = 1 (prefill) + 2 iterations."""
    service = spec_profile().task("gen").service
    t = service.sample(BatchShape(2, 10, 9, (9, 5)), np.random.default_rng(0))
    prefill = (0.5 + 0.01 * 2 * 10) + 0.1
    # views: bounds 10, 14 (+ k + 1 = 14, 18) rounded up to multiples of 8: 16, 24
    def iteration(view):
        draft = (0.01 + 0.001 * 2 * 2 * view) + 2 * (0.01 + 0.001 * 2 * 1 * view)
        return draft + (0.05 + 0.002 * 2 * 4) + 0.003
    assert t == pytest.approx(prefill + iteration(16) + iteration(24), rel=1e-12)


def test_lower_acceptance_and_lockstep_take_longer():
    shape = BatchShape(8, 100, 200, (200, 150, 120, 200, 50, 80, 200, 190))
    base = spec_profile(acceptance=0.7).task("gen").service
    mean = base.mean(shape)
    assert base.with_overrides(acceptance=0.3).mean(shape) > mean
    assert base.with_overrides(discipline="lockstep").mean(shape) > mean
    assert base.mean(shape) == mean  # Monte Carlo moments on a fixed stream: deterministic


@pytest.mark.parametrize("change, field", [
    ({"acceptance": 1.5}, "service.acceptance"),
    ({"lookahead": 0}, "service.lookahead"),
    ({"discipline": "sideways"}, "service.discipline"),
    ({"costs": {k: v for k, v in COSTS.items() if k != "verify"}}, "service.costs.verify"),
    ({"costs": {**COSTS, "verify": {"form": "prefill", "coef": [1, 1, 1]}}}, "service.costs.verify.form"),
    ({"costs": {**COSTS, "verify": {"form": "step", "coef": [1, -1, 1]}}}, "service.costs.verify.coef"),
])
def test_bad_spec_decode_profiles_name_the_field(change, field):
    with pytest.raises(ProfileError) as info:
        spec_profile(**change)
    assert info.value.field == field and info.value.record == "task 'gen'"


def test_scenario_overrides_reach_the_service_model():
    trace = make_trace([(0.0, ["gen"] * 4)])
    profile = spec_profile(acceptance=1.0)
    fast = run(trace, profile, max_batch=4)
    slow = run(trace, profile, max_batch=4, tasks={"gen": {"acceptance": 0.0}})
    assert slow["done_at"].iloc[0] > fast["done_at"].iloc[0]


def test_overrides_on_a_task_without_spec_decode():
    trace = make_trace([(0.0, ["other", "gen"])])
    profile = spec_profile()
    # a default applies where it can and is ignored elsewhere ...
    log = run(trace, profile, acceptance=0.5)
    assert len(log) == 2
    # ... but a task's own setting that cannot apply is an error
    with pytest.raises(ScenarioError, match="spec_decode"):
        run(trace, profile, tasks={"other": {"lookahead": 2}})
