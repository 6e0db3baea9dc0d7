"""Starting from a snapshot: how long a batch already running when the snapshot was taken
still runs.

A snapshot (:mod:`simulator.snapshot`) tells, per running batch, its prompts and where the
source knows it the service it has had (``elapsed_s``). The engine that starts from the
snapshot asks :func:`remaining_service` once per such batch; the rule draws nothing from
the run's service streams, so the new traffic's service times are those of a replay from
an empty system.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from simulator.profile.kinds import BatchShape


class _Service(Protocol):
    def mean(self, shape: BatchShape) -> float: ...

    def variance(self, shape: BatchShape) -> float: ...


class Remaining(NamedTuple):
    """A running batch's remaining service (seconds) and how it was estimated (``"mean
    minus elapsed"``, or ``"expected residual"`` where the elapsed service is unknown)."""

    seconds: float
    how: str


def remaining_service(service: _Service, shape: BatchShape, generations: int, elapsed: float | None) -> Remaining:
    """The remaining service of a batch of ``shape`` (``generations`` one after another)
    that has run for ``elapsed`` seconds: the profile's mean service time minus
    ``elapsed``, floored at 0. With ``elapsed`` unknown, the expected residual of a service
    time S seen at a random instant of it, E[S²] / (2 E[S]) = (var + mean²) / (2 mean)
    (the renewal-theory residual: a random look lands more often in a long service)."""
    mean = service.mean(shape) * generations
    if elapsed is not None:
        return Remaining(max(mean - elapsed, 0.0), "mean minus elapsed")
    if mean <= 0:
        return Remaining(0.0, "expected residual")
    variance = service.variance(shape) * generations
    return Remaining((variance + mean * mean) / (2 * mean), "expected residual")
