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
agent's (``slots``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from reconciler.core.model import ActionKind
from reconciler.fleet.notes import Claim
from reconciler.plan.windows import WindowError, parse_duration

__all__ = ["DISRUPTIVE", "Budget", "BudgetError", "Wait", "budgets_of", "next_ticket", "parse_budgets", "wait"]

# What takes a node (or its service) out for a while: what a budget counts.
DISRUPTIVE = frozenset({ActionKind.RESTART, ActionKind.RECREATE, ActionKind.DRAIN_RESTART, ActionKind.REBOOT})
EXPIRE_AFTER = timedelta(minutes=15)


class BudgetError(ValueError):
    """A budget that cannot be read: the message says what is wrong with it (no location)."""


@dataclass(frozen=True)
class Budget:
    group: str
    members: frozenset[str]
    max_disrupted: int  # a count; a percentage is resolved against the group's size
    spec: str  # as written: "1", "25%"
    expire_after: timedelta = EXPIRE_AFTER

    def live(self, claim: Claim, now: float) -> bool:
        return claim.state != "free" and now - claim.time <= self.expire_after.total_seconds()


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


def parse_budgets(spec: Iterable[Mapping[str, Any]], members: Mapping[str, Iterable[str]]
                  ) -> list[tuple[int, Budget | BudgetError]]:
    """reconciler.yaml's ``disruption_budgets`` (index, budget or what is wrong with it)."""
    out: list[tuple[int, Budget | BudgetError]] = []
    for i, b in enumerate(spec):
        group = str(b.get("group", ""))
        if group not in members:
            out.append((i, BudgetError(f"disruption budget: unknown group {group!r}")))
            continue
        nodes = frozenset(members[group])
        text = str(b.get("max_disrupted", "")).strip()
        try:
            if text.endswith("%"):
                share = float(text[:-1])
                if not 0 < share <= 100:
                    raise ValueError
                count = max(1, math.floor(len(nodes) * share / 100))
            else:
                count = int(text)
                if count < 1:
                    raise ValueError
        except ValueError:
            out.append((i, BudgetError(f"disruption budget of group {group!r}: max_disrupted {text!r} is not a "
                                       f"count of at least 1 or a percentage like 25%")))
            continue
        try:
            expire = parse_duration(str(b["expire_after"])) if "expire_after" in b else EXPIRE_AFTER
        except WindowError as exc:
            out.append((i, BudgetError(f"disruption budget of group {group!r}: expire_after: {exc}")))
            continue
        out.append((i, Budget(group, nodes, count, text, expire)))
    return out


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
