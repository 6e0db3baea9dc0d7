"""Sweeps: replay one trace under the cross product of configuration axes, in parallel.

A sweep is a :class:`SweepSpec` (axes and seeds) over a *base*: the trace, the profile and
a base scenario (built-ins or a scenario file). Task axes (``flush``, ``topology``,
``max_batch`` ...) are applied as per-task overrides to ``--task`` if given, else to every
task served on a GPU (CPU tasks keep the base scenario's settings: the questions a sweep
answers are about GPU queues); run axes (``gpus``, ``gpu_sharing``, ``rate_scale``) to the
run. Each (configuration, seed) is one replay and one result row: every axis value plus the
replay summary flattened to dotted names (``tasks.infobench.latency.p95``).

Results are durable as they arrive: each finished row is appended to a journal beside the
output (``OUT.journal``, one JSON line each, flushed: the row's values, after a line of its
keys written once per key order), and the Parquet file is (re)written
atomically from everything done when the sweep ends or is interrupted. Re-running the same
command resumes: rows already in the file or journal are skipped. The Parquet metadata
holds content hashes of the trace, the profile and the base scenario; a file from a
different base is refused rather than mixed.

Executors: a local process pool (``workers`` processes, forked so imports and the loaded
trace and profile are shared, not re-done per configuration; with no ``workers`` given, every
core unless the replays are few and small: :func:`default_workers`), or a ``dask.distributed``
cluster (``cluster="tcp://host:8786"``, or a ``distributed.Client``), which receives the
base once (scattered) and the configurations as tasks.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import hashlib
import itertools
import json
import math
import multiprocessing
import os
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from simulator import inputs
from simulator.cost import PriceTable
from simulator.errors import OutputError, ScenarioError, SimctlError, SweepError
from simulator.interrupts import release_inherited_sigint, sigint_deferred
from simulator.metrics import FigureError, TokenOptions, figure_key
from simulator.outputs import os_reason, output_lock, reported, write_through
from simulator.profile import Profile
from simulator.replay import simulate_and_summarize
from simulator.scenario import Scenario, check_tasks
from simulator.settings import AXES, RUN_AXES, SETTINGS, TASK_AXES, ignored_by
from simulator.trace.model import Trace

if TYPE_CHECKING:
    import pandas as pd

META_KEY = b"simctl.sweep"
#: Every setting a sweep may vary, by name: its type parses an axis's values, its check checks them.
_SETTING = {s.name: s for s in SETTINGS if s.sweepable}


# -- what a sweep is ------------------------------------------------------------------


@dataclass(frozen=True)
class SweepSpec:
    """Axis name -> values (in order), the seeds, and the task the task axes apply to."""

    axes: Mapping[str, tuple[Any, ...]]
    seeds: tuple[int, ...] = (0,)
    task: str | None = None

    def __post_init__(self) -> None:
        for name, values in self.axes.items():
            if name not in AXES:
                raise SweepError(None, None, name, f"unknown sweep axis; valid: {', '.join(AXES)}")
            if not values:
                raise SweepError(None, None, name, "needs at least one value")
        if not self.seeds:
            raise SweepError(None, None, "seeds", "needs at least one seed")

    def configurations(self) -> list[dict[str, Any]]:
        """The cross product, in axis order (the last axis varies fastest).

        An axis the configuration's topology never reads (:func:`simulator.settings.ignored_by`:
        the flush window of ``continuous``, say) is left out of that configuration, and the
        configurations this makes equal are kept once, so no replay is spent on a value that
        cannot change the result."""
        return [dict(c) for c in self._keyed().values()]

    def _keyed(self) -> dict[str, dict[str, Any]]:
        """:meth:`configurations` by their :func:`config_key`, made once per spec (a sweep
        reads them to check, then to run)."""
        known = self.__dict__.get("_configurations")
        if known is not None:
            return known
        names = list(self.axes)
        seen: dict[str, dict[str, Any]] = {}
        ignored = {t: ignored_by(t) for t in self.axes.get("topology", ()) if isinstance(t, str)}
        for values in itertools.product(*self.axes.values()):
            config = dict(zip(names, values, strict=True))
            topology = config.get("topology")
            if isinstance(topology, str):
                config = {k: v for k, v in config.items() if k not in ignored[topology]}
            seen.setdefault(config_key(config), config)
        self.__dict__["_configurations"] = seen  # (a cache, not a field: the spec stays frozen)
        return seen

    def jobs(self) -> list[tuple[str, dict[str, Any], int]]:
        """``(config_key, config, seed)`` for every configuration and seed."""
        return [(k, dict(c), s) for k, c in self._keyed().items() for s in self.seeds]


#: :func:`config_key`'s encoder, made once (``json.dumps`` with an option makes one a call).
_KEY_ENCODER = json.JSONEncoder(sort_keys=True)


def config_key(config: Mapping[str, Any]) -> str:
    """A canonical text key of a configuration (sorted axis names, JSON values): the text of
    ``json.dumps(config, sort_keys=True)``."""
    return _KEY_ENCODER.encode(dict(config))


def content_hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def trace_hash(trace: Trace) -> str:
    """Hash of what a replay sees of the trace (times, tasks, token counts), not of its file."""
    return content_hash([[c.id, c.t, [[p.task, p.prompt_tokens, p.max_tokens] for p in c.prompts]]
                         for c in trace.calls])


@dataclass(frozen=True)
class Base:
    """What every configuration of a sweep shares. ``prices``: the price table of every
    row's cost figures (``None``: the default table, :func:`simulator.cost.load_prices`)."""

    trace: Trace
    profile: Profile
    scenario: Scenario
    prices: PriceTable | None = None
    #: the token figures' percentiles and goodput SLO (``None``: the defaults, no goodput)
    tokens: TokenOptions | None = None
    #: profile variants (:mod:`simulator.uncertainty`): a configuration with ``world = i``
    #: replays ``worlds[i]`` instead of ``profile``
    worlds: tuple[Profile, ...] = ()

    def profile_of(self, config: Mapping[str, Any]) -> Profile:
        """The profile a configuration replays: its world's variant, else :attr:`profile`."""
        world = config.get("world")
        return self.profile if world is None else self.worlds[int(world)]

    def hashes(self) -> dict[str, str]:
        from simulator.cost import load_prices

        prices = self.prices if self.prices is not None else load_prices()
        return {"trace": trace_hash(self.trace), "profile": content_hash(self.profile.to_dict()),
                "scenario": content_hash(self.scenario.to_dict()), "prices": content_hash(prices.to_dict()),
                # (only when chosen: files written with the defaults keep their hashes)
                **({"tokens": content_hash(self.tokens.to_dict())} if self.tokens is not None else {})}

    def swept_tasks(self, task: str | None) -> list[str]:
        if task is not None:
            if task not in self.trace.tasks:
                raise SweepError(None, None, "task", f"the trace has no task {task!r} (it has: {', '.join(self.trace.tasks)})")
            return [task]
        return [t for t in self.trace.tasks
                if (self.scenario.for_task(t).resource or self.profile.task(t).resource) == "gpu"]


