"""Typed errors of the library.

Library code raises these; only the CLI catches them, prints their one-line message and
exits with status 2. Each error names the file, the record (index in the file, or a
name such as a task) and the field at fault, so a user can find the mistake without a
traceback.
"""

from __future__ import annotations

from pathlib import Path


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
        where = ": ".join(parts)
        text = f"{where}: {self.message}" if where else self.message
        return " ".join(text.split())  # always one line


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


class SimctlWarning(UserWarning):
    """Something in the input was repaired or is suspicious (for example unsorted calls).

    Library code issues these with :func:`warnings.warn`; the CLI prints each as one
    ``warning: ...`` line.
    """
