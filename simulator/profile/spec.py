"""Small validation helpers shared by the profile kinds: where a field sits, and checks
that raise :class:`ProfileError` naming the file, the task and the field."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from simulator.errors import ProfileError


@dataclass(frozen=True)
class Where:
    """A place in a profile file: its path and the task whose ``service`` is being read."""

    path: str | None
    task: str
    prefix: str = "service"

    def error(self, field: str, message: str) -> ProfileError:
        name = f"{self.prefix}.{field}" if self.prefix else field
        return ProfileError(self.path, f"task '{self.task}'", name, message)


def need_number(
    value: Any,
    where: Where,
    field: str,
    *,
    positive: bool = False,
    minimum: float | None = None,
) -> float:
    """``value`` as a finite float, or a :class:`ProfileError` saying what is wrong."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise where.error(field, f"must be a number, got {shown(value)}")
    try:
        x = float(value)
    except OverflowError:  # an integer past the largest float (1.8e308)
        raise where.error(field, f"is too large for a number (an integer of {len(str(abs(value)))} digits)") from None
    if not math.isfinite(x):
        raise where.error(field, f"must be finite, got {value!r}")
    if positive and x <= 0:
        raise where.error(field, f"must be > 0, got {value!r}")
    if minimum is not None and x < minimum:
        raise where.error(field, f"must be >= {minimum:g}, got {value!r}")
    return x


def shown(value: Any, limit: int = 60) -> str:
    """``value`` for a message, on one line and cut at ``limit`` characters (an integer of
    hundreds of digits is named by its length)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**20:
        return f"an integer of {len(str(abs(value)))} digits"
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
