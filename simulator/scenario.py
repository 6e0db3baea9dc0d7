"""Scenarios: the modeled serving system, as frozen, validated configuration.

A scenario says how many GPUs there are and how they are shared, and per task which
batching policy, queue topology, flush window, max batch, workers, dispatch rule, max
tokens and resource to use. It is read from TOML (``--config``)::

    name = "design-notes"
    description = "..."

    [run]                      # system-wide
    gpus = 2
    gpu_sharing = "processor-sharing"   # or "exclusive"
    deadline = 1200            # seconds from trace start; optional
    client = "open"            # or "closed:N[:THINK]": N calls outstanding, THINK s between
    client_timeout = 600       # a call not done in 600 s failed (still served); optional
    cold_start = 60            # nothing is served before t = 60 s; optional
    host_lock = true           # one process (one interpreter lock) drives every GPU; optional
    shared_rotation = ["graph", "mmlu"]   # one round-robin counter every group of these
                               # tasks advances; their round-robin dispatch takes from it
    max_concurrent_groups = 2  # a call's task groups run at most 2 at a time ...
    group_order = ["graph", "mmlu", "infobench"]   # ... started in this order
    engine = "auto"            # how to compute it: auto (the compiled kernel where it
                               # supports the scenario), reference (simpy), fast (the kernel
                               # or an error naming what it lacks); results are identical

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

import math
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from simulator.errors import ScenarioError

RESOURCES = ("gpu", "cpu")
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
    def parse(data: Any, where: str | None) -> "Compositions":
        """From the ``[compositions]`` table; :class:`ScenarioError` naming the class and field."""
        if not isinstance(data, dict):
            raise ScenarioError(where, "compositions", None, "must be a table of classes")
        rules = []
        for label, test in data.items():
            record = f"compositions.{label}"
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
                parsed[key] = frozenset(names)
            rules.append((str(label), parsed))
        return Compositions(tuple(rules))


@dataclass(frozen=True)
class TaskConfig:
    """How one task's prompts are queued, batched and served.

    ``workers``: for ``shared``, how many workers serve the queue (``None``: one per GPU,
    each bound to its GPU; fewer than the GPUs: each takes a GPU per batch by ``dispatch``).
    ``resource``: ``None`` takes the profile's. ``cpu_workers``: size of the CPU pool for a
    task on the CPU (``None``: unlimited, like a thread per request). ``max_tokens``: caps
    every prompt's max tokens (the trace's value otherwise, then the profile's default).
    ``acceptance``, ``lookahead``, ``discipline``: override a ``spec_decode`` profile's
    draft acceptance rate, drafts per iteration and batch discipline (``None``: the profile's).

    ``priority``: the task's class where work of several tasks waits for one device (higher
    first, FIFO within a class, never preempting a running batch). ``max_queue``: waiting
    prompts a queue holds; a prompt arriving at a full queue is rejected. ``queue_timeout``:
    seconds a prompt may wait in a queue; then ``timeout_action`` ``drop`` removes it
    (counted as dropped) or ``send`` keeps it (counted as timed out in the queue, still
    served), as Triton's queue policy does.

    Behaviours of real servers (see ``scenarios/lminference-*.toml``): ``sticky_gpu`` — a
    worker that takes a GPU per batch keeps the GPU of its first batch; ``dispatch_per`` —
    ``split`` sends each ``prompt`` to a queue, or a call's whole ``group`` to one;
    ``batch_forming`` — ``eager``: a free worker forms its batch and then waits for its GPU
    (a per-GPU lock taken after dequeuing), ``gpu-free``: it forms one only when its GPU is
    free; ``rows_per_prompt`` — rows a prompt occupies in a batch (best-of-n sampling: n);
    ``single_prompt`` — a batch of one prompt is served ``batched`` like any other, or
    ``sequential``: its rows run one after another as separate generations;
    ``adaptive_lookahead`` — speculative decoding picks the lookahead of each batch from the
    GPU's recent acceptance history (see :mod:`simulator.profile.kinds.spec_decode`).

    ``continuous`` topology only: ``max_num_seqs`` (rows in the running batch),
    ``max_batched_tokens`` (tokens per iteration: a prefill counts its prompt, a decode row
    one), ``kv_blocks`` (KV-cache blocks of ``block_size`` tokens per engine; ``None``: the
    profile's ``kv_cache``, else unlimited).
    """

    policy: str = "oldest"
    topology: str = "shared"
    flush: float = 0.0
    max_batch: int = 8
    workers: int | None = None
    dispatch: str = "round-robin"
    max_tokens: int | None = None
    resource: str | None = None
    cpu_workers: int | None = None
    acceptance: float | None = None
    lookahead: int | None = None
    discipline: str | None = None
    priority: int = 0
    max_queue: int | None = None
    queue_timeout: float | None = None
    timeout_action: str = "drop"
    max_num_seqs: int = 256
    max_batched_tokens: int = 8192
    kv_blocks: int | None = None
    block_size: int = 16
    sticky_gpu: bool = False
    dispatch_per: str = "prompt"
    batch_forming: str = "eager"
    rows_per_prompt: int = 1
    single_prompt: str = "batched"
    adaptive_lookahead: bool = False


TASK_FIELDS = {f.name for f in fields(TaskConfig)}
TIMEOUT_ACTIONS = ("drop", "send")
CHOICES = {"dispatch_per": ("prompt", "group"), "batch_forming": ("eager", "gpu-free"),
           "single_prompt": ("batched", "sequential")}


@dataclass(frozen=True)
class Scenario:
    """The whole modeled system for one replay. ``tasks`` holds per-task overrides only;
    :meth:`for_task` gives a task's complete configuration."""

    name: str = "cli"
    description: str = ""
    gpus: int = 2
    gpu_sharing: str = "exclusive"
    deadline: float | None = None
    rate_scale: float = 1.0
    client: str = "open"
    client_timeout: float | None = None
    cold_start: float = 0.0
    host_lock: bool = False
    shared_rotation: tuple[str, ...] = ()
    max_concurrent_groups: int | None = None
    group_order: tuple[str, ...] = ()
    engine: str = "auto"
    defaults: TaskConfig = field(default_factory=TaskConfig)
    tasks: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    compositions: Compositions = field(default_factory=Compositions)
    source: str | None = None

    def for_task(self, task: str) -> TaskConfig:
        """The complete configuration of ``task``: defaults with its overrides applied."""
        overrides = self.tasks.get(task)
        return replace(self.defaults, **overrides) if overrides else self.defaults

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record of the scenario (written beside every result)."""
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "gpus": self.gpus,
            "gpu_sharing": self.gpu_sharing,
            "deadline": self.deadline,
            "rate_scale": self.rate_scale,
            "client": self.client,
            "client_timeout": self.client_timeout,
            "cold_start": self.cold_start,
            "host_lock": self.host_lock,
            "shared_rotation": list(self.shared_rotation),
            "max_concurrent_groups": self.max_concurrent_groups,
            "group_order": list(self.group_order),
            "engine": self.engine,
            "defaults": asdict(self.defaults),
            "tasks": {k: dict(v) for k, v in self.tasks.items()},
            **({"compositions": self.compositions.to_dict()} if self.compositions.rules else {}),
        }


def _check_task_values(values: Mapping[str, Any], where: str | None, record: str | None) -> dict[str, Any]:
    """Type- and range-check task fields; names are checked against the registries later."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key not in TASK_FIELDS:
            raise ScenarioError(where, record, key, f"unknown setting; valid: {', '.join(sorted(TASK_FIELDS))}")
        if value is None:
            out[key] = None
            continue
        if key in ("policy", "topology", "dispatch", "resource"):
            if not isinstance(value, str) or not value:
                raise ScenarioError(where, record, key, f"must be a name, got {value!r}")
            if key == "resource" and value not in RESOURCES:
                raise ScenarioError(where, record, key, f"must be gpu or cpu, got {value!r}")
            if key != "resource":
                _check_name(key, value, where, record)
        elif key == "acceptance":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise ScenarioError(where, record, key, f"must be a probability in [0, 1], got {value!r}")
            value = float(value)
        elif key == "discipline":
            if value not in ("ragged", "lockstep"):
                raise ScenarioError(where, record, key, f"must be ragged or lockstep, got {value!r}")
        elif key in ("sticky_gpu", "adaptive_lookahead"):
            if not isinstance(value, bool):
                raise ScenarioError(where, record, key, f"must be true or false, got {value!r}")
        elif key in CHOICES:
            if value not in CHOICES[key]:
                raise ScenarioError(where, record, key, f"must be {' or '.join(CHOICES[key])}, got {value!r}")
        elif key == "timeout_action":
            if value not in TIMEOUT_ACTIONS:
                raise ScenarioError(where, record, key, f"must be {' or '.join(TIMEOUT_ACTIONS)}, got {value!r}")
        elif key == "priority":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ScenarioError(where, record, key, f"must be an integer (higher is served first), got {value!r}")
        elif key == "queue_timeout":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ScenarioError(where, record, key, f"must be a number of seconds > 0, got {value!r}")
            value = float(value)
        elif key == "flush":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ScenarioError(where, record, key, f"must be a number of seconds >= 0, got {value!r}")
            value = float(value)
        else:  # max_batch, workers, max_tokens, cpu_workers, lookahead, max_queue, max_num_seqs...
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ScenarioError(where, record, key, f"must be an integer >= 1, got {value!r}")
        out[key] = value
    return out


RUN_FIELDS = ("gpus", "gpu_sharing", "deadline", "rate_scale", "client", "client_timeout",
              "cold_start", "host_lock", "shared_rotation", "max_concurrent_groups", "group_order", "engine")
#: How a run is computed (``run.engine``); every engine gives the same event log.
ENGINES = ("auto", "reference", "fast")


@dataclass(frozen=True)
class ClosedLoop:
    """``closed:N[:THINK]``: N calls outstanding; a call's successor (the next call of the
    trace, in order) is sent THINK seconds after it ends. Arrival times are not used."""

    calls: int
    think: float = 0.0


def parse_client(text: str) -> ClosedLoop | None:
    """``None`` for ``open`` (replay the arrival times), a :class:`ClosedLoop` for
    ``closed:N[:THINK]``; ``ValueError`` with the reason otherwise."""
    if text == "open":
        return None
    parts = text.split(":")
    if parts[0] != "closed" or len(parts) not in (2, 3):
        raise ValueError(f"must be 'open' or 'closed:N[:THINK]', got {text!r}")
    try:
        calls = int(parts[1])
        think = float(parts[2]) if len(parts) == 3 else 0.0
    except ValueError:
        raise ValueError(f"must be 'open' or 'closed:N[:THINK]' with N an integer and THINK seconds, got {text!r}") from None
    if calls < 1 or not (think >= 0 and math.isfinite(think)):
        raise ValueError(f"closed loop needs N >= 1 and THINK >= 0, got {text!r}")
    return ClosedLoop(calls, think)


def _check_run_values(values: Mapping[str, Any], where: str | None, record: str | None) -> dict[str, Any]:
    """Type- and range-check run settings (``gpus``, ``gpu_sharing``, ``deadline``, ``rate_scale``)."""
    from simulator.model import GPU_SHARING
    from simulator.registry import UnknownName

    unknown = set(values) - set(RUN_FIELDS)
    if unknown:
        raise ScenarioError(where, record, sorted(unknown)[0], f"unknown setting; valid: {', '.join(RUN_FIELDS)}")
    out = dict(values)
    if "gpus" in values:
        gpus = values["gpus"]
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise ScenarioError(where, record, "gpus", f"must be an integer >= 1, got {gpus!r}")
    if values.get("deadline") is not None:
        deadline = values["deadline"]
        if isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or not (deadline > 0 and math.isfinite(deadline)):
            raise ScenarioError(where, record, "deadline", f"must be a number of seconds > 0, got {deadline!r}")
    if "rate_scale" in values:
        rate_scale = values["rate_scale"]
        if isinstance(rate_scale, bool) or not isinstance(rate_scale, (int, float)) or not (rate_scale > 0 and math.isfinite(rate_scale)):
            raise ScenarioError(where, record, "rate_scale", f"must be a number > 0, got {rate_scale!r}")
    for key in ("client_timeout", "cold_start"):
        value = values.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not (value >= 0 and math.isfinite(value))):
            raise ScenarioError(where, record, key, f"must be a number of seconds >= 0, got {value!r}")
    if "host_lock" in values and not isinstance(values["host_lock"], bool):
        raise ScenarioError(where, record, "host_lock", f"must be true or false, got {values['host_lock']!r}")
    groups = values.get("max_concurrent_groups")
    if groups is not None and (isinstance(groups, bool) or not isinstance(groups, int) or groups < 1):
        raise ScenarioError(where, record, "max_concurrent_groups", f"must be an integer >= 1, got {groups!r}")
    for key in ("group_order", "shared_rotation"):
        names = values.get(key)
        if names is not None and (not isinstance(names, (list, tuple)) or not all(isinstance(t, str) and t for t in names)):
            raise ScenarioError(where, record, key, f"must be a list of task names, got {names!r}")
    if "client" in values:
        client = values["client"]
        if not isinstance(client, str):
            raise ScenarioError(where, record, "client", f"must be a string, got {client!r}")
        try:
            parse_client(client)
        except ValueError as exc:
            raise ScenarioError(where, record, "client", str(exc)) from None
    if "engine" in values and values["engine"] not in ENGINES:
        raise ScenarioError(where, record, "engine", f"must be {', '.join(ENGINES)}, got {values['engine']!r}")
    if "gpu_sharing" in values:
        sharing = values["gpu_sharing"]
        if not isinstance(sharing, str):
            raise ScenarioError(where, record, "gpu_sharing", f"must be a name, got {sharing!r}")
        if sharing not in GPU_SHARING:
            raise ScenarioError(where, record, "gpu_sharing", str(UnknownName("GPU sharing mode", sharing, GPU_SHARING.names())))
    return out


