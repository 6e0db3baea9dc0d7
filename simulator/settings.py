"""The scenario's settings, each declared once.

Every setting is one field of :class:`TaskConfig` (how one task's prompts are queued, batched
and served) or of :class:`RunSettings` (the whole run; :class:`simulator.scenario.Scenario`
extends it), declared with :func:`setting`. The field gives the setting's name, type and
default; the keywords of :func:`setting` give the rest: its range or choices (or the registry
whose names are valid), its help, whether a sweep may vary it, which topologies and profile
kinds read it, and which commands take it as a flag. From these declarations, never written
again anywhere:

* the check of every value, from a scenario file, a flag, a sweep axis or ``--set``
  (:meth:`Setting.check`, :func:`check_values`), its error naming file, record and field;
* the flags of ``replay``, ``sweep`` and ``plan`` (``simulator.cli._common.setting_options``);
* sweep and plan axes (:data:`AXES`) and the parsing of their values (:meth:`Setting.parse`);
* the ``--set`` keys (``run.NAME``, ``defaults.NAME``, ``tasks.TASK.NAME``);
* the settings a topology never reads (:func:`ignored_by`: a sweep does not expand them);
* the scenario reference in ``docs/model.md`` (:func:`reference_table`).

Registries (batching policies, topologies, dispatch rules, GPU sharing modes, batch forming
rules) are named by import path and looked up when a value is checked or listed, so importing
this module (or :mod:`simulator.scenario`) imports nothing of the model.

Adding a setting is one field here, plus the code that reads it (``docs/model.md``, "Adding a
setting").
"""

from __future__ import annotations

import functools
import importlib
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

from simulator.errors import ScenarioError
from simulator.inputs import control_character
from simulator.registry import Registry, UnknownName

T = TypeVar("T")

#: The commands whose flags come from the settings.
COMMANDS = ("replay", "sweep", "plan")
#: Where a registry lives, as ``module:NAME``.
POLICIES = "simulator.model:POLICIES"
TOPOLOGIES = "simulator.model:TOPOLOGIES"
DISPATCH_RULES = "simulator.model:DISPATCH_RULES"
GPU_SHARING = "simulator.model:GPU_SHARING"
BATCH_FORMING = "simulator.model.batching:BATCH_FORMING"
BATCH_SELECTION = "simulator.model.length:SELECTIONS"
PROFILE_KINDS = "simulator.profile.kinds:KINDS"
AUTOSCALERS = "simulator.model:AUTOSCALERS"
POOL_RULES = "simulator.model:POOL_RULES"

# Who reads a setting, in the topologies' names.
QUEUED = ("shared", "split")                  # a micro-batch queue released by a batching policy
BATCHED = ("shared", "split", "direct")       # whole batches, formed once and served
WAITING_LINE = ("shared", "split", "continuous", "disaggregated")   # prompts wait in a line (queue limits)
CONTINUOUS = ("continuous", "disaggregated")  # continuous-batching engines
DISAGGREGATED = ("disaggregated",)           # prefill and decode pools
SPEC_DECODE = ("spec_decode",)                # profile kinds
ALL = COMMANDS
REPLAY = ("replay",)
REPLAY_SWEEP = ("replay", "sweep")


