"""Batched speculative decoding on the per-row KV cache of :mod:`simulator.harness.decoder`.

One iteration, for a batch of B rows, each with its own position ``pos`` (where its current
token ``cur`` goes) and the token before it (``prev``):

1. the draft proposes k tokens autoregressively: a first step over ``[prev, cur]`` (so a row
   whose previous k drafts were all accepted also caches its last draft token), then k - 1
   steps of one token;
2. the target verifies ``[cur, d_1 .. d_k]`` in one forward pass (k + 1 positions);
3. each row accepts a number of drafts ``n`` (see :class:`Acceptance`): speculative
   sampling (accept d_j with probability min(1, p_j(d_j) / q_j(d_j)); at the first
   rejection resample from norm(max(0, p - q)); a bonus token from the target when all k
   pass), or its greedy variant (accept while d_j is the target's argmax);
4. ``ragged``: every row commits its own n + 1 tokens; ``lockstep``: every row commits
   m + 1 with m the minimum n over the unfinished rows (a row that accepted more takes its
   draft d_{m+1} as the (m+1)-th token: it was accepted, so it has the target's
   distribution). Positions advance by the committed count; rejected cache entries lie
   past ``pos`` and are overwritten later (rollback is moving the pointer).

Finished rows (``max_new`` tokens generated) stay in the batch as masked rows: they run
every kernel but commit nothing, until the whole batch ends. Sampling uses the
exponential-race form of the Gumbel-max trick (argmax p / E with E ~ Exp(1)), which never
reads a device value on the host; the loop synchronises once per iteration, between
steps, to learn whether the batch is done (and, with adaptive lookahead, the next k).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from simulator.harness.decoder import Decoder, KVCache

DISCIPLINES = ("ragged", "lockstep")
ACCEPTANCE_KINDS = ("model", "inject", "vector", "replay")


@dataclass(frozen=True)
class Acceptance:
    """Where each row's number of accepted drafts comes from.

    * ``model``: the models' real probabilities (speculative sampling or greedy matching);
    * ``inject``: drafts accepted independently with probability ``alpha`` until the first
      rejection: a truncated geometric, ``P(n = j) = alpha^j (1 - alpha)`` for j < k and
      ``P(n = k) = alpha^k``; drawn on the device per row and iteration while every kernel
      still runs (random weights give alpha ≈ 0, so timing runs inject);
    * ``vector``: the same with a per-position probability ``alpha_j`` (``vector[j - 1]``);
    * ``replay``: a recorded ``[iterations, B]`` table of accepted counts (clipped to k).
    """

    kind: str = "model"
    alpha: float | None = None
    vector: tuple[float, ...] | None = None
    recorded: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        if self.kind not in ACCEPTANCE_KINDS:
            raise ValueError(f"unknown acceptance source {self.kind!r}; valid: {', '.join(ACCEPTANCE_KINDS)}")
        if self.kind == "inject" and not (self.alpha is not None and 0 <= self.alpha <= 1):
            raise ValueError(f"inject needs 0 <= alpha <= 1, got {self.alpha!r}")
        if self.kind == "vector" and not (self.vector and all(0 <= a <= 1 for a in self.vector)):
            raise ValueError("vector needs per-position probabilities in [0, 1]")
        if self.kind == "replay" and not self.recorded:
            raise ValueError("replay needs a recorded table of accepted counts")

    @classmethod
    def inject(cls, alpha: float) -> Acceptance:
        return cls("inject", alpha=float(alpha))

    def describe(self) -> str:
        if self.kind == "inject":
            return f"inject(alpha={self.alpha:g})"
        if self.kind == "vector":
            assert self.vector is not None  # __post_init__ checks each kind has its field
            return f"vector({', '.join(f'{a:g}' for a in self.vector)})"
        return self.kind


def expected_tokens_per_iteration(alpha: float, k: int) -> float:
    """Mean tokens one iteration commits per row under i.i.d. acceptance: (1 - alpha^(k+1)) / (1 - alpha)."""
    return float(k + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


@dataclass
class Generation:
    """What one batched generation did. Tensors are on the host after :meth:`SpecDecoder.generate`."""

    tokens: list[list[int]]           # per row, exactly its max_new generated tokens
    iterations: int
    accepted: torch.Tensor            # [iterations, B] drafts each row accepted (before lockstep min)
    committed: torch.Tensor           # [iterations, B] tokens each row committed (0 once finished)
    lookahead: list[int]              # k used in each iteration
    finish_iteration: list[int]       # per row, the iteration (0-based) in which it finished
    views: list[int] = field(default_factory=list)  # attended cache length in each iteration

    def tokens_per_iteration(self) -> float:
        """Mean tokens committed per row and iteration, over the iterations each row was active."""
        active = self.committed > 0
        return float(self.committed.sum() / active.sum())


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row of ``probs`` ``[..., V]`` (argmax p / E, E ~ Exp(1): no host sync)."""
    noise = torch.empty_like(probs).exponential_(generator=generator)
    return torch.argmax(probs / noise, dim=-1)


