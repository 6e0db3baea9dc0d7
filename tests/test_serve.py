"""``simctl serve``: the modeled server run for real (simulator/serve/), through httpx against
the ASGI app in-process, and the command through typer's CliRunner and a real process.

Timelines use a deterministic profile on the sleep backend with a time scale, on a
virtual-time event loop (tests/virtual_time.py: timers fire at their exact instants and
no test waits for real), so every in-process test is deterministic and instants are checked
exactly, up to float rounding. Tests over real sockets (uvicorn, the command's process) run
on real time and check only what holds however slow the machine is.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")

from typer.testing import CliRunner  # noqa: E402
from virtual_time import run_virtual  # noqa: E402

from simulator.cli import app as cli_app  # noqa: E402
from simulator.profile import profile_from_dict  # noqa: E402
from simulator.scenario import build_scenario  # noqa: E402
from simulator.serve.app import build_app  # noqa: E402
from simulator.serve.backends import Backend, SleepBackend, placeholder_text  # noqa: E402
from simulator.serve.runtime import Runtime, ServeBatch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MMLU = "multiple choice question: {}"
INFOBENCH = "Instruction: {}"
GRAPH = "find the shortest path in a directed graph {}"
#: model seconds per (virtual) loop second in the timeline tests
SCALE = 4.0
#: tolerance on an instant, model seconds: float rounding only (the loop's time is virtual)
TOL = 1e-9


def det_profile(mmlu: float = 3.0, infobench: float = 3.0, graph: float = 0.1) -> Any:
    def task(mean: float, resource: str = "gpu") -> dict:
        return {"resource": resource, "prompt_tokens": 10, "max_tokens": 4,
                "service": {"kind": "distribution", "dist": "deterministic", "mean": mean}}
    return profile_from_dict({"name": "det", "tasks": {"mmlu": task(mmlu), "infobench": task(infobench),
                                                        "graph": task(graph, "cpu")}})


def make(run: dict | None = None, defaults: dict | None = None, tasks: dict | None = None, *,
         backend: Backend | None = None, scale: float = SCALE, profile: Any = None, **kw: Any):
    scenario = build_scenario(run={"gpus": 1, **(run or {})}, defaults=defaults, tasks=tasks)
    return build_app(scenario, profile or det_profile(), backend or SleepBackend(), time_scale=scale, **kw)


def client(serve_app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=serve_app.app), base_url="http://serve",
                             timeout=30)


async def post_at(c: httpx.AsyncClient, at: float, texts: list[str], path: str = "/", scale: float = SCALE,
                  **body: Any) -> Any:
    await asyncio.sleep(at / scale)
    response = await c.post(path, json={"prompt": texts, **body})
    return response


def batches(serve_app) -> list[tuple[list[tuple[int, int]], float, float]]:
    """Each batch: its (call, prompt) pairs, its release and its end (model seconds)."""
    out: dict[int, Any] = {}
    for rec in serve_app.runtime.log:
        if rec["batch_id"] < 0:
            continue
        entry = out.setdefault(rec["batch_id"], [[], rec["batched_at"], rec["done_at"]])
        entry[0].append((rec["call_id"], rec["prompt_index"]))
    return [(sorted(v[0]), v[1], v[2]) for _, v in sorted(out.items())]


def close(a: float, b: float) -> bool:
    return abs(a - b) <= TOL


def test_oldest_timeline_of_the_model_docs():
    """W = 2 s, service 3 s, one worker; a..e at 0, 1, 2.5, 4, 4.5: oldest releases [a, b]
    at 2 and [c, d, e] at 5 (docs/model.md; tests/test_model_timelines.py pins the model's)."""
    sa = make(defaults={"flush": 2.0, "max_batch": 8})

    async def main():
        async with client(sa) as c:
            rs = await asyncio.gather(*(post_at(c, t, [MMLU.format(n)]) for n, t in zip("abcde", [0, 1, 2.5, 4, 4.5],
                                                                                      strict=True)))
        assert all("choices" in r.json() for r in rs)
    run_virtual(main())
    got = batches(sa)
    assert [b[0] for b in got] == [[(0, 0), (1, 0)], [(2, 0), (3, 0), (4, 0)]]
    assert close(got[0][1], 2.0) and close(got[0][2], 5.0)
    assert close(got[1][1], 5.0) and close(got[1][2], 8.0)


def test_pickup_timeline_of_the_model_docs():
    """pickup: the freed worker opens a new window at 5 and releases [c, d, e] at 7."""
    sa = make(defaults={"flush": 2.0, "max_batch": 8, "policy": "pickup"})

    async def main():
        async with client(sa) as c:
            await asyncio.gather(*(post_at(c, t, [MMLU.format(n)]) for n, t in zip("abcde", [0, 1, 2.5, 4, 4.5],
                                                                                 strict=True)))
    run_virtual(main())
    got = batches(sa)
    assert [b[0] for b in got] == [[(0, 0), (1, 0)], [(2, 0), (3, 0), (4, 0)]]
    assert close(got[0][1], 2.0) and close(got[1][1], 7.0) and close(got[1][2], 10.0)


def test_calls_within_the_window_form_one_batch_and_max_batch_splits():
    """Three calls inside one 3 s window: one batch at 3. With max batch 2 the first two go
    the instant the second arrives (t = 1); the third's window ends at 5, after the worker
    is free again (at 4)."""
    for max_batch, expect in ((8, [([(0, 0), (1, 0), (2, 0)], 3.0)]),
                              (2, [([(0, 0), (1, 0)], 1.0), ([(2, 0)], 5.0)])):
        sa = make(defaults={"flush": 3.0, "max_batch": max_batch})

        async def main(sa=sa):
            async with client(sa) as c:
                await asyncio.gather(*(post_at(c, t, [MMLU.format(t)]) for t in (0, 1, 2)))
        run_virtual(main())
        got = batches(sa)
        assert [b[0] for b in got] == [e[0] for e in expect]
        assert all(close(b[1], e[1]) for b, e in zip(got, expect, strict=True))


def test_split_and_shared_dispatch_as_the_rule_says():
    """Two GPUs, flush 0. split round-robin: a call's 4 prompts alternate between the GPUs'
    queues, 0 and 2 on GPU 0. shared, max batch 2, a worker per GPU: [0, 1] on one GPU,
    [2, 3] on the other. least-loaded split: prompts alternate too (ties to the lowest)."""
    texts = [MMLU.format(i) for i in range(4)]
    for tasks, expect in (
            ({"topology": "split", "dispatch": "round-robin", "max_batch": 8}, {0: 0, 1: 1, 2: 0, 3: 1}),
            ({"topology": "split", "dispatch": "least-loaded", "max_batch": 8}, {0: 0, 1: 1, 2: 0, 3: 1}),
            ({"topology": "shared", "max_batch": 2}, {0: 0, 1: 0, 2: 1, 3: 1})):
        sa = make(run={"gpus": 2}, tasks={"mmlu": tasks}, scale=20)

        async def main(sa=sa):
            async with client(sa) as c:
                r = await c.post("/", json={"prompt": texts})
                assert len(r.json()["choices"]) == 4
        run_virtual(main())
        gpus = {rec["prompt_index"]: rec["gpu"] for rec in sa.runtime.log}
        assert gpus == expect, tasks


def test_direct_sends_batches_of_at_most_max_batch():
    sa = make(run={"gpus": 2}, tasks={"mmlu": {"topology": "direct", "max_batch": 2}}, scale=20)

    async def main():
        async with client(sa) as c:
            await c.post("/", json={"prompt": [MMLU.format(i) for i in range(5)]})
    run_virtual(main())
    assert sorted(len(b[0]) for b in batches(sa)) == [1, 2, 2]
    assert {rec["queue"] for rec in sa.runtime.log} == {"mmlu/direct"}


def test_processor_sharing_stretches_concurrent_batches():
    """Two 3 s batches on one processor-sharing GPU at once each progress at rate 1/2: both
    end at 6; on an exclusive GPU the second waits for the lock: 3 and 6."""
    for sharing, ends in (("processor-sharing", [6.0, 6.0]), ("exclusive", [3.0, 6.0])):
        sa = make(run={"gpu_sharing": sharing}, tasks={"mmlu": {"topology": "direct"},
                                                       "infobench": {"topology": "direct"}})

        async def main(sa=sa):
            async with client(sa) as c:
                await asyncio.gather(post_at(c, 0, [MMLU.format(0)]), post_at(c, 0, [INFOBENCH.format(0)]))
        run_virtual(main())
        got = sorted(b[2] for b in batches(sa))
        assert all(close(g, e) for g, e in zip(got, ends, strict=True)), (sharing, got)


def test_groups_of_a_call_route_by_task_and_reply_in_prompt_order():
    sa = make(scale=20)
    texts = [INFOBENCH.format(0), GRAPH.format(1), MMLU.format(2), INFOBENCH.format(3)]

    async def main():
        async with client(sa) as c:
            return (await c.post("/", json={"prompt": texts, "max_tokens": 3})).json()
    body = run_virtual(main())
    assert [ch["index"] for ch in body["choices"]] == [0, 1, 2, 3]
    assert [ch["task"] for ch in body["choices"]] == ["infobench", "graph", "mmlu", "infobench"]
    assert body["choices"][0]["text"] == " the of and"
    by_prompt = {rec["prompt_index"]: rec for rec in sa.runtime.log}
    assert by_prompt[1]["gpu"] is None and by_prompt[1]["queue"] == "graph"
    assert by_prompt[0]["batch_id"] == by_prompt[3]["batch_id"]  # one infobench batch


def test_queue_limit_rejects_with_the_error_body_and_429():
    # A window of 10 model seconds (0.5 s real): the three completions arrive well inside it
    # even on a loaded machine, so the third finds the queue full.
    sa = make(defaults={"flush": 10.0, "max_batch": 8, "max_queue": 2}, scale=20)

    async def main():
        async with client(sa) as c:
            batch = (await c.post("/", json={"prompt": [MMLU.format(i) for i in range(4)]}))
            openai = [c.post("/v1/completions", json={"prompt": MMLU.format(i), "max_tokens": 2}) for i in range(3)]
            return batch, await asyncio.gather(*openai)
    batch, openai = run_virtual(main())
    assert batch.status_code == 200
    body = batch.json()
    assert "choices" not in body and set(body) >= {"error", "traceback", "failed"}
    assert "full" in body["error"] and [f["index"] for f in body["failed"]] == [2, 3]
    assert {f["reason"] for f in body["failed"]} == {"rejected"}
    assert sorted(r.status_code for r in openai) == [200, 200, 429]
    rejected = next(r for r in openai if r.status_code == 429).json()
    assert rejected["error"]["type"] == "rejected" and "max_queue 2" in rejected["error"]["message"]


def test_queue_timeout_drops_a_waiting_prompt():
    """One worker busy for 3 s; a prompt that waits longer than queue_timeout 1 s is dropped."""
    sa = make(tasks={"mmlu": {"topology": "shared", "flush": 0.0, "queue_timeout": 1.0}})

    async def main():
        async with client(sa) as c:
            return await asyncio.gather(post_at(c, 0, [MMLU.format(0)]), post_at(c, 0.5, [MMLU.format(1)]))
    first, second = run_virtual(main())
    assert "choices" in first.json()
    assert second.json()["failed"][0]["reason"] == "dropped"


def test_error_bodies_of_bad_requests():
    sa = make(scale=20)

    async def main():
        async with client(sa) as c:
            not_json = await c.post("/", content=b"{", headers={"content-type": "application/json"})
            no_prompt = await c.post("/", json={"max_tokens": 3})
            bad_max = await c.post("/", json={"prompt": ["x"], "max_tokens": 0})
            unknown = await c.post("/", json={"prompt": ["hello there"]})
            openai_bad = await c.post("/v1/completions", json={"prompt": ["a", "b"]})
            chat_bad = await c.post("/v1/chat/completions", json={"messages": []})
            return not_json, no_prompt, bad_max, unknown, openai_bad, chat_bad
    not_json, no_prompt, bad_max, unknown, openai_bad, chat_bad = run_virtual(main())
    for r, words in ((not_json, "not JSON"), (no_prompt, "'prompt'"), (bad_max, "'max_tokens'"),
                     (unknown, "no task of this server matches")):
        assert r.status_code == 200 and set(r.json()) >= {"error", "traceback"} and words in r.json()["error"]
    assert unknown.json()["failed"][0]["reason"] == "unknown-task"
    for r in (openai_bad, chat_bad):
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid"


def _events(text: str) -> list[Any]:
    return [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]


def test_openai_endpoints_plain_and_streamed():
    sa = make(scale=20)

    async def main():
        async with client(sa) as c:
            plain = await c.post("/v1/completions", json={"prompt": MMLU.format(0), "max_tokens": 3})
            chat = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": INFOBENCH.format(1)}],
                                                              "max_tokens": 2})
            stream = await c.post("/v1/completions", json={"prompt": MMLU.format(2), "max_tokens": 4, "stream": True,
                                                           "stream_options": {"include_usage": True}})
            chat_stream = await c.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": MMLU.format(3)}], "max_tokens": 2, "stream": True})
            models = await c.get("/v1/models")
            return plain, chat, stream, chat_stream, models
    plain, chat, stream, chat_stream, models = run_virtual(main())
    assert plain.json()["choices"][0]["text"] == " the of and" and plain.json()["usage"]["completion_tokens"] == 3
    assert plain.json()["id"].startswith("cmpl-") and chat.json()["id"].startswith("chatcmpl-")
    assert chat.json()["choices"][0]["message"] == {"role": "assistant", "content": " the of"}
    assert stream.headers["content-type"].startswith("text/event-stream")
    events = _events(stream.text)
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    pieces = [p["choices"][0]["text"] for p in parsed if p["choices"] and p["choices"][0]["text"]]
    assert pieces == [" the", " of", " and", " to"]
    assert parsed[-2]["choices"][0]["finish_reason"] == "length"
    assert parsed[-1]["choices"] == [] and parsed[-1]["usage"]["completion_tokens"] == 4
    assert {p["id"] for p in parsed} == {parsed[0]["id"]} and parsed[0]["id"].startswith("cmpl-")
    chat_events = [json.loads(e) for e in _events(chat_stream.text)[:-1]]
    assert [e["choices"][0]["delta"] for e in chat_events] == [{"role": "assistant", "content": " the"},
                                                               {"content": " of"}, {}]
    assert {e["id"] for e in chat_events} == {chat_events[0]["id"]} and chat_events[0]["id"].startswith("chatcmpl-")
    assert all(e["object"] == "chat.completion.chunk" for e in chat_events)  # no usage: the client did not ask
    assert models.json()["data"][0]["id"] == "simctl"


