"""How one call goes over the wire, per API, and what came back.

* ``batch`` — the users' batch endpoint: one POST per call, ``{"prompt": [texts],
  "max_tokens": M}``, exactly the body their client sends (no temperature). Their server
  answers HTTP 200 with ``{"choices": [{"index", "text", "finish_reason"}], "usage"}``, a
  choice per prompt; when it fails, HTTP 200 with ``{"error", "traceback"}``, a failed call.
* ``completions`` / ``chat`` — the OpenAI-compatible ``/v1/completions`` and
  ``/v1/chat/completions`` of vLLM, SGLang and TGI: one streamed request per prompt
  (``stream: true``), the server-sent events timed as they arrive: the first event carrying
  text is the prompt's first token, the gaps between text-carrying events its inter-token
  latencies. The call is done when its last prompt is; it succeeded if every prompt did.

A call succeeds only if its answer is valid field by field (:func:`check_batch_answer`,
:func:`check_event`): HTTP 200, the content type of the API (JSON, or an event stream),
UTF-8 JSON within :data:`MAX_ANSWER_BYTES`, a choice per prompt (a batch answer) or at most
one per event (a stream: one was asked for), each choice's ``index`` an integer naming its
prompt, its text a string, its ``finish_reason`` a string or null, token counts integers in
``0..LARGEST_TOKENS``, and a stream framed as server-sent events that ends with
``data: [DONE]``. Anything else is a failed call whose error names the field
(``answer: choices[0].index is not an integer``); a call never counts as a success on an
answer the reader had to guess at.

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

from simulator.settings import LARGEST_TOKENS

API_NAMES = ("batch", "completions", "chat")
#: The largest answer read, per request (a server streaming without end is cut off here).
MAX_ANSWER_BYTES = 64 * 2**20
#: An answer body is kept in the call's record only this shallow (``simctl observed``
#: refuses files nested deeper than 64 levels) ...
_STORED_DEPTH = 32
#: ... and, for a failed call, only this large (a valid answer is always kept).
_STORED_FAILED_BYTES = 64 * 2**10
_SNIPPET = 300


class AnswerError(Exception):
    """An answer that is not what the API promises; ``str`` is the reason, naming the field."""


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


def short(text: str) -> str:
    """``text`` on one line, at most a few hundred characters, encodable as UTF-8 (a lone
    surrogate from a JSON escape becomes ``?``: the request log is written as Parquet)."""
    text = " ".join(text.split()).encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= _SNIPPET else text[:_SNIPPET] + "..."


def describe(value: Any) -> str:
    """A JSON value shown in a reason, shortened (any depth, NaN included)."""
    if isinstance(value, str):
        return short(value)
    try:
        return short(json.dumps(value)[: 4 * _SNIPPET])
    except (ValueError, TypeError, RecursionError):
        return type(value).__name__


def _failure(exc: BaseException, timeout: float) -> tuple[str, str]:
    """(status, error) of a request that raised ``exc``."""
    if isinstance(exc, TimeoutError | httpx.TimeoutException):
        return "timeout", f"timeout: no complete answer within {timeout:g} s"
    if isinstance(exc, httpx.RemoteProtocolError | ConnectionError):
        return "error", f"connection dropped: {short(str(exc)) or type(exc).__name__}"
    return "error", f"{type(exc).__name__}: {short(str(exc))}"


# -- reading answers -----------------------------------------------------------------------

def parse_json(raw: bytes, what: str) -> Any:
    """``raw`` parsed as JSON; :class:`AnswerError` naming ``what`` if it is not UTF-8 JSON."""
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise AnswerError(f"answer: {what} is not UTF-8") from None
    except json.JSONDecodeError:
        raise AnswerError(f"answer: {what} is not JSON: {short(raw[:200].decode('utf-8', 'replace'))}") from None
    except (ValueError, RecursionError):  # an integer of over 4300 digits; nested past the parser
        raise AnswerError(f"answer: {what} is JSON no reader can use") from None


def count(value: Any, where: str) -> int:
    """A token count: an integer in ``0..LARGEST_TOKENS`` (not a bool, a float, NaN)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise AnswerError(f"answer: {where} is not an integer (got {describe(value)})")
    if not 0 <= value <= LARGEST_TOKENS:
        raise AnswerError(f"answer: {where} is {describe(value)}, not a count in 0..{LARGEST_TOKENS:,}")
    return value


def check_usage(usage: Any, where: str = "usage") -> tuple[int | None, int | None]:
    """``(prompt_tokens, completion_tokens)`` of a ``usage`` object (``None``: not given)."""
    if usage is None:
        return None, None
    if not isinstance(usage, dict):
        raise AnswerError(f"answer: {where} is not an object")
    got = [None if usage.get(key) is None else count(usage[key], f"{where}.{key}")
           for key in ("prompt_tokens", "completion_tokens", "total_tokens")]
    return got[0], got[1]


