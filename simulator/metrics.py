"""Summary figures: pure functions of the per-prompt event log.

Nothing here is accumulated during a run; everything is computed from the log, with the
formula in each docstring. The summary JSON has this one producer.

Definitions (deadline D, if given; otherwise D = ∞):

* a prompt was *served* unless its status says it was ``rejected`` (full queue) or
  ``dropped`` (queue timeout); a served prompt *completed* if ``done_at ≤ D``, otherwise
  it *timed out*; ``sent_after_timeout`` counts served prompts that outwaited their queue
  timeout;
* a call's latency is ``max(done_at) − arrived_at`` over its prompts, and it completed if
  all its prompts did;
* ``makespan_s = max(done_at) − min(arrived_at)`` over served prompts: the span of the run;
* throughput = completed prompts / makespan;
* a GPU's busy time is the length of the union of the [started_at, done_at) intervals of
  the prompts it served (a static batch's prompts share one interval; a continuous engine
  iterates exactly while it holds a prompt), so processor-shared work is not counted
  twice; utilisation = busy / makespan; ``gpu_seconds`` sums busy time over GPUs;
  ``mean_concurrency`` = prompt-seconds on the GPU / busy time (time-average rows served);
* TTFT and TPOT as in :func:`simulator.events.with_durations`;
* ``tokens``: the per-request token timings and throughputs that vLLM bench, GuideLLM and
  AIPerf report, in their units (:func:`token_figures`, defined there): TTFT, ITL, TPOT and
  end-to-end latency in milliseconds with the chosen percentiles, output and total tokens
  per second over the run's span, and with a goodput SLO the requests per second meeting it;
* ``padding``: padding waste of static batches, Σ(padded − actual) / Σ padded tokens and
  the mean per-batch waste, with padded = batch size × (longest prompt + longest max
  tokens) and actual = Σ (prompt + max tokens) per batch (:mod:`simulator.padding`;
  continuous batching pads nothing: waste 0);
* with a replica pool, the figures of :func:`replica_figures` under ``replicas``.

Latency, TTFT and call-latency statistics count every prompt (call) that did not complete
(timed out at the deadline, rejected, dropped, or, for calls, failed at the client timeout)
as infinitely late, the way observed runs censor failed calls: percentiles over completed
prompts alone would reward not finishing. So ``p95`` is ``+inf`` as soon as more than 5 %
did not finish, and a latency SLO is then missed. ``unfinished`` counts those prompts
(``prompts − completed``). In JSON (:func:`json_ready`) an infinite statistic is ``null``.
Wait, service and TPOT statistics describe completed prompts. ``call_latency`` of a task is
over the calls that contain that task.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator import summary_layout as sl
from simulator.errors import FigureError
from simulator.events import LogColumns
from simulator.memo import Memo
from simulator.model.compiled import summary_pass
from simulator.padding import batch_work, continuous_of, engine_of, padding_totals
from simulator.scenario import Compositions

if TYPE_CHECKING:
    import pandas as pd

STAT_KEYS = ("mean", "p50", "p90", "p95", "p99", "max")


#: Rows per block where a figure's arithmetic is done in blocks (bounded temporaries).
_BLOCK = 1 << 18

#: Stand-in for +inf inside the percentile arithmetic (see :func:`describe`).
_UNFINISHED = 1e300


#: Up to this many values, percentiles are read off one full sort in Python arithmetic (a
#: sweep's runs are small, and numpy's per-call overhead is most of their summary); above
#: it, off the order statistics that :func:`_order_statistics` places.
_SMALL = 4096


def percentiles(x: np.ndarray, q: Sequence[float], scratch: bool = False) -> list[float]:
    """``np.percentile(x, q)`` (linear interpolation; ``q`` in (0, 100]) as floats, bit for
    bit without calling it: the same order statistics (a sort gives those a partition
    gives), the same virtual index ``(n − 1) × q/100`` and the same interpolation (numpy's
    ``_lerp``: ``a + (b − a)·t``, or ``b − (b − a)·(1 − t)`` where ``t ≥ 0.5``). ``x`` is a
    non-empty float array; with NaN every percentile is NaN, as numpy's. ``scratch``: ``x``
    may be reordered."""
    n = x.size
    virtual = [(n - 1) * (p / 100) for p in q]
    at: Sequence[float] | dict[int, float]
    if n > _SMALL:
        top = x.max()
        if top != top:  # (NaN: the max is NaN where any value is)
            return [math.nan] * len(q)
        at = _order_statistics(x if scratch else x.copy(), _needed_ranks(n, virtual))
    else:
        s = np.sort(x).tolist()
        if s[-1] != s[-1]:  # NaN sorts last
            return [math.nan] * len(q)
        at = s
    out = []
    for vi in virtual:
        if vi >= n - 1:  # (numpy takes the last value: b − 0·(1 − t))
            out.append(at[n - 1] - (at[n - 1] - at[n - 1]) * (1 - (vi + 1)))
            continue
        lo = math.floor(vi)
        t = vi - lo
        a, b = at[lo], at[lo + 1]
        diff = b - a
        out.append(b - diff * (1 - t) if t >= 0.5 else a + diff * t)
    return out


def _needed_ranks(n: int, virtual: Sequence[float]) -> list[int]:
    """The order statistics (0-based ranks, increasing) that :func:`percentiles` reads at
    the virtual indices ``virtual`` of ``n`` values: each one's two neighbours, the last
    value for the last index."""
    ranks = set()
    for vi in virtual:
        if vi >= n - 1:
            ranks.add(n - 1)
        else:
            ranks.update((math.floor(vi), math.floor(vi) + 1))
    return sorted(ranks)


#: Where the values not yet placed are at most this many, :func:`_order_statistics` sorts
#: them rather than partition again (a sort costs about four partitions).
_SORT_REST = 1 << 15


def _order_statistics(x: np.ndarray, ranks: Sequence[int]) -> dict[int, float]:
    """The values of rank ``ranks`` (increasing) among ``x`` (a float array without NaN,
    reordered in place). One partition per rank, each over the values above the previous
    rank only, and the rank just after a found one is the minimum of those above it:
    numpy's ``partition`` with several ranks at once costs about one partition per rank over
    the whole array (8 ranks of 1,000,000 values: some 7 times one partition). The values
    are those of a sort, whichever way they are found."""
    out: dict[int, float] = {}
    start = 0  # x[start:] holds the values of rank start and above, in some order
    for i, rank in enumerate(ranks):
        rest = x[start:]
        if rest.size <= _SORT_REST:
            rest.sort()
            out.update((r, float(rest[r - start])) for r in ranks[i:])
            break
        if rank == start:  # (the smallest, moved to the front)
            low = int(rest.argmin())
            rest[0], rest[low] = rest[low], rest[0]
            out[rank] = float(rest[0])
        else:
            rest.partition(rank - start)
            out[rank] = float(rest[rank - start])
        start = rank + 1
    return out


def _mean(x: np.ndarray) -> float:
    """``float(x.mean())`` of a non-empty float array, bit for bit (numpy's own sum divided by
    the count), without ``ndarray.mean``'s per-call overhead."""
    return float(np.add.reduce(x)) / x.size


def describe(values: Iterable[float] | np.ndarray, scratch: bool = False) -> dict[str, float | None]:
    """``{mean, p50, p90, p95, p99, max}`` of ``values`` (linear-interpolated percentiles);
    all ``None`` when there are no values.

    ``+inf`` values (prompts that did not finish) are infinitely late: a percentile whose
    interpolation touches one is ``+inf``, as are the mean and the max.

    ``scratch``: ``values`` is a float array of the caller's that may be reordered and
    overwritten (no copy of a large run's column is made).
    """
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return {k: None for k in STAT_KEYS}
    mean, top = _mean(x), float(x.max())
    if top == math.inf:
        # Interpolating towards a huge finite stand-in keeps the finite percentiles exact and
        # sends every percentile that depends on an unfinished value past the stand-in's half.
        unfinished = np.isposinf(x)
        if scratch:
            x[unfinished] = _UNFINISHED
        else:
            x = np.where(unfinished, _UNFINISHED, x)
        del unfinished
        p50, p90, p95, p99 = (math.inf if v >= _UNFINISHED * 1e-6 else v
                              for v in percentiles(x, _DESCRIBED, scratch=True))
    else:
        p50, p90, p95, p99 = percentiles(x, _DESCRIBED, scratch=scratch)
    return {"mean": mean, "p50": p50, "p90": p90, "p95": p95, "p99": p99, "max": top}


#: The percentiles :func:`describe` gives.
_DESCRIBED = (50, 90, 95, 99)


#: Top-level figures of the summary (no task or ``overall`` in front).
RUN_FIGURES = ("makespan_s", "gpu_seconds", "deadline_s")


