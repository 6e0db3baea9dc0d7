"""Autoscalers (simulator.model.autoscalers): each decision method on hand-made observations,
against the documented algorithms (Kubernetes HPA, Knative KPA, the users' serverless
platform); and the registry's contract."""

from __future__ import annotations

import pytest

from simulator.model.autoscalers import AUTOSCALERS, Autoscaler, Observation
from simulator.scenario import build_scenario


def make(name: str, **run) -> Autoscaler:
    return AUTOSCALERS.get(name)(build_scenario(run={"autoscaler": name, **run}))


def seen(now: float = 0.0, replicas: int = 2, ready: int | None = None, in_flight: int = 0, queued: int = 0,
         idle: tuple[float, ...] | None = None, utilization: float = 0.0) -> Observation:
    ready = replicas if ready is None else ready
    return Observation(now, replicas, ready, in_flight, queued, idle if idle is not None else (0.0,) * ready,
                       utilization)


# -- serverless -----------------------------------------------------------------------------
def test_serverless_scales_up_at_once_to_the_demand_over_target_inputs_plus_the_buffer():
    auto = make("serverless", min_replicas=2, max_replicas=20, target_inputs=8.0, buffer_replicas=1)
    assert auto.interval == 1.0
    assert auto.desired(seen(replicas=2, in_flight=16, queued=1)) == 3 + 1   # ceil(17 / 8) + 1
    assert auto.desired(seen(replicas=2, in_flight=0)) == 2  # nobody idle long enough: keep


def test_serverless_scales_down_only_by_replicas_idle_for_the_window():
    auto = make("serverless", min_replicas=0, target_inputs=8.0, scaledown_window=600.0)
    assert auto.desired(seen(replicas=4, in_flight=3, idle=(0.0, 599.9, 600.0, 1200.0))) == 2
    # never below the demand's replicas
    assert auto.desired(seen(replicas=4, in_flight=20, idle=(0.0, 0.0, 600.0, 600.0))) == 3


# -- Kubernetes HPA -------------------------------------------------------------------------
def test_hpa_is_ceil_current_times_ratio_outside_the_tolerance():
    auto = make("hpa", target_inputs=10.0, stabilization_down=0.0)
    assert auto.interval == 15.0
    # the Kubernetes docs' example shape: 50 replicas at 90 % of a 75 % target -> 60
    util = make("hpa", hpa_metric="utilization", target_utilization=0.75, stabilization_down=0.0)
    assert util.desired(seen(replicas=50, utilization=0.9)) == 60
    assert auto.desired(seen(replicas=4, in_flight=43)) == 4        # ratio 1.075: within 0.1
    assert auto.desired(seen(now=15, replicas=4, in_flight=45)) == 5  # ratio 1.125 -> ceil(4.5)
    assert auto.desired(seen(now=30, replicas=5, in_flight=10)) == 1  # ratio 0.2 -> 1


def test_hpa_scale_down_follows_the_highest_recommendation_of_the_window_and_max_step():
    auto = make("hpa", target_inputs=10.0, stabilization_down=300.0, max_step=2)
    assert auto.desired(seen(now=0, replicas=4, in_flight=80)) == 6    # wants 8, at most +2
    assert auto.desired(seen(now=15, replicas=6, in_flight=10)) == 6   # wants 1; 8 recommended 15 s ago
    assert auto.desired(seen(now=301, replicas=6, in_flight=10)) == 4  # window passed: 1, at most -2


def test_hpa_scale_up_stabilisation_takes_the_lowest_recommendation():
    auto = make("hpa", target_inputs=10.0, stabilization_up=60.0, stabilization_down=0.0)
    assert auto.desired(seen(now=0, replicas=2, in_flight=20)) == 2
    assert auto.desired(seen(now=15, replicas=2, in_flight=80)) == 2   # min(2, 8) over the last 60 s
    assert auto.desired(seen(now=61, replicas=2, in_flight=80)) == 8


# -- Knative KPA -----------------------------------------------------------------------------
def test_knative_stable_mode_averages_the_demand_over_the_stable_window():
    auto = make("knative", target_inputs=10.0, stable_window=60.0, panic_window=6.0)
    assert auto.interval == 2.0
    for t in range(0, 60, 2):
        wanted = auto.desired(seen(now=t, replicas=3, in_flight=30))
    assert wanted == 3
    # the demand drops to 0: the stable average falls over a minute, not at once
    assert auto.desired(seen(now=60, replicas=3, in_flight=0)) == 3
    for t in range(62, 122, 2):
        wanted = auto.desired(seen(now=t, replicas=3, in_flight=0))
    assert wanted == 0


def test_knative_panics_at_twice_the_ready_replicas_and_does_not_scale_down_while_panicking():
    auto = make("knative", target_inputs=10.0, stable_window=60.0, panic_window=6.0, panic_threshold=2.0)
    for t in range(0, 60, 2):
        auto.desired(seen(now=t, replicas=1, in_flight=10))
    # a burst: the panic window's demand wants 6 = 6x the ready replica -> panic, scale to it
    assert auto.desired(seen(now=60, replicas=1, in_flight=160)) >= 6
    # demand gone again: still panicking, no scale-down
    assert auto.desired(seen(now=70, replicas=6, in_flight=0)) >= 6
    # a stable window after the last burst, panic ends and the stable average rules
    for t in range(72, 200, 2):
        wanted = auto.desired(seen(now=t, replicas=6, in_flight=0))
    assert wanted == 0


# -- the registry -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", AUTOSCALERS.names())
def test_every_autoscaler_answers_a_whole_number_and_is_quiet_without_demand(name):
    auto = make(name, min_replicas=1, max_replicas=8, scaledown_window=0.0, stabilization_down=0.0)
    assert auto.__doc__
    answers = [auto.desired(seen(now=float(t), replicas=2, in_flight=d)) for t, d in enumerate([0, 5, 50, 0])]
    assert all(isinstance(a, int) and a >= 0 for a in answers)
    assert auto.interval is None or auto.interval > 0


def test_fixed_never_asks_again_and_the_interval_setting_overrides_the_others():
    assert make("fixed", min_replicas=3).interval is None
    assert make("fixed", min_replicas=3).desired(seen(in_flight=100)) == 3
    assert make("hpa", scale_interval=5.0).interval == 5.0