def _finish(choice: dict, where: str) -> str | None:
    reason = choice.get("finish_reason")
    if reason is not None and not isinstance(reason, str):
        raise AnswerError(f"answer: {where}.finish_reason is not a string (got {describe(reason)})")
    return reason


def _prompts(n: int) -> str:
    return "one prompt" if n == 1 else f"{n} prompts"


def _index(choice: dict, where: str, default: int, prompts: int) -> int:
    if "index" not in choice:
        return default
    index = choice["index"]
    if isinstance(index, bool) or not isinstance(index, int):
        raise AnswerError(f"answer: {where}.index is not an integer (got {describe(index)})")
    if not 0 <= index < prompts:
        raise AnswerError(f"answer: {where}.index is {index}; the call has {_prompts(prompts)}")
    return index


def _server_error(body: dict) -> None:
    if body.get("error"):
        raise AnswerError(f"server error: {describe(body['error'])}")


def check_batch_answer(body: Any, prompts: int) -> list[tuple[str, str | None]]:
    """Each prompt's ``(text, finish_reason)``, in prompt order, from a batch answer of a
    call of ``prompts`` prompts; :class:`AnswerError` naming the first field at fault."""
    if not isinstance(body, dict):
        raise AnswerError(f"answer: not a JSON object (got {describe(body)})")
    _server_error(body)
    choices = body.get("choices")
    if not isinstance(choices, list):
        raise AnswerError("answer: no choices" if choices is None else "answer: choices is not a list")
    if len(choices) != prompts:
        raise AnswerError(f"answer: {len(choices)} choices; the call has {_prompts(prompts)}")
    out: dict[int, tuple[str, str | None]] = {}
    for position, choice in enumerate(choices):
        where = f"choices[{position}]"
        if not isinstance(choice, dict):
            raise AnswerError(f"answer: {where} is not an object")
        index = _index(choice, where, position, prompts)
        if index in out:
            raise AnswerError(f"answer: {where}.index {index} answers a prompt answered before")
        text = choice.get("text")
        if not isinstance(text, str):
            raise AnswerError(f"answer: {where}.text is not a string" + ("" if text is None else
                                                                        f" (got {describe(text)})"))
        out[index] = (text, _finish(choice, where))
    check_usage(body.get("usage"))
    return [out[i] for i in range(prompts)]


def check_event(event: Any, api: str, number: int) -> tuple[str | None, str | None, tuple[int | None, int | None]]:
    """``(text piece, finish_reason, (prompt_tokens, completion_tokens))`` of the streamed
    event ``number`` (from 1) of a request for one choice; :class:`AnswerError` naming the
    field at fault."""
    where = f"event {number}"
    if not isinstance(event, dict):
        raise AnswerError(f"answer: {where} is not a JSON object (got {describe(event)})")
    if event.get("error"):
        raise AnswerError(f"server error: {describe(event['error'])}")
    piece = finish = None
    if "choices" in event:
        choices = event["choices"]
        if not isinstance(choices, list):
            raise AnswerError(f"answer: {where}: choices is not a list (got {describe(choices)})")
        if len(choices) > 1:
            raise AnswerError(f"answer: {where} has {len(choices)} choices; one was asked for")
        for choice in choices:
            if not isinstance(choice, dict):
                raise AnswerError(f"answer: {where}: choices[0] is not an object")
            _index(choice, f"{where}: choices[0]", 0, 1)
            if api == "chat":
                delta = choice.get("delta")
                if delta is not None and not isinstance(delta, dict):
                    raise AnswerError(f"answer: {where}: choices[0].delta is not an object")
                piece, name = (delta or {}).get("content"), "choices[0].delta.content"
            else:
                piece, name = choice.get("text"), "choices[0].text"
            if piece is not None and not isinstance(piece, str):
                raise AnswerError(f"answer: {where}: {name} is not a string (got {describe(piece)})")
            finish = _finish(choice, f"{where}: choices[0]")
    return piece, finish, check_usage(event.get("usage"), f"{where}: usage")


def storable(body: Any, limit: int | None = None) -> bool:
    """Whether ``body`` may go into a call's record: plain JSON (no NaN), shallow enough for
    ``simctl observed`` to read back, and (``limit``) not larger than that many bytes."""
    from simulator.inputs import depth

    if depth(body, _STORED_DEPTH) > _STORED_DEPTH:
        return False
    try:
        size = len(json.dumps(body, allow_nan=False))
    except (ValueError, TypeError, RecursionError):
        return False
    return limit is None or size <= limit


# -- sending -------------------------------------------------------------------------------

async def _read_capped(response: httpx.Response) -> bytes:
    chunks, size = [], 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise AnswerError(f"answer: larger than {MAX_ANSWER_BYTES // 2**20} MiB")
        chunks.append(chunk)
    return b"".join(chunks)


def _http_error(status: int, raw: bytes) -> str:
    try:
        body = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        body = None
    detail = body.get("error") if isinstance(body, dict) and body.get("error") else raw.decode("utf-8", "replace")
    return f"HTTP {status}: {describe(detail)}"


