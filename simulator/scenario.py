"""Scenarios: the modeled serving system, as frozen, validated configuration.

A scenario says how many GPUs there are and how they are shared (the run settings), and per
task how its prompts are queued, batched and served (the task settings). Every setting is
declared once, in :mod:`simulator.settings` (docs/model.md has the table made from it). A
scenario is read from TOML (``--config``)::

    name = "design-notes"
    description = "..."

    [run]                      # system-wide
    gpus = 2
    gpu_sharing = "processor-sharing"
    deadline = 1200            # seconds from trace start; optional

    [defaults]                 # applies to every task (CLI flags set these too)
    flush = 0.5
    max_batch = 8

    [tasks.infobench]          # per-task overrides: win over [defaults]
    flush = 5.0
    max_batch = 10
    workers = 2

    [compositions]             # optional: classes of calls by their set of tasks, first match
    graph-only = {only = ["graph"]}                         # wins; figures per class in every
    mmlu-no-infobench = {all = ["mmlu"], none = ["infobench"]}  # summary, the rest "other"
    any-infobench = {any = ["infobench"]}

Precedence, lowest first: built-in defaults, the file's ``[defaults]``, the file's
``[tasks.NAME]``, command-line flags, ``--set`` overrides. An explicit flag always beats the
file: a task flag (``--flush 0.1``) sets that setting for every GPU task of the trace, as a
sweep or plan axis does (CPU tasks keep the file's settings; ``--set tasks.graph.X=...``
reaches them), and a run flag (``--gpus``) sets the run. ``--set KEY=VALUE`` names any
field by its dotted path (``tasks.infobench.flush=0.1``, ``defaults.max_batch=4``,
``run.gpus=4``, ``name="x"``), the value written as in TOML, and is checked as the file's
values are.
"""

from __future__ import annotations

import difflib
import tomllib
import warnings
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from simulator.errors import ScenarioError, SimctlWarning
from simulator.inputs import control_character
from simulator.memo import Memo
from simulator.settings import ENGINES, RUN, ClosedLoop, RunSettings, TaskConfig, check_values, parse_client

#: The conditions a composition class may set on a call's set of tasks.
COMPOSITION_TESTS = ("only", "all", "any", "none")


@dataclass(frozen=True)
class Compositions:
    """Classes of calls by the set of their tasks (``[compositions]``): ordered rules, first
    match wins; a call no rule matches is ``other``. A rule's conditions (all must hold):
    ``only`` — the call's tasks are exactly these; ``all`` — it has each of them; ``any`` —
    it has one of them; ``none`` — it has none of them. Without rules (the default) calls
    are not classed and summaries have no composition figures."""

    rules: tuple[tuple[str, Mapping[str, frozenset[str]]], ...] = ()

    @property
    def labels(self) -> list[str]:
        """The class names in rule order, then ``other`` (empty without rules)."""
        return [label for label, _ in self.rules] + (["other"] if self.rules else [])

    def classify(self, tasks: frozenset[str]) -> str:
        """The class of a call with task set ``tasks`` (``""`` without rules)."""
        if not self.rules:
            return ""
        for label, test in self.rules:
            if (("only" not in test or tasks == test["only"]) and test.get("all", frozenset()) <= tasks
                    and ("any" not in test or tasks & test["any"]) and not tasks & test.get("none", frozenset())):
                return label
        return "other"

    def to_dict(self) -> dict[str, dict[str, list[str]]]:
        return {label: {k: sorted(v) for k, v in test.items()} for label, test in self.rules}

    @staticmethod
    def parse(data: Any, where: str | None) -> Compositions:
        """From the ``[compositions]`` table; :class:`ScenarioError` naming the class and field."""
        if not isinstance(data, dict):
            raise ScenarioError(where, "compositions", None, "must be a table of classes")
        rules = []
        for label, test in data.items():
            record = f"compositions.{label!r}" if control_character(label) else f"compositions.{label}"
            if why := control_character(label):
                raise ScenarioError(where, record, None, f"the class name {why}")
            if label == "other":
                raise ScenarioError(where, record, None, "'other' is the class of calls no rule matches")
            if not isinstance(test, dict) or not test:
                raise ScenarioError(where, record, None, f"must be a table of {', '.join(COMPOSITION_TESTS)}")
            parsed = {}
            for key, names in test.items():
                if key not in COMPOSITION_TESTS:
                    raise ScenarioError(where, record, key, f"unknown condition; valid: {', '.join(COMPOSITION_TESTS)}")
                if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
                    raise ScenarioError(where, record, key, f"must be a list of task names, got {names!r}")
                for name in names:
                    if why := control_character(name):
                        raise ScenarioError(where, record, key, f"task name {name!r} {why}")
                parsed[key] = frozenset(names)
            rules.append((str(label), parsed))
        return Compositions(tuple(rules))


