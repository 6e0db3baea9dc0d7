"""How one call goes over the wire, per API, and what came back.

* ``batch`` — the users' batch endpoint: one POST per call, ``{"prompt": [texts],
  "max_tokens": M}``, exactly the body their client sends (no temperature). A call succeeded
  only if the answer is HTTP 200 with a JSON body holding ``choices``; their server answers
  HTTP 200 with ``{"error", "traceback"}`` when it fails, and that is a failed call.
* ``completions`` / ``chat`` — the OpenAI-compatible ``/v1/completions`` and
  ``/v1/chat/completions`` of vLLM, SGLang and TGI: one streamed request per prompt
  (``stream: true``), the server-sent events timed as they arrive: the first event carrying
  text is the prompt's first token, the gaps between text-carrying events its inter-token
  latencies. The call is done when its last prompt is; it succeeded if every prompt did.

Every request is bounded by the per-call ``timeout`` (the whole exchange, as the users'
aiohttp client's total timeout): a stalled server gives a failed call with the timeout as
its error, never a hang. A dropped connection, an HTTP error status, an unreadable body or
an ``error`` event is a failed call too. Instants are seconds on the run's clock.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

API_NAMES = ("batch", "completions", "chat")
_SNIPPET = 300


@dataclass
class PromptOutcome:
    """What one prompt's request gave: its instants, status and answer."""

    sent_at: float
    done_at: float | None = None
    first_token_at: float | None = None
    status: str = "ok"                # ok | error | timeout | interrupted
    http_status: int | None = None
    error: str = ""
    text: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    itls: list[float] = field(default_factory=list)


@dataclass
class CallOutcome:
    """One call's record as the users' client writes it (``record``) and its prompts'."""

    record: dict[str, Any]
    prompts: list[PromptOutcome]

    @property
    def ok(self) -> bool:
        return all(p.status == "ok" for p in self.prompts)


def endpoint(url: str, api: str) -> str:
    """The URL requests of ``api`` go to: the batch API posts to ``url`` itself; the OpenAI
    APIs to ``url`` if it already ends in the endpoint, else ``url`` + ``/v1/completions``
    (or ``/v1/chat/completions``; a URL ending in ``/v1`` gets the rest)."""
    if api == "batch":
        return url
    tail = "/completions" if api == "completions" else "/chat/completions"
    base = url.rstrip("/")
    if base.endswith("/v1" + tail):
        return base
    return base + tail if base.endswith("/v1") else base + "/v1" + tail


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _SNIPPET else text[:_SNIPPET] + "..."


def _failure(exc: BaseException, timeout: float) -> tuple[str, str]:
    """(status, error) of a request that raised ``exc``."""
    if isinstance(exc, TimeoutError | httpx.TimeoutException):
        return "timeout", f"timeout: no complete answer within {timeout:g} s"
    if isinstance(exc, httpx.RemoteProtocolError):
        return "error", f"connection dropped: {_short(str(exc)) or type(exc).__name__}"
    return "error", f"{type(exc).__name__}: {_short(str(exc))}"


async def send_batch(client: httpx.AsyncClient, url: str, texts: list[str], max_tokens: int,
                     timeout: float, clock: Callable[[], float]) -> tuple[PromptOutcome, Any]:
    """POST one call to the batch endpoint: (the call's outcome, the parsed body or ``None``)."""
    out = PromptOutcome(sent_at=clock())
    body: Any = None
    try:
        async with asyncio.timeout(timeout):
            response = await client.post(url, json={"prompt": texts, "max_tokens": max_tokens})
    except (TimeoutError, httpx.HTTPError, OSError) as exc:
        out.done_at = clock()
        out.status, out.error = _failure(exc, timeout)
        return out, None
    out.done_at = clock()
    out.http_status = response.status_code
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code != 200:
        out.status = "error"
        detail = body.get("error") if isinstance(body, dict) and body.get("error") else response.text
        out.error = f"HTTP {response.status_code}: {_short(str(detail))}"
    elif not isinstance(body, dict):
        out.status, out.error = "error", f"not a JSON object: {_short(response.text)}"
    elif not isinstance(body.get("choices"), list):
        out.status = "error"
        out.error = _short(str(body.get("error") or "no choices in the response"))
    return out, body


def stream_body(api: str, model: str, text: str, max_tokens: int) -> dict[str, Any]:
    """The JSON body of one streamed OpenAI request for ``text``."""
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": True,
                            "stream_options": {"include_usage": True}}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    return body


def _piece(api: str, choice: Any) -> str | None:
    if not isinstance(choice, dict):
        return None
    if api == "chat":
        delta = choice.get("delta")
        piece = delta.get("content") if isinstance(delta, dict) else None
    else:
        piece = choice.get("text")
    return piece if isinstance(piece, str) else None


async def send_stream(client: httpx.AsyncClient, url: str, api: str, model: str, text: str,
                      max_tokens: int, timeout: float, clock: Callable[[], float]) -> PromptOutcome:
    """One streamed OpenAI request for one prompt, its events timed on ``clock``."""
    out = PromptOutcome(sent_at=clock())
    pieces: list[str] = []
    times: list[float] = []
    finished = False
    try:
        async with asyncio.timeout(timeout), client.stream(
                "POST", url, json=stream_body(api, model, text, max_tokens)) as response:
            out.http_status = response.status_code
            if response.status_code != 200:
                detail = (await response.aread()).decode("utf-8", "replace")
                out.done_at, out.status = clock(), "error"
                out.error = f"HTTP {response.status_code}: {_short(detail)}"
                return out
            if not response.headers.get("content-type", "").startswith("text/event-stream"):
                detail = (await response.aread()).decode("utf-8", "replace")
                out.done_at, out.status = clock(), "error"
                try:
                    parsed = json.loads(detail)
                except ValueError:
                    parsed = None
                found = parsed.get("error") if isinstance(parsed, dict) else None
                out.error = _short(str(found)) if found else f"not an event stream: {_short(detail)}"
                return out
            async for line in response.aiter_lines():
                line = line.strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    finished = True
                    break
                try:
                    event = json.loads(data)
                except ValueError:
                    out.done_at, out.status, out.error = clock(), "error", f"unreadable event: {_short(data)}"
                    return out
                if not isinstance(event, dict):
                    continue
                if event.get("error"):
                    out.done_at, out.status, out.error = clock(), "error", _short(str(event["error"]))
                    return out
                for choice in event.get("choices") or []:
                    piece = _piece(api, choice)
                    if piece:
                        times.append(clock())
                        pieces.append(piece)
                    if isinstance(choice, dict) and choice.get("finish_reason"):
                        out.finish_reason = str(choice["finish_reason"])
                usage = event.get("usage")
                if isinstance(usage, dict):
                    out.prompt_tokens = usage.get("prompt_tokens", out.prompt_tokens)
                    out.output_tokens = usage.get("completion_tokens", out.output_tokens)
    except (TimeoutError, httpx.HTTPError, OSError) as exc:
        out.done_at = clock()
        out.status, out.error = _failure(exc, timeout)
        return out
    out.done_at = clock()
    if not finished and out.finish_reason is None:
        out.status, out.error = "error", "the event stream ended before [DONE]"
        return out
    out.text = "".join(pieces)
    out.first_token_at = times[0] if times else None
    out.itls = [b - a for a, b in zip(times, times[1:], strict=False)]
    if out.output_tokens is None:
        out.output_tokens = len(times)  # one event per token, as vLLM, SGLang and TGI stream
    return out
