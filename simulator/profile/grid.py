"""Where a composed profile holds: the grid its kernel costs were fitted on.

``simctl profile --gpu NAME`` fits each GPU task's cost forms to composed passes over a grid
of batch rows and contexts (``meta.grounded.tasks.TASK.grid``: ``rows`` and ``context`` for
the ``iteration`` kind, ``rows`` and ``views`` for ``spec_decode``). Outside that grid the
fitted form is extrapolated, and far outside it nothing says it still prices the composition.
:func:`outside_grid` compares what a run made with that grid, once per run from its event log
(a vectorised pass over the per-prompt records, never per event):

* a batch with more rows than the grid's largest, and
* a prompt whose context (prompt plus output tokens) is more than :data:`FAR` times the grid's
  largest context.

Profiles without a recorded grid (measured, calibrated, hand-set ones) give nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from simulator.events import LogColumns
from simulator.profile import Profile

if TYPE_CHECKING:
    import pandas as pd

#: how far beyond the grid's largest context a prompt's context is "far" outside it
FAR = 2.0


@dataclass(frozen=True)
class OutsideGrid:
    """One way a run left a task's fitted grid: what (``rows`` or ``context``), the largest
    value the run reached, and the grid's largest."""

    profile: str
    task: str
    what: str
    value: int
    grid_max: int
    grid: tuple[int, ...]

    def message(self) -> str:
        """The warning line, naming the profile, the task, the grid and the value."""
        if self.what == "rows":
            reached = f"batches of up to {self.value} rows"
        else:
            reached = f"contexts of up to {self.value:,} tokens (more than {FAR:g}x its largest)"
        return (f"profile {self.profile} is outside its fitted grid for task {self.task}: the run made {reached}, "
                f"the grid's {self.what} are {', '.join(str(v) for v in self.grid)}; its costs there are extrapolated")

    def to_dict(self) -> dict[str, object]:
        return {"profile": self.profile, "task": self.task, "what": self.what, "value": self.value,
                "grid_max": self.grid_max, "grid": list(self.grid), "message": self.message()}


def fitted_grids(profile: Profile) -> dict[str, dict[str, tuple[int, ...]]]:
    """Per GPU task of a composed profile, its fitted grid: ``rows`` and ``context`` (the
    ``views`` of a speculative task); empty for a profile that records none."""
    grounded = (profile.meta or {}).get("grounded")
    tasks = grounded.get("tasks") if isinstance(grounded, Mapping) else None
    out: dict[str, dict[str, tuple[int, ...]]] = {}
    for task, meta in (tasks or {}).items():
        grid = meta.get("grid") if isinstance(meta, Mapping) else None
        if not isinstance(grid, Mapping):
            continue
        axes = {}
        for what, key in (("rows", "rows"), ("context", "context"), ("context", "views")):
            values = grid.get(key)
            if isinstance(values, list) and values and all(isinstance(v, (int, float)) for v in values):
                axes[what] = tuple(int(v) for v in values)
        if axes:
            out[str(task)] = axes
    return out


def outside_grid(profile: Profile, log: LogColumns | pd.DataFrame) -> list[OutsideGrid]:
    """Every task of ``log`` (a run's event log, as columns or as its frame) whose batches or
    contexts left the profile's fitted grid (module docstring); at most one finding per task
    and axis. Prompts that were never batched (turned away) count for neither."""
    grids = fitted_grids(profile)
    if not grids or not len(log):
        return []
    if isinstance(log, LogColumns):
        names, codes = list(log.labels["task"]), log.columns["task"]
        size, prompt, most = (log.columns[c] for c in ("batch_size", "prompt_tokens", "max_tokens"))
    else:
        task = log["task"].astype("category")
        names, codes = [str(t) for t in task.cat.categories], task.cat.codes.to_numpy()
        size = log["batch_size"].to_numpy(float, na_value=np.nan)
        prompt, most = log["prompt_tokens"].to_numpy(), log["max_tokens"].to_numpy()
    ran = np.asarray(size, dtype=float) > 0  # (a never-batched prompt: size 0 or missing)
    found = []
    for task, axes in grids.items():
        if task not in names:
            continue
        rows = ran & (codes == names.index(task))
        if not rows.any():
            continue
        largest = int(size[rows].max())
        context = int((prompt[rows].astype(np.int64) + most[rows].astype(np.int64)).max())
        if "rows" in axes and largest > max(axes["rows"]):
            found.append(OutsideGrid(profile.name, task, "rows", largest, max(axes["rows"]), axes["rows"]))
        if "context" in axes and context > FAR * max(axes["context"]):
            found.append(OutsideGrid(profile.name, task, "context", context, max(axes["context"]), axes["context"]))
    return found


__all__ = ["FAR", "OutsideGrid", "fitted_grids", "outside_grid"]
