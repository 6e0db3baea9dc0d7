"""What the readers of other tools' results share: one request as read, and the observed
run (and trace) a list of them makes."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from simulator.errors import ObservedError, SimctlWarning

if TYPE_CHECKING:
    from simulator.scenario import Compositions
    from simulator.trace.model import Trace

#: seconds per unit of a duration as the tools write them
UNITS = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


@dataclass(frozen=True)
class Request:
    """One request of another tool's results. Times in seconds; ``start`` on any clock (the
    run's calls start at the earliest), ``None`` where the file does not say."""

    id: str
    start: float | None
    latency: float | None
    ok: bool
    error: str = ""
    status: int | None = None
    ttft: float | None = None
    #: mean gap between successive output tokens after the first (s)
    itl: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    prompt_text: str | None = None


@dataclass(frozen=True)
class ToolRun:
    """A run read from another tool's results, in the terms of an observed run: ``calls``
    has the columns of :attr:`simulator.observed.ObservedRun.calls` plus, per request,
    ``ttft_s`` (time to first token), ``itl_s`` (mean inter-token latency),
    ``prompt_tokens`` and ``output_tokens`` (NaN where the file does not say)."""

    name: str
    path: str
    calls: pd.DataFrame
    meta: dict[str, Any]
    trace: Trace


@dataclass(frozen=True)
class Benchmark:
    """One benchmark of a result file: its requests and what the file says of it (``label``:
    how the tool names it, e.g. its rate; ``meta``: settings worth keeping)."""

    requests: list[Request]
    meta: dict[str, Any]
    label: str = ""


@dataclass(frozen=True)
class ResultFormat:
    """A registered format: how to tell its file (``looks_like(path, head)``) and read it
    (``read(path)``: every benchmark the file holds, in file order; most hold one, a
    GuideLLM sweep or an appended ``vllm bench serve`` file several)."""

    name: str
    looks_like: Callable[[Path, str], bool]
    read: Callable[[Path], list[Benchmark]]


def number(value: Any) -> float | None:
    """``value`` as a finite float, else ``None``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def count(value: Any) -> int | None:
    x = number(value)
    return None if x is None or x < 0 else int(x)


def build_run(path: Path, fmt: str, requests: list[Request], meta: dict[str, Any], timeout: float,
              compositions: Compositions | None = None, name: str | None = None,
              shown_path: str | None = None) -> ToolRun:
    """The observed run of ``requests``: one call of one prompt each, in order of start.

    A request's task is its prompt's by the keyword rules when the file holds the prompt
    text, else ``unknown``. Its call arrives at its start time, counted from the earliest;
    a file without start times gives every call the instant 0 (with a warning: its latency
    figures hold, but a replay of its trace is not the run it measured). ``name`` and
    ``shown_path`` (default: from ``path``) name one benchmark of a file of several.
    """
    from simulator.scenario import Compositions
    from simulator.trace.classify import DEFAULT_CLASSIFIER, UNKNOWN
    from simulator.trace.model import Call, Prompt, Trace

    if not requests:
        raise ObservedError(path, None, None, f"a {fmt} result with no requests")
    compositions = compositions or Compositions()
    starts = [r.start for r in requests]
    known = all(s is not None for s in starts)
    if not known:
        warnings.warn(SimctlWarning(f"{path}: the {fmt} result has no request start times; every call "
                                    "is taken to arrive at 0 s (latencies hold, arrivals do not)"), stacklevel=3)
    origin = min(s for s in starts if s is not None) if known else 0.0
    order = sorted(range(len(requests)), key=lambda i: (starts[i] - origin) if known else 0.0)  # type: ignore[operator]
    rows, calls = [], []
    for ci, i in enumerate(order):
        r = requests[i]
        t = float(r.start - origin) if known else 0.0  # type: ignore[operator]
        task = DEFAULT_CLASSIFIER.classify(r.prompt_text) if r.prompt_text else UNKNOWN
        calls.append(Call(r.id, t, (Prompt(task, r.prompt_tokens, r.output_tokens or None, None),)))
        done = t + r.latency if r.latency is not None else np.nan
        rows.append({"call_id": r.id, "call_index": ci, "arrived_at": t, "prompts": 1, "tasks": task,
                     "composition": compositions.classify(frozenset({task})), "sent_at": t,
                     "duration_s": np.nan if r.latency is None else r.latency, "done_at": done,
                     "status_code": pd.NA if r.status is None else r.status, "ok": bool(r.ok and r.latency is not None),
                     "error": "" if r.ok else (r.error or "failed"),
                     "ttft_s": np.nan if r.ttft is None else r.ttft,
                     "itl_s": np.nan if r.itl is None else r.itl,
                     "prompt_tokens": np.nan if r.prompt_tokens is None else float(r.prompt_tokens),
                     "output_tokens": np.nan if r.output_tokens is None else float(r.output_tokens)})
    ids = [c.id for c in calls]
    if len(set(ids)) != len(ids):
        raise ObservedError(path, None, None, f"the {fmt} result has two requests with one id")
    frame = pd.DataFrame(rows)
    frame["latency_s"] = np.where(frame["ok"], frame["duration_s"], np.nan)
    frame["latency_censored_s"] = np.where(frame["ok"], np.minimum(frame["duration_s"], timeout), timeout)
    source = shown_path or str(path)
    trace = Trace(tuple(calls), meta={"format": fmt, "source_results": source}, source=source)
    if name is None:
        name = path.stem if path.name != "profile_export.jsonl" else path.parent.name
    return ToolRun(name=name, path=shown_path or str(path), calls=frame,
                   meta={"format": fmt, "requests": len(requests), **meta}, trace=trace)
