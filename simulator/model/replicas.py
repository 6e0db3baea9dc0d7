"""The replica pool: copies of the modeled serving system behind one FCFS queue, sized by an
autoscaler (:mod:`simulator.model.autoscalers`), each new copy serving after a cold start.

A scenario has a pool when it names an ``autoscaler``. Each replica is a copy of the system
the scenario describes without one: its own ``gpus`` GPUs, each task's topology, queues and
workers (a :class:`~simulator.model.context.RunContext` sharing the run's clock, prompt
columns and ids). The pool models a serverless GPU platform:

* A call that arrives goes to a replica chosen by the ``pool_rule`` among the ready,
  not-draining replicas holding fewer than ``max_inputs`` calls (unlimited by default); its
  task groups start there at once. When none has room, or none is ready, or calls already
  wait, it joins the pool's FCFS queue (a call arriving to a queue holding ``pool_queue``
  calls is rejected: its prompts get status ``rejected``). Waiting calls leave the queue in
  order as replicas get room (a call ends: its last prompt is done; a replica becomes ready).
* ``min_replicas`` replicas are ready at instant 0 (warm). The autoscaler decides every
  ``scale_interval`` seconds; the pool clamps its count to ``[min_replicas, max_replicas]``.
  Scaling up starts replicas that become ready after a cold start drawn from
  ``replica_cold_start`` (the ``cold start`` random stream of the run for measured
  samples). Scaling down first cancels replicas still starting (newest first), then drains
  ready ones, emptiest first and, among those, the longest idle: a draining replica takes no
  new call and stops when its last call ends.
* The pool stops deciding when every call has been taken or turned away and no prompt is
  left; replicas still up then are stopped at the run's end: its last prompt's completion
  (or last arrival).

Same-instant order: a replica becoming ready is a ``COMPLETION`` event (it takes waiting
calls before the arrivals of that instant, which then queue behind them); a decision is a
``TIMER`` event (it sees the arrivals and completions of its instant).

Records: per prompt, its ``replica`` and ``dispatched_at`` (when its call left the pool's
queue, its arrival if it never waited); per replica, the :class:`ReplicaTable` that travels
in the event log's ``attrs["replicas"]`` (see :mod:`simulator.events`).

Pool rules (registered, :data:`POOL_RULES`): each is a small class whose ``choose(key,
candidates)`` returns the index of the chosen candidate (candidates in replica order).
"""

from __future__ import annotations

import itertools
import math
from abc import ABC, abstractmethod
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.errors import ScenarioError
from simulator.model.autoscalers import AUTOSCALERS, Observation
from simulator.model.context import RunContext
from simulator.model.event_order import ARRIVAL, COMPLETION, TIMER
from simulator.model.streams import cold_start_stream, task_key
from simulator.model.topologies import TOPOLOGIES, Topology
from simulator.registry import Registry
from simulator.settings import ColdStart, parse_cold_start

if TYPE_CHECKING:
    from simulator.model.router import Router
    from simulator.profile import Profile
    from simulator.scenario import Scenario


class Replica:
    """One copy of the serving system: its context, each task's front, its lifecycle."""

    __slots__ = ("index", "context", "fronts", "requested_at", "ready_at", "drain_at", "stopped_at",
                 "in_flight", "idle_since", "busy_s", "busy_since", "ready_event")

    def __init__(self, index: int, context: RunContext, requested_at: float) -> None:
        self.index = index
        self.context = context
        self.fronts: dict[str, Topology] = {}
        self.requested_at = requested_at
        self.ready_at = math.nan
        self.drain_at = math.nan
        self.stopped_at = math.nan
        self.in_flight = 0
        self.idle_since = requested_at
        self.busy_s = 0.0          # seconds it held at least one call, up to busy_since
        self.busy_since = math.nan  # since when it holds a call (NaN: idle)
        self.ready_event: Any = None

    @property
    def ready(self) -> bool:
        return self.ready_at == self.ready_at  # not NaN

    @property
    def draining(self) -> bool:
        return self.drain_at == self.drain_at

    def waiting_prompts(self) -> int:
        """Prompts waiting in its queues (not yet in a batch)."""
        return sum(q.waiting_count for q in self.context.queues)