def figure_key(name: str, known: Iterable[str], option: str = "figure") -> str:
    """The flattened summary key that ``name`` names, in the one grammar every command
    accepts: ``TASK.FIGURE[.STAT]`` or ``tasks.TASK.FIGURE[.STAT]`` (the same key),
    ``overall.FIGURE[.STAT]``, or a run figure such as ``makespan_s``.

    ``known`` are the keys that exist (a results file's columns, or the SLO figures of a
    trace's tasks); a name that is none of them is a :class:`FigureError` whose message
    names ``option`` and offers the closest known keys in the short spelling.
    """
    import difflib

    known = list(known)
    text = name.strip()
    head = text.split(".", 1)[0]
    key = text if head in ("tasks", "overall") or text in RUN_FIGURES or text in known else f"tasks.{text}"
    if key in known:
        return key
    short = {k.removeprefix("tasks."): k for k in known}
    close = difflib.get_close_matches(text.removeprefix("tasks."), list(short), n=4, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else (
        "; names look like infobench.latency.p95, overall.call_latency.p99 or makespan_s")
    raise FigureError(None, None, None, f"{option} {name!r}: no such figure{hint}")


def json_ready(value: Any) -> Any:
    """``value`` with every non-finite float replaced by ``None`` (JSON has no infinity): a
    latency statistic of ``null`` beside a non-zero ``unfinished`` count means infinitely
    late."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


# -- per-request token figures, as load-testing tools report them --------------------------

#: The percentiles the token figures report unless told otherwise (vLLM bench's default
#: ``--metric-percentiles`` is 99; GuideLLM and AIPerf show 50, 90 and 99).
DEFAULT_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0)
#: The per-request timings of :func:`token_figures`, in the order the tables show them.
TOKEN_TIMINGS = ("ttft", "itl", "tpot", "e2e")
#: The unit of the timings in JSON: milliseconds, as the tools write them (``ttft_ms``).
TOKEN_UNIT = "ms"
_DURATION_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s)\s*$")


@dataclass(frozen=True)
class TokenOptions:
    """What the token figures report: ``percentiles`` (each in (0, 100]) besides the mean,
    and ``goodput``, the per-request SLO (timing name -> bound in seconds; ``None``: no
    goodput figures)."""

    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    goodput: tuple[tuple[str, float], ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"percentiles": list(self.percentiles),
                "goodput": None if self.goodput is None else {f"{k}_ms": 1000.0 * v for k, v in self.goodput}}


def stat_name(percentile: float) -> str:
    """The key of a percentile: ``p50``, ``p99.9``."""
    return f"p{percentile:g}"


def parse_percentiles(text: str, option: str = "--percentiles") -> tuple[float, ...]:
    """``"50,90,99"`` -> ``(50.0, 90.0, 99.0)`` (sorted, distinct, each in (0, 100]);
    :class:`FigureError` naming ``option`` otherwise."""
    values: list[float] = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            raise FigureError(None, None, None, f"{option} {text!r}: {part.strip()!r} is not a number; "
                              "give percentiles such as 50,90,99") from None
        if not 0 < value <= 100:
            raise FigureError(None, None, None, f"{option} {text!r}: {part.strip()} is not in (0, 100]")
        values.append(value)
    return tuple(sorted(set(values)))


def parse_goodput(text: str, option: str = "--goodput") -> tuple[tuple[str, float], ...]:
    """``"ttft:200ms,tpot:50ms,e2e:2s"`` -> ``(("ttft", 0.2), ("tpot", 0.05), ("e2e", 2.0))``
    (bounds in seconds; each needs its unit, ``ms`` or ``s``); the timings are those of
    :data:`TOKEN_TIMINGS`. :class:`FigureError` naming ``option`` otherwise."""
    out: dict[str, float] = {}
    for part in text.split(","):
        name, sep, bound = part.partition(":")
        name = name.strip().lower()
        if not sep or name not in TOKEN_TIMINGS:
            raise FigureError(None, None, None, f"{option} {text!r}: {part.strip()!r} is not TIMING:BOUND with "
                              f"TIMING one of {', '.join(TOKEN_TIMINGS)}, e.g. ttft:200ms,tpot:50ms,e2e:2s")
        m = _DURATION_RE.match(bound)
        if not m:
            raise FigureError(None, None, None, f"{option} {text!r}: bound {bound.strip()!r} of {name} is not a "
                              "duration with its unit, e.g. 200ms or 2s")
        if name in out:
            raise FigureError(None, None, None, f"{option} {text!r}: {name} is given twice")
        out[name] = float(m.group(1)) / (1000.0 if m.group(2) == "ms" else 1.0)
    return tuple(out.items())


def _stats(values: np.ndarray, qs: Sequence[float], scale: float, scratch: bool = False) -> dict[str, float | None]:
    """``{mean, pX...}`` of finite ``values`` times ``scale`` (linear interpolation at the
    percentiles ``qs``); all ``None`` without values. ``scratch``: ``values`` may be
    reordered (no copy of them is made)."""
    keys = ["mean", *(stat_name(p) for p in qs)]
    if values.size == 0:
        return {k: None for k in keys}
    mean = _mean(values) * scale  # (before the percentiles may reorder them: the same sum)
    pct = percentiles(values, qs, scratch=scratch) if qs else []
    return {"mean": mean, **{stat_name(p): float(v) * scale for p, v in zip(qs, pct, strict=True)}}


def token_figures(requests: pd.DataFrame, options: TokenOptions | None = None,
                  span: float | None = None) -> dict[str, Any]:
    """The token figures of a per-request table, as vLLM bench, GuideLLM and AIPerf define
    them. A request is one prompt; ``requests`` has ``sent_at``, ``first_token_at`` and
    ``done_at`` (instants, seconds), ``ok`` (it completed), ``output_tokens`` and
    ``prompt_tokens``, and optionally ``itl_s`` (the mean of its measured inter-token gaps).
    Over the completed requests (failed ones have no timings; they count against goodput):

    * ``ttft = first_token_at − sent_at`` (time to first token);
    * ``tpot = (done_at − first_token_at) / (output_tokens − 1)`` (time per output token
      after the first, vLLM's TPOT; requests of one token have none);
    * ``itl``: the request's mean inter-token latency, the mean of its measured gaps where
      they were recorded (``itl_s``), else ``tpot`` (a simulated prompt's tokens after the
      first are evenly spaced, so the two are one). vLLM's ITL pools every gap of every
      request instead, weighting long outputs more; the means agree when outputs are alike;
    * ``e2e = done_at − sent_at`` (end-to-end request latency);

    each reported in milliseconds (``ttft_ms`` ...) as its mean and ``options.percentiles``.
    ``span_s`` is the run's span, first send to last completion (``span`` if given);
    ``output_tokens_per_s = Σ output_tokens / span`` and ``total_tokens_per_s = Σ
    (prompt_tokens + output_tokens) / span`` over completed requests; ``requests_per_s``
    = completed / span. With ``options.goodput`` (timing -> bound in seconds): a request is
    *good* if it completed and meets every bound given (a bound on ``tpot`` or ``itl`` is
    met by a one-token request); ``goodput_per_s = good / span`` and ``goodput_fraction =
    good / requests``.
    """
    import pandas as pd

    itl = None
    if "itl_s" in requests:
        itl = pd.to_numeric(requests["itl_s"], errors="coerce").to_numpy(float)
    return _token_figures(requests["ok"].to_numpy(bool), requests["sent_at"].to_numpy(float),
                          requests["first_token_at"].to_numpy(float), requests["done_at"].to_numpy(float),
                          pd.to_numeric(requests["output_tokens"], errors="coerce").to_numpy(float),
                          pd.to_numeric(requests["prompt_tokens"], errors="coerce").to_numpy(float),
                          itl, options or TokenOptions(), span)


def _token_figures(ok: np.ndarray, sent: np.ndarray, first: np.ndarray, done: np.ndarray, out_tokens: np.ndarray,
                   in_tokens: np.ndarray, measured_itl: np.ndarray | None, options: TokenOptions,
                   span: float | None, described: dict[str, dict[str, float | None]] | None = None) -> dict[str, Any]:
    """:func:`token_figures` of a table given as its columns (``measured_itl``: ``itl_s``,
    ``None`` where the table has none). The token counts may be integers (an event log's
    own columns, uncopied) or floats with NaN (a table's). ``described``: timings whose
    kept values are, value for value and in order, those that :func:`describe` gave these
    figures of (in seconds); their mean and the percentiles it gives are taken from them."""
    pcts = options.percentiles

    def timing(name: str) -> np.ndarray:
        """One request timing, made when asked (one column-long array at a time, and at
        most one more temporary beside it)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            if name == "ttft":
                return first - sent
            if name == "e2e":
                return done - sent
            # (done - first) / (out_tokens - 1) where out_tokens > 1, else NaN; in place
            tpot = done - first
            tpot /= out_tokens - 1.0
            tpot[~(out_tokens > 1)] = np.nan
            if name == "tpot" or measured_itl is None:
                return tpot  # (without measured gaps a request's ITL is its TPOT)
            return np.where(np.isfinite(measured_itl), measured_itl, tpot)

    if span is None:
        span = float(np.nanmax(done[ok]) - np.nanmin(sent)) if ok.any() else 0.0
    figures: dict[str, Any] = {"requests": int(ok.size), "completed": int(ok.sum()),
                               "percentiles": list(pcts)}
    stats: dict[str, dict[str, float | None]] = {}
    for name in ("ttft", "tpot", "e2e", "itl"):
        if name == "itl" and measured_itl is None:
            stats[name] = dict(stats["tpot"])  # the same values: one set of statistics
            continue
        known = (described or {}).get(name)
        if known is not None and all(stat_name(p) in known for p in pcts):
            # (the same sum and order statistics, times the same scale: the same floats)
            stats[name] = {k: None if known[k] is None else float(known[k]) * 1000.0  # type: ignore[arg-type]
                           for k in ("mean", *(stat_name(p) for p in pcts))}
            continue
        values = timing(name)
        kept = np.isfinite(values)
        kept &= ok
        x = values[kept]
        del values, kept
        stats[name] = _stats(x, pcts, 1000.0, scratch=True)  # (x is this loop's own copy)
        del x
    for name in TOKEN_TIMINGS:
        figures[f"{name}_{TOKEN_UNIT}"] = stats[name]
    produced = float(np.nansum(out_tokens[ok]))
    figures["span_s"] = span
    figures["output_tokens"] = int(produced)
    figures["requests_per_s"] = ok.sum() / span if span > 0 else None
    figures["output_tokens_per_s"] = produced / span if span > 0 else None
    figures["total_tokens_per_s"] = (produced + float(np.nansum(in_tokens[ok]))) / span if span > 0 else None
    if options.goodput is not None:
        good = ok.copy()
        for name, bound in options.goodput:
            x = timing(name)
            # (a one-token request has no gap after its first token: no TPOT or ITL to miss)
            good &= (x <= bound) | (np.isnan(x) & (name in ("tpot", "itl")))
        figures["goodput"] = {f"{k}_{TOKEN_UNIT}": 1000.0 * v for k, v in options.goodput}
        figures["good"] = int(good.sum())
        figures["goodput_per_s"] = good.sum() / span if span > 0 else None
        figures["goodput_fraction"] = good.sum() / good.size if good.size else None
    return figures


def prompt_requests(log: pd.DataFrame, deadline: float | None = None) -> pd.DataFrame:
    """The event log as a per-request table for :func:`token_figures`: each prompt a request
    sent when its call arrived (``sent_at = arrived_at``), ``ok`` if served and done by the
    deadline, its ``max_tokens`` its output tokens (the model generates to max tokens)."""
    import pandas as pd

    from simulator.events import SERVED

    limit = math.inf if deadline is None else deadline
    done = log["done_at"].to_numpy(float)
    return pd.DataFrame({
        "sent_at": log["arrived_at"].to_numpy(float),
        "first_token_at": log["first_token_at"].to_numpy(float),
        "done_at": done,
        "ok": log["status"].isin(SERVED).to_numpy(bool) & (done <= limit),
        "output_tokens": log["max_tokens"].to_numpy(),
        "prompt_tokens": log["prompt_tokens"].to_numpy(),
    })


def _task_masks(log: pd.DataFrame) -> tuple[pd.Series, list[str]]:
    """Each call's task set as a bit mask (bit i set if any of its prompts has task i of the
    sorted task names), indexed by ``call_index`` in order, and the names. Whole-column
    operations: a per-call Python function costs more than the simulation it summarises."""
    import pandas as pd

    codes, uniques = pd.factorize(log["task"], sort=True)
    names = [str(n) for n in uniques]
    calls, index = pd.factorize(log["call_index"], sort=True)
    bits = np.where(codes >= 0, np.left_shift(1, np.maximum(codes, 0), dtype=np.int64), 0)
    masks = np.zeros(len(index), dtype=np.int64)
    np.bitwise_or.at(masks, calls, bits)
    return pd.Series(masks, index=pd.Index(index, name="call_index")), names


def call_table(log: pd.DataFrame, deadline: float | None = None) -> pd.DataFrame:
    """One row per call: ``arrived_at``, ``done_at`` (its last prompt), ``latency_s =
    done_at − arrived_at``, ``completed`` (``done_at ≤ deadline``), ``prompts`` and its
    composition ``tasks`` (the sorted set of its tasks, '+'-joined). A call with a prompt
    that was turned away never completes (``done_at`` = inf)."""
    return _call_table(log, deadline)[0]


def _call_table(log: pd.DataFrame, deadline: float | None = None) -> tuple[pd.DataFrame, pd.Series, list[str]]:
    """:func:`call_table`, with the calls' task masks and names (:func:`_task_masks`)."""
    import pandas as pd

    from simulator.events import SERVED

    log = log.assign(done_at=log["done_at"].where(log["status"].isin(SERVED), np.inf))
    grouped = log.groupby("call_index", sort=True)
    masks, names = _task_masks(log)
    labels = {m: "+".join(n for i, n in enumerate(names) if m >> i & 1) for m in masks.unique()}
    calls = pd.DataFrame({
        "call_id": grouped["call_id"].first(),
        "arrived_at": grouped["arrived_at"].min(),
        "done_at": grouped["done_at"].max(),
        "prompts": grouped.size(),
        "tasks": masks.map(labels),
    })
    calls["latency_s"] = calls["done_at"] - calls["arrived_at"]
    limit = math.inf if deadline is None else deadline
    calls["completed"] = np.isfinite(calls["done_at"]) & (calls["done_at"] <= limit)
    return calls, masks, names


def _group(calls: pd.DataFrame) -> dict[str, Any]:
    ok = calls["ok"].to_numpy(bool)
    censored = calls["latency_censored_s"].to_numpy(float)
    return {
        "calls": int(len(calls)),
        "ok": int(ok.sum()),
        "failed": int((~ok).sum()),
        "latency": describe(calls.loc[ok, "latency_s"].to_numpy(float)),
        "latency_censored": describe(censored[np.isfinite(censored)]),
    }


def call_figures(calls: pd.DataFrame, timeout: float | None = None) -> dict[str, Any]:
    """Figures of a per-call table (observed or simulated): ``overall``, ``compositions``
    (per class of the ``composition`` column, in order of appearance, ``other`` last; none
    when calls are not classed) and ``tasks`` (calls containing the task), each with call
    counts, latency statistics over successful calls and over all calls with failures
    censored at ``timeout``."""
    tasks = sorted({t for s in calls["tasks"] for t in s.split("+")})
    comps = composition_labels(calls["composition"])
    return {
        "overall": _group(calls),
        "compositions": {c: _group(calls[calls["composition"] == c]) for c in comps
                         if (calls["composition"] == c).any()},
        "tasks": {t: _group(calls[calls["tasks"].str.split("+").map(lambda s, t=t: t in s)]) for t in tasks},
        "timeout_s": timeout,
    }


def composition_labels(column: pd.Series) -> list[str]:
    """The classes in a ``composition`` column, in order of appearance, ``other`` last."""
    import pandas as pd

    labels = [c for c in pd.unique(column) if c]
    return [c for c in labels if c != "other"] + (["other"] if "other" in labels else [])


def client_calls(log: pd.DataFrame, timeout: float | None = None,
                 compositions: Compositions | None = None) -> pd.DataFrame:
    """The per-call table of a simulated run in an observed run's terms
    (:mod:`simulator.observed`): ``ok`` unless a prompt was turned away or the call took
    longer than the client ``timeout``; ``latency_s`` over ok calls, ``latency_censored_s``
    with failed calls at the timeout (the model, like the server, keeps serving them);
    ``composition`` the call's class by ``compositions`` (empty without rules)."""
    rules = compositions or Compositions()
    calls, masks, names = _call_table(log)
    calls = calls.reset_index()
    # classed once per distinct task set, not once per call
    classes = {m: rules.classify(frozenset(n for i, n in enumerate(names) if m >> i & 1)) for m in masks.unique()}
    calls["composition"] = calls["call_index"].map(masks.map(classes))
    limit = math.inf if timeout is None else timeout
    calls["ok"] = calls["completed"] & (calls["latency_s"] <= limit)
    calls["latency_censored_s"] = np.where(calls["ok"], calls["latency_s"],
                                           limit if timeout is not None else calls["latency_s"])
    calls["latency_s"] = np.where(calls["ok"], calls["latency_s"], np.nan)
    return calls


def busy_time(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of intervals [starts[i], ends[i])."""
    if len(starts) == 0:
        return 0.0
    if bool((starts[1:] >= starts[:-1]).all()):  # (a GPU's rows of a FIFO queue are in start order)
        s, e = starts, ends
    else:
        order = np.argsort(starts, kind="stable")
        s, e = starts[order], ends[order]
    # Sorted by start, an interval opens a new stretch of busy time when it starts after
    # every earlier one has ended (touching intervals merge); a stretch ends at the
    # running latest end of its intervals.
    latest = np.maximum.accumulate(e)
    opens = np.flatnonzero(np.concatenate([[True], s[1:] > latest[:-1]]))
    closes = np.concatenate([opens[1:] - 1, [len(s) - 1]])
    lengths = latest[closes] - s[opens]
    # Summed left to right, the last stretch as (total + end) - start: the float operations
    # of the one-pass loop this replaced, so figures stay bit-identical.
    total = float(np.cumsum(lengths[:-1])[-1]) if len(lengths) > 1 else 0.0
    return float(total + latest[closes[-1]] - s[opens[-1]])


def batch_table(log: pd.DataFrame) -> pd.DataFrame:
    """One row per batch: task, queue, gpu, size and its instants."""
    return log.groupby("batch_id", sort=True).agg(
        task=("task", "first"), queue=("queue", "first"), gpu=("gpu", "first"),
        worker=("worker", "first"), size=("batch_size", "first"),
        batched_at=("batched_at", "first"), started_at=("started_at", "first"),
        done_at=("done_at", "first"),
    )


def _group_summary(v: dict[str, Callable[[], np.ndarray]], done_ok: np.ndarray, turned: dict[str, np.ndarray],
                   batch_sizes: np.ndarray, call_latency: np.ndarray, call_ok: np.ndarray,
                   makespan: float, ttft_is_latency: bool = False,
                   call_latency_is_latency: bool = False) -> dict[str, Any]:
    """The figures of one group of prompts (a task, or all) and of the calls containing them.
    ``v`` makes the group's per-prompt columns on demand (one at a time, so a large run never
    holds them all), ``done_ok`` marks completed prompts. ``ttft_is_latency``: every prompt's
    first token came as it finished (no token timing); ``call_latency_is_latency``: each call
    is one prompt, complete where its prompt is. Either way the two columns are equal value
    for value, and their figures are the latency's, not computed again."""
    completed = int(done_ok.sum())

    def unless_done(x: np.ndarray) -> np.ndarray:
        x[~done_ok] = np.inf  # (x is the group's own new column)
        return x

    figures: dict[str, Any] = {
        "prompts": int(done_ok.size),
        "completed": completed,
        "unfinished": int(done_ok.size - completed),
        "timed_out": int(v["served"]().sum() - completed),
        "rejected": int(turned["rejected"].sum()),
        "dropped": int(turned["dropped"].sum()),
        "sent_after_timeout": int(turned["sent_after_timeout"].sum()),
        "preemptions": int(v["preemptions"]().sum()),
        "calls": int(call_ok.size),
        "calls_completed": int(call_ok.sum()),
        "latency": describe(unless_done(v["latency"]()), scratch=True),
    }
    figures["call_latency"] = dict(figures["latency"]) if call_latency_is_latency \
        else describe(np.where(call_ok, call_latency, np.inf), scratch=True)
    figures["wait"] = describe(v["wait"]()[done_ok], scratch=True)
    figures["service"] = describe(v["service"]()[done_ok], scratch=True)
    figures["ttft"] = dict(figures["latency"]) if ttft_is_latency else describe(unless_done(v["ttft"]()), scratch=True)
    figures["tpot"] = describe(v["tpot"](), scratch=True)
    figures["mean_batch_size"] = float(batch_sizes.mean()) if batch_sizes.size else None
    figures["throughput_prompts_per_s"] = float(completed / makespan) if makespan > 0 else None
    return figures


def _finite(stats: dict[str, float | None]) -> bool:
    """Whether :func:`describe`'s ``stats`` are of values all finite (a NaN or an infinity
    makes the mean or the max one)."""
    return stats["mean"] is not None and math.isfinite(stats["mean"]) and math.isfinite(stats["max"] or math.nan)


def batch_sizes_of(ids: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The size of each distinct batch among rows ``ids`` (ids >= 0; in order of id): per
    batch, not per row, so no table as long as the rows is made."""
    if not ids.size:
        return np.zeros(0, dtype=np.int64)
    if bool((ids[1:] >= ids[:-1]).all()):  # (rows in order of batch: each batch's first row)
        return sizes[np.flatnonzero(np.concatenate([[True], ids[1:] != ids[:-1]]))]
    top = int(ids.max()) + 1
    present = np.zeros(top, dtype=bool)
    present[ids] = True
    # (in the sizes' own integer type: a large run has about as many batches as rows)
    size_of = np.zeros(top, dtype=sizes.dtype if sizes.dtype.kind in "iu" else np.int64)
    size_of[ids] = sizes  # every row of a batch has the batch's size
    return size_of if present.all() else size_of[present]


def _codes(column: pd.Series) -> tuple[np.ndarray, list[str]]:
    """Each row's code and the sorted distinct values (``pd.factorize(column, sort=True)``),
    read off a categorical whose sorted categories are exactly the values present (the
    engines' logs) without a hash table per row."""
    import pandas as pd

    if isinstance(column.dtype, pd.CategoricalDtype) and column.cat.categories.is_monotonic_increasing:
        codes = column.cat.codes.to_numpy()
        categories = column.cat.categories
        if codes.size and codes.min() >= 0 and (np.bincount(codes, minlength=len(categories)) > 0).all():
            return codes, list(categories)
    codes, names = pd.factorize(column, sort=True)
    return codes, list(names)


def _sorted_labels(codes: np.ndarray, names: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """``codes`` into ``names`` renumbered into the sorted names present (what
    :func:`_codes` reads off an engine's log); the codes themselves where they are that
    already."""
    names = [str(n) for n in names]
    present = np.bincount(codes[codes >= 0] if codes.size and codes.min() < 0 else codes, minlength=len(names)) > 0
    if names == sorted(set(names)) and bool(present.all()):
        return codes, names
    order = sorted(set(n for n, p in zip(names, present, strict=True) if p))
    renumber = np.array([order.index(n) if p else -1 for n, p in zip(names, present, strict=True)] + [-1],
                        dtype=np.int32 if len(names) > 127 else np.int8)
    return renumber[codes], order


class _PerCall:
    """Reductions of per-prompt values to their calls (codes 0..calls-1): by segments where
    each call's prompts are consecutive (the engines' logs), else ``ufunc.at``. Max, min,
    and, or are exact whichever way they are taken."""

    def __init__(self, call_of: np.ndarray, n_calls: int) -> None:
        self.call_of, self.n_calls = call_of, n_calls
        self.starts: np.ndarray | None = None
        self.one_each = False  # (a prompt per call, in call order: each call's values are its prompt's)
        if call_of.size and bool(np.all(call_of[1:] >= call_of[:-1])) and int(call_of[-1]) == n_calls - 1 \
                and int(call_of[0]) == 0:
            # (sorted from 0 to the last call with as many rows as calls: no segments to find)
            self.one_each = call_of.size == n_calls
            if not self.one_each:
                self.starts = np.flatnonzero(np.concatenate([[True], call_of[1:] != call_of[:-1]]))

    def reduce(self, ufunc: np.ufunc, values: np.ndarray, initial: Any) -> np.ndarray:
        """``ufunc`` of each call's ``values`` (``initial`` for a call without prompts)."""
        if self.one_each:
            return np.array(values, copy=True)
        if self.starts is not None and len(self.starts) == self.n_calls:
            return ufunc.reduceat(values, self.starts)
        out = np.full(self.n_calls, initial, dtype=np.result_type(values, np.asarray(initial)))
        ufunc.at(out, self.call_of, values)
        return out


def _call_codes(call_index: np.ndarray) -> np.ndarray:
    """Each row's call as 0..calls-1 in order of call index (``pd.factorize(sort=True)``);
    the column itself where it is that already (the engines' logs: calls in order, from 0)."""
    if call_index.size and call_index[0] == 0 and bool(np.all(call_index[1:] >= call_index[:-1])) \
            and int(call_index[-1]) == int(np.count_nonzero(call_index[1:] != call_index[:-1])):
        return call_index
    return np.unique(call_index, return_inverse=True)[1].ravel()


def _gpu_figures(gpu_of: np.ndarray, served: np.ndarray, started: np.ndarray, done: np.ndarray,
                 batch_ids: np.ndarray, sizes: np.ndarray, gpus: int | None,
                 makespan: float) -> tuple[list[dict[str, Any]], float]:
    """Per GPU (``gpus`` of them, else as many as the log names): utilisation, busy time,
    batches, mean batch size and concurrency (module docstring); and the total busy time.
    ``gpu_of``: each row's GPU, ``-1`` on none."""
    on_gpu = (gpu_of >= 0) & served
    n_gpus = gpus if gpus is not None else (int(gpu_of[on_gpu].max()) + 1 if on_gpu.any() else 0)
    gpu_rows = []
    total_busy = 0.0
    # The rows of each GPU, found with one stable sort (not a pass over the log per GPU):
    # rows on no GPU (or not served) sort last.
    # (in the narrowest integer type: numpy's stable sort of 8- and 16-bit integers is a radix sort)
    gpu = np.where(on_gpu, gpu_of, n_gpus).astype(np.min_scalar_type(-n_gpus - 1), copy=False)
    del on_gpu
    rows = np.argsort(gpu, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(gpu, minlength=n_gpus + 1))])
    del gpu
    for g in range(n_gpus):
        mine = rows[bounds[g]:bounds[g + 1]]
        my_started, my_done = started[mine], done[mine]
        busy = busy_time(my_started, my_done)
        total_busy += busy
        gpu_batches = batch_sizes_of(batch_ids[mine], sizes[mine])
        gpu_rows.append(_gpu_row(g, busy, int(gpu_batches.size),
                                 float(gpu_batches.mean()) if gpu_batches.size else None,
                                 float((my_done - my_started).sum()), makespan))
    return gpu_rows, total_busy


def _gpu_row(gpu: int, busy: float, batches: int, mean_batch: float | None, prompt_seconds: float,
             makespan: float) -> dict[str, Any]:
    """A GPU's figures from its busy time, batches, their mean size and the seconds its
    prompts spent on it (module docstring)."""
    return {"id": gpu, "utilization": busy / makespan if makespan > 0 else 0.0, "busy_s": busy, "batches": batches,
            "mean_batch_size": mean_batch, "mean_concurrency": prompt_seconds / busy if busy > 0 else None}



#: Up to this many prompts the summary takes every group's figures (overall, each task) in
#: one pass (compiled, or :class:`_SortedGroups`): a sweep's runs are small, and one numpy call
#: per group and figure was most of their summary. Above it, group by group with bounded
#: temporaries.
_ONE_PASS = 1 << 16


class _SortedGroups:
    """Groups of values, each sorted, laid end to end; statistics of many of them read off
    with one vectorized pass (:meth:`resolve`).

    Percentiles are those of :func:`percentiles` (``np.percentile``, linear, bit for bit: the
    same order statistics, virtual index and interpolation). Means are each group's sum over
    its sorted values divided by its count: they can differ from a mean in log order (what
    :func:`describe` takes) by floating-point rounding only.

    Every group is sorted at once, when the statistics are resolved: the values added, each
    with its group's number in the whole layout, sorted by value, then by group (a stable
    sort of small integers). Equal values are equal floats, so the layout holds what sorting
    each group alone gives."""

    def __init__(self) -> None:
        self.parts: list[np.ndarray] = []
        self.groups: list[np.ndarray] = []
        self.n_groups = 0
        self.size = 0
        self.asks: list[tuple[list[int], list[int], tuple[float, ...], float, bool, list[dict[str, Any]]]] = []

    def add(self, x: np.ndarray, codes: np.ndarray | None, n_groups: int) -> tuple[list[int], list[int]]:
        """Add ``x`` grouped by ``codes`` (0..n_groups-1; ``None``: all in group 0): the
        start and length of each group's sorted run."""
        if codes is None:
            self.groups.append(np.full(x.size, self.n_groups, dtype=np.int64))
            lengths = [x.size]
        else:
            self.groups.append(codes + np.int64(self.n_groups))
            lengths = np.bincount(codes, minlength=n_groups).tolist()
        self.parts.append(x)
        self.n_groups += len(lengths)
        starts = []
        at = self.size
        for length in lengths:
            starts.append(at)
            at += length
        self.size = at
        return starts, lengths

    def ask(self, starts: Sequence[int], lengths: Sequence[int], qs: Sequence[float], scale: float = 1.0,
            late: bool = False) -> list[dict[str, Any]]:
        """The statistics of the runs at ``starts`` (``lengths`` long): dicts, filled by
        :meth:`resolve`, as :func:`describe` gives them (``late``: ``+inf`` values are
        unfinished prompts, the mean and max are given) or :func:`_stats` (mean and
        percentiles, times ``scale``)."""
        out: list[dict[str, Any]] = [{} for _ in starts]
        self.asks.append((list(starts), list(lengths), tuple(qs), scale, late, out))
        return out

    def _sorted(self) -> np.ndarray:
        """Every group's values sorted, laid end to end, then a slot past the end."""
        values = np.concatenate([*self.parts, np.zeros(1)])
        if not self.parts:
            return values
        groups = np.concatenate(self.groups)
        # (16-bit group numbers where they fit: numpy's stable sort of them is a radix sort)
        by_value = np.argsort(values[:-1])
        by_group = np.argsort(groups.astype(np.int16, copy=False)[by_value] if self.n_groups <= 2**15
                              else groups[by_value], kind="stable")
        values[:-1] = values[by_value[by_group]]
        return values

    def resolve(self) -> None:
        """Fill every asked dict, in one vectorized evaluation of every percentile asked."""
        if not self.asks:
            return
        big = self._sorted()  # (a slot past the end: reduceat's stop)
        # the stand-in for +inf inside the interpolation, as describe's
        finite = np.where(big == math.inf, _UNFINISHED, big)
        qs_all = sorted({q for ask in self.asks for q in ask[2]})
        s = np.array([x for ask in self.asks for x in ask[0]], dtype=np.int64)
        n = np.array([x for ask in self.asks for x in ask[1]], dtype=np.int64)
        late_rows = np.array([ask[4] for ask in self.asks for _ in ask[0]], dtype=bool)
        full = n > 0
        flags = full.tolist()
        if not full.all():
            s, n, late_rows = s[full], n[full], late_rows[full]
        bounds = np.empty(2 * s.size, dtype=np.int64)
        bounds[0::2] = s
        bounds[1::2] = s + n
        last = s + n - 1
        means = (np.add.reduceat(big, bounds)[::2] / n).tolist() if s.size else []
        top = big[last]
        vi = (n - 1).astype(float)[:, None] * np.array([p / 100 for p in qs_all])
        lo = np.floor(vi).astype(np.int64)
        t = vi - lo
        lo += s[:, None]
        a = finite[lo]
        b = finite[np.minimum(lo + 1, last[:, None])]
        diff = b - a
        # (values are finite or NaN here: no floating-point warning to silence)
        pct = np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)
        if late_rows.any():
            pct[(pct >= _UNFINISHED * 1e-6) & late_rows[:, None]] = math.inf
        pct[np.isnan(top)] = math.nan  # (NaN sorts last: a group holding one)
        tops, rows = top.tolist(), pct.tolist()
        i = j = 0
        for _, _, qs, scale, late, outs in self.asks:
            if late:
                keys = ["mean", "p50", "p90", "p95", "p99", "max"]
                qs = _DESCRIBED
            else:
                keys = ["mean", *(stat_name(p) for p in qs)]
            columns = None if list(qs) == qs_all else [qs_all.index(q) for q in qs]
            for out in outs:
                has = flags[j]
                j += 1
                if not has:
                    out.update(dict.fromkeys(keys))
                    continue
                row = rows[i] if columns is None else [rows[i][c] for c in columns]
                if late:
                    out.update(zip(keys, (means[i], *row, tops[i]), strict=True))
                elif scale == 1.0:
                    out.update(zip(keys, (means[i], *row), strict=True))
                else:
                    out.update(zip(keys, (means[i] * scale, *(v * scale for v in row)), strict=True))
                i += 1


def _groups_one_pass(n_tasks: int, task_codes: np.ndarray, served: np.ndarray, done_ok: np.ndarray,
                     turned: dict[str, np.ndarray], arrived: np.ndarray, started: np.ndarray, first: np.ndarray,
                     done: np.ndarray, max_tokens: np.ndarray, in_tokens: np.ndarray, preemptions: np.ndarray,
                     batch_ids: np.ndarray, sizes: np.ndarray, padded: np.ndarray, actual: np.ndarray,
                     batch_task: np.ndarray, layout: _Layout, call_latency: np.ndarray, call_ok: np.ndarray,
                     makespan: float, options: TokenOptions, sorted_groups: _SortedGroups) -> list[dict[str, Any]]:
    """The figures of every group of prompts, overall first, then task code 0, 1, ...: those
    :func:`_group_summary`, :func:`padding_totals` and :func:`_token_figures` give group by
    group, taken for all groups at once (counts by ``bincount``, statistics by
    ``sorted_groups``, resolved by the caller). ``layout``: the log's calls and tasks. Sums over a group (means, padding's mean waste) are taken in another order than
    group by group: they can differ by floating-point rounding only."""
    def per_group(mask: np.ndarray | None = None, weights: np.ndarray | None = None) -> list[float]:
        """Overall, then per task: the count of rows in ``mask`` (or the sum of ``weights``)."""
        codes = task_codes if mask is None else task_codes[mask]
        w = None if weights is None else (weights if mask is None else weights[mask])
        by_task = np.bincount(codes, weights=w, minlength=n_tasks)
        return [float(by_task.sum()) if w is not None else codes.size, *by_task.tolist()]

    prompts = per_group()
    completed = per_group(done_ok)
    served_n = per_group(served)
    turned_n = {k: per_group(v) for k, v in turned.items()}
    preempted = per_group(weights=preemptions.astype(float))
    # calls holding each task (a call per bit), and how many of them completed
    bits, calls, call_of_pair, task_of_pair = layout.pairs()
    calls_ok = [int(call_ok.sum()), *bits[call_ok].sum(axis=0).tolist()]
    # batches: each distinct batch's size and task (every row of a batch has its task)
    batched = batch_ids >= 0
    ids = batch_ids[batched]
    top = int(ids.max()) + 1 if ids.size else 0
    present = np.zeros(top, dtype=bool)
    present[ids] = True
    size_of = np.zeros(top, dtype=np.int64)
    size_of[ids] = sizes[batched]
    task_of = np.zeros(top, dtype=np.int64)
    task_of[ids] = task_codes[batched]
    batch_n = np.bincount(task_of[present], minlength=n_tasks)
    batch_total = np.bincount(task_of[present], weights=size_of[present], minlength=n_tasks)
    mean_batch = [float(size_of[present].sum()) / int(present.sum()) if present.any() else None,
                  *(float(t) / c if c else None for t, c in zip(batch_total.tolist(), batch_n.tolist(), strict=True))]
    # padding, per batch summed per group
    pad_n = np.bincount(batch_task, minlength=n_tasks)
    pad_padded = np.bincount(batch_task, weights=padded, minlength=n_tasks)
    pad_actual = np.bincount(batch_task, weights=actual, minlength=n_tasks)
    waste = np.where(padded > 0, (padded - actual) / np.maximum(padded, 1), 0.0)
    pad_waste = np.bincount(batch_task, weights=waste, minlength=n_tasks)
    padding = [(padded.size, int(padded.sum()), int(actual.sum()), float(np.add.reduce(waste)))]
    padding += [(c, int(p), int(a), w) for c, p, a, w in zip(pad_n.tolist(), pad_padded.tolist(),
                                                             pad_actual.tolist(), pad_waste.tolist(), strict=True)]
    produced = per_group(done_ok, max_tokens.astype(float))
    consumed = per_group(done_ok, in_tokens)
    good = None
    if options.goodput is not None:
        ok = done_ok.copy()
        for name, bound in options.goodput:
            with np.errstate(invalid="ignore", divide="ignore"):
                x = (first - arrived if name == "ttft" else done - arrived if name == "e2e"
                     else np.where(max_tokens > 1, (done - first) / (max_tokens - 1), np.nan))
            ok &= (x <= bound) | (np.isnan(x) & (name in ("tpot", "itl")))
        good = per_group(ok)

    # statistics: every value sorted once overall and once by task
    sg = sorted_groups

    def runs(x: np.ndarray, codes: np.ndarray) -> tuple[list[int], list[int]]:
        s0, n0 = sg.add(x, None, 1)
        if n_tasks == 1:  # (the one task's run is the overall one)
            return s0 * 2, n0 * 2
        s1, n1 = sg.add(x, codes, n_tasks)
        return s0 + s1, n0 + n1

    def finite_prefix(x: np.ndarray, codes: np.ndarray) -> list[int]:
        """Per group, how many of ``x`` are finite (they sort before +inf and NaN)."""
        fin = np.isfinite(x)
        return [int(fin.sum()), *np.bincount(codes[fin], minlength=n_tasks).tolist()]

    not_done = ~done_ok
    latency = done - arrived
    latency[not_done] = math.inf
    lat_s, lat_n = runs(latency, task_codes)
    e2e_n = finite_prefix(latency, task_codes)
    if np.array_equal(first, done, equal_nan=True):  # (no token timing: each TTFT is the latency, sorted once)
        ttft_s, ttft_n, ttft_ok_n = lat_s, lat_n, e2e_n
    else:
        ttft = first - arrived
        ttft[not_done] = math.inf
        ttft_s, ttft_n = runs(ttft, task_codes)
        ttft_ok_n = finite_prefix(ttft, task_codes)
    ok_codes = task_codes[done_ok]
    wait_s, wait_n = runs((started - arrived)[done_ok], ok_codes)
    service_s, service_n = runs((done - started)[done_ok], ok_codes)
    # (divided only where there is a gap after the first token: no warning to silence)
    tpot = np.divide(done - first, max_tokens - 1, out=np.full(done.size, math.nan), where=max_tokens > 1)
    has_tpot = done_ok & (max_tokens > 1) & np.isfinite(tpot)
    tpot_s, tpot_n = runs(tpot[has_tpot], task_codes[has_tpot])
    # call latency: every call overall; per task, the calls holding it
    call_values = np.where(call_ok, call_latency, np.inf)
    cs0, cn0 = sg.add(call_values, None, 1)
    cs1, cn1 = sg.add(call_values[call_of_pair], task_of_pair, n_tasks)
    call_s, call_n = cs0 + cs1, cn0 + cn1

    late = _DESCRIBED
    pcts = options.percentiles
    stats = {
        "latency": sg.ask(lat_s, lat_n, late, late=True),
        "call_latency": sg.ask(call_s, call_n, late, late=True),
        "wait": sg.ask(wait_s, wait_n, late, late=True),
        "service": sg.ask(service_s, service_n, late, late=True),
        "ttft": sg.ask(ttft_s, ttft_n, late, late=True),
        "tpot": sg.ask(tpot_s, tpot_n, late, late=True),
        "tok_ttft": sg.ask(ttft_s, ttft_ok_n, pcts, 1000.0),
        "tok_tpot": sg.ask(tpot_s, tpot_n, pcts, 1000.0),
        "tok_itl": sg.ask(tpot_s, tpot_n, pcts, 1000.0),  # (no measured gaps: a prompt's ITL is its TPOT)
        "tok_e2e": sg.ask(lat_s, e2e_n, pcts, 1000.0),
    }
    return _group_dicts(prompts, completed, served_n, turned_n, preempted, calls, calls_ok, mean_batch, padding,
                        produced, consumed, good, stats, makespan, options)


def _group_dicts(prompts: Sequence[float], completed: Sequence[float], served: Sequence[float],
                 turned: Mapping[str, Sequence[float]], preempted: Sequence[float], calls: Sequence[float],
                 calls_ok: Sequence[float], mean_batch: Sequence[float | None], padding: Sequence[tuple[int, int, int, float]],
                 produced: Sequence[float], consumed: Sequence[float], good: Sequence[float] | None,
                 stats: dict[str, list[dict[str, Any]]], makespan: float,
                 options: TokenOptions) -> list[dict[str, Any]]:
    """The figures of each group (overall, then each task) from its counts and sums (a value a
    group in each sequence, counts whole numbers; ``padding``: batches, padded and actual tokens, summed per-batch
    waste) and its statistics (``stats[name][group]``, named as the figures are, the token
    figures' as ``tok_ttft``, ``tok_tpot``, ``tok_itl``, ``tok_e2e``)."""
    out = []
    pcts = options.percentiles
    for g in range(len(prompts)):
        done_g = int(completed[g])
        c, p, a, w = padding[g]
        tokens: dict[str, Any] = {"requests": int(prompts[g]), "completed": done_g, "percentiles": list(pcts),
                                  "ttft_ms": stats["tok_ttft"][g], "itl_ms": stats["tok_itl"][g],
                                  "tpot_ms": stats["tok_tpot"][g], "e2e_ms": stats["tok_e2e"][g],
                                  "span_s": makespan, "output_tokens": int(produced[g]),
                                  "requests_per_s": done_g / makespan if makespan > 0 else None,
                                  "output_tokens_per_s": produced[g] / makespan if makespan > 0 else None,
                                  "total_tokens_per_s": (produced[g] + consumed[g]) / makespan if makespan > 0 else None}
        if options.goodput is not None and good is not None:
            good_g = int(good[g])
            tokens["goodput"] = {f"{k}_{TOKEN_UNIT}": 1000.0 * v for k, v in options.goodput}
            tokens["good"] = good_g
            tokens["goodput_per_s"] = good_g / makespan if makespan > 0 else None
            tokens["goodput_fraction"] = good_g / int(prompts[g]) if prompts[g] else None
        out.append({
            "prompts": int(prompts[g]), "completed": done_g, "unfinished": int(prompts[g]) - done_g,
            "timed_out": int(served[g]) - done_g,
            **{k: int(v[g]) for k, v in turned.items()},
            "preemptions": int(preempted[g]), "calls": int(calls[g]), "calls_completed": int(calls_ok[g]),
            **{k: stats[k][g] for k in ("latency", "call_latency", "wait", "service", "ttft", "tpot")},
            "mean_batch_size": mean_batch[g],
            "throughput_prompts_per_s": float(done_g / makespan) if makespan > 0 else None,
            "padding": ({"batches": c, "padded_tokens": p, "actual_tokens": a,
                         "waste": (p - a) / p if p > 0 else 0.0, "mean_batch_waste": w / c}
                        if c else {"batches": 0, "padded_tokens": 0, "actual_tokens": 0, "waste": None,
                                   "mean_batch_waste": None}),
            "tokens": tokens,
        })
    return out


def summarize(log: pd.DataFrame, config: dict[str, Any] | None = None,
              deadline: float | None = None, gpus: int | None = None,
              client_timeout: float | None = None, compositions: Compositions | None = None,
              tokens: TokenOptions | None = None) -> dict[str, Any]:
    """The summary JSON of one run (stable keys: ``overall``, ``tasks.<name>``,
    ``compositions``, ``gpus``, ``gpu_seconds``, ``makespan_s``, ``deadline_s``, ``config``;
    :func:`simulator.replay.simulate_and_summarize` adds ``cost``, :mod:`simulator.cost`).

    ``client_timeout``: a call not done that long after it arrived failed (the client gave
    up; the system still served it). ``compositions`` holds the call figures per
    composition class of the scenario's ``[compositions]`` rules (:func:`call_figures`),
    failed calls censored at the timeout; it is empty without rules. ``tokens`` chooses the
    percentiles and the goodput SLO of each group's ``tokens`` figures (:func:`token_figures`,
    over the run's span ``makespan_s``).

    ``gpus`` is the number of GPUs in the system, so that idle GPUs are listed too. Computed
    with numpy on the log's columns (:func:`summarize_columns` of :func:`log_columns`); the
    definitions are those of the module docstring, and :func:`call_table` /
    :func:`batch_table` give the same per-call and per-batch views as frames.
    """
    return summarize_columns(log_columns(log), config, deadline=deadline, gpus=gpus,
                             client_timeout=client_timeout, compositions=compositions, tokens=tokens)


#: The log's columns a summary reads as numbers (the others are labels, or gpu).
_NUMBER_COLUMNS = ("call_index", "prompt_tokens", "max_tokens", "batch_id", "batch_size", "preemptions")
_INSTANT_COLUMNS = ("arrived_at", "started_at", "first_token_at", "done_at")


def log_columns(log: pd.DataFrame) -> LogColumns:
    """The columns of an event log frame that :func:`summarize_columns` reads (the frame's
    own arrays where pandas holds them as numpy; labels as codes into their sorted names)."""
    columns = {name: log[name].to_numpy(float) for name in _INSTANT_COLUMNS}
    columns.update({name: log[name].to_numpy() for name in _NUMBER_COLUMNS})
    gpu = log["gpu"]
    columns["gpu"] = gpu.to_numpy(dtype=np.int64 if gpu.dtype == "Int64" else np.int32, na_value=-1)
    if "dispatched_at" in log:
        columns["dispatched_at"] = log["dispatched_at"].to_numpy(float)
    if "cached_tokens" in log:
        columns["cached_tokens"] = log["cached_tokens"].to_numpy()
    labels: dict[str, list[str]] = {}
    for name in ("task", "status", "queue"):
        columns[name], labels[name] = _codes(log[name])
    return LogColumns(columns, labels, dict(log.attrs))


class _Layout:
    """What a summary reads off a log's calls and tasks alone, not off what happened to its
    prompts: each row's call (codes 0..calls-1) and the reductions to calls, the task codes
    in sorted order of name, each call's task set as a bit mask, and what the one-pass
    summary and the composition classes derive from them. The same for every run of a trace
    (a sweep's thousands): made once (:func:`_layout`)."""

    def __init__(self, call_index: np.ndarray, task: np.ndarray, task_labels: Sequence[str]) -> None:
        self.call_of = _call_codes(call_index)
        self.n_calls = int(self.call_of.max()) + 1 if self.call_of.size else 0
        self.per_call = _PerCall(self.call_of, self.n_calls)
        self.task_codes, self.task_names = _sorted_labels(task, task_labels)
        bits = np.uint8 if len(self.task_names) <= 8 else np.int64  # (a byte a prompt where it suffices)
        self.mask = self.per_call.reduce(np.bitwise_or, np.left_shift(bits(1), self.task_codes.astype(bits)), bits(0))
        self._pairs: tuple[np.ndarray, list[int], np.ndarray, np.ndarray] | None = None
        self._classes = Memo(8)

    @cached_property
    def codes64(self) -> np.ndarray:
        """The task codes as 64-bit integers (as the compiled summary pass takes them)."""
        return self.task_codes.astype(np.int64)

    @cached_property
    def calls64(self) -> np.ndarray:
        """Each row's call as 64-bit integers (as the compiled summary pass takes them)."""
        return self.call_of.astype(np.int64)

    def pairs(self) -> tuple[np.ndarray, list[int], np.ndarray, np.ndarray]:
        """Per call a bit per task it holds (calls × tasks), the calls holding each task
        (every call first), and the (call, task) pairs of held tasks by task, calls in order."""
        if self._pairs is None:
            n_tasks = len(self.task_names)
            bits = ((self.mask[:, None] >> np.arange(n_tasks, dtype=self.mask.dtype)) & 1).astype(bool)
            calls = [self.mask.size, *bits.sum(axis=0).tolist()]
            call_of_pair, task_of_pair = np.nonzero(bits)
            order = np.argsort(task_of_pair, kind="stable")
            self._pairs = (bits, calls, call_of_pair[order], task_of_pair[order])
        return self._pairs

    def classes(self, rules: Compositions) -> np.ndarray:
        """Each call's composition class by ``rules``: its index in ``rules.labels``, -1 for
        a call of no class."""
        def make() -> np.ndarray:
            labels = list(rules.labels)
            task_names = self.task_names
            distinct, mask_of = np.unique(self.mask, return_inverse=True)
            label_of = np.array([labels.index(c) if (c := rules.classify(frozenset(
                str(task_names[i]) for i in range(len(task_names)) if m >> i & 1))) in labels else -1
                for m in distinct.tolist()], dtype=np.int64)
            return label_of[mask_of] if len(distinct) else np.zeros(0, dtype=np.int64)

        return self._classes.get((rules,), (), make)


#: Layouts by their log's call and task columns (see :func:`_layout`).
_LAYOUTS: dict[tuple, _Layout] = {}


def _layout(call_index: np.ndarray, task: np.ndarray, task_labels: Sequence[str]) -> _Layout:
    """The :class:`_Layout` of a log's ``call_index`` and ``task`` columns (codes into
    ``task_labels``), kept by their contents for the next log of the same calls and tasks,
    for logs of up to :data:`_ONE_PASS` prompts."""
    if call_index.size > _ONE_PASS:
        return _Layout(call_index, task, task_labels)
    key = (call_index.dtype.str, call_index.tobytes(), task.dtype.str, task.tobytes(), tuple(map(str, task_labels)))
    layout = _LAYOUTS.get(key)
    if layout is None:
        layout = _Layout(call_index, task, task_labels)
        if len(_LAYOUTS) >= 8:
            _LAYOUTS.clear()
        _LAYOUTS[key] = layout
    return layout


def summarize_columns(log: LogColumns, config: dict[str, Any] | None = None,
                      deadline: float | None = None, gpus: int | None = None,
                      client_timeout: float | None = None, compositions: Compositions | None = None,
                      tokens: TokenOptions | None = None) -> dict[str, Any]:
    """:func:`summarize` of an event log given as its columns: the one producer of the
    summary JSON, whether the log came as a frame (:func:`summarize`) or straight from the
    fast engine (a sweep's runs, no frame made). ``log`` needs the columns
    ``arrived_at``, ``started_at``, ``first_token_at``, ``done_at``, ``call_index``,
    ``prompt_tokens``, ``max_tokens``, ``batch_id``, ``batch_size``, ``preemptions``, ``gpu``
    and the labels ``task``, ``status`` and ``queue`` (with a replica pool,
    ``dispatched_at`` and the ``replicas`` attr).

    A log of up to :data:`_ONE_PASS` prompts has every group's figures (overall, each task,
    each composition class) taken at once: by one call of the compiled summary pass where the
    kernel's extension has it (:mod:`simulator.summary_kernel`), else by numpy's passes
    (:class:`_SortedGroups`), the same figures bit for bit. A larger log is summarised group by
    group, with temporaries bounded for memory. Percentiles, counts and maxima are the same
    either way; a mean (and padding's mean batch waste) is summed in another order, so it
    can differ by floating-point rounding."""
    limit = math.inf if deadline is None else deadline
    cols = log.columns
    # calls and tasks: made once for every log of the same calls (a sweep's runs of a trace)
    layout = _layout(cols["call_index"], cols["task"], log.labels["task"])
    options = tokens or TokenOptions()
    rules = compositions or Compositions()
    kernel = summary_pass() if 0 < layout.task_codes.size <= _ONE_PASS else None
    if kernel is not None:
        overall, tasks, by_composition, gpu_rows, total_busy, makespan = _compiled_figures(
            kernel, log, layout, limit, gpus, client_timeout, rules, options)
    else:
        overall, tasks, by_composition, gpu_rows, total_busy, makespan = _numpy_figures(
            log, layout, limit, gpus, client_timeout, rules, options)
    arrived, done = cols["arrived_at"], cols["done_at"]
    return {
        "overall": overall,
        "tasks": tasks,
        "compositions": by_composition,
        "gpus": gpu_rows,
        "gpu_seconds": total_busy,
        "makespan_s": makespan,
        "deadline_s": deadline,
        "config": config or {},
        **({"replicas": _replica_figures(log.attrs["replicas"], arrived, cols["dispatched_at"], done,
                                         _served(log))} if "replicas" in log.attrs else {}),
        **({"prefix_cache": prefix_cache_figures(cols["cached_tokens"], cols["prompt_tokens"], cols["batch_id"] >= 0,
                                                 arrived, layout.task_codes, layout.task_names)}
           if "cached_tokens" in cols else {}),
    }


def _served(log: LogColumns) -> np.ndarray:
    """Whether each prompt of ``log`` was served (module docstring)."""
    from simulator.events import SERVED

    status_code, status_names = log.columns["status"], log.labels["status"]
    return np.array([str(n) in SERVED for n in status_names], dtype=bool)[status_code] if len(status_code) \
        else np.zeros(0, dtype=bool)


@lru_cache(maxsize=64)
def _status_codes(names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Per status code (of ``names``) whether it is served; the codes of rejected, dropped and
    sent-after-timeout (-2: none)."""
    from simulator.events import SERVED

    return (np.array([n in SERVED for n in names], dtype=bool),
            np.array([names.index(k) if k in names else -2 for k in ("rejected", "dropped", "sent_after_timeout")],
                     dtype=np.int64))


@lru_cache(maxsize=64)
def _summary_options(percentiles: tuple[float, ...], goodput: tuple[tuple[str, float], ...] | None,
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """The token percentiles, the goodput SLO's timings and bounds as the compiled pass takes
    them, and the token statistics' keys."""
    kinds = {"ttft": sl.GOODPUT_TTFT, "e2e": sl.GOODPUT_E2E}
    slo = goodput or ()
    return (np.array(percentiles, dtype=float), np.array([kinds.get(k, sl.GOODPUT_TPOT) for k, _ in slo], dtype=np.int64),
            np.array([bound for _, bound in slo], dtype=float), ["mean", *(stat_name(p) for p in percentiles)])


#: The percentiles :func:`describe` gives, as the compiled pass takes them.
_DESCRIBED_ARRAY = np.array(_DESCRIBED, dtype=float)


def _compiled_figures(kernel: Callable[..., tuple], log: LogColumns, layout: _Layout, limit: float, gpus: int | None,
                      client_timeout: float | None, rules: Compositions, options: TokenOptions) -> Figures:
    """The :data:`Figures` of ``log`` (:func:`summarize_columns`) by the compiled summary pass
    (:mod:`simulator.summary_kernel`, through :func:`simulator.model.compiled.summary_pass`):
    one call, then the arrays it returns read into the summary's dicts."""
    cols, labels = log.columns, log.labels
    served_status, turned_status = _status_codes(tuple(str(n) for n in labels["status"]))
    token_qs, goodput_kind, goodput_bound, token_keys = _summary_options(tuple(options.percentiles), options.goodput)
    n_tasks = len(layout.task_names)
    classes = list(rules.labels)
    _, _, call_of_pair, task_of_pair = layout.pairs()
    counts, stats, gpu, composition, makespan = kernel(
        *(np.ascontiguousarray(cols[name], dtype=float) for name in _INSTANT_COLUMNS),
        np.asarray(cols["status"], dtype=np.int64), served_status, turned_status, layout.codes64, n_tasks,
        layout.calls64, layout.n_calls, call_of_pair, task_of_pair,
        layout.classes(rules) if classes else _NO_CLASSES, len(classes),
        *(np.asarray(cols[name], dtype=np.int64) for name in ("max_tokens", "prompt_tokens", "preemptions", "batch_id",
                                                            "batch_size", "gpu", "queue")),
        engine_of(tuple(str(q) for q in labels["queue"]), tuple(layout.task_names)),
        limit, math.nan if client_timeout is None else client_timeout, -1 if gpus is None else gpus,
        _DESCRIBED_ARRAY, token_qs, goodput_kind, goodput_bound)
    rows = stats.tolist()
    late_keys = ("mean", "p50", "p90", "p95", "p99", "max")

    def described(row: list[float]) -> dict[str, Any]:
        if not row[sl.R_COUNT]:
            return dict.fromkeys(late_keys)
        mean, top, p50, p90, p95, p99 = row[sl.R_MEAN:sl.R_PERCENTILES + 4]
        return {"mean": mean, "p50": p50, "p90": p90, "p95": p95, "p99": p99, "max": top}

    def tokens(row: list[float]) -> dict[str, Any]:
        if not row[sl.R_COUNT]:
            return dict.fromkeys(token_keys)
        return dict(zip(token_keys, (row[sl.R_MEAN], *row[sl.R_PERCENTILES:sl.R_PERCENTILES + len(token_qs)]),
                        strict=True))

    groups = range(n_tasks + 1)
    per = sl.PER_GROUP
    stat_rows = {name: [maker(rows[g * per + kind]) for g in groups] for name, kind, maker in (
        ("latency", sl.S_LATENCY, described), ("call_latency", sl.S_CALL_LATENCY, described),
        ("wait", sl.S_WAIT, described), ("service", sl.S_SERVICE, described), ("ttft", sl.S_TTFT, described),
        ("tpot", sl.S_TPOT, described), ("tok_ttft", sl.S_TOK_TTFT, tokens), ("tok_tpot", sl.S_TOK_TPOT, tokens),
        ("tok_itl", sl.S_TOK_TPOT, tokens), ("tok_e2e", sl.S_TOK_E2E, tokens))}
    c = counts.T.tolist()
    every = _group_dicts(
        c[sl.C_PROMPTS], c[sl.C_COMPLETED], c[sl.C_SERVED],
        {"rejected": c[sl.C_REJECTED], "dropped": c[sl.C_DROPPED], "sent_after_timeout": c[sl.C_SENT_LATE]},
        c[sl.C_PREEMPTED], c[sl.C_CALLS], c[sl.C_CALLS_OK],
        [t / n if n else None for t, n in zip(c[sl.C_BATCHED], c[sl.C_BATCHES], strict=True)],
        [(int(n), int(p), int(a), w) for n, p, a, w in zip(c[sl.C_BATCHES], c[sl.C_PADDED], c[sl.C_ACTUAL],
                                                           c[sl.C_WASTE], strict=True)],
        c[sl.C_PRODUCED], c[sl.C_CONSUMED], c[sl.C_GOOD] if options.goodput is not None else None,
        stat_rows, makespan, options)
    by_composition: dict[str, dict[str, Any]] = {}
    first = (n_tasks + 1) * per
    for code, (n, ok) in enumerate(composition.tolist()):
        if n:
            by_composition[classes[code]] = {
                "calls": int(n), "ok": int(ok), "failed": int(n) - int(ok),
                "latency": described(rows[first + 2 * code]), "latency_censored": described(rows[first + 2 * code + 1])}
    gpu_rows = []
    total_busy = 0.0
    for g, (busy, batches, batched, prompt_seconds) in enumerate(gpu.tolist()):
        total_busy += busy
        gpu_rows.append(_gpu_row(g, busy, int(batches), batched / batches if batches else None, prompt_seconds,
                                 makespan))
    return every[0], {str(name): every[i + 1] for i, name in enumerate(layout.task_names)}, by_composition, \
        gpu_rows, total_busy, makespan


#: The composition class of no call (a summary without rules).
_NO_CLASSES = np.zeros(0, dtype=np.int64)


#: Overall's figures, each task's, each composition class's, each GPU's, the GPU seconds and
#: the makespan (:func:`_numpy_figures`, :func:`_compiled_figures`).
Figures = tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, dict[str, Any]], list[dict[str, Any]], float, float]


def _numpy_figures(log: LogColumns, layout: _Layout, limit: float, gpus: int | None, client_timeout: float | None,
                   rules: Compositions, options: TokenOptions) -> Figures:
    """The :data:`Figures` of ``log`` (:func:`summarize_columns`) by numpy's array operations."""
    cols = log.columns
    arrived, started, first, done = (cols[name] for name in _INSTANT_COLUMNS)
    status_code, status_names = cols["status"], log.labels["status"]
    max_tokens = cols["max_tokens"]
    served = _served(log)
    turned = {k: status_code == (list(status_names).index(k) if k in set(status_names) else -2)
              for k in ("rejected", "dropped", "sent_after_timeout")}
    done_ok = served & (done <= limit)
    makespan = float(done[served].max() - arrived.min()) if served.any() else 0.0

    # calls: latency of the last prompt, completed if every prompt is
    call_of, n_calls, per_call = layout.call_of, layout.n_calls, layout.per_call
    call_done = per_call.reduce(np.maximum, np.where(served, done, np.inf), -np.inf)
    call_served = per_call.reduce(np.logical_and, served, True)
    call_arrived = per_call.reduce(np.minimum, arrived, np.inf)
    call_ok = call_served & (call_done <= limit)
    call_latency = call_done
    call_latency -= call_arrived  # (in place: a call's finish is not needed again)
    del call_done, call_arrived
    if client_timeout is not None:
        call_ok &= call_latency <= client_timeout

    # (the log's own integer columns, uncopied; sums of them are taken in 64 bits)
    batch_ids = cols["batch_id"]
    sizes = cols["batch_size"]
    preemptions = cols["preemptions"]
    # tasks in sorted order of name (the summary's order, whichever order the engine coded them)
    task_codes, task_names = layout.task_codes, layout.task_names
    sorted_groups = _SortedGroups() if 0 < task_codes.size <= _ONE_PASS else None

    def groups() -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """Overall's figures and each task's. (A function of its own: what only the groups read
        is freed when it returns, before the GPU figures' temporaries.)"""
        # padding: per batch once (its padded and actual tokens, its task), summed per group
        padded, actual, batch_task = batch_work(batch_ids, cols["prompt_tokens"], max_tokens,
                                                continuous_of(cols["queue"], log.labels["queue"], task_codes, task_names),
                                                task_codes)
        # the token figures' columns (prompt_requests' table, as columns: no frame per group)
        ok_tokens = served & (done <= limit)
        # (the log's integer columns, uncopied: the token figures take them as they are)
        out_tokens, in_tokens = max_tokens, cols["prompt_tokens"]

        def group(rows: np.ndarray | None, task: int | None = None) -> dict[str, Any]:
            """The figures of the prompts at ``rows`` (increasing indices; ``None``: every
            prompt, uncopied), those of task code ``task`` (``None``: every task)."""
            def pick(x: np.ndarray) -> np.ndarray:
                return x if rows is None else x[rows]

            def tpot() -> np.ndarray:
                """The TPOT of the completed prompts that have one (more than one token)."""
                m, d, f, ok = pick(max_tokens), pick(done), pick(first), pick(done_ok)
                out = np.empty(len(m))
                kept = 0
                # In blocks, each block's values packed after the previous block's (never past
                # its own start): temporaries a block long, not a column long.
                for lo in range(0, len(m), _BLOCK):
                    hi = lo + _BLOCK
                    mm = m[lo:hi]
                    with np.errstate(invalid="ignore", divide="ignore"):
                        values = (d[lo:hi] - f[lo:hi]) / (mm - 1)
                    values = values[ok[lo:hi] & (mm > 1) & np.isfinite(values)]
                    out[kept:kept + len(values)] = values
                    kept += len(values)
                return out[:kept]

            columns = {
                "served": lambda: pick(served), "preemptions": lambda: pick(preemptions),
                "latency": lambda: pick(done) - pick(arrived), "wait": lambda: pick(started) - pick(arrived),
                "service": lambda: pick(done) - pick(started), "ttft": lambda: pick(first) - pick(arrived),
                "tpot": tpot,
            }
            in_call: slice | np.ndarray = slice(None)
            if rows is not None:
                in_call = np.zeros(n_calls, dtype=bool)
                in_call[call_of[rows]] = True
            group_batches = pick(batch_ids)
            batched = group_batches >= 0
            group_ok = pick(done_ok)
            figures = _group_summary(columns, group_ok, {k: pick(t) for k, t in turned.items()},
                                     batch_sizes_of(group_batches if batched.all() else group_batches[batched],
                                                    pick(sizes) if batched.all() else pick(sizes)[batched]),
                                     call_latency[in_call], call_ok[in_call], makespan,
                                     ttft_is_latency=np.array_equal(pick(first), pick(done), equal_nan=True),
                                     call_latency_is_latency=rows is None and layout.per_call.one_each
                                     and np.array_equal(call_ok, group_ok))
            del group_batches, batched
            figures["padding"] = paddings[task]
            # Each prompt's TPOT is kept and computed alike here and in the token figures; with
            # every prompt complete (and every latency and TTFT finite), their e2e and TTFT are
            # the latency's and TTFT's values too.
            described = {"tpot": figures["tpot"]}
            if group_ok.all() and all(_finite(figures[k]) for k in ("latency", "ttft")):
                described.update(e2e=figures["latency"], ttft=figures["ttft"])
            figures["tokens"] = _token_figures(pick(ok_tokens), pick(arrived), pick(first), pick(done), pick(out_tokens),
                                               pick(in_tokens), None, options, makespan, described)
            return figures

        # Large logs: each group's padding figures now, and the per-batch arrays freed before
        # the groups' per-prompt columns are made (a large run's summary peaks there).
        paddings: dict[int | None, dict[str, Any]] = {}
        if sorted_groups is None:
            paddings[None] = padding_totals(padded, actual)
            for code in range(len(task_names) if len(task_names) > 1 else 0):
                mine = batch_task == code
                paddings[code] = padding_totals(padded[mine], actual[mine])
            del padded, actual, batch_task
        if sorted_groups is not None:
            every = _groups_one_pass(len(task_names), task_codes, served, done_ok, turned, arrived, started, first, done,
                                     max_tokens, in_tokens, preemptions, batch_ids, sizes, padded, actual, batch_task,
                                     layout, call_latency, call_ok, makespan, options, sorted_groups)
            overall = every[0]
            tasks = {str(name): every[i + 1] for i, name in enumerate(task_names)}
        elif len(task_names) == 1:
            overall = group(None)
            # one task: its prompts are every prompt, in the same order, so its figures are
            # overall's (computed once)
            tasks = {str(task_names[0]): copy.deepcopy(overall)}
        else:
            overall = group(None)
            # The rows of each task, found with one stable sort of the task codes (not a pass over
            # the log per task): each task's rows in log order, so its figures are those a mask
            # would pick.
            order = np.argsort(task_codes, kind="stable").astype(np.int64 if len(task_codes) >= 2**31 else np.int32)
            bounds = np.concatenate([[0], np.cumsum(np.bincount(task_codes, minlength=len(task_names)))])
            tasks = {str(name): group(order[bounds[i]:bounds[i + 1]], i) for i, name in enumerate(task_names)}
            del order
            tasks = {name: tasks[name] for name in (str(n) for n in task_names)}
        return overall, tasks

    overall, tasks = groups()
    gpu_rows, total_busy = _gpu_figures(cols["gpu"], served, started, done, batch_ids, sizes, gpus, makespan)
    # compositions: the figures call_figures(client_calls(log)) gives (a test holds them equal),
    # computed here with numpy because sweeps summarise thousands of runs. A call's task set
    # is a bit mask, mapped to its class (few distinct masks).
    labels = list(rules.labels)
    by_composition: dict[str, dict[str, Any]] = {}
    if labels:  # (without rules no call is classed: nothing to compute)
        call_class = layout.classes(rules)
        # Without a client timeout a failed call is censored at nothing: its latency as it was
        # (calls with a prompt turned away have none and are left out).
        censored = np.where(call_ok, call_latency, client_timeout if client_timeout is not None else call_latency)
    if sorted_groups is not None and labels:
        # every class's statistics in the one pass: calls of no class (code -1) sort first
        classes = call_class + 1
        ok_s, ok_n = sorted_groups.add(call_latency[call_ok], classes[call_ok], len(labels) + 1)
        kept = np.isfinite(censored)
        cen_s, cen_n = sorted_groups.add(censored[kept], classes[kept], len(labels) + 1)
        n_class = np.bincount(classes, minlength=len(labels) + 1).tolist()
        n_ok = np.bincount(classes[call_ok], minlength=len(labels) + 1).tolist()
        present = [code for code in range(len(labels)) if n_class[code + 1]]
        ok_stats = sorted_groups.ask([ok_s[c + 1] for c in present], [ok_n[c + 1] for c in present],
                                     _DESCRIBED, late=True)
        cen_stats = sorted_groups.ask([cen_s[c + 1] for c in present], [cen_n[c + 1] for c in present],
                                      _DESCRIBED, late=True)
        for i, code in enumerate(present):
            by_composition[labels[code]] = {
                "calls": n_class[code + 1], "ok": n_ok[code + 1], "failed": n_class[code + 1] - n_ok[code + 1],
                "latency": ok_stats[i], "latency_censored": cen_stats[i],
            }
    elif labels:
        for code, label in enumerate(labels):
            mine = call_class == code
            if mine.any():
                by_composition[label] = {
                    "calls": int(mine.sum()), "ok": int((mine & call_ok).sum()),
                    "failed": int((mine & ~call_ok).sum()),
                    "latency": describe(call_latency[mine & call_ok]),
                    "latency_censored": describe(censored[mine & np.isfinite(censored)]),
                }
    if sorted_groups is not None:
        sorted_groups.resolve()
    return overall, tasks, by_composition, gpu_rows, total_busy, makespan


#: Windows of the arrival span over which the prefix cache's hit rate is given.
PREFIX_WINDOWS = 10


def prefix_cache_figures(cached: np.ndarray, prompt_tokens: np.ndarray, admitted: np.ndarray, arrived: np.ndarray,
                         task_codes: np.ndarray, task_names: Sequence[str]) -> dict[str, Any]:
    """The prefix cache's figures over the prompts admitted to an engine: ``hit_rate``, the
    share of their prompt tokens found cached (what prefill did not compute), ``cached_tokens``,
    ``prompt_tokens``, ``prompts_hit`` (prompts that found any); overall, per task
    (``tasks``), and over :data:`PREFIX_WINDOWS` equal windows of arrival time (``over_time``:
    each window's start ``t_s`` and hit rate, ``None`` where none was admitted)."""
    cached = cached[admitted].astype(np.int64)
    tokens = prompt_tokens[admitted].astype(np.int64)
    codes, t = task_codes[admitted], arrived[admitted]

    def figures(rows: np.ndarray | None) -> dict[str, Any]:
        c, n = (cached, tokens) if rows is None else (cached[rows], tokens[rows])
        total, hit = int(n.sum()), int(c.sum())
        return {"hit_rate": hit / total if total else None, "cached_tokens": hit, "prompt_tokens": total,
                "prompts": len(c), "prompts_hit": int(np.count_nonzero(c))}

    over_time = []
    if len(t):
        start, span = float(arrived.min()), float(arrived.max() - arrived.min())
        width = span / PREFIX_WINDOWS if span > 0 else 1.0
        window = np.minimum(((t - start) / width).astype(np.int64), PREFIX_WINDOWS - 1)
        hit = np.bincount(window, weights=cached, minlength=PREFIX_WINDOWS)
        total = np.bincount(window, weights=tokens, minlength=PREFIX_WINDOWS)
        over_time = [{"t_s": start + i * width, "hit_rate": float(hit[i] / total[i]) if total[i] else None}
                     for i in range(PREFIX_WINDOWS)]
    return {**figures(None),
            "tasks": {str(name): figures(np.flatnonzero(codes == i)) for i, name in enumerate(task_names)
                      if np.any(codes == i)},
            "over_time": over_time}


def time_average_in_system(log: pd.DataFrame) -> float:
    """Time-average number of prompts in the system over [min arrived_at, max done_at]:
    the integral of (arrivals so far − departures so far), by an event sweep."""
    served = (log["status"].isin(("served", "sent_after_timeout")).to_numpy() if "status" in log
              else np.ones(len(log), dtype=bool))
    arr = np.sort(log["arrived_at"].to_numpy(float)[served])
    dep = np.sort(log["done_at"].to_numpy(float)[served])
    times = np.concatenate([arr, dep])
    steps = np.concatenate([np.ones_like(arr), -np.ones_like(dep)])
    order = np.argsort(times, kind="stable")
    times, steps = times[order], steps[order]
    counts = np.cumsum(steps)
    area = float(np.sum(counts[:-1] * np.diff(times)))
    span = float(times[-1] - times[0])
    return area / span if span > 0 else 0.0


# -- a replica pool ---------------------------------------------------------------------------
def replica_timeline(table: dict[str, Any]) -> pd.DataFrame:
    """The replica counts of a pool's lifecycle table (``log.attrs["replicas"]``, see
    :mod:`simulator.events`) as a step function: one row per instant ``at`` where a count
    changes, holding the counts from then on. ``up`` = replicas with ``requested_at ≤ t <
    stopped_at`` (started, cold or serving or draining: what is paid for); ``requested`` =
    those not draining yet (``t < drain_at``: the count the autoscaler asked for); ``ready``
    = those serving (``ready_at ≤ t < min(drain_at, stopped_at)``)."""
    import pandas as pd

    requested = np.asarray(table["requested_at"], dtype=float)
    stopped = np.asarray(table["stopped_at"], dtype=float)
    drain = np.fmin(np.asarray(table["drain_at"], dtype=float), stopped)
    ready = np.asarray(table["ready_at"], dtype=float)
    has_ready = ~np.isnan(ready) & (ready < drain)
    start, end = float(table["start_at"]), float(table["end_at"])

    def steps(on: np.ndarray, off: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.concatenate([on, off]), np.concatenate([np.ones(len(on)), -np.ones(len(off))])

    at = np.unique(np.concatenate([[start, end], requested, stopped, drain, ready[has_ready]]))
    at = at[(at >= start) & (at <= end)]
    out = {"at": at}
    for name, (t, d) in {"up": steps(requested, stopped), "requested": steps(requested, drain),
                         "ready": steps(ready[has_ready], drain[has_ready])}.items():
        order = np.argsort(t, kind="stable")
        cum = np.cumsum(d[order])
        # the count holding from each instant on: every change at or before it applied
        idx = np.searchsorted(t[order], at, side="right") - 1
        out[name] = np.where(idx >= 0, cum[np.maximum(idx, 0)], 0.0).round().astype(np.int64)
    return pd.DataFrame(out)


def replica_figures(log: pd.DataFrame) -> dict[str, Any]:
    """The figures of a run with a replica pool, from its lifecycle table
    (``log.attrs["replicas"]``) and its ``replica`` / ``dispatched_at`` columns. Over the
    run's span [``start_at``, ``end_at``] (instant 0 to the last completion):

    * ``replica_seconds = Σ (stopped_at − requested_at)`` over replicas (a replica is paid
      from its start, cold start included, to its stop, draining included);
      ``gpu_hours = replica_seconds × gpus_per_replica / 3600``;
    * ``mean_replicas = replica_seconds / (end_at − start_at)``; ``peak_replicas`` the most up
      at once; ``time_at_max_s`` the time the requested count equals ``max_replicas``;
    * ``started`` replicas, of which ``cold_starts`` became ready after a cold start (all but
      the warm ``min_replicas`` at instant 0, whoever started them) and ``cancelled`` were
      stopped while starting;
    * ``pool_wait`` the statistics of ``dispatched_at − arrived_at`` (time in the pool's
      queue) over the prompts a replica took;
    * a prompt's cold-start wait is the part of its pool wait during which no replica was
      ready (the length of [arrived_at, dispatched_at) ∩ {t : ready(t) = 0});
      ``cold_start_wait_s`` sums it over served prompts and ``cold_start_share`` divides
      that by their summed latency (``done_at − arrived_at``).
    """
    from simulator.events import SERVED

    return _replica_figures(log.attrs["replicas"], log["arrived_at"].to_numpy(float),
                            log["dispatched_at"].to_numpy(float), log["done_at"].to_numpy(float),
                            log["status"].isin(SERVED).to_numpy())


def _replica_figures(table: dict[str, Any], arrived: np.ndarray, dispatched: np.ndarray, done: np.ndarray,
                     served: np.ndarray) -> dict[str, Any]:
    """:func:`replica_figures` of the lifecycle table and the log's columns (``served``:
    each prompt's status is one of :data:`simulator.events.SERVED`)."""
    requested = np.asarray(table["requested_at"], dtype=float)
    stopped = np.asarray(table["stopped_at"], dtype=float)
    ready_at = np.asarray(table["ready_at"], dtype=float)
    start, end = float(table["start_at"]), float(table["end_at"])
    span = end - start
    replica_seconds = float(np.sum(stopped - requested))
    line = replica_timeline(table)
    at = line["at"].to_numpy(float)
    widths = np.diff(at)
    at_max = line["requested"].to_numpy()[:-1] == int(table["max_replicas"])
    # F(t): cumulative time with no ready replica up to t (piecewise linear in t)
    none_ready = (line["ready"].to_numpy()[:-1] == 0).astype(float)
    cum = np.concatenate([[0.0], np.cumsum(widths * none_ready)])

    def no_ready_before(t: np.ndarray) -> np.ndarray:
        t = np.clip(t, at[0], at[-1])
        j = np.clip(np.searchsorted(at, t, side="right") - 1, 0, max(len(widths) - 1, 0))
        slope = none_ready[j] if len(none_ready) else np.zeros_like(t)
        return cum[j] + (t - at[j]) * slope

    # the warm replicas: the first min_replicas, ready at instant 0 (every other replica, one
    # the autoscaler started at instant 0 too, went through a cold start)
    warm = (np.asarray(table["replica"]) < int(table["min_replicas"])) & (requested == start)
    served = served & ~np.isnan(dispatched)
    cold_wait = no_ready_before(dispatched[served]) - no_ready_before(arrived[served])
    latency = done[served] - arrived[served]
    total_latency = float(latency.sum())
    cold_total = float(cold_wait.sum())
    return {
        "started": int(len(requested)),
        "cold_starts": int(np.sum(~warm & ~np.isnan(ready_at))),
        "cancelled": int(np.sum(~warm & np.isnan(ready_at) & (stopped < end))),
        "replica_seconds": replica_seconds,
        "gpu_hours": replica_seconds * int(table["gpus_per_replica"]) / 3600.0,
        "mean_replicas": replica_seconds / span if span > 0 else 0.0,
        "peak_replicas": int(line["up"].max()) if len(line) else 0,
        "time_at_max_s": float(np.sum(widths[at_max])),
        "pool_wait": describe(dispatched[served] - arrived[served]),
        "cold_start_wait_s": cold_total,
        "cold_start_share": cold_total / total_latency if total_latency > 0 else 0.0,
    }
