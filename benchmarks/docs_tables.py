"""Write a benchmark's figures into the docs, between its markers, so no figure is pasted.

A page holds ``<!-- BEGIN generated: NAME -->`` ... ``<!-- END generated: NAME -->``; a script
run with ``--write-docs`` replaces what is between them with what it measured.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent.parent / "docs"


def write_generated(name: str, text: str, page: str = "benchmarks.md") -> Path:
    """Replace the generated block ``name`` of ``docs/page`` with ``text``; the page path."""
    path = DOCS / page
    content = path.read_text()
    pattern = re.compile(rf"(<!-- BEGIN generated: {re.escape(name)} -->\n).*?(<!-- END generated: {re.escape(name)} -->)",
                         re.S)
    if not pattern.search(content):
        raise SystemExit(f"{path} has no generated block {name!r}")
    path.write_text(pattern.sub(lambda m: m.group(1) + text.rstrip("\n") + "\n" + m.group(2), content))
    return path


def write_row(first_cell: str, text: str, page: str = "benchmarks.md") -> Path:
    """Replace the Markdown table row of ``page`` (under ``docs/``, or ``README.md``) whose first
    cell starts with ``first_cell`` by the row ``text``: a marker cannot sit inside a table, so
    the row's first cell is its name. The page path."""
    path = DOCS.parent / page if page == "README.md" else DOCS / page
    lines = path.read_text().split("\n")
    found = [i for i, line in enumerate(lines) if line.startswith(f"| {first_cell}")]
    if len(found) != 1:
        raise SystemExit(f"{path} has {len(found)} table rows starting {first_cell!r}, not one")
    lines[found[0]] = text
    path.write_text("\n".join(lines))
    return path


def report(result: dict[str, Any], text: str, name: str, *, write_docs: bool, as_json: bool,
           page: str = "benchmarks.md") -> int:
    """A benchmark's ending: its block ``name`` of ``docs/page`` rewritten with ``text`` when
    asked, then the result printed as JSON or as ``text``; the exit status (0)."""
    if write_docs:
        write_generated(name, text, page=page)
    print(json.dumps(result, indent=2) if as_json else text)
    return 0
