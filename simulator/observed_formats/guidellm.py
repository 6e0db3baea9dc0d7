"""GuideLLM's benchmark report (``guidellm benchmark --output-path benchmarks.json``).

One JSON object ``{"benchmarks": [benchmark, ...]}``, one benchmark per rate of the run
(a sweep, the usual use, holds several: each is a run, ``FILE#K``). A benchmark's
``requests`` holds ``successful``, ``errored`` and ``incomplete`` lists of per-request
records, in one of two layouts:

* GuideLLM 0.8 (``GenerativeRequestStats``): ``request_id``, ``info.timings``
  (``request_start``, ``request_end``, ``first_token_iteration``, ``last_token_iteration``,
  epoch seconds) with the figures GuideLLM derives from them written beside
  (``request_start_time``, ``request_latency`` in s, ``time_to_first_token_ms``,
  ``inter_token_latency_ms``, ``prompt_tokens``, ``output_tokens``), ``request_args`` (the
  request as sent, a JSON string holding the prompt) and ``info.error`` for a failure;
* GuideLLM 0.2-0.3: ``request_id``, ``prompt`` (the text), ``prompt_tokens``,
  ``output_tokens``, ``start_time``, ``end_time``, ``first_token_time``,
  ``last_token_time`` (epoch seconds) and, for a failure, ``error``.

A request's latency is GuideLLM's ``request_latency`` (end minus start of the request),
its TTFT ``time_to_first_token_ms`` and its inter-token latency ``inter_token_latency_ms``
(``(last token − first token) / (output tokens − 1)``), as the report's own summary
(``metrics``) counts them. A record of neither layout is refused, naming both.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simulator import inputs
from simulator.errors import ObservedError
from simulator.observed_formats._common import Benchmark, Request, count, number

STATUSES = ("successful", "errored", "incomplete")
_EXPECTED = ("expected a GuideLLM request record: info.timings.request_start and request_end "
             "(GuideLLM 0.8) or start_time and end_time (GuideLLM 0.2-0.3)")


def looks_like(path: Path, head: str) -> bool:
    return head.lstrip().startswith("{") and '"benchmarks"' in head and (
        "generative_benchmark" in head or '"run_id"' in head or '"requests"' in head)


def _prompt_of(request_args: Any) -> str | None:
    """The prompt text in GuideLLM 0.8's ``request_args`` (the body it sent, as JSON text:
    ``prompt`` for completions, the messages' text for chat), else ``None``."""
    if not isinstance(request_args, str):
        return None
    try:
        args = json.loads(request_args)
    except (ValueError, RecursionError):
        return None
    body = args.get("body", args) if isinstance(args, dict) else None
    if not isinstance(body, dict):
        return None
    if isinstance(body.get("prompt"), str):
        return body["prompt"]
    texts = []
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts += [part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)]
    return "\n".join(texts) or None


def _request_v08(rec: dict, status: str, rid: str) -> Request:
    timings = rec["info"]["timings"]
    start = number(rec.get("request_start_time"))
    if start is None:
        start = number(timings.get("request_start"))
    if start is None:
        start = number(timings.get("resolve_start"))
    latency = number(rec.get("request_latency"))
    if latency is None:
        begin, end = number(timings.get("request_start")), number(timings.get("request_end"))
        latency = end - begin if begin is not None and end is not None else None
    ok = status == "successful" and latency is not None
    ttft_ms, itl_ms = number(rec.get("time_to_first_token_ms")), number(rec.get("inter_token_latency_ms"))
    error = rec["info"].get("error")
    # the first line: GuideLLM writes the exception's text, whose later lines are advice
    message = "" if ok else (str(error or "").strip().splitlines() or ["incomplete" if status == "incomplete" else "failed"])[0]
    return Request(id=rid, start=start, latency=latency if ok else None, ok=ok, error=message,
                   ttft=ttft_ms / 1000 if ok and ttft_ms is not None else None,
                   itl=itl_ms / 1000 if ok and itl_ms is not None else None,
                   prompt_tokens=count(rec.get("prompt_tokens")), output_tokens=count(rec.get("output_tokens")),
                   prompt_text=_prompt_of(rec.get("request_args")))