class StepRunner:
    """Runs ``model(tokens, cache, view)``; on CUDA through captured CUDA graphs.

    One graph per ``(tokens per row, view)`` shape, captured on first use. The cache and its
    ``pos`` are updated in place only, so graphs stay valid.
    """

    def __init__(self, model: Decoder, cache: KVCache, graphs: bool) -> None:
        self.model, self.cache = model, cache
        self.graphs = graphs and cache.k.is_cuda
        self._captured: dict[tuple[int, int], tuple] = {}

    def __call__(self, tokens: torch.Tensor, view: int) -> torch.Tensor:
        if not self.graphs:
            return self.model(tokens, self.cache, view)
        key = (tokens.shape[1], view)
        entry = self._captured.get(key)
        if entry is None:
            static_in = tokens.clone()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up outside the graph (allocator, cuBLAS handles)
                    self.model(static_in, self.cache, view)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = self.model(static_in, self.cache, view)
            entry = self._captured[key] = (graph, static_in, static_out)
        graph, static_in, static_out = entry
        static_in.copy_(tokens)
        graph.replay()
        return static_out


def _bucket(n: int, step: int, cap: int) -> int:
    return min(cap, step * math.ceil(n / step))


@dataclass
class RoundState:
    """The per-row state one speculative iteration reads and advances (see the module
    docstring): where ``cur`` goes (``pos``), the token before it, the tokens written so far
    (``out``, ``generated`` per row), which rows still run (``active``, ``max_new``), the
    iteration each finished in (``finish``, -1 while running) and the row indices."""

    pos: torch.Tensor
    prev: torch.Tensor
    cur: torch.Tensor
    out: torch.Tensor
    generated: torch.Tensor
    active: torch.Tensor
    finish: torch.Tensor
    max_new: torch.Tensor
    rows: torch.Tensor


