"""Autoscalers: how many replicas a pool (:mod:`simulator.model.replicas`) should have.

Each autoscaler is a small class with one decision method, :meth:`Autoscaler.desired`,
which takes what the pool observes now (an :class:`Observation`) and returns the replica
count it wants; the pool clamps it to ``[min_replicas, max_replicas]`` and starts replicas
(each after its cold start) or drains them (they finish their calls, take no new ones). The
pool asks every ``scale_interval`` seconds (the autoscaler's own period by default), at
``TIMER`` priority: a decision at instant t sees every arrival and completion of t.

"Demand" below is the calls in flight on replicas plus the calls waiting in the pool's
queue (a platform counts the queued inputs, Knative's activator the buffered requests).

Registered (a name is a public contract; a change of behaviour gets a new name):

* ``fixed`` — always ``min_replicas`` (never asked again after the start).
* ``serverless`` — the users' platform (their design notes: ``min_containers = 2``,
  ``max_containers``, ``target_inputs = 8``, ``scaledown_window = 600``): scales up at once
  to ``ceil(demand / target_inputs) + buffer_replicas``; scales down only by the replicas
  that have been idle (no call) for ``scaledown_window`` seconds, never below that demand.
  Period 1 s.
* ``hpa`` — Kubernetes' Horizontal Pod Autoscaler, as documented in
  https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/ ("Algorithm
  details", "Stabilization window", "Scaling policies"): ``desired = ceil(current × metric /
  target)``, no change while ``|metric / target − 1| <= 0.1`` (the default tolerance); the
  metric averaged over the ready replicas is calls in flight (``hpa_metric = inputs``,
  target ``target_inputs``) or the share of the last interval they held a call
  (``utilization``, target ``target_utilization``). Scale-up follows the lowest
  recommendation of the last ``stabilization_up`` seconds, scale-down the highest of the
  last ``stabilization_down`` (default 0 and 300 s, as Kubernetes'); at most ``max_step``
  replicas per decision. Period 15 s (the controller's default sync period). From zero
  ready replicas it recommends ``ceil(demand / target_inputs)`` (Kubernetes' HPA does not
  scale from zero).
* ``knative`` — Knative's KPA, as documented in
  https://knative.dev/docs/serving/autoscaling/kpa-specific/ : ``ceil(average demand /
  target_inputs)`` with demand averaged over the ``stable_window`` (60 s), or over the
  ``panic_window`` (6 s) in panic mode; it panics when the panic window's count reaches
  ``panic_threshold`` (200 %) times the ready replicas, never scales down while panicking
  and leaves panic after a stable window without reason to. Period 2 s (Knative's tick).
  Not modeled: its maximum scale-up and scale-down rates.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import deque
from typing import NamedTuple

from simulator.registry import Registry
from simulator.settings import RunSettings


class Observation(NamedTuple):
    """What the pool shows its autoscaler at a decision instant ``now``.

    ``replicas``: replicas started and not draining (starting or ready); ``ready``: those of
    them serving; ``in_flight``: calls on replicas; ``queued``: calls in the pool's queue;
    ``idle_s``: per ready replica, seconds since it last held a call (0 while it holds one);
    ``utilization``: the mean share of the last interval the ready replicas held a call."""

    now: float
    replicas: int
    ready: int
    in_flight: int
    queued: int
    idle_s: tuple[float, ...] = ()
    utilization: float = 0.0

    @property
    def demand(self) -> int:
        """Calls in flight plus calls waiting in the pool's queue."""
        return self.in_flight + self.queued


class Autoscaler(ABC):
    """Base class: built from the run's settings; :meth:`desired` is its one decision."""

    #: seconds between decisions unless ``scale_interval`` says otherwise (None: never)
    period: float | None = None

    def __init__(self, settings: RunSettings) -> None:
        self.settings = settings

    @property
    def interval(self) -> float | None:
        """Seconds between decisions (``None``: the count never changes)."""
        return self.settings.scale_interval if self.settings.scale_interval is not None and self.period \
            else self.period

    @abstractmethod
    def desired(self, seen: Observation) -> int:
        """The replica count wanted now (the pool clamps it to [min, max])."""


