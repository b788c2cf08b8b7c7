"""The ledger's transitions as properties: whatever an operator and the faults do, in any order,
a node's note never says ``applied`` for a commit that failed here and was not applied healthy
since, and the fleet gate never lets the next wave start a commit the canary failed."""

from __future__ import annotations

import sqlite3
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from reconciler.core.model import ActionKind, Report, ResultState, ServiceResult, Verdict
from reconciler.fleet import notes
from reconciler.fleet.rollout import FleetView, decide, plan_rollout
from reconciler.ledger import IllegalTransition, Ledger, Pin, Proof, Version

COMMITS = ("c1", "c2", "c3")
commits = st.sampled_from(COMMITS)


def report(commit: str, verdict: Verdict, failed: bool = False) -> Report:
    result = ServiceResult("web", ActionKind.RESTART, ResultState.FAILED if failed else ResultState.OK, "test")
    return Report("canary", commit, verdict, "2026-01-01T00:00:00Z", services=(result,),
                  reason="APPLY_FAILED" if failed else "")


class CanaryNode(RuleBasedStateMachine):
    """One node's ledger under every operation the agent and an operator perform; ``truth`` is
    what really happened to each commit here (the last run's outcome), ``notes`` the notes ref."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="ledger-"))
        self.ledger = Ledger.open(self.dir)
        self.truth: dict[str, str] = {}
        self.notes: dict[str, dict[str, object]] = {}

    def teardown(self) -> None:
        self.ledger.close()

    def _settle(self, rep: Report, proof: Proof | None = None) -> None:
        before = self.ledger.record(rep.commit)
        try:
            self.ledger.settle(rep, proof=proof)
        except IllegalTransition:
            assert self.ledger.record(rep.commit) == before  # refused moves change nothing
            return
        self._note(rep.commit)

    def _note(self, commit: str) -> None:
        projected = self.ledger.report(commit, "canary", "2026-01-01T00:00:00Z")
        if projected is not None:
            self.notes[commit] = notes.to_dict(projected)
            self.ledger.noted(commit)

    @rule(c=commits)
    def healthy_run(self, c: str) -> None:
        self.ledger.advance(c, None)
        self._settle(report(c, Verdict.APPLIED), Proof.HEALTHY_RUN)
        self.truth[c] = "healthy"

    @rule(c=commits)
    def failed_run(self, c: str) -> None:
        self.ledger.advance(c, None)
        self._settle(report(c, Verdict.FAILED, failed=True))
        self.truth[c] = "failed"

    @rule(c=commits, verdict=st.sampled_from([Verdict.APPLIED, Verdict.STAGED, Verdict.REBOOTING]))
    def a_claim_without_proof(self, c: str, verdict: Verdict) -> None:
        """What the first wave's rollback did: a verdict written with no healthy run behind it."""
        self._settle(report(c, verdict))
        if verdict is Verdict.APPLIED and self.truth.get(c) != "failed":
            self.truth.setdefault(c, "claimed")

    @rule(c=commits, verdict=st.sampled_from([Verdict.REFUSED, Verdict.HALTED, Verdict.ERROR, Verdict.WAITING]))
    def stopped_before_applying(self, c: str, verdict: Verdict) -> None:
        self._settle(report(c, verdict))

    @rule(c=commits)
    def rollback(self, c: str) -> None:
        if self.ledger.record(c) is None:
            return
        self.ledger.pin(Pin("web", "c0", "h0", c, "operator", time.time()))
        self.ledger.ran("web", Version("c0", "h0"), healthy=True)
        self.ledger.add_event(c, "rollback of web to c0 by operator: ok")
        self._note(c)

    @rule()
    def unpin(self) -> None:
        pin = self.ledger.unpin("web")
        if pin is not None and self.ledger.record(pin.head) is not None:
            self.ledger.add_event(pin.head, "pin of web released")
            self._note(pin.head)

    @rule(c=commits)
    def retry(self, c: str) -> None:
        self.ledger.retry(c)

    @rule()
    def state_loss(self) -> None:
        """The disk is replaced: the ledger starts empty; the notes on the remote remain."""
        self.ledger.close()
        self.dir = Path(tempfile.mkdtemp(prefix="ledger-"))
        self.ledger = Ledger.open(self.dir)

    @invariant()
    def no_note_says_applied_for_a_commit_that_failed_here(self) -> None:
        for c, note in self.notes.items():
            if note["state"] == "applied":
                assert self.truth.get(c) != "failed", (c, note, self.truth)

    @invariant()
    def the_gate_halts_the_next_wave_on_a_failed_commit(self) -> None:
        rollout = plan_rollout({"rollout": {"waves": [{"nodes": ["canary"]}, {"nodes": ["next"]}]}},
                               ["canary", "next"], lambda g: [])
        fleet = FleetView({"canary": tuple(notes.Note.parse("canary", c, n) for c, n in self.notes.items())})
        for c in COMMITS:
            go = decide(rollout, "next", c, fleet, time.time())
            if self.truth.get(c) == "failed":
                assert not go.go, (c, self.notes.get(c))


TestCanaryNode = CanaryNode.TestCase
TestCanaryNode.settings = settings(max_examples=150, stateful_step_count=25, deadline=None,
                                   suppress_health_check=[HealthCheck.too_slow])


def test_a_first_wave_state_db_is_migrated_into_the_tables(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "state.db")
    db.executescript("""
        CREATE TABLE history (id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, service TEXT NOT NULL,
            commit_id TEXT NOT NULL, hash TEXT, action TEXT NOT NULL, result TEXT NOT NULL,
            reason TEXT NOT NULL DEFAULT '', detail TEXT NOT NULL DEFAULT '');
        CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO history(time, service, commit_id, hash, action, result) VALUES (1, 'web', 'c1', 'h1', 'start', 'ok');
        INSERT INTO kv VALUES ('high_water', 'c2'), ('high_water_signer', '{"principal": "merge@example.org"}'),
            ('applied_commit', 'c1'), ('applied_hashes', '{"web": "h1"}'), ('failed_commit', 'c2'),
            ('pin:web', '{"commit": "c1", "head": "c2", "hash": "h1"}'), ('notes_pushed', 'abc');
    """)
    db.close()

    ledger = Ledger.open(tmp_path)

    assert ledger.mark().commit == "c2" and ledger.mark().signer == {"principal": "merge@example.org"}
    assert ledger.verdict("c1") is Verdict.APPLIED and ledger.verdict("c2") is Verdict.FAILED
    assert ledger.converged() == ("c1", {"web": "h1"})
    assert [(p.service, p.commit, p.head) for p in ledger.pins()] == [("web", "c1", "c2")]
    assert ledger.notes_pushed().tip == "abc"
    assert [r.commit for r in ledger.history("web")] == ["c1"]
    # The migrated failure is a failure like any other: staged only after a healthy run of it
    # (c3, never seen here, may be staged by any run).
    with pytest.raises(IllegalTransition, match="c2: failed here; only a healthy run of it can make it staged"):
        ledger.settle(report("c2", Verdict.STAGED))
    ledger.settle(report("c3", Verdict.STAGED))
    ledger.close()
    assert Ledger.open(tmp_path).verdict("c2") is Verdict.FAILED  # and migrating twice is once
