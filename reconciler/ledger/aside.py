"""A damaged ledger, moved aside: kept for inspection, out of the way of a fresh one.

SQLite says a file is corrupt (``SQLITE_CORRUPT``), not a database (``SQLITE_NOTADB``), or its
``PRAGMA quick_check`` fails when the ledger is opened: every pass would stop on it, forever.
The file is renamed ``state.db.corrupt-<UTC time>`` (its ``-wal`` and ``-journal`` beside it
under the same name, so SQLite opens the copy as it was), the shared-memory index (derived, a
cache of the WAL) removed, and ``db.Store.open`` starts a fresh ledger; the node then rebuilds
what it knows as after a lost state dir (its notes on the remote, the drivers' records).

Two processes may open the same damaged ledger at once (a daemon and an `agent --once`): the
move happens under a flock of the state dir, and only if ``state.db`` is still the file that
was found damaged, so the second never moves the first one's fresh ledger aside.

Never under a running daemon (``reconciler agent``, holding ``agent.lock`` for its life, with
the ledger open): it would go on writing the renamed copy while the command that moved it wrote
a fresh one (a `suspend` never seen by the daemon). A command that finds the ledger damaged then
changes nothing and says to restart the daemon, which heals it as it opens it. The daemon's own
lock (its pid in ``agent.lock``: a daemon that re-executed itself holds it before it opens the
ledger) does not stop it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from reconciler.core import faults
from reconciler.ledger.statedir import holder_in

# SQLite's primary result codes that mean the file itself is damaged.
SQLITE_CORRUPT, SQLITE_NOTADB = 11, 26


@dataclass(frozen=True)
class Damaged:
    """What was found damaged, when, and where the damaged copy is kept."""

    time: str  # UTC, ISO 8601
    why: str  # SQLite's words
    moved_to: str  # the damaged copy's path ('' when it could not be kept)

    @property
    def event(self) -> str:
        """The line the next note carries (and ``status`` shows)."""
        kept = f"kept as {self.moved_to}" if self.moved_to else "not kept"
        return (f"ledger corrupt ({self.why}) at {self.time}: the damaged file is {kept}; a new ledger was "
                "started and rebuilt from this node's notes and its services")


class LedgerCorrupt(Exception):
    """The ledger file is damaged (raised inside ``Store.open``, never past it)."""


def corrupt_code(code: int) -> bool:
    return code & 0xFF in (SQLITE_CORRUPT, SQLITE_NOTADB)


def identity(path: Path) -> tuple[int, int] | None:
    """The file ``path`` is now (device, inode), or None when there is none."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


@contextlib.contextmanager
def state_dir_locked(directory: Path) -> Iterator[None]:
    """An exclusive flock of the state directory itself (no file of its own to leave behind)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def daemon_holding(directory: Path) -> int | None:
    """The pid of another process's daemon holding ``directory``'s ``agent.lock`` (0 when its
    pid cannot be read); None when none holds it, or this process does. A shared flock tried
    without waiting, and let go at once."""
    try:
        fd = os.open(directory / "agent.lock", os.O_RDONLY)
    except FileNotFoundError:
        return None  # no daemon ever ran here
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return None
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
        pid, mine = holder_in(os.read(fd, 64).decode(errors="replace"))
        return None if mine else (pid or 0)
    finally:
        os.close(fd)


def set_aside(path: Path, why: str) -> Damaged:
    """``path`` and its -wal and -journal renamed to ``<path>.corrupt-<UTC time>``; the -shm removed."""
    now = time.gmtime()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", now)
    moved = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while moved.exists():  # twice in one second: never over an earlier copy
        n += 1
        moved = path.with_name(f"{path.name}.corrupt-{stamp}.{n}")
    faults.point("rename", f"{path.name} aside")
    kept = ""
    # The database last: killed in between, a fresh ledger never meets the damaged one's WAL,
    # and the damaged file, still there, is found again and moved under a name of its own.
    for suffix in ("-wal", "-journal", ""):
        src = path.with_name(path.name + suffix)
        with contextlib.suppress(FileNotFoundError):
            os.rename(src, moved.with_name(moved.name + suffix))
            if not suffix:
                kept = str(moved)
    with contextlib.suppress(FileNotFoundError):
        path.with_name(path.name + "-shm").unlink()
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return Damaged(time.strftime("%Y-%m-%dT%H:%M:%SZ", now), why, kept)
