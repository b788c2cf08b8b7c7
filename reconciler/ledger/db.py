"""The ledger's database: one SQLite file, its schema and migrations, and transactions.

``Store`` is the ground every part of the ``Ledger`` stands on: the connection (WAL,
synchronous=FULL), one ``BEGIN IMMEDIATE`` transaction per change (each a fault point, so the
crash tests can kill a run at every write), the schema brought up to ``SCHEMA_VERSION`` once on
open, and SQLite's errors translated into the project's (a full disk, a lock held too long).
"""

from __future__ import annotations

import json
import logging
import shutil
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Self

from reconciler.core import faults
from reconciler.core.errors import DiskFull, ReconcilerError, StateMissing
from reconciler.core.redact import NONE as NO_SECRETS
from reconciler.core.redact import Redactor
from reconciler.ledger import aside

SCHEMA_VERSION = 4
DAMAGED_KEY = "ledger_damaged"  # meta: JSON {time, why, moved_to, noted}: a corrupt ledger set aside

log = logging.getLogger("reconciler.ledger")

SCHEMA = """
CREATE TABLE IF NOT EXISTS mark (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    commit_id TEXT,
    signer TEXT,              -- JSON {format, principal, fingerprint} of the commit's verdict
    trust_origin TEXT NOT NULL DEFAULT '',
    time REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS commits (
    commit_id TEXT PRIMARY KEY,
    verdict TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    error TEXT NOT NULL DEFAULT '',
    plan_hash TEXT NOT NULL DEFAULT '',
    signer TEXT,
    root_id TEXT NOT NULL DEFAULT '',     -- refusals: the trust root they were judged under
    healthy INTEGER NOT NULL DEFAULT 0,   -- a run of this commit applied it and found it healthy
    retry INTEGER NOT NULL DEFAULT 0,     -- an operator asked to try a failed commit again
    noted INTEGER NOT NULL DEFAULT 0,     -- the note says what this record says
    time REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS results (
    commit_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    service TEXT NOT NULL,
    action TEXT NOT NULL,
    result TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    detail TEXT NOT NULL DEFAULT '',
    pid INTEGER,
    hash TEXT,
    steps TEXT NOT NULL DEFAULT '[]',
    PRIMARY KEY (commit_id, service)
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    commit_id TEXT NOT NULL,
    text TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_commit ON events(commit_id, id);
CREATE TABLE IF NOT EXISTS trust_verdicts (
    commit_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (commit_id, seq)
);
CREATE TABLE IF NOT EXISTS services (
    name TEXT PRIMARY KEY,
    commit_id TEXT,           -- the commit the running version was rendered from
    hash TEXT,
    since REAL,
    good_commit TEXT,         -- the last version that ran healthy
    good_hash TEXT,
    failed_commit TEXT        -- the last commit whose version of this service failed here
);
CREATE TABLE IF NOT EXISTS pins (
    service TEXT PRIMARY KEY,
    commit_id TEXT NOT NULL,
    hash TEXT NOT NULL,
    head TEXT NOT NULL,       -- the branch head when it was made: it holds until the head moves
    by TEXT NOT NULL,
    time REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS converged (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    commit_id TEXT NOT NULL,
    hashes TEXT NOT NULL      -- JSON service -> hash the node ran, pins included
);
CREATE TABLE IF NOT EXISTS history (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    service TEXT NOT NULL,
    commit_id TEXT NOT NULL,  -- the commit this version was rendered from
    hash TEXT,
    action TEXT NOT NULL,
    result TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    detail TEXT NOT NULL DEFAULT '',
    head TEXT NOT NULL DEFAULT ''   -- the branch head of the run that did it
);
CREATE INDEX IF NOT EXISTS history_service ON history(service, id);
CREATE TABLE IF NOT EXISTS journal (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    commit_id TEXT NOT NULL,
    service TEXT NOT NULL,
    action TEXT NOT NULL,
    status TEXT NOT NULL      -- intent | done | failed | interrupted
);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    commit_id TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS planes (
    commit_id TEXT PRIMARY KEY,
    body TEXT NOT NULL        -- JSON: release, pending_release, mode, vip: where the node stood at it
);
CREATE TABLE IF NOT EXISTS upgrades (
    commit_id TEXT NOT NULL,
    service TEXT NOT NULL,
    from_commit TEXT NOT NULL DEFAULT '',  -- the version it ran when the upgrade began: put back on failure
    from_version TEXT NOT NULL DEFAULT '',
    to_version TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL,                  -- running | done | undone
    PRIMARY KEY (commit_id, service)
);
CREATE TABLE IF NOT EXISTS steps (
    commit_id TEXT NOT NULL,
    service TEXT NOT NULL,    -- '' for a deployment-wide post step
    step TEXT NOT NULL,
    seq INTEGER NOT NULL,
    scope TEXT NOT NULL,
    status TEXT NOT NULL,     -- started | done | skipped | failed | undone
    started REAL NOT NULL DEFAULT 0,
    ended REAL NOT NULL DEFAULT 0,
    detail TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (commit_id, service, step)
);
CREATE TABLE IF NOT EXISTS held (
    service TEXT NOT NULL,
    var TEXT NOT NULL,
    value TEXT NOT NULL,      -- JSON: a template variable an upgrade's pin step holds on this node
    commit_id TEXT NOT NULL,  -- the upgrade commit that pinned it
    PRIMARY KEY (service, var)
);
"""


