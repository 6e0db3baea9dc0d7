"""What a run costs: GPU-hours provisioned times the price per GPU-hour of the GPU type.

A **price table** maps a GPU type (the names profiles use in ``meta.gpu`` or
``meta.grounded.gpu``: ``a100-sxm``, ``h100-sxm``) to a price per GPU-hour, each with the
offering it is, its source (URL) and the date it was read. The default table is the bundled
``modal-serverless`` (the users' serverless platform); ``--prices NAME|FILE`` takes another
bundled table (``lambda-on-demand``) or the user's own JSON file::

    {"format": "simctl-prices/1", "currency": "USD",
     "gpus": {"h100-sxm": {"usd_per_gpu_hour": 3.9492, "offering": "...",
                           "source": "https://...", "read_on": "2026-11-24"}}}

Only ``usd_per_gpu_hour`` is required of an entry (a positive finite number); the other
fields are text, reported beside every cost.

Cost of a run (:func:`cost_summary`)::

    gpu_hours       = provisioned_gpu_seconds(summary, scenario) * gpus_per_engine(profile) / 3600
    usd             = gpu_hours * usd_per_gpu_hour
    usd_per_1k      = 1000 * usd / completed prompts

A fixed pool is provisioned for the whole run: :func:`provisioned_gpu_seconds` is the one
place that says what was provisioned (a pool whose size changes replaces it by the integral
of its size). Each modeled GPU of a profile composed with tensor parallelism is an engine of
``tp`` GPUs, all of them paid for (:func:`gpus_per_engine`). A profile without a GPU type, or a type the table does not price, gives a cost
of ``None`` with the reason, never an error: only cost-based planning needs a price.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.errors import PriceError
from simulator.profile import Profile
from simulator.scenario import Scenario

FORMAT = "simctl-prices/1"
#: The bundled table used when none is given.
DEFAULT_PRICES = "modal-serverless"
_TEXT_FIELDS = ("offering", "source", "read_on")


@dataclass(frozen=True)
class Price:
    """The price of one GPU type: US dollars per GPU-hour, and where the figure comes from."""

    gpu: str
    usd_per_gpu_hour: float
    offering: str = ""
    source: str = ""
    read_on: str = ""


@dataclass(frozen=True)
class PriceTable:
    """GPU type -> :class:`Price`; ``name`` and ``path`` say which table it is."""

    name: str
    prices: Mapping[str, Price] = field(default_factory=dict)
    path: str | None = None

    def get(self, gpu: str | None) -> Price | None:
        return None if gpu is None else self.prices.get(gpu)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "name": self.name, "currency": "USD",
                "gpus": {g: {"usd_per_gpu_hour": p.usd_per_gpu_hour, "offering": p.offering,
                             "source": p.source, "read_on": p.read_on} for g, p in self.prices.items()}}


def price_table(data: Any, path: str | Path | None = None) -> PriceTable:
    """A :class:`PriceTable` from the parsed JSON ``data`` of ``path``; :class:`PriceError`
    naming the file, the GPU type (record) and the field at fault."""
    if not isinstance(data, dict):
        raise PriceError(path, None, None, f"must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - {"format", "name", "currency", "note", "gpus"})
    if unknown:
        raise PriceError(path, None, unknown[0], "unknown field; valid: format, name, currency, note, gpus")
    if data.get("format", FORMAT) != FORMAT:
        raise PriceError(path, None, "format", f"must be {FORMAT!r}, got {data.get('format')!r}")
    if data.get("currency", "USD") != "USD":
        raise PriceError(path, None, "currency", f"prices are in US dollars ('USD'), got {data.get('currency')!r}")
    gpus = data.get("gpus")
    if not isinstance(gpus, dict) or not gpus:
        raise PriceError(path, None, "gpus", "must be an object of GPU type -> {\"usd_per_gpu_hour\": NUMBER, ...}")
    prices: dict[str, Price] = {}
    for gpu, entry in gpus.items():
        if not isinstance(entry, dict):
            raise PriceError(path, gpu, None, f"must be an object with usd_per_gpu_hour, got {type(entry).__name__}")
        extra = sorted(set(entry) - {"usd_per_gpu_hour", *_TEXT_FIELDS})
        if extra:
            raise PriceError(path, gpu, extra[0], f"unknown field; valid: usd_per_gpu_hour, {', '.join(_TEXT_FIELDS)}")
        value = entry.get("usd_per_gpu_hour")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PriceError(path, gpu, "usd_per_gpu_hour", f"must be a number of US dollars, got {value!r}")
        if not (math.isfinite(value) and value > 0):
            raise PriceError(path, gpu, "usd_per_gpu_hour", f"must be a positive finite number, got {value!r}")
        for name in _TEXT_FIELDS:
            if not isinstance(entry.get(name, ""), str):
                raise PriceError(path, gpu, name, f"must be text, got {type(entry[name]).__name__}")
        prices[str(gpu)] = Price(str(gpu), float(value), *(str(entry.get(n, "")) for n in _TEXT_FIELDS))
    name = data.get("name", Path(path).stem if path is not None else "prices")
    return PriceTable(str(name), prices, None if path is None else str(path))


def load_prices(name_or_path: str | Path | None = None) -> PriceTable:
    """The price table in file ``name_or_path`` (or the bundled table of that name; the
    default table when ``None``); :class:`PriceError` in one line when it is not usable."""
    if name_or_path is None:
        return _default_prices()
    return _read_prices(name_or_path)


def _read_prices(name_or_path: str | Path) -> PriceTable:
    from simulator.bundled import resolve
    from simulator.inputs import read_json

    path = resolve("prices", name_or_path, PriceError)
    return price_table(read_json(path, PriceError, "price table (JSON)"), path)


@functools.lru_cache(maxsize=1)
def _default_prices() -> PriceTable:
    """The bundled default table, read once per process (every sweep row prices its cost)."""
    return _read_prices(DEFAULT_PRICES)


def gpu_type(profile: Profile) -> str | None:
    """The GPU type a profile's service times were measured or composed for: its
    ``meta.gpu``, else ``meta.grounded.gpu`` (what ``simctl profile --gpu`` writes); ``None``
    for a profile that names none (a CPU profile, a hand-calibrated one)."""
    meta = profile.meta or {}
    gpu = meta.get("gpu")
    if gpu is None and isinstance(meta.get("grounded"), Mapping):
        gpu = meta["grounded"].get("gpu")
    return str(gpu) if isinstance(gpu, str) and gpu else None


def gpus_per_engine(profile: Profile) -> int:
    """Physical GPUs behind each GPU of the modeled system: the tensor-parallel degree the
    profile was composed for (``meta.grounded.tp``, or ``meta.system.tp``), else 1. A run's
    ``gpus`` count engines; each engine of a TP-4 profile holds four GPUs, and pays for them."""
    meta = profile.meta or {}
    for key in ("grounded", "system"):
        tp = meta.get(key, {}).get("tp") if isinstance(meta.get(key), Mapping) else None
        if isinstance(tp, int) and not isinstance(tp, bool) and tp >= 1:
            return tp
    return 1


def provisioned_gpu_seconds(summary: Mapping[str, Any], scenario: Scenario) -> float:
    """GPU-seconds provisioned for the run, busy or idle, read off its summary
    (:func:`simulator.metrics.summarize`). Without a replica pool: ``gpus × makespan_s``, a
    fixed set of ``scenario.gpus`` GPUs held from the first arrival to the last completion.
    With one: every replica's ``scenario.gpus`` from its start (cold start included) to its
    stop (draining included), ``replica_seconds × gpus`` of the pool's figures
    (:func:`simulator.metrics.replica_figures`). GPU-hours = this / 3600."""
    held = summary["replicas"]["replica_seconds"] if "replicas" in summary else summary["makespan_s"]
    return float(scenario.gpus) * float(held)


def cost_summary(summary: Mapping[str, Any], scenario: Scenario, profile: Profile,
                 prices: PriceTable | None) -> dict[str, Any]:
    """The ``cost`` group of ``summary`` (a run's figures, :func:`simulator.metrics.summarize`;
    formulas in the module docstring): ``gpu_type``,
    ``gpu_hours`` (every GPU of a tensor-parallel engine counted: :func:`gpus_per_engine`), ``usd_per_gpu_hour``, ``usd``, ``usd_per_1k_prompts`` (per 1,000 prompts
    completed), the price's ``offering``/``source``/``read_on``, the table's name, and
    ``unknown`` (``None``, or why the dollars are ``None``)."""
    gpu = gpu_type(profile)
    gpu_hours = provisioned_gpu_seconds(summary, scenario) * gpus_per_engine(profile) / 3600.0
    completed = int(summary["overall"]["completed"])  # served by the deadline
    price = prices.get(gpu) if prices is not None else None
    out: dict[str, Any] = {"gpu_type": gpu, "gpu_hours": gpu_hours, "usd_per_gpu_hour": None, "usd": None,
                           "usd_per_1k_prompts": None, "prices": None if prices is None else prices.name,
                           "offering": None, "source": None, "read_on": None, "unknown": None}
    if gpu is None:
        out["unknown"] = f"profile {profile.name!r} names no GPU type (meta.gpu)"
        return out
    if price is None:
        known = ", ".join(sorted(prices.prices)) if prices is not None else "none"
        out["unknown"] = f"no price for GPU type {gpu!r} in price table " \
                         f"{prices.name if prices is not None else '(none)'} (it prices: {known})"
        return out
    usd = gpu_hours * price.usd_per_gpu_hour
    out.update(usd_per_gpu_hour=price.usd_per_gpu_hour, usd=usd,
               usd_per_1k_prompts=float(1000.0 * usd / completed) if completed else None,
               offering=price.offering, source=price.source, read_on=price.read_on)
    return out


def prices_reference(names: tuple[str, ...] = ("modal-serverless", "lambda-on-demand")) -> str:
    """The bundled price tables as one Markdown table (docs/sweep-and-plan.md holds it)."""
    rows = ["| table | GPU type | $ per GPU-hour | offering | source | read on |", "|---|---|---|---|---|---|"]
    for name in names:
        table = load_prices(name)
        for p in table.prices.values():
            rows.append(f"| `{table.name}` | `{p.gpu}` | {p.usd_per_gpu_hour:g} | {p.offering} | {p.source} | {p.read_on} |")
    return "\n".join(rows) + "\n"


def require_price(profile: Profile, prices: PriceTable) -> Price:
    """The price of ``profile``'s GPU type, or :class:`PriceError` saying why there is none
    (cost-based planning needs one)."""
    gpu = gpu_type(profile)
    if gpu is None:
        raise PriceError(profile.path, None, "meta.gpu", f"profile {profile.name!r} names no GPU type, so it has "
                         "no price; use a profile made for a GPU (simctl profile --gpu TYPE) or --objective fewest-gpus")
    price = prices.get(gpu)
    if price is None:
        raise PriceError(prices.path, gpu, None, f"the price table {prices.name!r} has no price for GPU type "
                         f"{gpu!r} (profile {profile.name!r}); it prices: {', '.join(sorted(prices.prices))}")
    return price


__all__ = ["DEFAULT_PRICES", "Price", "PriceError", "PriceTable", "cost_summary", "gpu_type", "gpus_per_engine", "load_prices",
           "price_table", "prices_reference", "provisioned_gpu_seconds", "require_price"]
