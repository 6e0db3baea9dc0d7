"""The per-prompt columns of one run of the reference engine.

Every prompt of the trace has a position (trace order) that indexes these lists. The router
fills the input columns as it reads the trace; the outcome columns start as "not yet" and
are written by whoever serves or turns away the prompt; :mod:`simulator.model.log` turns
both into the event log.
"""

from __future__ import annotations


class PromptTable:
    """Per-prompt columns, indexed by the prompt's position in trace order.

    Input: ``arrived_at`` (a closed-loop client rewrites it when it sends the call),
    ``call_of``, ``task_of``, ``prompt_tokens``, ``max_tokens`` (defaults and caps applied).
    Outcome (after :meth:`allocate`): ``batch_of`` (-1: not in a batch yet), ``done_at`` and
    ``first_token_at`` (NaN until known), ``status`` (``served`` unless turned away),
    ``preemptions``, ``cached_tokens`` (prompt tokens its first admission found in the
    prefix cache). ``prefix_chains`` (each prompt's prefix block ids),
    ``prefix_block_tokens`` and ``prefix_from_trace`` are set where a task caches prefixes.
    ``topology_columns``: per-prompt fields a topology adds to the log, each ``name ->
    (int or float, {prompt: value})`` (prompts without a value are empty there); a field the
    log has already takes the values given, for those prompts."""

    def __init__(self) -> None:
        self.arrived_at: list[float] = []
        self.call_of: list[int] = []
        self.task_of: list[str] = []
        self.prompt_tokens: list[int] = []
        self.max_tokens: list[int] = []
        self.batch_of: list[int] = []
        self.done_at: list[float] = []
        self.first_token_at: list[float] = []
        self.status: list[str] = []
        self.preemptions: list[int] = []
        self.cached_tokens: list[int] = []
        self.prefix_chains: list[tuple[int, ...]] | None = None
        self.prefix_block_tokens = 0
        self.prefix_from_trace = False  # whether the trace gave prefix ids (else only system prompts make chains)
        self.topology_columns: dict[str, tuple[type, dict[int, float]]] = {}

    def allocate(self) -> None:
        """Start the outcome columns for every prompt of the input columns."""
        n = len(self.arrived_at)
        nan = float("nan")
        self.batch_of = [-1] * n
        self.done_at = [nan] * n
        self.first_token_at = [nan] * n
        self.status = ["served"] * n
        self.preemptions = [0] * n
        self.cached_tokens = [0] * n