# -- pool rules -----------------------------------------------------------------------------
class PoolRule(ABC):
    """Chooses a replica for a call among the candidates (ready, not draining, with room)."""

    @abstractmethod
    def choose(self, key: int, candidates: list[Replica], first: int = -1) -> int:
        """The index into ``candidates`` (never empty) of the replica that takes the call;
        ``key`` is the call's affinity key (its first prompt's task), ``first`` its first
        prompt."""


POOL_RULES: Registry[type[PoolRule]] = Registry("pool rule")


@POOL_RULES.register("round-robin")
class RoundRobin(PoolRule):
    """The next replica after the last one chosen, in replica order."""

    def __init__(self) -> None:
        self.last = -1

    def choose(self, key: int, candidates: list[Replica], first: int = -1) -> int:
        pick = next((i for i, r in enumerate(candidates) if r.index > self.last), 0)
        self.last = candidates[pick].index
        return pick


@POOL_RULES.register("least-loaded")
class LeastLoaded(PoolRule):
    """The replica holding the fewest calls (the first such)."""

    def choose(self, key: int, candidates: list[Replica], first: int = -1) -> int:
        best, fewest = 0, candidates[0].in_flight
        for i in range(1, len(candidates)):
            if candidates[i].in_flight < fewest:
                best, fewest = i, candidates[i].in_flight
        return best


@POOL_RULES.register("shortest-queue")
class ShortestQueue(PoolRule):
    """The replica with the fewest prompts waiting in its queues (then the fewest calls)."""

    def choose(self, key: int, candidates: list[Replica], first: int = -1) -> int:
        return min(range(len(candidates)), key=lambda i: (candidates[i].waiting_prompts(), candidates[i].in_flight))


@POOL_RULES.register("prefix-affinity")
class PrefixAffinity(PoolRule):
    """Calls of one task (one shared system prompt, the prefix a KV cache reuses) go to one
    replica: candidate ``key mod n``, so the mapping moves only as the candidates change.

    Where the replicas' engines cache prefixes (``prefix_caching``), the caches decide
    instead: the call goes to the replica whose engine of its first prompt's task holds the
    longest cached prefix of that prompt, ties to the one holding the fewest calls, then to
    candidate order (llm-d's prefix-cache scorer first, its load scorer second)."""

    def choose(self, key: int, candidates: list[Replica], first: int = -1) -> int:
        if first >= 0:
            hits = [replica_hit_blocks(r, first) for r in candidates]
            if any(h >= 0 for h in hits):
                return min(range(len(candidates)), key=lambda i: (-hits[i], candidates[i].in_flight))
        return key % len(candidates)


def replica_hit_blocks(replica: Replica, pid: int) -> int:
    """The longest cached prefix of prompt ``pid`` (in blocks) that an engine of ``replica``
    holds, among the engines of the prompt's task; -1 where they cache no prefixes."""
    front = replica.fronts.get(replica.context.task_of[pid])
    caches = [e.prefix for e in getattr(front, "engines", ()) if e.prefix is not None]
    return max((c.hit_blocks(pid) for c in caches), default=-1)


# -- settings -----------------------------------------------------------------------------------
#: The run settings only a pool reads (simulator.settings declares them after ``autoscaler``).
POOL_SETTINGS = ("min_replicas", "max_replicas", "max_inputs", "pool_queue", "pool_rule", "replica_cold_start",
                 "scale_interval", "target_inputs", "buffer_replicas", "scaledown_window", "hpa_metric",
                 "target_utilization", "stabilization_up", "stabilization_down", "max_step", "stable_window",
                 "panic_window", "panic_threshold")


def check_pool_settings(scenario: Scenario) -> None:
    """A pool setting given without a pool would be silently ignored: :class:`ScenarioError`
    naming it."""
    if scenario.autoscaler is not None:
        return
    from simulator.settings import RUN

    for name in POOL_SETTINGS:
        if getattr(scenario, name) != RUN[name].default:
            raise ScenarioError(scenario.source, "run", name,
                                "is a replica pool setting, read only with an autoscaler (e.g. autoscaler = \"fixed\")")


# -- cold starts ----------------------------------------------------------------------------
def cold_start_draw(spec: ColdStart, rng: np.random.Generator) -> float:
    """One cold start in seconds: the fixed value, or a sample drawn uniformly."""
    if spec.kind == "samples":
        return spec.samples[int(rng.integers(len(spec.samples)))]
    return spec.seconds


