"""The prefix-caching rule (simulator.model.rules.prefix_cache): hand timelines of hits,
misses and eviction order, and its invariants under random admissions and releases."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from helpers import run, timeline
from hypothesis import given, settings, strategies as st

from simulator.errors import ScenarioError
from simulator.metrics import summarize
from simulator.model import simulate
from simulator.model.rules.prefix_cache import PrefixCache, cached_tokens, unlimited_hit_blocks, with_system_prompts
from simulator.profile import profile_from_dict
from simulator.trace.model import Call, Prompt, Trace


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
    for chain, leaves in zip(prompts, leave[:len(prompts)], strict=True):
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


# -- through the continuous engine ----------------------------------------------------------

#: iteration = 1 s + 0.1 s per prefilled token; prompts of 40 tokens, one output token
PROFILE = profile_from_dict({"tasks": {"x": {
    "resource": "gpu", "prompt_tokens": 40, "max_tokens": 1,
    "service": {"kind": "iteration", "dist": "deterministic", "step": {"base": 1.0, "per_prefill_token": 0.1}}}}})


def prefix_trace(calls: list[tuple[float, tuple[int, ...]]], block_tokens: int = 16,
                 tokens: dict[int, int] | None = None) -> Trace:
    """One-prompt calls ``(t, block ids)``; ``tokens`` gives some calls' prompt tokens."""
    tokens = tokens or {}
    return Trace(tuple(Call(str(i), float(t), (Prompt("x", prompt_tokens=tokens.get(i), prefix=chain),))
                       for i, (t, chain) in enumerate(calls)), prefix_block_tokens=block_tokens)


def test_a_prompt_prefills_only_what_its_engine_has_not_cached():
    """Blocks of 16 tokens. a(0, blocks 1 2), b(5, 1 2 3), c(10, 9).

    t=0   a: a miss, 40 tokens: 1 + 4 = 5 -> done 5; blocks 1, 2 cached
    t=5   b: blocks 1, 2 hit: 32 cached, 8 to prefill: 1 + 0.8 = 1.8 -> done 6.8
    t=10  c: a miss: 1 + 4 = 5 -> done 15
    Without prefix caching b prefills its 40 tokens: done 10."""
    trace = prefix_trace([(0, (1, 2)), (5, (1, 2, 3)), (10, (9,))])
    log = run(trace, PROFILE, gpus=1, topology="continuous", prefix_caching=True)
    assert timeline(log) == [("0.0", 5.0), ("1.0", pytest.approx(6.8)), ("2.0", 15.0)]
    assert list(log["cached_tokens"]) == [0, 32, 0]
    assert log.attrs["engine"].startswith("reference")
    figures = summarize(log)["prefix_cache"]
    assert figures["hit_rate"] == pytest.approx(32 / 120)
    assert (figures["cached_tokens"], figures["prompts_hit"], figures["tasks"]["x"]["prompt_tokens"]) == (32, 1, 120)
    plain = run(trace, PROFILE, gpus=1, topology="continuous")
    assert timeline(plain) == [("0.0", 5.0), ("1.0", 10.0), ("2.0", 15.0)]
    assert "cached_tokens" not in plain and "prefix_cache" not in summarize(plain)


@pytest.mark.parametrize(("capacity_tokens", "cached_c"), [(32, 0), (48, 16), (64, 32)])
def test_a_bounded_cache_evicts_the_least_recently_released_blocks(capacity_tokens, cached_c):
    """a(0, 1 2) done at 5 releases 2 then 1; b(5, 3 4) must place two blocks; c(20, 1 2).
    Two blocks of room: b evicts 2 and 1, c misses. Three: b evicts 2 only, c hits block 1.
    Four: nothing is evicted, c hits both."""
    trace = prefix_trace([(0, (1, 2)), (5, (3, 4)), (20, (1, 2))])
    log = run(trace, PROFILE, gpus=1, topology="continuous", prefix_caching=True,
              prefix_cache_size=capacity_tokens)
    assert list(log["cached_tokens"]) == [0, 0, cached_c]


def test_cache_aware_dispatch_follows_the_prefix_and_breaks_ties_by_load():
    """Two GPUs. a(0, 1 2; 40 tokens) -> GPU 0 (a tie); b(0, 7; 20 tokens) -> GPU 1 (no hits
    anywhere: fewer tokens outstanding); c(1, 1 2 3) -> GPU 0, which holds 1 2, although it
    has more work left (41 tokens against 21); jsq-tokens sends c to GPU 1."""
    trace = prefix_trace([(0, (1, 2)), (0, (7,)), (1, (1, 2, 3))], tokens={1: 20})
    aware = run(trace, PROFILE, gpus=2, topology="continuous", prefix_caching=True, dispatch="cache-aware")
    assert list(aware["gpu"]) == [0, 1, 0] and list(aware["cached_tokens"]) == [0, 0, 32]
    jsq = run(trace, PROFILE, gpus=2, topology="continuous", prefix_caching=True, dispatch="jsq-tokens")
    assert list(jsq["gpu"]) == [0, 1, 1] and list(jsq["cached_tokens"]) == [0, 0, 0]


def test_prefix_settings_that_cannot_work_are_scenario_errors():
    plain = Trace((Call("0", 0.0, (Prompt("x"),)),))
    with pytest.raises(ScenarioError, match="prefix_caching.*trace has none"):
        run(plain, PROFILE, gpus=1, topology="continuous", prefix_caching=True)
    trace = prefix_trace([(0, (1,))])
    with pytest.raises(ScenarioError, match="dispatch.*prefix_caching = true"):
        run(trace, PROFILE, gpus=2, topology="continuous", dispatch="cache-aware")
    with pytest.raises(ScenarioError, match="dispatch.*continuous"):
        run(trace, PROFILE, gpus=2, topology="shared", dispatch="cache-aware", prefix_caching=True)


