"""``simctl profile``: measure batched speculative decoding on a device, write a profile."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from simulator.cli import app
from simulator.cli._common import console, user_errors, warn
from simulator.cli._tables import print_table_fast
from simulator.errors import HarnessError, UnknownPreset
from simulator.outputs import check_writable, open_output
from simulator.settings import LARGEST_COUNT, LARGEST_JOBS, LARGEST_TOKENS


def _ints(text: str | None, option: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise HarnessError(None, None, None, f"{option}: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise HarnessError(None, None, None, f"{option}: every value must be >= 1, got {text!r}")
    return values


def _floats(text: str | None, option: str) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise HarnessError(None, None, None, f"{option}: expected comma-separated numbers, got {text!r}") from None
    if not all(0 <= v < 1 for v in values):
        raise HarnessError(None, None, None, f"{option}: acceptance rates must be in [0, 1), got {text!r}")
    return values


def _user_dir() -> str:
    from simulator.bundled import user_profiles_dir

    return str(user_profiles_dir())


@app.command("profile")
def profile_cli(
    gpu: str | None = typer.Option(None, "--gpu", help="A CUDA device index to measure on (0, 1, ...), or a GPU whose "
                                   "measured per-op tables ship with simctl (a100-sxm, h100-sxm) to compose the profile from."),
    device: str | None = typer.Option(None, "--device", help="cpu, cuda or cuda:N (default: --gpu, else cpu)."),
    target: str | None = typer.Option(None, "--target", "--model", help="Target model preset (default qwen2.5-7b; with a "
                                      "named GPU it is required, and may be the path of a Hugging Face config.json)."),
    draft: str | None = typer.Option(None, "--draft", help="Draft model preset (default qwen2.5-0.5b; with a named GPU, tasks are decoded speculatively only when given)."),
    engine: str = typer.Option("cuda-graph", "--engine", help="With a named GPU: the engine: vllm, trtllm, sglang (host time fitted on public runs), cuda-graph (none), hf-eager (HF generate)."),
    backend: str | None = typer.Option(None, "--backend", help="With a named GPU: which of its measured tables (see --list-gpus; default: the --engine framework's, else the first)."),
    tp: int = typer.Option(1, "--tp", min=1, max=64, help="With a named GPU: tensor-parallel degree (weights, heads and GEMMs split; two all-reduces a layer from the measured tables)."),
    dtype: str = typer.Option("bf16", "--dtype", help="With a named GPU: weights and GEMMs in bf16 or fp8 (where the GPU's tables measured FP8)."),
    kv_dtype: str | None = typer.Option(None, "--kv-dtype", help="With a named GPU: the KV cache's dtype, bf16 or fp8 (default: --dtype)."),
    memory_utilization: float = typer.Option(0.9, "--gpu-memory-utilization", min=0.05, max=1.0, help="With a named GPU: share of GPU memory the engine takes (vLLM: 0.9); KV cache gets the rest."),
    list_gpus: bool = typer.Option(False, "--list-gpus", help="List the GPUs whose measured tables ship with simctl (memory, bandwidth, backends) and exit."),
    like: str = typer.Option("seed-calibrated", "--like", help="With a named GPU: the profile whose tasks (lengths, CPU tasks) the composed profile keeps."),
    spec_task: list[str] | None = typer.Option(None, "--spec-task", help="With a named GPU and --draft: a task decoded speculatively (repeat; default every GPU task)."),
    no_kv_cache: bool = typer.Option(False, "--no-kv-cache", help="With a named GPU and --draft: the speculative decoder keeps no KV cache (every pass over the whole sequence)."),
    max_rows: int = typer.Option(32, "--max-rows", min=1, max=LARGEST_COUNT, help="With a named GPU: the most rows a batch holds (the fit covers 1..this)."),
    batch: str | None = typer.Option(None, "--batch", help="Batch sizes, e.g. 1,2,4,8,16."),
    lookahead: str | None = typer.Option(None, "--lookahead", help="Lookaheads k, e.g. 1,3,5 (with a named GPU: one value, default 3)."),
    acceptance: str | None = typer.Option(None, "--acceptance", help="Injected acceptance rates, e.g. 0.5,0.7,0.9 (with a named GPU: one value, default 0.7)."),
    prompt_tokens: str | None = typer.Option(None, "--prompt-tokens", help="Prompt lengths, e.g. 128,512,2048."),
    max_tokens: int | None = typer.Option(None, "--max-tokens", min=1, max=LARGEST_TOKENS, help="Tokens generated per row (default 512)."),
    repeats: int | None = typer.Option(None, "--repeats", min=1, max=LARGEST_COUNT, help="Timed repeats per step (median, p10, p90)."),
    quick: bool = typer.Option(False, "--quick", help="A small grid on the tiny preset (under a minute on a CPU)."),
    no_graphs: bool = typer.Option(False, "--no-graphs", help="Do not capture CUDA graphs (GPU only)."),
    compile_: bool = typer.Option(False, "--compile", help="Run the model forwards through torch.compile."),
    output: Path | None = typer.Option(None, "--output", "-o", help=f"Profile to write [default: {_user_dir()}/<device>__<target>__<draft>.json, found by name with -p]."),
    threads: int = typer.Option(1, "--threads", min=1, max=LARGEST_JOBS, help="Intra-op threads torch may use while measuring (pinned, so other work on the machine moves the timings less)."),
    strict: bool = typer.Option(False, "--strict", help="Exit with status 1 when the fitted costs miss the held-out generations (the profile is still written)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing profile."),
    describes: str | None = typer.Option(None, "--describes", help="Which real system the profile stands for "
                                         "(default: a sentence said of the measurement or composition)."),
    answers: str | None = typer.Option(None, "--answers", help="Which question the profile answers "
                                       "(default: a sentence said of the measurement or composition)."),
    measure_ops: Path | None = typer.Option(
        None, "--measure-ops", metavar="DIR",
        help="Instead of a profile, measure this device's per-op tables (GEMMs, decode/verify/prefill attention, "
             "elementwise ops, timed with the harness's own torch ops) for the shapes of --model (a preset or a "
             "config.json; default llama-68m, tiny with --quick) and --draft, into DIR; load_gpu(DIR) and the "
             "composition's harness style read them. Uses --device or --gpu N, --threads, --quick and --force."),
) -> None:
    """Write a profile: measured by the harness on a device, or composed from a GPU's per-op tables.

    With --gpu N or --device: times prefill, draft steps, verification and plain decoding
    over the grid, then whole batched generations; fits a cost per operation and checks it on
    held-out generations. With --gpu a100-sxm|h100-sxm: composes every GPU task's kernel costs
    from NVIDIA's measured per-op tables of that GPU and adds the engine's host costs (no GPU
    and no torch needed).
    """
    if list_gpus:
        print_gpus()
        return
    if measure_ops is not None:
        with user_errors():
            measure_ops_cli(measure_ops, gpu, device, target, draft, threads, quick, force)
        return
    if gpu is not None and not gpu.isdigit():
        with user_errors():
            composed_profile(gpu, target, draft, engine, backend, like, spec_task, no_kv_cache, max_rows,
                             lookahead, acceptance, output, force, describes, answers, tp=tp, dtype=dtype,
                             kv_dtype=kv_dtype, memory_utilization=memory_utilization)
        return
    gpu_index = int(gpu) if gpu is not None else None
    with user_errors():
        try:
            import torch
        except ModuleNotFoundError:
            raise HarnessError(None, None, None, "simctl profile needs torch: pip install 'simctl-llm[harness]' "
                               "(for the CPU build: pip install torch==2.13.0)") from None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from simulator.harness.presets import get_preset
        from simulator.harness.profiler import Grid, default_output, resolve_device, run_profile, with_overrides

        base = Grid.quick() if quick else Grid()
        grid = with_overrides(
            base, target=target, draft=draft, batch=_ints(batch, "--batch"),
            lookahead=_ints(lookahead, "--lookahead"), acceptance=_floats(acceptance, "--acceptance"),
            prompt_tokens=_ints(prompt_tokens, "--prompt-tokens"), max_tokens=max_tokens, repeats=repeats,
            graphs=False if no_graphs else None, compile=True if compile_ else None,
        )
        for shape in (get_preset(grid.target), get_preset(grid.draft)):  # an unknown preset: UnknownPreset first
            if shape.experts:
                raise HarnessError(None, None, "--target", f"{shape.name} is a mixture of experts; the harness's "
                                   "decoder is dense (compose it instead: --gpu NAME --engine cuda-graph)")
        dev = resolve_device(gpu_index, device)
        out = output or default_profile_path(Path(default_output(dev, grid)).stem)
        check_writable(out, force=force)
        torch.set_num_threads(threads)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, transient=True) as bar:
            job = bar.add_task("profiling", total=grid.points())

            def tick(description: str) -> None:
                bar.update(job, advance=1, description=description)
            profile = run_profile(grid, dev, tick)
        profile["meta"]["threads"] = threads
        meta = profile["meta"]
        profile["describes"] = describes or (
            f"{grid.target} with a {grid.draft} draft, batched speculative decoding by simctl's torch decoder on "
            f"{meta.get('device')} ({meta.get('dtype')}, torch {meta.get('torch')}), timed on that device")
        profile["answers"] = answers or (
            f"How long batches of {grid.target} with a {grid.draft} draft take on {meta.get('device')} over the "
            f"measured grid (batch sizes, lookaheads, acceptance rates, prompt lengths)")
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
    if not check.get("held_out"):
        return "no held-out generations to check the fitted costs against"
    median, worst = check["median_ape"], check["max_ape"]
    if median > HELD_OUT_LIMITS[0] or worst > HELD_OUT_LIMITS[1]:
        return (f"the fitted costs miss held-out generations by median {100 * median:.0f} %, worst "
                f"{100 * worst:.0f} % (limits {100 * HELD_OUT_LIMITS[0]:.0f} % and {100 * HELD_OUT_LIMITS[1]:.0f} %)")
    return ""


def default_profile_path(stem: str) -> Path:
    """Where a measured profile goes by default: the per-user profile folder, under a name no
    bundled profile has (so ``-p NAME`` finds it and nothing bundled is ever overwritten).

    The folder is made here, on first use, as any program makes its own data folder; a
    folder the user names with ``--output`` is never made (its absence is an error)."""
    from simulator.bundled import names, user_profiles_dir

    if stem in names("profiles"):
        stem = f"{stem}-measured"
    folder = user_profiles_dir()
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{stem}.json"


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
    print_table_fast(table, console)
    if check["held_out"]:
        console.print(f"held-out generations: {check['held_out']}, absolute error of the composed prediction "
                      f"median {100 * check['median_ape']:.1f} %, max {100 * check['max_ape']:.1f} %", highlight=False)
    for err in meta["errors"]:
        console.print(f"[yellow]{err['op']} B={err['batch']}: {err['error']}[/yellow]")


def composed_profile(gpu: str, target: str | None, draft: str | None, engine: str, backend: str | None,
                     like: str, spec_tasks: list[str] | None, no_kv_cache: bool, max_rows: int,
                     lookahead: str | None, acceptance: str | None, output: Path | None, force: bool,
                     describes: str | None = None, answers: str | None = None, *,
                     tp: int = 1, dtype: str = "bf16", kv_dtype: str | None = None,
                     memory_utilization: float = 0.9) -> None:
    """``simctl profile --gpu NAME``: compose a profile from the GPU's tables (no torch)."""
    from simulator.hardware import load_gpu
    from simulator.hardware.engines import get_engine
    from simulator.hardware.grounded import GpuTask, grounded_profile
    from simulator.hardware.memory import memory_plan
    from simulator.harness.presets import load_shape
    from simulator.profile import load_profile, profile_from_dict

    if target is None:
        raise HarnessError(None, None, "--model", f"--gpu {gpu} composes a profile: name the target model "
                           "(--model qwen3-4b, ...)")
    try:
        target_shape = load_shape(target)
        draft_shape = load_shape(draft) if draft else None
    except UnknownPreset as exc:
        raise HarnessError(None, None, "--model", str(exc)) from None
    if backend is None and engine in ("vllm", "trtllm", "sglang"):
        # a named engine prices its kernels from its own framework's tables where the GPU has them
        from simulator.hardware import gpu_specs

        own = [b for b in gpu_specs().get(gpu, {}).get("backends", []) if b.startswith(engine + "-")]
        backend = own[0] if own else None
    tables = load_gpu(gpu, backend, dtype, kv_dtype, tp)
    # a model that does not fit is refused before anything is composed
    memory = memory_plan(tables, target_shape, draft_shape, memory_utilization)
    spec = get_engine(engine)
    ks = _ints(lookahead, "--lookahead") or (3,)
    alphas = _floats(acceptance, "--acceptance") or (0.7,)
    if len(ks) != 1 or len(alphas) != 1:
        raise HarnessError(None, None, "--lookahead", "with a named GPU give one lookahead and one acceptance")
    base = load_profile(like)
    gpu_tasks = [n for n, t in base.tasks.items() if t.resource == "gpu"]
    if not gpu_tasks:
        raise HarnessError(base.path, None, "tasks", "the --like profile has no GPU task to compose")
    chosen = set(spec_tasks or (gpu_tasks if draft_shape else []))
    unknown = sorted(chosen - set(gpu_tasks))
    if unknown:
        raise HarnessError(None, None, "--spec-task", f"{unknown[0]!r} is not a GPU task of {base.name} "
                           f"({', '.join(gpu_tasks)})")
    if chosen and draft_shape is None:
        raise HarnessError(None, None, "--spec-task", "speculative tasks need a --draft model")
    tasks = [GpuTask(n, base.tasks[n].prompt_tokens, base.tasks[n].max_tokens, max_rows, n in chosen)
             for n in gpu_tasks]
    data = grounded_profile(base.to_dict() | {"name": base.name}, tables, spec, target_shape, draft_shape,
                            tasks=tasks, kv_cache=not no_kv_cache, lookahead=ks[0], acceptance=alphas[0],
                            memory=memory, describes=describes, answers=answers)
    out = output or default_profile_path(data["name"])
    data["name"] = out.stem   # found by this name with -p
    profile_from_dict(data)   # what is written must load
    check_writable(out, force=force)
    with open_output(out, force=force) as fh:
        json.dump(data, fh, indent=1)
        fh.write("\n")
    print_composed(data, out)


