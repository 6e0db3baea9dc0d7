"""Command-line values converted without pydantic (simulator.cli._coercion): the same values
and the same errors as typer's own conversion, and no pydantic imported by a plain command."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st
from typer.testing import CliRunner

from simulator.cli import _load, app
from simulator.cli._coercion import _PlainRuntime

#: Values as a command line gives them: plain numbers and words, and every near miss.
values = st.one_of(
    st.none(),
    st.integers(-10**20, 10**20).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["007", "-0", "+5", " 5", "5 ", "1_000", "1.", ".5", "1e3", "1E-3", "-0.0", "1e400", "inf", "nan",
                     "", "abc", "0x10", "１２", "1.5.2", "--", "True", "ü", "a\udcff"]),
    st.text(max_size=6),
    st.integers(-10**6, 10**6),
    st.floats(allow_nan=False, width=64),
    st.lists(st.text(max_size=4), max_size=3).map(tuple),
)


def _outcome(convert, value, param):
    try:
        out = convert(value, param)
    except Exception as exc:  # noqa: BLE001  (typer's BadParameter, or what pydantic raises)
        return ("error", type(exc).__name__, str(exc))
    if isinstance(out, float) and math.isnan(out):
        return ("value", "nan")
    return ("value", type(out).__name__, repr(out), math.copysign(1, out) if isinstance(out, float) else None)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_plain_conversion_gives_typers_values_and_errors(data):
    command = _load("replay")
    params = [p for p in command.params if hasattr(p, "type_descriptor")]
    param = data.draw(st.sampled_from(params))
    value = data.draw(values)
    plain = _PlainRuntime(param, lambda: type(param).get_runtime_param(param))
    typers = type(param).get_runtime_param(param)
    mine = _outcome(lambda v, p: plain.coerce(v, param=p, ctx=None), value, param)
    theirs = _outcome(lambda v, p: typers.coerce(v, param=p, ctx=None), value, param)
    assert mine == theirs, (param.name, param.type_descriptor.annotation, value)


def test_a_plain_replay_imports_no_pydantic(tmp_path):
    code = ("import sys; sys.argv = ['simctl', 'replay', 'example', '-c', 'design-notes', '--flush', '0.5', "
            "'--max-batch', '4', '--set', 'tasks.mmlu.flush=1', '--json', sys.argv[1]]\n"
            "from simulator.cli import main\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "print('pydantic' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s.json")], capture_output=True, text=True,
                         check=True)
    assert out.stdout.split()[-1] == "False"
    assert (tmp_path / "s.json").stat().st_size > 0


@pytest.mark.parametrize(("args", "needle"), [
    (["--flush", "abc"], "Invalid value for '--flush': Input should be a valid number"),
    (["--seed", "-1"], "Invalid value for '--seed': Input should be greater than or equal to 0"),
    (["--max-batch", "1.5"], "Invalid value for '--max-batch': Input should be a valid integer"),
    (["--seed", "007"], None),  # (not plain: typer's own reads it, as 7)
])
def test_values_that_are_not_plain_get_typers_answer(args, needle):
    result = CliRunner().invoke(app, ["replay", "example", "-c", "design-notes", *args])
    if needle is None:
        assert result.exit_code == 0, result.output
    else:
        assert result.exit_code == 2 and needle in result.output