class SpecDecoder:
    """Batched speculative decoding of ``target`` with ``draft``.

    ``k``: lookahead (drafts per iteration); ``adaptive``: +2 after an iteration in which
    every unfinished row accepted all drafts, -1 otherwise, within ``[1, k_max]``.
    ``greedy``: greedy matching instead of speculative sampling. ``view_step``: attention
    reads the cache up to a multiple of this above the longest possible row.
    """

    def __init__(self, target: Decoder, draft: Decoder, k: int = 3, *, discipline: str = "ragged",
                 greedy: bool = False, acceptance: Acceptance = Acceptance(), adaptive: bool = False,
                 k_max: int | None = None, graphs: bool = True, view_step: int = 256,
                 seed: int = 0) -> None:
        if discipline not in DISCIPLINES:
            raise ValueError(f"unknown discipline {discipline!r}; valid: {', '.join(DISCIPLINES)}")
        if k < 1:
            raise ValueError(f"lookahead k must be >= 1, got {k}")
        if target.shape.vocab != draft.shape.vocab:
            raise ValueError("draft and target must share a vocabulary")
        self.target, self.draft = target, draft
        self.k, self.k_max = k, max(k, k_max or k)
        self.discipline, self.greedy, self.acceptance = discipline, greedy, acceptance
        self.adaptive, self.graphs, self.view_step = adaptive, graphs, view_step
        self.device = target.device
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    # -- building blocks, also timed one by one by the profiler ---------------------------

    def prefill(self, prompts: torch.Tensor, lengths: torch.Tensor, max_new: int):
        """Caches of both models filled with the prompts; the first token (from the target)."""
        B, P = prompts.shape
        s_max = P + max_new + 2 * (self.k_max + 1)
        t_cache = self.target.new_cache(B, s_max)
        d_cache = self.draft.new_cache(B, s_max)
        view = _bucket(P, self.view_step, s_max)
        logits = self.target(prompts, t_cache, view)
        self.draft(prompts, d_cache, view)
        rows = torch.arange(B, device=self.device)
        last = logits[rows, lengths - 1]
        first = self._pick(torch.softmax(last.float(), -1))
        prev = prompts[rows, lengths - 1]
        return t_cache, d_cache, first, prev

    def _pick(self, probs: torch.Tensor) -> torch.Tensor:
        return torch.argmax(probs, -1) if self.greedy else sample(probs, self.generator)

    # -- the loop --------------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, prompts: torch.Tensor, lengths: Sequence[int] | torch.Tensor,
                 max_new: Sequence[int] | int) -> Generation:
        """Generate for right-padded ``prompts`` ``[B, P]`` with true ``lengths``; ``max_new`` per row."""
        dev = self.device
        B, P = prompts.shape
        lengths = torch.as_tensor(lengths, device=dev, dtype=torch.long)
        max_new_t = torch.as_tensor(max_new, device=dev, dtype=torch.long).expand(B).clone()
        longest = int(max_new_t.max()) if isinstance(max_new, torch.Tensor) else max(
            [max_new] if isinstance(max_new, int) else list(max_new))
        t_cache, d_cache, cur, prev = self.prefill(prompts.to(dev), lengths, longest)
        s_max = t_cache.max_len
        t_step = StepRunner(self.target, t_cache, self.graphs)
        d_step = StepRunner(self.draft, d_cache, self.graphs)

        out = torch.zeros(B, longest + 2 * (self.k_max + 1), dtype=torch.long, device=dev)
        out[:, 0] = cur                            # the prefill's token is the first generated
        generated = torch.ones(B, dtype=torch.long, device=dev)
        active = generated < max_new_t
        state = RoundState(pos=lengths.clone(), prev=prev, cur=cur, out=out, generated=generated, active=active,
                           finish=torch.where(active, -1, 0), max_new=max_new_t,
                           rows=torch.arange(B, device=dev))
        k = self.k
        bound = P                                   # host-side bound on every row's pos
        accepted_log, committed_log, ks, views = [], [], [], []
        it = 0
        replay_table = (torch.tensor(self.acceptance.recorded, device=dev)
                        if self.acceptance.kind == "replay" else None)

        while bool(state.active.any()):            # the one sync per iteration
            ks.append(k)
            view = _bucket(bound + k + 1, self.view_step, s_max)
            views.append(view)
            was_active = state.active
            n, committed = self.iteration(t_step, d_step, state, k, view, it, replay_table)
            accepted_log.append(torch.where(was_active, n, 0))
            committed_log.append(committed)
            bound = min(bound + k + 1, P + longest + self.k_max + 1)
            if self.adaptive:  # needs the host to know the next k: one more small read
                all_in = bool(((n == k) | ~was_active).all())
                k = min(self.k_max, k + 2) if all_in else max(1, k - 1)
            it += 1

        accepted = torch.stack(accepted_log).cpu() if accepted_log else torch.zeros(0, B, dtype=torch.long)
        committed_all = torch.stack(committed_log).cpu() if committed_log else torch.zeros(0, B, dtype=torch.long)
        out_host = state.out.cpu()
        limits = max_new_t.cpu().tolist()
        return Generation(
            tokens=[out_host[b, : limits[b]].tolist() for b in range(B)],
            iterations=it, accepted=accepted, committed=committed_all, lookahead=ks,
            finish_iteration=state.finish.cpu().tolist(), views=views,
        )

    def iteration(self, t_step: StepRunner, d_step: StepRunner, state: RoundState, k: int, view: int,
                  it: int = 0, replay_table: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One speculative iteration (module docstring, steps 1-4) with lookahead ``k`` over
        the first ``view`` cached positions: advances ``state`` in place and returns the drafts
        each row accepted and the tokens each row committed (0 for finished rows). Reads
        nothing on the host."""
        d_cache, t_cache = d_step.cache, t_step.cache
        pos, prev, cur, rows, active = state.pos, state.prev, state.cur, state.rows, state.active
        # 1. draft proposes k tokens; the first step also (re)caches prev at pos - 1
        drafts, q_probs = [], []
        d_cache.pos.copy_(pos - 1)
        logits = d_step(torch.stack([prev, cur], 1), view)[:, -1]
        d_cache.pos.copy_(pos + 1)
        for j in range(k):
            q = torch.softmax(logits.float(), -1)
            d = self._pick(q)
            drafts.append(d)
            q_probs.append(q)
            if j < k - 1:
                logits = d_step(d[:, None], view)[:, -1]
                d_cache.pos.add_(1)
        drafts_t = torch.stack(drafts, 1)                        # [B, k]
        # 2. target verifies cur and the k drafts in one pass
        t_cache.pos.copy_(pos)
        p = torch.softmax(t_step(torch.cat([cur[:, None], drafts_t], 1), view).float(), -1)  # [B, k+1, V]
        # 3. how many drafts each row accepts
        n = self._accepted(p, torch.stack(q_probs, 1), drafts_t, k, it, replay_table)
        m = n if self.discipline == "ragged" else torch.where(active, n, k).min().expand(len(pos))
        # 4. the token after the m accepted drafts
        x = self._next_token(p, torch.stack(q_probs, 1), drafts_t, n, m, k)
        committed = torch.where(active, m + 1, 0)
        cand = torch.cat([drafts_t, torch.zeros_like(cur)[:, None]], 1)
        cand[rows, m] = x
        state.out[rows[:, None], state.generated[:, None] + torch.arange(k + 1, device=pos.device)] = cand
        last_before_x = torch.where(m > 0, drafts_t[rows, (m - 1).clamp(min=0)], cur)
        state.prev = torch.where(active, last_before_x, prev)
        state.cur = torch.where(active, x, cur)
        state.pos = pos + committed
        state.generated = state.generated + committed
        newly_done = active & (state.generated >= state.max_new)
        state.finish = torch.where(newly_done, it, state.finish)
        state.active = active & ~newly_done
        return n, committed

    def _accepted(self, p, q, drafts, k, it, replay_table) -> torch.Tensor:
        """Drafts accepted per row, ``[B]`` (leading run of accepts)."""
        src = self.acceptance
        B = drafts.shape[0]
        if src.kind == "replay":
            row = replay_table[min(it, replay_table.shape[0] - 1)]
            return row[:B].clamp(max=k).long()
        if src.kind == "model" and self.greedy:
            ok = drafts == p[:, :k].argmax(-1)
        else:
            u = torch.rand(B, k, device=drafts.device, generator=self.generator)
            if src.kind == "model":
                pd = p[:, :k].gather(-1, drafts[..., None]).squeeze(-1)
                qd = q.gather(-1, drafts[..., None]).squeeze(-1)
                ok = u * qd < pd           # u < p/q without dividing by a zero q
            elif src.kind == "inject":
                assert src.alpha is not None  # Acceptance.__post_init__ checks it
                ok = u < src.alpha
            else:
                vec = torch.tensor(src.vector, device=drafts.device)
                vec = torch.cat([vec, vec[-1:].expand(max(0, k - vec.numel()))])[:k]
                ok = u < vec
        return ok.long().cumprod(1).sum(1)

    def _next_token(self, p, q, drafts, n, m, k) -> torch.Tensor:
        """The token committed after the m accepted drafts of each row."""
        B = drafts.shape[0]
        rows = torch.arange(B, device=drafts.device)
        p_m = p[rows, m]                                             # target dist after m drafts
        if self.greedy:
            fresh = p_m.argmax(-1)
        elif self.acceptance.kind == "model":
            # Rejected at m < k: resample from norm(max(0, p - q)); all k accepted: bonus from p_k.
            q_m = q[rows, m.clamp(max=k - 1)]
            residual = (p_m - q_m).clamp(min=0)
            mass = residual.sum(-1, keepdim=True)
            residual = torch.where(mass > 0, residual / mass.clamp(min=1e-30), p_m)
            fresh = sample(torch.where((m < k)[:, None], residual, p_m), self.generator)
        else:
            fresh = sample(p_m, self.generator)
        # A lockstep row that accepted more than m takes its own accepted draft d_{m+1}.
        took_draft = n > m
        return torch.where(took_draft, drafts[rows, m.clamp(max=k - 1)], fresh)


@torch.no_grad()
def plain_generate(model: Decoder, prompts: torch.Tensor, lengths, max_new: int, *,
                   greedy: bool = True, seed: int = 0) -> list[list[int]]:
    """Ordinary one-token-per-step decoding of ``model`` (the reference for speculative decoding)."""
    dev = model.device
    B, P = prompts.shape
    lengths = torch.as_tensor(lengths, device=dev, dtype=torch.long)
    cache = model.new_cache(B, P + max_new + 1)
    gen = torch.Generator(device=dev).manual_seed(seed)
    rows = torch.arange(B, device=dev)
    logits = model(prompts.to(dev), cache)[rows, lengths - 1]
    cache.pos.copy_(lengths)
    out = []
    for _ in range(max_new):
        probs = torch.softmax(logits.float(), -1)
        tok = probs.argmax(-1) if greedy else sample(probs, gen)
        out.append(tok)
        logits = model(tok[:, None], cache)[:, -1]
        cache.pos.add_(1)
    return torch.stack(out, 1).cpu().tolist()