@dataclass
class Store:
    """The connection and its transactions, which every part of the ``Ledger`` writes through."""

    path: Path
    db: sqlite3.Connection = field(repr=False)
    # The secret values this node decrypted (the agent keeps it current): every free text the
    # ledger keeps (a service's output in an error, a step's, an event) is redacted on the way
    # in, so neither the history database nor a note (its projection) ever holds a value.
    redact: Redactor = field(default=NO_SECRETS, repr=False)

    @classmethod
    def open(cls, root: Path, *, create: bool = True) -> Self:
        """``create=False`` for read-only commands: a wrong path is an error, not a new node."""
        path = root / "state.db"
        if not create and not path.exists():
            raise StateMissing(f"state dir {root}: no node state there (state.db does not exist)")
        found = aside.identity(path)
        try:
            return cls._connect(path, check=create)
        except sqlite3.Error as exc:
            if not create or not aside.corrupt_code(getattr(exc, "sqlite_errorcode", 0)):
                raise _translate(exc, path) from exc
            why = str(exc)
        except aside.LedgerCorrupt as exc:
            why = str(exc)
        # Damaged: every pass would stop here forever. Kept aside; a fresh ledger, and the node
        # rebuilds what it knows as after a lost state dir (``aside``).
        with aside.state_dir_locked(root):
            if aside.identity(path) != found:  # another process moved it aside first
                return cls.open(root, create=create)
            daemon = aside.daemon_holding(root)
            if daemon is not None:  # it has the ledger open: moved here, it would write the old copy
                who = f"the running agent (pid {daemon})" if daemon else "the running agent"
                raise ReconcilerError(f"{path}: the ledger is damaged ({why}); {who} heals it when it restarts: "
                                      "restart it", reason="LEDGER_ERROR")
            damaged = aside.set_aside(path, why)
            log.error("%s: the node's ledger is corrupt (%s): moved aside to %s; starting a new one, rebuilt "
                      "from this node's notes and its services", path, why, damaged.moved_to or "(not kept)")
            try:
                ledger = cls._connect(path, check=False)
                with ledger._tx("ledger damaged") as db:
                    db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?,?)",
                               (DAMAGED_KEY, json.dumps({**asdict(damaged), "noted": False})))
            except sqlite3.Error as exc:
                raise _translate(exc, path) from exc
        return ledger

    @classmethod
    def _connect(cls, path: Path, *, check: bool) -> Self:
        """The ledger at ``path``, its schema brought up to date; ``check``: ``quick_check``
        first (``aside.LedgerCorrupt`` when it fails). Once per process (a daemon keeps it open):
        measured under 1 ms for a new node's ledger and 28 ms for one of 21 MiB (50,000 history
        rows, 50,000 runs, 10,000 events), against 1 ms to open without it."""
        db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        try:
            path.chmod(0o600)  # its -wal and -shm files take the same mode
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            if check:
                problem = str(db.execute("PRAGMA quick_check(1)").fetchone()[0])
                if problem != "ok":
                    raise aside.LedgerCorrupt(problem)
            ledger = cls(path, db)
            ledger._migrate()
        except BaseException:
            db.close()
            raise
        return ledger

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def _tx(self, what: str) -> Iterator[sqlite3.Connection]:
        faults.point("db", what)
        try:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from exc

    def _one(self, sql: str, *args: Any) -> Any:
        try:
            return self.db.execute(sql, args).fetchone()
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from exc

    def _all(self, sql: str, *args: Any) -> list[Any]:
        try:
            return self.db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from exc

    # schema ------------------------------------------------------------------------------
    def _migrate(self) -> None:
        version = int(self.db.execute("PRAGMA user_version").fetchone()[0])
        if version >= SCHEMA_VERSION:
            return
        old_kv = bool(self.db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='kv'").fetchone())
        had_history = bool(self.db.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='history'").fetchone())
        self.db.execute("BEGIN IMMEDIATE")
        try:
            if had_history:
                cols = {r[1] for r in self.db.execute("PRAGMA table_info(history)")}
                if "head" not in cols:
                    self.db.execute("ALTER TABLE history ADD COLUMN head TEXT NOT NULL DEFAULT ''")
            for stmt in _statements(SCHEMA):
                self.db.execute(stmt)
            if old_kv:
                self._migrate_kv()
            self.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def _migrate_kv(self) -> None:
        """The first wave's key-value store, moved into the tables once."""
        kv = {str(k): str(v) for k, v in self.db.execute("SELECT key, value FROM kv")}
        now = time.time()
        if "high_water" in kv or "trust_origin" in kv:
            self.db.execute("INSERT OR REPLACE INTO mark(id, commit_id, signer, trust_origin, time) VALUES (1,?,?,?,?)",
                            (kv.get("high_water"), kv.get("high_water_signer"), kv.get("trust_origin", ""), now))
        if "applied_commit" in kv:
            self.db.execute("INSERT OR REPLACE INTO commits(commit_id, verdict, healthy, noted, time)"
                            " VALUES (?, 'applied', 1, 1, ?)", (kv["applied_commit"], now))
            self.db.execute("INSERT OR REPLACE INTO converged(id, commit_id, hashes) VALUES (1,?,?)",
                            (kv["applied_commit"], kv.get("applied_hashes", "{}")))
        if "failed_commit" in kv:
            self.db.execute("INSERT OR REPLACE INTO commits(commit_id, verdict, noted, time)"
                            " VALUES (?, 'failed', 1, ?)", (kv["failed_commit"], now))
        if "refused_head" in kv:
            r = json.loads(kv["refused_head"])
            self.db.execute("INSERT OR REPLACE INTO commits(commit_id, verdict, reason, error, root_id, noted, time)"
                            " VALUES (?, 'refused', ?, ?, ?, 1, ?)",
                            (r["commit"], r.get("reason", ""), r.get("message", ""), r.get("root", ""), now))
        for key, value in kv.items():
            if key.startswith("pin:"):
                p = json.loads(value)
                self.db.execute("INSERT OR REPLACE INTO pins(service, commit_id, hash, head, by, time)"
                                " VALUES (?,?,?,?,?,?)", (key[4:], p["commit"], p.get("hash", ""), p["head"],
                                                         "operator", now))
        if "notes_pushed" in kv:
            self.db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('notes_pushed', ?)",
                            (kv["notes_pushed"],))
        self.db.execute("DROP TABLE kv")


def _statements(script: str) -> list[str]:
    """The schema's statements one by one: executescript() would commit the open transaction."""
    lines = [line.split("--", 1)[0] for line in script.splitlines()]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


# Below this much free space on the state dir's filesystem, an I/O error of SQLite's is the
# disk being full: on a full disk SQLite often reports not SQLITE_FULL but an I/O error (the
# shared-memory index of a WAL database cannot grow: SQLITE_IOERR_SHMSIZE), and a ledger
# transaction needs a few pages of WAL and 32 KiB of index.
NEARLY_FULL = 2**20
_SQLITE_IOERR, _SQLITE_FULL = 10, 13


def _translate(exc: sqlite3.Error, path: Path) -> ReconcilerError:
    text = str(exc)
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF  # the primary code of an extended one
    if code == _SQLITE_FULL or "disk is full" in text:
        return DiskFull.at(path.parent, f"{path}: {text}")
    if code == _SQLITE_IOERR and _free(path.parent) < NEARLY_FULL:
        return DiskFull.at(path.parent, f"{path}: {text}: the disk is full")
    if isinstance(exc, sqlite3.OperationalError) and "locked" in text:
        from reconciler.core.errors import Busy

        return Busy(f"{path}: {text}")
    return ReconcilerError(f"{path}: the node's ledger cannot be read or written: {text}", reason="LEDGER_ERROR")


def _free(directory: Path) -> int:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return NEARLY_FULL  # unknown: not taken for a full disk
