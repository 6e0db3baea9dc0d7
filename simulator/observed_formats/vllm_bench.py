"""``vllm bench serve --save-result --save-detailed`` JSON (vLLM's serving benchmark,
``vllm/benchmarks/serve.py``; ``benchmarks/benchmark_serving.py`` in older releases).

One JSON object: the run's settings and aggregate figures (``backend``, ``model_id``,
``request_rate``, ``duration``, ``completed``, ``failed``, ``request_throughput``,
``mean_ttft_ms``, ``p99_e2el_ms`` ...) and per-request lists in request order:
``input_lens``, ``output_lens`` (0 for a failed request), ``ttfts`` (s), ``itls`` (a list
of inter-token gaps per request, s), ``errors`` (``""`` for a success), ``start_times``
(``time.perf_counter()``, s), ``generated_texts`` and, in vLLM 0.11 and later,
``latencies`` (end-to-end, s; ``e2els`` in some earlier builds) and ``queue_times``.
Without ``--save-detailed`` a current release keeps ``latencies`` and ``queue_times`` but
drops the other lists; such a file is refused (it has no errors or start times to tell
what each request did). ``--append-result`` writes one such object per line: each line is
a benchmark (``FILE#K``).

A request succeeded when its error is empty and it has a first token (or, for a request
without one, a latency): vLLM writes ``ttft = latency = 0`` for a failure whose reason was
empty. Its latency is ``latencies`` (or ``e2els``), else ``ttft + sum(itls)``; its
inter-token latency the mean of its ``itls``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simulator import inputs as reading
from simulator.errors import ObservedError
from simulator.observed_formats._common import Benchmark, Request, count, number

#: the keys of the per-request latency list, newest first
LATENCY_KEYS = ("latencies", "e2els")


def looks_like(path: Path, head: str) -> bool:
    text = head.lstrip()
    return text.startswith("{") and '"request_throughput"' in head and (
        '"backend"' in head or '"model_id"' in head)


def _objects(path: Path) -> list[Any]:
    """The JSON objects of the file: one, or one per line (``--append-result``)."""
    text = reading.read_text(path, ObservedError, "vllm bench result")
    try:
        return [reading.check_depth(json.loads(text), path, ObservedError)]
    except ValueError:
        pass
    except RecursionError:
        raise ObservedError(path, None, None, "not a vllm bench result (JSON nested too deeply)") from None
    objects = []
    for n, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            raise ObservedError(path, n, None, "not JSON: a vllm bench result is one JSON object, or one "
                                "per line with --append-result") from None
        objects.append(reading.check_depth(obj, path, ObservedError))
    return objects


def _benchmark(path: Path, k: int | None, data: Any) -> Benchmark:
    where = k  # record number in errors: the line of an appended file
    if not isinstance(data, dict):
        raise ObservedError(path, where, None, "a vllm bench result must be a JSON object")
    ttfts = data.get("ttfts")
    latency_key = next((key for key in LATENCY_KEYS if isinstance(data.get(key), list)), None)
    if not isinstance(ttfts, list) or not isinstance(data.get("errors"), list):
        missing = "ttfts" if not isinstance(ttfts, list) else "errors"
        raise ObservedError(path, where, missing, "no per-request results (expected the lists ttfts, itls, "
                            "errors, start_times, input_lens, output_lens of `vllm bench serve --save-result "
                            "--save-detailed`)")
    n = len(ttfts)

    def column(key: str | None) -> list[Any]:
        values = data.get(key) if key else None
        if values is None:
            return [None] * n
        if not isinstance(values, list) or len(values) != n:
            raise ObservedError(path, where, key, f"must be a list of {n} entries (one per request), like ttfts")
        return values

    itls, latencies, starts = column("itls"), column(latency_key), column("start_times")
    errors, inputs, outputs = column("errors"), column("input_lens"), column("output_lens")
    requests = []
    for i in range(n):
        error = errors[i] or ""
        ttft, latency = number(ttfts[i]), number(latencies[i])
        gaps = [g for g in (number(x) for x in itls[i]) if g is not None] if isinstance(itls[i], list) else []
        if latency is None and ttft is not None:
            latency = ttft + sum(gaps)
        ok = not error and ((ttft is not None and ttft > 0) or (latency is not None and latency > 0))
        requests.append(Request(id=str(i), start=number(starts[i]), latency=latency if ok else None, ok=ok,
                                error=str(error) or ("no first token" if not ok else ""), ttft=ttft if ok else None,
                                itl=sum(gaps) / len(gaps) if ok and gaps else None,
                                prompt_tokens=count(inputs[i]), output_tokens=count(outputs[i]) if ok else None))
    meta = {key: data.get(key) for key in ("backend", "model_id", "request_rate", "max_concurrency", "date")
            if data.get(key) is not None}
    rate = data.get("request_rate")
    label = f"rate {rate}" if rate is not None else ""
    if data.get("max_concurrency") is not None:
        label = f"{label}, concurrency {data['max_concurrency']}".lstrip(", ")
    return Benchmark(requests, meta, label)


def read(path: Path) -> list[Benchmark]:
    objects = _objects(path)
    if len(objects) == 1:
        return [_benchmark(path, None, objects[0])]
    return [_benchmark(path, k, obj) for k, obj in enumerate(objects)]
