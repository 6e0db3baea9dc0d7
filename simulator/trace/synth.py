"""Synthetic traces generated from stated statistics.

A :class:`SynthSpec` states the arrival process (inter-arrival distribution with a mean
and a coefficient of variation), the distribution of prompts per call, the task mix and
per-task token-length distributions; :func:`synthesize` draws a :class:`Trace` from it.

Randomness: one ``numpy.random.default_rng(seed)`` per trace, spawned into four named
child streams, in this fixed order: ``arrivals``, ``sizes``, ``tasks``, ``tokens``. Each
part of the trace draws only from its own stream, so changing the task mix does not move
any arrival, and changing the arrival process does not change which sizes the calls get
(sizes are drawn per call in order: a longer trace keeps the earlier calls' sizes).
The same spec and seed always give the same trace.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simulator.errors import SynthSpecError
from simulator.settings import LARGEST_TOKENS
from simulator.trace.model import Call, Prompt, Trace

ARRIVAL_KINDS = ("poisson", "gamma", "lognormal", "weibull")
#: Gaps are drawn in blocks of this many, so a longer duration extends a trace without
#: changing its earlier arrivals.
_GAP_BLOCK = 256
#: The most calls a synthetic trace may be expected to hold (``duration / mean``): beyond,
#: drawing it would exhaust memory (the cap of ServeGen imports too).
MAX_SYNTH_CALLS = 50_000_000
#: The largest inter-arrival CV: beyond, gamma and Weibull gaps underflow to 0 and the
#: arrival clock stops advancing (a shape of 1/CV² = 0.01, ServeGen's smallest window shape).
MAX_CV = 10.0


def _bad(field_name: str, message: str) -> SynthSpecError:
    return SynthSpecError(None, None, field_name, message)


def _positive(field_name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise _bad(field_name, f"must be a positive number, got {value!r}")
    return float(value)


def weibull_shape(cv: float) -> float:
    """The Weibull shape k with coefficient of variation ``cv`` (solved by brentq)."""
    from scipy.optimize import brentq

    def gap(log_k: float) -> float:
        k = math.exp(log_k)
        return math.exp(math.lgamma(1 + 2 / k) - 2 * math.lgamma(1 + 1 / k)) - 1 - cv * cv

    return math.exp(brentq(gap, math.log(0.05), math.log(200.0)))


@dataclass(frozen=True)
class InterArrival:
    """Inter-arrival times with mean ``mean`` (s) and coefficient of variation ``cv``.

    * ``poisson``: exponential gaps (a Poisson process); ``cv`` is always 1.
    * ``gamma``: shape ``1 / cv**2``, scale ``mean * cv**2`` (``cv < 1`` is more regular
      than Poisson, ``cv > 1`` burstier).
    * ``lognormal``: ``sigma**2 = ln(1 + cv**2)``, ``mu = ln(mean) - sigma**2 / 2``.
    * ``weibull``: the shape k whose CV is ``cv`` (Γ(1+2/k)/Γ(1+1/k)² = 1 + cv²), scale
      ``mean / Γ(1 + 1/k)``.
    """

    kind: str
    mean: float
    cv: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in ARRIVAL_KINDS:
            raise _bad("arrival", f"unknown arrival process {self.kind!r} (expected one of {', '.join(ARRIVAL_KINDS)})")
        object.__setattr__(self, "mean", _positive("mean", self.mean))
        object.__setattr__(self, "cv", 1.0 if self.kind == "poisson" else _positive("cv", self.cv))
        if self.cv > MAX_CV:
            raise _bad("cv", f"must be at most {MAX_CV:g} (burstier gaps underflow to 0), got {self.cv:g}")

    @property
    def variance(self) -> float:
        """Variance of one gap, ``(mean * cv)**2``."""
        return (self.mean * self.cv) ** 2

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` independent gaps (seconds) drawn from ``rng``."""
        if self.kind == "poisson":
            return rng.exponential(self.mean, size)
        if self.kind == "gamma":
            shape = 1.0 / self.cv**2
            return rng.gamma(shape, self.mean / shape, size)
        if self.kind == "weibull":
            k = weibull_shape(self.cv)
            return rng.weibull(k, size) * self.mean / math.gamma(1 + 1 / k)
        sigma2 = math.log1p(self.cv**2)
        return rng.lognormal(math.log(self.mean) - sigma2 / 2, math.sqrt(sigma2), size)