def scenario_for(base: Base, config: Mapping[str, Any], task: str | None) -> Scenario:
    """The base scenario with ``config`` applied (task axes as per-task overrides)."""
    task_values = {k: v for k, v in config.items() if k in TASK_AXES}
    run_values = {k: v for k, v in config.items() if k in RUN_AXES}
    tasks = {t: dict(o) for t, o in base.scenario.tasks.items()}
    for t in base.swept_tasks(task):
        tasks[t] = {**tasks.get(t, {}), **task_values}
    return replace(base.scenario, tasks=tasks, **run_values)


def validate(spec: SweepSpec, base: Base) -> None:
    """Check every axis value once (types, ranges, registered names), then the scenario of
    every configuration (settings that contradict each other, such as a replica pool's
    settings without a pool), before any replay."""
    check_tasks(base.scenario, base.profile.tasks, base.trace.tasks, f"the profile {base.profile.name}")
    base.swept_tasks(spec.task)
    for name, values in spec.axes.items():
        for value in values:
            try:
                _SETTING[name].check(value)
            except ScenarioError as exc:
                raise SweepError(None, None, name, exc.message) from None
    from simulator.model.replicas import check_pool_settings

    # The pool settings are run settings: configurations that differ only in task axes share
    # one check (a sweep of 10,000 configurations has a few dozen run-axis combinations).
    checked: set[str] = set()
    for config in spec.configurations():
        run_part = {k: v for k, v in config.items() if k in RUN_AXES}
        key = config_key(run_part)
        if key not in checked:
            checked.add(key)
            check_pool_settings(scenario_for(base, run_part, spec.task))


# -- one replay -------------------------------------------------------------------------


#: The types of a summary's leaf values, told apart from mappings and lists without an
#: abstract-class check per value (a sweep flattens a summary of hundreds of leaves per row).
_LEAF_TYPES = frozenset({float, int, str, bool, type(None)})


def flatten(summary: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"tasks": {"a": {"latency": {"p95": 1}}}}`` -> ``{"tasks.a.latency.p95": 1}``; lists by index."""
    out: dict[str, Any] = {}
    _flatten_into(out, summary, prefix, prefix == "")
    return out


def _flatten_into(out: dict[str, Any], summary: Mapping[str, Any], prefix: str, top: bool) -> None:
    leaf_types = _LEAF_TYPES
    for key, value in summary.items():
        if top and key == "config":
            continue
        kind = type(value)
        if kind in leaf_types:
            out[f"{prefix}{key}"] = value
        elif kind is dict or isinstance(value, Mapping):
            _flatten_into(out, value, f"{prefix}{key}.", False)
        elif kind is list or isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, Mapping):
                    inner = f"{prefix}{key}.{i}."
                    for k, v in item.items():  # (a list's mappings, such as the GPUs, leave out their id)
                        if k == "id":
                            continue
                        if type(v) in leaf_types:
                            out[f"{inner}{k}"] = v
                        else:
                            _flatten_into(out, {k: v}, inner, False)
                else:
                    out[f"{prefix}{key}.{i}"] = item
        else:
            out[f"{prefix}{key}"] = value


_BASE: Base | None = None


def _set_base(base: Base) -> None:
    global _BASE
    _BASE = base


def _worker_start(base: Base, parent: int) -> None:
    """A pool worker's start: it dies with the sweep (a killed sweep leaves no worker blocked
    on a queue nobody feeds), then takes the sweep's base."""
    die_with_parent(parent)
    release_inherited_sigint()  # forked while the sweep held Ctrl-C
    _set_base(base)


def die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when its parent ends (Linux ``PR_SET_PDEATHSIG``);
    exit at once if the parent ``parent`` has ended already. Elsewhere, nothing."""
    import ctypes
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def run_job(job: tuple[str, dict[str, Any], int], task: str | None, base: Base | None = None) -> dict[str, Any]:
    """Replay one (configuration, seed); the result row. ``base`` defaults to the process's."""
    base = base or _BASE
    if base is None:
        raise RuntimeError("run_job needs a base: pass one, or set the process's with _set_base")
    key, config, seed = job
    scenario = scenario_for(base, config, task)
    # (no event log frame: the row needs the summary alone)
    _, summary = simulate_and_summarize(base.trace, scenario, base.profile_of(config), seed, prices=base.prices,
                                        tokens=base.tokens, keep_log=False)
    row = {"config_key": key, "seed": seed, **config}
    _flatten_into(row, summary, "", True)  # (the row's figures: flatten(summary), made in place)
    return row


