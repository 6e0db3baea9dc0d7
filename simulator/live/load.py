"""Replay a trace against a live endpoint in real time: the same scenario, measured.

:func:`run_load` sends every call of a trace to a server and writes what it measured as a
run folder (:mod:`simulator.live.runfolder`) that ``simctl observed``, ``compare-runs``,
``calibrate`` and ``predict`` read like a run of the users' client.

When calls are sent (the ``client`` setting, as in replay):

* ``open`` — every call at its instant, never waiting for earlier calls (as the users'
  client: one asyncio task per call that sleeps until its instant). At most
  ``max_in_flight`` calls are on the wire at once (their client's semaphore of 300); a call
  past that waits, and its send lag shows in ``actual_send_time``.
* ``closed:N[:THINK]`` — N calls outstanding: the first N at the trace's first instant, the
  trace's next call THINK seconds after one ends; a call's scheduled instant is rewritten to
  when it became due (as replay rewrites its arrival).

Time: a call at trace time ``t`` is due ``t / (rate_scale × time_scale)`` seconds after the
run starts. ``rate_scale`` changes the workload (as in replay: 2 doubles the arrival rate);
``time_scale`` compresses the wall clock for a quick look (and THINK with it). Every
instant written is seconds of wall time from the start of the run, and ``batch_arrivals.json``
holds the instants the calls were due, so the folder reads back as the run that happened.

Stopping: :func:`run_load` stops cleanly on SIGINT (Ctrl-C) when it runs in the main
thread, or when ``stop`` is set: calls in flight are abandoned, calls not sent are not
sent, and what finished is kept. The summary marks the run ``interrupted`` and lists the
abandoned and unsent calls; its arrival file and results hold the finished calls only, so
the folder reads as a (shorter) run, not as one whose unsent calls all failed.

Saving: the summary and request log are written before the first call and again as calls
finish (at most every ``checkpoint_s``, 2 s), marked ``in_progress`` until the end: a run
killed part-way (SIGKILL, a crash) leaves a folder that reads, its unfinished calls failed.
An answer that is not valid (:mod:`simulator.live.apis`) fails its call, never the run.
"""

from __future__ import annotations

import asyncio
import functools
import math
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simulator.errors import LoadError
from simulator.live.apis import API_NAMES, CallOutcome, PromptOutcome, endpoint, send_batch, send_stream, short
from simulator.live.runfolder import REQUEST_COLUMNS, RunFolder
from simulator.observed import CLIENT_TIMEOUT
from simulator.settings import ClosedLoop, parse_client
from simulator.trace.formats.client import client_records
from simulator.trace.model import Call, Trace


@functools.cache
def _tls_context() -> Any:
    """httpx's default TLS context (certificates verified, from certifi or the
    ``SSL_CERT_FILE``/``SSL_CERT_DIR`` it names), made once a process: reading the
    certificate store costs tens of milliseconds, which a process of many runs (a library
    user's loop) paid again for every run."""
    import httpx

    return httpx.create_ssl_context()


#: The users' client: its semaphore (calls on the wire at once) and its ``max_tokens``.
MAX_IN_FLIGHT = 300
#: How long the check that the server is there waits for a connection (s).
CONNECT_CHECK_S = 5.0