#: Complete task configurations made by :func:`task_config`, by their defaults and overrides.
_TASK_CONFIGS = Memo(4096)
#: The override values :func:`task_config` keeps its result for, compared by type and value
#: (floats by their exact bits: an override of 1 and one of 1.0, or 0.0 and -0.0, make
#: different configurations).
_PLAIN = frozenset({int, float, str, bool, type(None)})


def task_config(defaults: TaskConfig, overrides: Mapping[str, Any]) -> TaskConfig:
    """``defaults`` with ``overrides`` applied, kept for the next scenario with the same
    defaults and overrides: a sweep makes a scenario per configuration, and each would
    otherwise make its tasks' configurations again (a configuration is frozen: sharing it is safe)."""
    if not all(type(v) in _PLAIN for v in overrides.values()):
        return replace(defaults, **overrides)
    key = tuple((k, v.hex() if type(v) is float else (type(v), v)) for k, v in overrides.items())
    return _TASK_CONFIGS.get((defaults,), key, lambda: replace(defaults, **overrides))


@dataclass(frozen=True)
class Scenario(RunSettings):
    """The whole modeled system for one replay: the run settings (the fields of
    :class:`~simulator.settings.RunSettings`), the task settings of every task (``defaults``)
    and per-task overrides (``tasks``, overrides only: :meth:`for_task` gives a task's complete
    configuration)."""

    name: str = "cli"
    description: str = ""
    defaults: TaskConfig = field(default_factory=TaskConfig)
    tasks: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    compositions: Compositions = field(default_factory=Compositions)
    source: str | None = None

    def for_task(self, task: str) -> TaskConfig:
        """The complete configuration of ``task``: defaults with its overrides applied (made
        once per task: a replay asks for it many times, and a scenario is never changed)."""
        made = self.__dict__.get("_for_task")
        if made is None:
            made = {}
            object.__setattr__(self, "_for_task", made)  # (a cache, not a field: no effect on eq, hash, asdict)
        config = made.get(task)
        if config is None:
            overrides = self.tasks.get(task)
            config = made[task] = task_config(self.defaults, overrides) if overrides else self.defaults
        return config

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record of the scenario (written beside every result)."""
        run = {name: getattr(self, name) for name in RUN}
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            **{k: list(v) if isinstance(v, tuple) else v for k, v in run.items()},
            "defaults": asdict(self.defaults),
            "tasks": {k: dict(v) for k, v in self.tasks.items()},
            **({"compositions": self.compositions.to_dict()} if self.compositions.rules else {}),
        }


def parse_set(items: Sequence[str]) -> dict[str, Any]:
    """``["tasks.infobench.flush=0.1", "run.gpus=4"]`` -> ``{dotted key: value}``; the value is
    read as a TOML value (``0.1``, ``true``, ``"shared"``, ``[1, 2]``), a bare word as a string."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise ScenarioError(None, None, None, f"--set {item!r}: expected KEY=VALUE with a dotted KEY, "
                                f"e.g. tasks.infobench.flush=0.1")
        try:
            value = tomllib.loads(f"v = {text.strip()}")["v"]
        except (tomllib.TOMLDecodeError, RecursionError):
            value = text.strip()
        out[key] = value
    return out


def _apply_set(overrides: Mapping[str, Any], merged_defaults: dict[str, Any],
               task_overrides: dict[str, dict[str, Any]], run_values: dict[str, Any],
               header: dict[str, Any]) -> None:
    """Apply ``--set`` overrides in place, each checked as the file's value would be."""
    for key, value in overrides.items():
        parts = key.split(".")
        where = f"--set {key}"
        if parts[0] in ("name", "description") and len(parts) == 1:
            header[parts[0]] = str(value)
        elif parts[0] == "run" and len(parts) == 2:
            run_values.update(check_values("run", {parts[1]: value}, where, None))
        elif parts[0] == "defaults" and len(parts) == 2:
            merged_defaults.update(check_values("task", {parts[1]: value}, where, None))
        elif parts[0] == "tasks" and len(parts) == 3:
            task_overrides.setdefault(parts[1], {}).update(check_values("task", {parts[2]: value}, where, None))
        else:
            raise ScenarioError(None, None, None, f"--set {key}: no such setting; keys are name, description, "
                                f"run.SETTING, defaults.SETTING or tasks.TASK.SETTING "
                                f"(e.g. tasks.infobench.flush=0.1)")


