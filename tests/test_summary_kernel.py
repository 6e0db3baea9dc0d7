"""The compiled summary pass (simulator.summary_kernel, called from the kernel's extension)
gives a small run's summary exactly as numpy's passes give it: every figure equal bit for
bit, every count the same type, on engines' logs and on random logs of every shape a log
may take (turned-away prompts, unfinished ones, idle GPUs, prompts on no GPU, calls and
batches out of order, single-token outputs, a deadline, a client timeout, goodput)."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
from helpers import assert_same_figures

import simulator.metrics as metrics
from simulator.events import LogColumns
from simulator.metrics import TokenOptions, summarize_columns
from simulator.model import compiled, precompile
from simulator.model.kernel_sources import COMPILED
from simulator.scenario import Compositions


@pytest.fixture(scope="module")
def kernel():
    """The extension's summary pass; skipped where the checkout's compiled folder is not
    current (a kernel source edited since ``python -m simulator.model.precompile``)."""
    if not precompile.reusable(COMPILED):
        pytest.skip("simulator/model/_compiled/ is not current: python -m simulator.model.precompile")
    compiled.extension.cache_clear()
    found = compiled.summary_pass()
    assert found is not None, f"{COMPILED} holds no extension with the summary pass (its build said why)"
    return found


def _both(monkeypatch, kernel, log, **kwargs):
    """The summary of ``log`` by numpy's passes, and by the compiled one."""
    monkeypatch.setattr(metrics, "summary_pass", lambda: None)
    by_numpy = summarize_columns(log, **kwargs)
    monkeypatch.setattr(metrics, "summary_pass", lambda: kernel)
    return by_numpy, summarize_columns(log, **kwargs)


RULES = Compositions((("only-b", {"only": frozenset({"b"})}), ("has-a", {"all": frozenset({"a"})}),
                      ("never", {"all": frozenset({"zzz"})})))


def random_log(rng: np.random.Generator) -> tuple[LogColumns, dict]:
    """A log of a few dozen calls of 1-8 prompts each, over up to four tasks (labels in no
    order, some absent), served in batches on GPUs (or on none), some prompts turned away;
    and summary options drawn with it."""
    n_tasks = int(rng.integers(1, 5))
    task_names = ["c", "a", "d", "b"][:n_tasks]
    sizes = rng.integers(1, 9, size=int(rng.integers(1, 40)))
    call_index = np.repeat(np.arange(sizes.size), sizes)
    if rng.random() < 0.2:  # call numbers with gaps, rows out of call order
        call_index = call_index * 3 + 7
        call_index = call_index[rng.permutation(call_index.size)]
    n = call_index.size
    call_t = np.cumsum(rng.exponential(2.0, size=int(call_index.max()) + 1))
    arrived = call_t[call_index]
    task = rng.integers(0, n_tasks, size=n).astype(np.int32)
    status_names = ["served", "sent_after_timeout", "rejected", "dropped"]
    status = rng.choice(4, size=n, p=[0.8, 0.08, 0.07, 0.05] if rng.random() < 0.5 else [1, 0, 0, 0]).astype(np.int8)
    served = status < 2
    n_gpus = int(rng.integers(1, 4))
    batch_id = np.full(n, -1, dtype=np.int32)
    batch_size = np.zeros(n, dtype=np.int32)
    gpu = np.full(n, -1, dtype=np.int32)
    started, first, done = (np.full(n, math.nan) for _ in range(3))
    rows = np.flatnonzero(served)
    if rng.random() < 0.3:
        rows = rows[rng.permutation(rows.size)]  # batches formed out of row order
    next_batch = 0
    at = 0
    while at < rows.size:
        members = rows[at:at + int(rng.integers(1, 5))]
        at += members.size
        batch_id[members] = next_batch
        batch_size[members] = members.size
        gpu[members] = -1 if rng.random() < 0.1 else int(rng.integers(0, n_gpus))
        start = arrived[members].max() + rng.exponential(1.0)
        started[members] = start
        done[members] = start + rng.exponential(3.0)
        first[members] = start + rng.random() * (done[members] - start)
        next_batch += 1
    if rng.random() < 0.2:  # no token timing
        first = done.copy()
    max_tokens = rng.choice([1, 2, 50, 300], size=n).astype(np.int32)
    queue_names = [*task_names, *(f"{t}~0" for t in task_names)]
    queue = (task + n_tasks * (rng.random(n) < 0.3)).astype(np.int32)
    columns = {
        "call_index": call_index.astype(np.int32), "task": task, "prompt_tokens": rng.integers(1, 900, n).astype(np.int32),
        "max_tokens": max_tokens, "status": status, "arrived_at": arrived, "first_token_at": first, "done_at": done,
        "batch_id": batch_id, "queue": queue, "started_at": started, "gpu": gpu, "batch_size": batch_size,
        "preemptions": rng.integers(0, 3, n).astype(np.int32),
    }
    finished = done[np.isfinite(done)]
    options = {
        "deadline": float(np.quantile(finished, rng.random())) if finished.size and rng.random() < 0.4 else None,
        "client_timeout": float(rng.exponential(4.0)) if rng.random() < 0.4 else None,
        "gpus": n_gpus + int(rng.integers(0, 2)) if rng.random() < 0.7 else None,
        "compositions": RULES if rng.random() < 0.6 else None,
        "tokens": TokenOptions() if rng.random() < 0.5 else TokenOptions(
            percentiles=(25.0, 50.0, 99.9, 100.0), goodput=(("ttft", 1.0), ("itl", 0.02), ("e2e", 9.0))),
    }
    return LogColumns(columns, {"task": task_names, "status": status_names, "queue": queue_names}), options