@dataclass(frozen=True)
class Setting:
    """One setting: the field it is (name, scope, type, default) and what it accepts.

    A number lies in ``[min, max]`` (``min`` excluded when ``above``; never infinite when
    ``finite``). A name is one of ``choices``, or of the registry at ``registry``. ``grammar``
    parses a text value further (``client``), raising :class:`ValueError` with the reason.
    ``noun`` is how an error and the docs call a valid value (``a number of seconds``);
    ``unset`` what the default ``None`` means (``per GPU``). ``read_by``: the topologies that
    read it (empty: every one); ``kinds``: the profile kinds (empty: every one). ``cli``: the
    commands that take it as a flag; ``sweepable``: a sweep may vary it (an axis).
    ``reference_only``: only the reference engine models it, so a value other than the
    default runs the scenario there (:func:`simulator.model.fast.unsupported`).
    """

    help: str
    min: float | None = None
    max: float | None = None
    above: bool = False
    finite: bool = False
    choices: tuple[str, ...] = ()
    registry: str = ""
    grammar: Callable[[str], object] | None = None
    noun: str = ""
    unset: str = ""
    read_by: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    cli: tuple[str, ...] = ()
    sweepable: bool = False
    reference_only: bool = False
    # From the field (filled in by :func:`_declared`).
    name: str = ""
    scope: str = ""
    value_type: type = object
    optional: bool = False
    default: Any = None

    @property
    def flag(self) -> str:
        """The command-line flag: ``--max-batch`` for ``max_batch``."""
        return "--" + self.name.replace("_", "-")

    # -- what it accepts ------------------------------------------------------------------

    def names(self) -> list[str]:
        """The valid names of a name setting (its choices or its registry's names), else []."""
        return list(self.choices) or (registry(self.registry).names() if self.registry else [])

    def bounds(self) -> str:
        """The range as text: `` >= 0``, `` > 0``, `` in [0, 1]`` (empty without one)."""
        if self.min is not None and self.max is not None:
            return f" in [{_number(self.min)}, {_number(self.max)}]"
        if self.min is not None:
            return f" {'>' if self.above else '>='} {self.min:g}"
        return ""

    def expected(self) -> str:
        """What a valid value is, as an error says it after ``must be``."""
        if self.noun:
            return self.noun + self.bounds()
        if self.value_type is bool:
            return "true or false"
        if self.choices:
            return _either(self.choices)
        if self.registry:
            return "a name"
        kind = {int: "an integer", float: "a number", str: "a string", tuple: "a list of task names"}
        return kind[self.value_type] + self.bounds()

    def check(self, value: Any, where: str | None = None, record: str | None = None) -> Any:
        """``value`` as the setting holds it (an integer given for a number becomes a float,
        a list a tuple); :class:`ScenarioError` naming ``where``, ``record`` and this setting
        otherwise."""
        if value is None and self.optional:
            return None
        if self.registry:
            if not isinstance(value, str) or not value:
                raise ScenarioError(where, record, self.name, f"must be a name, got {value!r}")
            names = registry(self.registry)
            if value not in names:
                raise ScenarioError(where, record, self.name, str(UnknownName(names.what, value, names.names())))
            return value
        ok: bool
        if self.value_type is bool:
            ok = isinstance(value, bool)
        elif self.choices:
            ok = isinstance(value, str) and value in self.choices
        elif self.value_type is tuple:
            ok = isinstance(value, (list, tuple)) and all(isinstance(t, str) and t for t in value)
            value = tuple(value) if ok else value
        elif self.value_type is str:
            ok = isinstance(value, str)
        elif self.value_type in (int, float):
            ok = (not isinstance(value, bool) and isinstance(value, int if self.value_type is int else (int, float))
                  and self._in_range(value))
            value = float(value) if ok and self.value_type is float else value
        else:  # pragma: no cover - a declaration error, caught by the tests
            raise TypeError(f"setting {self.name}: no check for type {self.value_type}")
        if not ok:
            raise ScenarioError(where, record, self.name, f"must be {self.expected()}, got {value!r}")
        # A name (a task, a dispatch group) printed in tables and messages must be one line.
        for name in (value if self.value_type is tuple else (value,) if self.value_type is str and self.grammar is None
                     else ()):
            if why := control_character(name):
                raise ScenarioError(where, record, self.name, f"{name!r} {why}")
        if self.grammar is not None:
            try:
                self.grammar(value)
            except ValueError as exc:
                raise ScenarioError(where, record, self.name, str(exc)) from None
        return value

    def _in_range(self, value: float) -> bool:
        if self.min is not None and not (value > self.min if self.above else value >= self.min):
            return False
        if self.max is not None and not value <= self.max:
            return False
        return not self.finite or math.isfinite(value)

    def parse(self, text: str) -> Any:
        """One value from command-line text, by the setting's type (not yet checked);
        :class:`ValueError` when the text is not of that type."""
        if self.value_type is int:
            return int(text)
        if self.value_type is float:
            return float(text)
        if self.value_type is bool:
            if text.lower() not in ("true", "false"):
                raise ValueError(text)
            return text.lower() == "true"
        return text

    # -- how it is shown ------------------------------------------------------------------

    def default_text(self) -> str:
        """The default as help and docs show it (``per GPU`` for an unset default)."""
        value = self.default
        if value is None:
            return self.unset or "none"
        if isinstance(value, bool):
            return str(value).lower()
        if isinstance(value, tuple):
            return "[" + ", ".join(value) + "]"
        return str(value)

    def readers(self) -> str:
        """Who reads it, as the docs say it."""
        if self.scope == "run":
            return "the run"
        who = [", ".join(self.read_by)] if self.read_by else []
        who += [f"{', '.join(self.kinds)} profiles"] if self.kinds else []
        return "; ".join(who) or "every topology"

    def reads(self, topology: str, kind: str | None = None) -> bool:
        """Whether a task of ``topology`` whose profile kind is ``kind`` reads this setting."""
        return ((not self.read_by or topology in self.read_by)
                and (not self.kinds or kind is None or kind in self.kinds))


