"""Fuzzing every input simctl reads and every option it takes, held to one contract
(``tests/fuzzing.py``): exit 0 with readable outputs or exit 2 with one ``error:`` line, no
traceback, inputs byte-identical, no partial output.

Classes (the names ``benchmarks/hostile_inputs.py`` reports): JSON structure, one field of
a valid document made hostile, TOML, CSV rows for the importers, raw bytes, mutations of the
bundled files and of the real traces, every option of every command, and every setting
through ``--set``. Hypothesis is derandomized with no database, so CI runs the same cases
every time; ``FUZZ_EXAMPLES`` examples a class by default, and ``FUZZ_MORE_EXAMPLES`` other
ones (another seed) under ``slow``.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest
from fuzzing import (
    HOSTILE_CELLS,
    HOSTILE_JSON,
    HOSTILE_VALUES,
    REAL,
    ROOT,
    base_args,
    check,
    commands,
    hostile_file,
    mutate,
    option_values,
    replace_at,
    workspace,
)
from hypothesis import HealthCheck, given, seed as hypothesis_seed, settings, strategies as st

#: cases a class in the suite: the fast selection's, and half as many again from another seed
#: in the slow tests (benchmarks/hostile_inputs.py tries 1,000 a class for docs/robustness.md)
FUZZ_EXAMPLES = 100
FUZZ_MORE_EXAMPLES = 50


def _profile(examples: int):
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


DEFAULT = _profile(FUZZ_EXAMPLES)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | st.sampled_from(HOSTILE_JSON),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["t", "prompts", "task", "calls", "format", "tasks", "service", "kind", "mean", "meta",
                         "max_tokens", "prompt_tokens", "id", "ttfts", "request_throughput", "backend"])
        | st.text(max_size=5), inner, max_size=4),
    max_leaves=12)
ops = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 2**20), st.integers(0, 255)), min_size=1, max_size=4)


def _dumps(value: object) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


# -- JSON structure, and one field of a valid document ------------------------------------

def json_structure(data) -> None:
    doc = data.draw(json_values)
    kind = data.draw(st.sampled_from(["trace", "profile", "observed", "servegen"]))
    f = workspace()
    path = hostile_file(f"doc.{kind}.json", _dumps(doc))
    args = {"trace": ["replay", str(path)], "profile": ["replay", str(f["trace"]), "--profile", str(path)],
            "observed": ["observed", str(path)],
            "servegen": ["import", "servegen", str(f["servegen_csv"]), "--dataset", str(path),
                         "-o", str(f["folder"] / "i.json")]}[kind]
    check("JSON structure", args, [path])


def json_field(data) -> None:
    f = workspace()
    kind = data.draw(st.sampled_from(["trace", "profile"]))
    doc = json.loads(f[kind].read_text())
    value = data.draw(st.sampled_from(HOSTILE_JSON) | json_values)
    mutated = replace_at(doc, data.draw(st.lists(st.integers(0, 50), min_size=1, max_size=6)), value)
    path = hostile_file(f"field.{kind}.json", _dumps(mutated))
    args = ["replay", str(path)] if kind == "trace" else ["replay", str(f["trace"]), "--profile", str(path)]
    if data.draw(st.booleans()):
        args += ["--json", str(f["folder"] / "o.json")]
    check("JSON field", args, [path])


# -- TOML ---------------------------------------------------------------------------------

def toml_structure(data) -> None:
    f = workspace()
    lines = f["scenario"].read_text().splitlines()
    editable = [i for i, line in enumerate(lines) if "=" in line and not line.lstrip().startswith("#")]
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.sampled_from(editable))
        key = lines[i].split("=", 1)[0]
        value = data.draw(st.sampled_from(["nan", "inf", "-inf", "1e400", "9" * 25, "-1", "0", '"bogus"', "[]", "{}",
                                           "true", '"' + "\u00e9" * 3 + '"', "[[[[1]]]]", "1979-05-27", "0x7fffffff"])
                          | st.text(max_size=6))
        lines[i] = f"{key}= {value}"
    if data.draw(st.booleans()):
        lines.insert(data.draw(st.integers(0, len(lines))), data.draw(
            st.sampled_from(["[run]", "[tasks.x]", "[[tasks]]", "x = 1", "a.b.c = 2", "[defaults]", "==="])))
    path = hostile_file("s.toml", "\n".join(lines).encode("utf-8", "surrogatepass"))
    check("TOML", ["replay", str(f["trace"]), "--config", str(path)], [path])


# -- CSV rows for the importers -----------------------------------------------------------

HEADERS = {"azure": "TIMESTAMP,ContextTokens,GeneratedTokens",
           "burstgpt": "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
           "servegen": None}


def csv_structure(data) -> None:
    fmt = data.draw(st.sampled_from(sorted(HEADERS)))
    width = data.draw(st.integers(1, 7))
    rows = data.draw(st.lists(st.lists(st.sampled_from(HOSTILE_CELLS) | st.text(max_size=4), min_size=width,
                                       max_size=width + data.draw(st.integers(0, 1))), min_size=0, max_size=5))
    header = [HEADERS[fmt]] if HEADERS[fmt] and data.draw(st.integers(0, 4)) else []
    text = "\n".join(header + [",".join(r) for r in rows])
    path = hostile_file(f"rows.{fmt}.csv", text.encode("utf-8", "surrogatepass"))
    given_format = data.draw(st.sampled_from([fmt, "auto"]))
    check("CSV rows", ["import", given_format, str(path), "-o", str(workspace()["folder"] / "i.json")], [path])


# -- raw bytes, and mutations of the bundled and the real files ---------------------------

READERS = {  # how a file of each kind is handed to simctl ({f}: the file)
    "trace": ["replay", "{f}"], "profile": ["replay", "{trace}", "--profile", "{f}"],
    "scenario": ["replay", "{trace}", "--config", "{f}"], "events": ["plot", "cdf", "{f}", "-o", "{out}/c.png"],
    "sweep": ["compare", "{f}"], "import": ["import", "auto", "{f}", "-o", "{out}/i.json"],
}
SUFFIX = {"trace": ".json", "profile": ".json", "scenario": ".toml", "events": ".parquet", "sweep": ".parquet",
          "import": ".csv"}


def _reader(kind: str, path: Path) -> list[str]:
    f = workspace()
    return [a.replace("{f}", str(path)).replace("{trace}", str(f["trace"])).replace("{out}", str(f["folder"]))
            for a in READERS[kind]]


def raw_bytes(data) -> None:
    kind = data.draw(st.sampled_from(sorted(READERS)))
    if data.draw(st.booleans()):
        content = data.draw(st.binary(max_size=64))
    else:  # a valid file of that kind, mutated
        source = {"trace": "trace", "profile": "profile", "scenario": "scenario", "events": "events",
                  "sweep": "sweep", "import": "azure_csv"}[kind]
        content = mutate(workspace()[source].read_bytes(), data.draw(ops))
    path = hostile_file(f"raw{SUFFIX[kind]}", content)
    check("raw bytes", _reader(kind, path), [path])


BUNDLED = [(p, "trace" if p.suffix == ".json" else "import") for p in sorted((ROOT / "traces").glob("*.*"))
           if p.suffix in (".json", ".csv")] + \
          [(p, "profile") for p in sorted((ROOT / "profiles").glob("*.json"))] + \
          [(p, "scenario") for p in sorted((ROOT / "scenarios").glob("*.toml"))]


def bundled_mutation(data) -> None:
    source, kind = data.draw(st.sampled_from(BUNDLED))
    content = source.read_bytes()[:20000]  # the head: a mutated 100-call trace replays in milliseconds
    path = hostile_file(f"bundled{source.suffix}", mutate(content, data.draw(ops)))
    check("bundled files mutated", _reader(kind, path), [path, source])


def _real_files() -> list[Path]:
    return sorted(p for p in REAL.glob("*/*") if p.suffix in (".csv", ".jsonl") and "dataset" not in p.name)


def real_mutation(data) -> None:
    source = data.draw(st.sampled_from(_real_files()))
    with source.open("rb") as fh:
        head = b"".join(fh.readline() for _ in range(40))
    path = hostile_file(f"real{source.suffix}", mutate(head, data.draw(ops)))
    fmt = data.draw(st.sampled_from(["auto", {"azure_llm_2023": "azure", "burstgpt": "burstgpt",
                                              "mooncake_fast25": "mooncake", "servegen_sample": "servegen"}
                                     .get(source.parent.name, "auto")]))
    check("real traces mutated", ["import", fmt, str(path), "-o", str(workspace()["folder"] / "i.json")], [path])


# -- every option of every command, every setting -----------------------------------------

@functools.cache
def _options() -> list[tuple[str, str]]:
    found = []
    for words, command in commands().items():
        for param in command.params:  # type: ignore[attr-defined]
            if param.param_type_name == "option" and not getattr(param, "is_flag", False):
                found.append((words, param.opts[0]))
    return sorted(found)


@functools.cache
def _settings() -> dict[str, object]:
    from simulator.settings import SETTINGS

    return {s.name: s for s in SETTINGS}


def every_option(data) -> None:
    words, option = data.draw(st.sampled_from(_options()))
    setting = _settings().get(option.lstrip("-").replace("-", "_"))
    value = data.draw(st.sampled_from(option_values(option, setting)))
    args = base_args(words)
    if option in args:  # the base gives it: replace its value
        i = args.index(option)
        args = args[:i] + args[i + 2:]
    force = data.draw(st.booleans()) and "--force" in _flags(words)
    copy = None
    if force and Path(value).is_file() and not Path(value).is_symlink():
        # --force may overwrite the file an output option names: a copy in the case folder
        # is named, so the workspace file (an input of other cases) stays as it was.
        copy = workspace()["folder"] / f"copy-{Path(value).name}"
        shutil.copyfile(value, copy)
        value = str(copy)
    args += [option, value] + (["--force"] if force else [])
    try:
        check("options", args)
    finally:
        if copy is not None:
            copy.unlink(missing_ok=True)


@functools.cache
def _flags(words: str) -> set[str]:
    return {opt for p in commands()[words].params for opt in p.opts  # type: ignore[attr-defined]
            if getattr(p, "is_flag", False)}


def every_setting(data) -> None:
    name, setting = data.draw(st.sampled_from(sorted(_settings().items())))
    scope = {"run": ["run."], "task": ["defaults.", "tasks.infobench.", "tasks.nope."]}.get(
        getattr(setting, "scope", ""), ["run.", "defaults."])
    key = data.draw(st.sampled_from(scope)) + name
    value = data.draw(st.sampled_from(option_values("--set", setting) + ["[1]", "{}", '"x"']))
    check("settings (--set)", base_args("replay") + ["--set", f"{key}={value}"])


CLASSES = {"JSON structure": json_structure, "JSON field": json_field, "TOML": toml_structure,
           "CSV rows": csv_structure, "raw bytes": raw_bytes, "bundled files mutated": bundled_mutation,
           "real traces mutated": real_mutation, "options": every_option, "settings (--set)": every_setting}


def fuzz(klass: str, examples: int, seed: int | None = None):
    """The hypothesis test of ``klass`` at ``examples`` examples (the benchmark runs these);
    ``seed``: other cases than the derandomized default ones, the same ones every run."""
    test = given(data=st.data())(CLASSES[klass])
    if seed is not None:
        test = hypothesis_seed(seed)(test)
    return _profile(examples)(test)


@pytest.mark.parametrize("klass", sorted(CLASSES))
def test_fuzz(klass):
    if klass == "real traces mutated" and not REAL.is_dir():
        pytest.skip(f"the real traces are not here ({REAL}): they live in the shared folder beside the repository")
    fuzz(klass, FUZZ_EXAMPLES)()


@pytest.mark.slow
@pytest.mark.parametrize("klass", sorted(CLASSES))
def test_fuzz_more(klass):
    if klass == "real traces mutated" and not REAL.is_dir():
        pytest.skip(f"the real traces are not here ({REAL})")
    fuzz(klass, FUZZ_MORE_EXAMPLES, seed=19)()


def test_the_fuzz_starts_from_valid_inputs():
    """Each base command line is valid (exit 0), so the fuzz explores past the first check."""
    from fuzzing import runner

    from simulator.cli import app

    for words in commands():
        if words == "calibrate":  # its run folder is empty on purpose: a fit takes minutes
            continue
        result = runner.invoke(app, base_args(words) + (["--force"] if "--force" in _flags(words) else []))
        assert result.exit_code == 0, (words, result.output)
    assert len(_options()) > 100 and HOSTILE_VALUES


# -- what the fuzz found, each pinned ------------------------------------------------------

@pytest.mark.parametrize("args, needles", [
    (["replay", "{trace}", "--seed", "x"], ["simctl replay", "'--seed'", "valid integer"]),
    (["calibrate", "{folder}", "--max-evaluations", ""], ["'--max-evaluations'"]),
    (["replay", "{trace}", "--bogus"], ["No such option: --bogus"]),
    (["nope"], ["No such command 'nope'"]),
])
def test_a_usage_error_is_one_line_not_a_framed_box(args, needles):
    """Click's own errors (a value that does not parse, an unknown option) printed a framed
    box of five lines."""
    from fuzzing import runner
    from helpers import assert_one_line_error

    from simulator.cli import app

    f = workspace()
    args = [a.replace("{trace}", str(f["trace"])).replace("{folder}", str(f["folder"])) for a in args]
    assert_one_line_error(runner.invoke(app, args), *needles)


@pytest.mark.parametrize("extra, needles", [
    (["--mean", "1e-320"], ["--duration", "at most 50,000,000"]),
    (["--duration", "1e300"], ["--duration", "1e+299 calls"]),
    (["--arrival", "gamma", "--cv", "1000"], ["--cv", "at most 10"]),
])
def test_synth_refuses_absurd_work_up_front(tmp_path, extra, needles):
    """A tiny mean gap, a huge duration or a huge CV (gaps underflowing to 0) drew gaps forever."""
    from fuzzing import runner
    from helpers import assert_one_line_error

    from simulator.cli import app

    args = ["synth", "-o", str(tmp_path / "s.json"), "--duration", "600", *extra]
    assert_one_line_error(runner.invoke(app, args), *needles)
    assert not (tmp_path / "s.json").exists()
