"""What runs on a node and what to do about it: the services as the drivers observe them, and
the plan (its actions, each with the reason a reviewer reads) that takes them to the slice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.core.model.desired import ActionKind, DesiredService, FileSpec, canonical_json, sha256_hex


@dataclass(frozen=True)
class ObservedService:
    """What runs on the node for one service, as read back from the driver's own records."""

    name: str
    driver: str
    running: bool
    hash: str | None = None
    commit: str | None = None
    pid: int | None = None
    detail: str = ""
    fingerprint: tuple[tuple[str, str], ...] = ()
    # A change made by hand that the driver can see: "networks", "restart policy", or one that
    # starts with "files:" ("files: identity.conf changed, notes.txt added") for the live files.
    drifted: str = ""
    files: tuple[FileSpec, ...] = ()  # the config files it runs with now, for key-level comparison
    drift: str = "correct"  # the policy it was applied with: "report" means hands off

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "driver": self.driver,
            "running": self.running,
            "hash": self.hash,
            "commit": self.commit,
            "pid": self.pid,
            "detail": self.detail,
            "drifted": self.drifted,
        }


@dataclass(frozen=True)
class Observed:
    node: str
    services: tuple[ObservedService, ...]

    def by_name(self) -> Mapping[str, ObservedService]:
        return {s.name: s for s in self.services}

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "services": [s.to_dict() for s in self.services]}


@dataclass(frozen=True)
class Action:
    """One step of a plan, with the reason a reviewer reads."""

    kind: ActionKind
    service: str
    reason: str
    desired: DesiredService | None = None
    driver: str = ""
    sync: bool = False  # a "none" whose files still change on disk (comments, none-rules)
    staged: bool = False  # held back by apply: manual until an operator's `reconciler apply`
    waiting: str = ""  # held back on purpose: by what (which window and when it opens, whose slots)
    held_by: str = ""  # the reason code of that hold: WINDOW or BUDGET

    def without_desired(self) -> Action:
        """The same step without the rendered service it carries (what a review keeps)."""
        return Action(self.kind, self.service, self.reason, None, self.driver, self.sync, self.staged, self.waiting,
                      self.held_by)

    def to_dict(self) -> dict[str, Any]:
        out = {"service": self.service, "action": str(self.kind), "reason": self.reason}
        if self.waiting:
            out["waiting"] = self.waiting
        return out


@dataclass(frozen=True)
class Plan:
    node: str
    commit: str
    actions: tuple[Action, ...]

    @property
    def changes(self) -> tuple[Action, ...]:
        return tuple(a for a in self.actions if a.kind is not ActionKind.NONE or a.sync)

    @property
    def hash(self) -> str:
        """Of the changes only, so a reviewer's `diff` and the node's run name the same plan
        even when "unchanged since <commit>" differs."""
        return sha256_hex(canonical_json([a.to_dict() for a in self.changes]))[:16]

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "commit": self.commit,
            "hash": self.hash,
            "actions": [a.to_dict() for a in self.actions],
        }