def build_scenario(
    *,
    path: str | Path | None = None,
    defaults: Mapping[str, Any] | None = None,
    run: Mapping[str, Any] | None = None,
    tasks: Mapping[str, Mapping[str, Any]] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Scenario:
    """Build a scenario from an optional TOML file (or bundled scenario name) plus overrides.

    ``defaults`` (task settings for every task) override the file's ``[defaults]``;
    ``tasks`` (per-task settings, what task flags become for the trace's GPU tasks) override
    the file's ``[tasks.*]``; ``run`` (``gpus``, ``gpu_sharing``, ``deadline``...) overrides
    the file's ``[run]``; ``overrides`` (``--set``: dotted key -> value, see
    :func:`parse_set`) come last and win over everything. Keys whose value is ``None`` are
    ignored (an option the user did not give).
    """
    data: dict[str, Any] = {}
    if path is not None:
        from simulator import bundled, inputs

        path = bundled.resolve("scenarios", path, ScenarioError)
        data = inputs.read_toml(path, ScenarioError, "scenario TOML file")
        unknown = set(data) - {"name", "description", "run", "defaults", "tasks", "compositions"}
        if unknown:
            raise ScenarioError(str(path), None, sorted(unknown)[0],
                                "unknown section; valid: name, description, run, defaults, tasks, compositions")
    where = str(path) if path is not None else None
    file_run = data.get("run", {})
    file_defaults = data.get("defaults", {})
    file_tasks = data.get("tasks", {})
    for section, value in (("run", file_run), ("defaults", file_defaults), ("tasks", file_tasks)):
        if not isinstance(value, dict):
            raise ScenarioError(where, section, None, "must be a table")

    # Each source is checked on its own, so an error names the file or the option at fault.
    merged_defaults = check_values("task", file_defaults, where, "defaults")
    merged_defaults.update(check_values("task", _given(defaults), None, "option"))
    task_overrides: dict[str, dict[str, Any]] = {}
    for name in [*file_tasks, *(tasks or {}), *(k.split(".")[1] for k in overrides or {} if k.startswith("tasks."))]:
        if why := control_character(name):
            raise ScenarioError(where if name in file_tasks else None, f"tasks.{name!r}", None, f"the task name {why}")
    for name, values in file_tasks.items():
        if not isinstance(values, dict):
            raise ScenarioError(where, f"tasks.{name}", None, "must be a table")
        task_overrides[name] = check_values("task", values, where, f"tasks.{name}")
    for name, values in (tasks or {}).items():
        task_overrides.setdefault(name, {}).update(check_values("task", _given(values), None, f"tasks.{name}"))
    run_values = check_values("run", file_run, where, "run")
    run_values.update(check_values("run", _given(run), None, "option"))
    header = {"name": str(data.get("name", Path(path).stem if path else "cli")),
              "description": str(data.get("description", ""))}
    _apply_set(overrides or {}, merged_defaults, task_overrides, run_values, header)
    if why := control_character(header["name"]):
        raise ScenarioError(where, None, "name", why)
    return Scenario(
        name=header["name"],
        description=header["description"],
        **run_values,
        defaults=replace(TaskConfig(), **merged_defaults),
        tasks=task_overrides,
        compositions=Compositions.parse(data["compositions"], where) if "compositions" in data else Compositions(),
        source=where,
    )


def check_tasks(scenario: Scenario, profile_tasks: Collection[str], trace_tasks: Collection[str] | None = None,
                profile_name: str = "the profile") -> None:
    """Check the tasks ``scenario`` sets (its ``[tasks.NAME]`` tables) against those the run
    knows: the profile's ``profile_tasks`` and, where a trace is replayed, its ``trace_tasks``.
    The one check of a scenario meeting a profile and a trace (replay, sweep, plan, predict,
    calibrate, serve).

    A task neither knows is a typo that would otherwise go unnoticed (its settings applied to
    nothing, the task meant run with defaults): :class:`ScenarioError` naming the file, the
    table (``tasks.mmluu``), the nearest known names and every known one. A task the profile
    serves but the trace has no prompt of is legitimate (one scenario, many traces) and only
    warned about (:class:`~simulator.errors.SimctlWarning`), as its settings change nothing."""
    known = list(dict.fromkeys([*(trace_tasks or ()), *profile_tasks]))
    for name in scenario.tasks:
        if name in known and (trace_tasks is None or name in trace_tasks):
            continue
        if name in profile_tasks:
            warnings.warn(SimctlWarning(
                f"{scenario.source or 'scenario'}: tasks.{name}: the trace has no prompt of task '{name}'; "
                f"its settings change nothing"), stacklevel=2)
            continue
        close = difflib.get_close_matches(name, known, n=3)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        whose = f"the trace and {profile_name}" if trace_tasks is not None else profile_name
        raise ScenarioError(scenario.source, f"tasks.{name}", None,
                            f"unknown task '{name}'{hint} (tasks {whose} know: {', '.join(known)})")


def _given(values: Mapping[str, Any] | None) -> dict[str, Any]:
    """The values of options the user gave (``None``: not given)."""
    return {k: v for k, v in (values or {}).items() if v is not None}


__all__ = [
    "COMPOSITION_TESTS",
    "ENGINES",
    "ClosedLoop",
    "Compositions",
    "Scenario",
    "TaskConfig",
    "build_scenario",
    "check_tasks",
    "parse_client",
    "parse_set",
]
