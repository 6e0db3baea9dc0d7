"""Batch forming: when a worker forms a batch, what the batch is, and its service time.

When: a queue asks its task's forming rule (``batch_forming``, :data:`BATCH_FORMING`) which
idle worker forms the next batch: ``eager``, the longest idle (it then waits for its GPU, a
per-GPU lock taken after dequeuing); ``gpu-free``, the longest idle one whose GPU is free,
none while every one's GPU is busy (the queue polls again when one frees).

What: a queue (or a ``direct`` front) releases prompt ids to a worker; :class:`BatchFormer`
turns them into a :class:`~simulator.model.resources.Batch`:

1. its rows, by the task's :class:`Shaping` (the batch-shaping hook): a prompt takes
   ``rows_per_prompt`` rows (best-of-n), and a lone prompt with ``single_prompt =
   "sequential"`` runs its rows as that many one-row generations, one after another;
2. the task's service model (the profile's, with the scenario's speculative-decoding
   overrides applied, :func:`~simulator.model.rules.service.task_service`), wrapped per batch by
   :class:`AdaptiveLookahead` where the task sets ``adaptive_lookahead``;
3. its service time, drawn from the task's own stream, and what follows from it: the
   batch's host fraction, its first token's offset, its tokens.

Draws happen in formation order, one per generation (so a sequential lone prompt of n rows
draws n times); a task's stream is its own, so one task's setup never reshuffles another's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar, cast

import numpy as np

from simulator.model.prompts import PromptTable
from simulator.model.resources import Batch, Device
from simulator.model.rules.service import TaskServices
from simulator.profile import TaskProfile
from simulator.profile.iteration import StepCost, first_token_seconds
from simulator.profile.kinds import BatchShape, ServiceModel, TaskDefaults
from simulator.profile.kinds.spec_decode import SpecDecodeService, adaptive_lookahead
from simulator.registry import Registry
from simulator.scenario import Scenario, TaskConfig

__all__ = ["BATCH_FORMING", "AdaptiveLookahead", "BatchFormer", "FormingRule", "RecordedAcceptance", "Shaping",
           "WhenGpuFree"]


class _Placed(Protocol):
    device: Device | None


W = TypeVar("W", bound=_Placed)


class FormingRule:
    """When an idle worker forms its batch (the ``batch_forming`` setting): ``eager``, at
    once (the longest idle worker)."""

    #: whether a queue polls again whenever one of its workers' devices finishes a batch
    watches_devices: ClassVar[bool] = False

    def worker(self, idle: Sequence[W]) -> W | None:
        """Which of the ``idle`` workers (longest idle first) forms the next batch now;
        ``None``: none may yet."""
        return idle[0]


BATCH_FORMING: Registry[type[FormingRule]] = Registry("batch forming rule")
BATCH_FORMING.register("eager")(FormingRule)


@BATCH_FORMING.register("gpu-free")
class WhenGpuFree(FormingRule):
    """Only a worker whose GPU is free forms a batch (a worker without a GPU of its own
    always may); the GPU's watcher polls the queue again when it frees."""

    watches_devices = True

    def worker(self, idle: Sequence[W]) -> W | None:
        for w in idle:
            if w.device is None or w.device.is_free():
                return w
        return None


@dataclass(frozen=True)
class Shaping:
    """How a batch of prompts becomes rows and generations (the batch-shaping hook).

    ``rows_per_prompt`` rows per prompt (best-of-n sampling: n); with ``sequential_single``
    a batch of one prompt runs its rows one generation after another instead of batched.
    """

    rows_per_prompt: int = 1
    sequential_single: bool = False

    @classmethod
    def of(cls, config: TaskConfig) -> Shaping:
        return cls(config.rows_per_prompt, config.single_prompt == "sequential")

    def shape(self, prompt_tokens: list[int], max_tokens: list[int], ids: list[int]) -> tuple[BatchShape, int]:
        """The shape of one generation of the batch of ``ids``, and how many such
        generations run one after another."""
        n = self.rows_per_prompt
        rows = tuple(m for m in map(max_tokens.__getitem__, ids) for _ in range(n))
        longest_prompt = max(map(prompt_tokens.__getitem__, ids))
        if len(ids) == 1 and n > 1 and self.sequential_single:
            return BatchShape(1, longest_prompt, rows[0], rows[:1]), n
        return BatchShape(len(rows), longest_prompt, max(rows), rows), 1


class AdaptiveLookahead:
    """A service-model decorator: a speculative-decoding service whose lookahead is picked,
    per batch, from the recent acceptance rates of its device's rows
    (:func:`~simulator.profile.kinds.spec_decode.adaptive_lookahead`), and whose draws add
    their rows' rates to that history (the last 100 rows per device)."""

    HISTORY = 100

    def __init__(self, service: SpecDecodeService) -> None:
        self.service = service
        self._history: dict[int, deque] = {}

    def for_batch(self, device: Device | None) -> ServiceModel:
        """The service a batch on ``device`` runs with: the lookahead its device's history
        picks now, every draw recorded."""
        history = self._history.setdefault(-1 if device is None else device.gpu_id, deque(maxlen=self.HISTORY))
        k = adaptive_lookahead(self.service.lookahead, sum(history) / len(history) if history else None)
        return RecordedAcceptance(self.service.with_overrides(lookahead=k), history)