def _check_name(key: str, name: str, where: str | None, record: str) -> None:
    """``name`` must be registered for ``key`` (policy, topology or dispatch)."""
    from simulator.model import DISPATCH_RULES, POLICIES, TOPOLOGIES
    from simulator.registry import UnknownName

    reg, what = {"policy": (POLICIES, "batching policy"), "topology": (TOPOLOGIES, "topology"),
                 "dispatch": (DISPATCH_RULES, "dispatch rule")}[key]
    if name not in reg:
        raise ScenarioError(where, record, key, str(UnknownName(what, name, reg.names())))


def validate_names(scenario: Scenario, tasks: list[str]) -> None:
    """Check every policy, topology, dispatch and sharing name against its registry."""
    from simulator.model import DISPATCH_RULES, GPU_SHARING, POLICIES, TOPOLOGIES
    from simulator.registry import UnknownName

    if scenario.gpu_sharing not in GPU_SHARING:
        raise ScenarioError(scenario.source, "run", "gpu_sharing", str(UnknownName("GPU sharing mode", scenario.gpu_sharing, GPU_SHARING.names())))
    for task in ["defaults", *tasks]:
        cfg = scenario.defaults if task == "defaults" else scenario.for_task(task)
        record = "defaults" if task == "defaults" else f"tasks.{task}"
        for key, reg, what in (
            ("policy", POLICIES, "batching policy"),
            ("topology", TOPOLOGIES, "topology"),
            ("dispatch", DISPATCH_RULES, "dispatch rule"),
        ):
            name = getattr(cfg, key)
            if name not in reg:
                raise ScenarioError(scenario.source, record, key, str(UnknownName(what, name, reg.names())))


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
            run_values.update(_check_run_values({parts[1]: value}, where, None))
        elif parts[0] == "defaults" and len(parts) == 2:
            merged_defaults.update(_check_task_values({parts[1]: value}, where, None))
        elif parts[0] == "tasks" and len(parts) == 3:
            task_overrides.setdefault(parts[1], {}).update(_check_task_values({parts[2]: value}, where, None))
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

    merged_defaults = _check_task_values(file_defaults, where, "defaults")
    merged_defaults.update(
        _check_task_values({k: v for k, v in (defaults or {}).items() if v is not None}, None, "option")
    )
    task_overrides: dict[str, dict[str, Any]] = {}
    for name, values in file_tasks.items():
        if not isinstance(values, dict):
            raise ScenarioError(where, f"tasks.{name}", None, "must be a table")
        task_overrides[name] = _check_task_values(values, where, f"tasks.{name}")
    for name, values in (tasks or {}).items():
        task_overrides.setdefault(name, {}).update(
            _check_task_values({k: v for k, v in values.items() if v is not None}, None, f"tasks.{name}")
        )

    # Each source is checked on its own, so an error names the file or the option at fault.
    run_values = _check_run_values(file_run, where, "run")
    run_values.update(_check_run_values({k: v for k, v in (run or {}).items() if v is not None}, None, "option"))
    header = {"name": str(data.get("name", Path(path).stem if path else "cli")),
              "description": str(data.get("description", ""))}
    _apply_set(overrides or {}, merged_defaults, task_overrides, run_values, header)
    gpus = run_values.get("gpus", 2)
    deadline = run_values.get("deadline")
    rate_scale = run_values.get("rate_scale", 1.0)
    sharing = run_values.get("gpu_sharing", "exclusive")
    client = run_values.get("client", "open")
    client_timeout = run_values.get("client_timeout")

    scenario = Scenario(
        name=header["name"],
        description=header["description"],
        gpus=gpus,
        gpu_sharing=sharing,
        deadline=None if deadline is None else float(deadline),
        rate_scale=float(rate_scale),
        client=client,
        client_timeout=None if client_timeout is None else float(client_timeout),
        cold_start=float(run_values.get("cold_start", 0.0)),
        host_lock=bool(run_values.get("host_lock", False)),
        shared_rotation=tuple(run_values.get("shared_rotation", ())),
        max_concurrent_groups=run_values.get("max_concurrent_groups"),
        group_order=tuple(run_values.get("group_order", ())),
        engine=str(run_values.get("engine", "auto")),
        defaults=replace(TaskConfig(), **merged_defaults),
        tasks=task_overrides,
        compositions=Compositions.parse(data["compositions"], where) if "compositions" in data else Compositions(),
        source=where,
    )
    validate_names(scenario, list(task_overrides))
    return scenario