def test_streamed_tokens_spread_from_the_first_token_to_the_end():
    """A 3 s batch of 4 tokens whose first token comes after a share of the batch: the reply
    sends its token events at the first token's instant, evenly after it, the last at the
    batch's end (each event's instant as the app hands it to the server)."""
    sa = make(tasks={"mmlu": {"topology": "direct"}})
    sent: list[tuple[float, bytes]] = []

    async def timed(scope: dict, receive: Any, send: Any) -> None:
        async def timed_send(message: dict) -> None:
            if message["type"] == "http.response.body" and b'"text": " ' in message.get("body", b""):
                sent.append((sa.runtime.clock.now(), message["body"]))
            await send(message)
        await sa.app(scope, receive, timed_send)

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=timed), base_url="http://serve") as c:
            return await c.post("/v1/completions", json={"prompt": MMLU.format(0), "max_tokens": 4, "stream": True})
    reply = run_virtual(main())
    pieces = [json.loads(e)["choices"][0]["text"] for e in _events(reply.text)[:-1] if json.loads(e)["choices"]]
    assert pieces[:4] == [" the", " of", " and", " to"]
    (rec,) = sa.runtime.log
    started, first, done = rec["started_at"], rec["first_token_at"], rec["done_at"]
    assert close(started, 0.0) and close(done, 3.0) and started < first < done
    assert [b'"text": " %s"' % w in body for w, (_, body) in zip((b"the", b"of", b"and", b"to"), sent,
                                                                     strict=True)] == [True] * 4
    assert all(close(at, first + (done - first) * i / 3) for i, (at, _) in enumerate(sent)), (sent, first, done)


