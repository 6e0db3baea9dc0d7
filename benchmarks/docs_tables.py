"""Write a benchmark's figures into the docs, between its markers, so no figure is pasted.

A page holds ``<!-- BEGIN generated: NAME -->`` ... ``<!-- END generated: NAME -->``; a script
run with ``--write-docs`` replaces what is between them with what it measured.
"""

from __future__ import annotations

import re
from pathlib import Path

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