def _request_v02(rec: dict, status: str, rid: str) -> Request:
    start, end, first = number(rec.get("start_time")), number(rec.get("end_time")), number(rec.get("first_token_time"))
    last = number(rec.get("last_token_time"))
    ok = status == "successful" and start is not None and end is not None
    error = "" if ok else str(rec.get("error") or ("incomplete" if status == "incomplete" else "failed"))
    outputs = count(rec.get("output_tokens"))
    itl = (last - first) / (outputs - 1) if ok and first is not None and last is not None and outputs and outputs > 1 else None
    return Request(
        id=rid, start=start, latency=(end - start) if ok else None,  # type: ignore[operator]
        ok=ok, error=error, ttft=(first - start) if ok and first is not None else None,  # type: ignore[operator]
        itl=itl, prompt_tokens=count(rec.get("prompt_tokens")), output_tokens=outputs,
        prompt_text=rec.get("prompt") if isinstance(rec.get("prompt"), str) else None)


def _label(bench: dict) -> str:
    """How GuideLLM names the benchmark: its strategy and rate (``constant 2.0/s``)."""
    strategy: Any = None
    for holder in (bench.get("config"), bench.get("args")):  # 0.8; 0.2-0.3
        if isinstance(holder, dict) and isinstance(holder.get("strategy"), dict):
            strategy = holder["strategy"]
            break
    if strategy is None:
        return ""
    kind = str(strategy.get("type_") or strategy.get("type") or "")
    rate = number(strategy.get("rate"))
    streams = number(strategy.get("streams"))  # a concurrent strategy's; max_concurrency is a cap, not the load
    if rate is not None:
        return f"{kind} {rate:g}/s".strip()
    if streams is not None:
        return f"{kind} {streams:g} streams".strip()
    return kind


def _benchmark(path: Path, k: int, bench: Any) -> Benchmark:
    groups = bench.get("requests") if isinstance(bench, dict) else None
    if not isinstance(groups, dict):
        raise ObservedError(path, k, f"benchmarks[{k}].requests", "needs the per-request records "
                            "(successful, errored, incomplete)")
    requests = []
    for status in STATUSES:
        records = groups.get(status) or []
        if not isinstance(records, list):
            raise ObservedError(path, k, f"benchmarks[{k}].requests.{status}", "must be a list of request records")
        for j, rec in enumerate(records):
            field = f"benchmarks[{k}].requests.{status}[{j}]"
            if not isinstance(rec, dict):
                raise ObservedError(path, k, field, "must be a request record (an object)")
            rid = str(rec.get("request_id") or f"{k}-{status}-{j}")
            info = rec.get("info")
            if isinstance(info, dict) and isinstance(info.get("timings"), dict):
                requests.append(_request_v08(rec, status, rid))
            elif "start_time" in rec and "end_time" in rec:
                requests.append(_request_v02(rec, status, rid))
            else:
                raise ObservedError(path, k, field, _EXPECTED)
    if not requests:
        raise ObservedError(path, k, f"benchmarks[{k}].requests", "holds no request records")
    meta: dict[str, Any] = {}
    bench_id = bench.get("id_") or bench.get("run_id")
    if bench_id:
        meta["benchmark"] = bench_id
    return Benchmark(requests, meta, _label(bench))


def read(path: Path) -> list[Benchmark]:
    data = inputs.read_json(path, ObservedError, "GuideLLM report")
    benchmarks = data.get("benchmarks") if isinstance(data, dict) else None
    if not isinstance(benchmarks, list) or not benchmarks:
        raise ObservedError(path, None, "benchmarks", "a GuideLLM report needs a list of benchmarks")
    return [_benchmark(path, k, bench) for k, bench in enumerate(benchmarks)]