@pytest.mark.parametrize("seed", range(300))
def test_the_compiled_pass_gives_numpys_summary_of_a_random_log(monkeypatch, kernel, seed):
    log, options = random_log(np.random.default_rng(seed))
    by_numpy, by_kernel = _both(monkeypatch, kernel, log, **options)
    assert_same_figures(by_kernel, by_numpy)


def test_random_logs_take_every_shape_the_summary_distinguishes():
    # (the cases above are worth what they cover: count the shapes among them)
    seen = set()
    for seed in range(300):
        log, options = random_log(np.random.default_rng(seed))
        c = log.columns
        summary = summarize_columns(log, **options)
        seen.update(k for k, hit in (
            ("turned away", (c["status"] >= 2).any()), ("unfinished", summary["overall"]["unfinished"] > 0),
            ("all finished", summary["overall"]["unfinished"] == 0),
            ("idle gpu", any(g["batches"] == 0 for g in summary["gpus"])), ("no gpu", (c["gpu"] < 0).any()),
            ("calls out of order", (np.diff(c["call_index"]) < 0).any()),
            ("batches out of order", (np.diff(c["batch_id"][c["batch_id"] >= 0]) < 0).any()),
            ("a task of no completed prompt", any(t["completed"] == 0 for t in summary["tasks"].values())),
            ("untimed", np.array_equal(c["first_token_at"], c["done_at"], equal_nan=True)),
            ("one task", len(summary["tasks"]) == 1), ("goodput", "good" in summary["overall"]["tokens"]),
            ("classes", bool(summary["compositions"])), ("client timeout", options["client_timeout"] is not None),
            ("continuous", any(q.endswith("~0") for q in np.array(log.labels["queue"])[c["queue"]])),
        ) if hit)
    assert len(seen) == 14, seen


@pytest.mark.parametrize("topology, rate, complete", list(itertools.product(("shared", "split", "continuous"),
                                                                            (1.0, 4.0), (True, False))))
def test_the_compiled_pass_gives_numpys_summary_of_an_engines_log(monkeypatch, kernel, topology, rate, complete):
    from simulator import build_scenario, load_profile, load_trace
    from simulator.model.engine import simulate_columns

    base = build_scenario(path="design-notes")
    scenario = replace(base, tasks={**base.tasks, "infobench": {**base.tasks["infobench"], "topology": topology}},
                       deadline=None if complete else 150.0, client_timeout=None if complete else 120.0)
    log = simulate_columns(load_trace("example").scaled(rate), scenario, load_profile("seed-calibrated"), seed=5)
    by_numpy, by_kernel = _both(monkeypatch, kernel, log, deadline=scenario.deadline, gpus=scenario.gpus,
                                client_timeout=scenario.client_timeout, compositions=scenario.compositions)
    assert by_numpy["compositions"] and (by_numpy["overall"]["unfinished"] == 0) == complete
    assert_same_figures(by_kernel, by_numpy)


def test_a_summary_of_a_small_run_calls_the_compiled_pass_where_the_extension_has_it(monkeypatch, kernel):
    from simulator import build_scenario, load_profile, load_trace
    from simulator.model.engine import simulate_columns

    log = simulate_columns(load_trace("example"), build_scenario(path="design-notes"), load_profile("seed-calibrated"))
    calls = []
    monkeypatch.setattr(metrics, "summary_pass", lambda: lambda *args: calls.append(args) or kernel(*args))
    summarize_columns(log)
    assert len(calls) == 1
    monkeypatch.setattr(metrics, "_ONE_PASS", len(log) - 1)  # (a large run: group by group, numpy)
    summarize_columns(log)
    assert len(calls) == 1
