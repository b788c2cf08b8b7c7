"""The node's memory: typed tables, named transitions, the only SQL in the project.

One SQLite database per node (``<state>/state.db``, WAL, synchronous=FULL). What it holds:

- the **mark**: the last commit this node acted on (anti-rollback's reference), its signer and
  the origin of the trust root in force;
- per **commit**, the node's verdict (``Verdict``) and the moves allowed between verdicts
  (``ALLOWED``): above all, ``failed`` never becomes ``applied`` unless a run of that same commit
  applied it and found every service healthy (``Proof.HEALTHY_RUN``); a rollback or an unpin adds
  events and pins to a commit's record and never touches its verdict. Each record knows whether
  its note is written, so a run killed between the verdict and the note finishes the note;
- per **service**, the running version (the commit it was rendered from, its hash), the last good
  one, and a history of versions;
- **pins** (to which commit, made at which head, by whom);
- the **converged** marker: the commit and hashes of the last full run that left every service
  healthy, which lets a poll that finds nothing new do nothing; anything that changes what the
  node should run (a pin, an unpin, a retry) clears it;
- the **journal** of actions in flight: written before an action, settled after its effect;
- **upgrades** in progress per commit and service (the version they started from), each
  **step**'s status and times (what barriers on other nodes read from the note), and the
  template variables a pin step **holds** on this node.

Notes, ``status``, ``history`` and the fleet gate all read these records; ``report`` (a
``model.Report``) is the projection a note is encoded from.
"""

from __future__ import annotations

import errno
import json
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, NamedTuple

from reconciler.core import faults
from reconciler.core.errors import DiskFull, ReconcilerError, StateMissing
from reconciler.core.model import ActionKind, Report, ResultState, Scope, ServiceResult, StepRecord, StepStatus, Verdict
from reconciler.core.redact import NONE as NO_SECRETS
from reconciler.core.redact import Redactor

SCHEMA_VERSION = 4

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


class Proof(StrEnum):
    """What a move to ``applied`` rests on."""

    HEALTHY_RUN = "healthy-run"  # this run applied the commit and every service passed its check


# From each verdict, the verdicts a record may move to. None: the commit has no record yet.
# On top of the table (``_check``): applied only ever with Proof.HEALTHY_RUN, and a failed commit
# reaches staged or rebooting only with it too; nothing moves an applied or failed commit back to
# waiting, halted or refused.
_SETTLED = {Verdict.APPLIED, Verdict.FAILED, Verdict.REBOOTING, Verdict.STAGED}
ALLOWED: Mapping[Verdict | None, frozenset[Verdict]] = {
    None: frozenset(Verdict),
    Verdict.REFUSED: frozenset(Verdict),  # judged again under a new trust root
    Verdict.ERROR: frozenset(Verdict),  # nothing was applied
    Verdict.WAITING: frozenset(Verdict),
    Verdict.HALTED: frozenset(Verdict),  # the fleet went on (a retry elsewhere): it may too
    Verdict.STAGED: frozenset(_SETTLED | {Verdict.ERROR}),
    Verdict.REBOOTING: frozenset(_SETTLED),
    Verdict.APPLIED: frozenset(_SETTLED),
    Verdict.FAILED: frozenset(_SETTLED),
}


SUSPENDED_KEY = "suspended"  # meta: an operator's suspension, JSON {reason, by, since}
REPO_SUSPENDED_KEY = "suspended_repo"  # meta: the verified head's `suspend: true`, same shape


class IllegalTransition(ReconcilerError):
    reason = "LEDGER_TRANSITION"


@dataclass(frozen=True)
class Mark:
    commit: str | None
    signer: Mapping[str, str] | None
    trust_origin: str


@dataclass(frozen=True)
class CommitRecord:
    commit: str
    verdict: Verdict
    reason: str = ""
    error: str = ""
    plan_hash: str = ""
    signer: Mapping[str, str] | None = None
    root_id: str = ""
    healthy: bool = False
    retry: bool = False
    noted: bool = False


@dataclass(frozen=True)
class Version:
    commit: str
    hash: str


@dataclass(frozen=True)
class ServiceRecord:
    name: str
    running: Version | None
    good: Version | None
    failed_commit: str | None


