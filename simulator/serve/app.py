"""The HTTP face of a :class:`~simulator.serve.runtime.Runtime`: the users' batch endpoint,
OpenAI-compatible completions, Prometheus metrics (FastAPI; served by uvicorn).

Endpoints:

* ``POST /`` (also ``/batch``) — the users' batch endpoint: ``{"prompt": [texts],
  "max_tokens": M}``, one call. Each prompt is routed by the users' keyword rules
  (:data:`simulator.trace.classify.DEFAULT_CLASSIFIER`) to its task, its max tokens capped by
  the task's ``max_tokens`` (else the profile's). The reply, when every prompt is done, is
  ``{"choices": [{"index", "text", "task", "finish_reason"}], "usage": {...}}`` in prompt
  order. A prompt's task is the runtime's (:meth:`~simulator.serve.runtime.Runtime.classify`:
  the keyword rules, else the default task). **Every failure is HTTP 200** with
  ``{"error": "...", "traceback": "...", "failed": [{"index", "reason", "error"}]}``, as
  the users' server answers (a client tests for ``choices``): a malformed body, a prompt no
  task matches, a full queue, a queue timeout, a backend error, a stalled batch, shutdown.
  ``traceback`` keeps its name but never holds one: a backend's error is an error id whose
  details are in the server's log (``simctl.serve``). What the :class:`Guard` refuses before
  a handler runs (API key, body size, read timeout, requests in flight) is a status code
  here too (:mod:`simulator.serve.guard`).
* ``POST /v1/completions`` and ``POST /v1/chat/completions`` — one prompt per request
  (``prompt`` a string or a list of one; ``messages`` joined) and one choice (``n`` other than
  1 is refused), OpenAI's bodies (ids ``cmpl-N`` and ``chatcmpl-N``); with ``"stream": true``
  server-sent events, one per token (a sleep backend spreads them from the first-token
  instant to the batch's end; a real backend sends them when the batch ends; the first chat
  delta carries ``"role": "assistant"``), a last one with the finish reason, then
  ``data: [DONE]``; ``stream_options.include_usage`` adds a chunk with no choices and the
  usage before it. Failures have **proper status codes** and OpenAI's ``{"error": {"message",
  "type", "param", "code"}}`` (``type`` the reason, ``code`` the status, as vLLM fills it):
  400 a malformed body or field, ``n`` > 1, or a prompt no served task takes, 404 a model
  other than the served one (or an unknown route), 429 a full queue (``max_queue``), 503
  shutdown, 504 a queue timeout or a stalled batch, 500 a backend error (its message an
  error id only), 413 a prompt over ``max_prompt_tokens``. A stream's headers
  go when its batch starts, so a failure before that is a status code too; one after it is
  an ``{"error": ...}`` event, then ``[DONE]``.
* ``GET /metrics`` — Prometheus: ``simctl_queue_depth{queue}``, ``simctl_calls_in_flight``,
  ``simctl_gpu_outstanding_prompts{gpu}``, ``simctl_gpu_running_batches{gpu}``,
  ``simctl_batch_size{task}`` (histogram), ``simctl_prompt_latency_seconds{task}`` and
  ``simctl_call_latency_seconds`` (histograms, server seconds), ``simctl_prompts_total{task,
  status}``.
* ``GET /state`` — what waits and runs now, as JSON (:meth:`~simulator.serve.runtime.Runtime.state`:
  per queue its waiting prompts with their ages and tokens, per batch formed and not
  finished its task, GPU, size and elapsed service), what ``simctl snapshot`` reads
  (:mod:`simulator.snapshot`); protected as ``/metrics`` is.
* ``GET /health``, ``GET /v1/models``.

Shutdown (the ASGI lifespan's end, or :meth:`ServeApp.begin_shutdown` as a signal arrives):
queued prompts fail at once (their calls get error replies), new ones are refused,
in-flight batches finish within the grace period.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.exceptions import HTTPException as StarletteHTTPException

from simulator.profile import Profile
from simulator.scenario import Scenario
from simulator.serve.backends import Backend, pieces
from simulator.serve.guard import BodyRefused, Guard, Limits, error_id, guarded_protocol, parse_json
from simulator.serve.runtime import PromptFailed, PromptJob, Runtime, ServeBatch

#: Where the details of an error a client sees only by its id go (its traceback, its
#: backend's or engine's message).
log = logging.getLogger("simctl.serve")

#: HTTP status of each failure on the OpenAI endpoints.
STATUS = {"rejected": 429, "dropped": 504, "timeout": 504, "shutdown": 503, "backend": 500, "unknown-task": 400,
          "invalid": 400, "unknown-model": 404, "not-found": 404, "method-not-allowed": 405, "too-large": 413,
          "internal": 500}
_SIZE_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64, 128, 256)
_LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 60, 120, 240, 600, 1200)


class _State(Collector):
    """Gauges read from the runtime at each scrape."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def collect(self) -> Any:
        depth = GaugeMetricFamily("simctl_queue_depth", "Prompts waiting in each micro-batch queue", labels=["queue"])
        for name, n in self.runtime.queue_depths().items():
            depth.add_metric([name], n)
        yield depth
        yield GaugeMetricFamily("simctl_calls_in_flight", "Calls (and OpenAI requests) being served",
                                value=self.runtime.calls_in_flight)
        outstanding = GaugeMetricFamily("simctl_gpu_outstanding_prompts", "Prompts in batches formed for or "
                                        "running on each GPU", labels=["gpu"])
        running = GaugeMetricFamily("simctl_gpu_running_batches", "Batches running on each GPU", labels=["gpu"])
        for gpu in self.runtime.gpus:
            outstanding.add_metric([str(gpu.gpu_id)], gpu.outstanding)
            running.add_metric([str(gpu.gpu_id)], gpu.running)
        yield outstanding
        yield running