def print_composed(data: dict, path: Path) -> None:
    """What was composed, each GPU task's fit against the composition and its provenance."""
    from rich.table import Table

    g = data["meta"]["grounded"]
    group = f"{g['tp']} × {g['gpu']}" if g.get("tp", 1) > 1 else g["gpu"]
    console.print(f"wrote {path}: {g['model']}{' + ' + g['draft'] if g['draft'] else ''} on {group} "
                  f"({g['backend']} tables, {g.get('dtype', 'bf16')} weights, {g.get('kv_dtype', 'bf16')} KV cache), "
                  f"engine {g['engine']}", highlight=False)
    if "memory" in g:
        m = g["memory"]
        console.print(f"memory per GPU: {m['weights_bytes'] / 1e9:.1f} GB weights, {m['activation_bytes'] / 1e9:.1f} GB "
                      f"activations, {m['runtime_bytes'] / 1e9:.1f} GB runtime, {m['kv_bytes'] / 1e9:.1f} GB KV cache "
                      f"({m['kv_tokens']:,} tokens) of {m['usable_bytes'] / 1e9:.1f} GB usable", highlight=False)
    table = Table(title="GPU tasks: kernel costs fitted to the composition", title_justify="left")
    for col in ("task", "kind", "fit error (median / max)", "seconds exact / interp. / extrap. / assumed",
                "kernels per pass", "host share of a batch"):
        table.add_column(col)
    for name, meta in g["tasks"].items():
        service = data["tasks"][name]["service"]
        errors = "; ".join(f"{op} {100 * f['median']:.1f} / {100 * f['max']:.1f} %" for op, f in meta["fit"].items())
        shares = " / ".join(f"{100 * meta['provenance'].get(t, 0):.0f} %" for t in ("exact", "interpolated", "extrapolated", "assumed"))
        kernels = ", ".join(f"{k} {v:.0f}" for k, v in service["engine"]["kernels"].items())
        host = ", ".join(f"{100 * v:.0f} % at {k}" for k, v in meta["host_share"].items())
        table.add_row(name, service["kind"], errors, shares, kernels, host)
    print_table_fast(table, console)
    engine = next(iter(data["tasks"][n]["service"]["engine"] for n in g["tasks"]))
    console.print("engine host costs (calibrate frees these): " + ", ".join(
        f"{p} = {engine[p]:.3g}" for p in ("launch_s", "step_s", "row_s")) + f"; interpreter share {engine['interpreter_share']:g}",
        highlight=False)


