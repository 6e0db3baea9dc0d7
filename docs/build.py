"""Rewrite the outputs of the console examples in README.md and docs/*.md from a fresh run,
and the tables made from the code (the scenario settings of docs/model.md).

    python docs/build.py             # every page
    python docs/build.py README.md   # one page

See docs/runner.py for what is run and how; tests/test_docs.py fails where a page differs,
tests/test_settings.py where the settings table does.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runner import PAGES, ROOT, render, run_page  # noqa: E402


def write_settings_table() -> None:
    """The scenario-settings block of docs/model.md, from simulator.settings."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from docs_tables import write_generated

    from simulator.settings import reference_table

    page = ROOT / "docs" / "model.md"
    before = page.read_text()
    write_generated("scenario-settings", reference_table(), page="model.md")
    if page.read_text() != before:
        print(f"updated {page.relative_to(ROOT)} (scenario settings)")


def write_prices_table() -> None:
    """The price-tables block of docs/sweep-and-plan.md, from the bundled price files."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from docs_tables import write_generated

    from simulator.cost import prices_reference

    write_generated("price-tables", prices_reference(), page="sweep-and-plan.md")


def main(names: list[str]) -> int:
    pages = [ROOT / n for n in names] if names else PAGES
    if not names or "docs/model.md" in names:
        write_settings_table()
    if not names or "docs/sweep-and-plan.md" in names:
        write_prices_table()
    failed = 0
    for page in pages:
        text, blocks = run_page(page)
        for block in blocks:
            # a skipped block records no status: zip stops at the commands that ran
            for command, status in zip(block.commands, block.status, strict=False):
                if status != 0:
                    failed += 1
                    print(f"{page.name}: exit {status}: $ {command}", file=sys.stderr)
        new = render(text, blocks)
        if new != text:
            page.write_text(new)
            print(f"updated {page.relative_to(ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