@dataclass(frozen=True)
class LoadOptions:
    """How to drive the server (see the module docstring)."""

    url: str
    api: str = "batch"
    model: str | None = None
    client: str = "open"
    time_scale: float = 1.0
    rate_scale: float = 1.0
    timeout: float = CLIENT_TIMEOUT
    max_in_flight: int = MAX_IN_FLIGHT
    #: every call's ``max_tokens`` (default: the call's largest prompt ``max_tokens``, else
    #: 2048, as the client format's ``max_length``)
    max_tokens: int | None = None

    def checked(self) -> tuple[str, ClosedLoop | None]:
        """The endpoint URL and the closed loop (``None``: open); :class:`LoadError` naming
        the option at fault."""
        import httpx

        if self.api not in API_NAMES:
            raise LoadError(None, None, "--api", f"must be one of {', '.join(API_NAMES)}, got {self.api!r}")
        if self.api != "batch" and not self.model:
            raise LoadError(None, None, "--model", f"the {self.api} API needs the served model's name (--model NAME)")
        for name, value in (("--time-scale", self.time_scale), ("--rate-scale", self.rate_scale),
                            ("--timeout", self.timeout)):
            if not (value > 0 and math.isfinite(value)):
                raise LoadError(None, None, name, f"must be a positive number, got {value}")
        if self.max_in_flight < 1:
            raise LoadError(None, None, "--max-in-flight", f"must be >= 1, got {self.max_in_flight}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise LoadError(None, None, "--max-tokens", f"must be >= 1, got {self.max_tokens}")
        try:
            closed = parse_client(self.client)
        except ValueError as exc:
            raise LoadError(None, None, "--client", str(exc)) from None
        try:
            url = httpx.URL(self.url)
        except (httpx.InvalidURL, TypeError, ValueError) as exc:
            raise LoadError(self.url, None, None, f"not a URL ({exc})") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise LoadError(self.url, None, None, "not an http:// or https:// URL with a host")
        return endpoint(self.url, self.api), closed


@dataclass
class LoadProgress:
    """Counts so far, for a live display: calls sent, finished, failed; call latency
    quantiles over the successful calls finished so far (``NaN`` before the first)."""

    total: int
    sent: int = 0
    done: int = 0
    failed: int = 0
    p50: float = math.nan
    p90: float = math.nan

    @property
    def in_flight(self) -> int:
        return self.sent - self.done


@dataclass(frozen=True)
class LoadResult:
    """A finished (or stopped) load run: its folder, summary and per-request log."""

    folder: Path
    summary: dict[str, Any]
    requests: pd.DataFrame
    interrupted: bool = False

    @property
    def kept(self) -> int:
        return int(self.summary["total_batches"])


@dataclass
class _Planned:
    """One call as it will be sent: its record fields and texts."""

    index: int
    call: Call
    batch_id: int
    due: float
    texts: list[str]
    prompt_idxs: list[int]
    max_tokens: int


@dataclass
class _State:
    progress: LoadProgress
    sent: dict[int, float] = field(default_factory=dict)      # call index -> when sent
    due: dict[int, float] = field(default_factory=dict)       # call index -> when due
    done: dict[int, CallOutcome] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)


def plan_calls(trace: Trace, options: LoadOptions) -> list[_Planned]:
    """Every call of ``trace`` as it will be sent: ids, instants, texts (the prompt's text,
    else an invented one of its task, as the client-format writer makes), ``max_tokens``."""
    scale = options.rate_scale * options.time_scale
    records = client_records(trace)
    planned = []
    for i, (call, rec) in enumerate(zip(trace.calls, records, strict=True)):
        planned.append(_Planned(i, call, int(rec["batch_id"]), call.t / scale, list(rec["prompts"]),
                                list(rec["prompt_idxs"]), options.max_tokens or int(rec["max_length"])))
    return planned


def _sent_trace(planned: list[_Planned], due: dict[int, float], source: Trace, meta: dict[str, Any]) -> Trace:
    """The calls as sent: id the batch id, ``t`` when due, each prompt with the text sent."""
    calls = []
    for p in planned:
        if p.index not in due:
            continue
        prompts = tuple(replace(q, text=text) for q, text in zip(p.call.prompts, p.texts, strict=True))
        calls.append(Call(str(p.batch_id), due[p.index], prompts))
    return Trace(tuple(calls), meta={**source.meta, **meta}, source=source.source)


async def _check_reachable(url: str) -> None:
    import httpx

    parsed = httpx.URL(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(parsed.host, port), CONNECT_CHECK_S)
    except (OSError, TimeoutError) as exc:
        reason = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise LoadError(url, None, None, f"cannot connect to {parsed.host}:{port}: {reason}") from None
    writer.close()


