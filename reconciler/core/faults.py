"""Numbered side effects, so a test can kill the agent at each one in turn.

Every call that changes something outside the process (a rename, a spawn, a signal, a ledger
write, a note written or pushed) first calls ``point(kind, detail)``. With no environment
variable set this costs one dict lookup and does nothing. The crash tests set:

- ``RECONCILER_FAULT_LOG=FILE``: each point is appended to FILE as ``N kind detail`` (how a
  test learns how many side effects a run has, and what each is);
- ``RECONCILER_FAULT_AT=N``: the process kills itself with SIGKILL just before the Nth side
  effect: no ``finally``, no ``atexit``, exactly what a power cut or an OOM kill leaves;
  ``RECONCILER_FAULT_AT=KIND``: just before the first side effect of that kind (a daemon's
  ``exec``, which comes after a number of passes no test should have to count).

Numbering is per process, so a test forks or spawns one agent run per fault.
"""

from __future__ import annotations

import os
import signal

_count = 0


def point(kind: str, detail: str = "") -> None:
    global _count
    at = os.environ.get("RECONCILER_FAULT_AT")
    log = os.environ.get("RECONCILER_FAULT_LOG")
    if at is None and log is None:
        return
    _count += 1
    if log is not None:
        with open(log, "a") as f:
            f.write(f"{_count} {kind} {detail}\n")
    if at is not None and (at == kind if not at.isdigit() else _count == int(at)):
        os.kill(os.getpid(), signal.SIGKILL)


def reset() -> None:
    """Start numbering again (a forked test child that runs several passes)."""
    global _count
    _count = 0
