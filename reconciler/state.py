"""The node's local state: a directory with the mirror, rendered files, a lock and SQLite.

Layout of ``state_dir``::

    lock                    flock: one run at a time
    state.db                history, intent journal, runs (SQLite, WAL)
    mirror.git/             bare mirror of the deployment repo (source)
    services/<svc>/         driver-owned: rendered revisions, pid record, logs, data

Every file is written atomically (temp, fsync, rename), so a crash leaves the old or the new
content, never half of one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import faults
from .errors import Busy

SCHEMA = """
CREATE TABLE IF NOT EXISTS history (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    service TEXT NOT NULL,
    commit_id TEXT NOT NULL,
    hash TEXT,
    action TEXT NOT NULL,
    result TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    detail TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS history_service ON history(service, id);
CREATE TABLE IF NOT EXISTS journal (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    commit_id TEXT NOT NULL,
    service TEXT NOT NULL,
    action TEXT NOT NULL,
    status TEXT NOT NULL  -- intent | done | failed
);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    commit_id TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        faults.point("rename", str(path))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class HistoryRow:
    time: float
    service: str
    commit: str
    hash: str | None
    action: str
    result: str
    reason: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "service": self.service,
            "commit": self.commit,
            "hash": self.hash,
            "action": self.action,
            "result": self.result,
            "reason": self.reason,
            "detail": self.detail,
        }


class State:
    """The node's state directory. Open it, take the lock for anything that changes the node."""

    def __init__(self, root: Path) -> None:
        self.root = root
        try:
            # Search, not read, for others: a service that runs as its own user reaches its
            # files by path. What is private (records, the database, logs) is 0600 inside.
            root.mkdir(parents=True, exist_ok=True, mode=0o711)
            root.chmod(0o711)
        except OSError as exc:
            from .errors import ConfigError

            raise ConfigError(f"state dir {root}: {exc.strerror or exc}") from exc
        # The daemon runs its jobs in scheduler threads; they are serialised by the run lock.
        self.db = sqlite3.connect(root / "state.db", timeout=30, isolation_level=None, check_same_thread=False)
        (root / "state.db").chmod(0o600)  # its -wal and -shm files take the same mode
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(SCHEMA)

    @property
    def mirror(self) -> Path:
        return self.root / "mirror.git"

    @property
    def services_dir(self) -> Path:
        return self.root / "services"

    def close(self) -> None:
        self.db.close()

    @contextlib.contextmanager
    def lock(self, wait: float = 0.0) -> Iterator[None]:
        """Exclusive run lock; ``Busy`` if another run holds it after ``wait`` seconds."""
        fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + wait
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                    if time.monotonic() >= deadline:
                        raise Busy(f"{self.root}: another reconciler run holds the lock") from None
                    time.sleep(0.1)
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            yield
        finally:
            os.close(fd)  # closing releases the flock

    # key/value -----------------------------------------------------------------------
    def get(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM kv WHERE key=?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def put(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO kv(key, value) VALUES (?, ?)", (key, value))

    # journal -------------------------------------------------------------------------
    def intent(self, commit: str, service: str, action: str) -> int:
        """Record what is about to happen before it happens; a crash leaves it 'intent'."""
        cur = self.db.execute(
            "INSERT INTO journal(time, commit_id, service, action, status) VALUES (?,?,?,?, 'intent')",
            (time.time(), commit, service, action),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid

    def settle(self, entry: int, ok: bool) -> None:
        self.db.execute("UPDATE journal SET status=? WHERE id=?", ("done" if ok else "failed", entry))

    def interrupted(self) -> list[tuple[str, str, str]]:
        """Actions a previous run started and never finished: (commit, service, action)."""
        rows = self.db.execute(
            "SELECT commit_id, service, action FROM journal WHERE status='intent' ORDER BY id"
        ).fetchall()
        return [(str(c), str(s), str(a)) for c, s, a in rows]

    def clear_interrupted(self) -> None:
        self.db.execute("UPDATE journal SET status='interrupted' WHERE status='intent'")

    # history -------------------------------------------------------------------------
    def record(
        self, service: str, commit: str, hash_: str | None, action: str, result: str,
        reason: str = "", detail: str = "",
    ) -> None:
        self.db.execute(
            "INSERT INTO history(time, service, commit_id, hash, action, result, reason, detail)"
            " VALUES (?,?,?,?,?,?,?,?)",
            (time.time(), service, commit, hash_, action, result, reason, detail),
        )

    def history(self, service: str | None = None, limit: int = 50) -> list[HistoryRow]:
        q = "SELECT time, service, commit_id, hash, action, result, reason, detail FROM history"
        args: tuple[Any, ...] = ()
        if service:
            q += " WHERE service=?"
            args = (service,)
        q += " ORDER BY id DESC LIMIT ?"
        rows = self.db.execute(q, (*args, limit)).fetchall()
        return [HistoryRow(*r) for r in rows]

    # runs ----------------------------------------------------------------------------
    def record_run(self, commit: str, state: str, reason: str) -> int:
        cur = self.db.execute(
            "INSERT INTO runs(time, commit_id, state, reason) VALUES (?,?,?,?)",
            (time.time(), commit, state, reason),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid

    def last_run(self) -> dict[str, Any] | None:
        row = self.db.execute(
            "SELECT time, commit_id, state, reason FROM runs ORDER BY id DESC LIMIT 1"
        ).fetchone()
        if row is None:
            return None
        return {"time": row[0], "commit": row[1], "state": row[2], "reason": row[3]}