@dataclass(frozen=True)
class Pin:
    service: str
    commit: str
    hash: str
    head: str
    by: str
    time: float

    def to_dict(self) -> dict[str, Any]:
        return {"service": self.service, "commit": self.commit, "hash": self.hash, "head": self.head,
                "by": self.by, "time": self.time}


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
    head: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"time": self.time, "service": self.service, "commit": self.commit, "hash": self.hash,
                "action": self.action, "result": self.result, "reason": self.reason, "detail": self.detail,
                "head": self.head}


class Interrupted(NamedTuple):
    """An action a killed run began and never settled: its effect may or may not have happened."""

    commit: str
    service: str
    action: ActionKind


@dataclass
class Ledger:
    """Open with ``Ledger.open``; every method is one transaction."""

    path: Path
    db: sqlite3.Connection = field(repr=False)
    # The secret values this node decrypted (the agent keeps it current): every free text the
    # ledger keeps (a service's output in an error, a step's, an event) is redacted on the way
    # in, so neither the history database nor a note (its projection) ever holds a value.
    redact: Redactor = field(default=NO_SECRETS, repr=False)

    @staticmethod
    def open(root: Path, *, create: bool = True) -> Ledger:
        """``create=False`` for read-only commands: a wrong path is an error, not a new node."""
        path = root / "state.db"
        if not create and not path.exists():
            raise StateMissing(f"state dir {root}: no node state there (state.db does not exist)")
        try:
            db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
            path.chmod(0o600)  # its -wal and -shm files take the same mode
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            ledger = Ledger(path, db)
            ledger._migrate()
        except sqlite3.Error as exc:
            raise _translate(exc, path) from exc
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

    # mark and trust ----------------------------------------------------------------------
    def mark(self) -> Mark:
        row = self._one("SELECT commit_id, signer, trust_origin FROM mark WHERE id=1")
        if row is None:
            return Mark(None, None, "")
        return Mark(row[0], json.loads(row[1]) if row[1] else None, str(row[2]))

    def advance(self, commit: str, signer: Mapping[str, str] | None, trust_origin: str | None = None) -> None:
        """The node acts on ``commit``: the high-water mark moves there (and the signer, when the
        commit was verified now; a rotated root's origin with it)."""
        old = self.mark()
        with self._tx(f"mark {commit[:12]}") as db:
            db.execute("INSERT OR REPLACE INTO mark(id, commit_id, signer, trust_origin, time) VALUES (1,?,?,?,?)",
                       (commit, json.dumps(dict(signer)) if signer else (json.dumps(dict(old.signer))
                                                                         if old.signer else None),
                        old.trust_origin if trust_origin is None else trust_origin, time.time()))

    # verdicts ----------------------------------------------------------------------------
    def record(self, commit: str) -> CommitRecord | None:
        row = self._one("SELECT commit_id, verdict, reason, error, plan_hash, signer, root_id, healthy, retry, noted"
                        " FROM commits WHERE commit_id=?", commit)
        if row is None:
            return None
        return CommitRecord(row[0], Verdict(row[1]), row[2], row[3], row[4], json.loads(row[5]) if row[5] else None,
                            row[6], bool(row[7]), bool(row[8]), bool(row[9]))

    def verdict(self, commit: str) -> Verdict | None:
        rec = self.record(commit)
        return rec.verdict if rec else None

    def settle(self, report: Report, *, proof: Proof | None = None, root_id: str = "",
               converged: Mapping[str, str] | None = None) -> None:
        """A run's outcome for its commit: the verdict moves (if the table allows it), the results
        and events are kept, and the note is due. Raises ``IllegalTransition`` otherwise.
        ``converged`` (service -> hash, for an applied commit): the no-op fast path's marker,
        in the same transaction, so a pass that finds it also finds the verdict (and its note due)."""
        report = self.redact.report(report)
        old = self.record(report.commit)
        new = report.state
        self._check(report.commit, old, new, proof)
        healthy = new is Verdict.APPLIED and proof is Proof.HEALTHY_RUN
        with self._tx(f"verdict {report.commit[:12]} {new}") as db:
            db.execute(
                "INSERT INTO commits(commit_id, verdict, reason, error, plan_hash, signer, root_id, healthy, retry,"
                " noted, time) VALUES (?,?,?,?,?,?,?,?,0,0,?) ON CONFLICT(commit_id) DO UPDATE SET"
                " verdict=excluded.verdict, reason=excluded.reason, error=excluded.error,"
                " plan_hash=excluded.plan_hash, signer=COALESCE(excluded.signer, commits.signer),"
                " root_id=excluded.root_id, healthy=MAX(commits.healthy, excluded.healthy), retry=0, noted=0,"
                " time=excluded.time",
                (report.commit, str(new), report.reason, report.error, report.plan_hash,
                 json.dumps(dict(report.signer)) if report.signer else None, root_id, int(healthy), time.time()),
            )
            if report.services or new is not Verdict.HALTED:
                db.execute("DELETE FROM results WHERE commit_id=?", (report.commit,))
            for seq, r in enumerate(report.services):
                db.execute("INSERT OR REPLACE INTO results(commit_id, seq, service, action, result, reason, detail,"
                           " pid, hash, steps) VALUES (?,?,?,?,?,?,?,?,?,?)",
                           (report.commit, seq, r.service, str(r.action), str(r.state), r.reason, r.detail, r.pid,
                            r.hash, json.dumps(list(r.steps))))
            for text in report.events:
                db.execute("INSERT INTO events(commit_id, text) VALUES (?,?)", (report.commit, text))
            db.execute("DELETE FROM trust_verdicts WHERE commit_id=?", (report.commit,))
            for seq, v in enumerate(report.verdicts):
                db.execute("INSERT INTO trust_verdicts(commit_id, seq, body) VALUES (?,?,?)",
                           (report.commit, seq, json.dumps(dict(v), sort_keys=True)))
            if report.plane is not None:
                db.execute("INSERT OR REPLACE INTO planes(commit_id, body) VALUES (?,?)",
                           (report.commit, json.dumps(dict(report.plane), sort_keys=True)))
            if converged is not None:
                db.execute("INSERT OR REPLACE INTO converged(id, commit_id, hashes) VALUES (1,?,?)",
                           (report.commit, json.dumps(dict(sorted(converged.items())))))
            db.execute("INSERT INTO runs(time, commit_id, state, reason) VALUES (?,?,?,?)",
                       (time.time(), report.commit, str(new), report.reason))

    @staticmethod
    def _check(commit: str, old: CommitRecord | None, new: Verdict, proof: Proof | None) -> None:
        was = old.verdict if old else None
        if new not in ALLOWED[was]:
            raise IllegalTransition(f"{commit[:12]}: the node's verdict cannot move from {was} to {new}")
        if new is Verdict.APPLIED and proof is not Proof.HEALTHY_RUN:
            # Whatever the ledger remembers (it may be new after a lost disk): applied is what
            # a run of this commit found, never what an operation or a record claims.
            raise IllegalTransition(f"{commit[:12]}: only a healthy run of it can make it applied")
        if was is Verdict.FAILED and new in (Verdict.STAGED, Verdict.REBOOTING) and proof is not Proof.HEALTHY_RUN:
            raise IllegalTransition(f"{commit[:12]}: failed here; only a healthy run of it can make it {new}")

    def recover_failure(self, commit: str, reason: str, error: str) -> None:
        """After the state dir was lost: this node's own note says ``commit`` failed here. Kept as
        the failure it was (noted already), so the new ledger does not try it again unasked."""
        with self._tx(f"recover {commit[:12]}") as db:
            db.execute("INSERT OR IGNORE INTO commits(commit_id, verdict, reason, error, noted, time)"
                       " VALUES (?, 'failed', ?, ?, 1, ?)", (commit, reason, self.redact(error), time.time()))

    def add_event(self, commit: str, text: str) -> None:
        """Something happened to the node while ``commit`` was its head (a rollback, an unpin): the
        note gains a line; the verdict stays what it is."""
        with self._tx(f"event {commit[:12]}") as db:
            if db.execute("SELECT 1 FROM commits WHERE commit_id=?", (commit,)).fetchone() is None:
                raise IllegalTransition(f"{commit[:12]}: no verdict here to add an event to")
            db.execute("INSERT INTO events(commit_id, text) VALUES (?,?)", (commit, self.redact(text)))
            db.execute("UPDATE commits SET noted=0 WHERE commit_id=?", (commit,))

    def last_event(self, commit: str) -> str | None:
        row = self._one("SELECT text FROM events WHERE commit_id=? ORDER BY id DESC LIMIT 1", commit)
        return None if row is None else str(row[0])

    def retry(self, commit: str) -> bool:
        """An operator's `retry`: the failed ``commit`` is tried again by the next run (its
        verdict stays failed until that run applies it healthy)."""
        rec = self.record(commit)
        if rec is None or rec.verdict not in (Verdict.FAILED, Verdict.HALTED):
            return False
        with self._tx(f"retry {commit[:12]}") as db:
            db.execute("UPDATE commits SET retry=1 WHERE commit_id=?", (commit,))
            db.execute("DELETE FROM converged")
        return True

    def noted(self, commit: str) -> None:
        with self._tx(f"noted {commit[:12]}") as db:
            db.execute("UPDATE commits SET noted=1 WHERE commit_id=?", (commit,))

    def unnoted(self) -> list[str]:
        """Commits whose record changed after their note was last written (a killed run)."""
        return [str(r[0]) for r in self._all("SELECT commit_id FROM commits WHERE noted=0 ORDER BY time")]

    def report(self, commit: str, node: str, time_text: str) -> Report | None:
        """The note of ``commit``: the ledger's record of it, as one ``Report``."""
        rec = self.record(commit)
        if rec is None:
            return None
        results = tuple(
            ServiceResult(r[0], ActionKind(r[1]), ResultState(r[2]), r[3], r[4], r[5], r[6], tuple(json.loads(r[7])))
            for r in self._all("SELECT service, action, result, reason, detail, pid, hash, steps FROM results"
                               " WHERE commit_id=? ORDER BY seq", commit)
        )
        events = tuple(str(r[0]) for r in self._all("SELECT text FROM events WHERE commit_id=? ORDER BY id", commit))
        verdicts = tuple(json.loads(r[0]) for r in self._all(
            "SELECT body FROM trust_verdicts WHERE commit_id=? ORDER BY seq", commit))
        pins = {p.service: p.commit for p in self.pins() if p.head == commit}
        # While it lasts, the suspension shows on the note of the commit a suspended pass held back,
        # and on the head's (an applied one whose drift is left alone).
        held = rec.verdict is Verdict.WAITING and rec.reason == "SUSPENDED"
        suspended = self.suspension() if held or commit == self.mark().commit else None
        plane = self._one("SELECT body FROM planes WHERE commit_id=?", commit)
        return Report(node, commit, rec.verdict, time_text, services=results, reason=rec.reason, error=rec.error,
                      plan_hash=rec.plan_hash, signer=rec.signer, verdicts=verdicts, events=events, pins=pins,
                      steps=tuple(self.steps(commit)), suspended=suspended,
                      plane=json.loads(plane[0]) if plane else None)

    def plane(self, commit: str) -> dict[str, Any] | None:
        """Where the node stood (release, mode, VIP attachment) when it settled ``commit``."""
        row = self._one("SELECT body FROM planes WHERE commit_id=?", commit)
        return dict(json.loads(row[0])) if row else None

    def was_attached(self) -> bool | None:
        """On the VIP networks after the last commit it settled (None: it settled none). A commit
        settled with no plane record ran in a fleet of one plane: attached."""
        row = self._one("SELECT c.commit_id, p.body FROM commits c LEFT JOIN planes p USING(commit_id)"
                        " WHERE c.verdict IN ('applied','failed','staged','rebooting') ORDER BY c.time DESC LIMIT 1")
        if row is None:
            return None
        return row[1] is None or json.loads(row[1]).get("vip") == "attached"

    def replan(self, commit: str, plane: Mapping[str, Any]) -> None:
        """The node's placement at ``commit`` changed without a new commit (its cutover was
        aborted, or completed): recorded and the note due again; an abort also clears the no-op
        marker, so the next pass renders the commit again (back onto the VIP networks)."""
        with self._tx(f"plane {commit[:12]}") as db:
            db.execute("INSERT OR REPLACE INTO planes(commit_id, body) VALUES (?,?)",
                       (commit, json.dumps(dict(plane), sort_keys=True)))
            db.execute("UPDATE commits SET noted=0 WHERE commit_id=?", (commit,))
            if plane.get("aborted"):
                db.execute("DELETE FROM converged")

    def acted_on(self) -> Iterable[CommitRecord]:
        for (commit,) in self._all("SELECT commit_id FROM commits ORDER BY time"):
            rec = self.record(str(commit))
            if rec is not None:
                yield rec

    # services ----------------------------------------------------------------------------
    def ran(self, service: str, version: Version, *, healthy: bool) -> None:
        """``service`` now runs ``version`` (after a change that passed, or was put back)."""
        with self._tx(f"service {service} {version.hash[:8]}") as db:
            db.execute(
                "INSERT INTO services(name, commit_id, hash, since, good_commit, good_hash) VALUES (?,?,?,?,?,?)"
                " ON CONFLICT(name) DO UPDATE SET commit_id=excluded.commit_id, hash=excluded.hash,"
                " since=excluded.since, good_commit=COALESCE(excluded.good_commit, services.good_commit),"
                " good_hash=COALESCE(excluded.good_hash, services.good_hash)",
                (service, version.commit, version.hash, time.time(),
                 version.commit if healthy else None, version.hash if healthy else None),
            )

    def failed(self, service: str, commit: str) -> None:
        with self._tx(f"service {service} failed") as db:
            db.execute("INSERT INTO services(name, failed_commit) VALUES (?,?)"
                       " ON CONFLICT(name) DO UPDATE SET failed_commit=excluded.failed_commit", (service, commit))

    def removed(self, service: str) -> None:
        with self._tx(f"service {service} removed") as db:
            db.execute("UPDATE services SET commit_id=NULL, hash=NULL, since=NULL WHERE name=?", (service,))

    def service(self, name: str) -> ServiceRecord | None:
        row = self._one("SELECT name, commit_id, hash, good_commit, good_hash, failed_commit FROM services"
                        " WHERE name=?", name)
        if row is None:
            return None
        return ServiceRecord(row[0], Version(row[1], row[2]) if row[1] and row[2] else None,
                             Version(row[3], row[4]) if row[3] and row[4] else None, row[5])

    def good_versions(self, service: str) -> list[Version]:
        """Versions of ``service`` that ran healthy here, newest first, each once."""
        seen: dict[Version, None] = {}
        for commit, hash_ in self._all(
            "SELECT commit_id, hash FROM history WHERE service=? AND result='ok' AND hash IS NOT NULL"
            " AND action NOT IN ('stop', 'revive', 'none') ORDER BY id DESC LIMIT 1000", service,
        ):
            seen.setdefault(Version(str(commit), str(hash_)), None)
        return list(seen)

    # pins --------------------------------------------------------------------------------
    def pins(self) -> list[Pin]:
        rows = self._all("SELECT service, commit_id, hash, head, by, time FROM pins ORDER BY service")
        return [Pin(*r) for r in rows]

    def pin(self, pin: Pin) -> None:
        with self._tx(f"pin {pin.service}") as db:
            db.execute("INSERT OR REPLACE INTO pins(service, commit_id, hash, head, by, time) VALUES (?,?,?,?,?,?)",
                       (pin.service, pin.commit, pin.hash, pin.head, pin.by, pin.time))
            db.execute("DELETE FROM converged")

    def unpin(self, service: str) -> Pin | None:
        found = [p for p in self.pins() if p.service == service]
        if not found:
            return None
        with self._tx(f"unpin {service}") as db:
            db.execute("DELETE FROM pins WHERE service=?", (service,))
            db.execute("DELETE FROM converged")
        return found[0]

    # converged (the no-op fast path) -----------------------------------------------------
    def converged(self) -> tuple[str, dict[str, str]] | None:
        row = self._one("SELECT commit_id, hashes FROM converged WHERE id=1")
        return None if row is None else (str(row[0]), dict(json.loads(row[1])))

    def clear_converged(self) -> None:
        if self.converged() is not None:
            with self._tx("converged cleared") as db:
                db.execute("DELETE FROM converged")

    # journal -----------------------------------------------------------------------------
    def intent(self, commit: str, service: str, action: ActionKind) -> int:
        """Before an action: a killed run leaves this entry, and the next run does it again."""
        with self._tx(f"intent {action} {service}") as db:
            cur = db.execute("INSERT INTO journal(time, commit_id, service, action, status)"
                             " VALUES (?,?,?,?, 'intent')", (time.time(), commit, service, str(action)))
            assert cur.lastrowid is not None
            return cur.lastrowid

    def done(self, entry: int, ok: bool) -> None:
        """After the action's effect (or its failure and the restore): settled."""
        with self._tx(f"settle {entry}") as db:
            db.execute("UPDATE journal SET status=? WHERE id=?", ("done" if ok else "failed", entry))

    def interrupted(self) -> list[Interrupted]:
        return [Interrupted(str(c), str(s), ActionKind(a)) for c, s, a in self._all(
            "SELECT commit_id, service, action FROM journal WHERE status='intent' ORDER BY id")]

    def clear_interrupted(self) -> None:
        """Once the run that found them has redone them (or found them moot)."""
        if self.interrupted():
            with self._tx("journal cleared") as db:
                db.execute("UPDATE journal SET status='interrupted' WHERE status='intent'")

    # history -----------------------------------------------------------------------------
    def log(self, service: str, commit: str, hash_: str | None, action: str, result: str, reason: str = "",
            detail: str = "", head: str = "") -> None:
        with self._tx(f"history {service} {action}") as db:
            db.execute("INSERT INTO history(time, service, commit_id, hash, action, result, reason, detail, head)"
                       " VALUES (?,?,?,?,?,?,?,?,?)",
                       (time.time(), service, commit, hash_, action, result, self.redact(reason), self.redact(detail),
                        head or commit))

    def history(self, service: str | None = None, limit: int = 50) -> list[HistoryRow]:
        q = "SELECT time, service, commit_id, hash, action, result, reason, detail, head FROM history"
        args: tuple[Any, ...] = ()
        if service:
            q += " WHERE service=?"
            args = (service,)
        q += " ORDER BY id DESC LIMIT ?"
        return [HistoryRow(*r) for r in self._all(q, *args, limit)]

    def services_in_history(self) -> list[str]:
        return [r[0] for r in self._all("SELECT DISTINCT service FROM history ORDER BY service")]

    # runs --------------------------------------------------------------------------------
    def last_run(self) -> dict[str, Any] | None:
        row = self._one("SELECT time, commit_id, state, reason FROM runs ORDER BY id DESC LIMIT 1")
        if row is None:
            return None
        return {"time": row[0], "commit": row[1], "state": row[2], "reason": row[3]}

    # counts (what metrics read: totals that outlive the process) ------------------------
    def run_counts(self) -> dict[tuple[str, str], int]:
        """(verdict, reason) -> how many runs settled on it."""
        return {(str(s), str(r)): int(n) for s, r, n in self._all(
            "SELECT state, reason, COUNT(*) FROM runs GROUP BY state, reason ORDER BY state, reason")}

    def action_counts(self) -> dict[tuple[str, str], int]:
        """(action, result) -> how many were done (the supervisor's revives included)."""
        return {(str(a), str(r)): int(n) for a, r, n in self._all(
            "SELECT action, result, COUNT(*) FROM history GROUP BY action, result ORDER BY action, result")}

    def event_count(self, prefix: str) -> int:
        """Events (on any commit) whose text starts with ``prefix``."""
        row = self._one("SELECT COUNT(*) FROM events WHERE substr(text, 1, ?) = ?", len(prefix), prefix)
        return int(row[0]) if row else 0

    def last_applied(self) -> str | None:
        """The commit this node most recently applied (healthy), if any."""
        row = self._one("SELECT commit_id FROM commits WHERE verdict='applied' ORDER BY time DESC LIMIT 1")
        return None if row is None else str(row[0])

    # upgrades ----------------------------------------------------------------------------
    def begin_upgrade(self, commit: str, service: str, from_commit: str, from_version: str, to_version: str) -> None:
        """Once per commit and service: what a failure puts back. A commit that has no verdict
        yet gets ``waiting`` (its note carries the steps other nodes wait on)."""
        with self._tx(f"upgrade {service} {commit[:12]}") as db:
            db.execute("INSERT OR IGNORE INTO commits(commit_id, verdict, noted, time) VALUES (?, 'waiting', 0, ?)",
                       (commit, time.time()))
            db.execute("INSERT OR IGNORE INTO upgrades(commit_id, service, from_commit, from_version, to_version,"
                       " status) VALUES (?,?,?,?,?, 'running')", (commit, service, from_commit, from_version,
                                                                  to_version))

    def upgrade(self, commit: str, service: str) -> tuple[str, str, str, str] | None:
        """(from_commit, from_version, to_version, status) of a service's upgrade in ``commit``."""
        row = self._one("SELECT from_commit, from_version, to_version, status FROM upgrades"
                        " WHERE commit_id=? AND service=?", commit, service)
        return None if row is None else (str(row[0]), str(row[1]), str(row[2]), str(row[3]))

    def upgrade_under_way(self, service: str, other_than: str) -> tuple[str, str, str] | None:
        """An upgrade of ``service`` another commit began and never finished (the branch moved
        on mid-upgrade): (its commit, the commit it started from, that version)."""
        row = self._one("SELECT commit_id, from_commit, from_version FROM upgrades WHERE service=? AND"
                        " status='running' AND commit_id != ? ORDER BY rowid DESC LIMIT 1", service, other_than)
        return None if row is None else (str(row[0]), str(row[1]), str(row[2]))

    def reset_upgrade(self, commit: str, service: str) -> None:
        """An undone upgrade begins again (the fleet went on after a retry). A once step that
        is done stays done: a migration is not run twice unasked."""
        with self._tx(f"upgrade {service} again") as db:
            db.execute("DELETE FROM upgrades WHERE commit_id=? AND service=?", (commit, service))
            db.execute("DELETE FROM steps WHERE commit_id=? AND service=? AND NOT (scope='once' AND status='done')",
                       (commit, service))

    def end_upgrade(self, commit: str, service: str, status: str) -> None:
        with self._tx(f"upgrade {service} {status}") as db:
            db.execute("UPDATE upgrades SET status=? WHERE commit_id=? AND service=?", (status, commit, service))

    def step(self, commit: str, seq: int, rec: StepRecord) -> None:
        """A step began, ended or was taken back: its record, and the note is due."""
        rec = self.redact.step(rec)
        with self._tx(f"step {rec.service}/{rec.step} {rec.status}") as db:
            db.execute("INSERT OR IGNORE INTO commits(commit_id, verdict, noted, time) VALUES (?, 'waiting', 0, ?)",
                       (commit, time.time()))
            db.execute("INSERT OR REPLACE INTO steps(commit_id, service, step, seq, scope, status, started, ended,"
                       " detail) VALUES (?,?,?,?,?,?,?,?,?)",
                       (commit, rec.service, rec.step, seq, str(rec.scope), str(rec.status), rec.started, rec.ended,
                        rec.detail))
            db.execute("UPDATE commits SET noted=0 WHERE commit_id=?", (commit,))

    def steps(self, commit: str) -> list[StepRecord]:
        return [StepRecord(str(r[0]), str(r[1]), Scope(r[2]), StepStatus(r[3]), float(r[4]), float(r[5]), str(r[6]))
                for r in self._all("SELECT service, step, scope, status, started, ended, detail FROM steps"
                                   " WHERE commit_id=? ORDER BY service != '', service, seq", commit)]

    def held(self) -> dict[str, dict[str, Any]]:
        """service -> the template variables a pin step holds for it on this node."""
        out: dict[str, dict[str, Any]] = {}
        for service, var, value in self._all("SELECT service, var, value FROM held ORDER BY service, var"):
            out.setdefault(str(service), {})[str(var)] = json.loads(value)
        return out

    def hold(self, service: str, values: Mapping[str, Any], commit: str) -> None:
        with self._tx(f"hold {service}") as db:
            for var, value in values.items():
                db.execute("INSERT OR REPLACE INTO held(service, var, value, commit_id) VALUES (?,?,?,?)",
                           (service, var, json.dumps(value), commit))
            db.execute("DELETE FROM converged")

    def release(self, service: str, names: Iterable[str] | None = None, commit: str | None = None) -> None:
        """Held variables of ``service`` let go: these ``names``, or all that ``commit`` pinned."""
        with self._tx(f"release {service}") as db:
            if names is not None:
                for var in names:
                    db.execute("DELETE FROM held WHERE service=? AND var=?", (service, var))
            elif commit is not None:
                db.execute("DELETE FROM held WHERE service=? AND commit_id=?", (service, commit))
            db.execute("DELETE FROM converged")

    # suspension --------------------------------------------------------------------------
    def suspend(self, reason: str, by: str, since: str) -> bool:
        """An operator's `suspend`: passes apply nothing until `resume`. Returns whether it was
        suspended already (then only the reason changes; who and since stay the first ones).
        The no-op marker goes in the same transaction, so the next pass notes the suspension."""
        with self._tx("suspend") as db:
            row = db.execute("SELECT value FROM meta WHERE key=?", (SUSPENDED_KEY,)).fetchone()
            old = json.loads(row[0]) if row else None
            record = {"reason": reason, "by": old["by"] if old else by, "since": old["since"] if old else since}
            db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?,?)", (SUSPENDED_KEY, json.dumps(record)))
            db.execute("DELETE FROM converged")
        return old is not None

    def resume(self) -> dict[str, str] | None:
        """An operator's `resume`: the suspension it lifted, or None when there was none."""
        with self._tx("resume") as db:
            row = db.execute("SELECT value FROM meta WHERE key=?", (SUSPENDED_KEY,)).fetchone()
            if row is None:
                return None
            db.execute("DELETE FROM meta WHERE key=?", (SUSPENDED_KEY,))
            db.execute("DELETE FROM converged")  # the next pass converges, and notes it resumed
        return dict(json.loads(row[0]))

    def suspend_from_repo(self, record: Mapping[str, str] | None) -> None:
        """The verified head's ``suspend: true`` (None: the head has none). Kept apart from the
        operator's, so a commit lifting the fleet's never lifts an operator's own."""
        with self._tx("suspend from repo") as db:
            if record is None:
                db.execute("DELETE FROM meta WHERE key=?", (REPO_SUSPENDED_KEY,))
            else:
                row = db.execute("SELECT value FROM meta WHERE key=?", (REPO_SUSPENDED_KEY,)).fetchone()
                kept = dict(record)
                if row is not None:  # suspended since the first commit that said so, not since this pass
                    kept.update({k: v for k, v in json.loads(row[0]).items() if k in ("by", "since")})
                db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?,?)",
                           (REPO_SUSPENDED_KEY, json.dumps(kept)))

    def suspension(self) -> dict[str, str] | None:
        """In force now: the operator's suspension first, else the fleet's from the repo."""
        for key in (SUSPENDED_KEY, REPO_SUSPENDED_KEY):
            value = self.get_meta(key)
            if value:
                return dict(json.loads(value))
        return None

    # meta --------------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        row = self._one("SELECT value FROM meta WHERE key=?", key)
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        with self._tx(f"meta {key}") as db:
            db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?,?)", (key, value))


def _statements(script: str) -> list[str]:
    """The schema's statements one by one: executescript() would commit the open transaction."""
    lines = [line.split("--", 1)[0] for line in script.splitlines()]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def _translate(exc: sqlite3.Error, path: Path) -> ReconcilerError:
    text = str(exc)
    if "disk is full" in text or "database or disk is full" in text:
        return DiskFull.at(path.parent, f"{path}: {text}")
    if isinstance(exc, sqlite3.OperationalError) and "locked" in text:
        from reconciler.core.errors import Busy

        return Busy(f"{path}: {text}")
    if getattr(exc, "sqlite_errorcode", None) == errno.ENOSPC:
        return DiskFull.at(path.parent, f"{path}: {text}")
    return ReconcilerError(f"{path}: the node's ledger cannot be read or written: {text}", reason="LEDGER_ERROR")
