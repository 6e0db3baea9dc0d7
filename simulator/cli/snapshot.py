"""``simctl snapshot``: take a snapshot of a running system (what waits and runs now) as JSON."""

from __future__ import annotations

import json

import typer

from simulator.cli import app
from simulator.cli._common import console, user_errors, write_json


@app.command("snapshot")
def snapshot_cli(
    source: str = typer.Argument(..., help="A server's base URL (simctl serve: its /state, else its /metrics; "
                                 "vLLM: its /metrics), a saved metrics text file, or a run folder of simctl load "
                                 "(with --at)."),
    out: str = typer.Option("-", "--output", "-o", help="Write the snapshot JSON to FILE ('-': standard output)."),
    at: float | None = typer.Option(None, "--at", min=0, help="For a run folder: the instant, seconds into the "
                                    "run (the trace's seconds)."),
    api_key: str | None = typer.Option(None, "--api-key", envvar="SIMCTL_API_KEY", show_envvar=True,
                                       help="Sent as 'Authorization: Bearer KEY' (a server started with "
                                       "--api-key)."),
    timeout: float = typer.Option(10.0, "--timeout", min=0.1, help="Seconds to wait for the server's answer."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output file."),
) -> None:
    """Take a snapshot of a running system (what waits and runs now) as JSON.

    The snapshot (format simctl-snapshot/1) lists per queue the waiting prompts and per
    batch the running prompts, with their ages, tokens and elapsed service where the
    source knows them; `replay --from-state` starts from it. What the source cannot know
    is null, and its `unknown` list says so.
    """
    with user_errors():
        from simulator.snapshot import take_snapshot

        snapshot = take_snapshot(source, at=at, api_key=api_key, timeout=timeout)
        if write_json(json.dumps(snapshot.to_dict(), indent=2), out, force):
            return
        taken = "–" if snapshot.taken_at is None else f"{snapshot.taken_at:g} s"
        console.print(f"{out}: snapshot of {snapshot.location} ({snapshot.source_kind}, taken at {taken}): "
                      f"{snapshot.waiting_prompts} prompt(s) waiting, {snapshot.running_prompts} in "
                      f"{len(snapshot.running)} running batch(es)", highlight=False)
        for unknown in snapshot.unknown:
            console.print(f"  not known: {unknown}", highlight=False)
