"""The ledger's upgrade records: upgrades in progress, their steps, and the values pins hold.

**Upgrades** in progress per commit and service (the version they started from), each
**step**'s status and times (what barriers on other nodes read from the note), and the
template variables a pin step **holds** on this node.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

from reconciler.core.model import Scope, StepRecord, StepStatus
from reconciler.ledger.db import Store


class UpgradeLedger(Store):
    """The Ledger's upgrade records: upgrades, steps, held template variables."""

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

    def steps_started(self) -> list[tuple[str, StepRecord]]:
        """Steps begun and not ended, oldest first, each with its commit: a pass at one now, or
        one stopped mid-step (the next run takes it up). A service's step only while its
        upgrade is under way: one the branch left behind is nobody's to finish."""
        return [(str(r[0]), StepRecord(str(r[1]), str(r[2]), Scope(r[3]), StepStatus(r[4]), float(r[5]),
                                       float(r[6]), str(r[7])))
                for r in self._all("SELECT s.commit_id, s.service, s.step, s.scope, s.status, s.started, s.ended,"
                                   " s.detail FROM steps s WHERE s.status='started' AND (s.service='' OR EXISTS"
                                   " (SELECT 1 FROM upgrades u WHERE u.commit_id=s.commit_id AND"
                                   " u.service=s.service AND u.status='running')) ORDER BY s.started")]

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
