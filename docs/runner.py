"""Run the console examples of the README and of docs/, so that they cannot drift.

A fenced block marked ``python`` runs as a script, in this process (its exit status is
checked: non-zero where it raises, as ``python -c`` would exit). A fenced
block marked ``console`` holds commands (lines starting ``$ ``), each followed by
the output it prints. :func:`run_page` runs every command of a page in one fresh temporary
folder (so bundled names are used, not the checkout's paths, and files a command writes are
there for the next), with a fixed terminal (``COLUMNS=100``, no colour), and returns each
block with the output the commands print now. A line ``...`` in an expected output matches
any lines (timings, paths); ``...`` inside a line matches any text.

An HTML comment on the line before a block changes how it is treated:
``<!-- docs: skip -->`` — not run (installation, a GPU); ``<!-- docs: no-compare -->`` —
run, its exit status checked, its output not compared.

The README's first command runs as a real process (``simctl`` as installed, through a
shell), so the examples exercise the installed entry point; it is the same entry point on
every page, so the other pages need not start it again. Every other command that is plain
``simctl`` with arguments (no pipes, redirections, variables or globs), alone or followed by
``|| echo "exit status $?"`` (the pages' way of showing a failing command's status), runs in
this process through typer's ``CliRunner``, with the same argument list, folder and
environment: it prints the same, without paying the interpreter's and the libraries' start-up
again. Any other command runs through a shell, as the reader would type it. A ``python`` block runs in this
process too (as ``__main__``, in the page's folder and environment): a fresh interpreter
would only pay the imports again, and the entry point is the first command's to exercise.

    python docs/build.py        # rewrite the expected outputs from a fresh run
    pytest tests/test_docs.py   # fail where a page's output differs from a fresh run
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: the page whose first command runs as a real process
ENTRY_POINT_PAGE = ROOT / "README.md"
_FENCE = re.compile(r"^```(console|python)\n(.*?)^```\n", re.S | re.M)


@dataclass
class Block:
    """One console block: where it is in the page, its commands and the outputs written there."""

    start: int
    end: int
    mode: str                       # "run", "no-compare" or "skip"
    commands: list[str] = field(default_factory=list)
    expected: list[str] = field(default_factory=list)
    actual: list[str] = field(default_factory=list)
    status: list[int] = field(default_factory=list)


def parse(text: str) -> list[Block]:
    """The console blocks of a page."""
    blocks = []
    for m in _FENCE.finditer(text):
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        mode = {"<!-- docs: skip -->": "skip", "<!-- docs: no-compare -->": "no-compare"}.get(before, "run")
        if m.group(1) == "python":
            # A Python example runs as a script; its exit status is checked, not its output.
            block = Block(m.start(2), m.end(2), "skip" if mode == "skip" else "python", [m.group(2)], [""])
            blocks.append(block)
            continue
        block = Block(m.start(2), m.end(2), mode)
        current: list[str] | None = None
        for line in m.group(2).splitlines():
            if line.startswith("$ "):
                block.commands.append(line[2:])
                current = []
                block.expected.append("")
            elif current is not None:
                block.expected[-1] += line + "\n"
        blocks.append(block)
    return blocks


def _environment(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "CLICOLOR_FORCE")}
    env.update(COLUMNS="100", LINES="50", NO_COLOR="1", TERM="dumb", SIMCTL_HOME=str(home))
    # the simctl of this interpreter's environment first
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


#: Quoted words without expansions inside; what is left outside them must be plain words.
_QUOTED = re.compile(r"'[^']*'|\"[^\"$`\\\\!]*\"")
_PLAIN = re.compile(r"[A-Za-z0-9_.,:/=@+%\- ]*")


#: A command followed by the status it exits with where that is not 0.
_OR_ECHO_STATUS = re.compile(r'(.*?)\s+\|\|\s+echo "exit status \$\?"')


def in_process_or_echo_argv(command: str) -> list[str] | None:
    """The arguments of the ``simctl`` command of ``command`` when it is
    ``SIMCTL_COMMAND || echo "exit status $?"`` and ``SIMCTL_COMMAND`` runs in this process
    (:func:`in_process_argv`); ``None`` otherwise."""
    m = _OR_ECHO_STATUS.fullmatch(command)
    return in_process_argv(m.group(1)) if m else None


def in_process_argv(command: str) -> list[str] | None:
    """The arguments of ``command`` when it is ``simctl`` with arguments a shell would pass
    unchanged (quotes removed); ``None`` when a shell would do more (pipes, redirections,
    variables, globs, comments, ``||``) or the command is not ``simctl``."""
    if not _PLAIN.fullmatch(_QUOTED.sub("", command)):
        return None
    argv = shlex.split(command)
    return argv[1:] if argv and argv[0] == "simctl" else None


def _run_in_process(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[str, int]:
    """Run ``simctl ARGS`` in this process: its stdout then its stderr, and its exit status,
    as :func:`subprocess.run` would give them."""
    out, err, status = _run_in_process_streams(args, cwd, env)
    return out + err, status


def _run_in_process_or_echo(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[str, int]:
    """``simctl ARGS || echo "exit status $?"`` in this process, as :func:`subprocess.run`
    would give it: the command's stdout, the echoed status where it is not 0 (stdout too,
    after the command's), then the command's stderr; the status of the whole is 0."""
    out, err, status = _run_in_process_streams(args, cwd, env)
    return out + (f"exit status {status}\n" if status else "") + err, 0


def _run_in_process_streams(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[str, str, int]:
    """Run ``simctl ARGS`` in this process: its stdout, its stderr and its exit status."""
    import traceback

    from typer.testing import CliRunner

    from simulator.cli import _common, app

    # The command's consoles were made when simctl was imported, perhaps under another
    # terminal width: give them the page's for this command.
    consoles = (_common.console, _common.err_console)
    saved = [(c._width, c._height) for c in consoles]
    for c in consoles:
        c.size = (int(env["COLUMNS"]), int(env["LINES"]))
    here = os.getcwd()
    os.chdir(cwd)
    try:
        unset: dict[str, str | None] = {k: None for k in ("FORCE_COLOR", "CLICOLOR_FORCE")}
        result = CliRunner().invoke(app, args, env={**env, **unset})
    finally:
        os.chdir(here)
        for c, (width, height) in zip(consoles, saved, strict=True):
            c._width, c._height = width, height
    err = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit) and result.exc_info:
        err += "".join(traceback.format_exception(*result.exc_info))   # as an uncaught one would print
    return result.stdout, err, result.exit_code


@contextlib.contextmanager
def _page_process(cwd: Path, env: dict[str, str]) -> Iterator[None]:
    """This process in ``cwd`` with environment ``env`` (both restored afterwards)."""
    here, saved = os.getcwd(), dict(os.environ)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
        os.chdir(here)


def _run_python_in_process(source: str, cwd: Path, env: dict[str, str]) -> tuple[str, int]:
    """Run ``source`` as ``python -c`` would, in this process: what it prints (stdout and
    stderr, a traceback where it raises) and the exit status the interpreter would give."""
    import traceback

    out, err = io.StringIO(), io.StringIO()
    status = 0
    with _page_process(cwd, env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            exec(compile(source, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        except SystemExit as stop:
            # sys.exit(None) and sys.exit(0) exit 0; an integer is the status; anything
            # else is printed and exits 1, as the interpreter does
            if isinstance(stop.code, int):
                status = stop.code
            elif stop.code is not None:
                print(stop.code, file=sys.stderr)
                status = 1
        except BaseException as error:
            # the traceback from the example's own frames on, as the interpreter prints it
            assert error.__traceback__ is not None
            traceback.print_exception(type(error), error, error.__traceback__.tb_next)
            status = 1
    return out.getvalue() + err.getvalue(), status


def run_page(page: Path) -> tuple[str, list[Block]]:
    """Run every block of ``page``; its text and the blocks with what they print now."""
    text = page.read_text()
    blocks = parse(text)
    with tempfile.TemporaryDirectory(prefix="simctl-docs-") as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        env = _environment(Path(tmp) / "home")
        first = page == ENTRY_POINT_PAGE
        for block in blocks:
            if block.mode == "skip":
                block.actual = list(block.expected)
                continue
            for command in block.commands:
                args = None if block.mode == "python" or first else in_process_argv(command)
                echo_args = None if block.mode == "python" or first else in_process_or_echo_argv(command)
                if block.mode == "python":
                    out, status = _run_python_in_process(command, work, env)
                elif args is not None:
                    out, status = _run_in_process(args, work, env)
                elif echo_args is not None:
                    out, status = _run_in_process_or_echo(echo_args, work, env)
                else:
                    done = subprocess.run(command, shell=True, cwd=work, env=env,
                                          capture_output=True, text=True, timeout=600)
                    out, status = done.stdout + done.stderr, done.returncode
                    first = False
                block.actual.append("\n".join(line.rstrip() for line in out.splitlines()) + ("\n" if out else ""))
                block.status.append(status)
        shutil.rmtree(work, ignore_errors=True)
    return text, blocks


def matches(expected: str, actual: str) -> bool:
    """``actual`` fits ``expected``, where a line ``...`` stands for any lines and ``...``
    within a line for any text."""
    parts = []
    for line in expected.rstrip("\n").split("\n"):
        if line.strip() == "...":
            parts.append(r"(?:.*\n)*?")
        else:
            parts.append(".*?".join(re.escape(p) for p in line.rstrip().split("...")) + r"\n")
    return re.fullmatch("".join(parts), actual.rstrip("\n") + "\n") is not None


def render(text: str, blocks: list[Block]) -> str:
    """``text`` with every compared block's outputs replaced by what its commands print now
    (an expected output that still matches, wildcards included, is kept as written)."""
    out, last = [], 0
    for block in blocks:
        out.append(text[last:block.start])
        if block.mode == "python":
            out.append(block.commands[0])
            last = block.end
            continue
        body = ""
        for command, expected, actual in zip(block.commands, block.expected, block.actual, strict=True):
            keep = block.mode != "run" or matches(expected, actual)
            body += f"$ {command}\n" + (expected if keep else actual)
        out.append(body)
        last = block.end
    out.append(text[last:])
    return "".join(out)
