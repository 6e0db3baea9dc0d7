"""Hostile HTTP clients of ``simctl serve``: classes of cases for ``benchmarks/hostile_inputs.py``.

Each class sends ``examples`` hostile requests to a real ``simctl serve`` app on uvicorn (a
loopback port, the protocol and limits the command uses, limits made small so a case is
cheap) and counts those handled as promised: the status code intended (413, 400, 401, 408,
429, or the batch endpoint's HTTP 200 error shape), an error body naming the limit, no 500,
no traceback or file path in any byte sent back, a stalled socket closed by the server, and
the server still answering ``/health`` afterwards. The server's ``read_timeout`` is short only
where it is what a case tests (clients that stall mid-request); everywhere else it is as long
as the hang guard, and every wait of a client has that generous guard, so a slow machine
makes a case slower, never wrong.
"""

from __future__ import annotations

import json
import random
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
KEY = "s3cret-key"
#: the hostile server's limits: small, so a case costs little
BODY_LIMIT = 4096
PROMPTS_LIMIT = 8
PROMPT_TOKENS_LIMIT = 256
CONCURRENT_LIMIT = 4
#: seconds a client that stalls mid-request is given (short: the stalled-socket cases wait it out)
READ_TIMEOUT = 0.5
#: seconds a client waits for any answer before calling it a hang; also the server's read
#: timeout where stalling is not the case under test, so that a complete request is never
#: timed out by a busy machine's scheduling lag
HANG_GUARD = 20.0
PATHS = ("/", "/v1/completions", "/v1/chat/completions")


def make_serve_app(**limits: Any) -> Any:
    """A ``simctl serve`` app on the sleep backend (deterministic 0.1 s service, 1000 times
    faster than modeled), every prompt served by its default task, with ``limits``."""
    from simulator.profile import profile_from_dict
    from simulator.scenario import build_scenario
    from simulator.serve.app import build_app
    from simulator.serve.backends import SleepBackend
    from simulator.serve.guard import Limits

    def task(resource: str = "gpu") -> dict:
        return {"resource": resource, "prompt_tokens": 10, "max_tokens": 4,
                "service": {"kind": "distribution", "dist": "deterministic", "mean": 0.1}}
    profile = profile_from_dict({"name": "det", "tasks": {"mmlu": task(), "infobench": task()}})
    scenario = build_scenario(run={"gpus": 1}, defaults={"flush": 0.0, "max_batch": 8})
    return build_app(scenario, profile, SleepBackend(), time_scale=1000.0, default_task="mmlu",
                     limits=Limits(**limits))


class LiveServe:
    """``serve_app`` on uvicorn (``simctl serve``'s protocol) in a thread, on a free port."""

    def __init__(self, serve_app: Any, keep_alive: float = 5.0) -> None:
        import uvicorn

        self.serve_app = serve_app
        config = uvicorn.Config(serve_app.app, host="127.0.0.1", port=0, log_level="critical", lifespan="on",
                                http=serve_app.http_protocol(), timeout_keep_alive=keep_alive)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.port = 0

    def __enter__(self) -> LiveServe:
        self.thread.start()
        deadline = time.monotonic() + HANG_GUARD
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(HANG_GUARD)

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> Response:
        """One request over a fresh connection: the whole reply (``Connection: close``)."""
        head = {"Host": "serve", "Connection": "close", **(headers or {})}
        if body is not None:
            head.setdefault("Content-Type", "application/json")
            head.setdefault("Content-Length", str(len(body)))
        raw = f"{method} {path} HTTP/1.1\r\n".encode() + "".join(f"{k}: {v}\r\n" for k, v in head.items()).encode()
        return self.raw(raw + b"\r\n" + (body or b""))

    def post(self, path: str, payload: Any, key: str | None = KEY) -> Response:
        headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
        return self.request("POST", path, json.dumps(payload).encode(), headers)

    def raw(self, data: bytes) -> Response:
        """Send ``data`` on a new connection, then read until the server closes it (or the
        hang guard ends the wait), sending nothing more."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=HANG_GUARD) as sock:
            started = time.monotonic()
            try:
                sock.sendall(data)
            except OSError:  # the server refused before the last byte: its reply still counts
                pass
            return Response.read(sock, started)

    def healthy(self) -> bool:
        reply = self.request("GET", "/health")
        return reply.status == 200 and reply.json().get("status") == "ok"


class Response:
    """A raw HTTP reply: status, headers, body; ``closed`` whether the server closed the
    connection (rather than the hang guard ending the wait), after ``seconds``."""

    def __init__(self, status: int | None, headers: dict[str, str], body: bytes, closed: bool, seconds: float):
        self.status, self.headers, self.body, self.closed, self.seconds = status, headers, body, closed, seconds

    @classmethod
    def read(cls, sock: socket.socket, started: float) -> Response:
        data, closed = b"", False
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    closed = True
                    break
                data += chunk
        except ConnectionResetError:
            closed = True
        except TimeoutError:
            pass
        seconds = time.monotonic() - started
        if not data:
            return cls(None, {}, b"", closed, seconds)
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        if headers.get("transfer-encoding") == "chunked":
            body = _unchunk(body)
        return cls(status, headers, body, closed, seconds)

    def json(self) -> Any:
        return json.loads(self.body)

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


def _unchunk(body: bytes) -> bytes:
    out = b""
    while body:
        size, _, rest = body.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out, body = out + rest[:n], rest[n + 2:]
    return out


def leaks(text: str) -> bool:
    """Whether a reply shows what only the server's log may: a traceback, a source line, a path."""
    needles = ("Traceback", 'File "', "site-packages", str(REPO), sys.prefix, "/usr/lib/python")
    return any(n in text for n in needles)