def print_gpus() -> None:
    """``simctl profile --list-gpus``: the shipped GPUs, their spec figures and what was measured,
    one GPU a line (never cut to the terminal's width)."""
    from simulator.hardware import gpu_specs

    console.print("GPUs with measured per-op tables (NVIDIA aiconfigurator-core 0.12.0; "
                  "simulator/hardware/data/README.md):", highlight=False)
    for name, spec in gpu_specs().items():
        first = spec.get("measured", {}).get(spec["backends"][0], {})
        fp8 = spec.get("fp8_flops_per_s")
        peaks = f"bf16 {spec['bf16_flops_per_s'] / 1e12:,.0f}" + (f" / fp8 {fp8 / 1e12:,.0f}" if fp8 else "")
        console.print(
            f"  {name:<20} {spec.get('device', '')}: {spec['memory_bytes'] / 2**30:.0f} GiB, "
            f"{spec['memory_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s, {peaks} TFLOPS, "
            f"{spec.get('interconnect_bytes_per_s', 0) / 1e9:.0f} GB/s between GPUs; --backend "
            f"{', '.join(spec['backends'])} (first: default); --dtype {', '.join(first.get('gemm', ['bf16']))}; "
            f"--tp {', '.join(str(t) for t in [1, *first.get('allreduce_gpus', [])])}",
            highlight=False, soft_wrap=True)


