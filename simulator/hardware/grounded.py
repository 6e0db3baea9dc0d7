"""Profiles grounded in GPU measurements: composed kernel costs plus an engine's host costs.

:func:`grounded_profile` writes, for each GPU task of a base profile (its lengths and
resources), a service in the existing profile kinds whose kernel costs come from the
composition (:mod:`simulator.hardware.compose`) on a named GPU's measured tables, and whose
host costs come from an engine (:mod:`simulator.hardware.engines`):

* a task decoded by the target alone gets the ``iteration`` kind: its step coefficients
  (``base + per_row·R + per_context_token·R·C``, and ``per_prefill_token`` for the first
  iteration) are a least-squares fit, in relative error, of composed decode steps over the
  rows and contexts the task's batches reach;
* a task decoded speculatively (``--draft``) gets the ``spec_decode`` kind: with a KV cache,
  its prefill, draft-step and verify cost forms fitted to composed passes; without one (the
  users' first server), draft and verify passes over each row's whole sequence.

Every number says where it comes from: the fitted forms carry the fit's error against the
composition and the share of composed seconds that were exact, interpolated, extrapolated
or assumed table answers; the engine block carries each parameter's source. ``meta.calibrate``
lists the engine's host-cost parameters (tied across tasks: one engine), so ``simctl
calibrate`` started from this profile frees only them, the kernel costs fixed.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.hardware.compose import Pass, StepCost, decode_step, forward, prefill, uncached_pass
from simulator.hardware.engines import EngineSpec
from simulator.hardware.tables import TAGS, GpuTables
from simulator.harness.presets import ModelShape
from simulator.profile.kinds.spec_decode import FORMS

#: bounds of the engine parameters ``simctl calibrate`` may free (seconds; a share)
BOUNDS = {"launch_s": (1e-7, 1e-3), "step_s": (1e-6, 0.5), "row_s": (1e-7, 0.05), "interpreter_share": (0.05, 1.0)}



@dataclass(frozen=True)
class GpuTask:
    """A GPU task to price: its lengths, the most rows a batch of it may hold, and whether a
    draft model decodes it speculatively."""

    name: str
    prompt_tokens: int
    max_tokens: int
    max_rows: int = 32
    speculative: bool = False


def _grid(low: float, high: float, points: int, integer: bool = True) -> np.ndarray:
    values = np.unique(np.geomspace(max(low, 1), max(high, low, 1), points))
    return np.unique(np.round(values)).astype(int) if integer else values


def _fit(design: np.ndarray, seconds: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
    """Non-negative least squares of ``design @ coef ≈ seconds`` in relative error, and the
    fit's median and largest relative error."""
    from scipy.optimize import nnls

    weighted = design / seconds[:, None]
    scale = np.where(weighted.max(axis=0) > 0, weighted.max(axis=0), 1.0)
    coef, _ = nnls(weighted / scale, np.ones_like(seconds))
    coef = coef / scale
    error = np.abs(design @ coef / seconds - 1)
    return coef, {"median": float(np.median(error)), "max": float(error.max()), "points": len(seconds)}


def _tag_shares(costs: Sequence[Any]) -> dict[str, float]:
    """Share of composed seconds per provenance tag over ``costs``."""
    total = sum(c.seconds for c in costs)
    return {tag: round(sum(c.by_tag.get(tag, 0.0) for c in costs) / total, 4) for tag in TAGS
            if any(c.by_tag.get(tag, 0.0) for c in costs)}


