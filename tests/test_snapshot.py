"""Snapshots (simulator.snapshot) from every source, and replays that start from one
(simulator.model.start): a hand-computed timeline, every prompt accounted for once, and
the errors a bad snapshot gives."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import assert_one_line_error, fixed_profile, make_trace, timeline
from typer.testing import CliRunner

from simulator import load_trace, replay
from simulator.cli import app
from simulator.errors import ScenarioError, SnapshotError
from simulator.model import simulate
from simulator.model.start import StartState
from simulator.scenario import build_scenario
from simulator.snapshot import (
    FORMAT,
    from_run_folder,
    from_serve_metrics,
    from_vllm_metrics,
    load_snapshot,
    save_snapshot,
    snapshot_of,
)
from simulator.trace.model import Call, Prompt, Trace

DATA = Path(__file__).parent / "data"
runner = CliRunner()


def state(waiting=(), running=(), **extra) -> dict:
    return {"format": FORMAT, "taken_at": extra.pop("taken_at", 10.0),
            "source": {"kind": "serve-state", "location": "test"}, "waiting": list(waiting),
            "running": list(running), **extra}


# -- sources ---------------------------------------------------------------------------------
def test_vllm_metrics_fixture():
    snap = from_vllm_metrics((DATA / "vllm_metrics.txt").read_text(), "vllm")
    assert [(w.task, w.queue, w.count, w.prompts) for w in snap.waiting] == [(None, "Qwen/Qwen3-8B", 5, None)]
    assert [(r.task, r.size, r.elapsed_s) for r in snap.running] == [(None, 12, None)]
    assert snap.kv_cache_usage == pytest.approx(0.4213)
    assert snap.prefix_cache_hit_rate == pytest.approx(12000 / 48000)
    assert any("elapsed_s" in u for u in snap.unknown)
    # the written file reads back as the same snapshot
    assert snapshot_of(json.loads(json.dumps(snap.to_dict()))) == snap


def test_vllm_metrics_older_names():
    text = ('vllm:num_requests_running{model_name="m"} 2.0\nvllm:num_requests_waiting{model_name="m"} 0.0\n'
            'vllm:gpu_cache_usage_perc{model_name="m"} 0.9\n')
    snap = from_vllm_metrics(text, "old")
    assert snap.waiting == () and snap.running[0].size == 2 and snap.kv_cache_usage == pytest.approx(0.9)
    assert snap.prefix_cache_hit_rate is None and any("prefix_cache_hit_rate" in u for u in snap.unknown)


def test_serve_metrics_text():
    text = ("# TYPE simctl_queue_depth gauge\n"
            'simctl_queue_depth{queue="infobench"} 3.0\nsimctl_queue_depth{queue="mmlu@1"} 2.0\n'
            'simctl_queue_depth{queue="graph"} 0.0\n'
            "# TYPE simctl_gpu_outstanding_prompts gauge\n"
            'simctl_gpu_outstanding_prompts{gpu="0"} 5.0\nsimctl_gpu_outstanding_prompts{gpu="1"} 0.0\n'
            "# TYPE simctl_gpu_running_batches gauge\n"
            'simctl_gpu_running_batches{gpu="0"} 2.0\nsimctl_gpu_running_batches{gpu="1"} 0.0\n')
    snap = from_serve_metrics(text, "serve")
    assert [(w.task, w.queue, w.count) for w in snap.waiting] == [("infobench", "infobench", 3), ("mmlu", "mmlu@1", 2)]
    assert [(r.task, r.gpu, r.size, r.elapsed_s) for r in snap.running] == [(None, 0, 3, None), (None, 0, 2, None)]


def test_not_metrics_is_an_error():
    with pytest.raises(SnapshotError, match="simctl_queue_depth"):
        from_serve_metrics("# nothing\nfoo 1.0\n", "x")
    with pytest.raises(SnapshotError, match="vllm:num_requests_running"):
        from_vllm_metrics("foo 1.0\n", "x")


def test_run_folder_tail(tmp_path):
    """Calls sent by the instant and not answered by it, aged from their send; instants in
    the trace's seconds (the run's time scale 2 applied)."""
    rows = [  # call, task, sent, done (wall seconds of a run at time scale 2)
        (0, "mmlu", 0.0, 1.0),       # done at 2 (model) before 5
        (1, "mmlu", 1.0, 4.0),       # sent 2, done 8: in flight, age 3
        (1, "infobench", 1.0, None),  # never answered: in flight, age 3
        (2, "mmlu", 2.0, 3.0),       # sent 4, done 6: in flight, age 1
        (3, "mmlu", 3.0, 3.5),       # sent 6: after the instant
    ]
    table = pd.DataFrame({"call_id": [str(r[0]) for r in rows], "prompt_index": [0] * len(rows),
                          "task": [r[1] for r in rows], "sent_at": [r[2] for r in rows],
                          "done_at": [np.nan if r[3] is None else r[3] for r in rows],
                          "status": ["ok"] * len(rows), "prompt_tokens": [10, 20, 30, 40, 50]})
    table.to_parquet(tmp_path / "requests.parquet")
    (tmp_path / "simulation_summary.json").write_text(json.dumps({"load": {"time_scale": 2.0}}))
    snap = from_run_folder(tmp_path, 5.0)
    assert snap.taken_at == 5.0 and snap.running == ()
    got = {w.task: [(p.age_s, p.prompt_tokens) for p in w.prompts or ()] for w in snap.waiting}
    assert got == {"infobench": [(3.0, 30)], "mmlu": [(3.0, 20), (1.0, 40)]}
    result = runner.invoke(app, ["snapshot", str(tmp_path), "--at", "5", "-o", str(tmp_path / "s.json")])
    assert result.exit_code == 0, result.output
    assert load_snapshot(tmp_path / "s.json").waiting_prompts == 3


def test_snapshot_cli_errors(tmp_path):
    assert_one_line_error(runner.invoke(app, ["snapshot", str(tmp_path)]), "--at")
    assert_one_line_error(runner.invoke(app, ["snapshot", str(tmp_path / "none.txt")]), "none.txt")
    metrics = tmp_path / "m.txt"
    metrics.write_text("foo 1\n")
    assert_one_line_error(runner.invoke(app, ["snapshot", str(metrics)]), "m.txt")


def test_snapshot_cli_of_a_vllm_metrics_file(tmp_path):
    out = tmp_path / "s.json"
    result = runner.invoke(app, ["snapshot", str(DATA / "vllm_metrics.txt"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "5 prompt(s) waiting, 12 in 1 running batch(es)" in " ".join(result.output.split())
    data = json.loads(out.read_text())
    assert data["format"] == FORMAT and data["source"]["kind"] == "vllm-metrics" and data["kv_cache_usage"] == 0.4213


# -- bad files -----------------------------------------------------------------------------
@pytest.mark.parametrize(("data", "field"), [
    ({"format": "other"}, "format"),
    (state(waiting=[{"task": "x", "count": -1}]), "waiting[0].count"),
    (state(waiting=[{"task": "x", "count": 2, "prompts": [{"age_s": 1}]}]), "waiting[0].prompts"),
    (state(waiting=[{"task": "x", "count": 1, "prompts": [{"age_s": "old"}]}]), "waiting[0].prompts[0].age_s"),
    (state(running=[{"task": "x", "size": 0}]), "running[0].size"),
    (state(running=[{"task": "x", "size": 1, "elapsed_s": -2}]), "running[0].elapsed_s"),
    (state(running=[{"task": "x", "size": 1, "gpu": "a"}]), "running[0].gpu"),
    (state(kv_cache_usage=1.5), "kv_cache_usage"),
    (state(source={"kind": "nope", "location": "x"}), "source.kind"),
    # numbers past what a float or the run holds: one line, not an OverflowError
    (state(taken_at=10**400), "taken_at"),
    (state(waiting=[{"task": "x", "count": 10**300}]), "waiting[0].count"),
    (state(running=[{"task": "x", "size": 1, "prompts": [{"prompt_tokens": 2**40}]}]), "running[0].prompts[0].prompt_tokens"),
])
def test_bad_snapshot_file_is_a_one_line_error(tmp_path, data, field):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    result = runner.invoke(app, ["replay", "example", "-c", "design-notes", "--from-state", str(path)])
    assert_one_line_error(result, "bad.json", f"field '{field}'")


def test_snapshot_not_json_and_unknown_task(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{")
    assert_one_line_error(runner.invoke(app, ["replay", "example", "--from-state", str(path)]), "bad.json", "JSON")
    path.write_text(json.dumps(state(waiting=[{"task": None, "count": 1}])))
    # the bundled trace has three tasks: a prompt of no task needs --state-task
    assert_one_line_error(runner.invoke(app, ["replay", "example", "--from-state", str(path), "--start", "0"]),
                          "bad.json", "waiting[0].task", "--state-task")
    path.write_text(json.dumps(state(waiting=[{"task": "nosuch", "count": 1}])))
    assert_one_line_error(runner.invoke(app, ["replay", "example", "--from-state", str(path), "--start", "0"]),
                          "waiting[0].task", "nosuch")
    assert_one_line_error(runner.invoke(app, ["replay", "example", "--start", "3"]), "--from-state")


# -- replays from a snapshot ---------------------------------------------------------------
def scenario(**defaults):
    return build_scenario(defaults={"flush": 2.0, "max_batch": 2, "policy": "oldest", **defaults}, run={"gpus": 1})


def test_hand_computed_timeline_from_a_snapshot():
    """One GPU, window 2 s (oldest), max batch 2, service 3 s. The snapshot: a running batch
    r of 2 prompts 1 s into its service (2 s left), and w0, w1, w2 waiting for 4, 1 and 0.5 s
    (arrived at -4, -1, -0.5). A new call n arrives at 1.

    t=0 r runs 0..2 (no draw); the waiting three find the worker busy. t=1 n joins. t=2 r is
    done; w0 has waited 6 s (window over): {w0, w1} 2..5. t=5: w2 has waited 5.5 s: {w2, n}
    5..8."""
    snap = snapshot_of(state(waiting=[{"task": "x", "queue": "x", "count": 3,
                                       "prompts": [{"age_s": 4}, {"age_s": 1}, {"age_s": 0.5}]}],
                             running=[{"task": "x", "gpu": 0, "size": 2, "elapsed_s": 1.0}]))
    prof, trace, sc = fixed_profile(x=3.0), make_trace([(1, ["x"])]), scenario()
    log = simulate(trace, sc, prof, 0, initial_state=StartState(snap, trace, sc, prof))
    assert timeline(log, "arrived_at") == [("state-r0.0", -1.0), ("state-r0.1", -1.0), ("state-w0.0", -4.0),
                                           ("state-w1.0", -1.0), ("state-w2.0", -0.5), ("0.0", 1.0)]
    assert timeline(log, "started_at") == [("state-r0.0", 0), ("state-r0.1", 0), ("state-w0.0", 2),
                                           ("state-w1.0", 2), ("state-w2.0", 5), ("0.0", 5)]
    assert timeline(log) == [("state-r0.0", 2), ("state-r0.1", 2), ("state-w0.0", 5), ("state-w1.0", 5),
                             ("state-w2.0", 8), ("0.0", 8)]
    assert list(log["from_state"]) == [True] * 5 + [False]
    # through replay(): the new call's figures alone, the snapshot's on their own line
    result = replay(trace, sc, prof, initial_state=snap, start=0)
    assert result.summary["overall"]["prompts"] == 1
    assert result.summary["overall"]["latency"]["max"] == pytest.approx(7.0)
    f = result.summary["from_state"]
    assert (f["prompts"], f["waiting"], f["running"], f["done"]) == (5, 3, 2, 5)
    assert f["latency"]["max"] == pytest.approx(9.0) and f["cleared_at"] == pytest.approx(8.0)


def test_unknown_elapsed_takes_the_expected_residual():
    """Deterministic 3 s service: its residual E[S²]/(2E[S]) is 1.5 s."""
    snap = snapshot_of(state(running=[{"task": "x", "size": 1}]))
    prof, trace, sc = fixed_profile(x=3.0), make_trace([(0, ["x"])]), scenario(flush=0.0)
    start = StartState(snap, trace, sc, prof)
    log = simulate(trace, sc, prof, 0, initial_state=start)
    assert timeline(log) == [("state-r0.0", 1.5), ("0.0", 4.5)]
    assert any("expected residual 1.5 s" in n for n in start.notes)


def test_a_batch_waiting_for_its_gpu_runs_after_the_running_one():
    snap = snapshot_of(state(running=[{"task": "x", "size": 1, "started": False, "elapsed_s": 0.0},
                                      {"task": "x", "size": 1, "elapsed_s": 2.0}]))
    prof, trace, sc = fixed_profile(x=3.0), make_trace([(0.5, ["x"])]), build_scenario(
        defaults={"flush": 0.0, "max_batch": 4, "workers": 2}, run={"gpus": 1})
    log = simulate(trace, sc, prof, 0, initial_state=StartState(snap, trace, sc, prof))
    # the started one (running[1]) ends at 1; the formed one then runs 1..4; the new call waits for a worker
    assert timeline(log) == [("state-r0.0", 1.0), ("state-r1.0", 4.0), ("0.0", 7.0)]


@pytest.mark.parametrize("seed", range(4))
def test_every_prompt_is_accounted_for_once(seed):
    rng = np.random.default_rng(seed)
    tasks = ["a", "b", "cpu_c"]
    waiting = [{"task": t, "queue": None, "count": int(n),
                "prompts": [{"age_s": float(a)} for a in rng.uniform(0, 5, int(n))] if rng.random() < 0.5 else None}
               for t in tasks if (n := rng.integers(0, 6))]
    running = [{"task": t, "size": int(rng.integers(1, 5)), "elapsed_s": float(rng.uniform(0, 4))}
               for t in ("a", "b", "cpu_c") if rng.random() < 0.8]
    snap = snapshot_of(state(waiting=waiting, running=running))
    calls = [Call(f"c{i}", float(t), tuple(Prompt(str(rng.choice(tasks))) for _ in range(int(rng.integers(1, 4)))))
             for i, t in enumerate(np.sort(rng.uniform(0, 30, 25)))]
    trace = Trace(tuple(calls))
    prof = fixed_profile(a=1.0, b=2.0, cpu_c=0.3)
    # (the CPU task on the direct topology: its running batches go straight to the CPU pool)
    sc = build_scenario(defaults={"flush": 0.5, "max_batch": 4}, run={"gpus": 2, "rate_scale": 2.0},
                        tasks={"cpu_c": {"topology": "direct"}})
    start = 10.0
    result = replay(trace, sc, prof, initial_state=snap, start=start)
    log = result.log
    rest = trace.after(start)
    assert len(log) == snap.waiting_prompts + snap.running_prompts + rest.n_prompts
    assert int(log["from_state"].sum()) == snap.waiting_prompts + snap.running_prompts
    assert not log.duplicated(["call_id", "prompt_index"]).any()
    assert log["done_at"].notna().all() and (log["batch_id"] >= 0).all()
    assert (log["started_at"] >= 0).all() and (log["done_at"] >= log["started_at"]).all()
    new = log[~log["from_state"]]
    # the rest, shifted to start at 0 and at twice the rate
    assert sorted(new.groupby("call_id")["arrived_at"].first()) == pytest.approx(
        sorted((c.t - start) / 2 for c in trace.calls if c.t >= start))
    assert result.summary["overall"]["prompts"] == rest.n_prompts
    assert result.summary["from_state"]["prompts"] == snap.waiting_prompts + snap.running_prompts


def test_fast_engine_and_continuous_batching_are_refused():
    snap = snapshot_of(state(waiting=[{"task": "x", "count": 1}]))
    prof, trace = fixed_profile(x=1.0), make_trace([(0, ["x"])])
    with pytest.raises(ScenarioError, match="fast engine does not start from a snapshot"):
        replay(trace, build_scenario(run={"engine": "fast"}), prof, initial_state=snap, start=0)
    with pytest.raises(SnapshotError, match="continuous topology"):
        replay(trace, build_scenario(defaults={"topology": "continuous"}), prof, initial_state=snap, start=0)


def test_save_and_load_round_trip(tmp_path):
    snap = snapshot_of(state(waiting=[{"task": "x", "queue": "x", "count": 1, "prompts": [{"age_s": 1.0}]}]))
    save_snapshot(snap, tmp_path / "s.json")
    assert load_snapshot(tmp_path / "s.json") == snap


# -- simctl serve's /state and /metrics, on virtual time -----------------------------------
def test_serve_state_and_metrics_sources():
    """mmlu: window 0, max batch 1, 3 s service, one GPU. Call A (one prompt) at 0 runs 0..3;
    call B (two prompts) at 1 waits. At 2: /state has B's two prompts waiting 1 s and A's
    batch running 2 s; /metrics the same counts, without ages or elapsed service."""
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    import asyncio

    from virtual_time import run_virtual

    from simulator.profile import profile_from_dict
    from simulator.serve.app import build_app
    from simulator.serve.backends import SleepBackend
    from simulator.snapshot import from_serve_state

    scale = 4.0
    prof = profile_from_dict({"name": "det", "tasks": {"mmlu": {
        "resource": "gpu", "prompt_tokens": 10, "max_tokens": 4,
        "service": {"kind": "distribution", "dist": "deterministic", "mean": 3.0}}}})
    sa = build_app(build_scenario(run={"gpus": 1}, defaults={"flush": 0.0, "max_batch": 1}), prof, SleepBackend(),
                   time_scale=scale)

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=sa.app), base_url="http://serve",
                                     timeout=30) as c:
            a = asyncio.create_task(c.post("/", json={"prompt": ["multiple choice question: 0"]}))
            await asyncio.sleep(1 / scale)
            b = asyncio.create_task(c.post("/", json={"prompt": ["multiple choice question: 1",
                                                                  "multiple choice question: 2"]}))
            await asyncio.sleep(1 / scale)
            got = (await c.get("/state")).json(), (await c.get("/metrics")).text
            await a
            await b
            return got
    data, metrics = run_virtual(main())
    snap = from_serve_state(data, "http://serve")
    assert snap.source_kind == "serve-state" and snap.taken_at == pytest.approx(2.0, abs=1e-6)
    (w,) = snap.waiting
    assert (w.task, w.queue, w.count) == ("mmlu", "mmlu", 2)
    assert [p.age_s for p in w.prompts or ()] == pytest.approx([1.0, 1.0], abs=1e-6)
    assert all(p.prompt_tokens is not None and p.prompt_tokens >= 1 and p.max_tokens == 4 for p in w.prompts or ())
    (r,) = snap.running
    assert (r.task, r.gpu, r.size, r.started) == ("mmlu", 0, 1, True)
    assert r.elapsed_s == pytest.approx(2.0, abs=1e-6)
    assert r.prompts is not None and r.prompts[0].age_s == pytest.approx(2.0, abs=1e-6)
    m = from_serve_metrics(metrics, "http://serve")
    assert [(x.task, x.count, x.prompts) for x in m.waiting] == [("mmlu", 2, None)]
    assert [(x.task, x.gpu, x.size, x.elapsed_s) for x in m.running] == [(None, 0, 1, None)]


def test_serve_state_is_protected_like_metrics():
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    from virtual_time import run_virtual

    from simulator.profile import profile_from_dict
    from simulator.serve.app import build_app
    from simulator.serve.backends import SleepBackend
    from simulator.serve.guard import Limits

    prof = profile_from_dict({"name": "det", "tasks": {"mmlu": {
        "resource": "gpu", "service": {"kind": "distribution", "dist": "deterministic", "mean": 1.0}}}})
    sa = build_app(build_scenario(run={"gpus": 1}), prof, SleepBackend(), limits=Limits(api_key="k"))

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=sa.app), base_url="http://serve") as c:
            return ((await c.get("/state")).status_code,
                    (await c.get("/state", headers={"authorization": "Bearer k"})).status_code)
    assert run_virtual(main()) == (401, 200)


def test_a_replay_from_a_live_snapshot_predicts_the_rest_exactly():
    """The whole loop on virtual time, deterministic service: simctl serve (sleep backend)
    takes calls at 0, 0.5, 1, 4, 4.5, 7 and 9 (mmlu: window 2 s, max batch 2, 3 s a batch,
    one GPU); its /state is read at 5; the rest of the calls (7 and 9) replayed from that
    snapshot finish when the server finished them, and so do the prompts the snapshot held."""
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    import asyncio

    from virtual_time import run_virtual

    from simulator.profile import profile_from_dict
    from simulator.serve.app import build_app
    from simulator.serve.backends import SleepBackend
    from simulator.snapshot import from_serve_state

    scale, at = 4.0, 5.0
    arrivals = [0.0, 0.5, 1.0, 4.0, 4.5, 7.0, 9.0]
    prof = profile_from_dict({"name": "det", "tasks": {"mmlu": {
        "resource": "gpu", "prompt_tokens": 10, "max_tokens": 4,
        "service": {"kind": "distribution", "dist": "deterministic", "mean": 3.0}}}})
    sc = build_scenario(run={"gpus": 1}, defaults={"flush": 2.0, "max_batch": 2, "policy": "oldest"})
    sa = build_app(sc, prof, SleepBackend(), time_scale=scale)

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=sa.app), base_url="http://serve",
                                     timeout=60) as c:
            async def call(t: float, i: int):
                await asyncio.sleep(t / scale)
                return await c.post("/", json={"prompt": [f"multiple choice question: {i}"]})

            async def snap():
                await asyncio.sleep(at / scale)
                return (await c.get("/state")).json()
            tasks = [asyncio.create_task(call(t, i)) for i, t in enumerate(arrivals)]
            data = await snap()
            for t in tasks:
                await t
            return data
    data = run_virtual(main())
    live = sorted(sa.runtime.log, key=lambda r: r["arrived_at"])
    snapshot = from_serve_state(data, "http://serve")
    assert snapshot.waiting_prompts + snapshot.running_prompts == 3  # calls at 1, 4 and 4.5 in flight at 5
    trace = Trace(tuple(Call(str(i), t, (Prompt("mmlu"),)) for i, t in enumerate(arrivals)))
    result = replay(trace, sc, prof, initial_state=snapshot, start=at)
    log = result.log
    new = log[~log["from_state"]].sort_values("arrived_at")
    assert list(new["done_at"] + at) == pytest.approx([r["done_at"] for r in live[-2:]], abs=1e-6)
    held = sorted((log[log["from_state"]]["done_at"] + at).tolist())
    assert held == pytest.approx(sorted(r["done_at"] for r in live[2:5]), abs=1e-6)


def test_take_snapshot_prefers_state_then_falls_back_to_metrics():
    httpx = pytest.importorskip("httpx")
    from simulator.snapshot import take_snapshot

    metrics = (DATA / "vllm_metrics.txt").read_text()
    state_body = {"taken_at": 3.0, "waiting": [{"task": "x", "queue": "x", "count": 1, "prompts": [{"age_s": 1.0}]}],
                  "running": []}
    seen = []

    def server(with_state: bool, key: str | None = None):
        def handle(request):
            seen.append((request.url.path, request.headers.get("authorization")))
            if key is not None and request.headers.get("authorization") != f"Bearer {key}":
                return httpx.Response(401, json={"error": "unauthorized"})
            if request.url.path == "/state" and with_state:
                return httpx.Response(200, json=state_body)
            if request.url.path == "/metrics":
                return httpx.Response(200, text=metrics)
            return httpx.Response(404, json={"detail": "Not Found"})
        return httpx.MockTransport(handle)

    snap = take_snapshot("http://serve:8000/", transport=server(True))
    assert snap.source_kind == "serve-state" and snap.location == "http://serve:8000" and snap.waiting_prompts == 1
    snap = take_snapshot("http://vllm:8000/metrics", transport=server(False))
    assert snap.source_kind == "vllm-metrics" and snap.running_prompts == 12
    assert seen[-2:] == [("/state", None), ("/metrics", None)]
    with pytest.raises(SnapshotError, match="API key"):
        take_snapshot("http://serve:8000", transport=server(True, key="k"))
    assert take_snapshot("http://serve:8000", api_key="k", transport=server(True, key="k")).waiting_prompts == 1


def test_replay_cli_from_state_reports_the_snapshot_apart(tmp_path):
    path = tmp_path / "now.json"
    path.write_text(json.dumps(state(waiting=[{"task": "infobench", "queue": "infobench", "count": 2,
                                               "prompts": [{"age_s": 30.0}, {"age_s": 2.0}]}],
                                     running=[{"task": "mmlu", "size": 2, "elapsed_s": 0.2}], taken_at=None)))
    result = runner.invoke(app, ["replay", "example", "-c", "design-notes", "--from-state", str(path),
                                 "--start", "600", "--rate-scale", "2", "--json", "-"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    rest = load_trace("example").after(600)
    assert summary["overall"]["prompts"] == rest.n_prompts
    assert summary["from_state"]["prompts"] == 4 and summary["from_state"]["done"] == 4
    assert summary["config"]["from_state"]["start"] == 600
    # the oldest waiting prompt's latency counts its 30 s of age
    assert summary["from_state"]["latency"]["max"] >= 30
    result = runner.invoke(app, ["replay", "example", "-c", "design-notes", "--from-state", str(path),
                                 "--start", "600"])
    assert result.exit_code == 0, result.output
    assert "4 prompt(s) in flight (2 waiting, 2 in 1 running batch(es))" in " ".join(result.output.split())
