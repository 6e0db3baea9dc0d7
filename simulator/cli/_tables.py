"""Rich tables drawn as plain text without rich's layout engine, where the console emits no
styles (a pipe, a file, a CI log): the same characters rich prints, at a fraction of the cost.

Rich lays a table out cell by cell through its general renderables (padding, measurement,
wrapping, segment shaping): about 10 ms a table, most of the time a short command takes. When
the console has no colour system, styles print nothing, so a table whose cells are single
lines and whose columns fit the console at their natural widths is fully determined by those
widths, the box's characters and each column's justification; :func:`render` draws it from
them. Anything outside that case (wrapping or squeezed columns, multi-line or non-printable
cells, captions, footers, fixed or ratio widths, coloured or recording consoles) returns
``None`` and the caller prints through rich. ``tests/test_cli_tables.py`` compares the two
over random tables, so they cannot drift apart.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.console import Console
from rich.errors import MarkupError
from rich.segment import Segment
from rich.style import Style
from rich.table import Table


def _plain(console: Console, cell: object) -> str | None:
    """The text rich would show for ``cell``, or ``None`` where it is not a plain string.

    Only ``[`` (markup) and ``:`` (emoji codes) make rich's text differ from the string, so
    other strings are taken as they are. Broken markup is left to rich, which decides
    whether and how it fails."""
    if not isinstance(cell, str):
        return None
    if "[" in cell or ":" in cell:
        try:
            cell = console.render_str(cell).plain
        except MarkupError:
            return None
    return cell if cell.isprintable() else None


def render(table: Table, console: Console) -> str | None:
    """``table`` as ``console.print(table)`` would print it, or ``None`` where this drawing
    would not be exactly rich's (see the module docstring); then print through rich."""
    if (console.color_system is not None or console.record or console.is_jupyter or not table.columns
            or table.width is not None or table.min_width is not None or table.expand or table.caption
            or table.show_footer or table.show_lines or table.leading or table.collapse_padding):
        return None
    top, pad_right, bottom, pad_left = table.padding
    if top or bottom:
        return None
    options = console.options
    columns = table.columns
    count = len(columns)
    header = table.show_header
    texts: list[list[str]] = []  # per column: header (if shown), then its cells
    for column in columns:
        if (column.width is not None or column.max_width is not None or column.ratio is not None
                or column.justify not in ("left", "right", "center", "default")):
            return None
        cells = [column.header, *column._cells] if header else list(column._cells)
        plain = []
        for cell in cells:
            text = _plain(console, cell)
            if text is None:
                return None
            plain.append(text)
        texts.append(plain)
    box = table.box
    extra = (2 if box and table.show_edge else 0) + (count - 1 if box else 0)
    room = options.max_width - extra
    # Each column's width as rich measures it: its widest cell plus its padding (which
    # pad_edge=False takes off at the table's outer edges), at least min_width plus that
    # padding, and never 0.
    widths: list[int] = []
    pads: list[tuple[int, int]] = []
    for index, (column, plain) in enumerate(zip(columns, texts, strict=True)):
        left = 0 if not table.pad_edge and index == 0 else pad_left
        right = 0 if not table.pad_edge and index == count - 1 else pad_right
        if room - left - right < 1:
            return None
        natural = max((cell_len(p) for p in plain), default=0) + left + right if plain else room
        if column.min_width is not None:
            natural = max(natural, column.min_width + left + right)
        widths.append(natural or 1)
        pads.append((left, right))
    table_width = sum(widths) + extra
    if table_width > options.max_width:
        return None  # rich would wrap or squeeze the columns
    out: list[str] = []
    if table.title:
        title_options = options.update(width=table_width, highlight=table.highlight, height=None)
        title = (console.render_str(table.title, style=Style.pick_first(table.title_style, "table.title"),
                                    highlight=False) if isinstance(table.title, str) else table.title)
        out.extend(s.text for s in console.render(title, title_options.update(justify=table.title_justify))
                   if not s.control)
    if box:
        box = box.substitute(options, safe=table.safe_box if table.safe_box is not None else console.safe_box)
        if not header:
            box = box.get_plain_headed_box()
    edge = table.show_edge
    if box and edge:
        out.append(box.get_top(widths) + "\n")
    rows = len(texts[0])
    for r in range(rows):
        first, last = r == 0, r == rows - 1
        line = []
        for c in range(count):
            text = texts[c][r]
            left, right = pads[c]
            inner = widths[c] - left - right
            justify = columns[c].justify
            if justify in ("right", "center"):
                text = text.rstrip()  # rich strips a line before it aligns it right or centre
            space = inner - cell_len(text)
            before = space if justify == "right" else space // 2 if justify == "center" else 0
            line.append(" " * (left + before) + text + " " * (space - before + right))
        if box:
            row_left, row_right, divider = (
                (box.head_left, box.head_right, box.head_vertical) if first
                else (box.foot_left, box.foot_right, box.foot_vertical) if last
                else (box.mid_left, box.mid_right, box.mid_vertical))
            text_line = divider.join(line)
            out.append((row_left + text_line + row_right if edge else text_line) + "\n")
        else:
            out.append("".join(line) + "\n")
        if box and first and header:
            out.append(box.get_row(widths, "head", edge=edge) + "\n")
        elif box and not last:
            row = table.rows[r - header]
            if row.end_section:
                out.append(box.get_row(widths, "row", edge=edge) + "\n")
    if box and edge:
        out.append(box.get_bottom(widths) + "\n")
    return "".join(out)


def print_table_fast(table: Table, console: Console) -> None:
    """Print ``table`` on ``console``: drawn by :func:`render` where it can, else by rich."""
    text = render(table, console)
    if text is None:
        console.print(table)
    else:
        # Through the console (not its file) so that capture and its lock still apply; crop
        # off, as the text fits the console already.
        console.print(_Segments(text), crop=False)


class _Segments:
    """Text already laid out, printed as it is."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __rich_console__(self, console: Console, options: object) -> list[Segment]:
        return [Segment(self.text)]