class Gated(SleepBackend):
    """Plans each batch to end at once (every token due when it starts) but ends it only
    when ``release`` is set."""

    name = "gated"

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def run(self, runtime: Runtime, batch: ServeBatch) -> list[str]:
        batch.plan(runtime, 0.0, 0.0)
        await self.release.wait()
        return [placeholder_text(job) for job in batch.jobs]


def test_streamed_tokens_reach_a_real_socket_before_the_batch_ends():
    """Over a real socket (uvicorn): a streamed reply's token events reach the client as they
    are sent, not when the reply ends: all four arrive while the batch still runs (its
    backend ends it only when the client has them), then the reply finishes."""
    uvicorn = pytest.importorskip("uvicorn")
    gated = Gated()
    sa = make(tasks={"mmlu": {"topology": "direct"}}, backend=gated, scale=1)
    server = uvicorn.Server(uvicorn.Config(sa.app, host="127.0.0.1", port=0, log_level="error", lifespan="on"))

    async def main():
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        before, after = [], []
        async with httpx.AsyncClient(timeout=30) as c, c.stream(
                "POST", f"http://127.0.0.1:{port}/v1/completions",
                json={"prompt": MMLU.format(0), "max_tokens": 4, "stream": True}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data:"):
                    (after if gated.release.is_set() else before).append(line[5:].strip())
                if len(before) == 4 and not gated.release.is_set():
                    assert not sa.runtime.log  # the batch has not ended
                    gated.release.set()
        server.should_exit = True
        await task
        return before, after
    before, after = asyncio.run(asyncio.wait_for(main(), 60))
    assert [json.loads(e)["choices"][0]["text"] for e in before] == [" the", " of", " and", " to"]
    assert after[-1] == "[DONE]" and json.loads(after[0])["choices"][0]["finish_reason"] == "length"
    assert [r["status"] for r in sa.runtime.log] == ["served"]


def test_metrics_report_queues_batches_latency_and_calls():
    sa = make(scale=20)

    async def main():
        async with client(sa) as c:
            await c.post("/", json={"prompt": [MMLU.format(0), MMLU.format(1), INFOBENCH.format(2)]})
            return (await c.get("/metrics")).text
    text = run_virtual(main())
    assert 'simctl_queue_depth{queue="mmlu"} 0.0' in text
    assert "simctl_calls_in_flight 0.0" in text
    assert 'simctl_batch_size_count{task="mmlu"} 1.0' in text and 'simctl_batch_size_sum{task="mmlu"} 2.0' in text
    assert 'simctl_prompt_latency_seconds_count{task="infobench"} 1.0' in text
    assert 'simctl_prompts_total{status="served",task="mmlu"} 2.0' in text
    assert "simctl_call_latency_seconds_count 1.0" in text
    assert 'simctl_gpu_outstanding_prompts{gpu="0"} 0.0' in text


def test_metrics_see_a_waiting_queue_and_calls_in_flight():
    sa = make(defaults={"flush": 100.0, "max_batch": 8})

    async def main():
        async with client(sa) as c:
            pending = asyncio.create_task(c.post("/", json={"prompt": [MMLU.format(0), MMLU.format(1)]}))
            await asyncio.sleep(0.2)
            text = (await c.get("/metrics")).text
            await sa.runtime.shutdown()
            return text, (await pending).json()
    text, reply = run_virtual(main())
    assert 'simctl_queue_depth{queue="mmlu"} 2.0' in text and "simctl_calls_in_flight 1.0" in text
    assert "shutting down" in reply["error"]


def test_shutdown_fails_queued_calls_and_lets_in_flight_batches_finish():
    """A 3 s batch is running when the server shuts down (at 0.8); a call queued behind it
    gets an error reply at that instant, the running one its answer at 3; later calls are
    refused."""
    sa = make(defaults={"flush": 0.0, "max_batch": 1})

    async def main():
        async with client(sa) as c:
            running = asyncio.create_task(c.post("/", json={"prompt": [MMLU.format(0)]}))
            await asyncio.sleep(0.1)
            queued = asyncio.create_task(c.post("/", json={"prompt": [MMLU.format(1)]}))
            await asyncio.sleep(0.1)
            t0 = sa.runtime.clock.now()
            shutdown = asyncio.create_task(sa.runtime.shutdown(grace=10))
            queued_reply = await queued
            queued_after = sa.runtime.clock.now() - t0
            await shutdown
            later = await c.post("/", json={"prompt": [MMLU.format(2)]})
            return (await running).json(), queued_reply.json(), queued_after, later.json()
    running, queued, queued_after, later = run_virtual(main())
    assert "choices" in running
    assert queued["failed"][0]["reason"] == "shutdown" and queued_after == 0
    first = next(r for r in sa.runtime.log if r["call_id"] == 0)
    assert first["status"] == "served" and close(first["done_at"], 3.0)
    assert later["failed"][0]["reason"] == "shutdown"


class Failing(Backend):
    name = "failing"

    async def run(self, runtime: Runtime, batch: ServeBatch) -> list[str]:
        raise RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED")


class Stalling(Backend):
    name = "stalling"

    async def run(self, runtime: Runtime, batch: ServeBatch) -> list[str]:
        await asyncio.sleep(3600)
        return []


def test_a_backend_that_errors_or_stalls_gets_error_replies_not_hangs():
    failing = make(backend=Failing(), scale=20)
    stalling = make(backend=Stalling(), scale=1, batch_timeout=0.3)

    async def main():
        async with client(failing) as c:
            batch = await c.post("/", json={"prompt": [MMLU.format(0)]})
            openai = await c.post("/v1/completions", json={"prompt": MMLU.format(0)})
            streamed = await c.post("/v1/completions", json={"prompt": MMLU.format(0), "stream": True})
        async with client(stalling) as c:
            stalled = await asyncio.wait_for(c.post("/", json={"prompt": [MMLU.format(0)]}), 10)
            stalled_openai = await asyncio.wait_for(c.post("/v1/completions", json={"prompt": MMLU.format(0)}), 10)
        return batch, openai, streamed, stalled, stalled_openai
    batch, openai, streamed, stalled, stalled_openai = run_virtual(main())
    body = batch.json()
    # the backend's message and traceback stay in the server's log: the reply has an error id
    assert batch.status_code == 200 and "CUBLAS" not in batch.text and "Traceback" not in batch.text
    assert "error id err-" in body["error"] and "error id err-" in body["traceback"]
    assert body["failed"][0]["reason"] == "backend"
    assert openai.status_code == 500 and openai.json()["error"]["type"] == "backend"
    # the backend failed before the batch started: no byte of the stream was sent, a status tells
    assert streamed.status_code == 500 and streamed.json()["error"]["type"] == "backend"
    assert stalled.json()["failed"][0]["reason"] == "timeout"
    assert stalled_openai.status_code == 504


def test_same_batches_as_the_simulator():
    """The server's batches for a trace equal the reference engine's (same policy objects)."""
    from simulator.replay import replay
    from simulator.trace.model import Call, Prompt, Trace

    # [a, b] full at 0.5; [c, d] full at 2.4; e alone at its window's end, 5.6; f alone at 8.5
    arrivals = [0, 0.5, 1.0, 2.4, 3.6, 6.5]
    scenario = build_scenario(run={"gpus": 1, "engine": "reference"}, defaults={"flush": 2.0, "max_batch": 2})
    trace = Trace(tuple(Call(str(i), t, (Prompt("mmlu"),)) for i, t in enumerate(arrivals)))
    log = replay(trace, scenario, det_profile(mmlu=1.5), seed=0).log
    simulated = sorted(sorted(int(i) for i in g["call_index"]) for _, g in log.groupby("batch_id"))
    sa = build_app(scenario, det_profile(mmlu=1.5), SleepBackend(), time_scale=SCALE)

    async def main():
        async with client(sa) as c:
            await asyncio.gather(*(post_at(c, t, [MMLU.format(i)]) for i, t in enumerate(arrivals)))
    run_virtual(main())
    served = sorted(sorted(call for call, _ in b[0]) for b in batches(sa))
    # the server numbers calls in arrival order, as the trace does
    assert served == simulated


def test_batches_released_at_one_instant_draw_in_the_model_order():
    """Two GPUs, split round-robin, flush 1 s: each call's two prompts go to both GPUs'
    queues, whose windows end at one instant; the two batches are formed, and draw their
    service times from the task's stream, in the reference engine's order, so each batch
    takes what it takes there (gamma service times, cv 0.5: a swap would show)."""
    from simulator.replay import replay
    from simulator.trace.model import Call, Prompt, Trace

    profile = profile_from_dict({"name": "gamma", "tasks": {"mmlu": {
        "resource": "gpu", "prompt_tokens": 10, "max_tokens": 4,
        "service": {"kind": "distribution", "dist": "gamma", "cv": 0.5, "mean": 1.0}}}})
    scenario = build_scenario(run={"gpus": 2, "engine": "reference", "gpu_sharing": "exclusive"},
                              tasks={"mmlu": {"topology": "split", "dispatch": "round-robin", "flush": 1.0}})
    arrivals = [0.0, 4.0, 8.0, 12.0]
    trace = Trace(tuple(Call(str(i), t, (Prompt("mmlu"), Prompt("mmlu"))) for i, t in enumerate(arrivals)))
    log = replay(trace, scenario, profile, seed=3).log
    simulated = sorted((int(r.call_index), int(r.prompt_index), r.done_at - r.started_at) for r in log.itertuples())
    sa = build_app(scenario, profile, SleepBackend(), seed=3, time_scale=SCALE)

    async def main():
        async with client(sa) as c:
            await asyncio.gather(*(post_at(c, t, [MMLU.format(i), MMLU.format(i)]) for i, t in enumerate(arrivals)))
    run_virtual(main())
    served = sorted((r["call_id"], r["prompt_index"], r["done_at"] - r["started_at"]) for r in sa.runtime.log)
    assert [s[:2] for s in served] == [m[:2] for m in simulated]
    assert all(close(s[2], m[2]) for s, m in zip(served, simulated, strict=True)), (served, simulated)


def test_continuous_timeline_by_hand():
    """One continuous engine; each iteration takes 6 / 4 = 1.5 s (a deterministic batch of
    6 s over max tokens 4, one token per iteration), a prompt runs 4 iterations. a at 0 runs
    0..6 (first token 1.5). b at 2.2 joins at the boundary 3.0: first token 4.5, done 9.
    c at 10 finds the engine idle: 10..16. With max_num_seqs 1, b waits for a's end (6..12)
    and c for b's (12..18)."""
    for seqs, expect in ((8, [(0, 0, 1.5, 6), (2.2, 3, 4.5, 9), (10, 10, 11.5, 16)]),
                         (1, [(0, 0, 1.5, 6), (2.2, 6, 7.5, 12), (10, 12, 13.5, 18)])):
        sa = make(tasks={"mmlu": {"topology": "continuous", "max_num_seqs": seqs}}, profile=det_profile(mmlu=6.0))

        async def main(sa=sa):
            async with client(sa) as c:
                rs = await asyncio.gather(*(post_at(c, t, [MMLU.format(n)]) for n, t in zip("abc", [0, 2.2, 10],
                                                                                        strict=True)))
            assert all("choices" in r.json() for r in rs)
        run_virtual(main())
        log = sorted(sa.runtime.log, key=lambda r: r["call_id"])
        assert [r["batch_size"] for r in log] == [1, 1, 1] and len({r["batch_id"] for r in log}) == 3
        assert {r["queue"] for r in log} == {"mmlu~0"}
        for rec, (arrived, admitted, first, done) in zip(log, expect, strict=True):
            got = (rec["arrived_at"], rec["batched_at"], rec["first_token_at"], rec["done_at"])
            assert all(close(g, e) for g, e in zip(got, (arrived, admitted, first, done), strict=True)), (seqs, got)


def test_continuous_same_admissions_as_the_simulator():
    """Two GPUs, an engine each, prompts dispatched round-robin; iterations of 1.5 s. The
    server's admissions (which prompts join which engine at which boundary) equal the
    reference engine's, at the same instants."""
    from simulator.replay import replay
    from simulator.trace.model import Call, Prompt, Trace

    calls = [(0, 2), (2.25, 1), (3.75, 2), (5.25, 1), (12.75, 1)]
    scenario = build_scenario(run={"gpus": 2, "engine": "reference"},
                              tasks={"mmlu": {"topology": "continuous", "dispatch": "round-robin"}})
    profile = det_profile(mmlu=6.0)
    trace = Trace(tuple(Call(str(i), t, tuple(Prompt("mmlu") for _ in range(n))) for i, (t, n) in enumerate(calls)))
    log = replay(trace, scenario, profile, seed=0).log

    def admissions(rows: list[tuple[int, int, float, float]]) -> list[tuple[list[int], int, float]]:
        out: dict[int, Any] = {}
        for batch, call, gpu, at in rows:
            out.setdefault(batch, [[], int(gpu), float(at)])[0].append(call)
        return sorted((sorted(v[0]), v[1], v[2]) for v in out.values())
    simulated = admissions([(int(r.batch_id), int(r.call_index), r.gpu, r.started_at) for r in log.itertuples()])
    sa = build_app(scenario, profile, SleepBackend(), time_scale=SCALE)

    async def main():
        async with client(sa) as c:
            await asyncio.gather(*(post_at(c, t, [MMLU.format(i)] * n) for i, (t, n) in enumerate(calls)))
    run_virtual(main())
    served = admissions([(r["batch_id"], r["call_id"], r["gpu"], r["batched_at"]) for r in sa.runtime.log])
    assert [(b[0], b[1]) for b in served] == [(b[0], b[1]) for b in simulated]
    assert all(close(a[2], b[2]) for a, b in zip(served, simulated, strict=True)), (served, simulated)


def test_continuous_preemption_as_the_simulator():
    """A KV cache of 6 blocks of 4 tokens: three 7-token prompts of one call are admitted
    together (2 blocks each), the newest is preempted when the rows grow into a third block,
    recomputed when the others end; a fourth prompt waits behind it. Each prompt ends when
    the reference engine says (6, 6, 10.5, 12), one preemption among them."""
    from simulator.replay import replay
    from simulator.trace.classify import estimate_tokens
    from simulator.trace.model import Call, Prompt, Trace

    calls = [(0, 3), (2.25, 1)]
    scenario = build_scenario(run={"gpus": 1, "engine": "reference"},
                              tasks={"mmlu": {"topology": "continuous", "kv_blocks": 6, "block_size": 4}})
    profile = det_profile(mmlu=6.0)
    texts = {(i, j): MMLU.format(f"{i}{j}") for i, (_, n) in enumerate(calls) for j in range(n)}
    trace = Trace(tuple(Call(str(i), t, tuple(Prompt("mmlu", prompt_tokens=estimate_tokens(texts[i, j]), max_tokens=4)
                                              for j in range(n))) for i, (t, n) in enumerate(calls)))
    log = replay(trace, scenario, profile, seed=0).log.sort_values(["call_index", "prompt_index"])
    assert int(log["preemptions"].sum()) == 1
    sa = build_app(scenario, profile, SleepBackend(), time_scale=SCALE)

    async def main():
        async with client(sa) as c:
            await asyncio.gather(*(post_at(c, t, [texts[i, j] for j in range(n)]) for i, (t, n) in enumerate(calls)))
    run_virtual(main())
    served = sorted(sa.runtime.log, key=lambda r: (r["call_id"], r["prompt_index"]))
    assert [r["status"] for r in served] == ["served"] * 4
    assert all(close(r["done_at"], d) for r, d in zip(served, log["done_at"], strict=True)), served


# -- the command ---------------------------------------------------------------------------
runner = CliRunner()


@pytest.mark.parametrize("args, words", [
    (["-s", "design-notes", "--set", "tasks.mmlu.topology=split_by_color"], "field 'topology'"),
    (["-s", "design-notes", "--backend", "harness", "--set", "tasks.mmlu.topology=continuous"],
     "runs whole batches, not continuous engines"),
    (["-s", "design-notes", "--time-scale", "0"], "--time-scale"),
    (["-s", "design-notes", "--backend", "harness", "--time-scale", "5"], "only the sleep backend"),
    (["-s", "design-notes", "--backend", "openai:http://127.0.0.1:9"], "1 URL(s) for 2 GPU(s)"),
    (["-s", "design-notes", "--backend", "gpu"], "unknown backend 'gpu'"),
    (["-s", "no-such-scenario"], "no-such-scenario"),
    (["-s", "design-notes", "--set", "run.host_lock=true"], "host_lock"),
    (["-s", "design-notes", "--default-task", "chat"],
     "'--default-task': unknown task 'chat'; valid: infobench, mmlu, graph, none"),
    (["-s", "design-notes", "--per-prompt"], "only the openai backend"),
])
def test_cli_errors_are_one_line_and_exit_2(args, words):
    result = runner.invoke(cli_app, ["serve", *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], result.stderr
    assert "Traceback" not in result.output


def test_cli_says_when_the_serve_extra_is_missing(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "uvicorn" else real(name, *a))
    result = runner.invoke(cli_app, ["serve", "-s", "design-notes"])
    assert result.exit_code == 2 and "pip install 'simctl-llm[serve]'" in result.stderr and "uvicorn" in result.stderr


def test_the_command_serves_and_shuts_down_on_sigint(tmp_path):
    """A real process on a free port: a call is answered; SIGINT while a batch runs and a
    call waits: the running one is answered, the waiting one gets an error reply, the
    process exits. Each step waits for the server's metrics to show the state before it (no
    sleeps): the one real-time margin is the running batch's ~5 s."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-c", "from simulator.cli import main; main()", "serve", "-s",
                             "design-notes", "--set", "tasks.infobench.flush=0", "--set", "tasks.infobench.workers=1",
                             "--time-scale", "20", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert match, line + (proc.stderr.read() if proc.stderr else "")
        url = f"http://127.0.0.1:{match.group(1)}/"

        async def until(c: httpx.AsyncClient, metric: str, value: float) -> None:
            """Until the sum of ``metric``'s samples on /metrics is ``value``."""
            pattern = re.compile(rf"^{re.escape(metric)}(?:{{[^}}]*}})? (\S+)$", re.M)
            while sum(float(v) for v in pattern.findall((await c.get(url + "metrics")).text)) != value:
                await asyncio.sleep(0.01)

        async def main():
            async with httpx.AsyncClient(timeout=30) as c:
                first = await c.post(url, json={"prompt": [GRAPH.format(0)]})
                # an infobench batch of the seed-calibrated profile takes ~100 s: ~5 s here
                running = asyncio.create_task(c.post(url, json={"prompt": [INFOBENCH.format(1)]}))
                await until(c, "simctl_gpu_running_batches", 1)
                waiting = asyncio.create_task(c.post(url, json={"prompt": [INFOBENCH.format(2)]}))
                await until(c, 'simctl_queue_depth{queue="infobench"}', 1)
                proc.send_signal(signal.SIGINT)
                return first.json(), (await running).json(), (await waiting).json()
        first, running, waiting = asyncio.run(main())
        assert "choices" in first and "choices" in running
        assert "shutting down" in waiting["error"]
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_harness_backend_serves_a_call_on_the_cpu():
    pytest.importorskip("torch")
    from simulator.serve.backends import HarnessBackend

    sa = make(tasks={"mmlu": {"topology": "direct"}}, backend=HarnessBackend(device="cpu"), scale=1)

    async def main():
        async with client(sa) as c:
            await sa.runtime.start()
            t0 = time.monotonic()
            r = await c.post("/", json={"prompt": [MMLU.format("a"), MMLU.format("bb"), GRAPH.format(0)],
                                        "max_tokens": 4})
            return r.json(), time.monotonic() - t0
    body, seconds = asyncio.run(main())
    assert [c["task"] for c in body["choices"]] == ["mmlu", "mmlu", "graph"], body
    assert all(len(c["text"].split()) == 4 for c in body["choices"][:2])
    assert seconds < 30


def test_harness_prompts_are_as_many_tokens_as_the_trace_says():
    """The load generator's invented text of P tokens is a prefill of P tokens on the harness."""
    from simulator.serve.backends import prompt_tokens
    from simulator.trace.formats.client import placeholder_text

    for tokens in (16, 64, 190):
        ids = prompt_tokens(placeholder_text("mmlu", tokens), 1000)
        assert len(ids) == tokens and all(0 <= i < 1000 for i in ids)
    assert prompt_tokens("", 1000) == [0] and len(prompt_tokens("abcde", 7)) == 2


def test_load_against_serve_with_a_failing_engine_records_failed_calls(tmp_path):
    """End to end: ``simctl serve`` (a process) in front of an engine that errors, drops the
    connection or stalls past the batch timeout, loaded by ``simctl load``'s library: each
    such call is a failed call in the run record with the server's error reply, the good
    calls succeed, and nothing hangs."""
    from live_server import FakeServer

    from simulator.live import LoadOptions, run_load
    from simulator.observed import read_observed
    from simulator.trace.model import Call, Prompt, Trace

    markers = ["", "[500]", "[drop]", "[stall]", ""]
    trace = Trace(tuple(Call(str(i), 0.2 * i, (Prompt("mmlu", 10, 4, MMLU.format(m)),))
                        for i, m in enumerate(markers)))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with FakeServer() as engine:
        proc = subprocess.Popen([sys.executable, "-c", "from simulator.cli import main; main()", "serve", "-s",
                                 str(REPO / "scenarios" / "harness-cpu.toml"), "-p", "cpu__tiny__tiny",
                                 "--backend", f"openai:{engine.url}", "--set", "tasks.mmlu.flush=0",
                                 "--set", "tasks.mmlu.max_batch=1", "--batch-timeout", "3", "--port", "0"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
        try:
            line = proc.stdout.readline() if proc.stdout else ""
            match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
            assert match, line + (proc.stderr.read() if proc.stderr else "")
            t0 = time.monotonic()
            result = run_load(trace, LoadOptions(url=f"http://127.0.0.1:{match.group(1)}/", timeout=20),
                              tmp_path / "run", handle_sigint=False)
            seconds = time.monotonic() - t0
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=20) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    # the stalled batch gave up at its 3 s timeout (long enough that an answered call never
    # meets it on a busy machine), not at the client's 20 s
    assert seconds < 15
    recs = {r["batch_id"]: r for r in result.summary["results"]}
    assert result.summary["successful_batches"] == 2 and result.summary["failed_batches"] == 3
    assert "choices" in recs[0]["response"] and "choices" in recs[4]["response"]
    for i in (1, 2, 3):   # the server's error replies: HTTP 200 with an error body, as the users' server
        assert recs[i]["status_code"] == 200 and "choices" not in recs[i]["response"], recs[i]
    # the engine's own reply stays in the server's log; the client gets an error id
    assert "error id err-" in recs[1]["response"]["error"] and "HTTP 500" not in json.dumps(recs[1]["response"])
    assert recs[2]["response"]["failed"][0]["reason"] == "backend"
    assert recs[3]["response"]["failed"][0]["reason"] == "timeout"
    run = read_observed(tmp_path / "run")
    assert list(run.calls["ok"]) == [True, False, False, False, True]


# -- what benchmark clients send -------------------------------------------------------------
SYNTHETIC = "kept sand seven ocean ran quickly under the old bridge"  # no keyword rule matches it


def _openai_shaped(reply: Any, status: int, error_type: str, param: str | None = None) -> dict:
    """The reply is ``status`` with OpenAI's error body; returns the error object."""
    assert reply.status_code == status, (reply.status_code, reply.text)
    assert reply.headers["content-type"].startswith("application/json"), reply.headers
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"], error
    assert error["type"] == error_type and error["param"] == param and error["code"] == status, error
    return error


def test_a_prompt_no_rule_serves_goes_to_the_default_task():
    """With a default task, a synthetic prompt is served as that task on every endpoint (and
    the batch endpoint says so); without one (the library's default, --default-task none),
    it is refused: 400 on the OpenAI endpoints, streamed or not, the legacy reply on POST /."""
    served = make(scale=20, default_task="mmlu")
    strict = make(scale=20)

    async def main():
        async with client(served) as c:
            batch = await c.post("/", json={"prompt": [SYNTHETIC, INFOBENCH.format(0)], "max_tokens": 2})
            plain = await c.post("/v1/completions", json={"prompt": SYNTHETIC, "max_tokens": 2})
            stream = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": SYNTHETIC}],
                                                                "max_tokens": 2, "stream": True})
        async with client(strict) as c:
            refused = [await c.post("/v1/completions", json={"prompt": SYNTHETIC, "stream": s}) for s in (False, True)]
            legacy = await c.post("/", json={"prompt": [SYNTHETIC]})
        return batch, plain, stream, refused, legacy
    batch, plain, stream, refused, legacy = run_virtual(main())
    assert [ch["task"] for ch in batch.json()["choices"]] == ["mmlu", "infobench"]
    assert plain.status_code == 200 and plain.json()["choices"][0]["text"] == " the of"
    assert stream.status_code == 200 and _events(stream.text)[-1] == "[DONE]"
    assert sorted({r["task"] for r in served.runtime.log}) == ["infobench", "mmlu"]
    assert [r["task"] for r in served.runtime.log].count("mmlu") == 3
    for reply in refused:
        assert "no task of this server matches" in _openai_shaped(reply, 400, "unknown-task")["message"]
    assert legacy.status_code == 200 and legacy.json()["failed"][0]["reason"] == "unknown-task"


def test_default_task_of_the_command():
    """simctl serve's default is the profile's first task on a GPU (design-notes: infobench,
    graph runs on the CPU); ``none`` keeps the strict routing; a task the profile lacks is an
    error (test_cli_errors_are_one_line_and_exit_2)."""
    from simulator.cli.serve import make_server

    def default(name: str | None, scenario: str = "design-notes", sets: tuple[str, ...] = ()) -> str | None:
        sa = make_server(scenario, "seed-calibrated", "sleep", 1.0, 0, list(sets), 600.0, 30.0, "tiny", "tiny",
                         None, None, default_task=name)
        return sa.runtime.default_task
    assert default(None) == "infobench" and default("none") is None and default("graph") == "graph"
    assert default(None, sets=("tasks.infobench.resource=cpu",)) == "mmlu"


def test_request_errors_before_the_first_byte_are_4xx_with_the_openai_body():
    """Each bad request, streamed or not, is a status code and OpenAI's error body: the body,
    its fields, n > 1 (one choice per request), a model this server does not serve, a route
    or method it does not have; a full queue refuses a stream with 429 before it starts."""
    sa = make(defaults={"flush": 10.0, "max_batch": 8, "max_queue": 1}, scale=20)
    chat = "/v1/chat/completions"
    messages = [{"role": "user", "content": MMLU.format(0)}]

    async def main():
        async with client(sa) as c:
            replies = {}
            for stream in (False, True):
                replies["json", stream] = await c.post(chat, content=b"{", headers={"content-type": "application/json"})
                replies["messages", stream] = await c.post(chat, json={"messages": [], "stream": stream})
                replies["prompt", stream] = await c.post("/v1/completions", json={"prompt": ["a", "b"], "stream": stream})
                replies["max", stream] = await c.post(chat, json={"messages": messages, "max_completion_tokens": 0,
                                                                  "stream": stream})
                replies["n", stream] = await c.post(chat, json={"messages": messages, "n": 2, "stream": stream})
                replies["model", stream] = await c.post(chat, json={"messages": messages, "model": "gpt-4o",
                                                                    "stream": stream})
            replies["route"] = await c.post("/v1/embeddings", json={"input": "x"})
            replies["method"] = await c.get("/v1/completions")
            waiting = asyncio.create_task(c.post("/v1/completions", json={"prompt": MMLU.format(1), "max_tokens": 1}))
            await asyncio.sleep(0.1)
            replies["full"] = await c.post("/v1/completions", json={"prompt": MMLU.format(2), "stream": True})
            await waiting
            return replies
    replies = run_virtual(main())
    for stream in (False, True):
        _openai_shaped(replies["json", stream], 400, "invalid")
        _openai_shaped(replies["messages", stream], 400, "invalid", "messages")
        _openai_shaped(replies["prompt", stream], 400, "invalid", "prompt")
        _openai_shaped(replies["max", stream], 400, "invalid", "max_completion_tokens")
        assert "n must be 1" in _openai_shaped(replies["n", stream], 400, "invalid", "n")["message"]
        assert "'simctl'" in _openai_shaped(replies["model", stream], 404, "unknown-model", "model")["message"]
    _openai_shaped(replies["route"], 404, "not-found")
    _openai_shaped(replies["method"], 405, "method-not-allowed")
    assert "max_queue 1" in _openai_shaped(replies["full"], 429, "rejected")["message"]


class FailsAfterStarting(SleepBackend):
    """Starts each batch (its tokens due at once), then fails it."""

    name = "fails-after-starting"

    async def run(self, runtime: Runtime, batch: ServeBatch) -> list[str]:
        batch.plan(runtime, 0.0, 1.0)
        await asyncio.sleep(0)
        raise RuntimeError("lost the GPU")


def test_a_failure_after_the_stream_began_is_an_error_event():
    sa = make(backend=FailsAfterStarting(), scale=20)

    async def main():
        async with client(sa) as c:
            return await c.post("/v1/completions", json={"prompt": MMLU.format(0), "max_tokens": 3, "stream": True})
    reply = run_virtual(main())
    assert reply.status_code == 200
    events = _events(reply.text)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "backend" and "error id err-" in error["message"] and error["code"] == 500
    assert "lost the GPU" not in reply.text


def test_the_sleep_backends_text_counts_as_its_tokens():
    """A client that counts the reply's tokens itself gets what usage says: by whitespace
    exactly, and by a byte-level BPE tokenizer trained offline on the docs' prose alone
    (the word list left out of its corpus) within 10 %."""
    sa = make(scale=20)

    async def main():
        async with client(sa) as c:
            return [(await c.post("/v1/completions", json={"prompt": MMLU.format(n), "max_tokens": n})).json()
                    for n in (1, 7, 64, 200)]
    replies = run_virtual(main())
    texts = [r["choices"][0]["text"] for r in replies]
    assert [len(t.split()) for t in texts] == [r["usage"]["completion_tokens"] for r in replies] == [1, 7, 64, 200]
    assert all(t.startswith(" ") and " tok" not in t for t in texts)
    pytest.importorskip("tokenizers")
    import importlib.util

    spec = importlib.util.spec_from_file_location("offline_tokenizer", REPO / "benchmarks" / "offline_tokenizer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    bpe = module.build_tokenizer(words=False)
    for text, reply in zip(texts[1:], replies[1:], strict=True):
        counted, claimed = len(bpe.encode(text).ids), reply["usage"]["completion_tokens"]
        assert abs(counted - claimed) <= 0.1 * claimed, (counted, claimed, text)


# -- the openai backend and the engines behind it ----------------------------------------------
async def _uvicorn(asgi: Any) -> tuple[Any, asyncio.Task, str]:
    """``asgi`` served by uvicorn on a free loopback port in this loop: (server, task, URL)."""
    uvicorn = pytest.importorskip("uvicorn")
    server = uvicorn.Server(uvicorn.Config(asgi, host="127.0.0.1", port=0, log_level="error", lifespan="on"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.02)
    return server, task, f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"


def _recording(app: Any, bodies: list[Any]) -> Any:
    """``app`` recording the JSON body of every POST it is sent, in arrival order."""
    async def asgi(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return await app(scope, receive, send)
        chunks: list[bytes] = []

        async def recorded() -> dict:
            message = await receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    bodies.append(json.loads(b"".join(chunks) or b"null"))
            return message
        await app(scope, recorded, send)
    return asgi


def _front(url: str, per_prompt: bool = False) -> Any:
    """A one-GPU server whose mmlu batches (3 prompts of a call at once) go to ``url``."""
    from simulator.serve.backends import OpenAIBackend

    return make(tasks={"mmlu": {"flush": 0.0, "max_batch": 8}}, backend=OpenAIBackend([url], per_prompt=per_prompt),
                scale=1, default_task="mmlu")


async def _three_calls(front: Any) -> list[Any]:
    async with client(front) as c:
        replies = [(await c.post("/", json={"prompt": [MMLU.format(f"{call}{i}") for i in range(3)],
                                            "max_tokens": 2})).json() for call in range(2)]
    await front.runtime.shutdown(grace=5)  # closes the backend's connections
    return replies


def test_openai_backend_finds_that_simctl_serve_takes_one_prompt_per_request():
    """Behind the front, ``simctl serve`` itself (one prompt per OpenAI request, a list of 3
    answers 400): the first batch's list is refused once, its prompts go one request each,
    and from then on the front sends that engine one request per prompt; forced with
    per_prompt, no list is ever sent."""
    for forced in (False, True):
        engine = make(scale=50)
        bodies: list[Any] = []

        async def main(engine=engine, bodies=bodies, forced=forced):
            server, task, url = await _uvicorn(_recording(engine.app, bodies))
            try:
                front = _front(url, per_prompt=forced)
                return await _three_calls(front), front.runtime.backend
            finally:
                server.should_exit = True
                await task
        replies, backend = asyncio.run(asyncio.wait_for(main(), 60))
        assert all(len(r["choices"]) == 3 for r in replies), replies
        assert [r["choices"][0]["text"] for r in replies] == [" the of", " the of"]
        prompts = [b["prompt"] for b in bodies]
        lists = [p for p in prompts if isinstance(p, list)]
        assert lists == ([] if forced else [[MMLU.format(f"0{i}") for i in range(3)]]), prompts
        assert sorted(p for p in prompts if isinstance(p, str)) == sorted(MMLU.format(f"{c}{i}") for c in range(2)
                                                                           for i in range(3))
        assert list(backend.per_prompt.values()) == [True]
        assert len(engine.runtime.log) == 6 and {r["status"] for r in engine.runtime.log} == {"served"}


def test_openai_backend_sends_lists_to_an_engine_that_takes_them():
    """An engine that answers a list of prompts gets each batch as one list request (the
    probe's success remembered); forced per prompt, the same engine gets one request each."""
    from live_server import FakeServer

    for forced, expect in ((False, [3, 3]), (True, [1] * 6)):
        with FakeServer() as engine:
            replies = asyncio.run(asyncio.wait_for(_three_calls(_front(engine.url, per_prompt=forced)), 60))
            sizes = [len(b["prompt"]) if isinstance(b["prompt"], list) else 1 for _, _, b in engine.received
                     if b.get("prompt") is not None]
        assert all(len(r["choices"]) == 3 for r in replies), replies
        assert sizes == expect


def _guidellm() -> str:
    """The ``guidellm`` executable: $SIMCTL_GUIDELLM, else on PATH (skips the test if none)."""
    import shutil

    exe = os.environ.get("SIMCTL_GUIDELLM") or shutil.which("guidellm")
    if not exe:
        pytest.skip("guidellm is not installed (pip install guidellm==0.8.1, or point SIMCTL_GUIDELLM at its "
                    "executable)")
    return exe


def test_openai_backend_in_front_of_guidellms_mock_server(tmp_path):
    """GuideLLM's mock server takes one prompt per request (a list answers HTTP 500): the
    front falls back to one request per prompt and every call is answered."""
    import socket

    exe = _guidellm()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([exe, "mock-server", "--host", "127.0.0.1", "--port", str(port), "--ttft-ms", "1",
                             "--itl-ms", "1", "--request-latency", "0.01", "--output-tokens", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120  # a hang guard: the mock server imports for some seconds
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "guidellm mock-server did not start"
            time.sleep(0.2)
        front = _front(url)
        replies = asyncio.run(asyncio.wait_for(_three_calls(front), 60))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert all(len(r.get("choices", [])) == 3 for r in replies), replies
    assert front.runtime.backend.per_prompt == {url: True}
