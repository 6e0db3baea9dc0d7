"""Kill -9 and Ctrl-C at seeded moments of replay, sweep (local and on a Dask cluster) and
calibrate (``tests/faults.py``): no process outlives the command, a Ctrl-C says what was kept
in one line, the next run of the same command leaves no ``.part`` file, redoes no finished
sweep row, and ends with the outputs of an uninterrupted run."""

from __future__ import annotations

import random
import signal

import pytest
from faults import close_forker, interrupt

#: (command, signal, moment): the moments, fractions of an uninterrupted run's duration,
#: drawn from a fixed seed.
_rng = random.Random(19)
CASES = [(kind, sig, round(_rng.uniform(0.3, 0.9), 2)) for kind in ("replay", "sweep")
         for sig in (signal.SIGKILL, signal.SIGINT)]
#: One more moment for each command and signal, over a wider range (each case starts the
#: command twice, seconds of CPU each: benchmarks/hostile_inputs.py interrupts each command
#: at three moments a signal for the docs' table)
MORE = [(kind, sig, round(_rng.uniform(0.25, 0.95), 2)) for kind in ("replay", "sweep")
        for sig in (signal.SIGKILL, signal.SIGINT)]
# Drawn from their own seed, so that adding them moved none of the moments above.
_later = random.Random(23)
CASES += [(kind, sig, round(_later.uniform(0.3, 0.9), 2)) for kind in ("calibrate", "sweep --cluster")
          for sig in (signal.SIGKILL, signal.SIGINT)]
MORE += [(kind, sig, round(_later.uniform(0.25, 0.95), 2)) for kind in ("calibrate", "sweep --cluster")
         for sig in (signal.SIGKILL, signal.SIGINT)]
# Of those, only moments past every one above are run: the others (0.34 to 0.66) fall inside
# the span the cases above already cover, a fresh process and seconds of CPU each for a moment
# that shows nothing new; one past them all (0.95, replay near its end: writing its outputs,
# or already finished) does. The benchmark's full mode still interrupts every command at three
# moments a signal.
MORE = [case for case in MORE if case[2] > max(moment for *_, moment in CASES)]


@pytest.fixture(scope="module", autouse=True)
def _forker_ended():
    """The forking interpreter ends with this module's tests, waited for: its CPU time and its
    commands' count in this process's, as each fresh process's did."""
    yield
    close_forker()


def _check(tmp_path_factory, kind, sig, moment) -> None:
    base = tmp_path_factory.getbasetemp() / "faults"
    if kind == "sweep --cluster":
        pytest.importorskip("distributed", reason="dask.distributed is the optional 'cluster' extra")
    # quick: calibrate's smaller fit; the interrupted run and the reference run are processes
    # of their own (signals land in those), forked from one interpreter that imported simctl
    # once, the run after the interruption in this process
    got = interrupt(kind, sig, moment, tmp_path_factory.mktemp(f"{kind.replace(' --', '-')}-{sig.name}"), base,
                    quick=True)
    assert got["orphans"] == 0, got
    assert got["leftovers"] == 0, got
    assert got["rows_lost"] == 0, got
    assert got["identical"], got
    assert got["one_line"], (got, got["stderr"])
    assert got["said"], got


@pytest.mark.parametrize("kind, sig, moment", CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_an_interrupted_command_survives(tmp_path_factory, kind, sig, moment):
    _check(tmp_path_factory, kind, sig, moment)


@pytest.mark.slow
@pytest.mark.parametrize("kind, sig, moment", MORE, ids=lambda v: getattr(v, "name", str(v)))
def test_an_interrupted_command_survives_at_more_moments(tmp_path_factory, kind, sig, moment):
    _check(tmp_path_factory, kind, sig, moment)
