"""The kernel's extension (simulator.model.compiled, simulator.model.extension): the event
log of numba's kernel, run without loading numba, and refused where it was built from other
sources or for another numpy."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from simulator.model import compiled, precompile
from simulator.model.engine import simulate
from simulator.model.kernel_layout import RUN_ARGS, SRNG_ARG
from simulator.model.kernel_sources import COMPILED, PACKAGE
from simulator.profile import load_profile
from simulator.scenario import build_scenario
from simulator.trace.formats import load_trace


def _require_extension() -> None:
    """Skip where the checkout's compiled folder is not current (a kernel source edited since
    ``python -m simulator.model.precompile``); where it is, its extension must load."""
    if not precompile.reusable(COMPILED):
        pytest.skip("simulator/model/_compiled/ is not current: python -m simulator.model.precompile")
    compiled.extension.cache_clear()
    assert compiled.extension() is not None, f"{COMPILED} holds no usable extension (its build said why)"


@pytest.fixture
def numba_kernel(monkeypatch):
    """Runs in this test on numba's kernel; the extension again after it."""
    def use(on: bool) -> None:
        if on:
            monkeypatch.setenv(compiled.NO_EXTENSION, "1")
        else:
            monkeypatch.delenv(compiled.NO_EXTENSION, raising=False)
        compiled.extension.cache_clear()

    yield use
    monkeypatch.delenv(compiled.NO_EXTENSION, raising=False)
    compiled.extension.cache_clear()


def test_the_argument_names_are_the_kernels():
    from simulator.model.batch_kernel import run_kernel

    assert tuple(inspect.signature(run_kernel.py_func).parameters) == RUN_ARGS
    assert RUN_ARGS[SRNG_ARG] == "SRNG"


CONTINUOUS = {"tasks.mmlu.topology": "continuous", "tasks.mmlu.max_num_seqs": 6, "tasks.infobench.topology": "split",
              "run.gpu_sharing": "processor-sharing", "run.gpus": 3}


@pytest.mark.parametrize(("profile", "overrides"), [
    ("seed-calibrated", {}),
    ("seed-calibrated", CONTINUOUS),
    ("a100-sxm-qwen3-4b-qwen3-0.6b-hf-eager", {"tasks.mmlu.dispatch": "random", "tasks.graph.resource": "cpu",
                                               "tasks.graph.cpu_workers": 2}),
    # two tasks draw from their streams: the typed list the extension builds itself
    ("h100-sxm-qwen3-8b-qwen3-0.6b-cuda-graph", {"tasks.infobench.policy": "pickup", "run.gpus": 2}),
])
def test_the_extension_gives_numba_kernels_event_log(profile, overrides, numba_kernel):
    _require_extension()
    trace = load_trace("example").scaled(2.0)
    scenario = build_scenario(path="design-notes", overrides=overrides)
    on_extension = simulate(trace, scenario, load_profile(profile), 5, engine="fast")
    numba_kernel(True)
    on_numba = simulate(trace, scenario, load_profile(profile), 5, engine="fast")
    assert on_extension.attrs["engine"] == on_numba.attrs["engine"] == "fast"
    pd.testing.assert_frame_equal(on_extension, on_numba)


@pytest.mark.parametrize(("profile", "overrides"), [
    ("seed-calibrated", CONTINUOUS),
    ("h100-sxm-qwen3-8b-qwen3-0.6b-cuda-graph", {"tasks.infobench.policy": "pickup", "run.gpus": 2}),
])
def test_the_extension_frees_what_each_run_allocates(profile, overrides):
    """Its reference counts are plain increments (extension._plain_reference_counts): a
    count that never reached zero would keep every run's arrays (some 10 MiB a run here)."""
    _require_extension()
    trace = load_trace("example").scaled(2.0)
    from simulator.trace.model import Call, Trace

    calls = [Call(f"{k}-{c.id}", c.t + 700.0 * k, c.prompts) for k in range(40) for c in trace.calls]
    trace = Trace(tuple(calls))
    scenario = build_scenario(path="design-notes", overrides=overrides)
    loaded = load_profile(profile)

    def resident_mib() -> float:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    for seed in range(3):
        simulate(trace, scenario, loaded, seed, engine="fast")
    before = resident_mib()
    for seed in range(3, 13):
        simulate(trace, scenario, loaded, seed, engine="fast")
    assert resident_mib() - before < 8


