"""Trace files (client and native formats), task classification, statistics, synthesis."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from simulator.errors import OutputError, SimctlWarning, SynthSpecError, TraceError
from simulator.trace.classify import DEFAULT_CLASSIFIER, KeywordClassifier, estimate_tokens
from simulator.trace.formats import detect_format, load_trace, save_trace
from simulator.trace.model import Call, Prompt, Trace
from simulator.trace.stats import trace_stats
from simulator.trace.synth import (
    SynthSpec,
    parse_prompts_per_call,
    parse_task_mix,
    parse_token_dists,
    synthesize,
)

ROOT = Path(__file__).resolve().parent.parent
REAL = (ROOT.parent / "shared" / "traces" / "real" / "lminference" / "EEElisa@dfb2bf8"
        / "mingqia2_3" / "request" / "batch_arrivals.json")


def write(tmp_path: Path, content, name: str = "trace.json") -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


# -- classification ------------------------------------------------------------------


@pytest.mark.parametrize("text, task", [
    ("Find the shortest path in this DIRECTED GRAPH", "graph"),
    ("You are given a graph with 5 nodes", "graph"),
    ("What is the path from node 3 to node 4?", "graph"),
    ("The following is a Multiple Choice Question about physics", "mmlu"),
    ("Instruction: write a haiku", "infobench"),
    ("Each node has an edge to the next", "graph"),            # weak graph rule
    ("Options: A, B. Answer:", "mmlu"),                        # weak mmlu rule
    ("Instruction: list each node and edge", "infobench"),     # strong beats weak
    ("knowledge about nodes", "graph"),                        # 'edge' in 'knowledge': plain substrings, as the server
    ("Tell me a joke", "unknown"),
])
def test_keyword_rules_give_the_servers_task(text, task):
    assert DEFAULT_CLASSIFIER.classify(text) == task


def test_every_default_task_has_an_example_text_that_classifies_back():
    for task in ("graph", "mmlu", "infobench"):
        assert DEFAULT_CLASSIFIER.classify(DEFAULT_CLASSIFIER.example_text(task)) == task


def test_custom_rules_and_bad_rules():
    clf = KeywordClassifier.from_dict({"code": ["def ", "class "]}, weak={"math": [["sum", "add"], "number"]})
    assert clf.classify("def f(): pass") == "code"
    assert clf.classify("add this number") == "math"
    assert clf.classify("add this") == "unknown"
    with pytest.raises(ValueError):
        KeywordClassifier.from_dict({"code": [""]})


@pytest.mark.parametrize("chars, tokens", [(0, 1), (1, 1), (4, 1), (5, 2), (400, 100), (401, 101)])
def test_token_estimate_is_a_quarter_of_the_characters_rounded_up(chars, tokens):
    assert estimate_tokens("x" * chars) == tokens


# -- reading: native format ----------------------------------------------------------


def test_native_wrapped_form_with_synonyms_and_bare_task_prompts(tmp_path):
    path = write(tmp_path, {"format": "simctl-trace/1", "meta": {"origin": "test"}, "calls": [
        {"id": "a", "t": 0.5, "prompts": [{"task": "mmlu", "prompt_tokens": 10, "max_tokens": 5}, "graph"]},
        {"timestamp": 2, "prompts": [{"task_type": "infobench"}]},
        {"id": 7, "arrival_time": 3, "prompts": [{"type": "mmlu", "prompt_tokens": None}]},
    ]})
    trace = load_trace(path)
    assert [c.id for c in trace.calls] == ["a", "1", "7"]
    assert [c.t for c in trace.calls] == [0.5, 2.0, 3.0]
    assert trace.calls[0].prompts == (Prompt("mmlu", 10, 5), Prompt("graph"))
    assert trace.calls[1].prompts == (Prompt("infobench"),)
    assert trace.meta["origin"] == "test" and trace.meta["format"] == "native"


def test_epoch_times_are_shifted_to_zero(tmp_path):
    path = write(tmp_path, [{"t": 1.7e9 + 5, "prompts": ["mmlu"]}, {"t": 1.7e9 + 1, "prompts": ["mmlu"]}])
    with pytest.warns(SimctlWarning, match="sorted"):
        trace = load_trace(path)
    assert trace.arrival_times().tolist() == [0.0, 4.0]
    assert trace.meta["epoch_start"] == 1.7e9 + 1


def test_iso_times_are_shifted_to_zero(tmp_path):
    path = write(tmp_path, [{"t": "2026-01-01T00:00:00Z", "prompts": ["mmlu"]},
                            {"t": "2026-01-01T00:01:30+00:00", "prompts": ["graph"]}])
    trace = load_trace(path)
    assert trace.arrival_times().tolist() == [0.0, 90.0]
    assert trace.meta["epoch_start_iso"].startswith("2026-01-01T00:00:00")


def test_unsorted_calls_are_sorted_stably_with_a_warning(tmp_path):
    path = write(tmp_path, [{"id": i, "t": t, "prompts": ["mmlu"]}
                            for i, t in enumerate([5, 1, 3, 1, 0])])
    with pytest.warns(SimctlWarning, match=r"record 1"):
        trace = load_trace(path)
    assert [c.id for c in trace.calls] == ["4", "1", "3", "2", "0"]  # equal times keep file order


@pytest.mark.parametrize("content, record, field, words", [
    ("", None, None, "empty"),
    ("[{\"t\": 1,, }]", None, None, "line 1, column"),
    ("{\"calls\": 3}", None, "calls", "list"),
    ("[]", None, None, "no calls"),
    ([{"prompts": ["mmlu"]}], 0, "t", "missing"),
    ([{"t": 0, "prompts": ["mmlu"]}, {"t": -1, "prompts": ["mmlu"]}], 1, "t", "non-negative"),
    ('[{"t": NaN, "prompts": ["mmlu"]}]', 0, "t", "NaN"),
    ([{"t": True, "prompts": ["mmlu"]}], 0, "t", "non-negative number"),
    ([{"t": "soon", "prompts": ["mmlu"]}], 0, "t", "ISO-8601"),
    ([{"t": 0}], 0, "prompts", "missing"),
    ([{"t": 0, "prompts": []}], 0, "prompts", "empty"),
    ([{"t": 0, "prompts": "mmlu"}], 0, "prompts", "list"),
    ([{"t": 0, "prompts": [{"task": "mmlu", "prompt_tokens": -3}]}], 0, "prompts[0].prompt_tokens", ">= 0"),
    ([{"t": 0, "prompts": [{"task": "mmlu", "prompt_tokens": 2.5}]}], 0, "prompts[0].prompt_tokens", "integer"),
    ([{"t": 0, "prompts": [{"task": "mmlu", "max_tokens": 0}]}], 0, "prompts[0].max_tokens", ">= 1"),
    ([{"t": 0, "prompts": [{"tokens": 3}]}], 0, "prompts[0].task", "missing"),
    ([{"t": 0, "time": 1, "prompts": ["mmlu"]}], 0, "time", "synonyms"),
    ([{"id": "x", "t": 0, "prompts": ["a"]}, {"id": "x", "t": 1, "prompts": ["a"]}], 1, "id", "duplicate"),
    ([{"t": 0, "prompts": ["a"]}, {"t": "2026-01-01T00:00:00", "prompts": ["a"]}], 1, "t", "mixes"),
    ([3], 0, None, "object"),
])
def test_bad_native_traces_name_file_record_and_field(tmp_path, content, record, field, words):
    path = write(tmp_path, content)
    with pytest.raises(TraceError) as info:
        load_trace(path)
    err = info.value
    assert (err.path, err.record, err.field) == (str(path), record, field)
    text = str(err)
    assert "\n" not in text and text.startswith(str(path)) and words in text
    if record is not None:
        assert f"record {record}" in text
    if field is not None:
        assert f"field '{field}'" in text


def test_missing_file_is_a_trace_error(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "nope.json")


# -- reading: client format ----------------------------------------------------------


def client_record(i, t, texts, **extra):
    return {"batch_id": i, "batch_size": len(texts), "arrival_time": t, "prompts": texts,
            "max_length": 2048, "prompt_idxs": list(range(len(texts))), **extra}


def test_client_format_classifies_texts_and_estimates_lengths(tmp_path):
    texts = ["The following is a multiple choice question: 2+2?", "Instruction: write a poem",
             "Find the shortest path from node 0 to node 3 in this directed graph."]
    path = write(tmp_path, [client_record(4, 3.09, texts[:2]), client_record(9, 7.5, texts[2:], max_length=64)])
    assert detect_format(json.loads(path.read_text())) == "client"
    trace = load_trace(path)
    assert [c.id for c in trace.calls] == ["4", "9"]
    prompts = [p for c in trace.calls for p in c.prompts]
    assert [p.task for p in prompts] == ["mmlu", "infobench", "graph"]
    assert [p.prompt_tokens for p in prompts] == [math.ceil(len(t) / 4) for t in texts]
    assert [p.max_tokens for p in prompts] == [2048, 2048, 64]
    assert prompts[0].text == texts[0]


def test_client_unclassified_prompts_are_kept_as_unknown_with_a_warning(tmp_path):
    path = write(tmp_path, [client_record(0, 0, ["hello there"])])
    with pytest.warns(SimctlWarning, match="1 prompt"):
        trace = load_trace(path)
    assert trace.calls[0].prompts[0].task == "unknown"
    assert trace_stats(trace).unknown == 1


@pytest.mark.parametrize("record, field", [
    ({"batch_size": 3}, "batch_size"),
    ({"prompt_idxs": [1]}, "prompt_idxs"),
    ({"max_length": 0}, "max_length"),
    ({"arrival_time": -2}, "arrival_time"),
    ({"prompts": ["Instruction: x", 5]}, "prompts[1]"),
    ({"batch_id": "seven"}, "batch_id"),
])
def test_bad_client_records_name_the_field(tmp_path, record, field):
    good = client_record(0, 1.0, ["Instruction: a", "Instruction: b"])
    path = write(tmp_path, [client_record(5, 0.0, ["Instruction: z"]), {**good, **record}])
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert (info.value.record, info.value.field) == (1, field)


# -- writing and round trips -----------------------------------------------------------


tasks = st.sampled_from(["graph", "mmlu", "infobench"])
prompts = st.builds(Prompt, tasks, st.one_of(st.none(), st.integers(1, 3000)),
                    st.one_of(st.none(), st.integers(1, 4096)))
calls = st.lists(st.tuples(st.integers(0, 10**9).map(lambda n: n / 1e6), st.lists(prompts, min_size=1, max_size=8)),
                 min_size=1, max_size=20)


def as_trace(drawn) -> Trace:
    drawn = sorted(drawn, key=lambda c: c[0])
    return Trace(tuple(Call(str(i), t, tuple(ps)) for i, (t, ps) in enumerate(drawn)))


@settings(max_examples=40, deadline=None)
@given(calls)
def test_native_round_trip_keeps_everything(tmp_path_factory, drawn):
    trace = as_trace(drawn)
    path = tmp_path_factory.mktemp("rt") / "t.json"
    save_trace(trace, path, "native")
    assert load_trace(path).calls == trace.calls


@settings(max_examples=40, deadline=None)
@given(calls)
def test_client_round_trip_keeps_ids_times_tasks_and_lengths(tmp_path_factory, drawn):
    trace = as_trace(drawn)
    path = tmp_path_factory.mktemp("rt") / "t.json"
    save_trace(trace, path, "client")
    back = load_trace(path)
    assert [(c.id, c.t) for c in back.calls] == [(c.id, c.t) for c in trace.calls]
    for ours, theirs in zip(trace.calls, back.calls, strict=True):
        assert [p.task for p in theirs.prompts] == [p.task for p in ours.prompts]
        for p, q in zip(ours.prompts, theirs.prompts, strict=True):
            # Placeholder texts are 4 chars per token; a token count below the keyword's length
            # cannot be kept, so the text is the keyword alone.
            if p.prompt_tokens is not None and 4 * p.prompt_tokens >= 40:
                assert q.prompt_tokens == p.prompt_tokens
        given_max = [p.max_tokens for p in ours.prompts if p.max_tokens is not None]
        assert {q.max_tokens for q in theirs.prompts} == {max(given_max) if given_max else 2048}


def test_saving_never_overwrites_without_force(tmp_path):
    trace = as_trace([(0.0, [Prompt("mmlu")])])
    path = write(tmp_path, "precious", "out.json")
    with pytest.raises(OutputError):
        save_trace(trace, path)
    assert path.read_text() == "precious"
    save_trace(trace, path, force=True)
    assert load_trace(path).calls == trace.calls


# -- statistics ----------------------------------------------------------------------


def test_statistics_by_hand():
    trace = Trace(tuple(Call(str(i), t, tuple(Prompt(k, 10 * (i + 1)) for k in ks)) for i, (t, ks) in enumerate([
        (1.0, ["mmlu"]), (3.0, ["mmlu", "graph"]), (4.0, ["graph"]), (10.0, ["infobench", "mmlu", "graph"]),
    ])))
    s = trace_stats(trace)
    gaps = np.array([2.0, 1.0, 6.0])
    assert (s.calls, s.prompts, s.span, s.duration) == (4, 7, 10.0, 9.0)
    assert s.call_rate == pytest.approx(0.4) and s.prompt_rate == pytest.approx(0.7)
    g = s.inter_arrival
    assert (g.count, g.mean, g.median, g.min, g.max) == (3, 3.0, 2.0, 1.0, 6.0)
    assert g.std == pytest.approx(gaps.std(ddof=1)) and g.cv == pytest.approx(gaps.std(ddof=1) / 3)
    assert s.prompts_per_call == {1: 2, 2: 1, 3: 1}
    assert s.task_counts == {"graph": 3, "infobench": 1, "mmlu": 3}
    assert s.task_fractions["graph"] == pytest.approx(3 / 7)
    assert s.tokens["mmlu"].prompt_tokens_mean == pytest.approx((10 + 20 + 40) / 3)
    json.dumps(s.to_dict())
    assert trace_stats(Trace((Call("0", 0.0, (Prompt("a"),)),))).inter_arrival is None


# -- synthesis -----------------------------------------------------------------------


def test_same_seed_same_trace_and_streams_are_independent():
    spec = SynthSpec(duration=2000, arrival="gamma", mean=10, cv=0.6)
    a, b, c = synthesize(spec, 1), synthesize(spec, 1), synthesize(spec, 2)
    assert a.calls == b.calls and a.calls != c.calls
    other_mix = SynthSpec(duration=2000, arrival="gamma", mean=10, cv=0.6, task_mix={"x": 0.5, "y": 0.5})
    d = synthesize(other_mix, 1)
    assert d.arrival_times().tolist() == a.arrival_times().tolist()
    assert [len(x.prompts) for x in d.calls] == [len(x.prompts) for x in a.calls]


@pytest.mark.parametrize("arrival, cv", [("poisson", 1.0), ("gamma", 0.5), ("lognormal", 0.8)])
def test_synthetic_gaps_have_the_stated_mean_and_cv(arrival, cv):
    # 20,000 gaps: a mean 5 % off, or a CV 8 % off, still lies 5 SE or more outside.
    n_target = 20_000
    spec = SynthSpec(duration=n_target * 2.0, arrival=arrival, mean=2.0, cv=cv)
    trace = synthesize(spec, 7)
    t = trace.arrival_times()
    assert 0 < t[0] and t[-1] <= spec.duration
    gaps = np.diff(t)
    n = gaps.size
    # Standard error of the mean is sd/sqrt(n); of the CV, about cv*sqrt((1/2 + cv^2)/n) for
    # these light-tailed shapes (delta method). 4 SE either side.
    assert abs(gaps.mean() - 2.0) < 4 * 2.0 * cv / math.sqrt(n)
    assert abs(gaps.std(ddof=1) / gaps.mean() - cv) < 4 * cv * math.sqrt((0.5 + cv**2) / n) + 1e-3


def test_synthetic_sizes_and_tasks_follow_the_mixes():
    spec = SynthSpec(duration=100_000, mean=5.0)
    trace = synthesize(spec, 3)
    s = trace_stats(trace)
    for size, p in spec.prompts_per_call.items():
        frac = s.prompts_per_call.get(size, 0) / s.calls
        assert abs(frac - p) < 4 * math.sqrt(p * (1 - p) / s.calls), size
    for task, p in spec.task_mix.items():
        assert abs(s.task_fractions[task] - p) < 4 * math.sqrt(p * (1 - p) / s.prompts), task


def test_text_forms_of_the_mixes():
    ppc = parse_prompts_per_call("1:0.25,2:0.2,3:0.3,4-8:0.25")
    assert ppc == pytest.approx({1: 0.25, 2: 0.2, 3: 0.3, 4: 0.05, 5: 0.05, 6: 0.05, 7: 0.05, 8: 0.05})
    assert parse_task_mix("graph:0.34,mmlu:0.36,infobench:0.3") == {"graph": 0.34, "mmlu": 0.36, "infobench": 0.3}
    dists = parse_token_dists("infobench:300:0.5,graph:700,2048")
    assert dists["graph"].to_dict() == {"fixed": 700}
    assert dists["*"].to_dict() == {"fixed": 2048}
    assert dists["infobench"].to_dict() == {"lognormal": {"mean": 300.0, "cv": 0.5}}


@pytest.mark.parametrize("parse, text", [
    (parse_prompts_per_call, "1:0.5,2:0.4"),
    (parse_prompts_per_call, "0:1"),
    (parse_prompts_per_call, "1-3:0.5,3:0.5"),
    (parse_prompts_per_call, "1:-0.5,2:1.5"),
    (parse_task_mix, "a:0.5,a:0.5"),
    (parse_task_mix, "a"),
    (parse_token_dists, "x:12.5"),
])
def test_bad_text_forms_are_rejected(parse, text):
    with pytest.raises(SynthSpecError):
        parse(text)


# -- the bundled and the real trace --------------------------------------------------


def test_bundled_trace_matches_its_stated_profile():
    s = trace_stats(load_trace(ROOT / "traces" / "batch_arrivals.json"))
    assert s.format == "client" and s.unknown == 0
    assert set(s.task_counts) == {"graph", "mmlu", "infobench"}
    assert 1100 < s.span <= 1200
    g = s.inter_arrival
    assert abs(g.mean - 10.05) < 0.5 and abs(g.median - 8.52) < 0.5 and g.cv < 1
    assert abs(g.max - 31.54) < 2 and abs(g.min - 0.43) < 0.5


def test_the_users_real_trace_reads_as_their_server_routes_it():
    if not REAL.exists():
        pytest.skip(f"the users' real trace is not here ({REAL}); it lives in ../shared")
    with warnings.catch_warnings():
        warnings.simplefilter("error", SimctlWarning)  # sorted, all classified, no odd fields
        trace = load_trace(REAL)
    s = trace_stats(trace)
    assert (s.calls, s.prompts) == (98, 300)
    assert s.task_counts == {"graph": 100, "infobench": 100, "mmlu": 100}
    assert s.first_arrival == pytest.approx(3.09, abs=0.01)
    assert s.span == pytest.approx(1151.7, abs=0.1)