def _either(names: Iterable[str]) -> str:
    """``a or b``, ``a, b or c``."""
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


@functools.cache
def registry(path: str) -> Registry[Any]:
    """The registry at ``module:NAME``, imported on first use."""
    module, _, name = path.partition(":")
    found = getattr(importlib.import_module(module), name)
    assert isinstance(found, Registry), path
    return found


# The largest values a setting takes. A run keeps state per GPU, per worker and per batch
# slot, so a value past these describes no serving system and would only exhaust memory or
# time before it failed; it is refused up front, with the range, instead.
LARGEST_GPUS = 100_000
LARGEST_COUNT = 1_000_000         # workers, CPU pool size, batch and running-batch rows
LARGEST_TOKENS = 2**31 - 1        # token counts and budgets, queue lengths, priorities
LARGEST_LOOKAHEAD = 1024          # drafts per speculative step, rows per prompt
# The command-line counts that are not settings, bounded for the same reason.
LARGEST_SEED = 2**63 - 1          # a seed is written into results as a 64-bit integer
LARGEST_SEEDS = 10_000            # whole runs per configuration (--seeds)
LARGEST_JOBS = 1024               # local processes (--jobs), each a forked interpreter


def _number(value: float) -> str:
    """A bound as a message shows it: 1,000,000 rather than 1e+06."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def setting(default: T, help: str, **spec: Any) -> T:
    """A settings field: ``default``, with ``help`` and the rest of ``spec`` (the keywords of
    :class:`Setting`) kept as its metadata. Typed as its default, so that the dataclass's
    field type is the setting's."""
    return field(default=default, metadata={"setting": Setting(help=help, **spec)})


# -- the client grammar (a run setting's value) ------------------------------------------


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
        raise ValueError(f"must be 'open' or 'closed:N[:THINK]' with N an integer and THINK seconds, "
                         f"got {text!r}") from None
    if calls < 1 or not (think >= 0 and math.isfinite(think)):
        raise ValueError(f"closed loop needs N >= 1 and THINK >= 0, got {text!r}")
    return ClosedLoop(calls, think)


def parse_bounds(text: str) -> tuple[int, ...]:
    """Length bucket boundaries (``bucket_bounds``): ``"600,1500"`` -> ``(600, 1500)``,
    increasing token counts >= 1; ``ValueError`` with the reason otherwise."""
    try:
        bounds = tuple(int(p) for p in text.split(","))
    except ValueError:
        raise ValueError(f"must be comma-separated token counts such as '600,1500', got {text!r}") from None
    if any(b < 1 for b in bounds) or any(a >= b for a, b in zip(bounds, bounds[1:], strict=False)):
        raise ValueError(f"must be increasing token counts >= 1, got {text!r}")
    return bounds


@dataclass(frozen=True)
class ColdStart:
    """How long a new replica takes before it serves (``replica_cold_start``): ``fixed``
    seconds; one of measured ``samples`` (seconds, drawn uniformly from the run's
    ``cold start`` stream); or a model load, ``weights_gb`` ÷ ``load_gbps`` + ``engine_s``."""

    kind: str
    seconds: float = 0.0
    samples: tuple[float, ...] = ()

    @property
    def mean(self) -> float:
        """The mean cold start in seconds."""
        return sum(self.samples) / len(self.samples) if self.kind == "samples" else self.seconds


