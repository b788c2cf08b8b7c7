"""The ledger's service records: versions run, pins, the journal of actions in flight, history.

Per **service**: the running version (the commit it was rendered from, its hash), the last
good one, and a history of versions; **pins** (to which commit, made at which head, by whom);
the **journal** of actions in flight: written before an action, settled after its effect, so a
killed run's next run knows what it ``Interrupted``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from reconciler.core.model import ActionKind
from reconciler.ledger.db import Store


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


class ServiceLedger(Store):
    """The Ledger's service records: versions, pins, the journal, the history of actions."""

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

    def action_counts(self) -> dict[tuple[str, str], int]:
        """(action, result) -> how many were done (the supervisor's revives included)."""
        return {(str(a), str(r)): int(n) for a, r, n in self._all(
            "SELECT action, result, COUNT(*) FROM history GROUP BY action, result ORDER BY action, result")}

