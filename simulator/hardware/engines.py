"""Serving engines: how each runs a decoder's kernels, and what its host side costs.

The per-op tables time kernels inside CUDA-graph replay: what the GPU does. An engine adds
the host's part of every pass (:mod:`simulator.profile.overhead` applies it at replay):

* ``cuda-graph`` — vLLM / TensorRT-LLM-like: fused kernels (execution style ``fused``)
  replayed from CUDA graphs, so no per-kernel launch cost; a pass takes its kernels plus a
  per-step host cost plus a per-request cost, one after the other.
* ``hf-eager`` — Hugging Face ``generate`` without graphs (the users' server): each kernel of
  the eager modules (style ``hf-eager``: unfused projections, fp32 norms, RoPE, a KV cache
  copied on every step, rows padded to the longest, fp32 logits and full-vocabulary
  sampling) is launched from Python one by one; the launches run ahead of the GPU until a
  step's end synchronises them (generate checks its stopping criteria every step), so a
  pass takes the longer of its host time and its kernel time.

* ``vllm``, ``trtllm``, ``sglang`` — as ``cuda-graph``, with the per-pass host time
  ``step_s + row_s · rows`` that ``benchmarks/public_validation.py`` fits for that engine on
  public measured serving figures at TP 1 (its test fails if these defaults drift from the fit).

Each engine's parameters (:class:`EngineSpec.defaults`) carry where their values come from
(:attr:`EngineSpec.sources`); ``simctl calibrate`` can free exactly these, with the kernel
costs fixed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from simulator.errors import HardwareError


@dataclass(frozen=True)
class EngineSpec:
    """An engine: its execution style, whether host work overlaps the GPU's, its host-cost
    parameters with their default values, and the source of each value."""

    name: str
    style: str
    overlap: bool
    description: str
    defaults: Mapping[str, float] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)
    #: the parameters a composed profile lets ``simctl calibrate`` free by default
    calibrated: tuple[str, ...] = ()
    #: each host parameter's 5-95 % interval (seconds, or a share), where :attr:`sources`
    #: states one or, for an assumed value, the range the assumption spans: what
    #: :mod:`simulator.uncertainty` draws a composed profile's host costs within
    intervals: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    def overhead(self, kernels: Mapping[str, float], overrides: Mapping[str, float] | None = None,
                 source: str = "given") -> dict[str, Any]:
        """The ``engine`` block of a profile's service (:mod:`simulator.profile.overhead`);
        ``overrides`` replace defaults, their provenance ``source``."""
        overrides = dict(overrides or {})
        values = {**self.defaults, **overrides}
        provenance = {k: (source if k in overrides else self.sources[k]) for k in values}
        provenance["kernels"] = ("counted: the kernels one pass of the execution style launches "
                                 f"({self.style}, simulator.hardware.compose)")
        return {"name": self.name, "overlap": self.overlap, **values,
                "kernels": {k: float(v) for k, v in kernels.items()}, "provenance": provenance}


ENGINES: dict[str, EngineSpec] = {e.name: e for e in [
    EngineSpec(
        "cuda-graph", "fused", overlap=False,
        description="vLLM / TensorRT-LLM-like: fused kernels replayed from CUDA graphs, per-step and "
                    "per-request host costs",
        defaults={"launch_s": 0.0, "step_s": 0.0, "row_s": 0.0, "interpreter_share": 0.0},
        sources={
            "launch_s": "zero by construction: a CUDA graph launches a step's kernels at once",
            "step_s": "0, as fitted: benchmarks/public_validation.py fits a per-pass host cost per engine family "
                      "on public measured serving rows at TP 1 (docs/hardware.md) and finds none for vLLM "
                      "(0 ms, 5-95 % 0-0) or TensorRT-LLM (0 ms, 0-0.05); calibrate it on a run of your engine",
            "row_s": "0, as fitted (same benchmark): vLLM 0 us a row, TensorRT-LLM 2.3 us [0-7.4], SGLang 17 us "
                     "[7-25], small against a step's milliseconds; calibrate it on a run of your engine",
            "interpreter_share": "0: one engine process per GPU, so GPUs share no interpreter lock",
        },
        # no launch cost to fit under graphs: the host's part is per step
        calibrated=("step_s",),
        # the envelope of the engine families' fitted intervals below (vLLM, TensorRT-LLM, SGLang)
        intervals={"launch_s": (0.0, 0.0), "step_s": (0.0, 0.28e-3), "row_s": (0.0, 23.5e-6),
                   "interpreter_share": (0.0, 0.0)}),
    *(EngineSpec(
        name, "fused", overlap=False,
        description=f"{label}: fused kernels replayed from CUDA graphs, its host time per pass fitted on public "
                    f"measured serving figures",
        defaults={"launch_s": 0.0, "step_s": 0.0, "row_s": row_s, "interpreter_share": 0.0},
        sources={
            "launch_s": "zero by construction: a CUDA graph launches a step's kernels at once",
            "step_s": f"fitted: 0 (5-95 % over bootstrap resamples {interval_step}) by benchmarks/public_validation.py "
                      f"on public {label} serving rows at TP 1 (docs/hardware.md); calibrate it on a run of yours",
            "row_s": f"fitted: {row_s * 1e6:.1f} us a row ({interval_row}), same fit",
            "interpreter_share": "0: one engine process per GPU, so GPUs share no interpreter lock",
        },
        calibrated=("step_s", "row_s"),
        intervals={"launch_s": (0.0, 0.0), "step_s": step_range, "row_s": row_range, "interpreter_share": (0.0, 0.0)})
      for name, label, row_s, interval_step, interval_row, step_range, row_range in (
          ("vllm", "vLLM", 0.0, "0-0 ms", "0-0 us", (0.0, 0.0), (0.0, 0.0)),
          ("trtllm", "TensorRT-LLM", 2.0e-6, "0-0.28 ms", "0-7.0 us", (0.0, 0.28e-3), (0.0, 7.0e-6)),
          ("sglang", "SGLang", 15.8e-6, "0-0 ms", "5.5-23.5 us", (0.0, 0.0), (5.5e-6, 23.5e-6)))),
    EngineSpec(
        "hf-eager", "hf-eager", overlap=True,
        description="Hugging Face generate without CUDA graphs: eager kernels launched from Python, "
                    "host and GPU overlapping within a step",
        defaults={"launch_s": 18e-6, "step_s": 1.5e-3, "row_s": 5e-5, "interpreter_share": 0.5},
        sources={
            "launch_s": "assumed: PyTorch eager dispatch plus a CUDA launch plus the module code around it, "
                        "per kernel (order of 10-20 us on a server CPU); calibrate it on a run of the server",
            "step_s": "assumed: the Python of one generate step outside the model (input preparation, logits "
                      "processors, stopping criteria, cache bookkeeping); calibrate it on a run of the server",
            "row_s": "assumed: per-row bookkeeping of a step (a per-row acceptance loop in a speculative "
                     "decoder); calibrate it on a run of the server",
            "interpreter_share": "assumed: PyTorch's operator bindings release the interpreter lock around "
                                 "the ATen call, the module code around it holds it; about half of eager "
                                 "host time",
        },
        # the host cost per kernel: every one of the users' runs pins it within a few percent;
        # the others trade against it on latencies alone (docs/calibration.md)
        calibrated=("launch_s",),
        # assumed ranges around the assumed values: launch_s spans the stated order of 10-20 us
        # up to the 32-49 us the users' runs give (docs/calibration.md); the others a factor
        # of 2-3 either way of their default, the share 0.3-0.7
        intervals={"launch_s": (10e-6, 50e-6), "step_s": (0.5e-3, 3e-3), "row_s": (1e-5, 1.5e-4),
                   "interpreter_share": (0.3, 0.7)}),
]}


def get_engine(name: str) -> EngineSpec:
    """The engine ``name``; :class:`HardwareError` listing the valid names otherwise."""
    try:
        return ENGINES[name]
    except KeyError:
        raise HardwareError(None, None, "engine", f"unknown engine {name!r}; valid: {', '.join(ENGINES)}") from None
