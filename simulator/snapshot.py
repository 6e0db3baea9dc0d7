"""Snapshots of a running system: what waits and what runs at one instant, from any source.

A replay normally starts from an empty system. A snapshot lets it start from a live
server's state instead (``simctl replay --from-state S.json``, :func:`simulator.replay`'s
``initial_state``): the prompts waiting in the queues and the batches running on the GPUs
at the instant it was taken. Every source gives the same structure, written as JSON
(``"format": "simctl-snapshot/1"``)::

    {"format": "simctl-snapshot/1",
     "taken_at": 31.5,                  # seconds on the source's clock (null: not known)
     "source": {"kind": "serve-state", "location": "http://127.0.0.1:8000"},
     "waiting": [                       # one entry per queue (or task)
        {"task": "infobench", "queue": "infobench", "count": 3,
         "prompts": [{"age_s": 4.2, "prompt_tokens": 96, "max_tokens": 512}, ...]}],
     "running": [                       # one entry per batch (or per engine's requests)
        {"task": "infobench", "queue": "infobench", "gpu": 0, "size": 4, "started": true,
         "elapsed_s": 1.5, "prompts": [{"age_s": 9.0, "prompt_tokens": 80, "max_tokens": 512}, ...]}],
     "kv_cache_usage": null,            # share of KV cache blocks in use (0-1)
     "prefix_cache_hit_rate": null,     # prefix cache hits / queries since the server started
     "unknown": ["..."]}                # what this source cannot know, in words

Any field a source cannot know is ``null`` and ``unknown`` says so: a waiting entry's
``prompts`` (ages and tokens; ``count`` is always known), a running entry's ``elapsed_s``,
``prompts``, ``gpu``, a ``task``. Sources (:func:`take_snapshot`):

* ``simctl serve``'s ``GET /state`` (:func:`from_serve_state`): everything, per prompt;
* ``simctl serve``'s ``GET /metrics`` (:func:`from_serve_metrics`): waiting counts per queue,
  running batches and their prompts per GPU; no ages, tokens, elapsed service, or task of a
  running batch;
* vLLM's ``/metrics`` (:func:`from_vllm_metrics`): requests running and waiting per model,
  KV cache usage, prefix cache hit rate; no ages, tokens, elapsed service or task;
* a run folder of ``simctl load`` at an instant (:func:`from_run_folder`): the prompts sent
  before it and not answered by it, with their ages and tokens; the client cannot see
  whether each waited or ran, so all are counted as waiting.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.errors import SnapshotError
from simulator.profile.spec import shown
from simulator.settings import LARGEST_COUNT, LARGEST_GPUS, LARGEST_TOKENS

FORMAT = "simctl-snapshot/1"
SOURCES = ("serve-state", "serve-metrics", "vllm-metrics", "run-folder")


@dataclass(frozen=True)
class StatePrompt:
    """One prompt of a snapshot: how long ago it arrived and its lengths (``None``: unknown)."""

    age_s: float | None = None
    prompt_tokens: int | None = None
    max_tokens: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"age_s": self.age_s, "prompt_tokens": self.prompt_tokens, "max_tokens": self.max_tokens}


@dataclass(frozen=True)
class Waiting:
    """Prompts waiting in one queue (or for one task): ``count`` always; ``prompts``, oldest
    first, where the source knows them (then ``len(prompts) == count``)."""

    task: str | None
    count: int
    queue: str | None = None
    prompts: tuple[StatePrompt, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "queue": self.queue, "count": self.count,
                "prompts": None if self.prompts is None else [p.to_dict() for p in self.prompts]}


@dataclass(frozen=True)
class Running:
    """One batch formed and not finished: ``size`` prompts; ``started`` false for a batch
    formed but still waiting for its GPU; ``elapsed_s`` its service so far (``None``:
    unknown); ``prompts`` where the source knows them."""

    task: str | None
    size: int
    queue: str | None = None
    gpu: int | None = None
    started: bool = True
    elapsed_s: float | None = None
    prompts: tuple[StatePrompt, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "queue": self.queue, "gpu": self.gpu, "size": self.size, "started": self.started,
                "elapsed_s": self.elapsed_s,
                "prompts": None if self.prompts is None else [p.to_dict() for p in self.prompts]}


@dataclass(frozen=True)
class Snapshot:
    """What waited and ran at one instant (module docstring)."""

    source_kind: str
    location: str
    taken_at: float | None = None
    waiting: tuple[Waiting, ...] = ()
    running: tuple[Running, ...] = ()
    kv_cache_usage: float | None = None
    prefix_cache_hit_rate: float | None = None
    unknown: tuple[str, ...] = ()
    path: str | None = field(default=None, compare=False)

    @property
    def waiting_prompts(self) -> int:
        return sum(w.count for w in self.waiting)

    @property
    def running_prompts(self) -> int:
        return sum(r.size for r in self.running)

    def to_dict(self) -> dict[str, Any]:
        """The snapshot file's JSON data."""
        return {"format": FORMAT, "taken_at": self.taken_at,
                "source": {"kind": self.source_kind, "location": self.location},
                "waiting": [w.to_dict() for w in self.waiting], "running": [r.to_dict() for r in self.running],
                "kv_cache_usage": self.kv_cache_usage, "prefix_cache_hit_rate": self.prefix_cache_hit_rate,
                "unknown": list(self.unknown)}


