"""What ``simctl serve`` refuses before a request reaches its handlers, and how it answers.

A server on a network meets clients that send too much, too slowly, too deep or too often,
and clients that must not be served at all. Each limit here is one an inference engine users
trust has (vLLM's ``--api-key``, Triton's ``--http-max-input-size`` and its 413), and each
refusal is a status code and OpenAI's error body ``{"error": {"message", "type", "param",
"code"}}``:

* **API key** (``api_key``): every endpoint but ``GET /health`` needs ``Authorization:
  Bearer KEY``, else 401. ``/metrics`` is protected too (it tells the load and the tasks
  served; Prometheus sends the key with its ``authorization`` setting); ``/health`` stays
  open so a load balancer's probe needs no secret. Keys are compared in constant time.
* **Requests in flight** (``max_concurrent``): one more is refused with 429 and
  ``Retry-After`` (``/health`` is never refused).
* **Body size** (``max_body`` bytes): a ``Content-Length`` above it is refused with 413
  before a byte of the body is read; a chunked body is counted as it arrives and refused
  as soon as it passes the limit.
* **Read timeout** (``read_timeout`` seconds): the whole body must arrive within it of the
  request's headers, else 408 and the connection is closed; the headers themselves must
  arrive within it of the connection's first byte (or of the previous response), else the
  connection is closed (:func:`guarded_protocol`, the HTTP protocol ``simctl serve`` gives
  uvicorn, whose own protocol waits for headers for ever).
* **JSON nesting** (``max_depth``): a body nested deeper is refused with 400 before it is
  parsed (Python's parser recurses, and a deep enough body exhausts its stack).
* **Prompts per call** (``max_prompts``), **tokens per prompt** (``max_prompt_tokens``,
  estimated as the runtime estimates them) and **max tokens per prompt**
  (``max_output_tokens``): the handlers check these (:mod:`simulator.serve.app`), 413 for a
  prompt too long, 400 for the others.

Nothing a client sends reaches a traceback, a file path or an upstream engine's body in a
reply: an unexpected error is a 500 with a generic message and an error id, and the details
go to the server's log under the same id (:func:`error_id`).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import numpy as np

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MIB = 1024 * 1024
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "kib": 1024, "mib": MIB, "gib": 1024**3}
#: The paths that need no API key and are never refused for load.
OPEN_PATHS = ("/health",)


@dataclass(frozen=True)
class Limits:
    """The server's limits (``None``: none). Defaults: 16 MiB bodies, 30 s to send a
    request, JSON nested at most 64 deep, 1024 requests in flight, 1024 prompts a call,
    1,000,000 estimated tokens a prompt and as many max tokens, no API key."""

    max_body: int = 16 * MIB
    read_timeout: float = 30.0
    max_depth: int = 64
    max_concurrent: int | None = 1024
    max_prompts: int = 1024
    max_prompt_tokens: int = 1_000_000
    max_output_tokens: int = 1_000_000
    api_key: str | None = None

    def __post_init__(self) -> None:
        for name in ("max_body", "max_depth", "max_prompts", "max_prompt_tokens", "max_output_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.max_concurrent is not None and self.max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {self.max_concurrent!r}")
        if not self.read_timeout > 0:
            raise ValueError(f"read_timeout must be > 0, got {self.read_timeout!r}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must not be empty")


def parse_size(text: str) -> int:
    """Bytes of a size such as ``16777216``, ``16MiB``, ``512kb`` or ``1GB`` (decimal units:
    kB, MB, GB; binary: KiB, MiB, GiB). :class:`ValueError` says what is wrong."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r} (a number of bytes, optionally with kB, MB, GB, KiB, MiB or GiB)")
    size = int(float(match.group(1)) * _UNITS[unit])
    if size < 1:
        raise ValueError(f"a size must be at least 1 byte, got {text!r}")
    return size


