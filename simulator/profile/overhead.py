"""The engine's host-side overhead of a GPU service: the ``engine`` block of a service kind.

::

    "engine": {"name": "hf-eager", "overlap": true,
               "launch_s": 1.8e-05, "step_s": 0.0015, "row_s": 5e-05, "interpreter_share": 0.5,
               "kernels": {"step": 2250, "prefill": 2250}}

A service kind's costs (``iteration`` step coefficients, ``spec_decode`` cost forms) are then
the GPU's kernel time alone; each pass adds the host's:

    host = step_s + launch_s · kernels[pass] (+ row_s · rows, once per step)

``launch_s`` is the host time per kernel launched one by one (0 where CUDA graphs replay the
kernels), ``step_s`` the host time per pass outside the kernels (the generation loop, a
scheduler), ``row_s`` per row and step (per-request bookkeeping, a per-row sampling loop),
``kernels`` the kernels each pass launches (counted by the composition,
:mod:`simulator.hardware.compose`). With ``overlap`` (eager launches run ahead of the GPU
and a step waits for both) a pass takes ``max(host, gpu)``; without, ``host + gpu``.

``interpreter_share`` is the share of host time that holds the process's interpreter lock.
When one process drives several GPUs (a scenario's ``host_lock``) the batches contend for it:
a batch's host fraction is ``interpreter_share · host / (its seconds)``, summed over its
passes (:meth:`EngineOverhead.host_fraction`), computed rather than fitted.

This module needs numpy only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simulator.profile.spec import Where, need_number

PARAMETERS = ("launch_s", "step_s", "row_s", "interpreter_share")
PASSES = ("step", "prefill", "draft", "verify")


@dataclass(frozen=True)
class EngineOverhead:
    """Host time per pass on top of the GPU's kernel time (module docstring)."""

    name: str
    launch_s: float = 0.0
    step_s: float = 0.0
    row_s: float = 0.0
    interpreter_share: float = 0.0
    overlap: bool = False
    kernels: Mapping[str, float] = field(default_factory=dict)
    #: where each parameter's value comes from (measured, assumed, calibrated, ...): kept as written
    provenance: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def host(self, pass_name: str, rows: Any = 0) -> Any:
        """Host seconds of one pass of ``pass_name`` over ``rows`` rows (``rows`` may be an
        array; pass 0 rows for a pass whose per-row cost is counted elsewhere)."""
        kernels = self.kernels.get(pass_name, self.kernels.get("step", 0.0))
        return self.step_s + self.launch_s * kernels + self.row_s * np.asarray(rows, dtype=float)

    def combine(self, gpu: Any, host: Any) -> Any:
        """Seconds of passes that take ``gpu`` kernel seconds and ``host`` host seconds."""
        return np.maximum(gpu, host) if self.overlap else np.asarray(gpu) + host

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "overlap": self.overlap}
        out.update({p: getattr(self, p) for p in PARAMETERS})
        out["kernels"] = dict(self.kernels)
        if self.provenance:
            out["provenance"] = dict(self.provenance)
        return out


def parse_engine(raw: Any, where: Where) -> EngineOverhead | None:
    """The ``engine`` block of a service, checked field by field (``None`` when absent)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise where.error("engine", "must be an object (name, overlap, launch_s, step_s, row_s, "
                                    "interpreter_share, kernels)")
    known = {"name", "overlap", "kernels", "provenance", *PARAMETERS}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise where.error(f"engine.{unknown[0]}", f"unknown field; valid: {', '.join(sorted(known))}")
    name = raw.get("name", "engine")
    if not isinstance(name, str):
        raise where.error("engine.name", f"must be a string, got {name!r}")
    overlap = raw.get("overlap", False)
    if not isinstance(overlap, bool):
        raise where.error("engine.overlap", f"must be true or false, got {overlap!r}")
    values = {p: need_number(raw.get(p, 0.0), where, f"engine.{p}", minimum=0.0) for p in PARAMETERS}
    if values["interpreter_share"] > 1:
        raise where.error("engine.interpreter_share", f"must be between 0 and 1, got {values['interpreter_share']!r}")
    kernels_raw = raw.get("kernels", {})
    if not isinstance(kernels_raw, dict):
        raise where.error("engine.kernels", "must be an object of pass -> kernels per pass")
    kernels = {}
    for key, value in kernels_raw.items():
        if key not in PASSES:
            raise where.error(f"engine.kernels.{key}", f"unknown pass; valid: {', '.join(PASSES)}")
        kernels[key] = need_number(value, where, f"engine.kernels.{key}", minimum=0.0)
    provenance = raw.get("provenance", {})
    if not isinstance(provenance, dict):
        raise where.error("engine.provenance", "must be an object of parameter -> where its value comes from")
    return EngineOverhead(name=name, overlap=overlap, kernels=kernels, provenance=provenance, **values)