AUTOSCALERS: Registry[type[Autoscaler]] = Registry("autoscaler")


@AUTOSCALERS.register("fixed")
class Fixed(Autoscaler):
    """``min_replicas``, always."""

    def desired(self, seen: Observation) -> int:
        return self.settings.min_replicas


@AUTOSCALERS.register("serverless")
class Serverless(Autoscaler):
    """Up at once to the demand's replicas plus the buffer; down only by idle replicas."""

    period = 1.0

    def desired(self, seen: Observation) -> int:
        s = self.settings
        wanted = math.ceil(seen.demand / s.target_inputs) + s.buffer_replicas
        if wanted >= seen.replicas:
            return wanted
        idle = sum(1 for t in seen.idle_s if t >= s.scaledown_window)
        return max(wanted, seen.replicas - idle)


@AUTOSCALERS.register("hpa")
class Hpa(Autoscaler):
    """Kubernetes HPA: ratio to target with a 10 % tolerance, stabilisation windows, max step."""

    period = 15.0
    TOLERANCE = 0.1  # Kubernetes' default --horizontal-pod-autoscaler-tolerance

    def __init__(self, settings: RunSettings) -> None:
        super().__init__(settings)
        self._recommendations: deque[tuple[float, int]] = deque()

    def recommend(self, seen: Observation) -> int:
        """The unstabilised recommendation: ``ceil(current × metric / target)``."""
        s = self.settings
        if seen.ready == 0:
            return max(seen.replicas, math.ceil(seen.demand / s.target_inputs))
        if s.hpa_metric == "inputs":
            ratio = seen.demand / seen.ready / s.target_inputs
        else:
            ratio = seen.utilization / s.target_utilization
        if abs(ratio - 1.0) <= self.TOLERANCE:
            return seen.replicas
        return math.ceil(seen.replicas * ratio)

    def desired(self, seen: Observation) -> int:
        s = self.settings
        recs = self._recommendations
        recs.append((seen.now, self.recommend(seen)))
        keep = max(s.stabilization_up, s.stabilization_down)
        while recs and recs[0][0] < seen.now - keep:
            recs.popleft()
        up = min(r for t, r in recs if t >= seen.now - s.stabilization_up)
        down = max(r for t, r in recs if t >= seen.now - s.stabilization_down)
        current = seen.replicas
        wanted = current
        if wanted < up:
            wanted = up
        if wanted > down:
            wanted = down
        if s.max_step is not None:
            wanted = max(current - s.max_step, min(current + s.max_step, wanted))
        return wanted


@AUTOSCALERS.register("knative")
class Knative(Autoscaler):
    """Knative KPA: stable and panic windows over the sampled demand."""

    period = 2.0

    def __init__(self, settings: RunSettings) -> None:
        super().__init__(settings)
        self._samples: deque[tuple[float, int]] = deque()
        self._panic_since: float | None = None
        self._last = 0

    def _average(self, now: float, window: float) -> float:
        values = [d for t, d in self._samples if t > now - window]
        return sum(values) / len(values) if values else 0.0

    def desired(self, seen: Observation) -> int:
        s = self.settings
        now = seen.now
        self._samples.append((now, seen.demand))
        while self._samples and self._samples[0][0] <= now - s.stable_window:
            self._samples.popleft()
        stable = math.ceil(self._average(now, s.stable_window) / s.target_inputs)
        panic = math.ceil(self._average(now, s.panic_window) / s.target_inputs)
        bursting = panic >= s.panic_threshold * max(seen.ready, 1) and panic > seen.ready
        if bursting:
            self._panic_since = now
        elif self._panic_since is not None and now - self._panic_since >= s.stable_window:
            self._panic_since = None
        if self._panic_since is not None:
            self._last = max(panic, self._last, seen.replicas)  # no scale-down while panicking
        else:
            self._last = stable
        return self._last


__all__ = ["AUTOSCALERS", "Autoscaler", "Fixed", "Hpa", "Knative", "Observation", "Serverless"]
