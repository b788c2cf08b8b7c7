"""A node's side of the disruption budgets (``budget``): its claim written to its own notes
ref and pushed, every node's claims read through the fleet view.

A node takes a slot for the pass whose plan restarts, recreates, drains or reboots something
of a group with a budget, and frees it once that pass settled (its services passed their
checks, or failed and were put back). A reboot keeps the slot until the node is back.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from reconciler.core.errors import RemoteError
from reconciler.core.model import Plan
from reconciler.fleet.budget import DISRUPTIVE, Budget, budgets_of, next_ticket, wait
from reconciler.fleet.notes import Claim

if TYPE_CHECKING:
    from reconciler.agent import Agent
    from reconciler.repo.load import DeploymentRepo

log = logging.getLogger("reconciler.agent")


def take(agent: Agent, repo: DeploymentRepo, plan: Plan) -> str | None:
    """None when this node may make the plan's disruptive changes now (it holds its slot in
    every budget it is in); otherwise why it waits, and for whom."""
    node = agent.cfg.node
    mine = budgets_of(repo.budgets, node)
    needs = [a for a in plan.actions if a.kind in DISRUPTIVE]
    if not mine or not needs:
        return None
    what = ", ".join(f"{a.kind} {a.service}" for a in needs)
    try:
        return _take(agent, mine, what)
    except RemoteError as exc:  # the others' claims unread: a wait, never a go (nor a failed commit)
        return f"waiting (budget): the other nodes' claims could not be read: {exc}"


def _take(agent: Agent, mine: tuple[Budget, ...], what: str) -> str | None:
    node = agent.cfg.node
    group = {n for b in mine for n in b.members}
    claim = agent.reporter.claim()
    now = time.time()
    if claim is None or claim.state != "queued" or not all(b.live(claim, now) for b in mine):
        # The doorway: say we are choosing before reading the others, so a node that reads us
        # meanwhile waits for our ticket instead of missing it.
        agent.reporter.write_claim(Claim(node, "choosing", 0, now, what))
        if not agent.reporter.push():
            return "waiting (budget): this node's claim could not be pushed (the remote did not answer)"
        seen = agent.fleet_view(group).claims
        claim = Claim(node, "queued", next_ticket(seen, mine, time.time()), time.time(), what)
        agent.reporter.write_claim(claim)
        if not agent.reporter.push():
            return "waiting (budget): this node's ticket could not be pushed (the remote did not answer)"
    elif claim.action != what or now - claim.time > min(b.expire_after for b in mine).total_seconds() / 3:
        claim = replace(claim, time=now, action=what)  # still here: kept live while it waits
        agent.reporter.write_claim(claim)
        agent.reporter.push()
    held = wait(claim, agent.fleet_view(group).claims, mine, time.time())
    if held is not None:
        return str(held)
    log.info("%s: disruption slot taken (ticket %d): %s", node, claim.ticket, what)
    return None


def release(agent: Agent) -> None:
    """Free this node's slot, if it holds or waits for one."""
    claim = agent.reporter.claim()
    if claim is None or claim.state == "free":
        return
    agent.reporter.write_claim(Claim(agent.cfg.node, "free", 0, time.time()))
    agent.reporter.push()  # a push that fails is retried on the next pass, like a note