# -- the file ------------------------------------------------------------------------------
def save_snapshot(snapshot: Snapshot, path: str | Path, force: bool = False) -> None:
    """Write ``snapshot`` as JSON to ``path`` (refused if it exists, unless ``force``)."""
    from simulator.outputs import open_output

    with open_output(path, force=force) as fh:
        json.dump(snapshot.to_dict(), fh, indent=2)
        fh.write("\n")


def load_snapshot(path: str | Path) -> Snapshot:
    """Read and check a snapshot file; a :class:`SnapshotError` names the file and the field
    at fault (``waiting[2].prompts[0].age_s``)."""
    from simulator import inputs

    return snapshot_of(inputs.read_json(path, SnapshotError, "snapshot"), path)


def snapshot_of(data: Any, path: str | Path | None = None) -> Snapshot:
    """The :class:`Snapshot` of a snapshot file's JSON ``data`` (checked as
    :func:`load_snapshot` checks a file)."""
    reader = _Reader(path)
    if not isinstance(data, dict):
        raise SnapshotError(path, None, None, f"must be a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise SnapshotError(path, None, "format", f"must be {FORMAT!r}, got {data.get('format')!r}")
    source = data.get("source")
    if not isinstance(source, dict):
        raise SnapshotError(path, None, "source", "must be an object with 'kind' and 'location'")
    kind = source.get("kind")
    if kind not in SOURCES:
        raise SnapshotError(path, None, "source.kind", f"must be one of {', '.join(SOURCES)}, got {kind!r}")
    location = source.get("location")
    if not isinstance(location, str):
        raise SnapshotError(path, None, "source.location", f"must be a string, got {location!r}")
    waiting = tuple(reader.waiting(w, f"waiting[{i}]") for i, w in enumerate(reader.array(data, "waiting")))
    running = tuple(reader.running(r, f"running[{i}]") for i, r in enumerate(reader.array(data, "running")))
    unknown = reader.array(data, "unknown")
    for i, u in enumerate(unknown):
        if not isinstance(u, str):
            raise SnapshotError(path, None, f"unknown[{i}]", f"must be a string, got {u!r}")
    return Snapshot(kind, location, reader.number(data, "taken_at", "taken_at", None),
                    waiting, running, reader.share(data, "kv_cache_usage"), reader.share(data, "prefix_cache_hit_rate"),
                    tuple(unknown), None if path is None else str(path))


class _Reader:
    """Checks of a snapshot's fields, each error naming the file and the field."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = path

    def fail(self, name: str, message: str) -> SnapshotError:
        return SnapshotError(self.path, None, name, message)

    def array(self, data: dict, key: str) -> list:
        value = data.get(key, [])
        if not isinstance(value, list):
            raise self.fail(key, f"must be a list, got {type(value).__name__}")
        return value

    def number(self, data: dict, key: str, name: str, low: float | None = 0.0) -> float | None:
        value = data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(name, f"must be a number or null, got {shown(value)}")
        try:
            x = float(value)
        except OverflowError:  # an integer past the largest float
            raise self.fail(name, f"is too large for a number ({shown(value)})") from None
        if not math.isfinite(x):
            raise self.fail(name, f"must be a number or null, got {value!r}")
        if low is not None and x < low:
            raise self.fail(name, f"must be at least {low:g}, got {shown(value)}")
        return x

    def share(self, data: dict, key: str) -> float | None:
        value = self.number(data, key, key)
        if value is not None and value > 1:
            raise self.fail(key, f"must be a share between 0 and 1, got {value!r}")
        return value

    def count(self, data: dict, key: str, name: str, low: int = 0) -> int:
        # each of them becomes a prompt of the run: as many as a batch may hold rows
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= LARGEST_COUNT:
            raise self.fail(name, f"must be a whole number from {low} to {LARGEST_COUNT:,}, got {shown(value)}")
        return value

    def tokens(self, data: dict, key: str, name: str) -> int | None:
        value = data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= LARGEST_TOKENS:
            raise self.fail(name, f"must be a whole number from 1 to {LARGEST_TOKENS:,} or null, got {shown(value)}")
        return value

    def text(self, data: dict, key: str, name: str) -> str | None:
        value = data.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            raise self.fail(name, f"must be a non-empty string or null, got {shown(value)}")
        return value

    def entry(self, data: Any, name: str) -> dict:
        if not isinstance(data, dict):
            raise self.fail(name, f"must be an object, got {type(data).__name__}")
        return data

    def prompts(self, data: dict, name: str, count: int) -> tuple[StatePrompt, ...] | None:
        value = data.get("prompts")
        if value is None:
            return None
        if not isinstance(value, list):
            raise self.fail(f"{name}.prompts", f"must be a list or null, got {type(value).__name__}")
        if len(value) != count:
            raise self.fail(f"{name}.prompts", f"has {len(value)} prompt(s) but the entry counts {count}")
        out = []
        for i, p in enumerate(value):
            where = f"{name}.prompts[{i}]"
            p = self.entry(p, where)
            out.append(StatePrompt(self.number(p, "age_s", f"{where}.age_s"),
                                   self.tokens(p, "prompt_tokens", f"{where}.prompt_tokens"),
                                   self.tokens(p, "max_tokens", f"{where}.max_tokens")))
        return tuple(out)

    def waiting(self, data: Any, name: str) -> Waiting:
        data = self.entry(data, name)
        count = self.count(data, "count", f"{name}.count")
        return Waiting(self.text(data, "task", f"{name}.task"), count, self.text(data, "queue", f"{name}.queue"),
                       self.prompts(data, name, count))

    def running(self, data: Any, name: str) -> Running:
        data = self.entry(data, name)
        size = self.count(data, "size", f"{name}.size", low=1)
        gpu = data.get("gpu")
        if gpu is not None and (isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < LARGEST_GPUS):
            raise self.fail(f"{name}.gpu", f"must be a GPU index (0, 1, ...) or null, got {shown(gpu)}")
        started = data.get("started", True)
        if not isinstance(started, bool):
            raise self.fail(f"{name}.started", f"must be true or false, got {started!r}")
        return Running(self.text(data, "task", f"{name}.task"), size, self.text(data, "queue", f"{name}.queue"),
                       gpu, started, self.number(data, "elapsed_s", f"{name}.elapsed_s"),
                       self.prompts(data, name, size))


# -- the sources -----------------------------------------------------------------------------
def from_serve_state(data: Any, location: str) -> Snapshot:
    """The snapshot of ``simctl serve``'s ``GET /state`` answer ``data``
    (:meth:`simulator.serve.runtime.Runtime.state`): it is this module's structure already,
    every field known."""
    if not isinstance(data, dict):
        raise SnapshotError(location, None, None, "the /state answer is not a JSON object")
    data = dict(data, format=FORMAT, source={"kind": "serve-state", "location": location})
    return snapshot_of(data, location)


def _families(text: str, location: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The samples of a Prometheus text exposition, by sample name (a counter's ``_total``
    suffix dropped, as its family is named)."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                name = s.name[:-6] if s.name.endswith("_total") else s.name
                samples.setdefault(name, []).append((dict(s.labels), float(s.value)))
    except (ValueError, TypeError, IndexError) as exc:
        raise SnapshotError(location, None, None, f"not a Prometheus text exposition: {exc}") from None
    return samples


def from_serve_metrics(text: str, location: str, taken_at: float | None = None) -> Snapshot:
    """The snapshot of ``simctl serve``'s Prometheus ``/metrics`` text: per queue its waiting
    count (``simctl_queue_depth``; the queue ``task`` or ``task@i`` names the task), per GPU
    its running batches (``simctl_gpu_running_batches``) holding its outstanding prompts
    (``simctl_gpu_outstanding_prompts``, shared evenly, the remainder to the first)."""
    samples = _families(text, location)
    if "simctl_queue_depth" not in samples and "simctl_gpu_running_batches" not in samples:
        raise SnapshotError(location, None, "simctl_queue_depth", "not simctl serve's metrics: no such metric")
    waiting: list[Waiting] = []
    for labels, value in samples.get("simctl_queue_depth", []):
        queue = labels.get("queue", "")
        if value >= 1:
            waiting.append(Waiting(_task_of_queue(queue), int(value), queue or None))
    outstanding = {labels.get("gpu"): int(v) for labels, v in samples.get("simctl_gpu_outstanding_prompts", [])}
    running: list[Running] = []
    for labels, value in samples.get("simctl_gpu_running_batches", []):
        batches, gpu = int(value), labels.get("gpu")
        prompts = outstanding.get(gpu, 0)
        if batches < 1 or prompts < 1:
            continue
        sizes = [prompts // batches] * batches
        sizes[0] += prompts - sum(sizes)
        index = int(gpu) if gpu is not None and gpu.isdigit() else None
        running.extend(Running(None, s, None, index) for s in sizes if s > 0)
    return Snapshot("serve-metrics", location, taken_at, tuple(waiting), tuple(running), unknown=(
        "waiting[].prompts: ages and tokens (the metrics count waiting prompts only)",
        "running[].task, running[].elapsed_s, running[].prompts: the metrics give per GPU only its running batches "
        "and outstanding prompts (prompts formed into a batch that waits for the GPU are counted as running)",
        "kv_cache_usage, prefix_cache_hit_rate: not modelled by simctl serve",
        "taken_at: the metrics carry no clock"))


def _task_of_queue(queue: str) -> str | None:
    """The task a queue of simctl serve belongs to (``infobench@1`` → ``infobench``)."""
    task = queue.split("@")[0].split("#")[0].split("~")[0].split("/")[0]
    return task or None


def from_vllm_metrics(text: str, location: str, taken_at: float | None = None) -> Snapshot:
    """The snapshot of a vLLM server's Prometheus ``/metrics`` text, per ``model_name``:
    ``vllm:num_requests_waiting`` waiting, ``vllm:num_requests_running`` running (as one
    batch: vLLM batches continuously, its requests joined at different instants), KV cache
    usage (``vllm:kv_cache_usage_perc``, or the older ``vllm:gpu_cache_usage_perc``; the
    largest over models), and the prefix cache hit rate since the server started
    (``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``, the older
    ``vllm:gpu_prefix_cache_hit_rate``). A running request's elapsed service, a request's
    age and tokens, and its task are not in the metrics; the model name is the entry's
    ``queue``."""
    samples = _families(text, location)
    if "vllm:num_requests_running" not in samples and "vllm:num_requests_waiting" not in samples:
        raise SnapshotError(location, None, "vllm:num_requests_running", "not vLLM's metrics: no such metric")

    def per_model(name: str) -> dict[str | None, float]:
        out: dict[str | None, float] = {}
        for labels, value in samples.get(name, []):
            model = labels.get("model_name")
            out[model] = out.get(model, 0.0) + value
        return out

    # the task is the replay's to name (--state-task): a model serves whatever tasks it is sent
    waiting = tuple(Waiting(None, int(v), m) for m, v in per_model("vllm:num_requests_waiting").items() if v >= 1)
    running = tuple(Running(None, int(v), m) for m, v in per_model("vllm:num_requests_running").items() if v >= 1)
    usage = [v for _, v in samples.get("vllm:kv_cache_usage_perc", []) or samples.get("vllm:gpu_cache_usage_perc", [])]
    kv = min(max(usage), 1.0) if usage else None
    hits, queries = sum(per_model("vllm:prefix_cache_hits").values()), sum(per_model("vllm:prefix_cache_queries").values())
    rate: float | None = hits / queries if queries > 0 else None
    if rate is None and samples.get("vllm:gpu_prefix_cache_hit_rate"):
        rate = max(v for _, v in samples["vllm:gpu_prefix_cache_hit_rate"])
    unknown = ["waiting[].prompts, running[].prompts: ages and tokens (vLLM's metrics count requests only)",
               "running[].elapsed_s: how long each running request has run",
               "task, running[].gpu: vLLM's metrics are per model (the entry's queue is the model name)",
               "taken_at: the metrics carry no clock"]
    if kv is None:
        unknown.append("kv_cache_usage: no vllm:kv_cache_usage_perc metric")
    if rate is None:
        unknown.append("prefix_cache_hit_rate: no prefix cache queries yet")
    return Snapshot("vllm-metrics", location, taken_at, waiting, running, kv, rate, tuple(unknown))


def from_run_folder(folder: str | Path, at: float) -> Snapshot:
    """The snapshot, ``at`` seconds (the trace's) into the run of ``simctl load`` in
    ``folder``: the prompts whose call was sent by then and not answered by then (its
    ``requests.parquet``; instants times the run's ``time_scale``), per task, oldest first,
    each aged from its send. The client cannot see whether a prompt waited or ran: all are
    waiting here (a replay from it serves them in full: an upper bound)."""
    import numpy as np

    from simulator import inputs
    from simulator.errors import ObservedError
    from simulator.live.runfolder import REQUESTS_FILE
    from simulator.observed import SUMMARY_FILE, _load_settings

    folder = Path(folder)
    if not folder.is_dir():
        raise SnapshotError(folder, None, None, "not a run folder of simctl load (no such folder)")
    if not math.isfinite(at) or at < 0:
        raise SnapshotError(folder, None, "at", f"must be a number of seconds of at least 0, got {at!r}")
    scale = 1.0
    summary = folder / SUMMARY_FILE
    if summary.exists():
        try:
            scale, _ = _load_settings(inputs.read_json(summary, SnapshotError, "run summary"), summary)
        except ObservedError as exc:
            raise SnapshotError(exc.path, exc.record, exc.field, exc.message) from None
    path = folder / REQUESTS_FILE
    if not path.exists():
        raise SnapshotError(folder, None, None, f"not a run folder of simctl load: no {REQUESTS_FILE}")
    table = inputs.read_parquet(path, SnapshotError, "request log").to_pandas()
    for column in ("call_id", "task", "sent_at", "done_at", "prompt_tokens"):
        if column not in table.columns:
            raise SnapshotError(path, None, column, "not a request log of simctl load: no such column")
    sent = table["sent_at"].to_numpy(float) * scale
    done = table["done_at"].to_numpy(float) * scale
    inside = (sent <= at) & ~(done <= at)  # a prompt never answered (NaN) is still in flight
    rows = table[inside].assign(age_s=at - sent[inside]).sort_values("age_s", ascending=False, kind="stable")
    waiting = []
    for task, group in rows.groupby("task", sort=True):
        tokens = group["prompt_tokens"].to_numpy(float)
        waiting.append(Waiting(str(task), len(group), str(task), tuple(
            StatePrompt(round(float(a), 9), int(t) if np.isfinite(t) and t >= 1 else None, None)
            for a, t in zip(group["age_s"], tokens, strict=True))))
    return Snapshot("run-folder", str(folder), float(at), tuple(waiting), (), unknown=(
        "running: the client sees a prompt's send and answer only, so the prompts in flight are all counted "
        "as waiting (a replay from this snapshot serves them in full)",
        "waiting[].prompts[].max_tokens: not in the request log (the task's default applies)",
        "kv_cache_usage, prefix_cache_hit_rate: not seen by the client"))


def take_snapshot(source: str | Path, at: float | None = None, api_key: str | None = None,
                  timeout: float = 10.0, transport: Any = None) -> Snapshot:
    """A snapshot of ``source``: a run folder of ``simctl load`` (``at``: seconds into the
    run, needed), a saved metrics text file (``.txt``/``.prom``: simctl's or vLLM's, told by
    its metric names), or a server's base URL: ``simctl serve``'s ``/state`` where it has
    one, else its ``/metrics`` (simctl's or vLLM's). ``api_key``: sent as a bearer token;
    ``transport``: an ``httpx`` transport to send through (a test's)."""
    text = str(source)
    if not text.startswith(("http://", "https://")):
        path = Path(text)
        if path.is_dir():
            if at is None:
                raise SnapshotError(path, None, "at", "a run folder needs --at SECONDS (the instant of the run)")
            return from_run_folder(path, at)
        if at is not None:
            raise SnapshotError(path, None, "at", "--at applies to a run folder only")
        if not path.exists():
            raise SnapshotError(path, None, None, "no such run folder, metrics file or URL")
        from simulator import inputs

        return _from_metrics_text(inputs.read_text(path, SnapshotError, "metrics text file"), str(path))
    if at is not None:
        raise SnapshotError(text, None, "at", "--at applies to a run folder only")
    import httpx

    base = text.rstrip("/")
    for suffix in ("/state", "/metrics"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx.Client(timeout=timeout, headers=headers, transport=transport) as client:
            reply = client.get(base + "/state")
            if reply.status_code == 200 and reply.headers.get("content-type", "").startswith("application/json"):
                return from_serve_state(reply.json(), base)
            if reply.status_code == 401:
                raise SnapshotError(base, None, None, "the server needs an API key (--api-key)")
            reply = client.get(base + "/metrics")
    except httpx.HTTPError as exc:
        raise SnapshotError(base, None, None, f"cannot be reached: {type(exc).__name__}: {exc}") from None
    if reply.status_code != 200:
        raise SnapshotError(base + "/metrics", None, None, f"answered HTTP {reply.status_code}")
    return _from_metrics_text(reply.text, base)


def _from_metrics_text(text: str, location: str) -> Snapshot:
    if "vllm:num_requests_" in text:
        return from_vllm_metrics(text, location)
    return from_serve_metrics(text, location)