# -- durable results --------------------------------------------------------------------


def _json_object(text: str | bytes) -> dict[str, Any]:
    """The JSON object ``text`` holds; ``{}`` if it holds something else or is cut short."""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    return obj if isinstance(obj, dict) else {}


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as fh:  # our own journal, checked before appending to it
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) == b"\n"


class ResultStore:
    """The Parquet results file and its journal; see the module docstring."""

    def __init__(self, path: str | Path, meta: dict[str, Any], force: bool = False) -> None:
        self.path = Path(path)
        self.journal = self.path.with_name(self.path.name + ".journal")
        self.meta = meta
        self.rows: list[dict[str, Any]] = []
        # rows the pool's workers sent, column by column as they come (see Columns)
        self.columns = Columns()
        # The journal's key lines by their keys, numbered in order (a row line names its own)
        self.key_lines: dict[tuple[str, ...], int] = {}
        if force:
            self.journal.unlink(missing_ok=True)
        else:
            self._load()
        self.resumed = len(self.rows)
        self._handle: TextIO | None = None

    def _check(self, found: Mapping[str, Any], where: Path) -> None:
        # Files written before cost figures were recorded have no prices hash: not checked.
        for part in ("trace", "profile", "scenario", "prices"):
            if part == "prices" and part not in found.get("hashes", {}):
                continue
            if found.get("hashes", {}).get(part) != self.meta["hashes"][part]:
                raise SweepError(where, None, None,
                                 f"holds results for a different {part} (content hash "
                                 f"{found.get('hashes', {}).get(part)} != {self.meta['hashes'][part]}); "
                                 f"use another --out, or --force to start over")
        # Files written before the axes were recorded are checked by their hashes alone.
        if "axes" in found and found["axes"] != self.meta.get("axes"):
            raise SweepError(where, None, "axes", f"holds results over the axes {', '.join(found['axes']) or '(none)'}, "
                             f"not {', '.join(self.meta.get('axes') or []) or '(none)'}; rows of different axes cannot "
                             f"share a file: use another --out, or --force to start over")
        if found.get("task") != self.meta["task"]:
            raise SweepError(where, None, "task", f"holds results whose axes apply to task "
                             f"{found.get('task')!r}, not {self.meta['task']!r}; use another --out or --force")

    def _load(self) -> None:
        if self.path.exists():
            try:
                table = inputs.read_parquet(self.path, SweepError, "sweep results file")
            except SweepError as exc:
                raise SweepError(self.path, None, None, f"{exc.message}; use --force to overwrite it") from None
            raw = (table.schema.metadata or {}).get(META_KEY)
            if raw is None:
                raise SweepError(self.path, None, None, "is not a simctl sweep results file; use --force to overwrite it")
            self._check(_json_object(raw), self.path)
            self.rows.extend(table.to_pandas().to_dict("records"))
        if self.journal.exists():
            lines = inputs.read_text(self.journal, SweepError, "sweep journal").splitlines()
            head = _json_object(lines[0]) if lines else {}
            if lines and not head:
                if len(lines) > 1:
                    raise SweepError(self.journal, "line 1", None, "is not a simctl sweep journal's header; "
                                     "use another --out, or --force to start over")
                # a header cut short by an interruption: no run had finished. The journal
                # (our own, holding no row) starts again, header first; rows appended after
                # the torn header would be refused on the next resume.
                lines = []
                self.journal.unlink(missing_ok=True)
            if lines:
                self._check(head, self.journal)
                keys_of: list[tuple[str, ...]] = []
                for line in lines[1:]:
                    row = _journal_row(line, keys_of)
                    # A line cut short by an interruption (or glued to the next by one): that
                    # run alone is redone; the lines after it still count.
                    if row is not None and "config_key" in row and isinstance(row.get("seed"), int):
                        self.rows.append(row)
                self.key_lines = {keys: i for i, keys in enumerate(keys_of)}

    def done(self) -> set[tuple[str, int]]:
        return {(r["config_key"], int(r["seed"])) for r in self.rows} | self.columns.keys()

    def add(self, row: dict[str, Any]) -> None:
        """Save one finished row (journal line written and flushed)."""
        self.add_many([row])

    def add_many(self, rows: Sequence[dict[str, Any]] | Rows, lines: Sequence[str] | None = None) -> None:
        """Save finished rows with one write and flush; ``lines``: the :func:`values_line` of
        each row's values, in the order iterating ``rows`` gives them, when already made (by
        the workers that ran them)."""
        if not len(rows):
            return
        packed = rows if isinstance(rows, Rows) else Rows(rows)
        values_lines = iter(lines if lines is not None else packed.values_lines())
        journal: list[str] = []
        new_keys: dict[tuple[str, ...], int] = {}
        for keys, block in packed.blocks.items():
            number = self.key_lines.get(keys, new_keys.get(keys))
            if number is None:  # a key order new to the journal: its line first
                number = new_keys[keys] = len(self.key_lines) + len(new_keys)
                journal.append(json.dumps({JOURNAL_KEYS: list(keys)}))
            # "[values...]" -> "[number,values...]" (a row has a config_key: never empty)
            journal.extend(f"[{number},{next(values_lines)[1:]}" for _ in block)
        try:
            self._append(journal)
            self.key_lines.update(new_keys)  # (numbered once their lines are written)
        except OSError as exc:  # disk full, quota, size limit: one line naming the results file
            raise OutputError(self.path, None, None, f"cannot save a finished row in {self.journal.name}: "
                              f"{os_reason(exc)}; the rows saved so far are kept, "
                              "run the same command again to resume") from None
        if isinstance(rows, Rows):
            self.columns.add(rows)
        else:
            self.rows.extend(rows)

    def _append(self, lines: Sequence[str]) -> None:
        if self._handle is None:
            fresh = not self.journal.exists() or self.journal.stat().st_size == 0
            torn = not fresh and not _ends_with_newline(self.journal)
            # Appending to our own journal (an output, not a file the user wrote).
            self._handle = open(self.journal, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
            if fresh:
                self._handle.write(json.dumps(self.meta) + "\n")
            elif torn:  # end the line an interruption cut short, so the next row stands alone
                self._handle.write("\n")
        self._handle.write("".join(line + "\n" for line in lines))
        self._handle.flush()

    def frame(self) -> pd.DataFrame:
        import pandas as pd

        df = pd.DataFrame(self.rows)
        if len(self.columns):
            df = self.columns.frame() if df.empty else pd.concat([df, self.columns.frame()], ignore_index=True, sort=False)
        if df.empty:
            return df
        df = df.drop_duplicates(["config_key", "seed"], keep="first")
        return df.sort_values(["config_key", "seed"], kind="stable").reset_index(drop=True)

    def close(self, failed: bool = False) -> pd.DataFrame:
        """Write the Parquet file from every row done; remove the journal. A sweep that
        ``failed`` with no row done at all writes nothing (an error leaves no output, and a
        file that was there stays as it was)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from simulator.outputs import open_output

        if self._handle is not None:
            handle, self._handle = self._handle, None
            with contextlib.suppress(OSError):  # every row was flushed as it came: nothing is lost
                handle.close()
        df = self.frame()
        if df.empty and (failed or not self.path.exists()):  # nothing ran: no file, or the old one kept
            self.journal.unlink(missing_ok=True)
            return df
        table = pa.Table.from_pandas(df, preserve_index=False)
        table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                               META_KEY: json.dumps(self.meta).encode()})
        with open_output(self.path, "wb", force=True) as fh:
            # Dictionary encoding for the columns of names alone: a figure's values are mostly
            # distinct, and trying it on each of a few hundred figure columns was most of the write.
            names = [f.name for f in table.schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
            pq.write_table(table, fh, use_dictionary=names)
        self.journal.unlink(missing_ok=True)
        return df


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


_ENCODER: Any = None

#: The one key of a journal line that lists the keys of the row lines after it that name it.
JOURNAL_KEYS = "keys"


def values_line(values: Sequence[Any]) -> str:
    """A row's values as the JSON list a journal line holds (after the number of its key
    line: :meth:`ResultStore.add_many`), read back by :class:`ResultStore`.

    A row's keys are a line of their own, once per key order, not repeated on every row's
    line: they were more than half of a journal's bytes (about 10 KB a row of a few hundred
    dotted names). msgspec writes the values several times faster than :func:`json.dumps`
    (the journal was a sweep's largest cost after the replays), but writes NaN and infinity
    as ``null``; a row holding one (a figure of prompts that never finished) goes through
    :func:`json.dumps`, whose ``NaN``/``Infinity`` read back as the same floats."""
    global _ENCODER
    if _ENCODER is None:
        import msgspec

        _ENCODER = msgspec.json.Encoder(enc_hook=_json_default)
    text = _ENCODER.encode(values)
    # Every None is a null; a null more (a NaN or infinity, or the word in a string) sends
    # the row through json.dumps. Counting beats a type check per value.
    if text.count(b"null") != values.count(None) \
            and any(isinstance(v, float) and not math.isfinite(v) for v in values):
        return json.dumps(list(values), default=_json_default)
    return text.decode()


def _journal_row(line: str, keys_of: list[tuple[str, ...]]) -> dict[str, Any] | None:
    """The row a journal line holds (``None`` for another line, or one cut short); a line of
    keys is added to ``keys_of``, the key lines read so far. A row line is ``[n, values...]``
    with the keys of key line ``n``; a line that is a whole row (a journal written before
    keys had lines of their own) is read as it is."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if isinstance(obj, list):
        if obj and type(obj[0]) is int and 0 <= obj[0] < len(keys_of) and len(obj) - 1 == len(keys_of[obj[0]]):
            return dict(zip(keys_of[obj[0]], obj[1:], strict=True))
        return None
    if not isinstance(obj, dict):
        return None
    if set(obj) == {JOURNAL_KEYS}:
        keys = obj[JOURNAL_KEYS]
        if isinstance(keys, list) and all(isinstance(k, str) for k in keys):
            keys_of.append(tuple(keys))
        return None
    return obj


# -- running ----------------------------------------------------------------------------


class SweepInterrupted(KeyboardInterrupt):
    """A sweep stopped by Ctrl-C (or SIGTERM made one) once every finished row was saved."""

    def __init__(self, out: Path, kept: int, ran: int, total: int) -> None:
        super().__init__(f"{out}: {kept} of {total} rows kept")
        self.out, self.kept, self.ran, self.total = out, kept, ran, total


@dataclass
class SweepResult:
    frame: pd.DataFrame
    ran: int
    skipped: int
    total: int


class Rows:
    """Finished rows as they travel between processes: per distinct key order, the keys once
    and each row's values (a row has a few hundred keys; pickled once a row, they were most
    of what a worker sent back). Iterating gives the rows as dicts."""

    def __init__(self, rows: Iterable[Mapping[str, Any]] = ()) -> None:
        self.blocks: dict[tuple[str, ...], list[tuple[Any, ...]]] = {}
        for row in rows:
            self.blocks.setdefault(tuple(row), []).append(tuple(row.values()))

    def __len__(self) -> int:
        return sum(len(values) for values in self.blocks.values())

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for keys, values in self.blocks.items():
            for v in values:
                yield dict(zip(keys, v, strict=True))

    def values_lines(self) -> list[str]:
        """Each row's :func:`values_line`, in the order iterating gives the rows."""
        return [values_line(v) for values in self.blocks.values() for v in values]

    def frame(self) -> pd.DataFrame:
        """The rows as a frame, as ``pd.DataFrame`` of the rows as dicts makes it (:class:`Columns`)."""
        columns = Columns()
        columns.add(self)
        return columns.frame()


#: The types of the values of a column :class:`Columns` makes an array of.
_NUMBER_TYPES = frozenset({int, float, type(None)})


class Columns:
    """Rows' values column by column, added a batch of :class:`Rows` at a time, made into the
    frame ``pd.DataFrame`` would make of the rows as dicts (columns in order of first
    appearance, a column missing from some rows NaN there, the same dtypes and values) with
    no dict a row and no value-by-value inference by pandas.

    A sweep's frame is thousands of rows of a few hundred figures. Made at the end from the
    rows' values (a Python object each, all held until then), it was most of the time a
    finished sweep took to write its file. Here each column's values are typed
    :data:`SEGMENT` rows at a time as batches come in, while the pool's workers are still
    running replays, and only the arrays are kept: the end has a last segment and one join
    a column left. A column of numbers alone (``None`` is NaN)
    is an array, int64 where every value is an int, else float64; any other column is its
    values, for pandas to infer."""

    #: Rows whose values are typed together: few enough that the last segment, typed at
    #: the end, is small; enough that the work per segment is the values', not the calls'.
    SEGMENT = 1024

    def __init__(self) -> None:
        #: the rows not yet typed, per key order (a batch's rows are added to them as they
        #: are: a column at a time is a segment's work, not a batch's)
        self.pending = Rows()
        #: per column, its typed segments: (the types of its values, their array or, where
        #: they are not numbers alone or hold an int beyond int64, the values themselves;
        #: the values as well where the array cannot give them back: of numbers of several
        #: types, None among them)
        self.segments: dict[str, list[tuple[frozenset[type], np.ndarray | list[Any], list[Any] | None]]] = {}
        self.rows = 0
        self.typed = 0  # rows typed into segments so far

    def __len__(self) -> int:
        return self.rows

    def keys(self) -> set[tuple[str, int]]:
        """The ``(config_key, seed)`` of every row."""
        if not self.rows:
            return set()
        self._type_segment()
        return set(zip(self._values("config_key"), map(int, self._values("seed")), strict=True))

    def add(self, rows: Rows) -> None:
        for keys, values in rows.blocks.items():
            self.pending.blocks.setdefault(keys, []).extend(values)
            self.rows += len(values)
        if self.rows - self.typed >= self.SEGMENT:
            self._type_segment()

    def _type_segment(self) -> None:
        """Type the pending rows' values into a segment of every column."""
        if self.typed == self.rows:
            return
        columns: dict[str, list[Any]] = {}
        done = 0
        for keys, values in self.pending.blocks.items():
            for key, column in zip(keys, zip(*values, strict=True), strict=True):
                known = columns.get(key)
                if known is None:
                    known = columns[key] = [math.nan] * done
                known.extend(column)
            done += len(values)
            for known in columns.values():
                if len(known) < done:  # a column this block's rows lack: NaN there
                    known.extend([math.nan] * (done - len(known)))
        for key in self.segments.keys() - columns.keys():  # a column none of these rows has
            columns[key] = [math.nan] * done
        for key, values in columns.items():
            segments = self.segments.get(key)
            if segments is None:  # a column new to the frame: NaN in every row before
                segments = self.segments[key] = [(frozenset({float}), np.full(self.typed, math.nan), None)] \
                    if self.typed else []
            types = frozenset(map(type, values))
            part = _typed(values, types)
            segments.append((types, part, values if len(types) > 1 and isinstance(part, np.ndarray) else None))
        self.pending = Rows()
        self.typed = self.rows

    def _values(self, key: str) -> list[Any]:
        """Column ``key``'s values as they came."""
        out: list[Any] = []
        for _, part, values in self.segments[key]:
            out.extend(values if values is not None else part.tolist() if isinstance(part, np.ndarray) else part)
        return out

    def frame(self) -> pd.DataFrame:
        import pandas as pd

        self._type_segment()
        return pd.DataFrame({key: self._column(key) for key in self.segments})

    def _column(self, key: str) -> np.ndarray | list[Any]:
        segments = self.segments[key]
        types = frozenset().union(*(kinds for kinds, _, _ in segments))
        if not types <= _NUMBER_TYPES or types <= {type(None)} \
                or any(isinstance(part, list) and not kinds <= {type(None)} for kinds, part, _ in segments):
            return self._values(key)  # (names, flags, an int beyond int64 among numbers: pandas infers them)
        # numbers: int64 where ints alone, else float64, None NaN (a segment of None alone
        # was left as values)
        parts = [part if isinstance(part, np.ndarray) else np.full(len(part), math.nan) for _, part, _ in segments]
        joined = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return joined if types == {int} else joined.astype(np.float64, copy=False)


def _typed(values: list[Any], types: frozenset[type] | None = None) -> np.ndarray | list[Any]:
    """A column's values as the array pandas would make of them, where they are numbers
    (``None`` is NaN; ints alone are int64, else float64), made by numpy in one call; other
    columns, and numbers with an int beyond int64, as they are, for pandas to infer.
    ``types``: the types of the values, where known."""
    if types is None:
        types = frozenset(map(type, values))
    if not types <= _NUMBER_TYPES or types <= {type(None)}:  # (None alone: pandas keeps an object column)
        return values
    # (floats alone or ints alone, read one by one: twice as fast as np.array)
    if types == {int}:
        try:
            return np.fromiter(values, dtype=np.int64, count=len(values))
        except OverflowError:
            return values
    if types == {float}:
        return np.fromiter(values, dtype=np.float64, count=len(values))
    array = np.array(values, dtype=np.float64)
    if int in types and (np.abs(array) >= 2.0 ** 63).any() \
            and any(type(v) is int and not -2 ** 63 <= v < 2 ** 63 for v in values):
        return values
    return array


#: Rows with their values' journal lines (:func:`values_line`), as a batch of finished replays comes back.
Batch = tuple[list[dict[str, Any]] | Rows, list[str] | None]

#: Most replays a pool worker runs per task it is sent: enough that the round trip to the
#: parent and the parent's write are small beside a chunk's replays, few enough that a Ctrl-C
#: loses little and the last chunks still spread over every worker.
LARGEST_CHUNK = 32


def chunk_size(jobs: int, workers: int) -> int:
    """Replays per pool task: at least 8 tasks per worker (the load stays balanced when
    replays differ in cost), at most :data:`LARGEST_CHUNK`."""
    return max(1, min(LARGEST_CHUNK, jobs // (8 * max(1, workers))))


def default_workers(jobs: int, prompts: int) -> int:
    """Local processes for ``jobs`` replays of a trace of ``prompts`` prompts when none were
    asked for: every core, unless the replays together are fewer prompts than
    :data:`~simulator.model.engine.SMALL_RUN_PROMPTS`. Those take this process well under
    a second on the reference engine, about what starting a pool costs, and a forked worker
    starts with this process's count of small runs, so each worker might load the compiled
    kernel for its share (a plan starts a pool per step); here they run in this process."""
    from simulator.model.engine import SMALL_RUN_PROMPTS

    if jobs * prompts < SMALL_RUN_PROMPTS:
        return 1
    return os.cpu_count() or 1


def _local_results(jobs: list, task: str | None, base: Base, workers: int | None,
                   lines: bool = True) -> Iterator[Batch]:
    """Replay ``jobs`` on ``workers`` local processes (``None``: :func:`default_workers`);
    batches of rows as they finish, with their values' journal lines when the pool's workers ran
    them and ``lines`` asks for them (``None`` otherwise)."""
    from simulator.model.engine import expect_prompts

    # a grid of more than a small run's prompts takes the compiled kernel from its first job
    expect_prompts(len(jobs) * base.trace.n_prompts)
    if workers is None:
        workers = default_workers(len(jobs), base.trace.n_prompts)
    if workers <= 1 or len(jobs) <= 1:
        _set_base(base)
        for job in jobs:  # in this process a row is saved as soon as its replay ends
            yield [run_job(job, task)], None
        return
    ctx = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
    if ctx is not None:
        # The first job runs here: forked workers then inherit the loaded compiled kernel
        # instead of each loading it again (a plan makes a pool per step).
        _set_base(base)
        yield [run_job(jobs[0], task)], None
        jobs = jobs[1:]
    # Never more processes than jobs: a forked pool starts all of its workers at once.
    with cf.ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=ctx, initializer=_worker_start,
                                initargs=(base, os.getpid())) as pool:
        # Chunks amortise the inter-process round trip over several millisecond-long replays;
        # the workers also write the rows' values as journal text, so the parent only numbers
        # and appends them.
        chunk = chunk_size(len(jobs), min(workers, len(jobs)))
        futures: list[cf.Future] = []
        warming: threading.Thread | None = None
        try:
            with sigint_deferred():  # the first submit forks every worker (see simulator.interrupts)
                futures = [pool.submit(_run_chunk, jobs[i:i + chunk], task, None, lines) for i in range(0, len(jobs), chunk)]
            warming = _import_in_background(RESULT_MODULES)
            for fut in cf.as_completed(futures):
                yield fut.result()
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise
        finally:
            if warming is not None:
                # (done long before: joined so that no later fork, a plan's next pool, meets an import half made)
                warming.join()


#: What writing a results file imports (the frame, the Parquet writer), none of which a
#: replay needs: a pool's workers are forked without them.
RESULT_MODULES = ("pandas", "pyarrow.parquet")


def _import_in_background(modules: Sequence[str]) -> threading.Thread:
    """Import ``modules`` in a thread of their own, started after a pool's workers are forked:
    while they run the replays, this process mostly waits on them, and the imports (about a
    quarter of a second) are then not added to the end of the sweep."""
    import importlib

    def load() -> None:
        for name in modules:
            with contextlib.suppress(ImportError):  # (reported where the module is used)
                importlib.import_module(name)

    thread = threading.Thread(target=load, name="simctl-sweep-imports", daemon=True)
    thread.start()
    return thread


def _run_chunk(jobs: list, task: str | None, base: Base | None = None, lines: bool = True) -> Batch:
    """Replay ``jobs``; their rows, and the :func:`values_line` of each (in the order the
    rows iterate) if ``lines``."""
    # A Ctrl-C is held over the whole chunk (a few dozen replays of milliseconds), not set
    # aside and taken back around each replay's compiled run as a lone replay does.
    with sigint_deferred():
        rows = [run_job(job, task, base) for job in jobs]
    packed = Rows(rows)
    return packed, packed.values_lines() if lines else None


#: Seconds to reach a cluster's scheduler before a sweep gives up on it.
CONNECT_TIMEOUT = 10.0


#: The address schemes of Dask's comms; ``tcp://`` (the default) is checked and probed first.
DASK_SCHEMES = ("tcp://", "tls://", "inproc://", "ucx://", "ws://", "wss://")


def cluster_address(text: str) -> tuple[str, int] | None:
    """``(host, port)`` of a scheduler address ``tcp://HOST:PORT`` (or ``HOST:PORT``), ``None``
    for another Dask scheme (``inproc://``, ``tls://`` ...); :class:`SweepError` naming what
    is wrong with it."""
    if "://" in text and not text.startswith("tcp://"):
        if text.startswith(DASK_SCHEMES):
            return None
        raise SweepError(None, None, None, f"--cluster: not a Dask scheduler address ({', '.join(DASK_SCHEMES)}), "
                         f"got {text!r}")
    rest = text[len("tcp://"):] if text.startswith("tcp://") else text
    host, sep, port = rest.rpartition(":")
    host = host.strip("[]")  # an IPv6 address in brackets
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise SweepError(None, None, None, f"--cluster: must be a scheduler address like tcp://HOST:8786, got {text!r}")
    return host, int(port)


def connect(cluster: str, timeout: float = CONNECT_TIMEOUT) -> Any:
    """A ``distributed.Client`` of the scheduler at ``cluster``, or :class:`SweepError` in one
    line within about ``timeout`` seconds: a bad address, nothing listening, a listener that
    is no scheduler."""
    try:
        from distributed import Client
    except ModuleNotFoundError:
        raise SweepError(None, None, "cluster", "running on a cluster needs dask.distributed: "
                         "pip install 'simctl-llm[cluster]'") from None
    where = cluster_address(cluster)
    if where is not None:
        try:
            socket.create_connection(where, timeout=timeout).close()
        except OSError as exc:
            reason = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__)
            raise SweepError(None, None, None, f"--cluster: cannot reach the scheduler at {cluster}: {reason}") from None
        cluster = cluster if cluster.startswith("tcp://") else f"tcp://{cluster}"
    # A listener that accepts but never speaks Dask holds the client's handshake for minutes
    # whatever its timeouts say: the client is made in a thread the sweep waits on so long.
    made: dict[str, Any] = {}

    def make() -> None:
        try:
            made["client"] = Client(cluster, timeout=timeout)
        except BaseException as exc:  # reported below, in the sweep's thread
            made["error"] = exc

    thread = threading.Thread(target=make, name="simctl-cluster-connect", daemon=True)
    thread.start()
    thread.join(timeout + 5.0)
    if "client" in made:
        return made["client"]
    error = made.get("error")
    reason = "no answer" if error is None else " ".join(f"{type(error).__name__}: {error}".split())[:160]
    raise SweepError(None, None, None, f"--cluster: no Dask scheduler answered at {cluster} within "
                     f"{timeout:g} s ({reason})")


def _dask_results(jobs: list, task: str | None, base: Base, client: Any) -> Iterator[Batch]:
    from distributed import as_completed

    remote_base = client.scatter(base, broadcast=True)
    futures = [client.submit(_run_chunk, jobs[i:i + 4], task, remote_base, pure=False)
               for i in range(0, len(jobs), 4)]
    for fut in as_completed(futures):
        yield fut.result()


def run_sweep(spec: SweepSpec, base: Base, out: str | Path, *, workers: int | None = None,
              cluster: Any = None, force: bool = False,
              progress: Callable[[int, int], None] | None = None) -> SweepResult:
    """Run ``spec`` over ``base``; stream rows into ``out`` (Parquet). Resumable (see module doc)."""
    from simulator.outputs import check_writable

    check_writable(out, force=True)  # a blank name, a folder, a missing folder: before any run
    if write_through(out) is not None:
        raise SweepError(out, None, None, "sweep results are read back to resume: give the name of a regular "
                         "file, not a device or a pipe")
    if Path(out).suffix.lower() != ".parquet":
        raise SweepError(out, None, None, "sweep results are Parquet (resumable, with their metadata): "
                         "name the file .parquet (pandas.read_parquet turns it into CSV if needed)")
    validate(spec, base)
    meta = {"format": "simctl-sweep/1", "hashes": base.hashes(), "task": spec.task,
            "axes": sorted(spec.axes),
            "trace": base.trace.source, "profile": base.profile.name, "scenario": base.scenario.name}
    owned = isinstance(cluster, str)
    if owned:
        cluster = connect(cluster)  # before the results file is touched
    try:
        # One sweep writes a results file at a time, from reading what is there to writing it
        # back. Another one waits for it (as long as it runs: a killed sweep's lock goes with
        # it), then reads its rows and runs only the ones still missing: rows of both are kept,
        # none is run twice.
        with contextlib.ExitStack() as held:
            with reported(Path(out), Path(out)):  # a read-only folder: one line naming the results file
                held.enter_context(output_lock(Path(out), bounded=False,
                                               then="; then only the rows it did not run are run"))
            return _run_jobs(spec, base, out, meta, workers, cluster, force, progress)
    finally:
        if owned:
            cluster.close()


def _run_jobs(spec: SweepSpec, base: Base, out: str | Path, meta: dict[str, Any], workers: int | None,
              cluster: Any, force: bool, progress: Callable[[int, int], None] | None) -> SweepResult:
    store = ResultStore(out, meta, force=force)
    done = store.done()
    every = spec.jobs()
    jobs = [j for j in every if (j[0], j[2]) not in done]
    total = len(every)
    skipped = total - len(jobs)
    finished = 0
    if progress:
        progress(skipped, total)
    results = (_dask_results(jobs, spec.task, base, cluster) if cluster is not None
               else _local_results(jobs, spec.task, base, workers))
    interrupted = failed = False
    try:
        for rows, lines in results:
            store.add_many(rows, lines)
            finished += len(rows)
            if progress:
                progress(skipped + finished, total)
    except KeyboardInterrupt:
        interrupted = True
    except BaseException:
        failed = True
        raise
    finally:
        if failed:  # the failure is what to report; the rows done stay in the journal if not in the file
            with contextlib.suppress(SimctlError):
                store.close(failed)
        else:
            frame = store.close(failed)  # every finished row saved, whatever stopped the sweep
    if interrupted:
        raise SweepInterrupted(Path(out), len(frame), finished, total) from None
    return SweepResult(frame, finished, skipped, total)


# -- reading results ----------------------------------------------------------------------


def read_results(path: str | Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    """A results file's rows and its metadata; :class:`SweepError` if it is not one."""
    p = Path(path)
    table = inputs.read_parquet(p, SweepError, "sweep results file")
    raw = (table.schema.metadata or {}).get(META_KEY)
    if raw is None:
        raise SweepError(p, None, None, "is not a simctl sweep results file")
    return table.to_pandas(), json.loads(raw)


def axes_of(frame: pd.DataFrame) -> list[str]:
    """The sweep axes present in a results frame."""
    return [a for a in AXES if a in frame.columns]


def metric_column(frame: pd.DataFrame, metric: str, option: str = "--metric") -> str:
    """The results column ``metric`` names, in the figure grammar of
    :func:`simulator.metrics.figure_key` (``infobench.latency.p95`` or
    ``tasks.infobench.latency.p95``); :class:`SweepError` with the closest columns."""
    try:
        return figure_key(metric, [c for c in frame.columns if c not in AXES], option)
    except FigureError as exc:
        raise SweepError(None, None, None, exc.message) from None


def axis_order(value: Any) -> tuple[int, float, str]:
    """Sort key for axis values of mixed kinds: numbers, then names, then absent (an axis the
    row's topology ignores)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return (2, 0.0, "")
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, str(value))


def _axis_ranks(column: pd.Series) -> np.ndarray:
    """Each value's rank among the column's values in :func:`axis_order` (values it orders
    alike rank alike): a number a row to sort by, for an axis of a few values down
    thousands of rows, not a key made a row."""
    import pandas as pd

    codes, uniques = pd.factorize(column, use_na_sentinel=True)  # (None and NaN: -1)
    keys = [axis_order(value) for value in uniques]
    rank_of = {key: rank for rank, key in enumerate(sorted(set(keys)))}
    # the absent (code -1) last, as axis_order orders them
    ranks = np.array([rank_of[key] for key in keys] + [len(rank_of)], dtype=np.int64)
    return ranks[codes]


def show_axis_value(value: Any) -> str:
    """An axis value as tables print it; an axis the row's topology ignores prints as ``–``."""
    return "–" if axis_order(value)[0] == 2 else str(value)


def aggregate(frame: pd.DataFrame, metric: str, by: Sequence[str]) -> pd.DataFrame:
    """Per value of ``by``: mean of ``metric`` over seeds, its 95 % CI half-width (Student t), n.

    Rows are ordered by :func:`axis_order` of the ``by`` values, so axes that hold numbers,
    names and absent values side by side still sort."""
    metric = metric_column(frame, metric)
    grouped = frame.groupby(list(by), sort=False, dropna=False)[metric]
    out = grouped.agg(["mean", "std", "count"]).reset_index()
    # (stable: rows whose values rank alike keep their order, as sorting by axis_order would)
    order = np.lexsort([_axis_ranks(out[c]) for c in reversed(by)]) if len(out) else np.arange(0)
    out = out.iloc[order].reset_index(drop=True)
    count = out["count"].to_numpy()
    t = np.full(len(out), math.nan)
    if (count > 1).any():
        # Student t's quantile function itself (what scipy.stats.t.ppf calls), without
        # scipy.stats, whose import costs a command most of a second.
        from scipy.special import stdtrit

        t[count > 1] = stdtrit(count[count > 1] - 1, 0.975)
    out["ci95"] = t * out["std"] / np.sqrt(out["count"])
    return out.rename(columns={"count": "n"})


def parse_axis_values(name: str, text: str) -> tuple[Any, ...]:
    """``"0,0.5,1"`` for axis ``name`` -> values of the setting's type (checked later, by
    :func:`validate`); :class:`SweepError` naming the option."""
    setting = _SETTING.get(name)
    if setting is None:
        raise SweepError(None, None, name, f"unknown sweep axis; valid: {', '.join(AXES)}")
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise SweepError(None, None, None, f"{setting.flag}: needs at least one value")
    try:
        return tuple(setting.parse(p) for p in parts)
    except ValueError:
        what = {int: "integers", float: "numbers", bool: "true or false"}.get(setting.value_type, "values")
        raise SweepError(None, None, None, f"{setting.flag}: expected comma-separated {what}, got {text!r}") from None


def axes_from_options(options: Mapping[str, str | None]) -> dict[str, tuple[Any, ...]]:
    """Axis values from CLI-style text options (``None``: axis not swept)."""
    return {name: parse_axis_values(name, text) for name, text in options.items() if text is not None}


def seeds_from(count: int) -> tuple[int, ...]:
    if count < 1:
        raise SweepError(None, None, None, f"--seeds: must be >= 1, got {count}")
    return tuple(range(count))


__all__ = ["AXES", "Base", "ResultStore", "SweepError", "SweepInterrupted", "SweepResult", "SweepSpec", "aggregate", "metric_column",
           "axes_from_options", "axes_of", "config_key", "flatten", "read_results", "run_job",
           "run_sweep", "scenario_for", "seeds_from"]