def refused(reply: Response, status: int, *words: str) -> bool:
    """``reply`` is OpenAI's error body with ``status`` and the message has ``words``."""
    if reply.status != status or leaks(reply.text()):
        return False
    try:
        error = reply.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return error.get("code") == status and all(w in error.get("message", "") for w in words)


def answered(reply: Response, path: str, status: int, *words: str) -> bool:
    """A request refused by a handler: OpenAI's body with ``status`` on the OpenAI endpoints,
    the batch endpoint's own shape (HTTP 200 ``{"error", "traceback"}``) on ``/``."""
    if path != "/":
        return refused(reply, status, *words)
    if reply.status != 200 or leaks(reply.text()):
        return False
    try:
        body = reply.json()
    except ValueError:
        return False
    return "choices" not in body and {"error", "traceback"} <= set(body) and all(w in body["error"] for w in words)


def prompt_body(path: str, texts: list[str], **extra: Any) -> dict:
    if path == "/":
        return {"prompt": texts, **extra}
    if path == "/v1/completions":
        return {"prompt": texts[0], **extra}
    return {"messages": [{"role": "user", "content": t} for t in texts], **extra}


@contextmanager
def live(keep_alive: float = 5.0, **limits: Any) -> Iterator[LiveServe]:
    defaults = {"max_body": BODY_LIMIT, "read_timeout": HANG_GUARD, "max_prompts": PROMPTS_LIMIT,
                "max_prompt_tokens": PROMPT_TOKENS_LIMIT, "max_concurrent": CONCURRENT_LIMIT, "api_key": KEY,
                "max_output_tokens": 64}
    with LiveServe(make_serve_app(**(defaults | limits)), keep_alive) as server:
        yield server


def _count(examples: int, case: Callable[[LiveServe, int], bool], workers: int = 1, **limits: Any) -> tuple[int, int]:
    """Run ``case(server, i)`` for ``i < examples`` (``workers`` at once) and count those
    handled; none counts if the server stops answering ``/health`` afterwards."""
    with live(**limits) as server:
        if workers > 1:
            with ThreadPoolExecutor(workers) as pool:
                results = list(pool.map(lambda i: case(server, i), range(examples)))
        else:
            results = [case(server, i) for i in range(examples)]
        healthy = server.healthy()
    return examples, sum(results) if healthy else 0


# -- the classes -------------------------------------------------------------------------
def oversized_bodies(examples: int) -> tuple[int, int]:
    """Bodies over the limit: declared by Content-Length (refused before a byte is read) or
    sent chunked (refused as the count passes the limit): 413 and the connection closed."""
    def case(server: LiveServe, i: int) -> bool:
        path = PATHS[i % len(PATHS)]
        auth = f"Authorization: Bearer {KEY}\r\n"
        if i % 2 == 0:
            declared = BODY_LIMIT + 1 + random.Random(i).randrange(10**12)
            head = f"POST {path} HTTP/1.1\r\nHost: s\r\n{auth}Content-Length: {declared}\r\n\r\n".encode()
            reply = server.raw(head + b'{"prompt": "')
        else:
            chunk = b"x" * (BODY_LIMIT // 2)
            chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(3)) + b"0\r\n\r\n"
            head = f"POST {path} HTTP/1.1\r\nHost: s\r\n{auth}Transfer-Encoding: chunked\r\n\r\n".encode()
            reply = server.raw(head + chunks)
        return refused(reply, 413, f"{BODY_LIMIT:,} bytes") and reply.closed
    return _count(examples, case)