# -- the lifecycle table ----------------------------------------------------------------------
class ReplicaTable(dict):
    """The replicas of a run: ``replica``, ``requested_at``, ``ready_at``, ``drain_at``,
    ``stopped_at`` (tuples, one entry per replica; NaN: never), and the pool's
    ``gpus_per_replica``, ``min_replicas``, ``max_replicas``, ``start_at`` and ``end_at``.

    Plain JSON data (it is written with the log's metadata); immutable once made, so that
    pandas' copy of a frame's ``attrs`` on every operation costs nothing."""

    def __deepcopy__(self, memo: dict) -> ReplicaTable:
        return self

    def __copy__(self) -> ReplicaTable:
        return self


# -- the pool -------------------------------------------------------------------------------
class ReplicaPool:
    """The pool of one run (module docstring): :meth:`send` is the client's door."""

    def __init__(self, main: RunContext, router: Router, scenario: Scenario, profile: Profile,
                 seed: int, calls: int) -> None:
        if scenario.max_concurrent_groups is not None:
            raise ScenarioError(scenario.source, "run", "max_concurrent_groups",
                                "is not modeled with a replica pool (autoscaler)")
        self.max_replicas = scenario.max_replicas if scenario.max_replicas is not None else scenario.min_replicas
        if self.max_replicas < scenario.min_replicas:
            raise ScenarioError(scenario.source, "run", "max_replicas",
                                f"must be >= min_replicas ({scenario.min_replicas}), got {self.max_replicas}")
        if self.max_replicas < 1:
            raise ScenarioError(scenario.source, "run", "max_replicas", "a pool needs at least one replica")
        if scenario.min_replicas == 0 and (scenario.autoscaler or "fixed") == "fixed":
            raise ScenarioError(scenario.source, "run", "min_replicas",
                                "a fixed pool of 0 replicas serves nothing; give it min_replicas >= 1")
        self.main = main
        self.env = main.env
        self.router = router
        self.scenario = scenario
        self.profile = profile
        self.autoscaler = AUTOSCALERS.get(scenario.autoscaler or "fixed")(scenario)
        self.rule = POOL_RULES.get(scenario.pool_rule)()
        self.cold_start = parse_cold_start(scenario.replica_cold_start)
        self.cold_rng = cold_start_stream(seed)
        self.max_inputs = scenario.max_inputs if scenario.max_inputs is not None else math.inf
        self.replicas: list[Replica] = []
        #: the replicas not draining (starting or ready), in replica order: what a decision
        #: and a call look at (a day's run starts hundreds of replicas; the stopped stay out)
        self.live: list[Replica] = []
        self._worker_ids = itertools.count()
        self.queue: deque[int] = deque()
        self.calls_left = calls            # calls not yet taken by a replica or turned away
        n = len(main.arrived_at)
        #: per prompt: its call's replica (-1: none) and when the call left the pool's queue
        self.replica_of = [-1] * n
        self.dispatched_at = [math.nan] * n
        call_of = main.call_of
        #: per call: its prompts' positions (trace order keeps them contiguous)
        first = np.searchsorted(np.asarray(call_of, dtype=np.int64), np.arange(calls + 1))
        self._left_in_call = np.diff(first).tolist()
        self._first: list[int] = first.tolist()
        self._call_replica = [-1] * calls
        keys = {t: task_key(t) for t in main.configs}
        task_of, first_of = main.task_of, self._first
        self._key = [keys[task_of[first_of[c]]] if first_of[c] < n else 0 for c in range(calls)]
        self.prompts_left = n
        self.end_at = 0.0
        self._ticking = False
        main.on_finished = self.prompts_finished
        for _ in range(scenario.min_replicas):
            self._start_replica(0.0, warm=True)
        interval = self.autoscaler.interval
        if interval is not None and calls:
            self._ticking = True
            self.env.call_at(0.0, TIMER, self._tick, interval)

    # -- replicas ---------------------------------------------------------------------------
    def _start_replica(self, now: float, warm: bool = False) -> Replica:
        main, index = self.main, len(self.replicas)
        ctx = RunContext(self.scenario, self.profile, main.service_rng, main.dispatch_rng,
                         parent=main, first_gpu=index * self.scenario.gpus)
        ctx.on_finished = self.prompts_finished
        ctx._worker_ids = self._worker_ids  # the main context's fronts (never sent a call) keep theirs
        replica = Replica(index, ctx, now)
        for task, cfg in main.configs.items():
            replica.fronts[task] = TOPOLOGIES.get(cfg.topology)(ctx, task, cfg)
        self.replicas.append(replica)
        self.live.append(replica)
        if warm:
            replica.ready_at = now
        else:
            replica.ready_event = self.env.call_at(now + cold_start_draw(self.cold_start, self.cold_rng),
                                                   COMPLETION, self._ready, replica)
        if self.calls_left == 0:
            ctx.input_closed = True
        return replica

    def _ready(self, event: Any) -> None:
        replica: Replica = event._value
        if replica.draining:
            return  # cancelled while starting
        replica.ready_at = self.env._now
        replica.idle_since = self.env._now
        self._dispatch()

    def _drain(self, replica: Replica, now: float) -> None:
        replica.drain_at = now
        self.live.remove(replica)
        if replica.in_flight == 0:
            replica.stopped_at = now

    def _scale_to(self, wanted: int, now: float) -> None:
        live = self.live
        if wanted > len(live):
            for _ in range(wanted - len(live)):
                self._start_replica(now)
        elif wanted < len(live):
            # Cancel starting replicas first (newest first), then the emptiest, longest idle.
            order = sorted(list(live), key=lambda r: (r.ready, r.in_flight, r.idle_since if r.ready else -r.index))
            for replica in order[:len(live) - wanted]:
                self._drain(replica, now)

    def _observe(self, now: float, since: float) -> Observation:
        live = self.live
        span = now - since
        in_flight, busy = 0, 0.0
        idle: list[float] = []
        for r in live:
            in_flight += r.in_flight
            if r.ready_at == r.ready_at:
                idle.append(0.0 if r.in_flight else now - r.idle_since)
                if span > 0:
                    busy += self._busy_between(r, since, now)
        util = busy / (len(idle) * span) if idle and span > 0 else 0.0
        return Observation(now=now, replicas=len(live), ready=len(idle), in_flight=in_flight,
                           queued=len(self.queue), idle_s=tuple(idle), utilization=util)

    def _tick(self, event: Any) -> None:
        interval: float = event._value
        now = self.env._now
        seen = self._observe(now, max(0.0, now - interval))
        wanted = min(self.max_replicas, max(self.scenario.min_replicas, self.autoscaler.desired(seen)))
        self._scale_to(wanted, now)
        self._reset_busy(now)
        if self.calls_left > 0 or self.prompts_left > 0:
            self.env.call_at(now + interval, TIMER, self._tick, interval)
        else:
            self._ticking = False

    # -- busy accounting for utilisation ---------------------------------------------------
    def _busy_between(self, r: Replica, since: float, now: float) -> float:
        held = r.busy_s
        if r.busy_since == r.busy_since:
            held += now - max(r.busy_since, since)
        return min(held, now - since)

    def _reset_busy(self, now: float) -> None:
        for r in self.live:
            r.busy_s = 0.0
            if r.busy_since == r.busy_since:
                r.busy_since = now

    # -- calls --------------------------------------------------------------------------------
    def send(self, ci: int) -> None:
        """Call ``ci`` arrives now (the client's ``send``); before the run's ``cold_start``
        ends nothing is taken in (the call arrives then, as without a pool)."""
        if self.env._now < self.scenario.cold_start:
            self.env.call_at(self.scenario.cold_start, ARRIVAL, lambda event: self.send(event._value), ci)
            return
        if self.queue:
            self._enqueue(ci)
            return
        if not self._place(ci):
            self._enqueue(ci)

    def _enqueue(self, ci: int) -> None:
        limit = self.scenario.pool_queue
        if limit is not None and len(self.queue) >= limit:
            ids = list(range(self._first[ci], self._first[ci + 1]))
            self._taken(ci)
            self.router.sent[ci] = True
            self._call_replica[ci] = -2
            self.main.turn_away(ids, "rejected")
            return
        self.queue.append(ci)

    def _candidates(self) -> list[Replica]:
        cap = self.max_inputs
        return [r for r in self.live if r.in_flight < cap and r.ready_at == r.ready_at]

    def _place(self, ci: int) -> bool:
        candidates = self._candidates()
        if not candidates:
            return False
        replica = candidates[self.rule.choose(self._key[ci], candidates, self._first[ci])]
        now = self.env._now
        lo, hi = self._first[ci], self._first[ci + 1]
        replica_of, dispatched_at, index = self.replica_of, self.dispatched_at, replica.index
        for i in range(lo, hi):
            replica_of[i] = index
            dispatched_at[i] = now
        self._call_replica[ci] = replica.index
        if replica.in_flight == 0:
            replica.busy_since = now
        replica.in_flight += 1
        self.router.sent[ci] = True
        ctx = replica.context
        self._taken(ci)
        for front, ids in self.router.groups[ci]:
            task = front.task
            ctx.dispatch_groups.group_started(task, len(ctx.gpus), ctx.dispatch_rng)
            replica.fronts[task].accept(ids)
        return True

    def _taken(self, ci: int) -> None:
        self.calls_left -= 1
        if self.calls_left == 0:
            for replica in self.replicas:
                ctx = replica.context
                ctx.input_closed = True
                for queue in ctx.queues:
                    queue.poll()

    def _dispatch(self) -> None:
        queue = self.queue
        while queue and self._place(queue[0]):
            queue.popleft()

    def prompts_finished(self, ids: list[int]) -> None:
        """Prompts left the system now: a call whose last prompt this was ends on its replica
        (which may take a waiting call, or stop if draining)."""
        now = self.env._now
        self.prompts_left -= len(ids)
        if now > self.end_at:
            self.end_at = now
        freed = False
        left, call_of = self._left_in_call, self.main.call_of
        for i in ids:
            ci = call_of[i]
            left[ci] -= 1
            if left[ci] == 0 and self._call_replica[ci] >= 0:
                replica = self.replicas[self._call_replica[ci]]
                replica.in_flight -= 1
                if replica.in_flight == 0:
                    replica.idle_since = now
                    replica.busy_s += now - replica.busy_since
                    replica.busy_since = math.nan
                    if replica.draining:
                        replica.stopped_at = now
                freed = True
        if freed:
            self._dispatch()
        self.router.prompts_finished(ids)

    def check_drained(self) -> None:
        """After the run: no call may be left in the pool's queue (:class:`ScenarioError`)."""
        if self.queue:
            raise ScenarioError(self.scenario.source, "run", "autoscaler",
                                f"the run stalled: {len(self.queue)} call(s) wait in the pool's queue and the "
                                f"{self.scenario.autoscaler} autoscaler starts no replica for them")

    # -- the record ---------------------------------------------------------------------------
    def table(self, last_arrival: float) -> ReplicaTable:
        """The lifecycle of every replica, the run ending at its last completion or arrival."""
        end = max(self.end_at, last_arrival)
        rows = self.replicas

        def clip(x: float) -> float:
            return x if x == x and x <= end else math.nan

        stopped = [min(r.stopped_at, end) if r.stopped_at == r.stopped_at else end for r in rows]
        return ReplicaTable(
            replica=tuple(r.index for r in rows),
            requested_at=tuple(min(r.requested_at, end) for r in rows),
            ready_at=tuple(clip(r.ready_at) for r in rows),
            drain_at=tuple(clip(r.drain_at) for r in rows),
            stopped_at=tuple(stopped),
            gpus_per_replica=self.scenario.gpus,
            min_replicas=self.scenario.min_replicas,
            max_replicas=self.max_replicas,
            start_at=0.0,
            end_at=end,
        )


def add_pool_columns(log: Any, pool: ReplicaPool, last_arrival: float) -> None:
    """Add the pool's per-prompt columns (``replica``, ``dispatched_at``) to ``log`` and its
    lifecycle table to ``log.attrs["replicas"]`` (in place)."""
    import pandas as pd

    replica = np.asarray(pool.replica_of, dtype=np.int64)
    log["replica"] = pd.arrays.IntegerArray(replica, mask=replica < 0)
    log["dispatched_at"] = np.asarray(pool.dispatched_at, dtype=float)
    log.attrs["replicas"] = pool.table(last_arrival)


__all__ = ["POOL_RULES", "POOL_SETTINGS", "check_pool_settings", "LeastLoaded", "PoolRule", "PrefixAffinity", "Replica", "ReplicaPool",
           "ReplicaTable", "RoundRobin", "ShortestQueue", "add_pool_columns", "cold_start_draw"]