def _iteration_service(gpu: GpuTables, shape: ModelShape, style: str, task: GpuTask,
                       finished_rows: str) -> tuple[dict[str, Any], dict[str, float], dict[str, Any]]:
    P, M = task.prompt_tokens, task.max_tokens
    rows = _grid(1, task.max_rows, 7)
    contexts = np.unique(np.linspace(P, P + M, 5).round().astype(int))
    points, costs = [], []
    for r in rows:
        for c in contexts:
            cost = decode_step(gpu, shape, [int(c)] * int(r), style)
            points.append((r, c, cost.seconds))
            costs.append(cost)
    R, C, s = (np.array(v, dtype=float) for v in zip(*points, strict=True))
    (base, per_row, per_ctx), decode_fit = _fit(np.column_stack([np.ones_like(R), R, R * C]), s)
    fills = [prefill(gpu, shape, [P] * int(r), style) for r in rows]
    extra = np.array([f.seconds for f in fills]) - (base + per_row * rows + per_ctx * rows * P)
    per_prefill = max(0.0, float(np.sum(extra * rows * P) / np.sum((rows * P) ** 2)))
    service: dict[str, Any] = {"kind": "iteration", "dist": "deterministic",
               "step": {"base": float(base), "per_row": float(per_row), "per_prefill_token": per_prefill,
                        "per_context_token": float(per_ctx)},
               "finished_rows": finished_rows}
    kernels = {"step": float(costs[0].kernels), "prefill": float(fills[0].kernels)}
    meta: dict[str, Any] = {"fit": {"decode": decode_fit}, "provenance": _tag_shares(costs + fills),
            "grid": {"rows": rows.tolist(), "context": contexts.tolist()}}
    return service, kernels, meta


