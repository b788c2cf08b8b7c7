"""A commit's run through a node: the revision as the source found it and as trust let it
through, each service's result, the upgrade steps' records, and the verdict and report the
ledger keeps and the note carries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from reconciler.core.model.desired import ActionKind


@dataclass(frozen=True)
class Revision:
    """A commit of the deployment repo as the source found it: nothing about it is trusted yet."""

    commit: str
    tree: str
    author: str
    time: int  # committer time, seconds since the epoch (never used to judge a key's validity)

    def to_dict(self) -> dict[str, Any]:
        return {"commit": self.commit, "tree": self.tree, "author": self.author, "time": self.time}


@dataclass(frozen=True)
class VerifiedRevision:
    """A ``Revision`` that trust let through: signed under the node's root and forward of the
    mark. Only ``node.keeper`` makes one, and only one of these reaches render and apply."""

    revision: Revision
    signer: Mapping[str, str] | None  # format, principal, fingerprint of the signature that vouched

    @property
    def commit(self) -> str:
        return self.revision.commit

    def to_dict(self) -> dict[str, Any]:
        return {**self.revision.to_dict(), "signer": dict(self.signer) if self.signer else None}


class ResultState(StrEnum):
    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class ServiceResult:
    service: str
    action: ActionKind
    state: ResultState
    reason: str
    detail: str = ""
    pid: int | None = None
    hash: str | None = None
    steps: tuple[str, ...] = ()  # escalation: each step tried and how it ended

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": list(self.steps),
            "action": str(self.action),
            "result": str(self.state),
            "reason": self.reason,
            "detail": self.detail,
            "pid": self.pid,
            "hash": self.hash,
        }


class Scope(StrEnum):
    """Where an upgrade step runs: on every node that runs the service, or on one of them."""

    NODE = "node"
    ONCE = "once"


class StepStatus(StrEnum):
    STARTED = "started"  # begun, not finished: a killed run leaves this
    DONE = "done"
    SKIPPED = "skipped"  # nothing to do here: the node runs the new version already, or a once step runs elsewhere
    FAILED = "failed"
    UNDONE = "undone"  # the upgrade failed or halted: this step was taken back


PASSED = (StepStatus.DONE, StepStatus.SKIPPED)


@dataclass(frozen=True)
class StepRecord:
    """One step on one node, as the ledger keeps it and the note shows it."""

    service: str  # "" for a deployment-wide post step
    step: str
    scope: Scope
    status: StepStatus
    started: float = 0.0
    ended: float = 0.0
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"service": self.service, "step": self.step, "scope": str(self.scope), "status": str(self.status),
                "started": _iso(self.started), "ended": _iso(self.ended), "detail": self.detail}


def _iso(t: float) -> str:
    """Milliseconds: an audit of barriers compares the ends and starts of steps."""
    if not t:
        return ""
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class Verdict(StrEnum):
    """The node's verdict on a commit: what its note says, and what the fleet gate reads."""

    APPLIED = "applied"  # every service of the slice runs it and passed its check
    FAILED = "failed"  # a service failed here (and was put back)
    ERROR = "error"  # the commit cannot be used as it is (render, validation): nothing applied
    REFUSED = "refused"  # trust said no: nothing rendered
    REBOOTING = "rebooting"  # a reboot this commit needs is under way
    HALTED = "halted"  # another node failed it: this one did not start
    STAGED = "staged"  # apply: manual services wait for an operator's `reconciler apply`
    WAITING = "waiting"  # not this node's turn yet; noted only at an upgrade's barrier


RunState = Verdict  # the first wave's name for it


@dataclass(frozen=True)
class Report:
    """What the node did for one commit: a run's outcome, and the ledger's record that a note is
    encoded from (``reconciler.notes`` is the only place that knows the note's JSON)."""

    node: str
    commit: str
    state: RunState
    time: str
    services: tuple[ServiceResult, ...] = ()
    reason: str = ""
    error: str = ""
    plan_hash: str = ""
    signer: Mapping[str, str] | None = None
    verdicts: tuple[Mapping[str, Any], ...] = ()
    events: tuple[str, ...] = ()  # what happened around the run: a reboot finished, a run interrupted
    pins: Mapping[str, str] = field(default_factory=dict)  # service -> commit it is held at
    steps: tuple[StepRecord, ...] = ()  # upgrade steps of this commit on this node
    suspended: Mapping[str, str] | None = None  # held back by a suspension: {reason, by, since}
    # Two control planes side by side: the node's release, mode and VIP attachment at this commit
    plane: Mapping[str, Any] | None = None
    # The commit trust root in force when the note was written: "node" (the node's own) or
    # "repo@<commit>" (rotated through the repo): what a node that lost its state dir recovers
    root: str = ""
    # On the commit the node runs: the branch was moved back to an older commit it had applied
    # and it refused to go there ({head, reason, time}); that commit's own verdict stays as it was
    refused: Mapping[str, str] | None = None
    # Services an operator held stopped (`reconciler stop`) when the note was written
    held: tuple[str, ...] = ()
    # The node's facts its render of this commit read (``core.model.facts``: ``Facts.to_dict``)
    facts: Mapping[str, Any] | None = None
