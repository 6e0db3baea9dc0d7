"""``simctl synth``: write a synthetic trace drawn from stated statistics."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import typer

from simulator.cli import app
from simulator.cli._common import console, user_errors
from simulator.errors import SynthSpecError
from simulator.outputs import check_writable
from simulator.settings import LARGEST_SEED
from simulator.trace.formats import FORMATS, save_trace
from simulator.trace.synth import (
    SynthSpec,
    parse_prompts_per_call,
    parse_task_mix,
    parse_token_dists,
    synthesize,
)

T = TypeVar("T")

#: The option that sets each SynthSpec field, for error messages.
_OPTIONS = {
    "duration": "--duration", "arrival": "--arrival", "mean": "--mean", "cv": "--cv",
    "prompts_per_call": "--prompts-per-call", "task_mix": "--task-mix",
    "prompt_tokens": "--prompt-tokens", "max_tokens": "--max-tokens", "seed": "--seed",
}


def _as_option(build: Callable[[], T]) -> T:
    """Run ``build``; re-raise a :class:`SynthSpecError` naming the CLI option, not the field."""
    try:
        return build()
    except SynthSpecError as exc:
        option = _OPTIONS.get(exc.field or "", exc.field)
        raise SynthSpecError(None, None, None, f"{option}: {exc.message}" if option else exc.message) from None


def _fitted_spec(path: Path, duration: float, rate_scale: float, request_rate: float | None = None) -> SynthSpec:
    """The spec fitted to the trace at ``path`` (its mean gap ``1 / request_rate`` when
    given); prints the arrival model it chose."""
    import dataclasses

    from simulator.trace.fit import spec_from_fit
    from simulator.trace.formats import load_trace

    if not rate_scale > 0:
        raise SynthSpecError(None, None, None, f"--rate-scale: must be > 0, got {rate_scale:g}")
    if not duration > 0:
        raise SynthSpecError(None, None, None, f"--duration: must be > 0, got {duration:g}")
    try:
        spec, model = spec_from_fit(load_trace(path), duration, rate_scale)
    except ValueError as exc:
        raise SynthSpecError(path, None, None, str(exc)) from None
    best = model.best
    others = ", ".join(f"{c.family} {c.aic:,.0f}" for c in model.candidates[1:])
    rate = f"rate x{rate_scale:g}"
    if request_rate is not None:
        spec = _as_option(lambda: dataclasses.replace(spec, mean=1 / request_rate))
        rate = f"rate {request_rate:g} calls/s"
    console.print(f"fitted {path}: {best.family} gaps (mean {best.mean:.4g} s, CV {best.cv:.3g}; AIC "
                  f"{best.aic:,.0f}, KS {best.ks:.3f}; others: {others}); {rate}", highlight=False)
    return spec


@app.command("synth")
def synth_cli(
    output: Path = typer.Option(..., "--output", "-o", help="Trace file to write."),
    duration: float = typer.Option(..., "--duration", help="Seconds; calls arrive in (0, duration]."),
    arrival: str = typer.Option("poisson", "--arrival", help="Inter-arrival distribution: poisson, gamma, lognormal or weibull."),
    mean: float | None = typer.Option(None, "--mean", help="Mean inter-arrival time (s). [default: 10]"),
    request_rate: float | None = typer.Option(None, "--request-rate", help="Mean arrival rate (calls/s): the same "
                                              "as --mean 1/R (with --fit: the fitted gaps' mean set to 1/R)."),
    cv: float = typer.Option(1.0, "--cv", help="Coefficient of variation of the inter-arrival time (ignored by poisson)."),
    prompts_per_call: str = typer.Option(
        "1:0.25,2:0.2,3:0.3,4-8:0.25", "--prompts-per-call",
        help="SIZE:P,... ; a range LOW-HIGH:P spreads P uniformly over its sizes.",
    ),
    task_mix: str = typer.Option("graph:0.34,mmlu:0.36,infobench:0.3", "--task-mix", help="TASK:P,..."),
    prompt_tokens: str | None = typer.Option(
        None, "--prompt-tokens",
        help="TASK:MEAN (fixed) or TASK:MEAN:CV (lognormal), comma-separated; '*' = every other task. "
             "Default: lengths measured on the users' trace.",
    ),
    max_tokens: str | None = typer.Option(
        None, "--max-tokens", help="Same syntax as --prompt-tokens. Default: 2048 for every task.",
    ),
    seed: int = typer.Option(0, "--seed", min=0, max=LARGEST_SEED, help="Random seed (same seed and options, same trace)."),
    fit: Path | None = typer.Option(None, "--fit", help="Fit every statistic to this trace instead (arrival model by MLE + AIC)."),
    rate_scale: float | None = typer.Option(None, "--rate-scale", help="With --fit: divide the fitted mean gap by this "
                                            "(2 = twice the load). [default: 1]"),
    fmt: str = typer.Option("native", "--format", help=f"Output format: {' or '.join(FORMATS)}."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output file."),
) -> None:
    """Write a synthetic trace drawn from stated statistics.

    Arrivals come from a poisson, gamma, lognormal or weibull inter-arrival process; prompts
    per call, tasks and token counts are drawn from the given mixes. With --fit, every
    statistic is fitted to a trace instead.
    """
    with user_errors():
        if fmt not in FORMATS:
            raise SynthSpecError(None, None, None, f"--format: unknown format {fmt!r} (expected {' or '.join(FORMATS)})")
        if request_rate is not None:
            other = "--mean" if mean is not None else "--rate-scale" if rate_scale is not None else None
            if other:
                raise SynthSpecError(None, None, None, f"--request-rate and {other} both set the arrival rate; "
                                     "give one of them")
            if not (math.isfinite(request_rate) and request_rate > 0):
                raise SynthSpecError(None, None, None, f"--request-rate: must be a number of calls per second > 0, "
                                     f"got {request_rate:g}")
        check_writable(output, force=force, inputs=(fit,) if fit else ())
        if fit is not None:
            spec = _fitted_spec(fit, duration, 1.0 if rate_scale is None else rate_scale, request_rate)
        else:
            gap = 1 / request_rate if request_rate is not None else 10.0 if mean is None else mean
            spec = _as_option(lambda: SynthSpec(
                duration=duration,
                arrival=arrival,
                mean=gap,
                cv=cv,
                prompts_per_call=parse_prompts_per_call(prompts_per_call),
                task_mix=parse_task_mix(task_mix),
                prompt_tokens=parse_token_dists(prompt_tokens, "prompt_tokens") if prompt_tokens else {},
                max_tokens=parse_token_dists(max_tokens, "max_tokens") if max_tokens else {},
            ))
        trace = _as_option(lambda: synthesize(spec, seed))
        save_trace(trace, output, format=fmt, force=force)
        span = trace.calls[-1].t
        console.print(
            f"wrote {len(trace)} calls, {trace.n_prompts} prompts over {span:,.1f} s to {output} "
            f"({fmt} format, seed {seed})",
            highlight=False,
        )
