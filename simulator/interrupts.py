"""Ctrl-C held across the few places where Python would print it and lose it.

Python runs its signal handlers between bytecodes of the main thread, wherever that is. Two
places of simctl run Python inside machinery that swallows exceptions: llvmlite's object-cache
hook while the compiled kernel loads (a C callback), and the at-fork hooks that run while a
sweep forks its workers (``logging`` registers one). A ``KeyboardInterrupt`` raised there is
printed with its traceback ("Exception ignored in ...") and then lost, so the command would go
on and exit 0. :func:`sigint_deferred` holds the Ctrl-C and raises it as the block ends; for
such places in libraries, :func:`carry_lost_interrupts` has the command line deliver a lost
Ctrl-C again."""

from __future__ import annotations

import _thread
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType


class HeldSigint:
    """The SIGINT handler while a Ctrl-C is held: it only records that one came."""

    def __init__(self) -> None:
        self.caught = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.caught = True


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """Hold a Ctrl-C that arrives inside the block and raise it (``KeyboardInterrupt``) as the
    block ends. Only where Python's own Ctrl-C handler is installed, in the main thread (a
    notebook's or a server's handler is left alone)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    held = HeldSigint()
    signal.signal(signal.SIGINT, held)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if held.caught:
        raise KeyboardInterrupt


def release_inherited_sigint() -> None:
    """In a process forked inside :func:`sigint_deferred`: take Python's own Ctrl-C handler
    back (the fork copied the holding one, which would swallow every Ctrl-C)."""
    if isinstance(signal.getsignal(signal.SIGINT), HeldSigint):
        signal.signal(signal.SIGINT, signal.default_int_handler)


#: Seconds before a swallowed Ctrl-C is delivered again (long enough for the hook to return).
REDELIVERY_DELAY_S = 0.01


def _carry_interrupt(unraisable: sys.UnraisableHookArgs) -> None:
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        # Swallowed where it was raised (a C callback, a Cython ``noexcept`` function calling
        # Python, an at-fork hook): deliver it again a moment later, from another thread, so
        # that it is raised once this hook has returned (delivered now, it would be raised in
        # here and lost again). Swallowed again, it comes back here and goes round again until
        # it reaches code that can propagate it. Nothing is printed; the command says it was
        # interrupted.
        try:
            redeliver = threading.Timer(REDELIVERY_DELAY_S, _thread.interrupt_main)
            redeliver.daemon = True
            redeliver.start()
        except KeyboardInterrupt:  # a second Ctrl-C while scheduling: the one scheduled is enough
            pass
        return
    sys.__unraisablehook__(unraisable)


def carry_lost_interrupts() -> None:
    """Make every Ctrl-C stop the command, even one that lands inside code that cannot raise
    it (scipy's Sobol set-up reads its tables from such a function, calibrate's screening
    calls it): Python would print "Exception ignored ... KeyboardInterrupt" and go on. For
    the command line's process; a library user's notebook keeps its own hook."""
    sys.unraisablehook = _carry_interrupt
