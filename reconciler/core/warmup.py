"""Imports done while the caller waits on another process (issue 40).

A node's first pass after a change imports what an idle daemon never loads (pygit2, Jinja2,
the render and the steps past the no-op check: about 80 ms of one core), and it does so right
after its ``git fetch``, which the agent only waits on. ``warming`` imports them in a thread
during that wait instead: on a node with two cores the fetch and the imports overlap, and the
change is applied that much sooner. CPU spent is the same; nothing is imported that the pass
would not have imported next.

The thread is joined before the caller goes on, so the caller's own imports never race it
(two threads importing modules that import each other could see one half made). A module that
fails to import in the thread is left out of ``sys.modules`` by Python: the pass's own import
of it raises the error where it is handled today.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import sys
import threading
from collections.abc import Iterator, Sequence


@contextlib.contextmanager
def warming(modules: Sequence[str]) -> Iterator[None]:
    """Import ``modules`` in a thread for as long as the body runs (and then until they are in)."""
    missing = [m for m in modules if m not in sys.modules]
    if not missing:
        yield
        return
    thread = threading.Thread(target=_import_all, args=(missing,), name="reconciler-warmup", daemon=True)
    try:
        thread.start()
        started = True
    except RuntimeError:  # no thread to be had now (a pids limit): the pass imports them itself
        started = False
    try:
        yield
    finally:
        if started:
            thread.join()


def _import_all(modules: Sequence[str]) -> None:
    # No cyclic collection while importing: imports make objects by the ten thousand and free
    # almost none, so each pass of the collector over the daemon's heap is lost time (6 ms of
    # 80 here). Only that long, not the fetch's (up to git's time limit): the collector is the
    # whole process's, and the supervisor's and the receiver's threads run meanwhile.
    collecting = gc.isenabled()
    gc.disable()
    try:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - said by the pass's own import of it, not by a thread
                return
    finally:
        if collecting:
            gc.enable()