def parse_cold_start(text: str) -> ColdStart:
    """``SECONDS``, ``samples:S1,S2,...`` or ``load:WEIGHTS_GB:GBPS[:ENGINE_S]`` as a
    :class:`ColdStart`; ``ValueError`` with the reason otherwise."""
    head, _, rest = text.partition(":")
    try:
        if not rest:
            value = float(head)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError
            return ColdStart("fixed", value)
        if head == "samples":
            samples = tuple(float(x) for x in rest.split(","))
            if not samples or not all(x >= 0 and math.isfinite(x) for x in samples):
                raise ValueError
            return ColdStart("samples", samples=samples)
        if head == "load":
            parts = [float(x) for x in rest.split(":")]
            if len(parts) not in (2, 3) or parts[1] <= 0 or not all(x >= 0 and math.isfinite(x) for x in parts):
                raise ValueError
            return ColdStart("fixed", parts[0] / parts[1] + (parts[2] if len(parts) == 3 else 0.0))
    except ValueError:
        pass
    raise ValueError(f"must be SECONDS, samples:S1,S2,... or load:WEIGHTS_GB:GBPS[:ENGINE_S] (finite, >= 0; "
                     f"GBPS > 0), got {text!r}")


#: How a run is computed (``run.engine``); every engine gives the same event log.
ENGINES = ("auto", "reference", "fast")