def error_body(reason: str, message: str, status: int, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error body, as vLLM fills it (``type`` the reason, ``code`` the status)."""
    return {"error": {"message": message, "type": reason, "param": param, "code": status}}


def error_id() -> str:
    """A fresh id that ties an error reply to its record in the server's log."""
    return f"err-{uuid.uuid4().hex[:16]}"


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_OPENERS = np.zeros(256, dtype=np.int8)
_OPENERS[[ord("["), ord("{")]] = 1
_OPENERS[[ord("]"), ord("}")]] = -1


def json_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in ``raw`` (JSON text), brackets inside
    strings not counted; without parsing, so a body too deep for the parser's stack is
    measured safely. Linear, in C (regex and numpy) however deep the body is."""
    if raw.count(b"[") + raw.count(b"{") <= 1:
        return int(b"[" in raw or b"{" in raw)
    outside = _STRING.sub(b"", raw)
    steps = _OPENERS[np.frombuffer(outside, dtype=np.uint8)]
    if not steps.any():
        return 0
    return int(np.cumsum(steps, dtype=np.int64).max())


class BodyRefused(Exception):
    """A body the guard will not pass on: its status, reason and message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


def parse_json(raw: bytes, max_depth: int) -> Any:
    """``raw`` parsed, or :class:`BodyRefused` (400) for a body that is not JSON or nests
    deeper than ``max_depth``."""
    if json_depth(raw) > max_depth:
        raise BodyRefused(400, "invalid", f"the request body nests arrays and objects deeper than {max_depth} "
                                          f"levels (the limit)")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError only past the depth check's reach
        raise BodyRefused(400, "invalid", "the request body is not JSON") from None


class Guard:
    """ASGI middleware that applies :class:`Limits`' key, concurrency, size and read-time
    limits to every HTTP request and reads its whole body before the app sees it (the app
    then reads it from memory, so no handler waits on a slow client)."""

    def __init__(self, app: ASGIApp, limits: Limits) -> None:
        self.app = app
        self.limits = limits
        self.in_flight = 0
        self._key = None if limits.api_key is None else limits.api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if path in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if self._key is not None and not self._authorized(headers.get(b"authorization", b"")):
            await _reply(send, 401, "unauthorized", "this server needs an API key: send the header "
                         "'Authorization: Bearer KEY'", {"www-authenticate": "Bearer"})
            return
        limit = self.limits.max_concurrent
        if limit is not None and self.in_flight >= limit:
            await _reply(send, 429, "overloaded", f"the server is serving its limit of {limit} requests at once; "
                         "retry later", {"retry-after": "1"})
            return
        self.in_flight += 1
        try:
            try:
                body = await self._body(headers, receive)
            except BodyRefused as refused:
                # the rest of the body is not read: the connection cannot carry another request
                await _reply(send, refused.status, refused.reason, refused.message, {"connection": "close"})
                return
            await self.app(scope, _replay(body, receive), send)
        finally:
            self.in_flight -= 1

    def _authorized(self, header: bytes) -> bool:
        scheme, _, token = header.partition(b" ")
        assert self._key is not None
        # compare_digest takes as long for a wrong key as for a right one of its length
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._key)

    async def _body(self, headers: dict[bytes, bytes], receive: Receive) -> bytes:
        limits = self.limits
        too_large = BodyRefused(413, "too-large", f"the request body is larger than {limits.max_body:,} bytes "
                                                  "(the server's limit)")
        declared = headers.get(b"content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > limits.max_body:
            raise too_large
        chunks: list[bytes] = []
        size = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limits.read_timeout
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise BodyRefused(408, "timeout", f"the request body did not arrive within "
                                                  f"{limits.read_timeout:g} s") from None
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limits.max_body:
                raise too_large
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives ``body`` once, then waits on the client (for its disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return replay


async def _reply(send: Send, status: int, reason: str, message: str, headers: dict[str, str]) -> None:
    payload = json.dumps(error_body(reason, message, status)).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})


def guarded_protocol(read_timeout: float) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol, closing a connection whose request headers have not all
    arrived ``read_timeout`` seconds after their first byte came (or the connection opened):
    uvicorn's own waits for them for ever, so a client that sends half a request line holds
    a socket as long as it likes."""
    from uvicorn.protocols.http.h11_impl import H11Protocol, h11

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._watch_headers()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._watch_headers()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_header_timer()
            super().connection_lost(exc)

        def _watch_headers(self) -> None:
            # IDLE: h11 still waits for (the rest of) a request's headers; an idle keep-alive
            # connection (no byte of a next request yet) is uvicorn's keep-alive timeout's
            waiting = self.conn.their_state is h11.IDLE and (self.timeout_keep_alive_task is None)
            if waiting and self._header_timer is None:
                self._header_timer = self.loop.call_later(read_timeout, self._headers_late)
            elif not waiting:
                self._stop_header_timer()

        def _stop_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return GuardedH11Protocol


__all__ = ["BodyRefused", "Guard", "Limits", "OPEN_PATHS", "error_body", "error_id", "guarded_protocol",
           "json_depth", "parse_json", "parse_size"]
