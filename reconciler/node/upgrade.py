"""The upgrade steps of a pass: this node's steps of the commit's upgrades, each after its
barrier (``node.upgrader``), before the commit converges; and after it applied, the
deployment-wide post steps (``node.poststeps``) once the fleet applied it too. A commit whose
post steps wait on the fleet is kept in the ledger: a poll that finds nothing new looks again,
and a run killed after the verdict still runs them.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from reconciler.core.errors import ReconcilerError
from reconciler.core.model import ActionKind, Report, ResultState, ServiceResult, Verdict
from reconciler.node.peers import fleet_view, watch
from reconciler.node.poststeps import post
from reconciler.node.run import Run, RunResult, now_iso
from reconciler.node.settle import settle, write_note
from reconciler.node.upgrader import Upgrader

if TYPE_CHECKING:
    from reconciler.fleet.rollout import FleetView
    from reconciler.node.context import NodeContext

log = logging.getLogger("reconciler.agent")


def upgrade_step(ctx: NodeContext, run: Run) -> Run | RunResult:
    upgrader = run.upgrader
    assert upgrader is not None  # ``gate`` ran
    if run.fleet is not None and run.ask.only is None:
        stop = upgrade(ctx, run, upgrader, run.fleet)
        if stop is not None:
            return stop
    pending = ctx.ledger.post_pending()
    if upgrader.fleet_upgrades and run.ask.only is None and not pending:
        # Owed from here on: a run killed after the verdict (before the post steps) still runs them.
        ctx.ledger.set_post_pending(run.commit)
    return replace(run, pending=pending or "")


def post_step(ctx: NodeContext, run: Run) -> RunResult:
    assert run.result is not None and run.upgrader is not None  # ``converge`` applied it
    result, pending = run.result, run.pending
    if pending and pending != run.commit:  # an earlier upgrade's post steps the branch moved past: first
        earlier = post_upgrade(ctx, replace(run, commit=pending), Upgrader.of(ctx, pending,
                                                                             ctx.resolver.load(pending)), result)
        if earlier.waiting or earlier.error:
            return earlier
        result = earlier
    if run.upgrader.fleet_upgrades:
        return post_upgrade(ctx, run, run.upgrader, result)
    return result


def upgrade(ctx: NodeContext, run: Run, upgrader: Upgrader, fleet: FleetView) -> RunResult | None:
    """This node's upgrade steps of the commit, each after its barrier: None once all are done
    (the pass goes on to converge), a waiting or failed result otherwise."""
    def note() -> None:
        write_note(ctx, run.commit)
        ctx.reporter.push()

    outcome = upgrader.run(fleet, note)
    node, commit = ctx.node, run.commit
    if outcome.waiting:
        # The daemon wait-polls those it waits for: the step starts within a wait-poll of the
        # last one's note, not at the next poll.
        watch(ctx, outcome.waiting_for)
        ctx.say_once(("barrier", commit, outcome.waiting), logging.INFO, "%s: %s: %s", node, commit[:12],
                       outcome.waiting)
        if ctx.ledger.may_become(commit, Verdict.WAITING):
            report = Report(node, commit, Verdict.WAITING, now_iso(), reason="BARRIER", error=outcome.waiting,
                            signer=run.signer, events=run.events)
            return replace(settle(ctx, run, report, None), waiting=outcome.waiting)
        write_note(ctx, commit)
        return RunResult(node, commit, run.fetched, pushed=ctx.reporter.push(), waiting=outcome.waiting)
    if outcome.failed:
        ctx.say_once(("failed", commit, outcome.detail), logging.ERROR, "%s: %s failed at %s [UPGRADE_FAILED]",
                       node, commit[:12], ctx.redact(outcome.detail))
        undone = upgrader.undo(outcome.detail)
        failed = ServiceResult(outcome.failed, ActionKind.NONE, ResultState.FAILED, "upgrade", detail=outcome.detail)
        report = Report(node, commit, Verdict.FAILED, now_iso(), services=(failed,), reason="UPGRADE_FAILED",
                        error=outcome.detail, signer=run.signer, events=run.events + tuple(undone))
        return settle(ctx, run, report, None)
    return None


def post_upgrade(ctx: NodeContext, run: Run, upgrader: Upgrader, result: RunResult) -> RunResult:
    """After the commit applied here: deployment-wide post steps that name this node, once every
    node that runs their services applied it too (a poll that finds nothing new checks again)."""
    def note() -> None:
        write_note(ctx, run.commit)
        ctx.reporter.push()

    posted = post(upgrader, fleet_view(ctx), note)
    waiting, failed = posted.waiting, posted.failed
    if waiting:
        # As at a barrier: the daemon wait-polls a few of those it waits for, so the step runs
        # (or its reboot turn comes) within a wait-poll of the last one's note, not at a poll.
        watch(ctx, posted.waiting_for)
        ctx.ledger.set_post_pending(run.commit)
        ctx.say_once(("post", run.commit, waiting), logging.INFO, "%s: %s", ctx.node, waiting)
        return replace(result, waiting=waiting, pushed=ctx.reporter.push())
    if ctx.ledger.post_pending():
        ctx.ledger.set_post_pending("")
    if failed:
        ctx.ledger.add_event(run.commit, failed)
        note()
        ctx.say_once(("post-failed", run.commit), logging.ERROR, "%s: %s [POST_UPGRADE_FAILED]", ctx.node,
                       failed)
        return replace(result, error=ReconcilerError(failed, reason="POST_UPGRADE_FAILED"))
    return replace(result, pushed=ctx.reporter.push())