# -- the settings -------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskConfig:
    """How one task's prompts are queued, batched and served: one field per task setting.

    A scenario's ``[defaults]`` and ``[tasks.NAME]`` set these; ``Scenario.for_task`` gives a
    task's complete configuration. What each setting means is its ``help`` below (and the
    table in docs/model.md, made from it).
    """

    policy: str = setting(
        "oldest", "When a queue releases a batch", registry=POLICIES, read_by=QUEUED, sweepable=True, cli=ALL)
    topology: str = setting(
        "shared", "Queue topology", registry=TOPOLOGIES, sweepable=True, cli=ALL)
    flush: float = setting(
        0.0, "Flush window in seconds (0 = no waiting)", min=0, noun="a number of seconds", read_by=QUEUED,
        sweepable=True, cli=ALL)
    max_batch: int = setting(
        8, "Max prompts per batch", min=1, max=LARGEST_COUNT, read_by=BATCHED, sweepable=True, cli=ALL)
    workers: int | None = setting(
        None, "Workers per shared queue (fewer than the GPUs: each takes a GPU per batch by the dispatch rule)",
        min=1, max=LARGEST_COUNT, unset="per GPU", read_by=("shared",), sweepable=True, cli=ALL)
    dispatch: str = setting(
        "round-robin", "Dispatch rule to queues/GPUs", registry=DISPATCH_RULES, sweepable=True, cli=ALL)
    max_tokens: int | None = setting(
        None, "Cap on every prompt's max tokens", min=1, max=LARGEST_TOKENS, unset="the trace's, else the profile's",
        sweepable=True, cli=REPLAY_SWEEP)
    resource: str | None = setting(
        None, "Where the task runs", choices=("gpu", "cpu"), unset="the profile's")
    cpu_workers: int | None = setting(
        None, "Size of the CPU pool of a task on the CPU", min=1, max=LARGEST_COUNT, unset="unlimited, a thread per request")
    acceptance: float | None = setting(
        None, "Draft acceptance rate alpha", min=0, max=1, noun="a probability", unset="the profile's",
        kinds=SPEC_DECODE, sweepable=True, cli=REPLAY_SWEEP)
    lookahead: int | None = setting(
        None, "Drafts per speculative iteration", min=1, max=LARGEST_LOOKAHEAD, unset="the profile's", kinds=SPEC_DECODE,
        sweepable=True, cli=REPLAY_SWEEP)
    discipline: str | None = setting(
        None, "Speculative batch discipline", choices=("ragged", "lockstep"), unset="the profile's",
        kinds=SPEC_DECODE, sweepable=True, cli=REPLAY_SWEEP)
    priority: int = setting(
        0, "The task's class where work of several tasks waits for one device: higher first, FIFO within a "
        "class, never preempting a running batch", min=-LARGEST_TOKENS, max=LARGEST_TOKENS,
        noun="an integer (higher is served first)")
    max_queue: int | None = setting(
        None, "Waiting prompts a queue holds; more are rejected", min=1, max=LARGEST_TOKENS, unset="unlimited",
        read_by=WAITING_LINE, cli=REPLAY)
    queue_timeout: float | None = setting(
        None, "Seconds a prompt may wait in a queue", min=0, above=True, noun="a number of seconds",
        unset="unlimited", read_by=WAITING_LINE, cli=REPLAY, reference_only=True)
    timeout_action: str = setting(
        "drop", "At the queue timeout: drop the prompt, or send it anyway (served, counted as timed out)",
        choices=("drop", "send"), read_by=WAITING_LINE, cli=REPLAY)
    max_num_seqs: int = setting(
        256, "Rows in a running batch", min=1, max=LARGEST_COUNT, read_by=CONTINUOUS, sweepable=True, cli=REPLAY_SWEEP)
    max_batched_tokens: int = setting(
        8192, "Token budget per iteration (a prefill counts its prompt, a decode row one)", min=1,
        max=LARGEST_TOKENS,
        read_by=CONTINUOUS, sweepable=True, cli=REPLAY_SWEEP)
    kv_blocks: int | None = setting(
        None, "KV-cache blocks per engine", min=1, max=LARGEST_TOKENS, unset="the profile's kv_cache, else unlimited",
        read_by=CONTINUOUS, sweepable=True, cli=REPLAY_SWEEP)
    block_size: int = setting(
        16, "Tokens per KV-cache block", min=1, max=LARGEST_TOKENS, read_by=CONTINUOUS, cli=REPLAY)
    prefix_caching: bool = setting(
        False, "Automatic prefix caching: an engine keeps the prefix blocks of the prompts it ran (the trace's "
        "hash_ids) and prefills only what a prompt does not share with them", read_by=CONTINUOUS, sweepable=True,
        cli=REPLAY_SWEEP, reference_only=True)
    system_tokens: int = setting(
        0, "Tokens of a system prompt every prompt of the task begins with: prefix caching shares its whole blocks "
        "between the task's prompts that carry no prefix ids in the trace", min=0, max=LARGEST_TOKENS,
        read_by=CONTINUOUS, sweepable=True, cli=REPLAY_SWEEP, reference_only=True)
    prefix_cache_size: int | None = setting(
        None, "Prefix-cache capacity per engine, in tokens (least recently used unreferenced blocks are evicted)",
        min=1, max=LARGEST_TOKENS, unset="the KV cache's, else unlimited", read_by=CONTINUOUS, sweepable=True,
        cli=REPLAY_SWEEP, reference_only=True)
    prefill_gpus: int = setting(
        1, "Disaggregated serving: GPUs of the prefill pool; the rest of the run's GPUs decode", min=1,
        max=LARGEST_GPUS, read_by=DISAGGREGATED, sweepable=True, cli=ALL, reference_only=True)
    kv_link: str = setting(
        "nvlink", "Disaggregated serving: the link a prompt's KV cache crosses from its prefill GPU to its decode "
        "GPU (nvlink 900 GB/s, infiniband 50 GB/s, pcie 64 GB/s)", choices=("nvlink", "infiniband", "pcie"),
        read_by=DISAGGREGATED, sweepable=True, cli=REPLAY_SWEEP, reference_only=True)
    kv_link_gbps: float | None = setting(
        None, "Disaggregated serving: the KV link's bandwidth in GB/s (overrides kv_link's)", min=0, above=True,
        finite=True, noun="a bandwidth in GB/s", unset="kv_link's", read_by=DISAGGREGATED, sweepable=True,
        cli=REPLAY_SWEEP, reference_only=True)
    kv_link_latency: float = setting(
        0.0, "Disaggregated serving: seconds every KV transfer takes besides its bytes", min=0, finite=True,
        noun="a number of seconds", read_by=DISAGGREGATED, sweepable=True, cli=REPLAY_SWEEP, reference_only=True)
    kv_bytes_per_token: int | None = setting(
        None, "Disaggregated serving: KV-cache bytes per token a transfer moves", min=1, max=2**40,
        unset="the profile's kv_cache.bytes_per_token", read_by=DISAGGREGATED, cli=REPLAY_SWEEP,
        reference_only=True)
    sticky_gpu: bool = setting(
        False, "A worker that takes a GPU per batch keeps the GPU of its first batch", read_by=("shared",))
    dispatch_group: str | None = setting(
        None, "A named dispatch group: the tasks of one group share one round-robin rotation over the GPUs "
        "(their round-robin dispatch takes from it; each call's group of a task that takes nothing from it "
        "still advances it)", noun="a group name", unset="none", reference_only=True)
    dispatch_per: str = setting(
        "prompt", "What split sends to a queue: each prompt, or a call's whole group of the task",
        choices=("prompt", "group"), read_by=("split",))
    batch_forming: str = setting(
        "eager", "eager: a free worker forms its batch, then waits for its GPU (a per-GPU lock taken after "
        "dequeuing); gpu-free: it forms one only when its GPU is free", registry=BATCH_FORMING,
        read_by=QUEUED, reference_only=True)
    batch_selection: str = setting(
        "fifo", "Which waiting prompts a released batch takes: fifo, the oldest; similar-length, the oldest and "
        "those closest to it in length (prompt + max tokens), so that fewer rows pad", registry=BATCH_SELECTION,
        read_by=QUEUED, sweepable=True, cli=ALL, reference_only=True)
    length_buckets: int = setting(
        1, "Length buckets: a micro-batch queue per bucket of prompt + max tokens, bounded at the task's length "
        "quantiles in the trace (1: one queue)", min=1, max=LARGEST_LOOKAHEAD, read_by=QUEUED, sweepable=True,
        cli=ALL, reference_only=True)
    bucket_bounds: str | None = setting(
        None, "Length bucket boundaries in prompt + max tokens, e.g. '600,1500' (three queues), instead of "
        "length_buckets' quantiles", grammar=parse_bounds, noun="comma-separated token counts", unset="none",
        read_by=QUEUED, cli=REPLAY, reference_only=True)
    rows_per_prompt: int = setting(
        1, "Rows a prompt occupies in a batch (best-of-n sampling: n)", min=1, max=LARGEST_LOOKAHEAD,
        read_by=BATCHED,
        reference_only=True)
    single_prompt: str = setting(
        "batched", "A batch of one prompt is served batched like any other, or sequential: its rows one "
        "generation after another", choices=("batched", "sequential"), read_by=BATCHED)
    adaptive_lookahead: bool = setting(
        False, "Speculative decoding picks each batch's lookahead from the GPU's recent acceptance history",
        read_by=BATCHED, kinds=SPEC_DECODE, reference_only=True)