def measure_ops_cli(out: Path, gpu: str | None, device: str | None, model: str | None, draft: str | None,
                    threads: int, quick: bool, force: bool) -> None:
    """``simctl profile --measure-ops DIR``: this device's per-op tables for the presets' shapes."""
    try:
        import torch
    except ModuleNotFoundError:
        raise HarnessError(None, None, None, "--measure-ops needs torch: pip install 'simctl-llm[harness]' "
                           "(for the CPU build: pip install torch==2.13.0)") from None
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from simulator.hardware.tables import SPEC_FILE
    from simulator.harness.optable import OpGrid, measure_op_tables, memory_bytes
    from simulator.harness.presets import load_shape
    from simulator.harness.profiler import device_name, resolve_device

    if gpu is not None and not gpu.isdigit():
        raise HarnessError(None, None, "--gpu", f"with --measure-ops, --gpu takes a CUDA device index, not {gpu!r}")
    shapes = [load_shape(name) for name in dict.fromkeys(
        [n for n in (draft, model or ("tiny" if quick else "llama-68m")) if n])]
    dev = resolve_device(int(gpu) if gpu is not None else None, device)
    if out.exists() and not out.is_dir():
        raise HarnessError(out, None, None, "is a file; --measure-ops writes a folder")
    if (out / SPEC_FILE).exists() and not force:
        raise HarnessError(out, None, None, "already holds measured op tables; use --force to replace them")
    grid = (OpGrid.for_shapes(shapes, batches=(1, 2), contexts=(8, 16, 32), lookaheads=(2,), prompt_tokens=(8,),
                              repeats=3, warmup=1, point_seconds=0.02, elementwise_numel=(16, 1024, 65536))
            if quick else OpGrid.for_shapes(shapes))
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    needed, available = grid.weight_bytes(torch.finfo(dtype).bits // 8), memory_bytes(dev)
    if available is not None and needed > available / 2:
        raise HarnessError(None, None, "--model", f"timing GEMMs inside passes of "
                           f"{', '.join(s.name for s in shapes)} holds {needed / 1e9:.1f} GB of weights; "
                           f"{device_name(dev)} has {available / 1e9:.1f} GB: choose smaller models")
    torch.set_num_threads(threads)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        job = bar.add_task("measuring op tables", total=grid.points())
        try:
            spec = measure_op_tables(dev, dtype, grid, out,
                                     lambda description: bar.update(job, advance=1, description=description))
        except torch.cuda.OutOfMemoryError:
            raise HarnessError(None, None, None, f"out of memory on {device_name(dev)} measuring the op tables "
                               f"of {', '.join(s.name for s in shapes)}") from None
    console.print(f"wrote {out}: per-op tables of {spec['device']} ({spec['dtype']}, torch {spec['torch']}, "
                  f"{spec['threads']} thread(s)) for {', '.join(s.name for s in shapes)}: {len(grid.gemm)} GEMMs, "
                  f"{len(grid.decode_attention) + len(grid.verify_attention) + len(grid.prefill_attention)} attention "
                  f"points, {len(spec['elementwise']['ops'])} elementwise ops, in {spec['seconds_taken']:.0f} s; copy "
                  f"bandwidth {spec['memory_bandwidth_bytes_per_s'] / 1e9:,.1f} GB/s. Compose with "
                  f"load_gpu({str(out)!r}) and style 'harness'.", highlight=False)
