"""The compiled service times of the iteration and spec_decode kinds
(:mod:`simulator.model.kernel_service`) against the kinds' own ``sample`` and
``first_token_seconds``: the same floats and the same draws, batch by batch."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from simulator.model.kernel_layout import lower_service
from simulator.model.kernel_service import batch_service, pairwise_sum
from simulator.profile import profile_from_dict
from simulator.profile.iteration import first_token_seconds
from simulator.profile.kinds import BatchShape

ENGINE = st.fixed_dictionaries(
    {"overlap": st.booleans(), "launch_s": st.sampled_from([0.0, 1.8e-5]), "step_s": st.sampled_from([0.0, 1.5e-3]),
     "row_s": st.sampled_from([0.0, 5e-5]),
     "kernels": st.dictionaries(st.sampled_from(["step", "prefill", "draft", "verify"]),
                                st.sampled_from([0.0, 300.0, 2250.0]))})
COEF = st.floats(0.0, 0.05, allow_subnormal=False)
ITERATION = st.fixed_dictionaries(
    {"kind": st.just("iteration"), "dist": st.sampled_from(["deterministic", "exponential", "gamma"]),
     "cv": st.sampled_from([0.2, 0.7]), "finished_rows": st.sampled_from(["leave", "stay"]),
     "step": st.fixed_dictionaries({"base": st.floats(1e-3, 0.05), "per_row": COEF,
                                    "per_prefill_token": st.sampled_from([0.0, 1e-5, 3.3e-6]),
                                    "per_context_token": st.sampled_from([0.0, 1e-7, 2.9e-8])})},
    optional={"engine": ENGINE})
SPEC = st.fixed_dictionaries(
    {"kind": st.just("spec_decode"),
     "costs": st.fixed_dictionaries({
         "prefill_target": st.fixed_dictionaries({"form": st.just("prefill"), "coef": st.lists(COEF, min_size=3, max_size=3)}),
         "prefill_draft": st.fixed_dictionaries({"form": st.just("prefill"), "coef": st.lists(COEF, min_size=3, max_size=3)}),
         "draft_step": st.fixed_dictionaries({"form": st.just("step"), "coef": st.lists(COEF, min_size=3, max_size=3)}),
         "verify": st.fixed_dictionaries({"form": st.just("step"), "coef": st.lists(COEF, min_size=3, max_size=3)}),
         "iteration": st.fixed_dictionaries({"form": st.just("iteration"), "coef": st.lists(COEF, min_size=2, max_size=2)})}),
     "acceptance": st.sampled_from([0.0, 0.02, 0.3, 0.7, 0.95, 1.0]), "lookahead": st.integers(1, 6),
     "discipline": st.sampled_from(["ragged", "lockstep"]), "view_step": st.sampled_from([1, 8, 256]),
     "kv_cache": st.booleans()},
    optional={"engine": ENGINE})
BATCH = st.tuples(st.integers(0, 3000), st.lists(st.integers(1, 300), min_size=1, max_size=12))


def _task(spec):
    return profile_from_dict({"tasks": {"t": {"resource": "gpu", "service": spec}}}).task("t")


def _check(spec, batches, seed):
    task = _task(spec)
    service = task.service
    si, sf = lower_service(service)
    reference, compiled = np.random.default_rng([seed, 1, 7]), np.random.default_rng([seed, 1, 7])
    for prompt, rows in batches:
        shape = BatchShape(len(rows), prompt, max(rows), tuple(rows))
        work = service.sample(shape, reference)
        first = first_token_seconds(task, service, shape, work)
        got = batch_service(si, sf, compiled, np.array(rows, dtype=np.int64), prompt)
        assert got == (work, first)
    assert reference.random() == compiled.random()  # the same number of draws


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=ITERATION, batches=st.lists(BATCH, min_size=1, max_size=4), seed=st.integers(0, 3))
def test_iteration_kind_batch_by_batch(spec, batches, seed):
    _check(spec, batches, seed)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=SPEC, batches=st.lists(BATCH, min_size=1, max_size=4), seed=st.integers(0, 3))
def test_spec_decode_kind_batch_by_batch(spec, batches, seed):
    _check(spec, batches, seed)


@pytest.mark.parametrize("n", [*range(0, 300), 1000, 4097, 65537])
def test_pairwise_sum_is_numpys(n):
    a = np.random.default_rng(n).exponential(size=n) * 10.0 ** np.random.default_rng(n + 1).integers(-6, 3, n)
    assert pairwise_sum(a, 0, n) == float(a.sum())
    if n > 3:
        assert pairwise_sum(a, 3, n - 3) == float(a[3:].sum())