@dataclass(frozen=True)
class RunSettings:
    """The system-wide settings of a run (a scenario's ``[run]``): one field per run setting."""

    gpus: int = setting(
        2, "Number of GPUs", min=1, max=LARGEST_GPUS, sweepable=True, cli=REPLAY_SWEEP)
    gpu_sharing: str = setting(
        "exclusive", "How concurrent batches share a GPU", registry=GPU_SHARING, sweepable=True, cli=ALL)
    deadline: float | None = setting(
        None, "Seconds from trace start; prompts not done by then time out", min=0, above=True, finite=True,
        noun="a number of seconds", unset="none", cli=ALL)
    rate_scale: float = setting(
        1.0, "Scale the arrival rate (inter-arrival times / X)", min=0, above=True, finite=True,
        sweepable=True, cli=REPLAY_SWEEP)
    client: str = setting(
        "open", "open (replay arrival times) or closed:N[:THINK] (N calls outstanding, the next sent THINK s "
        "after one ends)", grammar=parse_client, noun="open or closed:N[:THINK]", cli=REPLAY,
        reference_only=True)
    client_timeout: float | None = setting(
        None, "A call not done this many seconds after it was sent failed (the server still serves it)",
        min=0, finite=True, noun="a number of seconds", unset="none")
    cold_start: float = setting(
        0.0, "Nothing is served before this many seconds", min=0, finite=True, noun="a number of seconds")
    host_lock: bool = setting(
        False, "One process (one interpreter lock) drives every GPU: running GPU batches slow down together",
        reference_only=True)
    shared_rotation: tuple[str, ...] = setting(
        (), "Tasks of one dispatch group named shared_rotation (as their dispatch_group, which a task's own "
        "setting overrides)", reference_only=True)
    max_concurrent_groups: int | None = setting(
        None, "A call's task groups run at most this many at a time", min=1, max=LARGEST_TOKENS, unset="unlimited", reference_only=True)
    group_order: tuple[str, ...] = setting(
        (), "The order a call's task groups start in (tasks it does not list keep their order, after)")
    engine: str = setting(
        "auto", "How the run is computed: auto (the compiled kernel where it supports the scenario, once a "
        "process has more than 20,000 prompts to run), "
        "reference (simpy) or fast (the kernel, or an error naming what it lacks); results are identical",
        choices=ENGINES, cli=ALL)
    # -- the replica pool: present when an autoscaler is named (simulator.model.replicas) --
    autoscaler: str | None = setting(
        None, "A replica pool: each replica is a copy of the system above (its gpus, topology and queues), "
        "sized by this autoscaler", registry=AUTOSCALERS, unset="no pool", sweepable=True, cli=ALL,
        reference_only=True)
    min_replicas: int = setting(
        1, "Replicas the pool never goes below (warm at trace start)", min=0, max=LARGEST_GPUS, sweepable=True,
        cli=ALL)
    max_replicas: int | None = setting(
        None, "Replicas the pool never goes above", min=1, max=LARGEST_GPUS, unset="min_replicas",
        sweepable=True, cli=ALL)
    max_inputs: int | None = setting(
        None, "Calls a replica takes at once; more wait in the pool's FCFS queue", min=1, max=LARGEST_TOKENS,
        unset="unlimited", sweepable=True, cli=ALL)
    pool_queue: int | None = setting(
        None, "Calls the pool's queue holds; a call arriving to a full one is rejected", min=0,
        max=LARGEST_TOKENS, unset="unlimited", cli=REPLAY)
    pool_rule: str = setting(
        "least-loaded", "How a call picks among the ready replicas with room", registry=POOL_RULES,
        sweepable=True, cli=ALL)
    replica_cold_start: str = setting(
        "0", "Time from a replica's start to its first call: SECONDS, samples:S1,S2,... (measured, drawn "
        "per start) or load:WEIGHTS_GB:GBPS[:ENGINE_S]", grammar=parse_cold_start,
        noun="SECONDS, samples:S1,... or load:GB:GBPS[:ENGINE_S]", sweepable=True, cli=ALL)
    scale_interval: float | None = setting(
        None, "Seconds between the autoscaler's decisions", min=0, above=True, finite=True,
        noun="a number of seconds", unset="the autoscaler's (serverless 1, hpa 15, knative 2)", sweepable=True,
        cli=ALL)
    target_inputs: float = setting(
        8.0, "Calls in flight per replica the autoscaler aims at (serverless target_inputs, knative target "
        "concurrency, hpa with hpa_metric = inputs)", min=0, above=True, finite=True, sweepable=True, cli=ALL)
    buffer_replicas: int = setting(
        0, "serverless: replicas kept beyond the demand", min=0, max=LARGEST_GPUS, sweepable=True, cli=ALL)
    scaledown_window: float = setting(
        600.0, "serverless: seconds a replica stays idle before it is stopped", min=0, finite=True,
        noun="a number of seconds", sweepable=True, cli=ALL)
    hpa_metric: str = setting(
        "inputs", "hpa: the metric, calls in flight per replica (inputs, aiming at target_inputs) or GPU "
        "utilisation over the last interval (utilization, aiming at target_utilization)",
        choices=("inputs", "utilization"), sweepable=True, cli=ALL)
    target_utilization: float = setting(
        0.7, "hpa: target GPU utilisation of a replica", min=0, max=1, above=True, sweepable=True, cli=ALL)
    stabilization_up: float = setting(
        0.0, "hpa: scale up to the lowest recommendation of this many seconds", min=0, finite=True,
        noun="a number of seconds", sweepable=True, cli=ALL)
    stabilization_down: float = setting(
        300.0, "hpa: scale down to the highest recommendation of this many seconds", min=0, finite=True,
        noun="a number of seconds", sweepable=True, cli=ALL)
    max_step: int | None = setting(
        None, "hpa: replicas added or removed per decision at most", min=1, max=LARGEST_GPUS, unset="unlimited",
        sweepable=True, cli=ALL)
    stable_window: float = setting(
        60.0, "knative: seconds of in-flight calls averaged in stable mode", min=0, above=True, finite=True,
        noun="a number of seconds", sweepable=True, cli=ALL)
    panic_window: float = setting(
        6.0, "knative: seconds averaged in panic mode", min=0, above=True, finite=True,
        noun="a number of seconds", sweepable=True, cli=ALL)
    panic_threshold: float = setting(
        2.0, "knative: panic when the panic window's demand reaches this many times the ready replicas",
        min=1, finite=True, sweepable=True, cli=ALL)