def deep_nesting(examples: int) -> tuple[int, int]:
    """JSON nested past the limit, up to 100,000 levels (Python's parser's stack overflows
    long before): 400 naming the limit, never a RecursionError's 500."""
    def case(server: LiveServe, i: int) -> bool:
        path = PATHS[i % len(PATHS)]
        depth = 65 + random.Random(i).choice([0, 1, 100, 1000, 20_000])
        opener, closer = [("[", "]"), ('{"a":', "}"), ('[{"b":', "}]")][i % 3]
        inner = opener * depth + "1" + closer * depth
        body = json.dumps(prompt_body(path, ["multiple choice question"]))[:-1] + f', "x": {inner}}}'
        reply = server.request("POST", path, body.encode(), {"Authorization": f"Bearer {KEY}"})
        return answered(reply, path, 400, "deeper than 64")
    return _count(examples, case, max_depth=64, max_body=10**6)


#: (path, field, bad value, words the message must have)
WRONG_TYPES = [
    ("/", "prompt", 5, "'prompt'"), ("/", "prompt", [1, 2], "'prompt'"), ("/", "prompt", [], "'prompt'"),
    ("/", "prompt", {"a": "b"}, "'prompt'"), ("/", "max_tokens", "7", "'max_tokens'"),
    ("/", "max_tokens", True, "'max_tokens'"), ("/", "max_tokens", -1, "'max_tokens'"),
    ("/", "max_tokens", 1.5, "'max_tokens'"), ("/", "max_tokens", 10**300, "'max_tokens'"),
    ("/v1/completions", "prompt", None, "'prompt'"), ("/v1/completions", "prompt", ["a", "b"], "'prompt'"),
    ("/v1/completions", "max_tokens", "x", "max_tokens"), ("/v1/completions", "max_tokens", 10**9, "max_tokens"),
    ("/v1/completions", "n", "1", "n must be 1"), ("/v1/completions", "n", True, "n must be 1"),
    ("/v1/completions", "stream", "yes", "stream"), ("/v1/completions", "stream_options", 5, "stream_options"),
    ("/v1/completions", "stream_options", {"include_usage": "no"}, "include_usage"),
    ("/v1/completions", "model", ["m"], "model"), ("/v1/completions", "model", 3, "model"),
    ("/v1/chat/completions", "messages", "hi", "'messages'"), ("/v1/chat/completions", "messages", [5], "'messages'"),
    ("/v1/chat/completions", "messages", [{"content": 5}], "'messages'"),
    ("/v1/chat/completions", "messages", [{"content": [{"text": 5}]}], "'messages'"),
    ("/v1/chat/completions", "max_completion_tokens", 0, "max_completion_tokens"),
    ("/v1/chat/completions", "stream", 1, "stream"),
]


def wrong_types(examples: int) -> tuple[int, int]:
    """Every field of every endpoint given a wrong type or value: 400 (the batch endpoint's
    error shape on ``/``) naming the field."""
    def case(server: LiveServe, i: int) -> bool:
        path, field, value, words = WRONG_TYPES[i % len(WRONG_TYPES)]
        body = prompt_body(path, ["multiple choice question"], max_tokens=2)
        body[field] = value
        status = 400
        return answered(server.post(path, body), path, status, words)
    return _count(examples, case)


def stalled_sockets(examples: int) -> tuple[int, int]:
    """Clients that send half a request and wait: silent after connecting, half a request
    line, half the headers (closed by the server after its read timeout), or all headers
    and part of the body (408, then closed). Many at once: a case waits the timeout once."""
    partial = [b"", b"POST /v1/compl", b"POST / HTTP/1.1\r\nHost: s\r\nAuthorization: Bearer",
               f"POST / HTTP/1.1\r\nHost: s\r\nAuthorization: Bearer {KEY}\r\nContent-Length: 100\r\n\r\n"
               '{"prompt": ['.encode()]

    def case(server: LiveServe, i: int) -> bool:
        kind = i % len(partial)
        reply = server.raw(partial[kind])
        if not reply.closed or reply.seconds >= HANG_GUARD:
            return False
        if kind == 3:
            return refused(reply, 408, "did not arrive within")
        return reply.status is None
    return _count(examples, case, workers=min(32, max(examples, 1)), max_concurrent=None, read_timeout=READ_TIMEOUT)


