"""``simctl profile``: measure batched speculative decoding on a device, write a profile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from simulator.cli import app
from simulator.cli._common import console, user_errors, warn
from simulator.errors import SimctlError
from simulator.outputs import check_writable, open_output


class HarnessInputError(SimctlError):
    kind = "harness"


def _ints(text: Optional[str], option: str) -> Optional[tuple[int, ...]]:
    if text is None:
        return None
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise HarnessInputError(None, None, None, f"{option}: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise HarnessInputError(None, None, None, f"{option}: every value must be >= 1, got {text!r}")
    return values


def _floats(text: Optional[str], option: str) -> Optional[tuple[float, ...]]:
    if text is None:
        return None
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise HarnessInputError(None, None, None, f"{option}: expected comma-separated numbers, got {text!r}") from None
    if not all(0 <= v < 1 for v in values):
        raise HarnessInputError(None, None, None, f"{option}: acceptance rates must be in [0, 1), got {text!r}")
    return values


def _user_dir() -> str:
    from simulator.bundled import user_profiles_dir

    return str(user_profiles_dir())


@app.command("profile")
def profile_cli(
    gpu: Optional[int] = typer.Option(None, "--gpu", help="CUDA device index to measure on."),
    device: Optional[str] = typer.Option(None, "--device", help="cpu, cuda or cuda:N (default: --gpu, else cpu)."),
    target: Optional[str] = typer.Option(None, "--target", help="Target model preset (default qwen2.5-7b)."),
    draft: Optional[str] = typer.Option(None, "--draft", help="Draft model preset (default qwen2.5-0.5b)."),
    batch: Optional[str] = typer.Option(None, "--batch", help="Batch sizes, e.g. 1,2,4,8,16."),
    lookahead: Optional[str] = typer.Option(None, "--lookahead", help="Lookaheads k, e.g. 1,3,5."),
    acceptance: Optional[str] = typer.Option(None, "--acceptance", help="Injected acceptance rates, e.g. 0.5,0.7,0.9."),
    prompt_tokens: Optional[str] = typer.Option(None, "--prompt-tokens", help="Prompt lengths, e.g. 128,512,2048."),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help="Tokens generated per row (default 512)."),
    repeats: Optional[int] = typer.Option(None, "--repeats", help="Timed repeats per step (median, p10, p90)."),
    quick: bool = typer.Option(False, "--quick", help="A small grid on the tiny preset (under a minute on a CPU)."),
    no_graphs: bool = typer.Option(False, "--no-graphs", help="Do not capture CUDA graphs (GPU only)."),
    compile_: bool = typer.Option(False, "--compile", help="Run the model forwards through torch.compile."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help=f"Profile to write [default: {_user_dir()}/<device>__<target>__<draft>.json, found by name with -p]."),
    threads: int = typer.Option(1, "--threads", help="Intra-op threads torch may use while measuring (pinned, so other work on the machine moves the timings less)."),
    strict: bool = typer.Option(False, "--strict", help="Exit with status 1 when the fitted costs miss the held-out generations (the profile is still written)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing profile."),
) -> None:
    """Measure batched speculative decoding and write a spec_decode profile.

    Times prefill, draft steps, verification and plain decoding over the grid, then whole
    batched generations; fits a cost per operation and checks it on held-out generations.
    """
    with user_errors():
        try:
            import torch
        except ModuleNotFoundError:
            raise HarnessInputError(None, None, None, "simctl profile needs torch: pip install 'simctl[harness]' "
                                    "(for the CPU build: pip install torch==2.13.0)") from None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from simulator.harness.presets import UnknownPreset, get_preset
        from simulator.harness.profiler import Grid, HarnessError, default_output, resolve_device, run_profile, with_overrides

        base = Grid.quick() if quick else Grid()
        grid = with_overrides(
            base, target=target, draft=draft, batch=_ints(batch, "--batch"),
            lookahead=_ints(lookahead, "--lookahead"), acceptance=_floats(acceptance, "--acceptance"),
            prompt_tokens=_ints(prompt_tokens, "--prompt-tokens"), max_tokens=max_tokens, repeats=repeats,
            graphs=False if no_graphs else None, compile=True if compile_ else None,
        )
        try:
            get_preset(grid.target), get_preset(grid.draft)
            dev = resolve_device(gpu, device)
        except (UnknownPreset, HarnessError) as exc:
            raise HarnessInputError(None, None, None, str(exc)) from None
        if threads < 1:
            raise HarnessInputError(None, None, None, f"--threads: must be >= 1, got {threads}")
        out = output or default_profile_path(Path(default_output(dev, grid)).stem)
        check_writable(out, force=force)
        torch.set_num_threads(threads)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, transient=True) as bar:
            job = bar.add_task("profiling", total=grid.points())

            def tick(description: str) -> None:
                bar.update(job, advance=1, description=description)
            try:
                profile = run_profile(grid, dev, tick)
            except HarnessError as exc:
                raise HarnessInputError(None, None, None, str(exc)) from None
        profile["meta"]["threads"] = threads
        out.parent.mkdir(parents=True, exist_ok=True)
        with open_output(out, force=force) as fh:
            json.dump(profile, fh, indent=1)
        print_profile(profile, out)
        missed = held_out_missed(profile["meta"]["fit_check"])
        if missed:
            warn(f"{out}: {missed}; the machine was probably busy while measuring: measure again on an idle "
                 f"machine before trusting this profile")
            if strict:
                raise typer.Exit(1)


#: The held-out check passes when the composed costs predict held-out generations within
#: these absolute errors (median, worst).
HELD_OUT_LIMITS = (0.15, 0.50)


def held_out_missed(check: dict) -> str:
    """Why the fitted costs fail the held-out check (empty if they pass)."""
    median, worst = check.get("median_ape"), check.get("max_ape")
    if not check.get("held_out"):
        return "no held-out generations to check the fitted costs against"
    if median > HELD_OUT_LIMITS[0] or worst > HELD_OUT_LIMITS[1]:
        return (f"the fitted costs miss held-out generations by median {100 * median:.0f} %, worst "
                f"{100 * worst:.0f} % (limits {100 * HELD_OUT_LIMITS[0]:.0f} % and {100 * HELD_OUT_LIMITS[1]:.0f} %)")
    return ""


def default_profile_path(stem: str) -> Path:
    """Where a measured profile goes by default: the per-user profile folder, under a name no
    bundled profile has (so ``-p NAME`` finds it and nothing bundled is ever overwritten)."""
    from simulator.bundled import names, user_profiles_dir

    if stem in names("profiles"):
        stem = f"{stem}-measured"
    return user_profiles_dir() / f"{stem}.json"


def print_profile(profile: dict, path: Path) -> None:
    """A short account of what was measured and how well the fit holds."""
    from rich.table import Table

    meta = profile["meta"]
    check = meta["fit_check"]
    console.print(f"wrote {path}: {meta['target']['name']} + {meta['draft']['name']} on {meta['device']} "
                  f"({meta['dtype']}, torch {meta['torch']})", highlight=False)
    if meta["bandwidth_bytes_per_s"]:
        r = meta["ratio_to_floor"]
        console.print(f"copy bandwidth {meta['bandwidth_bytes_per_s'] / 1e9:,.0f} GB/s; measured/memory floor "
                      f"min {r['min']:.2f}, median {r['median']:.2f}, max {r['max']:.2f}", highlight=False)
    table = Table(title="Fitted costs (median over repeats)", title_justify="left")
    for col in ("operation", "form", "coefficients", "fit median APE"):
        table.add_column(col)
    for op, cost in profile["tasks"]["infobench"]["service"]["costs"].items():
        err = check["fit_median_ape"].get(op)
        table.add_row(op, cost["expr"], ", ".join(f"{c:.3g}" for c in cost["coef"]),
                      "" if err is None else f"{100 * err:.1f} %")
    console.print(table)
    if check["held_out"]:
        console.print(f"held-out generations: {check['held_out']}, absolute error of the composed prediction "
                      f"median {100 * check['median_ape']:.1f} %, max {100 * check['max_ape']:.1f} %", highlight=False)
    for err in meta["errors"]:
        console.print(f"[yellow]{err['op']} B={err['batch']}: {err['error']}[/yellow]")