def _call_record(p: _Planned, due: float, outcomes: list[PromptOutcome], body: Any, api: str) -> dict[str, Any]:
    """The users' client's record of one finished call. Unlike their client, a failed call
    always has its reason in ``error`` (their client leaves it null on an HTTP 200 answer
    and the failure is in the body), so an invalid answer reads back as a failure."""
    sent = min(o.sent_at for o in outcomes)
    done = max((o.done_at for o in outcomes if o.done_at is not None), default=sent)
    statuses = [o.http_status for o in outcomes]
    failed = [(i, o) for i, o in enumerate(outcomes) if o.status != "ok"]
    got_response = all(s is not None for s in statuses)
    if api == "batch":
        response = body
        error = (outcomes[0].error or "failed") if failed else None
    else:
        response = None
        if not failed:
            response = {"choices": [{"text": o.text, "index": i, "finish_reason": o.finish_reason}
                                    for i, o in enumerate(outcomes)],
                        "usage": {"prompt_tokens": sum(o.prompt_tokens or 0 for o in outcomes),
                                  "completion_tokens": sum(o.output_tokens or 0 for o in outcomes)}}
        error = None if not failed else "; ".join(
            f"prompt {i}: {o.error}" if len(outcomes) > 1 else o.error for i, o in failed[:3])
    status = next((s for s in statuses if s is not None and s != 200), None)
    if status is None:
        status = 200 if got_response else None
    return {"batch_id": p.batch_id, "batch_size": len(p.texts), "scheduled_arrival_time": due,
            "actual_send_time": sent, "request_duration": done - sent, "completion_time": done,
            "status_code": status, "prompt_idxs": p.prompt_idxs, "response": response, "error": error}


#: The start of the reason of a call whose answer the load generator itself failed to read:
#: never expected (every answer is checked field by field), but a run keeps going and
#: records the call rather than losing every other call's result.
UNEXPECTED = "unexpected failure reading the answer"


async def _send_call(client: Any, url: str, p: _Planned, options: LoadOptions,
                     clock: Callable[[], float], due: float) -> CallOutcome:
    sent = clock()
    try:
        if options.api == "batch":
            outcomes, body = await send_batch(client, url, p.texts, p.max_tokens, options.timeout, clock)
            return CallOutcome(_call_record(p, due, outcomes, body, "batch"), outcomes)
        assert options.model is not None  # checked
        outcomes = list(await asyncio.gather(*(
            send_stream(client, url, options.api, options.model, text, p.max_tokens, options.timeout, clock)
            for text in p.texts)))
        return CallOutcome(_call_record(p, due, outcomes, None, options.api), outcomes)
    except Exception as exc:  # noqa: BLE001 - one call's answer must not lose the run (UNEXPECTED)
        error = f"{UNEXPECTED}: {type(exc).__name__}: {short(str(exc))}"
        outcomes = [PromptOutcome(sent_at=sent, done_at=clock(), status="error", error=error) for _ in p.texts]
        return CallOutcome(_call_record(p, due, outcomes, None, options.api), outcomes)


def _request_rows(planned: list[_Planned], state: _State,
                  in_flight: str = "still in flight when the run stopped") -> pd.DataFrame:
    """One row per prompt of every call sent (:data:`REQUEST_COLUMNS`); a call sent and not
    finished has its prompts ``interrupted``, ``in_flight`` their error."""
    rows = []
    for p in planned:
        if p.index not in state.sent:
            continue
        done = state.done.get(p.index)
        for j, prompt in enumerate(p.call.prompts):
            o = done.prompts[j] if done is not None else PromptOutcome(
                sent_at=state.sent[p.index], status="interrupted", error=in_flight)
            rows.append({
                "call_id": str(p.batch_id), "prompt_index": j, "task": prompt.task,
                "scheduled_at": state.due[p.index], "sent_at": o.sent_at,
                "first_token_at": np.nan if o.first_token_at is None else o.first_token_at,
                "done_at": np.nan if o.done_at is None else o.done_at, "status": o.status,
                "http_status": o.http_status, "error": o.error,
                "prompt_tokens": o.prompt_tokens if o.prompt_tokens is not None else prompt.prompt_tokens,
                "output_tokens": o.output_tokens, "itls_s": list(o.itls)})
    frame = pd.DataFrame(rows, columns=list(REQUEST_COLUMNS))
    for col in ("http_status", "prompt_tokens", "output_tokens"):
        frame[col] = frame[col].astype("Int64")
    for col in ("scheduled_at", "sent_at", "first_token_at", "done_at"):
        frame[col] = frame[col].astype(float)
    return frame