class Metrics:
    """The app's Prometheus registry (its own, so several apps live in one process)."""

    def __init__(self, runtime: Runtime) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_State(runtime))
        self.batch_size = Histogram("simctl_batch_size", "Prompts per batch", ["task"], buckets=_SIZE_BUCKETS,
                                    registry=self.registry)
        self.prompt_latency = Histogram("simctl_prompt_latency_seconds", "Prompt latency (done - arrived), "
                                        "server seconds", ["task"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.call_latency = Histogram("simctl_call_latency_seconds", "Call latency of the batch endpoint, server "
                                      "seconds", buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.prompts = Counter("simctl_prompts", "Prompts finished, by task and status", ["task", "status"],
                               registry=self.registry)
        runtime.on_batch.append(self._batch)
        runtime.on_prompt_done.append(self._prompt)

    def _batch(self, batch: ServeBatch) -> None:
        self.batch_size.labels(batch.task).observe(len(batch.jobs))

    def _prompt(self, job: PromptJob) -> None:
        self.prompts.labels(job.task, job.status).inc()
        if job.done_at is not None and job.status in ("served", "sent_after_timeout"):
            self.prompt_latency.labels(job.task).observe(job.done_at - job.arrived_at)


class ServeApp:
    """A runtime, its metrics and the FastAPI app over them (:func:`build_app`); ``app`` is
    the ASGI app to serve: the FastAPI app (``fastapi``) behind the :class:`Guard` of
    ``limits``."""

    def __init__(self, runtime: Runtime, *, grace: float = 30.0, model_name: str = "simctl",
                 limits: Limits | None = None) -> None:
        self.runtime = runtime
        self.grace = grace
        self.model_name = model_name
        self.limits = limits or Limits()
        self.metrics = Metrics(runtime)
        self._shutdown: asyncio.Task | None = None
        #: the loop serving the app (set at startup; a signal handler schedules shutdown on it)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.fastapi = self._build()
        self.guard = Guard(self.fastapi, self.limits)
        self.app = self.guard

    def http_protocol(self) -> type[asyncio.Protocol]:
        """The HTTP protocol class to give uvicorn: its h11 protocol with a deadline on a
        request's headers (``limits.read_timeout``)."""
        return guarded_protocol(self.limits.read_timeout)

    def begin_shutdown(self) -> asyncio.Task:
        """Start the graceful shutdown (idempotent): queued prompts fail now, batches finish."""
        if self._shutdown is None:
            self._shutdown = asyncio.get_running_loop().create_task(self.runtime.shutdown(self.grace))
        return self._shutdown

    def _build(self) -> FastAPI:
        @asynccontextmanager
        async def lifespan(app: FastAPI) -> AsyncIterator[None]:
            self.loop = asyncio.get_running_loop()
            await self.runtime.start()
            yield
            await self.begin_shutdown()

        app = FastAPI(title="simctl serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
        app.state.serve = self

        async def http_error(request: Request, exc: Exception) -> Response:
            # an unknown route or method answers in OpenAI's shape, as every other error
            status = getattr(exc, "status_code", 500)
            reason = {404: "not-found", 405: "method-not-allowed"}.get(status, "invalid")
            body = _error_body(reason, f"{request.method} {request.url.path}: {getattr(exc, 'detail', exc)}")
            body["error"]["code"] = status
            return JSONResponse(body, status_code=status, headers=getattr(exc, "headers", None))

        app.add_exception_handler(StarletteHTTPException, http_error)
        batch = _caught(self.batch, legacy=True)
        app.add_api_route("/", batch, methods=["POST"])
        app.add_api_route("/batch", batch, methods=["POST"])
        app.add_api_route("/v1/completions", _caught(self.completions), methods=["POST"])
        app.add_api_route("/v1/chat/completions", _caught(self.chat), methods=["POST"])
        app.add_api_route("/v1/models", _caught(self.models), methods=["GET"])
        app.add_api_route("/metrics", _caught(self.prometheus), methods=["GET"])
        app.add_api_route("/state", _caught(self.state), methods=["GET"])
        app.add_api_route("/health", _caught(self.health), methods=["GET"])
        return app

    async def _body(self, request: Request) -> Any:
        """The request's JSON body (:class:`BodyRefused` for one too deep or not JSON)."""
        return parse_json(await request.body(), self.limits.max_depth)

    # -- the users' batch endpoint ---------------------------------------------------------
    async def batch(self, request: Request) -> JSONResponse:
        await self.runtime.start()
        started = self.runtime.clock.now()
        try:
            body = await self._body(request)
        except BodyRefused as refused:
            return _batch_error(refused.message)
        texts, max_tokens, problem = _batch_body(body, self.limits)
        if problem:
            return _batch_error(problem)
        results = await self.runtime.submit_call(texts, max_tokens)
        failed = [(i, r) for i, r in enumerate(results) if isinstance(r, PromptFailed)]
        if failed:
            first = failed[0][1]
            # the traceback stays in the server's log: the reply has its id only
            return _batch_error(f"prompt {failed[0][0]}: {_public(first)}", _reference(first),
                                [{"index": i, "reason": r.reason, "error": _public(r)} for i, r in failed])
        self.metrics.call_latency.observe(self.runtime.clock.now() - started)
        tasks = [self.runtime.classify(t) for t in texts]
        choices = [{"index": i, "text": text, "task": tasks[i], "finish_reason": "length"}
                   for i, text in enumerate(results)]
        completion = sum(len(pieces(str(t))) for t in results)
        prompt = sum(_tokens(t) for t in texts)
        return JSONResponse({"id": f"call-{int(time.time() * 1e6)}", "object": "text_completion",
                             "model": self.model_name, "choices": choices,
                             "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                       "total_tokens": prompt + completion}})

    # -- OpenAI-compatible -----------------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        return await self._openai(request, chat=False)

    async def chat(self, request: Request) -> Response:
        return await self._openai(request, chat=True)

    async def _openai(self, request: Request, chat: bool) -> Response:
        # Everything that can fail before the first byte is checked here, so a streamed
        # request's failure is a status code too: the body, the model, then the prompt's
        # admission (unknown task, full queue, shutdown) and its wait for a batch (queue
        # timeout). A stream's headers go when its batch starts.
        try:
            body = await self._body(request)
        except BodyRefused as refused:
            return _openai_error(refused.reason, refused.message)
        text, problem, param = _openai_prompt(body, chat)
        if problem or text is None:
            return _openai_error("invalid", problem or "no prompt", param)
        limits = self.limits
        if _tokens(text) > limits.max_prompt_tokens:
            return _openai_error("too-large", f"the prompt is about {_tokens(text):,} tokens, more than the server's "
                                 f"limit of {limits.max_prompt_tokens:,} tokens a prompt", "messages" if chat else "prompt")
        for key in ("max_tokens", "max_completion_tokens"):
            value = body.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                return _openai_error("invalid", f"{key} must be an integer >= 1, got {_shown(value)}", key)
            if value is not None and value > limits.max_output_tokens:
                return _openai_error("invalid", f"{key} must be at most {limits.max_output_tokens:,} (the server's "
                                     f"limit), got {_shown(value)}", key)
        # max_tokens wins where a client sends both (the older name, as vLLM reads them)
        max_tokens = body.get("max_tokens")
        if max_tokens is None:
            max_tokens = body.get("max_completion_tokens")
        n = body.get("n")
        if n is not None and (isinstance(n, bool) or n != 1):
            return _openai_error("invalid", f"n must be 1 (this server answers one choice per request), "
                                 f"got {_shown(n)}", "n")
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            return _openai_error("invalid", f"model must be a string, got {_shown(model)}", "model")
        if model is not None and model != self.model_name:
            return _openai_error("unknown-model", f"the model {_shown(model)} does not exist; this server serves "
                                 f"{self.model_name!r} (GET /v1/models)", "model")
        stream = body.get("stream")
        if stream is not None and not isinstance(stream, bool):
            return _openai_error("invalid", f"stream must be true or false, got {_shown(stream)}", "stream")
        options = body.get("stream_options")
        if options is not None and not isinstance(options, dict):
            return _openai_error("invalid", "stream_options must be an object", "stream_options")
        include = (options or {}).get("include_usage")
        if include is not None and not isinstance(include, bool):
            return _openai_error("invalid", f"stream_options.include_usage must be true or false, got "
                                 f"{_shown(include)}", "stream_options")
        stream = bool(stream)
        usage = bool(include) if stream else True
        runtime = self.runtime
        runtime.calls_in_flight += 1
        streaming = False
        try:
            job = await runtime.submit_prompt(text, max_tokens)
            if stream:
                await job.started
                streaming = True
                return StreamingResponse(self._events(job, chat, self.model_name, usage),
                                         media_type="text/event-stream")
            answer = await job.future
        except PromptFailed as exc:
            return _openai_error(exc.reason, _public(exc))
        finally:
            if not streaming:
                runtime.calls_in_flight -= 1
        completion = len(pieces(answer))
        choice: dict[str, Any] = ({"index": 0, "message": {"role": "assistant", "content": answer}}
                                  if chat else {"index": 0, "text": answer, "logprobs": None})
        choice["finish_reason"] = "length"
        return JSONResponse({"id": _reply_id(job, chat), "object": "chat.completion" if chat else "text_completion",
                             "created": int(time.time()), "model": self.model_name, "choices": [choice],
                             "usage": {"prompt_tokens": job.prompt_tokens, "completion_tokens": completion,
                                       "total_tokens": job.prompt_tokens + completion}})

    async def _events(self, job: PromptJob, chat: bool, model: str, usage: bool) -> AsyncIterator[str]:
        """The stream of a prompt whose batch has started: a chunk per token (the first
        chat delta carries the role), a last chunk with the finish reason, then, where the
        client asked (``stream_options.include_usage``), a chunk with no choices and the
        usage, and ``[DONE]``. A failure now is an error event."""
        runtime = self.runtime
        head = {"id": _reply_id(job, chat), "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": model}
        sent = 0

        def event(piece: str | None, finish: str | None = None) -> str:
            if chat:
                delta: dict[str, Any] = {} if piece is None else {"content": piece}
                if sent == 0 and piece is not None:
                    delta = {"role": "assistant", **delta}
                choice: dict[str, Any] = {"index": 0, "delta": delta}
            else:
                choice = {"index": 0, "text": piece or "", "logprobs": None}
            choice["finish_reason"] = finish
            return f"data: {json.dumps(head | {'choices': [choice]})}\n\n"

        try:
            try:
                _, first, done = await job.started
                planned = runtime.backend.planned_text(job)
                if planned is not None and first is not None and done is not None:
                    parts = pieces(planned)
                    for i, part in enumerate(parts):
                        at = first if len(parts) == 1 else first + (done - first) * i / (len(parts) - 1)
                        delay = runtime.clock.real(at - runtime.clock.now())
                        if delay > 0:
                            await asyncio.sleep(delay)
                        if job.future.done() and job.future.exception() is not None:
                            break
                        yield event(part)
                        sent += 1
                    await job.future
                else:
                    answer = await job.future
                    for part in pieces(answer):
                        yield event(part)
                        sent += 1
            except PromptFailed as exc:
                yield f"data: {json.dumps(_error_body(exc.reason, _public(exc)))}\n\n"
                yield "data: [DONE]\n\n"
                return
            yield event(None, "length")
            if usage:
                yield f"data: {json.dumps(head | {'choices': [], 'usage': {'prompt_tokens': job.prompt_tokens, 'completion_tokens': sent, 'total_tokens': job.prompt_tokens + sent}})}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            runtime.calls_in_flight -= 1

    async def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "simctl"}]}

    async def prometheus(self) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def state(self) -> dict[str, Any]:
        return self.runtime.state()

    async def health(self) -> dict[str, Any]:
        return {"status": "shutting down" if self.runtime.closing else "ok",
                "scenario": self.runtime.scenario.name, "profile": self.runtime.profile.name,
                "backend": self.runtime.backend.name, "tasks": self.runtime.tasks}


def _tokens(text: str) -> int:
    from simulator.trace.classify import estimate_tokens

    return estimate_tokens(text)


def _batch_body(body: Any, limits: Limits) -> tuple[list[str], int | None, str]:
    """(texts, max tokens, problem) of a batch endpoint body."""
    if not isinstance(body, dict):
        return [], None, "the request body must be a JSON object {\"prompt\": [texts], \"max_tokens\": M}"
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt or not all(isinstance(p, str) for p in prompt):
        return [], None, "field 'prompt': must be a non-empty list of strings"
    if len(prompt) > limits.max_prompts:
        return [], None, (f"field 'prompt': {len(prompt):,} prompts, more than the server's limit of "
                          f"{limits.max_prompts:,} prompts a call")
    for index, text in enumerate(prompt):
        if _tokens(text) > limits.max_prompt_tokens:
            return [], None, (f"field 'prompt': prompt {index} is about {_tokens(text):,} tokens, more than the "
                              f"server's limit of {limits.max_prompt_tokens:,} tokens a prompt")
    max_tokens = body.get("max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        return [], None, f"field 'max_tokens': must be an integer >= 1, got {_shown(max_tokens)}"
    if max_tokens is not None and max_tokens > limits.max_output_tokens:
        return [], None, (f"field 'max_tokens': must be at most {limits.max_output_tokens:,} (the server's limit), "
                          f"got {_shown(max_tokens)}")
    return prompt, max_tokens, ""


def _shown(value: Any) -> str:
    """A client's value quoted in an error message: its repr, cut short (a message does not
    echo a megabyte back)."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**30 else f"an integer of {len(str(abs(value)))} digits"
    return text if len(text) <= 60 else f"{text[:57]}..."


def _public(failure: PromptFailed) -> str:
    """What a client is told of ``failure``: its message, except for a backend's error, whose
    message may hold an engine's URL, its reply or a path: a generic message and an error id
    instead (the details are logged under the id, once per failure)."""
    if failure.reason != "backend" and not failure.detail:
        return failure.message
    return f"the backend failed to serve the prompt (error id {_logged(failure)}; the details are in the server's log)"


def _reference(failure: PromptFailed) -> str:
    """The batch endpoint's ``traceback`` field: never a traceback, only where to find it."""
    if failure.reason != "backend" and not failure.detail:
        return ""
    return f"error id {_logged(failure)}: the traceback is in the server's log"


def _logged(failure: PromptFailed) -> str:
    """The error id of ``failure``, logging its details the first time it is asked."""
    eid = getattr(failure, "error_id", None)
    if eid is None:
        eid = error_id()
        failure.error_id = eid  # type: ignore[attr-defined]
        log.error("%s: prompt failed (%s): %s\n%s", eid, failure.reason, failure.message, failure.detail)
    return eid


def _caught(handler: Any, legacy: bool = False) -> Any:
    """``handler`` with a last line of defence: an exception it did not expect is logged with
    an error id and answered with a generic message and that id (HTTP 500, OpenAI's body; the
    batch endpoint's own shape, HTTP 200, there) — never its traceback."""

    @functools.wraps(handler)
    async def caught(*args: Any, **kwargs: Any) -> Any:
        try:
            return await handler(*args, **kwargs)
        except Exception:
            eid = error_id()
            log.exception("%s: unexpected error in %s", eid, handler.__name__)
            message = f"internal server error (error id {eid}; the details are in the server's log)"
            if legacy:
                return _batch_error(message, f"error id {eid}: the traceback is in the server's log")
            return _openai_error("internal", message)
    return caught


def _reply_id(job: PromptJob, chat: bool) -> str:
    """OpenAI's id of a reply: ``chatcmpl-N`` for a chat completion, ``cmpl-N`` for a completion."""
    return f"chatcmpl-{job.id}" if chat else f"cmpl-{job.id}"


def _openai_prompt(body: Any, chat: bool) -> tuple[str | None, str, str | None]:
    """(prompt text, problem, the field at fault) of an OpenAI request body."""
    if not isinstance(body, dict):
        return None, "the request body must be a JSON object", None
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return None, "field 'messages': must be a non-empty list", "messages"
        texts = []
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, list):  # content parts: their texts
                parts = [p.get("text", "") for p in content if isinstance(p, dict)]
                if not all(isinstance(p, str) for p in parts):
                    return None, "field 'messages': a content part's 'text' must be a string", "messages"
                content = " ".join(parts)
            if not isinstance(content, str):
                return None, "field 'messages': every message needs a string 'content'", "messages"
            texts.append(content)
        return "\n".join(texts), "", None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        return None, ("field 'prompt': must be one string (one prompt per request; the batch endpoint takes "
                      "lists)"), "prompt"
    return prompt, "", None


def _batch_error(message: str, detail: str = "", failed: list[dict[str, Any]] | None = None) -> JSONResponse:
    body: dict[str, Any] = {"error": message, "traceback": detail}
    if failed:
        body["failed"] = failed
    return JSONResponse(body, status_code=200)


def _error_body(reason: str, message: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error body (as vLLM fills it: ``type`` the reason, ``code`` the HTTP status)."""
    return {"error": {"message": message, "type": reason, "param": param, "code": STATUS.get(reason, 500)}}


def _openai_error(reason: str, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(_error_body(reason, message, param), status_code=STATUS.get(reason, 500))


def build_app(scenario: Scenario, profile: Profile, backend: Backend, *, seed: int = 0, time_scale: float = 1.0,
              batch_timeout: float | None = 600.0, grace: float = 30.0, model_name: str = "simctl",
              default_task: str | None = None, limits: Limits | None = None) -> ServeApp:
    """The server for ``scenario`` with ``profile``'s tasks on ``backend``: a
    :class:`ServeApp` whose ``.app`` is the ASGI app and ``.runtime`` the runtime.
    ``default_task``: where a prompt whose task this server does not serve goes (``None``: it
    fails; ``simctl serve`` passes :func:`~simulator.serve.runtime.first_gpu_task`).
    ``limits``: what the server refuses (:class:`~simulator.serve.guard.Limits`; its defaults
    where ``None``).
    :class:`~simulator.errors.ScenarioError` names a setting the runtime does not serve."""
    runtime = Runtime(scenario, profile, backend, seed=seed, time_scale=time_scale, batch_timeout=batch_timeout,
                      default_task=default_task)
    return ServeApp(runtime, grace=grace, model_name=model_name, limits=limits)
