"""A wait a runtime does in the middle of an action (an old process's graceful exit), done
aside: while it lasts, the other actions of the batch take their turns (``node.batches``).

The driver cannot be handed the batch's ``Wait`` through its interface without every runtime
growing a parameter, so the thread applying an action carries it. Outside a batch (the daemon's
supervisor, a sequential apply) and inside another wait, the wait runs inline. A wait's steps
(``pause``) end in ``Stopped`` once the batch is told to stop (a Ctrl-C in the main thread).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

_here = threading.local()


def aside(what: Callable[[], None]) -> None:
    """Run ``what``, which waits and makes no side effect, letting the batch's others act."""
    wait: Callable[[Callable[[], None]], None] | None = getattr(_here, "wait", None)
    if wait is None:
        what()
    else:
        wait(what)


def carry(wait: Callable[[Callable[[], None]], None] | None) -> None:
    """This thread's way to wait aside from now on (None: inline)."""
    _here.wait = wait


class Stopped(BaseException):
    """Raised in an action's thread once its batch is told to stop: the main thread is
    unwinding (Ctrl-C), so no side effect may follow. A ``BaseException``, so that no runtime's
    ``except Exception`` takes it for a failed step and escalates."""


def pause(seconds: float) -> None:
    """A wait's step (``time.sleep``), cut short when this thread's batch is told to stop."""
    stopping: threading.Event | None = getattr(_here, "stopping", None)
    if stopping is None:
        time.sleep(seconds)
    elif stopping.wait(seconds):
        raise Stopped


def watch(stopping: threading.Event | None) -> None:
    """What tells this thread's waits to stop (None: nothing)."""
    _here.stopping = stopping