def many_prompts(examples: int) -> tuple[int, int]:
    """Calls with more prompts than the limit, or a prompt longer than the limit: refused
    with a message naming the limit (413 for a prompt too long on the OpenAI endpoints)."""
    def case(server: LiveServe, i: int) -> bool:
        rng = random.Random(i)
        path = PATHS[i % len(PATHS)]
        if path == "/" and i % 2 == 0:
            n = PROMPTS_LIMIT + 1 + rng.randrange(400)  # the body stays under its own limit
            return answered(server.post(path, {"prompt": ["q"] * n}), path, 400, f"limit of {PROMPTS_LIMIT:,} prompts")
        long = "multiple choice question " + "x" * (4 * PROMPT_TOKENS_LIMIT + rng.randrange(1, 3000))
        reply = server.post(path, prompt_body(path, [long[:BODY_LIMIT - 200]]))
        return answered(reply, path, 413, f"limit of {PROMPT_TOKENS_LIMIT:,} tokens")
    return _count(examples, case)


def bad_api_keys(examples: int) -> tuple[int, int]:
    """No key, a wrong one, one a byte short or long, another scheme, on every endpoint
    but /health: 401 with OpenAI's body; /health answers without a key."""
    keys = [None, "", "wrong", KEY[:-1], KEY + "x", KEY.upper(), f"Basic {KEY}"]

    def case(server: LiveServe, i: int) -> bool:
        path = [*PATHS, "/v1/models", "/metrics"][i % 5]
        key = keys[i % len(keys)]
        headers = {} if key is None else {"Authorization": key if key.startswith("Basic") else f"Bearer {key}"}
        method = "GET" if path in ("/v1/models", "/metrics") else "POST"
        body = None if method == "GET" else json.dumps(prompt_body(path, ["multiple choice question"])).encode()
        reply = server.request(method, path, body, headers)
        return refused(reply, 401, "API key") and server.request("GET", "/health").status == 200
    return _count(examples, case)


def floods(examples: int) -> tuple[int, int]:
    """Requests over the concurrency limit: the limit's worth held in flight (clients that
    send headers and stall their body), then one more: 429 with Retry-After; once those
    clients go, the server serves again."""
    def case(server: LiveServe, i: int) -> bool:
        guard = server.serve_app.guard
        head = f"POST / HTTP/1.1\r\nHost: s\r\nAuthorization: Bearer {KEY}\r\nContent-Length: 50\r\n\r\n".encode()
        held = [socket.create_connection(("127.0.0.1", server.port), timeout=HANG_GUARD) for _ in range(CONCURRENT_LIMIT)]
        try:
            for sock in held:
                sock.sendall(head)
            deadline = time.monotonic() + HANG_GUARD
            while guard.in_flight < CONCURRENT_LIMIT and time.monotonic() < deadline:
                time.sleep(0.005)
            path = PATHS[i % len(PATHS)]
            reply = server.post(path, prompt_body(path, ["multiple choice question"]))
            ok = refused(reply, 429, f"limit of {CONCURRENT_LIMIT}") and reply.headers.get("retry-after") == "1"
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + HANG_GUARD
        while guard.in_flight and time.monotonic() < deadline:
            time.sleep(0.005)
        served = server.post("/", {"prompt": ["multiple choice question"], "max_tokens": 2})
        return ok and served.status == 200 and "choices" in served.json()
    # the held clients must outlast the case however slow the machine: the long read timeout
    return _count(examples, case)


CLASSES: dict[str, Callable[[int], tuple[int, int]]] = {
    "HTTP bodies over the size limit": oversized_bodies,
    "HTTP bodies of deeply nested JSON": deep_nesting,
    "HTTP fields of the wrong type": wrong_types,
    "HTTP clients that stall mid-request": stalled_sockets,
    "HTTP calls with too many or too long prompts": many_prompts,
    "HTTP requests without the right API key": bad_api_keys,
    "HTTP floods over the concurrency limit": floods,
}
