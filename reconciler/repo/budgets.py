"""Disruption budgets as reconciler.yaml defines them (``disruption_budgets``): how many nodes of
a group may be disrupted at once, parsed when the repo loads.

How nodes share a budget's slots (the bakery over their notes) is ``fleet.budget``'s; a budget
here only says which claims still count, so the repo's definitions need nothing from the fleet.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from reconciler.repo.windows import WindowError, parse_duration

# A claim not rewritten for this long (a node that stopped answering) no longer counts.
EXPIRE_AFTER = timedelta(minutes=15)


class Claimed(Protocol):
    """What a budget reads of a node's claim (``fleet.notes.Claim``): its state and when the node
    last wrote it. A protocol, so the repo's definitions do not import the fleet's note codec."""

    @property
    def state(self) -> str: ...

    @property
    def time(self) -> float: ...


class BudgetError(ValueError):
    """A budget that cannot be read: the message says what is wrong with it (no location)."""


@dataclass(frozen=True)
class Budget:
    group: str
    members: frozenset[str]
    max_disrupted: int  # a count; a percentage is resolved against the group's size
    spec: str  # as written: "1", "25%"
    expire_after: timedelta = EXPIRE_AFTER

    def live(self, claim: Claimed, now: float) -> bool:
        return claim.state != "free" and now - claim.time <= self.expire_after.total_seconds()


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
