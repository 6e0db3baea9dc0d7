"""Tables drawn without rich's layout engine (``simulator/cli/_tables.py``) print exactly
what rich prints, over random tables: headers and cells of any width (wide characters,
markup, emoji codes, trailing spaces, line breaks), every justification, titles that wrap,
boxes, edges, padding, sections and consoles too narrow for the table (where the drawing
hands over to rich, and ``print_table`` splits the columns)."""

from __future__ import annotations

import io

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from rich import box
from rich.console import Console
from rich.errors import MarkupError
from rich.table import Table

import simulator.cli._common as common
from simulator.cli._tables import print_table_fast, render

#: characters that exercise rich's text handling: wide (two cells), spaces (trailing ones are
#: stripped before right and centre alignment), and in some tables markup, emoji codes and
#: line breaks (which rich lays out itself)
PLAIN = list("ab9.,-% 字ü—") + ["  "]
RICH = ["[bold]", "[/bold]", ":smile:", "\n"]


def cells(alphabet: list[str]) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(alphabet), max_size=6).map("".join)


BOXES = [box.SIMPLE_HEAD, box.HEAVY_HEAD, box.ROUNDED, box.ASCII, box.MINIMAL, box.SIMPLE, None]


@st.composite
def tables(draw) -> dict:
    columns = draw(st.integers(1, 6))
    # most tables plain, so that most examples exercise the drawing rather than rich alone
    cell_text = cells(PLAIN + RICH if draw(st.sampled_from([False, False, True])) else PLAIN)
    return {
        "headers": draw(st.lists(cell_text, min_size=columns, max_size=columns)),
        "justify": draw(st.lists(st.sampled_from(["left", "right", "center", "default"]),
                                 min_size=columns, max_size=columns)),
        "min_width": draw(st.lists(st.none() | st.integers(0, 12), min_size=columns, max_size=columns)),
        "rows": draw(st.lists(st.tuples(st.lists(cell_text, min_size=columns, max_size=columns), st.booleans()),
                              max_size=5)),
        "title": draw(st.none() | st.just("") | st.lists(st.sampled_from(["word", "a", "longer-word", " ", "字",
                                                                            "[bold]x[/bold]"]), max_size=15).map("".join)),
        "title_justify": draw(st.sampled_from(["left", "right", "center"])),
        "box": draw(st.sampled_from(BOXES)),
        "show_header": draw(st.booleans()),
        "show_edge": draw(st.booleans()),
        "pad_edge": draw(st.booleans()),
        "padding": draw(st.sampled_from([(0, 1), (0, 0), (0, 2), (0, 1, 0, 3), (0, 1), (1, 1)])),
        "width": draw(st.integers(8, 120)),
    }


def build(spec: dict) -> Table:
    table = Table(title=spec["title"], title_justify=spec["title_justify"], box=spec["box"],
                  show_header=spec["show_header"], show_edge=spec["show_edge"], pad_edge=spec["pad_edge"],
                  padding=spec["padding"])
    for header, justify, min_width in zip(spec["headers"], spec["justify"], spec["min_width"], strict=True):
        table.add_column(header, justify=justify, min_width=min_width)
    for cells, end_section in spec["rows"]:
        table.add_row(*cells, end_section=end_section)
    return table


def console(width: int, **kwargs) -> Console:
    return Console(file=io.StringIO(), width=width, **kwargs)


def printed(spec: dict, how) -> str:
    """What ``how`` prints of the table; a cell's broken markup is rich's error either way."""
    out = console(spec["width"])
    try:
        how(build(spec), out)
    except MarkupError as exc:
        return f"MarkupError: {exc}"
    return out.file.getvalue()


def by_rich(table: Table, out: Console) -> None:
    out.print(table)


FUZZ = settings(max_examples=100, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))


@FUZZ
@given(tables())
def test_drawing_prints_what_rich_prints(spec: dict) -> None:
    assert printed(spec, print_table_fast) == printed(spec, by_rich)


@FUZZ
@given(tables())
def test_print_table_prints_what_it_printed_through_rich_alone(spec: dict) -> None:
    """``print_table`` (widths kept, columns split where the console is too narrow) prints
    the same through the drawing as through rich alone."""
    fast = printed(spec, common.print_table)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(common, "print_table_fast", by_rich)
        slow = printed(spec, common.print_table)
    assert fast == slow


def summary_like() -> Table:
    """A table as the commands print them (``simctl replay``'s latency table)."""
    table = Table(title="Latency per task (seconds)", title_justify="left", box=box.SIMPLE_HEAD,
                  padding=(0, 1), pad_edge=False)
    for col in ("task", "mean", "p95"):
        table.add_column(col, justify="left" if col == "task" else "right")
    table.add_row("infobench", "127.7", "172.4")
    table.add_row("overall", "41.2", "146.8", end_section=True)
    return table


def test_the_commands_tables_are_drawn_without_rich() -> None:
    """The case the drawing exists for is drawn by it (so the comparisons above compare
    it, not rich with itself), and comes out as rich prints it."""
    out = console(80)
    assert render(summary_like(), out) is not None
    print_table_fast(summary_like(), out)
    reference = console(80)
    reference.print(summary_like())
    assert out.file.getvalue() == reference.file.getvalue()


@pytest.mark.parametrize("kwargs", [{"force_terminal": True, "color_system": "standard"}, {"record": True}])
def test_consoles_that_style_or_record_print_through_rich(kwargs: dict) -> None:
    assert render(summary_like(), console(80, **kwargs)) is None


def test_a_table_wider_than_the_console_is_left_to_rich() -> None:
    assert render(summary_like(), console(20)) is None