MOONCAKE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "real" / "mooncake_fast25" / "conversation_trace.jsonl"


def test_an_unlimited_cache_on_the_mooncake_trace_hits_exactly_what_its_hash_ids_say():
    """One engine, an unlimited cache: prompts are admitted in arrival order, so each one's
    hit is the run of its leading blocks some earlier request carried."""
    if not MOONCAKE.exists():
        pytest.skip(f"the Mooncake conversation trace is not at {MOONCAKE} (../shared is absent)")
    from simulator.trace.formats.mooncake import read_mooncake

    trace = read_mooncake(MOONCAKE).head(400)
    cols = trace.columns
    chains = [cols.prefix_of(i).tolist() for i in range(len(cols.task_of))]
    profile = profile_from_dict({"tasks": {"mooncake": {
        "resource": "gpu", "prompt_tokens": 1000, "max_tokens": 1,
        "service": {"kind": "iteration", "dist": "deterministic",
                    "step": {"base": 0.01, "per_prefill_token": 1e-5}}}}})
    log = run(trace, profile, gpus=1, topology="continuous", prefix_caching=True, max_tokens=8)
    expected = [max(0, min(hit * 512, tokens - 1))
                for hit, tokens in zip(unlimited_hit_blocks(chains), cols.prompt_tokens.tolist(), strict=True)]
    assert log["cached_tokens"].tolist() == expected
    assert sum(expected) > 0.1 * int(np.sum(cols.prompt_tokens))  # the trace does reuse prefixes


@pytest.mark.benchmark
def test_prefix_cache_benchmark_quick_mode(capsys):
    import importlib.util
    import json

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "prefix_cache.py"
    spec = importlib.util.spec_from_file_location("prefix_cache_bench", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    if not bench.MOONCAKE.exists():
        pytest.skip(f"{bench.MOONCAKE} absent (the real traces live in ../shared/traces/real)")
    assert bench.main(["--quick", "--end", "60", "--gpus", "4", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    rows = {(r["cache"], r["dispatch"]): r for r in result["rows"]}
    assert rows["off", "jsq-tokens"]["hit_rate"] == 0
    assert 0 < rows["unlimited", "jsq-tokens"]["hit_rate"] <= rows["unlimited", "cache-aware"]["hit_rate"]
    assert rows["unlimited", "cache-aware"]["ttft_p50"] <= rows["off", "jsq-tokens"]["ttft_p50"]
    assert all(r["engine"] == "reference" for r in result["rows"])
    assert sum(line.startswith("| ") for line in bench.table(result).splitlines()) == len(result["rows"]) + 1
    assert bench.readme_row(result).startswith(f"| {bench.README_ROW} (first {result['calls']:,} requests")


def test_a_task_s_system_prompt_is_a_prefix_its_prompts_share():
    """No ids in the trace; system prompt of 40 tokens, blocks of 16 (the KV block): its 2
    whole blocks are shared. Prompts of 40 tokens, one output token, one GPU.

    t=0   a: a miss, 40 tokens: 1 + 4 = 5 -> done 5; blocks s1 s2 a3 cached
    t=10  b: s1 s2 hit: 32 cached, 8 prefilled: 1 + 0.8 -> done 11.8 (its own block misses)"""
    trace = Trace((Call("a", 0.0, (Prompt("x"),)), Call("b", 10.0, (Prompt("x"),))))
    log = run(trace, PROFILE, gpus=1, topology="continuous", prefix_caching=True, system_tokens=40)
    assert timeline(log) == [("a.0", 5.0), ("b.0", pytest.approx(11.8))]
    assert list(log["cached_tokens"]) == [0, 32]
    chains = with_system_prompts(None, ["x", "y", "x"], [40, 40, 20], {"x": 40, "y": 0}, 16)
    assert chains[0][:2] == chains[2][:2] and len(chains[0]) == 3 and len(chains[2]) == 2 and chains[1] == ()
    assert len(set(chains[0]) | set(chains[2])) == 3 and all(i < 0 for i in chains[0])
    # the trace's ids win where a prompt has them
    assert with_system_prompts([(5, 6), ()], ["x", "x"], [40, 40], {"x": 40}, 16)[0] == (5, 6)


def test_prefix_affinity_sends_a_call_to_the_replica_whose_cache_holds_its_prefix():
    """Two replicas of one GPU. a(0, 1 2) -> replica 0 (no cache holds anything: the fewest
    calls, then the first); b(0, 7 8) -> replica 1 (replica 0 holds a); c(20, 7 8 9) ->
    replica 1, whose cache holds 7 8 (least-loaded, both idle, takes replica 0)."""
    from simulator.scenario import build_scenario

    trace = prefix_trace([(0, (1, 2)), (0, (7, 8)), (20, (7, 8, 9))])
    replicas = {}
    for rule in ("prefix-affinity", "least-loaded"):
        scenario = build_scenario(defaults={"topology": "continuous", "prefix_caching": True},
                                  run={"gpus": 1, "autoscaler": "fixed", "min_replicas": 2, "pool_rule": rule})
        log = simulate(trace, scenario, PROFILE, 0)
        replicas[rule] = (log["replica"].tolist(), log["cached_tokens"].tolist())
    assert replicas["prefix-affinity"] == ([0, 1, 1], [0, 0, 32])
    assert replicas["least-loaded"] == ([0, 1, 0], [0, 0, 0])
