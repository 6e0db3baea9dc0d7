"""What a profile describes: the one place that reads a profile's identity.

A profile's service times stand for one real system, and the figures of a replay hold for
that system only. :func:`describe` reads, from wherever the profile records it, the GPU, the
tensor-parallel degree, the weights' dtype, the target and draft models, the serving engine
and its version, the speculative-decoding acceptance the profile uses, its KV cache, how its
numbers were obtained, and its ``describes`` / ``answers`` texts. The sources, first match
wins per field:

* a composed profile (``simctl profile --gpu NAME``) records ``meta.grounded``: ``gpu``,
  ``backend`` (the engine version whose measured tables priced the kernels), ``model``,
  ``draft``, ``engine``, ``tp`` (default 1 when absent) and ``dtype`` (default ``bf16``);
* a profile measured by the harness (``simctl profile --device ...``) records
  ``meta.device``, ``meta.dtype``, ``meta.torch`` and ``meta.target`` / ``meta.draft``;
* any other profile may state its system in ``meta.system`` (same keys as
  ``meta.grounded``, and ``engine_version``): the calibrated and hand-set bundled ones do.

A field the profile does not state reads ``not stated``; none is ever empty. The acceptance
and the KV cache are read off the GPU tasks' services: ``none`` where no task decodes
speculatively (``not modelled`` where batch times are given whole); ``no`` for a speculative decoder without a cache, the capacity where a task
gives one, ``yes`` where a cache is modelled without a capacity limit, and ``not modelled``
where the service prices whole batches (``distribution``, ``table``).

How the numbers were obtained (``source``): ``measured`` (the harness timed them),
``composed`` (from a GPU's measured per-op tables), ``calibrated`` (fitted to a real run's
latencies by ``simctl calibrate``), ``composed, calibrated`` (composed, the engine's host costs
then fitted to a real run) or ``given`` (set by hand: a starting point, or figures from
design notes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from simulator.profile import Profile

NOT_STATED = "not stated"
#: defaults of the composition's fields that older composed profiles do not record
DEFAULT_TP = 1
DEFAULT_DTYPE = "bf16"


@dataclass(frozen=True)
class ProfileIdentity:
    """The real system a profile describes, every field a non-empty text (or ``tp`` an int)."""

    name: str
    gpu: str
    tp: int | str
    dtype: str
    model: str
    draft: str
    engine: str
    engine_version: str
    acceptance: str
    kv_cache: str
    source: str
    describes: str
    answers: str

    def line(self) -> str:
        """The identity in one line, as the replay and plan headers print it."""
        model = self.model if self.draft in ("none", NOT_STATED) else f"{self.model} + {self.draft} draft"
        return (f"{self.name}: model {model}, GPU {self.gpu}, tp {self.tp}, dtype {self.dtype}, engine "
                f"{self.engine} (backend {self.engine_version}), acceptance {self.acceptance}, KV cache "
                f"{self.kv_cache}, {self.source}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _text(value: Any) -> str | None:
    return str(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) and str(value) else None


def _name(value: Any) -> str | None:
    """A model's name: the preset name of a measured profile's shape block, or the text."""
    if isinstance(value, Mapping):
        return _text(value.get("name"))
    return _text(value)


def _per_task(values: Mapping[str, str]) -> str:
    """One value when every GPU task agrees, else ``task value`` for each."""
    distinct = set(values.values())
    if not distinct:
        return "none"
    if len(distinct) == 1:
        return next(iter(distinct))
    return " / ".join(f"{task} {value}" for task, value in values.items())


def _acceptance(profile: Profile) -> str:
    values, whole = {}, False
    for name, task in profile.tasks.items():
        kind = getattr(task.service, "kind", None)
        if task.resource != "gpu":
            continue
        alpha = getattr(task.service, "acceptance", None)
        if kind == "spec_decode" and alpha is not None:
            values[name] = f"{float(alpha):.3g}"
        whole = whole or kind not in ("iteration", "spec_decode")
    # batch times given whole fold any acceptance into themselves
    return _per_task(values) if values or not whole else "not modelled"


def _kv_cache(profile: Profile) -> str:
    values = {}
    for name, task in profile.tasks.items():
        if task.resource != "gpu":
            continue
        kind = getattr(task.service, "kind", None)
        if kind == "spec_decode" and not getattr(task.service, "kv_cache", True):
            values[name] = "no"
        elif task.kv_cache and "blocks" in task.kv_cache:
            values[name] = f"{int(task.kv_cache['blocks']):,} blocks"
        elif task.kv_cache:
            tokens = task.kv_cache["memory_gib"] * 2**30 / task.kv_cache["bytes_per_token"]
            values[name] = f"{task.kv_cache['memory_gib']:.1f} GiB ({tokens:,.0f} tokens)"
        elif kind in ("iteration", "spec_decode"):
            values[name] = "yes"
        else:
            values[name] = "not modelled"
    return _per_task(values)


def _source(meta: Mapping[str, Any]) -> str:
    if isinstance(meta.get("grounded"), Mapping):
        return "composed, calibrated" if meta.get("fit") else "composed"
    if meta.get("device") is not None and meta.get("target") is not None:
        return "measured"
    if meta.get("fit"):
        return "calibrated"
    return "given"


def describe(profile: Profile) -> ProfileIdentity:
    """The identity of ``profile``: what real system it describes (module docstring)."""
    meta = profile.meta or {}
    stated: dict[str, Any] = {}
    if isinstance(meta.get("grounded"), Mapping):
        g = meta["grounded"]
        stated = {"gpu": g.get("gpu"), "tp": g.get("tp", DEFAULT_TP), "dtype": g.get("dtype", DEFAULT_DTYPE),
                  "model": g.get("model"), "draft": g.get("draft") or "none", "engine": g.get("engine"),
                  "engine_version": g.get("backend")}
    elif meta.get("device") is not None and meta.get("target") is not None:
        torch = _text(meta.get("torch"))
        stated = {"gpu": meta.get("device"), "tp": 1, "dtype": meta.get("dtype"), "model": _name(meta.get("target")),
                  "draft": _name(meta.get("draft")) or "none", "engine": "simctl harness",
                  "engine_version": f"torch {torch}" if torch else None}
    elif isinstance(meta.get("system"), Mapping):
        s = meta["system"]
        stated = {key: s.get(key) for key in ("gpu", "tp", "dtype", "model", "draft", "engine", "engine_version")}
    tp = stated.get("tp")
    return ProfileIdentity(
        name=profile.name,
        gpu=_text(stated.get("gpu")) or _text(meta.get("gpu")) or NOT_STATED,
        tp=tp if isinstance(tp, int) and not isinstance(tp, bool) else _text(tp) or NOT_STATED,
        dtype=_text(stated.get("dtype")) or NOT_STATED,
        model=_name(stated.get("model")) or NOT_STATED,
        draft=_name(stated.get("draft")) or NOT_STATED,
        engine=_text(stated.get("engine")) or NOT_STATED,
        engine_version=_text(stated.get("engine_version")) or NOT_STATED,
        acceptance=_acceptance(profile),
        kv_cache=_kv_cache(profile),
        source=_source(meta),
        describes=profile.describes or NOT_STATED,
        answers=profile.answers or NOT_STATED,
    )


__all__ = ["DEFAULT_DTYPE", "DEFAULT_TP", "NOT_STATED", "ProfileIdentity", "describe"]
