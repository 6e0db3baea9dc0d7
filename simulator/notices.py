"""One-line notices of the library's slow steps, for whoever runs it to show.

Library code prints nothing: it calls :func:`say`, which hands the line to :data:`show`
when one is set. The CLI sets :data:`show` to print on stderr at once (before the step, so
a user waiting knows why); a program or notebook calling the library sees nothing unless it
sets one too.
"""

from __future__ import annotations

from collections.abc import Callable

#: Where a notice goes; ``None``: nowhere.
show: Callable[[str], None] | None = None


def say(line: str) -> bool:
    """Hand ``line`` to :data:`show`; whether anyone was there to show it."""
    if show is None:
        return False
    show(line)
    return True
