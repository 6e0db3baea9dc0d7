"""``simctl serve``: run a scenario's server for real behind HTTP (the library: :mod:`simulator.serve`)."""

from __future__ import annotations

import asyncio
import importlib.util
import math
from typing import Any

import typer

from simulator.cli import app
from simulator.cli._common import console, user_errors
from simulator.errors import ServeError
from simulator.profile import DEFAULT_PROFILE
from simulator.settings import LARGEST_COUNT, LARGEST_JOBS, LARGEST_SEED, LARGEST_TOKENS

#: The packages of the ``serve`` extra (imported only when a server starts).
SERVE_EXTRA = ("fastapi", "uvicorn", "prometheus_client")


def missing_extra() -> str | None:
    """The first package of the ``serve`` extra that is not installed, else ``None``."""
    for name in SERVE_EXTRA:
        if importlib.util.find_spec(name) is None:
            return name
    return None


@app.command("serve")
def serve_cli(
    scenario: str = typer.Option(..., "--scenario", "-s", "--config", "-c", help="Scenario: TOML file or bundled name (design-notes, ...)."),
    profile: str = typer.Option(DEFAULT_PROFILE, "--profile", "-p", help="Profile JSON file or bundled profile name: the tasks served and, for the sleep backend, their service times."),
    backend: str = typer.Option("sleep", "--backend", help="sleep (the profile's service times), harness (the torch decoder, a thread per GPU) "
                                 "or openai:URL[,URL...] (one OpenAI-compatible engine per GPU of the scenario)."),
    time_scale: float = typer.Option(1.0, "--time-scale", help="Sleep backend: run the server this many times faster than the modeled "
                                    "system (service times, flush windows and queue timeouts all divided by it)."),
    seed: int = typer.Option(0, "--seed", min=0, max=LARGEST_SEED, help="Seed of the service-time and dispatch streams (sleep backend: same seed, same draws as replay)."),
    set_values: list[str] = typer.Option([], "--set", help="Override any scenario field: KEY=VALUE with a dotted KEY, e.g. run.gpus=1 or tasks.mmlu.flush=0.2 (repeatable)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="Port to listen on (0: any free port)."),
    batch_timeout: float = typer.Option(600.0, "--batch-timeout", help="Seconds a batch may take on its backend before its prompts get error replies (a stalled backend never hangs a call)."),
    grace: float = typer.Option(30.0, "--grace", help="On SIGINT/SIGTERM: seconds in-flight batches may take to finish (queued prompts get error replies at once)."),
    harness_model: str = typer.Option("tiny", "--harness-model", help="Harness backend: the target model preset."),
    harness_draft: str = typer.Option("tiny", "--harness-draft", help="Harness backend: the draft model preset."),
    harness_device: str | None = typer.Option(None, "--harness-device", help="Harness backend: cpu, cuda or cuda:N for every GPU of the scenario (default cuda:i where there is one, else cpu)."),
    harness_threads: int = typer.Option(1, "--harness-threads", min=0, max=LARGEST_JOBS, help="Harness backend: torch's intra-op threads (1, as simctl profile measures; 0: torch's default)."),
    engine_model: str | None = typer.Option(None, "--engine-model", help="OpenAI backend: the model name sent to the engines (default: the first one their "
                                        "/v1/models lists); also the name this server serves under (default simctl)."),
    per_prompt: bool = typer.Option(False, "--per-prompt", help="OpenAI backend: send each prompt of a batch as its own request, all at "
                                    "once (for engines that take one prompt per request). Default: a list per batch, falling back to "
                                    "one request per prompt for good if an engine refuses a list."),
    default_task: str | None = typer.Option(None, "--default-task", help="The task of a prompt whose task this server does not "
                                        "serve (no keyword rule matches it, as a benchmark client's synthetic text): a task of the "
                                        "profile, or none to refuse such prompts (HTTP 400; the batch endpoint's error reply). "
                                        "Default: the profile's first task that runs on a GPU in the scenario (infobench for "
                                        "design-notes)."),
    log_level: str = typer.Option("warning", "--log-level", help="uvicorn's log level (critical, error, warning, info, debug)."),
    api_key: str | None = typer.Option(None, "--api-key", envvar="SIMCTL_API_KEY", show_envvar=True,
                                       help="Require 'Authorization: Bearer KEY' on every endpoint but /health (else 401). "
                                       "Prefer the environment variable: a command line is visible to other users."),
    max_body: str = typer.Option("16MiB", "--max-body", help="Largest request body: bytes, or with a unit (512kB, 16MiB, 1GB); "
                                 "larger is refused with 413 before it is read."),
    max_prompts: int = typer.Option(1024, "--max-prompts", min=1, max=LARGEST_COUNT, help="Most prompts in one call of the batch endpoint."),
    max_prompt_tokens: int = typer.Option(1_000_000, "--max-prompt-tokens", min=1, max=LARGEST_TOKENS,
                                          help="Most tokens in one prompt (estimated, 4 characters a token); longer is refused."),
    max_output_tokens: int = typer.Option(1_000_000, "--max-output-tokens", min=1, max=LARGEST_TOKENS,
                                          help="Largest max_tokens a request may ask for."),
    read_timeout: float = typer.Option(30.0, "--read-timeout", help="Seconds a client has to send a request's headers, and "
                                       "then its body; a stalled one is closed (408 for a body)."),
    max_concurrent: int = typer.Option(1024, "--max-concurrent", min=0, max=LARGEST_COUNT,
                                       help="Most requests in flight; one more gets 429 with Retry-After (0: no limit)."),
    max_json_depth: int = typer.Option(64, "--max-json-depth", min=1, max=10_000, help="Deepest nesting of arrays and objects "
                                       "in a request body; deeper is refused with 400."),
) -> None:
    """Serve SCENARIO over HTTP: its queues, workers, dispatch and GPU locks, for real.

    The users' batch endpoint (POST / {"prompt": [texts], "max_tokens": M}; failures are HTTP
    200 {"error", "traceback"} as theirs), OpenAI-compatible /v1/completions and
    /v1/chat/completions (one prompt and one choice each, streaming with "stream": true,
    usage in the stream with stream_options.include_usage; failures have proper status codes
    and OpenAI's error body, a stream's too until its batch starts) and Prometheus metrics at
    /metrics. A prompt no keyword rule gives a served task goes to --default-task.
    SIGINT/SIGTERM: queued calls get error replies, in-flight batches finish. Limits (--max-body,
    --max-prompts, --max-prompt-tokens, --read-timeout, --max-concurrent, --max-json-depth) and
    --api-key refuse what a hostile or broken client sends, with a status code and OpenAI's
    error body; no reply carries a traceback (an error id points to the server's log).
    """
    with user_errors():
        missing = missing_extra()
        if missing is not None:
            raise ServeError(None, None, None, f"simctl serve needs the serve extra (missing the Python package "
                             f"{missing!r}): pip install 'simctl-llm[serve]'")
        limits = make_limits(max_body, max_prompts, max_prompt_tokens, max_output_tokens, read_timeout,
                             max_concurrent, max_json_depth, api_key)
        serve_app = make_server(scenario, profile, backend, time_scale, seed, set_values, batch_timeout, grace,
                                harness_model, harness_draft, harness_device, engine_model, harness_threads,
                                default_task=default_task, per_prompt=per_prompt, limits=limits)
        if not 0 <= port <= 65535:
            raise ServeError(None, None, "--port", f"must be between 0 and 65535, got {port}")
        if log_level not in ("critical", "error", "warning", "info", "debug", "trace"):
            raise ServeError(None, None, "--log-level", f"must be one of critical, error, warning, info, debug, "
                             f"got {log_level!r}")
    run_server(serve_app, host, port, log_level)


def make_limits(max_body: str, max_prompts: int, max_prompt_tokens: int, max_output_tokens: int,
                read_timeout: float, max_concurrent: int, max_json_depth: int, api_key: str | None) -> Any:
    """The :class:`~simulator.serve.guard.Limits` the options describe (a typed error names a
    bad one)."""
    from simulator.serve.guard import Limits, parse_size

    try:
        body = parse_size(max_body)
    except ValueError as exc:
        raise ServeError(None, None, "--max-body", str(exc)) from None
    if not (read_timeout > 0 and math.isfinite(read_timeout)):
        raise ServeError(None, None, "--read-timeout", f"must be a number of seconds > 0, got {read_timeout}")
    if api_key is not None and not api_key.strip():
        raise ServeError(None, None, "--api-key", "must not be empty")
    return Limits(max_body=body, read_timeout=read_timeout, max_depth=max_json_depth,
                  max_concurrent=max_concurrent or None, max_prompts=max_prompts,
                  max_prompt_tokens=max_prompt_tokens, max_output_tokens=max_output_tokens,
                  api_key=None if api_key is None else api_key.strip())


def make_server(scenario: str, profile: str, backend: str, time_scale: float, seed: int, set_values: list[str],
                batch_timeout: float, grace: float, harness_model: str, harness_draft: str,
                harness_device: str | None, engine_model: str | None, harness_threads: int = 1, *,
                default_task: str | None = None, per_prompt: bool = False, limits: Any = None) -> Any:
    """The :class:`~simulator.serve.app.ServeApp` the options describe (typed errors for bad ones).
    ``default_task``: a task name, ``"none"`` (refuse prompts of no served task) or ``None``
    (the profile's first GPU task, :func:`~simulator.serve.runtime.first_gpu_task`)."""
    from simulator.profile import load_profile
    from simulator.scenario import build_scenario, check_tasks, parse_set
    from simulator.serve.app import build_app
    from simulator.serve.backends import backend_from_spec
    from simulator.serve.runtime import first_gpu_task

    if not time_scale > 0:
        raise ServeError(None, None, "--time-scale", f"must be > 0, got {time_scale}")
    if time_scale != 1 and backend != "sleep":
        raise ServeError(None, None, "--time-scale", "only the sleep backend runs on a scaled clock (a real "
                         "backend takes real time)")
    if not batch_timeout > 0:
        raise ServeError(None, None, "--batch-timeout", f"must be > 0, got {batch_timeout}")
    if harness_threads < 0:
        raise ServeError(None, None, "--harness-threads", f"must be >= 0, got {harness_threads}")
    if not grace >= 0:
        raise ServeError(None, None, "--grace", f"must be >= 0, got {grace}")
    if per_prompt and not backend.startswith("openai:"):
        raise ServeError(None, None, "--per-prompt", "only the openai backend sends requests to engines")
    prof = load_profile(profile)
    scen = build_scenario(path=scenario, overrides=parse_set(set_values))
    check_tasks(scen, prof.tasks, None, f"the profile {prof.name}")
    if default_task is None:
        fallback = first_gpu_task(scen, prof)
    elif default_task == "none":
        fallback = None
    elif default_task in prof.tasks:
        fallback = default_task
    else:
        raise ServeError(None, None, "--default-task", f"unknown task {default_task!r}; valid: "
                         f"{', '.join([*prof.tasks, 'none'])}")
    chosen = backend_from_spec(backend, target=harness_model, draft=harness_draft, device=harness_device,
                               model=engine_model, threads=harness_threads, per_prompt=per_prompt)
    return build_app(scen, prof, chosen, seed=seed, time_scale=time_scale, batch_timeout=batch_timeout,
                     grace=grace, model_name=engine_model or "simctl", default_task=fallback, limits=limits)


def run_server(serve_app: Any, host: str, port: int, log_level: str) -> None:
    """Run ``serve_app`` on uvicorn until SIGINT/SIGTERM; the signal starts the graceful
    shutdown at once (queued prompts fail, so their connections close), then uvicorn waits
    for the in-flight ones."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            loop = getattr(serve_app, "loop", None)
            if loop is not None:
                loop.call_soon_threadsafe(serve_app.begin_shutdown)
            super().handle_exit(sig, frame)

    config = uvicorn.Config(serve_app.app, host=host, port=port, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=int(serve_app.grace) + 5, http=serve_app.http_protocol())
    server = Server(config)
    runtime = serve_app.runtime

    async def main() -> None:
        serve_app.loop = asyncio.get_running_loop()
        task = asyncio.get_running_loop().create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started:
            bound = [s.getsockname() for srv in server.servers for s in srv.sockets]
            where = f"http://{host}:{bound[0][1]}" if bound else f"http://{host}:{port}"
            default = runtime.default_task or "none"
            console.print(f"serving {runtime.scenario.name} (profile {runtime.profile.name}, backend "
                          f"{runtime.backend.name}, tasks {', '.join(runtime.tasks)}, default task {default}, "
                          f"model {serve_app.model_name}) at {where}: batch endpoint POST /, OpenAI {where}/v1, "
                          f"metrics {where}/metrics", highlight=False, soft_wrap=True)
        await task

    try:
        asyncio.run(main())
    except KeyboardInterrupt:  # uvicorn raises the captured SIGINT again once it has shut down
        pass
    if not server.started:
        raise typer.Exit(1)


__all__ = ["make_limits", "make_server", "run_server", "serve_cli"]
