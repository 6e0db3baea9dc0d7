"""``vllm bench serve --save-result`` JSON (vLLM's serving benchmark, also
``benchmarks/benchmark_serving.py``).

One JSON object: the run's settings and aggregate figures (``backend``, ``model_id``,
``request_rate``, ``duration``, ``completed``, ``request_throughput``, ``mean_ttft_ms`` ...)
and, with ``--save-detailed``, per-request lists in request order: ``input_lens``,
``output_lens``, ``ttfts`` (s), ``itls`` (a list of inter-token gaps per request, s),
``generated_texts``, ``errors`` (``""`` for a success) and, in recent versions,
``start_times`` (a monotonic clock, s) and ``e2els`` (end-to-end latency, s). A request's
latency is its ``e2els`` entry, else ``ttft + sum(itls)``. Without ``--save-detailed`` the
file holds no per-request figures and is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simulator import inputs as reading
from simulator.errors import ObservedError
from simulator.observed_formats._common import Request, count, number


def looks_like(path: Path, head: str) -> bool:
    text = head.lstrip()
    return text.startswith("{") and '"request_throughput"' in head and (
        '"backend"' in head or '"model_id"' in head)


def read(path: Path) -> tuple[list[Request], dict[str, Any]]:
    data = reading.read_json(path, ObservedError, "vllm bench result")
    if not isinstance(data, dict):
        raise ObservedError(path, None, None, "a vllm bench result must be a JSON object")
    ttfts = data.get("ttfts")
    if not isinstance(ttfts, list):
        raise ObservedError(path, None, "ttfts", "no per-request figures: save the result with "
                            "`vllm bench serve --save-result --save-detailed`")
    n = len(ttfts)

    def column(key: str) -> list[Any]:
        values = data.get(key)
        if values is None:
            return [None] * n
        if not isinstance(values, list) or len(values) != n:
            raise ObservedError(path, None, key, f"must be a list of {n} entries (one per request), like ttfts")
        return values

    itls, e2els, starts = column("itls"), column("e2els"), column("start_times")
    errors, inputs, outputs = column("errors"), column("input_lens"), column("output_lens")
    requests = []
    for i in range(n):
        error = errors[i] or ""
        ttft = number(ttfts[i])
        latency = number(e2els[i])
        if latency is None and ttft is not None:
            gaps = itls[i] if isinstance(itls[i], list) else []
            latency = ttft + sum(x for x in gaps if number(x) is not None)
        ok = not error and ttft is not None and ttft > 0
        requests.append(Request(id=str(i), start=number(starts[i]), latency=latency if ok else None, ok=ok,
                                error=str(error) or ("no first token" if not ok else ""), ttft=ttft if ok else None,
                                prompt_tokens=count(inputs[i]), output_tokens=count(outputs[i])))
    meta = {key: data.get(key) for key in ("backend", "model_id", "request_rate", "max_concurrency", "date")
            if data.get(key) is not None}
    return requests, meta