async def send_batch(client: httpx.AsyncClient, url: str, texts: list[str], max_tokens: int,
                     timeout: float, clock: Callable[[], float]) -> tuple[list[PromptOutcome], Any]:
    """POST one call to the batch endpoint: (an outcome per prompt, the body to keep in the
    call's record: the answer as parsed, or ``None`` where it is not JSON or not storable)."""
    out = PromptOutcome(sent_at=clock())
    body: Any = None
    try:
        async with asyncio.timeout(timeout), client.stream(
                "POST", url, json={"prompt": texts, "max_tokens": max_tokens}) as response:
            out.http_status = response.status_code
            raw = await _read_capped(response)
        out.done_at = clock()
        if out.http_status != 200:
            raise AnswerError(_http_error(out.http_status, raw))
        kind = response.headers.get("content-type", "")
        media = kind.split(";")[0].strip().lower()
        if media != "application/json" and not media.endswith("+json"):
            raise AnswerError(f"answer: content type {describe(kind) or 'missing'}, not JSON")
        body = parse_json(raw, "the body")
        answers = check_batch_answer(body, len(texts))
    except (TimeoutError, httpx.HTTPError, OSError) as exc:
        out.done_at = clock()
        out.status, out.error = _failure(exc, timeout)
        return [PromptOutcome(**vars(out)) for _ in texts], None
    except AnswerError as exc:
        out.done_at = clock() if out.done_at is None else out.done_at
        out.status, out.error = "error", short(str(exc))
        kept = body if body is not None and storable(body, _STORED_FAILED_BYTES) else None
        return [PromptOutcome(**vars(out)) for _ in texts], kept
    outcomes = [PromptOutcome(**{**vars(out), "text": text, "finish_reason": finish}) for text, finish in answers]
    if not storable(body):  # a valid answer with fields past what a record holds: its checked part
        body = {"choices": [{"index": i, "text": t, "finish_reason": f} for i, (t, f) in enumerate(answers)]}
    return outcomes, body


def stream_body(api: str, model: str, text: str, max_tokens: int) -> dict[str, Any]:
    """The JSON body of one streamed OpenAI request for ``text``."""
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": True,
                            "stream_options": {"include_usage": True}}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    return body


#: Server-sent event fields other than ``data`` (ignored, as the standard says).
_SSE_FIELDS = (b"event:", b"id:", b"retry:")


async def _lines(response: httpx.Response) -> Any:
    """The stream's lines (bytes, without the line end), the last one even if unterminated;
    :class:`AnswerError` past :data:`MAX_ANSWER_BYTES`."""
    buffer, size = b"", 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise AnswerError(f"answer: event stream larger than {MAX_ANSWER_BYTES // 2**20} MiB")
        buffer += chunk
        *whole, buffer = buffer.split(b"\n")
        for line in whole:
            yield line.rstrip(b"\r")
    if buffer:
        yield buffer.rstrip(b"\r")


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
                raise AnswerError(_http_error(response.status_code, await _read_capped(response)))
            kind = response.headers.get("content-type", "")
            if not kind.lower().startswith("text/event-stream"):
                raw = await _read_capped(response)
                try:  # a server that refuses a request may say why in a JSON body
                    found = json.loads(raw.decode("utf-8"))
                except (ValueError, RecursionError):
                    found = None
                if isinstance(found, dict) and found.get("error"):
                    raise AnswerError(f"server error: {describe(found['error'])}")
                raise AnswerError(f"answer: content type {describe(kind) or 'missing'}, not an event stream")
            events = 0
            async for line in _lines(response):
                if not line or line.startswith(b":") or line.startswith(_SSE_FIELDS):
                    continue
                if not line.startswith(b"data:"):
                    raise AnswerError("answer: the event stream is not server-sent events: "
                                      f"{describe(line[:80].decode('utf-8', 'replace'))}")
                data = line[5:].strip()
                if data == b"[DONE]":
                    finished = True
                    break
                events += 1
                piece, finish, (prompt_tokens, output_tokens) = check_event(
                    parse_json(data, f"event {events}"), api, events)
                if piece:
                    times.append(clock())
                    pieces.append(piece)
                out.finish_reason = finish or out.finish_reason
                out.prompt_tokens = prompt_tokens if prompt_tokens is not None else out.prompt_tokens
                out.output_tokens = output_tokens if output_tokens is not None else out.output_tokens
    except (TimeoutError, httpx.HTTPError, OSError) as exc:
        out.done_at = clock()
        out.status, out.error = _failure(exc, timeout)
        return out
    except AnswerError as exc:
        out.done_at = clock()
        out.status, out.error = "error", short(str(exc))
        return out
    out.done_at = clock()
    if not finished:
        out.status, out.error = "error", "answer: the event stream ended before data: [DONE]"
        return out
    out.text = "".join(pieces)
    out.first_token_at = times[0] if times else None
    out.itls = [b - a for a, b in zip(times, times[1:], strict=False)]
    if out.output_tokens is None:
        out.output_tokens = len(times)  # one event per token, as vLLM, SGLang and TGI stream
    return out

