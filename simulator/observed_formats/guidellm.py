"""GuideLLM's benchmark report (``guidellm benchmark --output-path benchmarks.json``).

One JSON object ``{"benchmarks": [GenerativeBenchmark, ...]}`` (GuideLLM 0.2-0.3,
``guidellm.benchmark.benchmark``); each benchmark's ``requests`` holds ``successful``,
``errored`` and ``incomplete`` lists of per-request records: ``request_id``, ``prompt``
(the text), ``prompt_tokens``, ``output_tokens``, ``start_time``, ``end_time``,
``first_token_time``, ``last_token_time`` (epoch seconds) and, for failures, ``error``.
A report of several benchmarks (a sweep over rates) is several runs: the file is refused
unless it holds one (``--rate-type`` other than sweep gives one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simulator import inputs
from simulator.errors import ObservedError
from simulator.observed_formats._common import Request, count, number


def looks_like(path: Path, head: str) -> bool:
    return head.lstrip().startswith("{") and '"benchmarks"' in head and (
        "generative_benchmark" in head or '"run_id"' in head or '"requests"' in head)


def read(path: Path) -> tuple[list[Request], dict[str, Any]]:
    data = inputs.read_json(path, ObservedError, "GuideLLM report")
    benchmarks = data.get("benchmarks") if isinstance(data, dict) else None
    if not isinstance(benchmarks, list) or not benchmarks:
        raise ObservedError(path, None, "benchmarks", "a GuideLLM report needs a list of benchmarks")
    if len(benchmarks) != 1:
        raise ObservedError(path, None, "benchmarks", f"holds {len(benchmarks)} benchmarks (a sweep); an observed "
                            "run is one: give a report of one benchmark (one rate)")
    bench = benchmarks[0]
    groups = bench.get("requests") if isinstance(bench, dict) else None
    if not isinstance(groups, dict):
        raise ObservedError(path, 0, "requests", "needs the per-request records (successful, errored, incomplete)")
    requests = []
    for status in ("successful", "errored", "incomplete"):
        records = groups.get(status) or []
        if not isinstance(records, list):
            raise ObservedError(path, 0, f"requests.{status}", "must be a list of request records")
        for j, rec in enumerate(records):
            if not isinstance(rec, dict):
                raise ObservedError(path, 0, f"requests.{status}[{j}]", "must be a request record (an object)")
            start, end, first = number(rec.get("start_time")), number(rec.get("end_time")), number(rec.get("first_token_time"))
            ok = status == "successful" and start is not None and end is not None
            error = "" if ok else str(rec.get("error") or ("incomplete" if status == "incomplete" else "failed"))
            requests.append(Request(
                id=str(rec.get("request_id") or f"{status}-{j}"), start=start,
                latency=(end - start) if ok else None,  # type: ignore[operator]
                ok=ok, error=error, ttft=(first - start) if ok and first is not None else None,  # type: ignore[operator]
                prompt_tokens=count(rec.get("prompt_tokens")), output_tokens=count(rec.get("output_tokens")),
                prompt_text=rec.get("prompt") if isinstance(rec.get("prompt"), str) else None))
    meta: dict[str, Any] = {"benchmark": bench.get("id_")} if bench.get("id_") else {}
    return requests, meta
