"""Rewrite the outputs of the console examples in README.md and docs/*.md from a fresh run.

    python docs/build.py             # every page
    python docs/build.py README.md   # one page

See docs/runner.py for what is run and how; tests/test_docs.py fails where a page differs.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runner import PAGES, ROOT, render, run_page  # noqa: E402


def main(names: list[str]) -> int:
    pages = [ROOT / n for n in names] if names else PAGES
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
