"""Small builders shared by the tests: in-memory traces, one-line profiles, quick runs."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd

from simulator.model import simulate
from simulator.profile import Profile, profile_from_dict
from simulator.scenario import build_scenario
from simulator.trace.model import Call, Prompt, Trace


def make_trace(calls: Iterable[tuple[float, Sequence[str]]]) -> Trace:
    """A trace from ``(t, [task, task, ...])`` pairs; call ids are their positions."""
    return Trace(tuple(
        Call(str(i), float(t), tuple(Prompt(task) for task in tasks))
        for i, (t, tasks) in enumerate(calls)
    ))


def fixed_profile(**seconds: Any) -> Profile:
    """Deterministic service per task: ``fixed_profile(a=3.0, b={"base": 1, "per_prompt": 1})``.

    A task named ``cpu_*`` runs on the CPU."""
    return profile_from_dict({"tasks": {
        task: {"resource": "cpu" if task.startswith("cpu") else "gpu",
               "service": {"kind": "distribution", "dist": "deterministic", "mean": mean}}
        for task, mean in seconds.items()
    }})


def run(trace: Trace, profile: Profile, seed: int = 0, tasks: dict | None = None,
        **settings: Any) -> pd.DataFrame:
    """Simulate with task ``settings`` for every task and ``gpus``/``gpu_sharing`` for the run."""
    from simulator.settings import RUN as run_keys

    scenario = build_scenario(
        defaults={k: v for k, v in settings.items() if k not in run_keys},
        run={k: v for k, v in settings.items() if k in run_keys},
        tasks=tasks,
    )
    return simulate(trace, scenario, profile, seed)


def timeline(log: pd.DataFrame, column: str = "done_at") -> list[tuple[str, float]]:
    """``[(call_id.prompt_index, instant)]`` in trace order, for whole-timeline asserts."""
    return [(f"{c}.{p}", float(x)) for c, p, x in
            zip(log["call_id"], log["prompt_index"], log[column], strict=True)]


def assert_one_line_error(result, *needles: str) -> None:
    """A CLI result that exited 2 with a single ``error:`` line naming every needle, no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def assert_same_figures(got: Any, want: Any, *, exact_types: bool = True, close: tuple[str, ...] = (),
                        where: str = "") -> None:
    """``got`` is ``want`` leaf for leaf: the same keys in the same order, lists as long, NaN
    where NaN, every other leaf equal. ``exact_types``: each leaf of ``want``'s own type (else
    any float matches a float); ``close``: the names of leaves (a mean summed in another
    order) equal within floating-point rounding, not bit for bit."""
    import math

    import pytest

    assert type(got) is type(want) or (not exact_types and isinstance(got, float) and isinstance(want, float)), \
        f"{where}: {got!r} against {want!r}"
    if isinstance(want, dict):
        assert list(got) == list(want), where
        for k in want:
            assert_same_figures(got[k], want[k], exact_types=exact_types, close=close, where=f"{where}.{k}")
    elif isinstance(want, list):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same_figures(g, w, exact_types=exact_types, close=close, where=f"{where}.{i}")
    elif isinstance(want, float) and where.rsplit(".", 1)[-1] in close:
        assert got == pytest.approx(want, rel=1e-12, abs=0.0) or (math.isnan(got) and math.isnan(want)), where
    elif isinstance(want, float) and math.isnan(want):
        assert math.isnan(got), where
    else:
        assert got == want, f"{where}: {got!r} against {want!r}"