def _declared(cls: type, scope: str) -> dict[str, Setting]:
    """The settings of ``cls``'s fields, completed from each field's name, type and default."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Setting] = {}
    for f in fields(cls):
        spec = f.metadata.get("setting")
        if spec is None:
            continue
        hint = hints[f.name]
        args = typing.get_args(hint)
        optional = isinstance(hint, types.UnionType) and type(None) in args
        base = next(a for a in args if a is not type(None)) if optional else hint
        out[f.name] = replace(spec, name=f.name, scope=scope, value_type=typing.get_origin(base) or base,
                              optional=optional, default=f.default)
    return out


#: Task settings and run settings by name, in declaration order.
TASK: dict[str, Setting] = _declared(TaskConfig, "task")
RUN: dict[str, Setting] = _declared(RunSettings, "run")
SETTINGS: tuple[Setting, ...] = (*TASK.values(), *RUN.values())
#: The settings a sweep may vary, task settings first (the order of a results file's columns).
AXES: tuple[str, ...] = tuple(s.name for s in SETTINGS if s.sweepable)
TASK_AXES: tuple[str, ...] = tuple(a for a in AXES if a in TASK)
RUN_AXES: tuple[str, ...] = tuple(a for a in AXES if a in RUN)
SCOPES: dict[str, dict[str, Setting]] = {"task": TASK, "run": RUN}


def check_values(scope: str, values: Mapping[str, Any], where: str | None, record: str | None) -> dict[str, Any]:
    """Check ``values`` (setting name -> value) of one scope (``task`` or ``run``); the values
    as the settings hold them. :class:`ScenarioError` names ``where``, ``record`` and the
    setting at fault (an unknown name lists the valid ones)."""
    known = SCOPES[scope]
    out: dict[str, Any] = {}
    for key, value in values.items():
        spec = known.get(key)
        if spec is None:
            other = "run" if scope == "task" else "task"
            hint = (f"'{key}' is a {other} setting" if key in SCOPES[other]
                    else f"valid: {', '.join(sorted(known))}")
            raise ScenarioError(where, record, key, f"unknown setting; {hint}")
        out[key] = spec.check(value, where, record)
    return out


def service_overrides() -> tuple[str, ...]:
    """The task settings that override a speculative-decoding service model's own values
    (those read by ``spec_decode`` profiles only and set on its ``with_overrides``)."""
    return tuple(s.name for s in TASK.values() if s.kinds == SPEC_DECODE and s.name != "adaptive_lookahead")


def ignored_by(topology: str) -> frozenset[str]:
    """The task settings ``topology`` never reads: a sweep or plan does not expand them for it
    (their values could not change a result), and the run's header does not print them. Empty
    for a name that is not a registered topology."""
    if topology not in registry(TOPOLOGIES):
        return frozenset()
    return frozenset(s.name for s in TASK.values() if not s.reads(topology))


def for_command(command: str) -> list[Setting]:
    """The settings ``command`` takes as flags, in declaration order."""
    return [s for s in SETTINGS if command in s.cli]


def reference_table() -> str:
    """The scenario reference: a Markdown table of every setting (docs/model.md holds it)."""
    rows = ["| setting | scope | value | default | read by | sweep | flag | what it sets |",
            "|---|---|---|---|---|---|---|---|"]
    for s in SETTINGS:
        value = ", ".join(f"`{n}`" for n in s.names()) or s.expected().removeprefix("an ").removeprefix("a ")
        if s.registry:
            value = f"{registry(s.registry).what}: {value}"
        flag = f"`{s.flag}` ({', '.join(s.cli)})" if s.cli else ""
        rows.append(f"| `{s.name}` | {s.scope} | {value} | {s.default_text()} | {s.readers()} | "
                    f"{'yes' if s.sweepable else ''} | {flag} | {s.help} |")
    return "\n".join(rows) + "\n"


__all__ = [
    "AXES",
    "ENGINES",
    "RUN",
    "RUN_AXES",
    "SETTINGS",
    "TASK",
    "TASK_AXES",
    "ClosedLoop",
    "ColdStart",
    "RunSettings",
    "Setting",
    "TaskConfig",
    "check_values",
    "for_command",
    "ignored_by",
    "parse_bounds",
    "parse_client",
    "parse_cold_start",
    "reference_table",
    "registry",
    "setting",
]
