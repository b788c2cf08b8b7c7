"""The Ledger: the one object callers hold, composed of its parts over one database.

Each part is a class over ``db.Store`` (the connection and its transactions) and owns its
tables: ``CommitLedger`` the mark, verdicts and what settles them, ``ServiceLedger`` services,
pins, the journal and history, ``UpgradeLedger`` upgrades, steps and held values, ``FlagLedger``
the small named facts of ``meta``. What reads across all of them lives here: ``report``, the
projection a note is encoded from.
"""

from __future__ import annotations

import json

from reconciler.core.model import ActionKind, Report, ResultState, ServiceResult, Verdict
from reconciler.ledger.commits import CommitLedger
from reconciler.ledger.flags import FlagLedger
from reconciler.ledger.services import ServiceLedger
from reconciler.ledger.upgrades import UpgradeLedger


class Ledger(CommitLedger, ServiceLedger, UpgradeLedger, FlagLedger):
    """Open with ``Ledger.open``; every method is one transaction."""

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
        rewind = self.rewind_refused()
        refused = {k: v for k, v in rewind.items() if k != "commit"} if rewind and rewind["commit"] == commit else None
        facts = self.facts_rendered()  # the last converged render's: on that commit's note only
        return Report(node, commit, rec.verdict, time_text, services=results, reason=rec.reason, error=rec.error,
                      plan_hash=rec.plan_hash, signer=rec.signer, verdicts=verdicts, events=events, pins=pins,
                      steps=tuple(self.steps(commit)), suspended=suspended,
                      plane=json.loads(plane[0]) if plane else None, refused=refused,
                      facts=facts[2] if facts is not None and facts[0] == commit else None)