def _spec_service(gpu: GpuTables, target: ModelShape, draft: ModelShape, style: str, task: GpuTask,
                  kv_cache: bool, lookahead: int, acceptance: float) -> tuple[dict[str, Any], dict[str, float], dict[str, Any]]:
    P, M, k = task.prompt_tokens, task.max_tokens, lookahead
    rows = _grid(1, task.max_rows, 6)
    fits: dict[str, Any] = {}
    costs: list[StepCost] = []

    def fitted(name: str, form: str, cases: list[tuple[tuple[float, ...], StepCost]]) -> dict[str, Any]:
        """The cost form ``form`` fitted to composed passes (``cases``: the form's variables, the pass)."""
        costs.extend(cost for _, cost in cases)
        cols = FORMS[form][1](*(np.array(v, dtype=float) for v in zip(*(args for args, _ in cases), strict=True)))
        coef, fits[name] = _fit(cols, np.array([cost.seconds for _, cost in cases]))
        return {"form": form, "coef": [float(c) for c in coef]}

    def cached(shape: ModelShape, b: int, new: int, view: int) -> StepCost:
        """A pass of ``new`` tokens per row over ``b`` rows, attending ``view`` positions."""
        return forward(gpu, shape, Pass(b, new, view - new, False, b * new, True), style)

    views = [int(v) for v in np.unique(np.linspace(P, P + M + k + 1, 5).round())]
    batches = [int(b) for b in rows]
    zero = {"form": "prefill", "coef": [0.0, 0.0, 0.0]}
    if kv_cache:
        prompts = [int(p) for p in np.unique(np.linspace(max(1, P // 2), 2 * P, 4).round())]
        costs_out = {
            "prefill_target": fitted("prefill_target", "prefill",
                                     [((b, p), prefill(gpu, target, [p] * b, style)) for b in batches for p in prompts]),
            "prefill_draft": fitted("prefill_draft", "prefill",
                                    [((b, p), prefill(gpu, draft, [p] * b, style)) for b in batches for p in prompts]),
            "draft_step": fitted("draft_step", "step", [((b, t, v), cached(draft, b, t, v))
                                                        for b in batches for t in (1, 2) for v in views]),
            "verify": fitted("verify", "step", [((b, k + 1, v), cached(target, b, k + 1, v))
                                                for b in batches for v in views]),
        }
        kernels = {"prefill": float(prefill(gpu, target, [P], style).kernels),
                   "draft": float(cached(draft, 1, 1, P).kernels),
                   "verify": float(cached(target, 1, k + 1, P).kernels)}
    else:
        # Without a cache every pass runs over each active row's whole sequence (the first
        # pass is the prefill); draft_step(R, V, V) and verify(R, V + k, V + k) in the step form.
        costs_out = {
            "prefill_target": zero, "prefill_draft": zero,
            "draft_step": fitted("draft_step", "step", [((b, v, v), uncached_pass(gpu, draft, b, v, style))
                                                        for b in batches for v in views]),
            "verify": fitted("verify", "step", [((b, v, v), uncached_pass(gpu, target, b, v, style))
                                                for b in batches for v in views]),
        }
        kernels = {"draft": float(uncached_pass(gpu, draft, 1, P, style).kernels),
                   "verify": float(uncached_pass(gpu, target, 1, P, style).kernels)}
    costs_out["iteration"] = {"form": "iteration", "coef": [0.0, 0.0]}
    service: dict[str, Any] = {"kind": "spec_decode", "costs": costs_out, "acceptance": acceptance, "lookahead": lookahead,
               "discipline": "ragged", "view_step": 16}
    if not kv_cache:
        service["kv_cache"] = False
    meta: dict[str, Any] = {"fit": fits, "provenance": _tag_shares(costs),
            "grid": {"rows": batches, "views": views}}
    return service, kernels, meta


def _host_share(service: dict[str, Any], task: GpuTask) -> dict[str, float]:
    """The host's share of a batch's time (host seconds over seconds) at one row and at the
    most rows, at the task's lengths: how host-bound the engine makes this task."""
    from simulator.profile.kinds import KINDS, BatchShape
    from simulator.profile.spec import Where

    # the host's share is the lock share with every host second counted (interpreter share 1)
    probe = {**service, "engine": {**service["engine"], "interpreter_share": 1.0}}
    # iteration and spec_decode services with an engine block answer host_fraction
    model: Any = KINDS.get(service["kind"])(probe, Where(None, task.name))
    out = {}
    for rows in sorted({1, task.max_rows}):
        shape = BatchShape(rows, task.prompt_tokens, task.max_tokens, (task.max_tokens,) * rows)
        out[f"{rows} rows"] = round(float(model.host_fraction(shape)), 4)
    return out


def grounded_profile(base: dict[str, Any], gpu: GpuTables, engine: EngineSpec, target: ModelShape,
                     draft: ModelShape | None = None, *, tasks: Sequence[GpuTask] | None = None,
                     kv_cache: bool = True, lookahead: int = 3, acceptance: float = 0.7,
                     finished_rows: str | None = None, name: str | None = None,
                     overrides: dict[str, float] | None = None, overrides_source: str = "given",
                     free: Sequence[str] | None = None, memory: Any = None, describes: str | None = None,
                     answers: str | None = None) -> dict[str, Any]:
    """A profile (JSON data) with ``base``'s tasks, every GPU task's service composed for
    ``target`` (and ``draft``, for tasks marked speculative) on ``gpu`` under ``engine``.

    ``tasks`` defaults to every GPU task of ``base`` at its lengths, speculative when a
    draft is given. ``finished_rows`` defaults to ``stay`` for engines of the ``hf-eager``
    style (a static generate pads finished rows to the end) and ``leave`` otherwise.
    ``overrides`` sets engine parameters (their provenance ``overrides_source``); ``free`` names the engine
    parameters listed in ``meta.calibrate`` (tied across the GPU tasks: one engine; default:
    the engine's own choice, :attr:`EngineSpec.calibrated`). ``memory`` (a
    :class:`~simulator.hardware.memory.MemoryPlan`) gives every GPU task the KV cache that is
    left, so continuous batching preempts where the engine would. ``describes`` and ``answers``
    (which real system the profile stands for, which question it answers) default to texts
    said of the composition itself."""
    out = copy.deepcopy(base)
    if tasks is None:
        tasks = [GpuTask(n, int(t.get("prompt_tokens", 256)), int(t.get("max_tokens", 256)), speculative=draft is not None)
                 for n, t in base["tasks"].items() if t.get("resource", "gpu") == "gpu"]
    finished = finished_rows or ("stay" if engine.style == "hf-eager" else "leave")
    grounded: dict[str, Any] = {"gpu": gpu.gpu, "backend": gpu.backend, "model": target.name,
                                "draft": draft.name if draft else None, "engine": engine.name,
                                "style": engine.style, "tp": gpu.tp,
                                "dtype": gpu.dtype, "kv_dtype": gpu.kv_dtype,
                                "tasks": {}}
    if memory is not None:
        grounded["memory"] = memory.to_dict()
    for task in tasks:
        if task.speculative:
            if draft is None:
                raise ValueError(f"task {task.name} is marked speculative but no draft model is given")
            service, kernels, meta = _spec_service(gpu, target, draft, engine.style, task, kv_cache, lookahead, acceptance)
        else:
            service, kernels, meta = _iteration_service(gpu, target, engine.style, task, finished)
        service["engine"] = engine.overhead(kernels, overrides, overrides_source)
        meta["host_share"] = _host_share(service, task)
        entry = out["tasks"].setdefault(task.name, {"resource": "gpu"})
        entry.update({"resource": "gpu", "prompt_tokens": task.prompt_tokens, "max_tokens": task.max_tokens,
                      "service": service})
        if memory is not None and (not task.speculative or kv_cache):
            entry["kv_cache"] = {"memory_gib": memory.kv_bytes / 2**30, "bytes_per_token": memory.kv_bytes_per_token}
        entry.pop("host_fraction", None)   # computed from the engine block now
        grounded["tasks"][task.name] = meta
    gpu_tasks = [t.name for t in tasks]
    meta_out = out.setdefault("meta", {})
    meta_out.pop("fit", None)
    meta_out.pop("system", None)   # meta.grounded says what the composed profile describes
    meta_out["grounded"] = grounded
    meta_out["calibrate"] = [
        {"name": f"engine.{param}", "task": gpu_tasks[0], "path": f"service.engine.{param}", "min": low, "max": high,
         "ties": [{"task": t, "path": f"service.engine.{param}", "factor": 1.0} for t in gpu_tasks[1:]]}
        for param, (low, high) in ((p, BOUNDS[p]) for p in (engine.calibrated if free is None else free))]
    deployment = f"{gpu.gpu}" + (f" × {gpu.tp} (tensor parallel)" if gpu.tp > 1 else "") + f", {gpu.dtype} weights"
    decoding = f"{'KV cache' if kv_cache else 'no KV cache'}, lookahead {lookahead}, acceptance {acceptance:g}"
    speculative = draft is not None and any(t.speculative for t in tasks)
    spec = f" + {draft.name} draft ({decoding})" if speculative and draft is not None else ""
    tp, dtype = gpu.tp, gpu.dtype
    suffix = (f"-tp{tp}" if tp > 1 else "") + (f"-{dtype}" if dtype != "bf16" else "")
    out["name"] = name or f"{gpu.gpu}{suffix}__{target.name}{'__' + draft.name if draft else ''}__{engine.name}"
    out["source"] = (
        f"Composed by `simctl profile --gpu {gpu.gpu}` from NVIDIA's measured per-op tables of the {gpu.gpu} "
        f"({gpu.backend}; simulator/hardware/data/README.md) for {target.name}{spec} on {deployment} under the "
        f"{engine.name} engine "
        f"({engine.description}). GPU tasks {', '.join(gpu_tasks)}: kernel costs fitted to the composition "
        f"(meta.grounded: the fit's error and the share of exact / interpolated / extrapolated / assumed seconds); "
        f"the engine block's host costs say where each value comes from. Other tasks as in the base profile "
        f"({base.get('name', 'unnamed')}).")
    model = target.name + (f" with a {draft.name} draft ({decoding})" if speculative and draft is not None else "")
    out["describes"] = describes or (
        f"{model} on {'one ' + gpu.gpu if tp == 1 else f'{tp} × {gpu.gpu} (tensor parallel)'} in {dtype} under a "
        f"{engine.name} engine, kernel times from NVIDIA's {gpu.backend} "
        f"per-op tables of that GPU (composed, not measured end to end)")
    out["answers"] = answers or (
        f"What {target.name} costs in latency and GPU-hours on {gpu.gpu} GPUs at the task lengths of "
        f"{base.get('name', 'the base profile')}; compare it with the same model composed for another GPU type "
        f"(simctl plan --objective cheapest)")
    return out
