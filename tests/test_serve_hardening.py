"""``simctl serve`` against hostile and broken clients (simulator/serve/guard.py): the body,
prompt, nesting, read-time and concurrency limits, the API key, error replies that never
carry a traceback, a fuzz run of every endpoint, and the classes of tests/hostile_http.py.

In-process tests go through httpx's ASGI transport on a virtual-time loop (no test waits for
real); the read-timeout and flood tests use real sockets on uvicorn with the command's
protocol, and check only what holds however slow the machine is (every wait has a generous
hang guard)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

import hostile_http  # noqa: E402
from helpers import assert_one_line_error  # noqa: E402
from hypothesis import (  # noqa: E402
    HealthCheck,
    given,
    settings,
    strategies as st,  # noqa: E402
)
from typer.testing import CliRunner  # noqa: E402
from virtual_time import run_virtual  # noqa: E402

from simulator.cli import app as cli_app  # noqa: E402
from simulator.serve.backends import SleepBackend  # noqa: E402
from simulator.serve.guard import Limits, json_depth, parse_size  # noqa: E402
from simulator.serve.runtime import Runtime, ServeBatch  # noqa: E402

KEY = hostile_http.KEY
AUTH = {"Authorization": f"Bearer {KEY}"}
Q = "multiple choice question: {}"


def serve_app(**limits: Any) -> Any:
    return hostile_http.make_serve_app(**limits)


def client(sa: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=sa.app), base_url="http://serve", timeout=30)


def openai_error(reply: Any, status: int, *words: str) -> dict:
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["code"] == status and set(error) == {"message", "type", "param", "code"}
    for word in words:
        assert word in error["message"], error["message"]
    assert not hostile_http.leaks(reply.text)
    return error


# -- the pieces ----------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "size"), [("16777216", 16 * 2**20), ("16MiB", 16 * 2**20), ("1GB", 10**9),
                                            ("512kB", 512_000), ("2 KiB", 2048), ("1.5MB", 1_500_000)])
def test_sizes_in_bytes_or_units(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "MiB", "-5", "12 parsecs", "0", "1e9"])
def test_sizes_that_are_not(text):
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


@pytest.mark.parametrize(("raw", "depth"), [
    (b"1", 0), (b"[]", 1), (b'{"a": [1, {"b": [[]]}]}', 5), (b'"[[[[{{{"', 0),
    (b'{"a": "x\\"[[[", "b": [1]}', 2), (b"[" * 100_000 + b"]" * 100_000, 100_000),
    (b'[[["]]]"]]]', 3),
])
def test_json_depth_counts_brackets_outside_strings(raw, depth):
    assert json_depth(raw) == depth


def test_json_depth_agrees_with_the_parser():
    for value in ([], [[1], {"a": [{"b": "[{"}]}], {"x": [[[[[]]]]]}, "]]]", [{}, [[]], {"k": {"k": {}}}]):
        raw = json.dumps(value).encode()

        def depth(v: Any) -> int:
            inner = v.values() if isinstance(v, dict) else v if isinstance(v, list) else ()
            return 1 + max((depth(x) for x in inner), default=0) if isinstance(v, list | dict) else 0
        assert json_depth(raw) == depth(value)


def test_limits_are_checked_once():
    with pytest.raises(ValueError, match="max_prompts"):
        Limits(max_prompts=0)
    with pytest.raises(ValueError, match="read_timeout"):
        Limits(read_timeout=0)
    with pytest.raises(ValueError, match="api_key"):
        Limits(api_key="")


# -- in-process: each refusal's status and body -------------------------------------------
def test_api_key_guards_every_endpoint_but_health():
    sa = serve_app(api_key=KEY)

    async def main():
        async with client(sa) as c:
            open_health = await c.get("/health")
            missing = {p: await c.post(p, json={"prompt": [Q.format(0)]}) for p in ("/", "/v1/completions")}
            wrong = await c.get("/v1/models", headers={"Authorization": f"Bearer {KEY}x"})
            scheme = await c.get("/metrics", headers={"Authorization": f"Basic {KEY}"})
            right = await c.get("/v1/models", headers=AUTH)
            metrics = await c.get("/metrics", headers=AUTH)
            return open_health, missing, wrong, scheme, right, metrics
    open_health, missing, wrong, scheme, right, metrics = run_virtual(main())
    assert open_health.status_code == 200
    for reply in (*missing.values(), wrong, scheme):
        assert openai_error(reply, 401, "API key")["type"] == "unauthorized"
        assert reply.headers["www-authenticate"] == "Bearer"
    assert right.status_code == 200 and metrics.status_code == 200


def test_a_body_over_the_limit_is_413_before_it_is_read():
    sa = serve_app(max_body=1000)
    reads = []

    async def main():
        async with client(sa) as c:
            big = await c.post("/v1/completions", content=b"x" * 1001, headers={"content-type": "application/json"})

            async def chunks():  # no Content-Length: counted as it arrives
                for _ in range(100):
                    reads.append(1)
                    yield b"y" * 100
            chunked = await c.post("/", content=chunks())
            fits = await c.post("/", json={"prompt": [Q.format(0)], "max_tokens": 1})
            return big, chunked, fits
    big, chunked, fits = run_virtual(main())
    openai_error(big, 413, "1,000 bytes")
    assert big.headers["connection"] == "close"
    openai_error(chunked, 413, "1,000 bytes")
    assert len(reads) < 100  # refused as it passed the limit, not after the whole body
    assert "choices" in fits.json()


def test_deep_nesting_is_refused_before_the_parser_recurses():
    sa = serve_app(max_depth=64)
    deep = b'{"prompt": ["q"], "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    ok = b'{"prompt": ["' + Q.format(0).encode() + b'"], "max_tokens": 1, "x": ' + b"[" * 63 + b"]" * 63 + b"}"

    async def main():
        async with client(sa) as c:
            headers = {"content-type": "application/json"}
            return (await c.post("/", content=deep, headers=headers),
                    await c.post("/v1/chat/completions", content=deep, headers=headers),
                    await c.post("/", content=ok, headers=headers))
    batch, chat, fine = run_virtual(main())
    assert batch.status_code == 200 and "deeper than 64" in batch.json()["error"]
    openai_error(chat, 400, "deeper than 64")
    assert "choices" in fine.json()


def test_prompt_count_and_length_limits_name_the_limit():
    sa = serve_app(max_prompts=3, max_prompt_tokens=10, max_output_tokens=50)

    async def main():
        async with client(sa) as c:
            return (await c.post("/", json={"prompt": ["q"] * 4}),
                    await c.post("/", json={"prompt": ["q", "x" * 41]}),
                    await c.post("/v1/completions", json={"prompt": "x" * 41}),
                    await c.post("/v1/completions", json={"prompt": "q", "max_tokens": 51}),
                    await c.post("/", json={"prompt": ["q"], "max_tokens": 51}),
                    await c.post("/", json={"prompt": ["q"] * 3, "max_tokens": 2}))
    count, long, long_openai, output, output_batch, fits = run_virtual(main())
    assert "4 prompts, more than the server's limit of 3 prompts a call" in count.json()["error"]
    assert "prompt 1 is about 11 tokens" in long.json()["error"] and "limit of 10 tokens" in long.json()["error"]
    openai_error(long_openai, 413, "limit of 10 tokens")
    openai_error(output, 400, "at most 50")
    assert "at most 50" in output_batch.json()["error"]
    assert len(fits.json()["choices"]) == 3


@pytest.mark.parametrize(("path", "field", "value", "words"), hostile_http.WRONG_TYPES)
def test_wrong_types_of_every_field_are_400_naming_it(path, field, value, words):
    sa = serve_app(max_output_tokens=1000)
    body = hostile_http.prompt_body(path, [Q.format(0)], max_tokens=2)
    body[field] = value

    async def main():
        async with client(sa) as c:
            return await c.post(path, json=body)
    reply = run_virtual(main())
    if path == "/":
        assert reply.status_code == 200 and words in reply.json()["error"] and "choices" not in reply.json()
    else:
        openai_error(reply, 400, words)


class LeakyBackend(SleepBackend):
    """An engine whose error carries what no client may see: its URL, its reply, a path."""

    name = "leaky"

    async def run(self, runtime: Runtime, batch: ServeBatch) -> list[str]:
        raise RuntimeError("POST http://10.0.0.7:8001/v1/completions -> 500: {\"detail\": \"secret upstream "
                           "body\"} at /opt/engine/server.py")


def test_a_backend_error_reaches_clients_only_as_an_error_id(caplog):
    from simulator.profile import profile_from_dict
    from simulator.scenario import build_scenario
    from simulator.serve.app import build_app

    profile = profile_from_dict({"name": "det", "tasks": {"mmlu": {
        "resource": "gpu", "prompt_tokens": 10, "max_tokens": 4,
        "service": {"kind": "distribution", "dist": "deterministic", "mean": 0.1}}}})
    sa = build_app(build_scenario(run={"gpus": 1}), profile, LeakyBackend(), time_scale=100, default_task="mmlu")

    async def main():
        async with client(sa) as c:
            return (await c.post("/", json={"prompt": [Q.format(0), Q.format(1)]}),
                    await c.post("/v1/completions", json={"prompt": Q.format(2)}),
                    await c.post("/v1/chat/completions", json={"messages": [{"content": "x"}], "stream": True}))
    with caplog.at_level(logging.ERROR, logger="simctl.serve"):
        replies = run_virtual(main())
    for reply in replies:
        assert "10.0.0.7" not in reply.text and "secret" not in reply.text and "/opt" not in reply.text
        assert "Traceback" not in reply.text and "error id err-" in reply.text
    batch = replies[0].json()
    assert set(batch) == {"error", "traceback", "failed"} and batch["failed"][0]["reason"] == "backend"
    eid = batch["traceback"].split()[2].rstrip(":")
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith(eid)]
    assert len(logged) == 1 and "secret upstream body" in logged[0] and "Traceback" in logged[0]


def test_an_unexpected_error_in_a_handler_is_a_generic_500_with_an_id(caplog, monkeypatch):
    sa = serve_app()

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise KeyError("/srv/secret/path")
    monkeypatch.setattr(sa.runtime, "submit_call", broken)
    monkeypatch.setattr(sa.runtime, "submit_prompt", broken)

    async def main():
        async with client(sa) as c:
            return (await c.post("/", json={"prompt": [Q.format(0)]}),
                    await c.post("/v1/completions", json={"prompt": Q.format(0)}),
                    await c.get("/health"))
    with caplog.at_level(logging.ERROR, logger="simctl.serve"):
        batch, openai, health = run_virtual(main())
    assert batch.status_code == 200 and "internal server error (error id err-" in batch.json()["error"]
    assert openai_error(openai, 500, "internal server error (error id err-")["type"] == "internal"
    for reply in (batch, openai):
        assert "/srv/secret" not in reply.text
    assert sum("/srv/secret/path" in (r.exc_text or "") for r in caplog.records) == 2
    assert health.status_code == 200


# -- real sockets --------------------------------------------------------------------------
def test_a_stalled_client_is_closed_after_the_read_timeout():
    """A client that sends half its headers, or its headers and half its body, is closed
    (the body with 408); one that keeps sending a complete request is served."""
    with hostile_http.live(read_timeout=0.3) as server:
        half_head = server.raw(b"POST /v1/completions HTTP/1.1\r\nHost: s\r\nContent-Le")
        half_body = server.raw(f"POST / HTTP/1.1\r\nHost: s\r\nAuthorization: Bearer {KEY}\r\n"
                               "Content-Length: 40\r\n\r\n{\"prompt\"".encode())
        served = server.post("/", {"prompt": [Q.format(0)], "max_tokens": 2})
    assert half_head.closed and half_head.status is None and half_head.seconds < hostile_http.HANG_GUARD
    assert half_body.closed and half_body.status == 408 and "did not arrive within 0.3 s" in half_body.text()
    assert "choices" in served.json()


def test_a_keep_alive_connection_whose_next_request_stalls_is_closed():
    # uvicorn's own keep-alive timeout set past the hang guard: only the header deadline closes it
    with hostile_http.live(read_timeout=0.3, keep_alive=10 * hostile_http.HANG_GUARD) as server, \
            socket.create_connection(("127.0.0.1", server.port), timeout=hostile_http.HANG_GUARD) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: s\r\n\r\n")
        first = sock.recv(65536)
        sock.sendall(b"GET /heal")
        started = time.monotonic()
        rest = b""
        while chunk := sock.recv(65536):
            rest += chunk
    assert first.startswith(b"HTTP/1.1 200") and (first + rest).count(b"HTTP/1.1 ") == 1
    assert time.monotonic() - started < hostile_http.HANG_GUARD


@pytest.mark.parametrize("klass", sorted(hostile_http.CLASSES))
def test_hostile_http_classes_are_all_handled(klass):
    tried, handled = hostile_http.CLASSES[klass](8)
    assert tried == 8 and handled == tried


# -- a fuzz run of every endpoint -----------------------------------------------------------
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**6), st.integers(), st.floats(allow_nan=True),
                     st.text(max_size=40))
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                           max_size=4), max_leaves=12)
_texts = st.text(max_size=60) | st.just(Q.format(1))
_parts = st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _texts}), min_size=1, max_size=3)
_messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]),
                                            "content": _texts | _parts}), min_size=1, max_size=4)
_tokens = st.integers(1, 10)  # the fuzz server's max_output_tokens is 8: some pass it
_common = {"max_tokens": _tokens, "max_completion_tokens": _tokens, "n": st.just(1), "model": st.just("simctl"),
           "stream": st.booleans(), "stream_options": st.fixed_dictionaries({}, optional={
               "include_usage": st.booleans()}), "temperature": st.floats(0, 2)}
#: each endpoint's fields (the OpenAI reference's, and the batch endpoint's) with valid values;
#: a request is a valid body with any one or two of its fields, or the whole body, replaced by
#: any JSON value (schemathesis' negative cases: one field wrong at a time reaches the checks
#: after it)
SCHEMA: dict[str, tuple[dict, dict]] = {
    "/": ({"prompt": st.lists(_texts, min_size=1, max_size=10) | _texts}, {"max_tokens": _tokens}),
    "/v1/completions": ({"prompt": _texts | st.lists(_texts, min_size=1, max_size=1)}, _common),
    "/v1/chat/completions": ({"messages": _messages}, _common),
}


#: a field's replacement: a value of each JSON type (the wrong one for most fields), or any JSON
_wrong = st.sampled_from([None, True, False, 0, -1, 5, 1.5, 10**30, "", "x", [], [1], {}, {"a": 1}]) | _json


#: each endpoint's valid bodies and its fields to replace, built once: hypothesis validates a
#: strategy the first time it draws from it, which built afresh in every example cost more
#: than the request it makes
_BODIES = {path: st.fixed_dictionaries(required, optional=optional) for path, (required, optional) in SCHEMA.items()}
_REPLACED = {path: st.lists(st.sampled_from(sorted({*required, *optional})), min_size=1, max_size=2, unique=True)
             for path, (required, optional) in SCHEMA.items()}
_PATHS = st.sampled_from(sorted(SCHEMA))
_HOW = st.sampled_from(["valid", "one", "one", "one", "two", "body"])


@st.composite
def _requests(draw: Any) -> tuple[str, Any]:
    path = draw(_PATHS)
    body = draw(_BODIES[path])
    how = draw(_HOW)
    if how == "body":
        return path, draw(_json)
    for field in draw(_REPLACED[path]) if how != "valid" else []:
        body[field] = draw(_wrong)
    return path, body


@pytest.fixture(scope="module")
def fuzz_server():
    with hostile_http.live(api_key=None, max_concurrent=None, max_output_tokens=8, max_prompts=8) as server, \
            httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=hostile_http.HANG_GUARD) as c:
        yield server, c


@settings(max_examples=400, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(_requests())
def test_fuzzed_requests_get_no_500_no_hang_no_traceback(fuzz_server, request_):
    _, c = fuzz_server
    path, body = request_
    started = time.monotonic()
    reply = c.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})
    assert time.monotonic() - started < hostile_http.HANG_GUARD
    assert reply.status_code < 500, reply.text
    assert not hostile_http.leaks(reply.text)
    if reply.status_code >= 400:
        assert set(reply.json()["error"]) == {"message", "type", "param", "code"}


def test_the_server_still_answers_after_the_fuzz_run(fuzz_server):
    server, _ = fuzz_server
    assert server.healthy()
    assert server.serve_app.guard.in_flight == 0


# -- the command -----------------------------------------------------------------------------
runner = CliRunner()


@pytest.mark.parametrize(("args", "words"), [
    (["--max-body", "lots"], ["--max-body", "not a size"]),
    (["--read-timeout", "0"], ["--read-timeout", "> 0"]),
    (["--api-key", " "], ["--api-key", "must not be empty"]),
])
def test_bad_limit_options_are_one_line_errors(args, words):
    result = runner.invoke(cli_app, ["serve", "-s", "design-notes", *args])
    assert_one_line_error(result, *words)


def test_the_command_passes_its_limits_and_the_key_from_the_environment(monkeypatch):
    import simulator.cli.serve as serve_cli

    seen = {}
    monkeypatch.setattr(serve_cli, "run_server", lambda sa, *a: seen.setdefault("app", sa))
    result = runner.invoke(cli_app, ["serve", "-s", "design-notes", "--max-body", "1MiB", "--max-prompts", "5",
                                     "--max-concurrent", "0", "--read-timeout", "2.5"],
                           env={"SIMCTL_API_KEY": "from-env"})
    assert result.exit_code == 0, result.output
    limits = seen["app"].limits
    assert (limits.max_body, limits.max_prompts, limits.max_concurrent, limits.read_timeout, limits.api_key) == \
        (2**20, 5, None, 2.5, "from-env")
    assert asyncio.iscoroutinefunction(seen["app"].guard.__call__)
