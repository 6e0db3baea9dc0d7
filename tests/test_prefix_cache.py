"""The prefix-caching rule (simulator.model.rules.prefix_cache): hand timelines of hits,
misses and eviction order, and its invariants under random admissions and releases."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.model.rules.prefix_cache import PrefixCache, cached_tokens, unlimited_hit_blocks


def test_a_hit_saves_whole_blocks_but_never_the_last_token():
    assert cached_tokens(0, 16, 100) == 0
    assert cached_tokens(3, 16, 100) == 48
    assert cached_tokens(7, 16, 100) == 99      # every block cached: the last token is still computed
    assert cached_tokens(2, 512, 600) == 599
    assert cached_tokens(1, 16, 0) == 0         # an empty prompt saves nothing


def test_hits_misses_and_eviction_order_by_hand():
    cache = PrefixCache(capacity=4, block_tokens=16)
    a, b, c = (1, 2, 3), (1, 2, 4), (5, 6)
    # a: a cold miss; its three blocks are cached and referenced
    assert cache.hit_blocks(a) == 0
    assert cache.acquire(a) == 3
    # b shares a's first two blocks: two hits; block 4 takes the last free place
    assert cache.hit_blocks(b) == 2
    assert cache.acquire(b) == 3
    assert len(cache) == 4 and cache.evictable() == []
    # c finds a full cache whose blocks are all referenced: nothing of it is cached
    assert cache.acquire(c) == 0 and 5 not in cache
    # a leaves: its blocks stay cached; only 3 is unreferenced (1 and 2 are b's too)
    cache.release(a, 3)
    assert cache.evictable() == [3]
    # b leaves: tail first, so 4 is evicted before 2, and 2 before 1
    cache.release(b, 3)
    assert cache.evictable() == [3, 4, 2, 1]
    # c again: 5 evicts 3 (least recently released), 6 evicts 4
    assert cache.hit_blocks(c) == 0
    assert cache.acquire(c) == 2
    assert sorted(cache._refs) == [1, 2, 5, 6] and cache.evictable() == [2, 1]
    # a again: 1 and 2 hit (unreferenced, still cached); 3 evicts... nothing is free: uncached
    assert cache.hit_blocks(a) == 2
    assert cache.acquire(a) == 2
    assert 3 not in cache and cache.evictable() == []


def test_a_hit_moves_a_block_out_of_the_eviction_line():
    cache = PrefixCache(capacity=3, block_tokens=4)
    cache.release((7, 8), cache.acquire((7, 8)))
    cache.release((9,), cache.acquire((9,)))
    assert cache.evictable() == [8, 7, 9]
    held = cache.acquire((7,))           # 7 is referenced again
    assert cache.evictable() == [8, 9]
    cache.acquire((10,))                 # evicts 8, the least recently released
    assert 8 not in cache and 7 in cache
    cache.release((7,), held)
    assert cache.evictable() == [9, 7]


chains = st.lists(st.lists(st.integers(0, 12), min_size=0, max_size=6, unique=True), min_size=1, max_size=30)


@given(chains)
@settings(max_examples=100, deadline=None)
def test_an_unlimited_cache_hits_what_the_ids_alone_say(prompts):
    cache = PrefixCache(math.inf, 16)
    hits = []
    for chain in prompts:  # each admitted and finished in turn
        hits.append(cache.hit_blocks(chain))
        cache.release(chain, cache.acquire(chain))
    assert hits == unlimited_hit_blocks(prompts)


@given(chains, st.integers(1, 8), st.lists(st.booleans(), min_size=30, max_size=30))
@settings(max_examples=100, deadline=None)
def test_a_bounded_cache_never_overflows_nor_evicts_a_referenced_block(prompts, capacity, leave):
    cache = PrefixCache(capacity, 16)
    running: list[tuple[list[int], int]] = []
    for chain, leaves in zip(prompts, leave):
        hit = cache.hit_blocks(chain)
        held = cache.acquire(chain)
        assert held >= hit and all(b in cache for b in chain[:held])
        running.append((chain, held))
        if leaves:
            cache.release(*running.pop(0))
        assert len(cache) <= capacity
        for other, kept in running:  # what a running prompt references stays cached
            assert all(b in cache for b in other[:kept])
        refs = {}
        for other, kept in running:
            for b in other[:kept]:
                refs[b] = refs.get(b, 0) + 1
        assert {b: n for b, n in cache._refs.items() if n} == refs
        assert set(cache.evictable()) == {b for b, n in cache._refs.items() if n == 0}