def test_a_replay_on_the_extension_never_imports_numba():
    _require_extension()
    code = ("import sys, simulator as sim\n"
            "r = sim.replay('example', sim.build_scenario(path='design-notes', run={'engine': 'auto'}), keep_log=False)\n"
            "print(r.summary['overall']['prompts'], r.summary['config']['engine'], 'numba' in sys.modules)\n")
    env = {k: v for k, v in os.environ.items() if k != compiled.NO_EXTENSION}
    env["PYTHONPATH"] = str(PACKAGE.parent)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    # auto takes the kernel at once: loading the extension costs no more than the run
    assert out.stdout.split() == ["347", "fast", "False"]


def test_an_extension_of_other_sources_or_another_numpy_is_not_loaded(tmp_path, monkeypatch):
    _require_extension()
    stamp = json.loads((COMPILED / compiled.EXTENSION_STAMP).read_text())
    folder = tmp_path / "_compiled"
    folder.mkdir()
    (folder / stamp["file"]).symlink_to(COMPILED / stamp["file"])
    monkeypatch.setattr(compiled, "COMPILED", folder)
    major, minor = (int(x) for x in np.__version__.split(".")[:2])
    cases = [({}, True), ({"sources": "0" * 64}, False), ({"python": "2.7"}, False), ({"file": "other.so"}, False),
             ({"numpy": f"{major}.{minor + 1}.0"}, False), ({"numpy": f"{major + 1}.0.0"}, False),
             ({"numpy": f"{major}.0.0"}, True), ({"numpy": "garbled"}, False)]
    try:
        for change, loads in cases:
            (folder / compiled.EXTENSION_STAMP).write_text(json.dumps({**stamp, **change}))
            compiled.extension.cache_clear()
            assert (compiled.extension() is not None) == loads, change
        (folder / compiled.EXTENSION_STAMP).write_text("{not json")
        compiled.extension.cache_clear()
        assert compiled.extension() is None
    finally:
        monkeypatch.undo()
        compiled.extension.cache_clear()


class _Recorder:
    """An extension's entry points that record what they were given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def run_kernel_one(self, *args):
        self.calls.append(("one", args))
        return "one"

    def run_kernel_streams(self, *args):
        self.calls.append(("streams", args))
        return "streams"


def test_the_streams_reach_the_extension_one_by_one_and_too_many_reach_numba(monkeypatch):
    recorder = _Recorder()
    monkeypatch.setattr(compiled, "extension", lambda: recorder)
    before, after = tuple(range(SRNG_ARG)), tuple(range(100, 100 + len(RUN_ARGS) - SRNG_ARG - 1))
    rngs = [np.random.default_rng(i) for i in range(compiled.MAX_STREAMS + 1)]
    assert compiled.run_kernel((*before, [rngs[0]], *after)) == "one"
    assert recorder.calls[-1][1] == (*before, rngs[0], *after)
    assert compiled.run_kernel((*before, [], *after)) == "one"  # (an unused stream: no task draws)
    assert isinstance(recorder.calls[-1][1][SRNG_ARG], np.random.Generator)
    assert compiled.run_kernel((*before, rngs[:3], *after)) == "streams"
    args = recorder.calls[-1][1]
    assert args[:SRNG_ARG] == before and args[SRNG_ARG] == 3
    assert list(args[SRNG_ARG + 1:SRNG_ARG + 4]) == rngs[:3] and len(args) == len(RUN_ARGS) + compiled.MAX_STREAMS
    # more streams than the extension takes: numba's kernel, with a typed list of them all
    from simulator.model import batch_kernel

    seen = []
    monkeypatch.setattr(batch_kernel, "run_kernel", lambda *a: seen.append(a[SRNG_ARG]) or "numba")
    assert compiled.run_kernel((*before, rngs, *after)) == "numba"
    assert len(recorder.calls) == 3 and len(seen[0]) == len(rngs) and type(seen[0]).__name__ == "List"
