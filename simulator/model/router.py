"""The router: a call's prompts → per-task groups → each task's front end (its topology).

Reading the trace, the router fills the run's per-prompt input columns (a prompt's tokens
default to its task's profile, its max tokens capped by the task's ``max_tokens``), builds
each task's front once (in the order the tasks first appear) and splits every call into
per-task groups, started in the scenario's ``group_order`` (tasks it does not list keep
their order of first appearance, after the listed ones).

When a call is sent (:meth:`Router.send`, by the client) its groups start: all at once, or
with ``max_concurrent_groups = N`` at most N at a time, the next starting when one's last
prompt leaves. A group of a task in a dispatch group that takes nothing from the group's
rotation still advances it. Nothing is taken in before the ``cold_start`` ends; after the
trace's last call is sent, the queues are told that input has ended.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from simulator.model.context import RunContext
from simulator.model.event_order import ARRIVAL
from simulator.model.topologies import TOPOLOGIES, Topology
from simulator.profile import Profile
from simulator.scenario import Scenario
from simulator.trace.model import Trace


class Router:
    """Splits calls into task groups and starts them at their tasks' fronts."""

    def __init__(self, run: RunContext, trace: Trace, scenario: Scenario, profile: Profile) -> None:
        self.run = run
        self.scenario = scenario
        self.n_calls = len(trace.calls)
        #: per call: its groups in start order, each (the task's front, its prompt ids)
        self.groups: list[list[tuple[Topology, list[int]]]] = []
        #: whether each call has been sent (taken in by the server)
        self.sent = [False] * self.n_calls
        #: told when a call's last prompt leaves (a closed-loop client), if set
        self.on_call_done: Callable[[int], None] | None = None
        #: per call, what its sending does instead of starting its groups (a snapshot's
        #: prompts, :mod:`simulator.model.start`)
        self.instead: dict[int, Callable[[], None]] = {}
        self._build(trace, profile)
        run.allocate()
        run.on_finished = self.prompts_finished
        self._left_in_call = [len(c.prompts) for c in trace.calls]
        # With at most N groups of a call at a time: the groups not started yet, and prompts
        # left per running group (keyed by the group's first prompt).
        self._waiting_groups: dict[int, deque] = {}
        self._left_in_group: dict[int, int] = {}
        self._group_head = [0] * len(run.arrived_at)
        for call_groups in self.groups:
            for _, ids in call_groups:
                for i in ids:
                    self._group_head[i] = ids[0]

    def _build(self, trace: Trace, profile: Profile) -> None:
        run, scenario = self.run, self.scenario
        order = {t: r for r, t in enumerate(scenario.group_order)}
        # Per task: its front end, default prompt tokens, default max tokens and cap.
        info: dict[str, tuple[Topology, int, int, int | None]] = {}
        arrived_at, call_of, task_of = run.arrived_at, run.call_of, run.task_of
        ptoks, mtoks = run.prompt_tokens, run.max_tokens
        index = 0
        for ci, call in enumerate(trace.calls):
            by_task: dict[str, list[int]] = {}
            for prompt in call.prompts:
                task = prompt.task
                task_info = info.get(task)
                if task_info is None:
                    run.configs[task] = cfg = scenario.for_task(task)
                    tp = profile.task(task)  # fails early on a task the profile lacks
                    front = TOPOLOGIES.get(cfg.topology)(run, task, cfg)
                    task_info = info[task] = (front, tp.prompt_tokens, tp.max_tokens, cfg.max_tokens)
                max_tokens = prompt.max_tokens or task_info[2]
                if task_info[3] is not None and max_tokens > task_info[3]:
                    max_tokens = task_info[3]
                ptoks.append(task_info[1] if prompt.prompt_tokens is None else prompt.prompt_tokens)
                mtoks.append(max_tokens)
                arrived_at.append(call.t)
                call_of.append(ci)
                task_of.append(task)
                group = by_task.get(task)
                if group is None:
                    by_task[task] = [index]
                else:
                    group.append(index)
                index += 1
            tasks = sorted(by_task, key=lambda t: order.get(t, len(order))) if order else list(by_task)
            self.groups.append([(info[t][0], by_task[t]) for t in tasks])

    def send(self, ci: int) -> None:
        """Call ``ci`` is sent now: its groups start (or wait for the cold start to end)."""
        run = self.run
        env = run.env
        if env._now < self.scenario.cold_start:
            # Nothing serves before the cold start ends: the call is taken in then.
            env.call_at(self.scenario.cold_start, ARRIVAL, lambda event: self.send(event._value), ci)
            return
        self.sent[ci] = True
        instead = self.instead.get(ci)
        if instead is not None:
            instead()
            self._after_send(ci)
            return
        call_groups = self.groups[ci]
        limit = self.scenario.max_concurrent_groups
        if limit is not None and len(call_groups) > limit:
            self._waiting_groups[ci] = deque(call_groups[limit:])
            call_groups = call_groups[:limit]
        for front, ids in call_groups:
            self._start_group(front, ids)
        self._after_send(ci)

    def _after_send(self, ci: int) -> None:
        run = self.run
        if ci == self.n_calls - 1:
            run.input_closed = True
            for queue in run.queues:
                queue.poll()

    def _start_group(self, front: Topology, ids: list[int]) -> None:
        run = self.run
        if self._waiting_groups:
            self._left_in_group[ids[0]] = len(ids)
        run.dispatch_groups.group_started(run.task_of[ids[0]], len(run.gpus), run.dispatch_rng)
        front.accept(ids)

    def prompts_finished(self, ids: list[int]) -> None:
        """Prompts left the system now: a call's next task group may start (at most N at a
        time); a closed-loop client learns when a call is over."""
        if self._waiting_groups:
            for i in ids:
                head = self._group_head[i]
                left = self._left_in_group.get(head)
                if left is None:
                    continue
                if left > 1:
                    self._left_in_group[head] = left - 1
                    continue
                del self._left_in_group[head]
                pending = self._waiting_groups.get(self.run.call_of[i])
                if pending:
                    self._start_group(*pending.popleft())
        if self.on_call_done is None:
            return
        left_in_call, call_of = self._left_in_call, self.run.call_of
        for i in ids:
            ci = call_of[i]
            left_in_call[ci] -= 1
            if left_in_call[ci] == 0:
                self.on_call_done(ci)