@dataclass(frozen=True)
class TokenDist:
    """A token-count distribution: fixed (``cv == 0``, ``mean`` an integer) or lognormal.

    Lognormal draws (mean ``mean``, coefficient of variation ``cv``) are rounded to the
    nearest integer, raised to at least 1 and held to at most ``LARGEST_TOKENS`` (a trace's
    token counts are 32-bit integers); a mean above that is refused.
    """

    mean: float
    cv: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.mean, bool) and isinstance(self.mean, (int, float)) and self.mean > LARGEST_TOKENS:
            raise _bad("tokens", f"must be at most {LARGEST_TOKENS:,} tokens (a trace's token counts are "
                       "32-bit integers)")
        mean = _positive("tokens", self.mean)
        if isinstance(self.cv, bool) or not isinstance(self.cv, (int, float)) or not math.isfinite(self.cv) or self.cv < 0:
            raise _bad("tokens", f"cv must be a non-negative number, got {self.cv!r}")
        if self.cv == 0 and (not mean.is_integer()):
            raise _bad("tokens", f"a fixed token count must be an integer, got {self.mean!r}")
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "cv", float(self.cv))

    @classmethod
    def fixed(cls, tokens: int) -> TokenDist:
        """Always ``tokens``."""
        return cls(tokens, 0.0)

    @classmethod
    def lognormal(cls, mean: float, cv: float) -> TokenDist:
        """Lognormal with mean ``mean`` and coefficient of variation ``cv`` (rounded, >= 1)."""
        return cls(mean, cv)

    @property
    def variance(self) -> float:
        """Variance before rounding, ``(mean * cv)**2``."""
        return (self.mean * self.cv) ** 2

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` token counts (``int64``) drawn from ``rng`` (no draw when fixed)."""
        if self.cv == 0:
            return np.full(size, int(self.mean), dtype=np.int64)
        sigma2 = math.log1p(self.cv**2)
        draws = rng.lognormal(math.log(self.mean) - sigma2 / 2, math.sqrt(sigma2), size)
        return np.clip(np.rint(draws), 1, LARGEST_TOKENS).astype(np.int64)

    def to_dict(self) -> dict[str, Any]:
        """``{"fixed": n}`` or ``{"lognormal": {"mean": m, "cv": c}}``."""
        if self.cv == 0:
            return {"fixed": int(self.mean)}
        return {"lognormal": {"mean": self.mean, "cv": self.cv}}


#: The production mix of the users' workload.
PRODUCTION_TASK_MIX = {"graph": 0.34, "mmlu": 0.36, "infobench": 0.30}
#: Prompts per call in production: 1 → 25 %, 2 → 20 %, 3 → 30 %, 4–8 → 25 % (5 % each).
PRODUCTION_PROMPTS_PER_CALL = {1: 0.25, 2: 0.20, 3: 0.30, 4: 0.05, 5: 0.05, 6: 0.05, 7: 0.05, 8: 0.05}
#: Prompt lengths (estimated tokens, :func:`~simulator.trace.classify.estimate_tokens`)
#: measured on the users' 300-prompt ``batch_arrivals.json``: mean and CV per task.
DEFAULT_PROMPT_TOKENS: dict[str, TokenDist] = {
    "graph": TokenDist.lognormal(460, 0.55),
    "mmlu": TokenDist.lognormal(195, 0.42),
    "infobench": TokenDist.lognormal(85, 0.9),
    "*": TokenDist.lognormal(256, 0.5),
}
#: Every task's max tokens: the 2048 the users' client sends.
DEFAULT_MAX_TOKENS: dict[str, TokenDist] = {"*": TokenDist.fixed(2048)}


def _probabilities(field_name: str, probs: Mapping[Any, Any]) -> None:
    if not probs:
        raise _bad(field_name, "needs at least one entry")
    total = 0.0
    for key, p in probs.items():
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) or p < 0:
            raise _bad(field_name, f"probability of {key!r} must be a number >= 0, got {p!r}")
        total += p
    if abs(total - 1.0) > 1e-6:
        raise _bad(field_name, f"probabilities sum to {total:.6g}, not 1 (within 1e-6)")


@dataclass(frozen=True)
class SynthSpec:
    """What a synthetic trace looks like. Validated on construction (:class:`SynthSpecError`).

    * ``duration``: seconds; calls arrive in ``(0, duration]``, the first after one gap.
    * ``arrival``, ``mean``, ``cv``: the inter-arrival process, see :class:`InterArrival`
      (``poisson`` ignores ``cv``: it is 1).
    * ``prompts_per_call``: ``{size: probability}``, sizes integers >= 1.
    * ``task_mix``: ``{task: probability}``; each prompt's task is drawn independently.
    * ``prompt_tokens`` / ``max_tokens``: ``{task: TokenDist}``; a task not listed uses the
      ``"*"`` entry, else the defaults (:data:`DEFAULT_PROMPT_TOKENS`,
      :data:`DEFAULT_MAX_TOKENS`).

    Probabilities must be ``>= 0`` and sum to 1 within 1e-6.
    """

    duration: float
    arrival: str = "poisson"
    mean: float = 10.0
    cv: float = 1.0
    prompts_per_call: Mapping[int, float] = field(default_factory=lambda: dict(PRODUCTION_PROMPTS_PER_CALL))
    task_mix: Mapping[str, float] = field(default_factory=lambda: dict(PRODUCTION_TASK_MIX))
    prompt_tokens: Mapping[str, TokenDist] = field(default_factory=dict)
    max_tokens: Mapping[str, TokenDist] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "duration", _positive("duration", self.duration))
        process = InterArrival(self.arrival, self.mean, self.cv)
        object.__setattr__(self, "mean", process.mean)
        object.__setattr__(self, "cv", process.cv)
        if self.duration / process.mean > MAX_SYNTH_CALLS:
            raise _bad("duration", f"{self.duration:g} s at a mean gap of {process.mean:g} s is "
                       f"{self.duration / process.mean:.3g} calls; at most {MAX_SYNTH_CALLS:,} fit in memory")

        for size in self.prompts_per_call:
            if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
                raise _bad("prompts_per_call", f"sizes must be integers >= 1, got {size!r}")
        _probabilities("prompts_per_call", self.prompts_per_call)
        object.__setattr__(self, "prompts_per_call",
                           {int(k): float(v) for k, v in sorted(self.prompts_per_call.items())})

        for task in self.task_mix:
            if not isinstance(task, str) or not task.strip():
                raise _bad("task_mix", f"task names must be non-empty strings, got {task!r}")
        _probabilities("task_mix", self.task_mix)
        object.__setattr__(self, "task_mix", {k: float(v) for k, v in self.task_mix.items()})

        for name in ("prompt_tokens", "max_tokens"):
            dists = dict(getattr(self, name))
            for task, dist in dists.items():
                if not isinstance(dist, TokenDist):
                    raise _bad(name, f"the distribution of {task!r} must be a TokenDist, got {dist!r}")
            object.__setattr__(self, name, dists)

    @property
    def inter_arrival(self) -> InterArrival:
        """The inter-arrival distribution."""
        return InterArrival(self.arrival, self.mean, self.cv)

    def token_dist(self, kind: str, task: str) -> TokenDist:
        """The ``kind`` (``"prompt_tokens"`` or ``"max_tokens"``) distribution of ``task``."""
        given: Mapping[str, TokenDist] = getattr(self, kind)
        default = DEFAULT_PROMPT_TOKENS if kind == "prompt_tokens" else DEFAULT_MAX_TOKENS
        for table in (given, default):
            if task in table:
                return table[task]
            if "*" in table and table is given:
                return table["*"]
        return default["*"]

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON-able dicts, with every task's resolved token distributions."""
        return {
            "duration": self.duration,
            "arrival": self.arrival,
            "mean": self.mean,
            "cv": self.cv,
            "prompts_per_call": {str(k): v for k, v in self.prompts_per_call.items()},
            "task_mix": dict(self.task_mix),
            "prompt_tokens": {t: self.token_dist("prompt_tokens", t).to_dict() for t in self.task_mix},
            "max_tokens": {t: self.token_dist("max_tokens", t).to_dict() for t in self.task_mix},
        }


def _arrival_times(process: InterArrival, duration: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival instants in ``(0, duration]``: cumulative sums of gaps drawn block by block."""
    blocks = []
    now = 0.0
    while now <= duration:
        gaps = process.sample(rng, _GAP_BLOCK)
        times = now + np.cumsum(gaps)
        blocks.append(times)
        now = float(times[-1])
    times = np.concatenate(blocks)
    return times[times <= duration]


def synthesize(spec: SynthSpec, seed: int) -> Trace:
    """A trace drawn from ``spec`` with random seed ``seed`` (an integer >= 0).

    Calls get ids ``"0"``, ``"1"``, ... and times rounded to microseconds; prompts get a
    task, ``prompt_tokens`` and ``max_tokens`` and no text. ``meta`` holds
    ``{"synthetic": True, "seed": seed, "spec": spec.to_dict()}``. Raises
    :class:`SynthSpecError` for a bad seed or when no call arrives within the duration.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise _bad("seed", f"must be an integer >= 0, got {seed!r}")
    arrivals_rng, sizes_rng, tasks_rng, tokens_rng = np.random.default_rng(int(seed)).spawn(4)

    times = np.round(_arrival_times(spec.inter_arrival, spec.duration, arrivals_rng), 6)
    if times.size == 0:
        raise _bad("duration", f"no call arrives within {spec.duration:g} s; make the duration longer")

    size_values = np.array(list(spec.prompts_per_call), dtype=np.int64)
    size_p = np.array(list(spec.prompts_per_call.values()))
    sizes = sizes_rng.choice(size_values, size=times.size, p=size_p / size_p.sum())

    tasks = list(spec.task_mix)
    task_p = np.array(list(spec.task_mix.values()))
    task_index = tasks_rng.choice(len(tasks), size=int(sizes.sum()), p=task_p / task_p.sum())

    prompt_tokens = np.zeros(task_index.size, dtype=np.int64)
    max_tokens = np.zeros(task_index.size, dtype=np.int64)
    for k, task in enumerate(tasks):
        where = np.flatnonzero(task_index == k)
        prompt_tokens[where] = spec.token_dist("prompt_tokens", task).sample(tokens_rng, where.size)
        max_tokens[where] = spec.token_dist("max_tokens", task).sample(tokens_rng, where.size)

    calls = []
    start = 0
    for n, (t, size) in enumerate(zip(times.tolist(), sizes.tolist(), strict=True)):
        prompts = tuple(
            Prompt(tasks[task_index[j]], int(prompt_tokens[j]), int(max_tokens[j]))
            for j in range(start, start + size)
        )
        calls.append(Call(str(n), float(t), prompts))
        start += size
    meta = {"synthetic": True, "seed": int(seed), "spec": spec.to_dict()}
    return Trace(calls=tuple(calls), meta=meta)


# -- the textual forms the CLI accepts ------------------------------------------------

def _entries(field_name: str, text: str) -> list[list[str]]:
    entries = [e.strip() for e in text.split(",")]
    if not text.strip() or any(not e for e in entries):
        raise _bad(field_name, f"expected comma-separated entries, got {text!r}")
    return [[part.strip() for part in e.split(":")] for e in entries]


def _number(field_name: str, text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _bad(field_name, f"{what} must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise _bad(field_name, f"{what} must be finite, got {text!r}")
    if value < 0:
        raise _bad(field_name, f"{what} must not be negative, got {text!r}")
    return value


def _size(field_name: str, text: str) -> int:
    if not text.isdecimal() or int(text) < 1:
        raise _bad(field_name, f"sizes must be integers >= 1, got {text!r}")
    return int(text)


def parse_prompts_per_call(text: str) -> dict[int, float]:
    """``"1:0.25,2:0.2,3:0.3,4-8:0.25"`` → ``{size: probability}``.

    A range ``a-b`` spreads its probability uniformly over the sizes ``a..b``. A size given
    twice (also through overlapping ranges) is an error. Raises :class:`SynthSpecError`
    (field ``prompts_per_call``).
    """
    name = "prompts_per_call"
    out: dict[int, float] = {}
    for parts in _entries(name, text):
        if len(parts) != 2:
            raise _bad(name, f"expected SIZE:PROBABILITY or LOW-HIGH:PROBABILITY, got {':'.join(parts)!r}")
        key, p = parts[0], _number(name, parts[1], "a probability")
        low_text, _, high_text = key.partition("-")
        low = _size(name, low_text.strip())
        high = _size(name, high_text.strip()) if high_text else low
        if high < low:
            raise _bad(name, f"range {key!r} is empty (low > high)")
        for size in range(low, high + 1):
            if size in out:
                raise _bad(name, f"size {size} is given twice")
            out[size] = p / (high - low + 1)
    _probabilities(name, out)
    return out


def parse_task_mix(text: str) -> dict[str, float]:
    """``"graph:0.34,mmlu:0.36,infobench:0.3"`` → ``{task: probability}``.

    Raises :class:`SynthSpecError` (field ``task_mix``).
    """
    name = "task_mix"
    out: dict[str, float] = {}
    for parts in _entries(name, text):
        if len(parts) != 2 or not parts[0]:
            raise _bad(name, f"expected TASK:PROBABILITY, got {':'.join(parts)!r}")
        if parts[0] in out:
            raise _bad(name, f"task {parts[0]!r} is given twice")
        out[parts[0]] = _number(name, parts[1], "a probability")
    _probabilities(name, out)
    return out


def parse_token_dists(text: str, field_name: str = "prompt_tokens") -> dict[str, TokenDist]:
    """``"infobench:300:0.5,graph:700,*:256:0.5"`` → ``{task: TokenDist}``.

    Each entry is ``TASK:MEAN`` (fixed count) or ``TASK:MEAN:CV`` (lognormal); ``*``, or an
    entry without a task (``"2048"``, ``"300:0.5"``), sets every task not listed.
    Raises :class:`SynthSpecError` (field ``field_name``).
    """
    out: dict[str, TokenDist] = {}
    for parts in _entries(field_name, text):
        try:
            float(parts[0])
            parts = ["*", *parts]
        except ValueError:
            pass
        if len(parts) not in (2, 3) or not parts[0]:
            raise _bad(field_name, f"expected TASK:MEAN or TASK:MEAN:CV, got {':'.join(parts)!r}")
        task = parts[0]
        if task in out:
            raise _bad(field_name, f"task {task!r} is given twice")
        mean = _number(field_name, parts[1], "a mean")
        cv = _number(field_name, parts[2], "a cv") if len(parts) == 3 else 0.0
        try:
            out[task] = TokenDist(mean, cv)
        except SynthSpecError as exc:
            raise _bad(field_name, f"{task}: {exc.message}") from None
    return out
