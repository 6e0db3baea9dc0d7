"""Hostile outputs: special files, concurrent writers, full disks and read-only folders.

Each class tries ``examples`` cases and counts those handled as promised (README, "Outputs";
``simulator/outputs.py``):

* onto a special file: a character device (only ``/dev/null`` and ``/dev/full``, which a
  wrong write could not harm, named directly or through a link) is written through and is
  still a character device afterwards; a FIFO with a reader gets the whole output, one
  without a reader, a socket and a sweep's results on a device are refused in one line;
* concurrent writers: a second writer of one output waits for the first (saying so in one
  line) and then obeys ``--force`` as if it had come second; a second sweep into one results
  file runs only the rows the first did not, and the file ends with the rows of both;
* full disk, file-size limit, read-only folder: exit 2, one ``error:`` line naming the
  output (never its ``.part`` or ``.lock`` file), no ``.part`` file left, the previous file
  byte-identical.

No case depends on timing: writers are ordered by the lock itself (a process holds it, the
second writer says it waits, then the first lets go); timeouts are hang guards only.

A case's simctl process is a fork of this interpreter (``benchmarks/live_twin.py``'s
``ForkedSimctl``): a process of its own, with its own folder, environment, limits, output
files, locks and exit status, as a shell starts one, that skips the second of imports a fresh
interpreter spends before the command (what a case checks is the command's outputs).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
#: Seconds any one process of a case may take before it counts as hung.
HANG_GUARD = 300


@functools.lru_cache(maxsize=1)
def small_trace() -> Path:
    """A 12-call trace (a replay of it takes a fraction of a second)."""
    from simulator.trace.formats import load_trace, save_trace
    from simulator.trace.model import Trace

    d = Path(tempfile.mkdtemp(prefix="simctl-outputs-"))
    full = load_trace(ROOT / "traces" / "batch_arrivals.json")
    trace = d / "trace.json"
    save_trace(Trace(calls=full.calls[:12], meta=full.meta, source=full.source), trace)
    return trace


#: Appended to a replay run in a fresh process: the reference engine, which a 12-call trace
#: needs no compiled kernel for, spares each such process a second of start-up (loading the
#: kernel); what these cases check is the outputs, which every engine writes alike.
NO_KERNEL = ("--set", "run.engine=reference")


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def start_simctl(args: Sequence[str], cwd: Path, *, stdout: Path | None = None,
                 preexec: Callable[[], None] | None = None, **extra: str) -> tuple[Any, Path]:
    """``simctl ARGS`` as a process of its own, forked from this interpreter, in ``cwd``, with
    ``extra`` in its environment, ``preexec`` run in it first (a limit) and its stdout
    ``stdout`` if given (as a shell's ``>`` opens it; else a pipe, the process's ``stdout``).
    Its stderr goes to a file outside ``cwd``, returned too (:func:`finish` reads and removes
    it)."""
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    from live_twin import ForkedSimctl

    fd, name = tempfile.mkstemp(prefix="simctl-stderr-")
    os.close(fd)

    def setup() -> None:
        os.chdir(cwd)
        os.environ.update(extra)
        if preexec is not None:
            preexec()
        if stdout is not None:
            os.dup2(os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 1)

    return ForkedSimctl(list(args), Path(name), setup), Path(name)


def first_line(proc: Any, stderr: Path) -> str:
    """The first line ``proc`` writes to ``stderr``, once whole (or all it wrote, if it ended
    first). Polls the file: it waits on the process, never on a clock (the limit is a hang
    guard)."""
    deadline = time.monotonic() + HANG_GUARD
    while True:
        ended = proc.poll() is not None
        text = stderr.read_text()
        if "\n" in text or ended:
            return text.split("\n")[0] + ("\n" if "\n" in text else "")
        if time.monotonic() > deadline:
            raise subprocess.TimeoutExpired("simctl", HANG_GUARD)
        time.sleep(0.01)


def finish(proc: Any, stderr: Path) -> subprocess.CompletedProcess:
    """Wait for ``proc`` (:func:`start_simctl`): its exit status, stdout (if a pipe) and stderr."""
    out = proc.stdout.read() if proc.stdout is not None and not proc.stdout.closed else ""
    code = proc.wait(HANG_GUARD)
    err = stderr.read_text()
    stderr.unlink()
    return subprocess.CompletedProcess(proc.args, code, out, err)


def run_simctl(args: Sequence[str], cwd: Path, preexec: Callable[[], None] | None = None,
               **extra: str) -> subprocess.CompletedProcess:
    """``simctl ARGS`` run to its end as a process of its own (:func:`start_simctl`)."""
    return finish(*start_simctl(args, cwd, preexec=preexec, **extra))


def invoke(args: Sequence[str]) -> tuple[int, str, str]:
    """``simctl ARGS`` in this process (typer's runner): exit status, stdout, stderr."""
    from typer.testing import CliRunner

    from simulator.cli import app

    result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        return 99, result.stdout, f"Traceback: {type(result.exception).__name__}: {result.exception}"
    return result.exit_code, result.stdout, result.stderr


def one_error_line(stderr: str, names: str | None = None) -> bool:
    """Whether ``stderr`` ends in exactly one ``error:`` line (after any ``waiting`` line),
    naming ``names`` if given, never a temporary or lock file, with no traceback."""
    lines = [line for line in stderr.strip().splitlines() if "waiting for another simctl" not in line]
    if "Traceback" in stderr or len(lines) != 1 or not lines[0].startswith("error: "):
        return False
    if ".part" in lines[0] or ".lock" in lines[0]:
        return False
    return names is None or names in lines[0]


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith((".part", ".lock")))


