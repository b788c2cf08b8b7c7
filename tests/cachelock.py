"""The tests' cache of what they fetch once per machine (a peer's venv, a release's wheel), under
the temp dir: built by one test process at a time. Two xdist workers that find it missing at
once would otherwise build it together (`venv --clear` under the other's `pip install`); the
second waits for the first and finds it made."""

from __future__ import annotations

import contextlib
import fcntl
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def building(name: str) -> Iterator[Path]:
    """``reconciler-test-cache/<name>`` under the temp dir, this process alone at it meanwhile."""
    cache = Path(tempfile.gettempdir()) / "reconciler-test-cache"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, whatever happens inside
        yield cache / name
