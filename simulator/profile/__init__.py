"""Service profiles: per task, where it runs and how long a batch of its prompts takes.

A profile is JSON (``simctl-profile/1``)::

    {"format": "simctl-profile/1", "name": str, "source": str,
     "describes": str, "answers": str,                                  # optional
     "tasks": {TASK: {"resource": "gpu" | "cpu", "prompt_tokens": int, "max_tokens": int,
                      "service": {"kind": KIND, ...},
                      "tokens_per_iteration": 1.0,                     # optional
                      "host_fraction": 0.0,                            # optional
                      "kv_cache": {"blocks": int} | {"memory_gib": float,  # optional
                                   "bytes_per_token": int}}}}

``describes`` says which real system the profile stands for and ``answers`` which question it
is fit to answer (short texts; :mod:`simulator.profile.identity` reads them with the rest of
the profile's identity). ``source`` says where its numbers come from.
``prompt_tokens``/``max_tokens`` are the task's defaults for prompts whose trace gives none.
``tokens_per_iteration`` (for kinds that price whole batches, ``distribution`` and ``table``)
says how many tokens a row gains per decoding iteration, so that continuous batching can
derive an iteration's cost from a batch's (see :mod:`simulator.profile.iteration`).
``kv_cache`` is the KV-cache capacity one engine has: blocks, or the memory left for the
cache and the cache bytes one token takes (2 x layers x KV heads x head dim x dtype bytes).
``host_fraction`` (0 to 1) is the share of a batch's service time spent in host code that
holds the process's interpreter lock; it matters only in a scenario with ``host_lock``,
where one process drives every GPU and their batches compete for that lock
(:class:`simulator.model.resources.HostLock`).
``service`` is one of the registered kinds (:mod:`simulator.profile.kinds`); every kind
answers :meth:`Profile.batch_service_time`. An ``iteration`` or ``spec_decode`` service may
carry an ``engine`` block (:mod:`simulator.profile.overhead`): its costs are then kernel time
and the engine adds host time per pass, and computes each batch's host fraction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from simulator.errors import ProfileError, UnknownName
from simulator.inputs import control_character
from simulator.profile.kinds import KINDS, BatchShape, ServiceModel
from simulator.profile.spec import Where, need_number

FORMAT = "simctl-profile/1"
RESOURCES = ("gpu", "cpu")

DEFAULT_PROFILE = "seed-calibrated"


@dataclass(frozen=True)
class TaskProfile:
    """How one task is served: its resource, token defaults and batch service model."""

    resource: str
    prompt_tokens: int
    max_tokens: int
    service: ServiceModel
    tokens_per_iteration: float = 1.0
    kv_cache: Mapping[str, float] | None = None
    host_fraction: float = 0.0

    def kv_blocks(self, block_size: int) -> int | None:
        """KV-cache blocks of ``block_size`` tokens one engine holds (``None``: unlimited)."""
        if not self.kv_cache:
            return None
        if "blocks" in self.kv_cache:
            return int(self.kv_cache["blocks"])
        per_block = self.kv_cache["bytes_per_token"] * block_size
        return int(self.kv_cache["memory_gib"] * 2**30 // per_block)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "resource": self.resource,
            "prompt_tokens": self.prompt_tokens,
            "max_tokens": self.max_tokens,
            "service": self.service.to_dict(),
        }
        if self.tokens_per_iteration != 1.0:
            out["tokens_per_iteration"] = self.tokens_per_iteration
        if self.kv_cache:
            out["kv_cache"] = dict(self.kv_cache)
        if self.host_fraction:
            out["host_fraction"] = self.host_fraction
        return out


@dataclass(frozen=True)
class Profile:
    """A named set of task profiles, with the provenance of its numbers in ``source``, the
    real system it stands for in ``describes`` and the question it answers in ``answers``."""

    name: str
    source: str
    tasks: Mapping[str, TaskProfile]
    path: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    describes: str = ""
    answers: str = ""

    def task(self, name: str) -> TaskProfile:
        """The profile of task ``name``; :class:`ProfileError` if the profile lacks it."""
        try:
            return self.tasks[name]
        except KeyError:
            raise ProfileError(
                self.path or self.name, f"task '{name}'", "tasks",
                f"the profile has no service model for this task (it has: {', '.join(self.tasks)})",
            ) from None

    def batch_service_time(
        self, task: str, prompts: Sequence[tuple[int, int]], rng: np.random.Generator
    ) -> float:
        """Seconds of exclusive device time for one batch of ``task``.

        ``prompts`` holds ``(prompt_tokens, max_tokens)`` for each prompt of the batch.
        """
        return self.task(task).service.sample(BatchShape.of(prompts), rng)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": FORMAT, "name": self.name, "source": self.source}
        if self.describes:
            out["describes"] = self.describes
        if self.answers:
            out["answers"] = self.answers
        if self.meta:
            out["meta"] = dict(self.meta)
        out["tasks"] = {k: v.to_dict() for k, v in self.tasks.items()}
        return out


#: The largest default token count a profile may give: a trace's (32-bit columns).
MAX_TASK_TOKENS = 2**31 - 1


def _need_int(value: Any, path: str, task: str, fld: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TASK_TOKENS:
        shown = f"{value!r}" if not isinstance(value, int) or value < 10**20 else f"an integer of {len(str(value))} digits"
        raise ProfileError(path, f"task '{task}'", fld, f"must be an integer in [1, {MAX_TASK_TOKENS:,}], got {shown}")
    return value


def _kv_cache(raw: Any, where: Where) -> dict[str, float] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not ({"blocks"} == set(raw) or {"memory_gib", "bytes_per_token"} == set(raw)):
        raise where.error("kv_cache", "must be {\"blocks\": N} or {\"memory_gib\": M, \"bytes_per_token\": B}")
    if "blocks" in raw:
        blocks = raw["blocks"]
        if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1:
            raise where.error("kv_cache.blocks", f"must be an integer >= 1, got {blocks!r}")
        return {"blocks": blocks}
    return {"memory_gib": need_number(raw["memory_gib"], where, "kv_cache.memory_gib", positive=True),
            "bytes_per_token": need_number(raw["bytes_per_token"], where, "kv_cache.bytes_per_token", positive=True)}


def profile_from_dict(data: Any, path: str | None = None) -> Profile:
    """Validate and build a :class:`Profile` from parsed JSON."""
    where_path = path or "<profile>"
    if not isinstance(data, dict):
        raise ProfileError(where_path, None, None, "a profile must be a JSON object")
    fmt = data.get("format", FORMAT)
    if fmt != FORMAT:
        raise ProfileError(where_path, None, "format", f"expected '{FORMAT}', got {fmt!r}")
    tasks_raw = data.get("tasks")
    if not isinstance(tasks_raw, dict) or not tasks_raw:
        raise ProfileError(where_path, None, "tasks", "must be a non-empty object of task -> profile")
    tasks: dict[str, TaskProfile] = {}
    for name, spec in tasks_raw.items():
        if why := control_character(name):
            raise ProfileError(where_path, f"task {name!r}", None, f"the task name {why}")
        if not isinstance(spec, dict):
            raise ProfileError(where_path, f"task '{name}'", None, "must be an object")
        resource = spec.get("resource", "gpu")
        if resource not in RESOURCES:
            raise ProfileError(where_path, f"task '{name}'", "resource", f"must be gpu or cpu, got {resource!r}")
        service_raw = spec.get("service")
        if not isinstance(service_raw, dict):
            raise ProfileError(where_path, f"task '{name}'", "service", "missing or not an object")
        kind = service_raw.get("kind", "distribution")
        if not isinstance(kind, str):
            raise ProfileError(where_path, f"task '{name}'", "service.kind",
                               f"must be the name of a kind ({', '.join(KINDS.names())}), got {kind!r}")
        try:
            parser = KINDS.get(kind)
        except UnknownName as exc:
            raise ProfileError(where_path, f"task '{name}'", "service.kind", str(exc)) from None
        task_where = Where(where_path, name, prefix="")
        tpi = need_number(spec.get("tokens_per_iteration", 1.0), task_where, "tokens_per_iteration", minimum=1.0)
        host_fraction = need_number(spec.get("host_fraction", 0.0), task_where, "host_fraction", minimum=0.0)
        if host_fraction > 1:
            raise task_where.error("host_fraction", f"must be between 0 and 1, got {host_fraction!r}")
        tasks[name] = TaskProfile(
            resource=resource,
            prompt_tokens=_need_int(spec.get("prompt_tokens", 256), where_path, name, "prompt_tokens"),
            max_tokens=_need_int(spec.get("max_tokens", 256), where_path, name, "max_tokens"),
            service=parser(service_raw, Where(where_path, name)),
            tokens_per_iteration=tpi,
            kv_cache=_kv_cache(spec.get("kv_cache"), task_where),
            host_fraction=host_fraction,
        )
    name = data.get("name") or (Path(path).stem if path else "unnamed")
    if isinstance(name, str) and (why := control_character(name)):
        raise ProfileError(where_path, None, "name", why)
    texts = {}
    for key in ("source", "describes", "answers"):
        texts[key] = data.get(key, "")
        if not isinstance(texts[key], str):
            raise ProfileError(where_path, None, key, f"must be a string, got {type(texts[key]).__name__}")
    meta = data.get("meta", {})
    if not isinstance(meta, dict):
        raise ProfileError(where_path, None, "meta", f"must be an object, got {type(meta).__name__}")
    return Profile(name=str(name), source=texts["source"], tasks=tasks, path=path, meta=meta,
                   describes=texts["describes"], answers=texts["answers"])


def resolve_profile_path(name_or_path: str | Path) -> Path:
    """A path as given if it exists, else the bundled (or user-measured) profile of that name."""
    from simulator import bundled

    return bundled.resolve("profiles", name_or_path, ProfileError)


def load_profile(name_or_path: str | Path = DEFAULT_PROFILE) -> Profile:
    """Read a profile from a JSON file, or a bundled one by name (``seed-calibrated``)."""
    from simulator import inputs

    path = resolve_profile_path(name_or_path)
    return profile_from_dict(inputs.read_json(path, ProfileError, "profile JSON file"), str(path))


__all__ = [
    "BatchShape", "Profile", "TaskProfile", "ServiceModel", "load_profile",
    "profile_from_dict", "DEFAULT_PROFILE",
]
