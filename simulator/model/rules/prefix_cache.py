"""Automatic prefix caching, as vLLM does it, over a trace's prefix block ids.

A prompt's tokens are cut into blocks of ``block_tokens``; each block has an id chained
along the prompt (Mooncake's ``hash_ids``, vLLM's block hashes), so two prompts share
block *i* only if they share every token up to its end. A prompt therefore reuses the
longest run of leading blocks its engine holds, and prefills only the rest.

:class:`PrefixCache` is one engine's cache of blocks:

* a prompt admitted to a running batch references every block of its chain (its hits, and
  its other blocks, which enter the cache as it is prefilled); a referenced block is never
  evicted;
* when the prompt leaves (finished, or preempted) its blocks stay cached, unreferenced,
  released tail first, so that of one prompt the later blocks are evicted before the
  earlier ones (the order vLLM frees a request's blocks in);
* a block that must enter a full cache evicts the least recently released unreferenced
  block; where every cached block is referenced, the block (and the rest of that chain)
  is not cached.

Blocks enter the cache when their prompt is admitted, so a prompt admitted in the same
iteration as another with the same prefix already reuses it (vLLM computes such a shared
block once as well, as long as the two are scheduled in one step).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any


def cached_tokens(hit_blocks: int, block_tokens: int, tokens: int) -> int:
    """The tokens of a prefill of ``tokens`` that a hit of ``hit_blocks`` leading blocks saves:
    whole blocks only, and never the last token, which the engine computes to make the
    first output token (vLLM recomputes it even on a full hit)."""
    return max(0, min(hit_blocks * block_tokens, tokens - 1))


class PrefixCache:
    """The prefix blocks one engine holds (module docstring). ``capacity`` is in blocks
    (``math.inf``: unlimited)."""

    __slots__ = ("_refs", "_unreferenced", "block_tokens", "capacity")

    def __init__(self, capacity: float, block_tokens: int) -> None:
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        self.capacity = math.inf if capacity == math.inf else int(capacity)
        self.block_tokens = block_tokens
        self._refs: dict[int, int] = {}  # every cached block: the admitted prompts that reference it
        #: cached blocks no prompt references, least recently released first
        self._unreferenced: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        """Blocks cached."""
        return len(self._refs)

    def __contains__(self, block: int) -> bool:
        return block in self._refs

    def hit_blocks(self, chain: Sequence[int]) -> int:
        """The leading blocks of ``chain`` this cache holds."""
        refs = self._refs
        n = 0
        for block in chain:
            if block not in refs:
                break
            n += 1
        return n

    def acquire(self, chain: Sequence[int]) -> int:
        """A prompt of ``chain`` is admitted: it references its cached blocks and caches the
        others, evicting as the module docstring says. Returns how many leading blocks of the
        chain it now references (to hand back to :meth:`release`)."""
        refs, unreferenced = self._refs, self._unreferenced
        held = 0
        for block in chain:
            count = refs.get(block)
            if count is None:
                if len(refs) >= self.capacity:
                    if not unreferenced:
                        break  # every cached block is in use: this one and the rest stay uncached
                    victim, _ = unreferenced.popitem(last=False)
                    del refs[victim]
                refs[block] = 1
            else:
                if count == 0:
                    del unreferenced[block]
                refs[block] = count + 1
            held += 1
        return held

    def release(self, chain: Sequence[int], held: int) -> None:
        """The prompt that :meth:`acquire` gave ``held`` leaves its engine: its blocks stay
        cached, and those no other prompt references become evictable, tail first."""
        refs, unreferenced = self._refs, self._unreferenced
        for i in range(held - 1, -1, -1):
            block = chain[i]
            count = refs[block] - 1
            refs[block] = count
            if count == 0:
                unreferenced[block] = None

    def evictable(self) -> list[int]:
        """Unreferenced blocks, in the order they would be evicted."""
        return list(self._unreferenced)


class EnginePrefixes:
    """One engine's prefix cache bound to a run's prompts: ``chains[pid]`` is prompt
    ``pid``'s block ids; the tokens each prompt's first admission found cached are written
    to ``table.cached_tokens[pid]`` (looked up at each write: the run allocates that column
    after its engines are built). An engine calls :meth:`cached_tokens` to price an admission,
    :meth:`admit` when it admits, :meth:`release` when the prompt leaves (finished or
    preempted)."""

    __slots__ = ("_held", "cache", "chains", "table")

    def __init__(self, cache: PrefixCache, chains: Sequence[Sequence[int]], table: Any) -> None:
        self.cache = cache
        self.chains = chains
        self.table = table
        self._held: dict[int, int] = {}

    def hit_blocks(self, pid: int) -> int:
        """Leading blocks of prompt ``pid`` this engine holds."""
        return self.cache.hit_blocks(self.chains[pid])

    def cached_tokens(self, pid: int, tokens: int) -> int:
        """Of a prefill of ``tokens`` for prompt ``pid``, those the cache holds."""
        return cached_tokens(self.cache.hit_blocks(self.chains[pid]), self.cache.block_tokens, tokens)

    def admit(self, pid: int, cached: int, first: bool) -> None:
        """Prompt ``pid`` is admitted having found ``cached`` tokens (recorded on its ``first``
        admission, not on the recompute after a preemption)."""
        self._held[pid] = self.cache.acquire(self.chains[pid])
        if first:
            self.table.cached_tokens[pid] = cached

    def release(self, pid: int) -> None:
        """Prompt ``pid`` leaves the running batch."""
        held = self._held.pop(pid, None)
        if held is not None:
            self.cache.release(self.chains[pid], held)


def with_system_prompts(chains: Sequence[Sequence[int]] | None, task_of: Sequence[str], prompt_tokens: Sequence[int],
                        system_tokens: dict[str, int], block_tokens: int) -> list[tuple[int, ...]]:
    """Each prompt's chain: the trace's ids where it gave a prompt any (``chains``; ``None``:
    it gave none); else, for a task whose prompts all begin with a system prompt of
    ``system_tokens[task]`` tokens, that prompt's whole blocks (ids the task's prompts
    share) followed by blocks of the prompt's own (ids no other prompt has); else none.
    Made-up ids are negative, so they never meet a trace's (which are >= 0)."""
    own = -(1 << 40)  # the next id of a prompt's own block (counting down; below every system block)
    system_ids: dict[str, tuple[int, ...]] = {}
    out: list[tuple[int, ...]] = []
    for pid, task in enumerate(task_of):
        chain = tuple(chains[pid]) if chains is not None else ()
        shared = system_tokens.get(task, 0) // block_tokens
        if not chain and shared:
            ids = system_ids.get(task)
            if ids is None:  # task k's system blocks: -(k + 1) * 2**20 - i
                base = -(len(system_ids) + 1) * (1 << 20)
                ids = system_ids[task] = tuple(base - i for i in range(shared))
            rest = max(0, -(-prompt_tokens[pid] // block_tokens) - shared)
            chain = ids + tuple(range(own, own - rest, -1))
            own -= rest
        out.append(chain)
    return out


def unlimited_hit_blocks(chains: Sequence[Sequence[int]]) -> list[int]:
    """Each prompt's hit in leading blocks, prompts admitted in the order given, on an engine
    whose cache never evicts: block *i* of a chain hits when some earlier prompt carried the
    same id (its chain's first *i* blocks then matched too). Computed from the ids alone,
    without a cache: the reference figure the engines' caches are checked against."""
    seen: set[int] = set()
    hits = []
    for chain in chains:
        n = 0
        for block in chain:
            if block not in seen:
                break
            n += 1
        hits.append(n)
        seen.update(chain)
    return hits
