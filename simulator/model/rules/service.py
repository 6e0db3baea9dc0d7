"""A task's service model: the profile's, with the scenario's speculative-decoding overrides
applied, made once per task for the reference engine and the live server alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from simulator.errors import ScenarioError
from simulator.profile import TaskProfile
from simulator.profile.kinds import ServiceModel
from simulator.profile.kinds.spec_decode import SpecDecodeService
from simulator.scenario import Scenario
from simulator.settings import TASK, service_overrides


def task_service(scenario: Scenario, task: str, task_profile: TaskProfile) -> ServiceModel:
    """The task's service model, with the scenario's speculative-decoding overrides applied
    (a :class:`ScenarioError` where the task itself sets one its kind cannot take)."""
    service = task_profile.service
    cfg = scenario.for_task(task)
    overrides = {k: getattr(cfg, k) for k in service_overrides() if getattr(cfg, k) is not None}
    # the kinds that take an override are the setting's declared readers
    if overrides and all(service.kind in TASK[k].kinds for k in overrides):
        return cast(SpecDecodeService, service).with_overrides(**overrides)
    if overrides:
        # Defaults (CLI flags, [defaults]) apply where they can; a task's own setting that
        # cannot apply is a mistake worth stopping for.
        own = [k for k in overrides if k in scenario.tasks.get(task, {})]
        if own:
            raise ScenarioError(scenario.source, f"tasks.{task}", own[0],
                                f"applies to spec_decode profiles only; task '{task}' has a "
                                f"'{service.kind}' service model")
    return service


class TaskServices:
    """Each task's service model (:func:`task_service`), made on first use and kept: one
    object per task for a run or a server, so every batch of a task draws from the same
    one."""

    def __init__(self, scenario: Scenario, task_profiles: Mapping[str, TaskProfile]) -> None:
        self.scenario = scenario
        self.task_profiles = task_profiles
        self._made: dict[str, ServiceModel] = {}

    def of(self, task: str) -> ServiceModel:
        """``task``'s service model."""
        service = self._made.get(task)
        if service is None:
            service = self._made[task] = task_service(self.scenario, task, self.task_profiles[task])
        return service