class RecordedAcceptance:
    """``service`` (one that ``draws_acceptance``) whose every draw adds its rows' draft
    acceptance rates to ``history``; everything else is the service's own."""

    draws_acceptance: ClassVar[bool] = True

    def __init__(self, service: SpecDecodeService, history: deque) -> None:
        self.service = service
        self.history = history
        self.kind = service.kind

    def sample(self, shape: BatchShape, rng: np.random.Generator) -> float:
        work, rates = self.service.sample_detail(shape, rng)
        self.history.extend(rates.tolist())
        return work

    def mean(self, shape: BatchShape) -> float:
        return self.service.mean(shape)

    def variance(self, shape: BatchShape) -> float:
        return self.service.variance(shape)

    def host_fraction(self, shape: BatchShape) -> float | None:
        return self.service.host_fraction(shape)

    def step_cost(self, task_profile: TaskDefaults) -> StepCost:
        return self.service.step_cost(task_profile)

    def first_token_seconds(self, task_profile: TaskDefaults, shape: BatchShape, work: float) -> float:
        return self.service.first_token_seconds(task_profile, shape, work)

    def to_dict(self) -> dict[str, Any]:
        return self.service.to_dict()


class BatchFormer:
    """Forms every batch of one run (module docstring) and keeps the run's batch table.

    It reads the run's per-prompt token columns, writes each prompt's batch into the
    table's ``batch_of``, appends each batch to ``batches`` and numbers batches from the
    run's own counter."""

    def __init__(self, scenario: Scenario, task_profiles: Mapping[str, TaskProfile],
                 configs: Mapping[str, TaskConfig], table: PromptTable, batches: list[Batch],
                 service_rng: Callable[[str], np.random.Generator], new_batch_id: Callable[[], int],
                 clock: Callable[[], float]) -> None:
        self.task_profiles = task_profiles
        self.services = TaskServices(scenario, task_profiles)
        self.configs = configs
        self.table = table
        self.batches = batches
        self.service_rng = service_rng
        self.new_batch_id = new_batch_id
        self.clock = clock
        self._adaptive: dict[str, AdaptiveLookahead] = {}
        self._shaping: dict[str, Shaping] = {}

    def service_of(self, task: str) -> ServiceModel:
        """The task's service model (:func:`~simulator.model.rules.service.task_service`), made once per run."""
        return self.services.of(task)

    def resumed(self, task: str, queue: str, ids: list[int], worker: int, work: float) -> Batch:
        """A batch of ``ids`` that was running before the run began, with ``work`` seconds
        of service left (:mod:`simulator.model.start`): nothing is drawn; its first token
        is taken as already out (its prefill ran before the run)."""
        return self._record(task, queue, ids, worker, work, self.task_profiles[task].host_fraction, 0.0)

    def _record(self, task: str, queue: str, ids: list[int], worker: int, work: float, host_fraction: float,
                first_token_work: float) -> Batch:
        """A new batch of ``ids`` formed now, entered in the run's batch table."""
        table = self.table
        batch = Batch(self.new_batch_id(), task, queue, ids, worker, self.clock(), work)
        batch.priority = self.configs[task].priority
        batch.host_fraction = host_fraction
        batch.tokens = sum(table.prompt_tokens[i] + table.max_tokens[i] for i in ids)
        batch.first_token_work = first_token_work
        self.batches.append(batch)
        batch_of = table.batch_of
        for i in ids:
            batch_of[i] = batch.id
        return batch

    def form(self, task: str, queue: str, ids: list[int], worker: int, device: Device | None = None) -> Batch:
        """Make a batch of ``ids`` now, for ``device`` where it is known, and draw its service time."""
        cfg = self.configs[task]
        shaping = self._shaping.get(task)
        if shaping is None:
            shaping = self._shaping[task] = Shaping.of(cfg)
        table = self.table
        ptoks, mtoks = table.prompt_tokens, table.max_tokens
        shape, generations = shaping.shape(ptoks, mtoks, ids)
        service = self.service_of(task)
        if cfg.adaptive_lookahead and service.draws_acceptance:
            adaptive = self._adaptive.get(task)
            if adaptive is None:
                adaptive = self._adaptive[task] = AdaptiveLookahead(cast(SpecDecodeService, service))
            service = adaptive.for_batch(device)
        rng = self.service_rng(task)
        if generations == 1:
            work = service.sample(shape, rng)
        else:
            work = float(sum([service.sample(shape, rng) for _ in range(generations)]))
        task_profile = self.task_profiles[task]
        # an engine block computes the batch's own share of host time; else the task's figure
        computed = service.host_fraction(shape)
        return self._record(task, queue, ids, worker, work,
                            task_profile.host_fraction if computed is None else computed,
                            first_token_seconds(task_profile, service, shape, work))