async def _drive(planned: list[_Planned], url: str, closed: ClosedLoop | None, options: LoadOptions,
                 folder: RunFolder, state: _State, on_progress: Callable[[LoadProgress], None] | None,
                 stop: asyncio.Event, checkpoint: Callable[[float], None], every: float) -> tuple[bool, float]:
    """Send the calls; (whether it was stopped, the run's length in seconds). As calls
    finish, ``checkpoint(now)`` saves the run so far, at most once every ``every`` seconds."""
    import httpx

    widest = max((len(p.texts) for p in planned), default=1)
    pool = min(max(options.max_in_flight * (1 if options.api == "batch" else widest), 1), 4096)
    limits = httpx.Limits(max_connections=pool, max_keepalive_connections=pool)
    gate = asyncio.Semaphore(options.max_in_flight)
    start = time.monotonic()

    def clock() -> float:
        return time.monotonic() - start

    saved = [clock()]

    def report() -> None:
        if on_progress is not None:
            on_progress(replace(state.progress))

    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(None), verify=_tls_context()) as client:

        async def one(p: _Planned, due: float) -> None:
            wait = due - clock()
            if wait > 0:
                await asyncio.sleep(wait)
            async with gate:
                state.due[p.index] = due
                state.sent[p.index] = clock()
                state.progress.sent += 1
                report()
                outcome = await _send_call(client, url, p, options, clock, due)
            folder.write_call(outcome.record)
            state.done[p.index] = outcome
            state.progress.done += 1
            if outcome.ok:
                state.latencies.append(outcome.record["request_duration"])
                state.progress.p50, state.progress.p90 = (float(v) for v in np.percentile(state.latencies, [50, 90]))
            else:
                state.progress.failed += 1
            if clock() - saved[0] >= every:
                checkpoint(clock())
                saved[0] = clock()
            report()

        if closed is None:
            tasks = [asyncio.create_task(one(p, p.due)) for p in planned]
        else:
            queue = iter(planned)
            think = closed.think / options.time_scale
            first = planned[0].due if planned else 0.0

            async def worker() -> None:
                due = first
                for p in queue:  # one shared iterator: each call is taken once, in trace order
                    await one(p, max(due, clock()))
                    due = clock() + think

            tasks = [asyncio.create_task(worker()) for _ in range(min(closed.calls, len(planned)))]
        everything: asyncio.Future[Any] = asyncio.gather(*tasks)
        stopped: asyncio.Future[Any] = asyncio.create_task(stop.wait())
        await asyncio.wait({everything, stopped}, return_when=asyncio.FIRST_COMPLETED)
        interrupted = stop.is_set() and not everything.done()
        if interrupted:
            everything.cancel()
        else:
            stopped.cancel()
        await asyncio.gather(everything, stopped, return_exceptions=True)
        if not interrupted:
            everything.result()  # a bug in a call task surfaces here, not silently
        return interrupted, clock()


#: How often a run in progress saves its summary and request log (seconds).
CHECKPOINT_S = 2.0


def _summary(planned: list[_Planned], kept: list[_Planned], state: _State, settings: dict[str, Any],
             interrupted: bool, length: float, in_progress: bool) -> dict[str, Any]:
    """The run's ``simulation_summary.json``: the records of the calls finished, in call
    order; ``in_progress`` while the run goes on (then the calls in flight are listed as
    ``abandoned``: what a run killed now would have lost)."""
    finished = [p for p in kept if p.index in state.done]
    ok = sum(1 for p in finished if state.done[p.index].ok)
    return {
        "total_batches": len(kept), "total_prompts": sum(len(p.texts) for p in kept),
        "scheduled_duration": max((state.due.get(p.index, p.due) for p in kept), default=0.0),
        "actual_duration": length, "successful_batches": ok, "failed_batches": len(finished) - ok,
        "interrupted": interrupted, "in_progress": in_progress,
        "abandoned": [p.batch_id for p in planned if p.index in state.sent and p.index not in state.done],
        "not_sent": [p.batch_id for p in planned if p.index not in state.sent],
        "load": settings,
        "results": [state.done[p.index].record for p in sorted(finished, key=lambda p: p.batch_id)],
    }


