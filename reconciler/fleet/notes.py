"""The note codec: a node's record of one commit as JSON, and back. One schema version.

The only module that knows the note's fields. A note is written by its node alone, in
``refs/notes/reconciler/<node>``; other nodes (the fleet gate), ``status --fleet`` and review
tools read it through ``decode``/``Note``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from reconciler.core.model import Report

FORMAT = 1


def to_dict(report: Report) -> dict[str, Any]:
    out: dict[str, Any] = {
        "format": FORMAT,
        "node": report.node,
        "commit": report.commit,
        "state": str(report.state),
        "time": report.time,
        "services": {r.service: r.to_dict() for r in report.services},
    }
    if report.plan_hash:
        out["plan_hash"] = report.plan_hash
    if report.reason:
        out["reason"] = report.reason
    if report.error:
        out["error"] = report.error
    if report.signer:
        out["signer"] = dict(report.signer)
    if report.verdicts:
        out["verdicts"] = [dict(v) for v in report.verdicts]
    if report.events:
        out["events"] = list(report.events)
    if report.pins:
        out["pins"] = dict(report.pins)
    if report.steps:
        out["upgrade"] = [s.to_dict() for s in report.steps]
    if report.suspended:
        out["suspended"] = dict(report.suspended)
    if report.plane:
        out["plane"] = dict(report.plane)
    return out


def encode(report: Report) -> str:
    """Same record, same bytes: sorted keys."""
    return json.dumps(to_dict(report), indent=2, sort_keys=True) + "\n"


def decode(text: str | bytes) -> dict[str, Any] | None:
    """A note's body, or None for one that is not ours (not JSON, not an object)."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, TypeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True)
class Note:
    """The part of a node's note the rollout and fleet status read."""

    node: str
    commit: str
    state: str
    time: str = ""
    failed_service: str = ""
    error: str = ""
    steps: Mapping[tuple[str, str], str] = field(default_factory=dict)  # (service, step) -> status
    vip: str = ""  # "attached" | "detached": on the VIP networks at this commit ("": no two planes)

    @staticmethod
    def parse(node: str, commit: str, data: Mapping[str, Any]) -> Note:
        failed = [s for s, r in (data.get("services") or {}).items()
                  if isinstance(r, Mapping) and r.get("result") == "failed"]
        steps = {(str(s.get("service", "")), str(s.get("step", ""))): str(s.get("status", ""))
                 for s in data.get("upgrade") or () if isinstance(s, Mapping)}
        plane = data.get("plane")
        return Note(node, commit, str(data.get("state", "")), str(data.get("time", "")),
                    failed[0] if failed else "", str(data.get("error", "")), steps,
                    str(plane.get("vip", "")) if isinstance(plane, Mapping) else "")


# A node's claim on a disruption slot (see ``budget``) is a note too, in the same ref, on an
# object no commit is: the empty tree, which every repository knows without storing it.
CLAIM_OBJECT = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


@dataclass(frozen=True)
class Claim:
    """A node's register in the disruption bakery: ``choosing`` while it picks a ticket,
    ``queued`` with its ticket until it is done, ``free`` (ticket 0) once its change passed."""

    node: str
    state: str  # choosing | queued | free
    ticket: int = 0
    time: float = 0.0  # when the node last wrote it (seconds since the epoch, its clock)
    action: str = ""  # what it needs the slot for: "restart db, identity"

    def encode(self) -> str:
        return json.dumps({"format": FORMAT, "claim": {"node": self.node, "state": self.state, "ticket": self.ticket,
                                                       "time": self.time, "action": self.action}},
                          indent=2, sort_keys=True) + "\n"

    @staticmethod
    def parse(node: str, data: Mapping[str, Any]) -> Claim | None:
        """The claim in a note body, or None for one that is not (an old agent's, garbage): a
        claim that cannot be read is no claim, as if the node held none."""
        c = data.get("claim")
        if not isinstance(c, Mapping) or c.get("state") not in ("choosing", "queued", "free"):
            return None
        try:
            return Claim(node, str(c["state"]), int(c.get("ticket", 0)), float(c.get("time", 0.0)),
                         str(c.get("action", "")))
        except (TypeError, ValueError):
            return None
