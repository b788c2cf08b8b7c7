"""The ledger's commit records: the mark, each commit's verdict and the moves between verdicts.

The **mark** is the last commit this node acted on (anti-rollback's reference), its signer and
the origin of the trust root in force. Per **commit** the node keeps its verdict (``Verdict``)
and the moves allowed between verdicts (``ALLOWED``): above all, ``failed`` never becomes
``applied`` unless a run of that same commit applied it and found every service healthy
(``Proof.HEALTHY_RUN``); a rollback or an unpin adds events and pins to a commit's record and
never touches its verdict. Each record knows whether its note is written, so a run killed
between the verdict and the note finishes the note; a node that lost its state dir takes its
records back from its own notes (``restore``), so the table holds across the loss. With the
verdicts: the plane the node stood on at each commit, the **converged** marker (the commit and
hashes of the last full run that left every service healthy, which lets a poll that finds
nothing new do nothing; anything that changes what the node should run clears it), and the runs
settled (what metrics count).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from reconciler.core.errors import ReconcilerError
from reconciler.core.model import Report, Verdict
from reconciler.ledger.db import Store


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


class CommitLedger(Store):
    """The Ledger's commit records: the mark, verdicts, events, planes, the converged marker, runs."""

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

    def may_become(self, commit: str, verdict: Verdict) -> bool:
        """The transition table lets ``commit``'s record move to ``verdict`` (a commit with no
        record may become anything). The table only: ``settle`` also asks applied for its proof."""
        return verdict in ALLOWED[self.verdict(commit)]

    def restore(self, reports: Iterable[Report]) -> int:
        """After the state dir was lost: the records this node's own notes say, for the commits
        the ledger has none of. Each is what its note says (verdict, results, events, trust
        verdicts, plane, upgrade steps), noted already: the table of allowed moves holds against
        it as before the loss (an applied commit is not refused, a failed one not tried again
        unasked), and a note written again from it (an event added) keeps all it said. Returns
        how many were restored."""
        done = 0
        with self._tx("restore from notes") as db:
            for r in reports:
                cur = db.execute(
                    "INSERT OR IGNORE INTO commits(commit_id, verdict, reason, error, plan_hash, signer, healthy,"
                    " noted, time) VALUES (?,?,?,?,?,?,?,1,?)",
                    (r.commit, str(r.state), r.reason, r.error, r.plan_hash,
                     json.dumps(dict(r.signer)) if r.signer else None, int(r.state is Verdict.APPLIED),
                     _epoch(r.time)))
                if cur.rowcount != 1:
                    continue  # the ledger's own record wins over a note
                done += 1
                db.executemany("INSERT OR REPLACE INTO results(commit_id, seq, service, action, result, reason,"
                               " detail, pid, hash, steps) VALUES (?,?,?,?,?,?,?,?,?,?)",
                               [(r.commit, seq, s.service, str(s.action), str(s.state), s.reason, s.detail, s.pid,
                                 s.hash, json.dumps(list(s.steps))) for seq, s in enumerate(r.services)])
                db.executemany("INSERT INTO events(commit_id, text) VALUES (?,?)", [(r.commit, e) for e in r.events])
                db.executemany("INSERT OR REPLACE INTO trust_verdicts(commit_id, seq, body) VALUES (?,?,?)",
                               [(r.commit, seq, json.dumps(dict(v), sort_keys=True))
                                for seq, v in enumerate(r.verdicts)])
                if r.plane is not None:
                    db.execute("INSERT OR REPLACE INTO planes(commit_id, body) VALUES (?,?)",
                               (r.commit, json.dumps(dict(r.plane), sort_keys=True)))
                db.executemany("INSERT OR REPLACE INTO steps(commit_id, service, step, seq, scope, status, started,"
                               " ended, detail) VALUES (?,?,?,?,?,?,?,?,?)",
                               [(r.commit, s.service, s.step, seq, str(s.scope), str(s.status), s.started, s.ended,
                                 s.detail) for seq, s in enumerate(r.steps)])
        return done

    def count_run(self, commit: str, verdict: Verdict, reason: str) -> None:
        """A pass that came to ``verdict`` without moving ``commit``'s record (a rewind refused
        while the commit stays applied): counted with the runs, so `status` and the metrics say
        it."""
        with self._tx(f"run {commit[:12]} {verdict}") as db:
            db.execute("INSERT INTO runs(time, commit_id, state, reason) VALUES (?,?,?,?)",
                       (time.time(), commit, str(verdict), reason))

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

    # converged (the no-op fast path) -----------------------------------------------------
    def converged(self) -> tuple[str, dict[str, str]] | None:
        row = self._one("SELECT commit_id, hashes FROM converged WHERE id=1")
        return None if row is None else (str(row[0]), dict(json.loads(row[1])))

    # runs --------------------------------------------------------------------------------
    def last_run(self) -> dict[str, Any] | None:
        row = self._one("SELECT time, commit_id, state, reason FROM runs ORDER BY id DESC LIMIT 1")
        if row is None:
            return None
        return {"time": row[0], "commit": row[1], "state": row[2], "reason": row[3]}

    def run_counts(self) -> dict[tuple[str, str], int]:
        """(verdict, reason) -> how many runs settled on it."""
        return {(str(s), str(r)): int(n) for s, r, n in self._all(
            "SELECT state, reason, COUNT(*) FROM runs GROUP BY state, reason ORDER BY state, reason")}

    def event_count(self, prefix: str) -> int:
        """Events (on any commit) whose text starts with ``prefix``."""
        row = self._one("SELECT COUNT(*) FROM events WHERE substr(text, 1, ?) = ?", len(prefix), prefix)
        return int(row[0]) if row else 0

    def last_applied(self) -> str | None:
        """The commit this node most recently applied (healthy), if any."""
        row = self._one("SELECT commit_id FROM commits WHERE verdict='applied' ORDER BY time DESC LIMIT 1")
        return None if row is None else str(row[0])


def _epoch(text: str) -> float:
    """A note's time as the ledger orders records by (0: none, or not one: before the rest)."""
    try:
        return datetime.fromisoformat(text).timestamp()
    except (TypeError, ValueError):
        return 0.0