def run_load(trace: Trace, options: LoadOptions, folder: str | Path, force: bool = False,
             trace_path: str | Path | None = None, on_progress: Callable[[LoadProgress], None] | None = None,
             stop: threading.Event | None = None, handle_sigint: bool = True,
             checkpoint_s: float = CHECKPOINT_S) -> LoadResult:
    """Replay ``trace`` against ``options.url`` and write the run into ``folder``.

    ``folder`` must not exist (unless ``force``) and must not hold ``trace_path``. The server
    must accept a connection before anything is written. ``on_progress`` is called with a
    :class:`LoadProgress` as each call is sent and as each finishes. ``stop`` (set from
    another thread), or SIGINT with ``handle_sigint`` in the main thread, stops the run
    cleanly (module docstring). Raises :class:`LoadError` for bad options, an unusable folder
    or an unreachable server; needs the ``live`` extra (httpx).

    The folder is a readable run from the start: the summary and request log are written
    (atomically) before the first call, again as calls finish (at most every
    ``checkpoint_s`` seconds; 0: after every call), and at the end, so a run killed part-way
    leaves every call that finished by its last save, and each call's ``batch_NNNN.json``.
    """
    url, closed = options.checked()
    run = RunFolder(folder, force=force, trace_path=trace_path)
    planned = plan_calls(trace, options)
    state = _State(LoadProgress(total=len(planned)))
    started = datetime.now(UTC).isoformat(timespec="seconds")
    settings = {"url": options.url, "endpoint": url, "api": options.api, "model": options.model,
                "client": options.client, "time_scale": options.time_scale, "rate_scale": options.rate_scale,
                "timeout_s": options.timeout, "max_in_flight": options.max_in_flight,
                "max_tokens": options.max_tokens, "trace": trace.source, "started": started}

    def checkpoint(now: float) -> None:
        # the arrival file written at the start holds every planned call: so does this summary
        run.write_requests(_request_rows(planned, state, in_flight="in flight when the run was last saved"))
        run.write_summary(_summary(planned, planned, state, settings, False, now, in_progress=True))

    async def main() -> tuple[bool, float]:
        await _check_reachable(url)
        run.create()
        run.write_arrivals(_sent_trace(planned, {p.index: p.due for p in planned}, trace, {"load": settings}))
        checkpoint(0.0)
        event = asyncio.Event()
        loop = asyncio.get_running_loop()
        sigint = handle_sigint and threading.current_thread() is threading.main_thread()
        if sigint:
            loop.add_signal_handler(signal.SIGINT, event.set)
        watcher = None
        if stop is not None:
            async def watch() -> None:
                while not stop.is_set():
                    await asyncio.sleep(0.05)
                event.set()
            watcher = asyncio.create_task(watch())
        try:
            return await _drive(planned, url, closed, options, run, state, on_progress, event, checkpoint,
                                checkpoint_s)
        finally:
            if sigint:
                loop.remove_signal_handler(signal.SIGINT)
            if watcher is not None:
                watcher.cancel()

    interrupted, length = asyncio.run(main())
    finished = [p for p in planned if p.index in state.done]
    kept = finished if interrupted else [p for p in planned if p.index in state.due]
    summary = _summary(planned, kept, state, settings, interrupted, length, in_progress=False)
    requests = _request_rows(planned, state)
    # a stopped run keeps fewer calls than the saved summary lists: the new summary follows
    # the arrival file at once
    run.write_arrivals(_sent_trace(kept, state.due, trace, {"load": settings}))
    run.write_summary(summary)
    run.write_requests(requests)
    return LoadResult(run.path, summary, requests, interrupted)
