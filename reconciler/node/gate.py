"""The gate of a pass: what must hold before a commit changes anything on this node.

``trust``: the head verified and forward (a refusal noted once per trust root). ``gate``: a
commit that failed here waits for `retry`; pins are released once the branch moved on; the repo
loads; an upgrade this node owes runs first; a suspension (the operator's, or the verified
head's) holds everything; the rollout says go, wait for the wave or barrier before (images
pulled meanwhile), or halted by a failure elsewhere (an upgrade under way here taken back).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from reconciler.core.errors import BadInput, ReconcilerError
from reconciler.core.model import Report, Verdict, VerifiedRevision
from reconciler.drivers.kinds import prefetches
from reconciler.drivers.observe import observe
from reconciler.node import peers
from reconciler.node.apply import pull_images
from reconciler.node.converge import unknown_services
from reconciler.node.peers import fleet_view, rollout_gate
from reconciler.node.run import Run, RunResult, now_iso
from reconciler.node.settle import held, settle, stopped, write_note
from reconciler.node.upgrader import Upgrader
from reconciler.trust.root import TrustError

if TYPE_CHECKING:
    from reconciler.node.context import NodeContext
    from reconciler.repo.definitions import DeploymentRepo

log = logging.getLogger("reconciler.agent")


def trust(ctx: NodeContext, run: Run) -> Run | RunResult:
    verified = verify(ctx, run)
    if isinstance(verified, RunResult):
        return verified
    return replace(run, verified=verified, signer=verified.signer)


def verify(ctx: NodeContext, run: Run) -> VerifiedRevision | RunResult:
    """The head, verified; a finished ``RunResult`` when it is refused."""
    rec = ctx.ledger.record(run.commit)
    if rec is not None and rec.verdict is Verdict.REFUSED and rec.root_id == ctx.keeper.root_id():
        # judged under this same root and noted already: no work, no new note
        exc = TrustError(rec.error, rec.reason)
        return RunResult(ctx.node, run.commit, run.fetched, pushed=ctx.reporter.push(), error=exc,
                         skipped="refused before under this trust root")
    try:
        return ctx.keeper.verify(ctx.resolver.revision(run.commit))
    except TrustError as exc:
        report = Report(ctx.node, run.commit, Verdict.REFUSED, now_iso(), reason=exc.reason, error=str(exc),
                        verdicts=tuple(v.to_dict() for v in exc.verdicts if not v.ok))
        # KEY_NOT_YET_VALID may pass later: judged again on every poll (noted once all the same)
        root_id = "" if exc.reason == "KEY_NOT_YET_VALID" else ctx.keeper.root_id()
        ctx.say_once(("refused", run.commit, exc.reason), logging.ERROR, "%s: refused %s: %s [%s]",
                       ctx.node, run.commit[:12], exc, exc.reason)
        if not ctx.ledger.may_become(run.commit, Verdict.REFUSED):
            # An old commit this node applied, replayed as the head: its own record stays what it
            # was (the fleet gate reads it; after a lost state dir, as its note says), and the
            # refused move is an event on the node's mark and a run `status` shows.
            mark = ctx.ledger.mark().commit
            text = f"refused head {run.commit[:12]}: {exc.reason}"
            # Judged done by the field, written after the event: a pass killed between the two
            # leaves the next one to write the field (the event is not said twice).
            if mark is not None and not ctx.ledger.refused_rewind_to(mark, run.commit, exc.reason):
                if ctx.ledger.last_event(mark) != text:
                    ctx.ledger.add_event(mark, text)
                # and as a field of that note, which the fleet view reads at the head it refused
                ctx.ledger.set_rewind_refused(mark, run.commit, exc.reason, now_iso())
                ctx.ledger.count_run(run.commit, Verdict.REFUSED, exc.reason)
                write_note(ctx, mark)
            return RunResult(ctx.node, run.commit, run.fetched, report=report, pushed=ctx.reporter.push(),
                             error=exc)
        result = settle(ctx, run, report, None, root_id=root_id)
        return replace(result, error=exc)


def gate(ctx: NodeContext, run: Run) -> Run | RunResult:
    commit, verified = run.commit, run.verified
    assert verified is not None  # ``trust`` ran
    if run.ask.only is not None:
        only_known(ctx, commit, run.ask.only)
    rec = ctx.ledger.record(commit)
    if rec is not None and rec.verdict is Verdict.FAILED and not rec.retry and not run.interrupted:
        ctx.say_once(("failed", commit), logging.WARNING,
                     "%s: %s failed here before; not retried until a new commit or `reconciler retry`",
                     ctx.node, commit[:12])
        return RunResult(ctx.node, commit, run.fetched, pushed=ctx.reporter.push(),
                         skipped="failed here before: `reconciler retry` to try again")
    run = replace(run, events=run.events + tuple(release_pins(ctx, commit)))
    try:
        repo = ctx.resolver.load(commit)
        # the fleet's suspend is the head's word, even when an owed upgrade would run first
        head, head_repo = commit, repo
        debt = ctx.resolver.owed(commit, repo)
        if debt.first:  # the head moved past an upgrade this node has not run: that commit first
            ctx.say_once(("owed", commit, debt.first), logging.WARNING, "%s: %s is past the upgrade of %s, "
                         "which this node owes: %s first", ctx.node, commit[:12], debt.first[:12], debt.first[:12])
            verified = ctx.keeper.vouch(ctx.resolver.revision(debt.first))
            run = replace(run, commit=debt.first, events=run.events + (
                f"head {commit[:12]} is past this upgrade, which this node owed: run first",))
            commit, repo = debt.first, ctx.resolver.load(debt.first)
        run = replace(run, events=run.events + tuple(why for _, why in debt.kept.values()))
        upgrader = Upgrader.of(ctx, commit, repo)
        run = replace(run, events=run.events + upgrader.held_events())
        fleet = fleet_view(ctx) if upgrader.barriers else None
        run = replace(run, before=ctx.ledger.was_attached())
        verdict = rollout_gate(ctx, repo, commit, barriers=upgrader.barriers, fleet=fleet, before=run.before)
    except BadInput as exc:
        return stopped(ctx, run, Verdict.ERROR, exc)
    run = replace(run, verified=verified, repo=repo, upgrader=upgrader, fleet=fleet)
    # Read here, after trust: only a verified head's reconciler.yaml can suspend the fleet.
    suspension = suspended_by(ctx, head_repo, head)
    if suspension is not None:
        return hold(ctx, run, verified, repo, suspension)
    if verdict.go:
        return run
    if not verdict.halted:
        ctx.say_once(("waiting", commit, verdict.reason), logging.INFO, "%s: %s: %s", ctx.node, commit[:12],
                     verdict.reason)
        pull_ahead(ctx, verified, repo)
        return RunResult(ctx.node, commit, run.fetched, pushed=ctx.reporter.push(), waiting=verdict.reason)
    ctx.say_once(("halted", commit), logging.ERROR, "%s: %s", ctx.node, verdict.reason)
    undone = upgrader.undo(verdict.reason)
    report = Report(ctx.node, commit, Verdict.HALTED, now_iso(), reason="HALTED", error=verdict.reason,
                    signer=run.signer, events=tuple(undone))
    return settle(ctx, run, report, None)


def only_known(ctx: NodeContext, commit: str, only: frozenset[str]) -> None:
    """``apply --service`` of a service this node does not run at ``commit`` is the operator's
    mistake, said (exit 2) before any answer of the gate's (failed here before, suspended,
    waiting, halted) could read as "nothing to do". A repo that does not load is left to the
    pass, which says so where it always does."""
    try:
        runs = ctx.resolver.load(commit).services_of(ctx.node)
    except BadInput:
        return
    unknown_services(ctx.node, commit, runs, only, ctx.ledger.held_stopped())


def release_pins(ctx: NodeContext, head: str) -> list[str]:
    """A pin holds until the branch moves past the commit it was made on (a fix, a revert)."""
    events = []
    for pin in ctx.ledger.pins():
        if pin.head != head:
            ctx.ledger.unpin(pin.service)
            events.append(f"pin of {pin.service} at {pin.commit[:12]} released: the branch moved to {head[:12]}")
    return events


def suspended_by(ctx: NodeContext, repo: DeploymentRepo, commit: str) -> dict[str, str] | None:
    """The suspension in force: the operator's (`reconciler suspend`), else the verified head's
    ``suspend: true``, which is kept in the ledger so status and metrics read the same record."""
    settings = repo.settings
    if settings.get("suspend") is True:
        reason = str(settings.get("suspend_reason") or "suspended fleet-wide in reconciler.yaml")
        ctx.ledger.suspend_from_repo({"reason": reason, "by": f"repo at {commit[:12]}", "since": now_iso()})
    else:
        ctx.ledger.suspend_from_repo(None)
    return ctx.ledger.suspension()


def hold(ctx: NodeContext, run: Run, rev: VerifiedRevision, repo: DeploymentRepo,
         suspension: Mapping[str, str]) -> RunResult:
    """A suspended pass: render, observe and plan as usual, apply nothing. The head is noted
    waiting (SUSPENDED) with what the pass would do and the drift it leaves alone, so an operator
    reads from the note what `resume` will change."""
    node, commit = ctx.node, run.commit
    why = f"suspended by {suspension.get('by', '?')} since {suspension.get('since', '?')}: " \
          f"{suspension.get('reason') or 'no reason given'}"
    try:
        desired = ctx.resolver.desired(rev, repo)
        with ctx.state.services_lock(wait=60):
            drivers = ctx.drivers(desired)
            observed = observe(node, drivers)
            the_plan = ctx.plan(desired, observed)
    except BadInput as exc:
        return stopped(ctx, run, Verdict.ERROR, exc)
    except ReconcilerError as exc:  # a runtime that cannot even be observed (engine down)
        return stopped(ctx, run, Verdict.FAILED, exc)
    lines = [f"suspended: {o.name} drifted ({o.drifted}), not put back" for o in observed.services if o.drifted]
    lines += [f"suspended: would {a.kind} {a.service}" + (f" ({a.reason})" if a.reason else "")
              for a in the_plan.changes]
    ctx.say_once(("suspended", commit, why), logging.WARNING, "%s: %s: %s; nothing applied", node, commit[:12], why)
    peers.release(ctx)  # nothing disrupted while suspended: no slot kept from the others
    return held(ctx, run, the_plan, "SUSPENDED", why, lines, suspension)


def pull_ahead(ctx: NodeContext, rev: VerifiedRevision, repo: DeploymentRepo) -> None:
    """While the node waits for an earlier wave: the images the commit will run here, pulled
    meanwhile, so its turn does not wait on the registry. Best effort, nothing else touched: a
    pull that fails is logged, not tried again until the node's turn, when the change pulls again
    (and fails on it with nothing stopped). Done once per commit per agent process."""
    if rev.commit in ctx.memory.pulled_ahead:
        return
    try:
        node = ctx.node
        if not any(prefetches(repo.driver_of(node, s)) for s in repo.services_of(node) if s in repo.services):
            ctx.memory.pulled_ahead.add(rev.commit)  # no container here: nothing to render for it
            return
        desired = ctx.resolver.desired(rev, repo)
        pulled = pull_images(desired, ctx.drivers(desired))
    except ReconcilerError as exc:  # the engine down, a render error: the node's turn says it
        ctx.say_once(("pull-ahead", rev.commit, exc.reason), logging.WARNING, "%s: %s: images not pulled ahead: "
                       "%s [%s]", ctx.node, rev.commit[:12], exc, exc.reason)
        ctx.memory.pulled_ahead.add(rev.commit)  # tried once: not a render and a registry call every waiting poll
        return
    for p in pulled:
        if p.result == "pulled":
            log.info("%s: %s: pulled %s ahead of this node's turn", ctx.node, rev.commit[:12], p.image)
        elif p.result == "failed":
            ctx.say_once(("pull-ahead", rev.commit, p.image), logging.WARNING, "%s: %s: %s", ctx.node,
                           rev.commit[:12], p.detail)
    ctx.memory.pulled_ahead.add(rev.commit)  # once per commit, whatever came of it: its turn pulls again