# -- outputs onto special files -------------------------------------------------------------

#: The replay options that write a file, and a name each accepts (the event log's suffix
#: says its format).
REPLAY_OUTPUTS = (("--json", "out.json"), ("--csv", "out.csv"), ("--events", "out.csv"), ("--events", "out.parquet"))
SPECIALS = ("/dev/null", "/dev/full", "link to /dev/null", "link to /dev/full", "fifo with a reader",
            "fifo without a reader", "socket", "sweep onto a device")


def _chardev(path: str) -> bool:
    return stat.S_ISCHR(os.stat(path).st_mode)


def _drain(fd: int, finished: threading.Event, received: list[bytes]) -> None:
    """Read the FIFO ``fd`` (non-blocking: before a writer opens it, and after it closes,
    a read finds nothing) until the command has finished and nothing is left."""
    import select

    chunks = []
    while True:
        ready, _, _ = select.select([fd], [], [], 0.05)
        data = os.read(fd, 1 << 16) if ready else b""
        if data:
            chunks.append(data)
        elif finished.is_set():
            break
    received.append(b"".join(chunks))


def special_case(i: int, folder: Path) -> bool:
    """Case ``i``: one replay output (or a sweep's results) onto one special file."""
    trace = small_trace()
    kind = SPECIALS[i % len(SPECIALS)]
    option, name = REPLAY_OUTPUTS[(i // len(SPECIALS)) % len(REPLAY_OUTPUTS)]
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / name
    received: list[bytes] = []
    finished = threading.Event()
    reader: threading.Thread | None = None
    with contextlib.ExitStack() as stack:
        if kind in ("/dev/null", "/dev/full"):
            if option == "--events":  # an event log's name says its format: a device has none
                target.symlink_to(kind)
            else:
                target = Path(kind)
        elif kind.startswith("link to"):
            target.symlink_to(kind.removeprefix("link to "))
        elif kind.startswith("fifo"):
            os.mkfifo(target)
            if kind == "fifo with a reader":
                # Opened for reading before the command starts: the command finds its reader.
                fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK)
                stack.callback(os.close, fd)
                reader = threading.Thread(target=_drain, args=(fd, finished, received), daemon=True)
        elif kind == "socket":
            sock = stack.enter_context(socket.socket(socket.AF_UNIX))
            sock.bind(str(target))
        elif kind == "sweep onto a device":
            target = folder / "results.parquet"
            target.symlink_to("/dev/null")
        if kind == "sweep onto a device":
            args = ["sweep", str(trace), "--flush", "0,1", "-j", "1", "-o", str(target)]
        else:
            args = ["replay", str(trace), option, str(target)]
        if reader is not None:
            reader.start()
        code, _, err = invoke(args)
        finished.set()
        if reader is not None:
            reader.join(HANG_GUARD)
    try:
        if not all(_chardev(d) for d in ("/dev/null", "/dev/full")):
            return False  # a device replaced by a file: the worst failure there is
        if kind in ("/dev/null", "link to /dev/null", "fifo with a reader"):
            ok = code == 0 and not err.strip()
            if kind == "fifo with a reader":
                ok = ok and bool(received) and len(received[0]) > 0 and stat.S_ISFIFO(os.lstat(target).st_mode)
                if ok and option == "--json":
                    json.loads(received[0])
            return ok
        named = target.name if kind != "/dev/full" or option == "--events" else "/dev/full"
        return code == 2 and one_error_line(err, named) and not leftovers(folder)
    finally:
        for p in list(folder.iterdir()):
            p.unlink()


def _tally(case: Callable[[int, Path], bool], examples: int, name: str) -> tuple[int, int]:
    """``(tried, handled)`` of cases ``0 .. examples-1``, each in a folder of its own."""
    handled = 0
    with tempfile.TemporaryDirectory(prefix=f"simctl-{name}-") as d:
        for i in range(examples):
            handled += bool(case(i, Path(d) / f"case{i}"))
    return examples, handled


def try_special(examples: int) -> tuple[int, int]:
    return _tally(special_case, examples, "special")


# -- concurrent writers -------------------------------------------------------------------

HOLDER = """
import sys
from pathlib import Path
from simulator.outputs import output_lock
target = Path(sys.argv[1])
with output_lock(target):
    print("held", flush=True)
    sys.stdin.readline()          # until the case has seen the second writer wait
    target.write_text(sys.argv[2])  # what the first writer wrote
"""


@contextlib.contextmanager
def lock_held(target: Path, content: str) -> Iterator[subprocess.Popen]:
    """Another process holding ``target``'s lock until the caller writes a line to it; it then
    writes ``content`` into ``target`` and lets go."""
    holder = subprocess.Popen([PYTHON, "-c", HOLDER, str(target), content], env=env(), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        if holder.poll() is None:
            with contextlib.suppress(OSError):
                holder.communicate("\n", timeout=HANG_GUARD)


def second_writer(target: Path, option: str, force: bool, folder: Path) -> bool:
    """A replay writing ``target`` while another process holds its lock and then writes it:
    the replay says it waits, and afterwards obeys ``--force`` (without it, refused: the file
    it found missing at the start is the other writer's now)."""
    args = ["replay", str(small_trace()), option, str(target), *(["--force"] if force else []), *NO_KERNEL]
    with lock_held(target, "first writer\n") as holder:
        second, stderr = start_simctl(args, folder)
        said = first_line(second, stderr)  # once it waits on the lock (or has ended)
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        got = finish(second, stderr)
    code, rest = got.returncode, got.stderr.removeprefix(said)
    if "waiting for another simctl" not in said or str(target.name) not in said:
        return False
    content = target.read_bytes()  # an event log is Parquet: bytes, not text
    if force:
        return code == 0 and content != b"first writer\n" and not rest.strip() and not leftovers(folder)
    return code == 2 and one_error_line(rest, target.name) and "exists" in rest and content == b"first writer\n" \
        and not leftovers(folder)


def refused_at_once(target: Path, folder: Path) -> bool:
    """With ``SIMCTL_LOCK_WAIT=0`` a second writer is refused in one line naming the holder."""
    with lock_held(target, "first writer\n") as holder:
        got = run_simctl(["replay", str(small_trace()), "--json", str(target), *NO_KERNEL], folder,
                         SIMCTL_LOCK_WAIT="0")
        pid = holder.pid
    return got.returncode == 2 and one_error_line(got.stderr, target.name) and f"pid {pid}" in got.stderr


#: Flush windows of the first and the second of two sweeps into one file.
SWEEP_PAIRS = (("0,1", "0,1"), ("0,1", "2,3"), ("0,1", "1,2"))


def two_sweeps(first: str, second: str, folder: Path) -> bool:
    """Sweep ``second`` started while sweep ``first`` (this process) holds the results file:
    it waits, then runs only the rows ``first`` did not, and the file holds both."""
    from simulator.outputs import output_lock
    from simulator.profile import load_profile
    from simulator.scenario import build_scenario
    from simulator.sweep import Base, SweepSpec, parse_axis_values, read_results, run_sweep
    from simulator.trace.formats import load_trace

    out = folder / "results.parquet"
    trace = small_trace()
    # Both on the reference engine (NO_KERNEL): one base, as two users' sweeps of one file share
    base = Base(load_trace(trace), load_profile("seed-calibrated"), build_scenario(run={"engine": "reference"}))
    # The second sweep is forked before this process takes the lock (a fork would share it),
    # and starts once it is taken.
    go, went = os.pipe()

    def after_the_lock() -> None:
        os.close(went)
        os.read(go, 1)

    proc, stderr = start_simctl(["sweep", str(trace), "--flush", second, "-j", "1", "-o", str(out), *NO_KERNEL],
                                folder, preexec=after_the_lock)
    os.close(go)
    with output_lock(out, bounded=False):  # the first sweep's lock, held from before the second starts
        os.write(went, b".")
        os.close(went)
        said = first_line(proc, stderr)
        run_sweep(SweepSpec({"flush": parse_axis_values("flush", first)}), base, out, workers=1)
    got = finish(proc, stderr)
    stdout, rest = got.stdout, got.stderr.removeprefix(said)
    if got.returncode != 0 or "waiting for another simctl" not in said or rest.strip():
        return False
    a, b = set(first.split(",")), set(second.split(","))
    frame, _ = read_results(out)
    flushes = sorted(str(int(x)) for x in frame["flush"])
    said_ran = f"{len(b - a)} replays run" in " ".join(stdout.split())  # (the console wraps long lines)
    return flushes == sorted(a | b) and said_ran and not leftovers(folder)


def concurrent_case(i: int, folder: Path) -> bool:
    folder.mkdir(parents=True, exist_ok=True)
    kinds = 4 + len(SWEEP_PAIRS)
    k = i % kinds
    option, name = REPLAY_OUTPUTS[(i // kinds) % len(REPLAY_OUTPUTS)]
    if k < 2:
        return second_writer(folder / name, option, force=k == 1, folder=folder)
    if k == 2:
        return refused_at_once(folder / name, folder)
    if k == 3:  # two sweeps with the same axes: the second runs nothing again
        return two_sweeps("0,1", "0,1", folder)
    return two_sweeps(*SWEEP_PAIRS[k - 4], folder)


def try_concurrent(examples: int) -> tuple[int, int]:
    return _tally(concurrent_case, examples, "concurrent")


# -- disk full, file-size limit, read-only -------------------------------------------------

PREVIOUS = b'{"previous": "output"}\n'


def _limit_file_size() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """``folder`` read-only for this process: its permission bits, or, for root (whom they do
    not stop), a refusal of every open for writing in it, as a read-only file system answers
    (EROFS), at the system-call boundary."""
    folder.chmod(0o555)
    try:
        if os.geteuid() != 0:
            yield
            return
        real_open = os.open

        def refusing_open(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
            writes = flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
            if writes and Path(os.path.abspath(path)).parent == folder:
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
            return real_open(path, flags, *args, **kwargs)

        os.open = refusing_open
        try:
            yield
        finally:
            os.open = real_open
    finally:
        folder.chmod(0o755)


def full_case(i: int, folder: Path) -> bool:
    """Case ``i``: one output onto a full device, past a file-size limit or into a read-only
    folder, over a previous file that must stay as it was."""
    folder.mkdir(parents=True, exist_ok=True)
    trace = small_trace()
    how = ("file-size limit", "read-only folder", "full device", "sweep, read-only folder")[i % 4]
    option, name = REPLAY_OUTPUTS[(i // 4) % len(REPLAY_OUTPUTS)]
    target = folder / name
    if how == "full device":
        target = folder / f"full{Path(name).suffix}"
        target.symlink_to("/dev/full")
        code, _, err = invoke(["replay", str(trace), option, str(target)])
        return code == 2 and one_error_line(err, target.name) and "no space left" in err and _chardev("/dev/full") \
            and not leftovers(folder)
    if how.startswith("sweep"):
        target = folder / "results.parquet"
        args = ["sweep", str(trace), "--flush", "0,1", "-j", "1", "-o", str(target)]
        target.write_bytes(PREVIOUS)
        with read_only(folder):
            code, _, err = invoke(args)
        return code == 2 and one_error_line(err, target.name) and target.read_bytes() == PREVIOUS \
            and not leftovers(folder)
    target.write_bytes(PREVIOUS)
    args = ["replay", str(trace), option, str(target), "--force"]
    if how == "file-size limit":
        got = run_simctl([*args, *NO_KERNEL], folder, preexec=_limit_file_size)
        code, err = got.returncode, got.stderr
        said = "file too large" in err
    else:
        with read_only(folder):
            code, _, err = invoke(args)
        said = "read-only" in err or "permission denied" in err
    return code == 2 and one_error_line(err, target.name) and said and target.read_bytes() == PREVIOUS \
        and not leftovers(folder)


def try_full(examples: int) -> tuple[int, int]:
    return _tally(full_case, examples, "full")


CLASSES: dict[str, Callable[[int], tuple[int, int]]] = {
    "outputs onto special files": try_special,
    "concurrent writers": try_concurrent,
    "disk full and read-only": try_full,
}

__all__ = ["CLASSES"]
