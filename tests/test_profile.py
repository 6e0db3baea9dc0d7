"""Service profiles: the fixed schema, each kind's mean/variance/sample contract, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simulator.errors import ProfileError
from simulator.profile import BatchShape, load_profile, profile_from_dict


def svc(**service):
    return profile_from_dict({"name": "t", "tasks": {"x": {"service": service}}}).tasks["x"].service


def shape(b, p=100, m=100):
    return BatchShape(b, p, m)


def test_bundled_default_profile_loads_and_says_where_its_numbers_come_from():
    prof = load_profile()
    assert prof.name == "seed-calibrated"
    assert "design notes" in prof.source
    assert set(prof.tasks) == {"graph", "mmlu", "infobench"}
    assert prof.tasks["graph"].resource == "cpu"
    ib = prof.tasks["infobench"].service
    # 170 iterations x 0.6 s for a full batch of 10 (the design notes' figures).
    assert ib.mean(shape(10)) == pytest.approx(170 * 0.6)


@pytest.mark.parametrize("dist,cv", [("exponential", 1.0), ("gamma", 0.5), ("lognormal", 0.3),
                                     ("deterministic", 0.0)])
def test_distribution_samples_match_mean_and_variance(dist, cv):
    model = svc(kind="distribution", dist=dist, cv=cv, mean={"base": 2.0, "per_prompt": 0.5})
    s = shape(4)
    assert model.mean(s) == pytest.approx(4.0)
    assert model.variance(s) == pytest.approx((cv * 4.0) ** 2)
    rng = np.random.default_rng(7)
    x = np.array([model.sample(s, rng) for _ in range(40000)])
    se = np.sqrt(model.variance(s) / len(x))
    assert abs(x.mean() - 4.0) <= 4 * se + 1e-12
    if cv > 0:
        # The sample variance's standard error depends on the fourth moment; 5 % is ~4 SE
        # even for the lognormal at this sample size.
        assert x.var() == pytest.approx(model.variance(s), rel=0.05)


def test_mean_by_batch_size_interpolates_and_extrapolates_linearly():
    model = svc(kind="distribution", dist="deterministic", mean={"by_batch_size": {"1": 2.0, "4": 5.0}})
    assert [model.mean(shape(b)) for b in (1, 2, 4, 6)] == pytest.approx([2.0, 3.0, 5.0, 7.0])


def test_table_kind_interpolates_over_batch_size_and_tokens():
    model = svc(kind="table", axes={"batch_size": [1, 4], "max_tokens": [100, 500]},
                seconds=[[1.0, 5.0], [2.0, 8.0]])
    assert model.mean(shape(1, m=100)) == pytest.approx(1.0)
    assert model.mean(shape(4, m=500)) == pytest.approx(8.0)
    # Midpoint in both axes: bilinear.
    assert model.mean(shape(2.5, m=300)) == pytest.approx((1 + 5 + 2 + 8) / 4)
    # Outside the grid: linear extrapolation.
    assert model.mean(shape(7, m=100)) == pytest.approx(3.0)
    assert model.sample(shape(4, m=500), np.random.default_rng(0)) == pytest.approx(8.0)


def test_table_with_noise_keeps_its_mean():
    model = svc(kind="table", axes={"batch_size": [1, 8]}, seconds=[2.0, 4.0], dist="gamma", cv=0.2)
    rng = np.random.default_rng(3)
    x = np.array([model.sample(shape(8), rng) for _ in range(20000)])
    assert abs(x.mean() - 4.0) < 4 * 0.2 * 4.0 / np.sqrt(len(x))


def test_profile_batch_service_time_uses_the_batch_longest_prompt():
    prof = profile_from_dict({"tasks": {"x": {"service": {
        "kind": "table", "axes": {"max_tokens": [100, 200]}, "seconds": [1.0, 2.0]}}}})
    t = prof.batch_service_time("x", [(10, 100), (10, 200)], np.random.default_rng(0))
    assert t == pytest.approx(2.0)


@pytest.mark.parametrize("tasks,field", [
    ({"x": {"service": {"kind": "nope"}}}, "service.kind"),
    ({"x": {"service": {"dist": "weird", "mean": 1}}}, "service.dist"),
    ({"x": {"service": {"dist": "gamma", "mean": 1}}}, "service.cv"),
    ({"x": {"service": {"dist": "exponential", "mean": -1}}}, "service.mean"),
    ({"x": {"service": {"dist": "exponential", "mean": "fast"}}}, "service.mean"),
    ({"x": {"service": {"dist": "exponential"}}}, "service.mean"),
    ({"x": {"resource": "tpu", "service": {"mean": 1}}}, "resource"),
    ({"x": {"max_tokens": 0, "service": {"mean": 1}}}, "max_tokens"),
    ({"x": {"service": {"kind": "table", "axes": {"batch_size": [1, 2]}, "seconds": [1.0]}}}, "service.seconds"),
    ({"x": {"service": {"kind": "table", "axes": {"batch_size": [2, 1]}, "seconds": [1, 2]}}}, "service.axes.batch_size"),
    ({"x": {"service": {"kind": "table", "axes": {"colour": [1, 2]}, "seconds": [1, 2]}}}, "service.axes.colour"),
])
def test_bad_profiles_name_the_task_and_field(tasks, field):
    with pytest.raises(ProfileError) as err:
        profile_from_dict({"tasks": tasks}, "p.json")
    message = str(err.value)
    assert message.startswith("p.json: task 'x': ") and f"field '{field}'" in message
    assert "\n" not in message


def test_profile_file_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ProfileError, match="bad.json: not valid JSON"):
        load_profile(bad)
    with pytest.raises(ProfileError, match="no bundled profile of that name .*seed-calibrated"):
        load_profile("no-such-profile")
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"tasks": {}}))
    with pytest.raises(ProfileError, match="field 'tasks'"):
        load_profile(empty)


def test_missing_task_is_reported_with_the_tasks_the_profile_has():
    prof = load_profile()
    with pytest.raises(ProfileError, match="task 'summarize'.*it has: "):
        prof.task("summarize")


def test_round_trip_to_dict():
    prof = load_profile()
    again = profile_from_dict(prof.to_dict())
    for name, tp in prof.tasks.items():
        assert again.tasks[name].service.mean(shape(3)) == pytest.approx(tp.service.mean(shape(3)))
