"""Typed errors of the library, all of them (one hierarchy under :class:`SimctlError`).

Library code raises these; only the CLI catches them, prints their one-line message and
exits with status 2. Each error names the file, the record (index in the file, or a
name such as a task) and the field at fault, so a user can find the mistake without a
traceback. ``kind`` says which part of the input was at fault.

This module imports nothing heavy: the harness (no simpy) and the CLI listing import it.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from pathlib import Path

#: Characters that steer a terminal's writing direction rather than show (a name holding one
#: can look like another name).
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f")


def shown(text: str) -> str:
    """``text`` safe to print on a terminal: control characters (an escape sequence, a
    newline, a carriage return), text-direction marks and undecodable bytes (``\\udcff``)
    written as Python escapes (``\\x1b``, ``\\n``, ``\\u202e``); every other character,
    accented or not, as it is. Every path an error or message prints goes through it."""
    if text.isprintable():
        return text
    return "".join(
        c if c == " " or (c not in _BIDI and unicodedata.category(c) not in ("Cc", "Cs")) else repr(c)[1:-1]
        for c in text)


class SimctlError(Exception):
    """Base class: an input the user gave is not usable. ``str(err)`` is one line."""

    kind = "input"

    def __init__(
        self,
        path: str | Path | None,
        record: int | str | None,
        field: str | None,
        message: str,
    ) -> None:
        self.path = None if path is None else str(path)
        self.record = record
        self.field = field
        self.message = message
        super().__init__(self._one_line())

    def _one_line(self) -> str:
        parts: list[str] = []
        if self.path is not None:
            parts.append(self.path)
        if self.record is not None:
            parts.append(
                f"record {self.record}" if isinstance(self.record, int) else str(self.record)
            )
        if self.field is not None:
            parts.append(f"field '{self.field}'")
        where = ": ".join(shown(p) for p in parts)
        text = f"{where}: {self.message}" if where else self.message
        return shown(" ".join(text.split()))  # always one line, never a terminal's control sequence


class TraceError(SimctlError):
    """A trace file cannot be read or a record in it is invalid."""

    kind = "trace"


class ProfileError(SimctlError):
    """A service profile cannot be read or a task's service model is invalid."""

    kind = "profile"


class ScenarioError(SimctlError):
    """A scenario (TOML file or CLI options) is invalid."""

    kind = "scenario"


class OutputError(SimctlError):
    """An output cannot be written (for example it would overwrite an existing file)."""

    kind = "output"


class SynthSpecError(SimctlError):
    """A synthetic-trace specification (or its textual form) is invalid.

    ``field`` names the :class:`~simulator.trace.synth.SynthSpec` field at fault
    (``task_mix``, ``mean`` ...).
    """

    kind = "synth"


class PlotError(SimctlError):
    """A figure that cannot be drawn from the inputs given (an axis or task they do not have)."""

    kind = "plot"


class EventLogError(SimctlError):
    """A file given as an event log that is not one."""

    kind = "events"


class FigureError(SimctlError):
    """A figure name that the summary does not have."""

    kind = "figure"


class ObservedError(SimctlError):
    """An observed-run folder or file that cannot be read."""

    kind = "observed"


class LoadError(SimctlError):
    """A load run that cannot start: a bad URL, an unreachable server, an unusable run folder,
    options that do not go together, or the ``live`` extra missing."""

    kind = "load"


class ServeError(SimctlError):
    """``simctl serve`` cannot start as asked (an option, the ``serve`` extra missing)."""

    kind = "serve"


class SnapshotError(SimctlError):
    """A snapshot of a running system that cannot be taken, read or replayed from."""

    kind = "snapshot"


class BackendError(SimctlError):
    """A serving backend cannot be set up as asked (``--backend``)."""

    kind = "backend"


class HardwareError(SimctlError):
    """An unknown GPU or backend, or a shape no table can answer."""

    kind = "hardware"


class HarnessError(SimctlError):
    """A profiling request that cannot run: no such device, models that do not fit, options
    that do not go together, a measurement with nothing to fit."""

    kind = "harness"


class UnknownPreset(HarnessError):
    """A model preset name that is not in :data:`~simulator.harness.presets.PRESETS`, or a
    Hugging Face ``config.json`` simctl cannot read a model shape from."""


class UnknownName(SimctlError, LookupError):
    """``name`` is not registered (a policy, topology, profile kind...); the message lists
    the valid names. Also a :class:`LookupError`, as a registry is a mapping."""

    kind = "name"

    def __init__(self, what: str, name: str, valid: Sequence[str]) -> None:
        self.what, self.name, self.valid = what, name, list(valid)
        super().__init__(None, None, None, f"unknown {what} '{name}'; valid: {', '.join(valid)}")


class SweepError(SimctlError):
    """A sweep that cannot run or a results file that cannot be used."""

    kind = "sweep"


class PlanError(SimctlError):
    """A plan that cannot run: an SLO that does not parse, or options that leave nothing to search."""

    kind = "plan"


class PriceError(SimctlError):
    """A price table (GPU type -> cost per GPU-hour) that cannot be read or has a bad entry,
    or a cost asked for that the table cannot price."""

    kind = "prices"


class SimctlWarning(UserWarning):
    """Something in the input was repaired or is suspicious (for example unsorted calls).

    Library code issues these with :func:`warnings.warn`; the CLI prints each as one
    ``warning: ...`` line.
    """
