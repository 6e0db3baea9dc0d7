"""AIPerf's per-request export, ``profile_export.jsonl`` (NVIDIA AIPerf, the successor of
GenAI-Perf; "Working with Profile Export Files" in its documentation).

One JSON object per line, per request: ``metadata`` (``session_num``, ``x_request_id``,
``request_start_ns`` and ``request_end_ns`` in epoch nanoseconds, ``benchmark_phase``,
``was_cancelled``), ``metrics`` (each ``{"value", "unit"}``: ``request_latency``,
``time_to_first_token``, ``input_sequence_length``, ``output_sequence_length`` ...; null
for a failed request) and ``error`` (``{"code", "type", "message"}`` or null). Records of
a phase other than ``profiling`` (warm-up) are left out. A folder holding
``profile_export.jsonl`` (AIPerf's artifact directory) reads the same.

Token counts are the server's where the response reported them (``usage_prompt_tokens``,
``usage_completion_tokens``: the server's tokenizer, which the simulated service model is
measured in), else AIPerf's client-side counts (``input_sequence_length``,
``output_sequence_length``, tokenized with ``--tokenizer``). A request's inter-token
latency is AIPerf's formula, ``(request_latency − ttft) / (output tokens − 1)`` (the mean
gap after the first token), over those same output tokens: AIPerf's own
``inter_token_latency`` divides by its client-side count unless it ran with
``--use-server-token-count``, and is taken only where the server reported no count.
"""

from __future__ import annotations

import json
from pathlib import Path

from simulator import inputs
from simulator.errors import ObservedError
from simulator.observed_formats._common import UNITS, Benchmark, Request, count, number


def looks_like(path: Path, head: str) -> bool:
    first = head.lstrip().split("\n", 1)[0]
    return first.startswith("{") and '"metadata"' in first and '"request_start_ns"' in first


def _metric(metrics: dict, name: str, seconds: bool = False) -> float | None:
    entry = metrics.get(name)
    if not isinstance(entry, dict):
        return None
    value = number(entry.get("value"))
    if value is None or not seconds:
        return value
    return value * UNITS.get(str(entry.get("unit", "ms")), 1e-3)


def _first(metrics: dict, *names: str) -> float | None:
    """The value of the first of ``names`` the record has."""
    for name in names:
        value = _metric(metrics, name)
        if value is not None:
            return value
    return None


def _itl(metrics: dict, latency: float | None, output: float | None) -> float | None:
    """Mean inter-token latency (s) over the server's output tokens where it counted them."""
    ttft = _metric(metrics, "time_to_first_token", seconds=True)
    if _metric(metrics, "usage_completion_tokens") is not None:
        if latency is None or ttft is None or output is None or output < 2:
            return None
        return (latency - ttft) / (output - 1)
    return _metric(metrics, "inter_token_latency", seconds=True)


def read(path: Path) -> list[Benchmark]:
    requests = []
    lines = inputs.read_text(path, ObservedError, "AIPerf profile_export.jsonl").splitlines()
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            raise ObservedError(path, n, None, "not a JSON record (profile_export.jsonl has one per line)") from None
        meta = rec.get("metadata") if isinstance(rec, dict) else None
        if not isinstance(meta, dict):
            raise ObservedError(path, n, "metadata", "each record needs its metadata")
        if meta.get("benchmark_phase", "profiling") != "profiling":
            continue
        metrics = rec.get("metrics") if isinstance(rec.get("metrics"), dict) else {}
        error = rec.get("error")
        start, end = number(meta.get("request_start_ns")), number(meta.get("request_end_ns"))
        latency = _metric(metrics, "request_latency", seconds=True)
        if latency is None and start is not None and end is not None:
            latency = (end - start) * 1e-9
        ok = not error and not meta.get("was_cancelled") and latency is not None
        message = ""
        if not ok:
            message = (f"{error.get('type') or 'error'}: {error.get('message') or ''}".strip()
                       if isinstance(error, dict) else "cancelled" if meta.get("was_cancelled") else "failed")
        output = _first(metrics, "usage_completion_tokens", "output_sequence_length", "output_token_count")
        prompt = _first(metrics, "usage_prompt_tokens", "input_sequence_length", "error_isl")
        rid = meta.get("x_request_id") or meta.get("session_num", n)
        requests.append(Request(
            id=str(rid), start=None if start is None else start * 1e-9, latency=latency if ok else None, ok=ok,
            error=message, status=count(error.get("code")) if isinstance(error, dict) else None,
            ttft=_metric(metrics, "time_to_first_token", seconds=True) if ok else None,
            itl=_itl(metrics, latency, output) if ok else None,
            prompt_tokens=count(prompt), output_tokens=count(output)))
    if requests and all(r.start is None and r.latency is None for r in requests):
        raise ObservedError(path, None, "metadata.request_start_ns", "no request has a start time or a latency: "
                            "expected AIPerf's profile_export.jsonl (metadata.request_start_ns, request_end_ns, "
                            "metrics.request_latency)")
    return [Benchmark(requests, {})]
