"""The data one pass carries from step to step, and what it returns.

``Run`` is what the steps of a pass share, filled in as they go (the commit, the verified
revision, the repo, the upgrade under way, the rollout's word); ``RunResult`` is what a pass did,
returned by the step that ends it: early (a stop, with its reason) or at the end.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from reconciler.core.model import Plan, Report, Verdict, VerifiedRevision
from reconciler.fleet import notes

if TYPE_CHECKING:
    from reconciler.core.errors import ReconcilerError
    from reconciler.fleet.rollout import FleetView
    from reconciler.ledger import Interrupted
    from reconciler.node.upgrader import Upgrader
    from reconciler.repo.definitions import DeploymentRepo


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class RunResult:
    """What one pass did. ``report`` is None when nothing changed and no note was needed."""

    node: str
    commit: str
    fetched: bool
    plan: Plan | None = None
    report: Report | None = None
    pushed: bool = True
    interrupted: tuple[Interrupted, ...] = ()
    error: ReconcilerError | None = None
    waiting: str = ""  # a rollout holds this node back: why
    skipped: str = ""  # the pass did nothing on purpose: why (failed here before, refused before)
    operation: str = ""  # an operator's rollback: its own outcome decides the exit code, not the head's
    suspended: str = ""  # a suspension held the pass back on purpose (exit 0): by whom, since, why

    @property
    def exit_code(self) -> int:
        if self.error is not None:
            return self.error.exit_code
        if self.operation or self.suspended:
            return 0
        if self.report is not None and self.report.state not in (Verdict.APPLIED, Verdict.REBOOTING, Verdict.STAGED,
                                                                 Verdict.WAITING):  # a barrier, a window: on purpose
            return 1  # failed here, or halted by a failure elsewhere
        return 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "commit": self.commit,
            "fetched": self.fetched,
            "plan": self.plan.to_dict() if self.plan else None,
            "report": notes.to_dict(self.report) if self.report else None,
            "note_pushed": self.pushed,
            "interrupted": [list(i) for i in self.interrupted],
            "error": {"reason": self.error.reason, "message": str(self.error)} if self.error else None,
            "waiting": self.waiting,
            "skipped": self.skipped,
            "suspended": self.suspended,
        }


@dataclass(frozen=True)
class Request:
    """What was asked of the pass: ``fetch`` the branch (or read the mirror), at ``rev`` (the
    head when None); ``instantiate``: an operator's `reconciler apply`, which also applies what
    ``apply: manual`` staged (``only``: just these services)."""

    fetch: bool = True
    rev: str | None = None
    only: frozenset[str] | None = None
    instantiate: bool = False


@dataclass(frozen=True)
class Run:
    """What the steps of one pass share, filled in as they go."""

    commit: str
    fetched: bool
    interrupted: tuple[Interrupted, ...]
    events: tuple[str, ...] = ()
    signer: Mapping[str, str] | None = None
    before: bool | None = None  # on the VIP networks after the last commit it settled (None: none yet)
    ask: Request = Request()
    verified: VerifiedRevision | None = None  # the commit the pass runs, once trust vouched for it
    repo: DeploymentRepo | None = None  # that commit's repo
    upgrader: Upgrader | None = None  # the commit's upgrades, as this node takes part in them
    fleet: FleetView | None = None  # the fleet's notes, read for the upgrade's barriers
    pending: str = ""  # a commit whose post steps wait on the fleet, as the pass found it
    result: RunResult | None = None  # the converged result, for the post steps to finish
