"""Disruption budgets: at most ``max_disrupted`` nodes of a group restart, recreate, drain or
reboot at once, with no lock server.

Each node's notes ref is a register only that node writes, so Lamport's bakery works over them
(the k-slot form): a node announces it is *choosing*, reads every claim, takes a ticket one
above the highest it saw, publishes it (*queued*), and goes once fewer than k live claims of
its group hold a lower (ticket, node) and nobody in its group is still choosing; it frees its
claim once its change passed its health check. A claim not rewritten for ``expire_after``
(a node that stopped answering) no longer counts. Node clocks are assumed to agree to well
within that time (NTP).

Pure: budgets, claims and a time in, a verdict out. Reading and writing the registers is the
agent's (``node.peers``); the budgets themselves, as reconciler.yaml defines them, are the repo's
(``repo.budgets``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from reconciler.core.model import ActionKind
from reconciler.fleet.notes import Claim
from reconciler.repo.budgets import Budget

__all__ = ["DISRUPTIVE", "Wait", "budgets_of", "next_ticket", "wait"]

# What takes a node (or its service) out for a while: what a budget counts.
DISRUPTIVE = frozenset({ActionKind.RESTART, ActionKind.RECREATE, ActionKind.DRAIN_RESTART, ActionKind.REBOOT})


@dataclass(frozen=True)
class Wait:
    """Why a node may not take its slot yet: the budget, and the nodes it waits for."""

    budget: Budget
    nodes: tuple[str, ...]
    choosing: bool = False  # they are picking tickets: read again before deciding

    def __str__(self) -> str:
        b = self.budget
        who = ", ".join(self.nodes)
        if self.choosing:
            return f"waiting (budget): group {b.group} max_disrupted {b.spec}: {who} choosing a ticket"
        return f"waiting (budget): group {b.group} max_disrupted {b.spec}: waiting for {who}"


def budgets_of(budgets: Iterable[Budget], node: str) -> tuple[Budget, ...]:
    return tuple(b for b in budgets if node in b.members)


def next_ticket(claims: Mapping[str, Claim], mine: Iterable[Budget], now: float) -> int:
    """One above the highest ticket of a live claim in any of this node's groups."""
    mine = tuple(mine)
    tickets = [c.ticket for c in claims.values()
               if c.state == "queued" and any(c.node in b.members and b.live(c, now) for b in mine)]
    return max(tickets, default=0) + 1


def wait(me: Claim, claims: Mapping[str, Claim], mine: Iterable[Budget], now: float) -> Wait | None:
    """None when ``me`` (queued, with its ticket) may take its slot in every budget it is in."""
    for b in mine:
        others = [c for n, c in sorted(claims.items()) if n != me.node and n in b.members and b.live(c, now)]
        choosing = tuple(c.node for c in others if c.state == "choosing")
        if choosing:
            return Wait(b, choosing, choosing=True)
        ahead = tuple(c.node for c in others if (c.ticket, c.node) < (me.ticket, me.node))
        if len(ahead) >= b.max_disrupted:
            return Wait(b, ahead)
    return None
