"""A disruption claim is aged by the reader's clock: from when this node first read it as it is,
never from the time its writer put in it. A claim dated far ahead counts for nothing; one left
behind by a node that went away stops counting ``expire_after`` after it was first seen, as the
disruption budgets page (docs/operations/budgets.md) promises, whatever date it bears.

ctl1 is the compromised (or merely broken) node here: it holds its own notes key, so what it
writes is signed and well formed. ctl2 is the honest agent that must not be held for good.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from clock import Clock
from conftest import Deployment, git, note_key

from reconciler.agent import Agent
from reconciler.fleet.notes import CLAIM_OBJECT, Claim
from reconciler.trust.notesig import NoteKey

BUDGET = """
disruption_budgets:
  - {group: controllers, max_disrupted: 1, expire_after: 10m}
"""
YEAR = 365 * 86400.0


def ctl1_claims(deployment: Deployment, claim: Claim) -> None:
    """ctl1 writes ``claim`` into its own notes ref on the remote, signed with its own key."""
    body = NoteKey.load(note_key("ctl1")).seal("ctl1", CLAIM_OBJECT, claim.to_dict())
    git("--git-dir", str(deployment.bare), "-c", "user.name=ctl1", "-c", "user.email=ctl1@example.org", "notes",
        "--ref=reconciler/ctl1", "add", "-f", "-m", json.dumps(body, indent=2), CLAIM_OBJECT)


def restart_db(deployment: Deployment, name: str) -> str:
    text = deployment.read("services/db/templates/db.conf.j2")
    start = text.index("name = db-{{ node }}")
    end = text.index("\n", start)
    deployment.write("services/db/templates/db.conf.j2", text[:start] + f"name = db-{{{{ node }}}}-{name}" + text[end:])
    return deployment.commit(f"db: member name {name} (a restart on every controller)")


def test_a_claim_dated_years_ahead_counts_for_nothing_and_a_dead_nodes_claim_expires_by_the_readers_clock(
    deployment: Deployment, agents: Callable[..., Agent]
) -> None:
    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml") + BUDGET)
    deployment.commit("budget: one controller at a time")
    clock = Clock()  # ctl2's clock; ctl1 dates its claims by a clock of its own
    ctl2 = agents("ctl2", deployment.url, clock=clock)

    def now() -> float:
        return clock.now.timestamp()
    assert ctl2.reconcile_once().exit_code == 0  # starts: nothing is disrupted

    # ctl1 holds the lowest ticket, dated ten years ahead: it would block the group for good
    ctl1_claims(deployment, Claim("ctl1", "queued", 1, now() + 10 * YEAR, "restart db"))
    head = restart_db(deployment, "a")
    went = ctl2.reconcile_once()
    assert went.exit_code == 0 and not went.waiting and ctl2.ledger.verdict(head) == "applied", went

    # ctl1 claims again, dated within a clock's drift (200 s ahead), then goes away for good
    ctl1_claims(deployment, Claim("ctl1", "queued", 1, now() + 200, "restart db"))
    head = restart_db(deployment, "b")
    held = ctl2.reconcile_once()
    assert held.waiting and "ctl1" in held.waiting, held
    # while it waits it keeps reading the same claim: its age runs from the first read
    clock.now += timedelta(minutes=6)
    assert ctl2.reconcile_once().waiting
    clock.now += timedelta(minutes=5)  # 11 minutes since ctl2 first read it (its date is 3 min ahead still)
    went = ctl2.reconcile_once()
    assert went.exit_code == 0 and not went.waiting and ctl2.ledger.verdict(head) == "applied", went

    # a claim ctl1 rewrites is new again: it counts, as a live node's must
    ctl1_claims(deployment, Claim("ctl1", "queued", 1, now(), "restart db"))
    head = restart_db(deployment, "c")
    assert ctl2.reconcile_once().waiting


def test_a_node_whose_key_the_repo_does_not_list_takes_no_slot_the_others_cannot_see(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path
) -> None:
    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml") + BUDGET)
    deployment.commit("budget: one controller at a time")
    unlisted = tmp_path / "ctl2-new-key"  # made anew (the state dir was lost, say), not listed yet
    NoteKey.load_or_create(unlisted)
    ctl2 = agents("ctl2", deployment.url, note_key=unlisted)
    assert ctl2.reconcile_once().exit_code == 0  # starts: no slot needed
    head = restart_db(deployment, "a")
    held = ctl2.reconcile_once()
    assert held.waiting and "would count for no other node" in held.waiting, held
    assert ctl2.ledger.verdict(head) != "applied"


def test_an_older_claim_served_again_does_not_replace_the_newer_one_read_before(
    deployment: Deployment, agents: Callable[..., Agent]
) -> None:
    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml") + BUDGET)
    deployment.commit("budget: one controller at a time")
    clock = Clock()
    ctl2 = agents("ctl2", deployment.url, clock=clock)
    assert ctl2.reconcile_once().exit_code == 0
    now = clock.now.timestamp()
    ctl1_claims(deployment, Claim("ctl1", "queued", 1, now, "restart db"))  # ctl1 restarts db
    head = restart_db(deployment, "a")
    assert ctl2.reconcile_once().waiting
    # a stale mirror (or a hostile one) serves ctl1's older, genuinely signed "free" claim
    ctl1_claims(deployment, Claim("ctl1", "free", 0, now - 600))
    held = ctl2.reconcile_once()
    assert held.waiting and "ctl1" in held.waiting, held
    # ctl1 frees its slot for real (a newer claim): ctl2 goes
    ctl1_claims(deployment, Claim("ctl1", "free", 0, now + 1))
    went = ctl2.reconcile_once()
    assert went.exit_code == 0 and not went.waiting and ctl2.ledger.verdict(head) == "applied", went
