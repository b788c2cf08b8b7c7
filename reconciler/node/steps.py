"""One pass of the loop as named sub-steps: each returns what the next needs, or a ``Stop``.

    prepare  sweep a killed run's leftovers, check for room, finish notes a killed run owed
    source   the branch head (a ref check; a fetch only when it moved)
    resume   a reboot this node started: wait for it, or finish it
    noop     same commit, converged, every service running its slice: nothing at all (unless
             post_upgrade steps here wait on the fleet)
    trust    verified and forward, or refused (noted once per root)
    gate     a commit that failed here waits for `retry`; pins released when the branch moved;
             the repo loads; the rollout says go, wait or halted (an upgrade under way here is
             taken back when halted)
    upgrade  the commit's upgrade steps this node takes part in, each after its barrier
    converge render, observe, plan, apply (under the services lock), then settle the verdict
    post     deployment-wide post_upgrade steps, once the fleet applied the commit
    report   the ledger's record of the commit, as its note; pushed

Every verdict goes through ``Ledger.settle`` (the one table of allowed moves) and every note
is the ledger's projection, so what a note says is what the node remembers.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from reconciler.core.errors import BadInput, ReconcilerError
from reconciler.core.model import (
    Action,
    ActionKind,
    Desired,
    DesiredService,
    Plan,
    Report,
    ResultState,
    ServiceResult,
    Verdict,
    VerifiedRevision,
)
from reconciler.drivers import Driver
from reconciler.drivers.observe import observe
from reconciler.fleet.budget import DISRUPTIVE
from reconciler.ledger.ledger import ALLOWED, Interrupted, Proof, ServiceRecord
from reconciler.node import slots
from reconciler.node.apply import apply_plan, pull_images
from reconciler.plan.planner import hold_back, in_windows, stage
from reconciler.plan.planner import plan as make_plan
from reconciler.trust.verify import TrustError
from reconciler.upgrades.runner import Upgrader, owed

if TYPE_CHECKING:
    from reconciler.agent import Agent
    from reconciler.fleet.rollout import FleetView
    from reconciler.repo.load import DeploymentRepo

log = logging.getLogger("reconciler.agent")

# An action whose effect a killed run may or may not have had is done again: these are safe to repeat.
REDO = (ActionKind.RELOAD, ActionKind.RESTART, ActionKind.RECREATE, ActionKind.DRAIN_RESTART)


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
        from reconciler.fleet import notes

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
class Run:
    """What the sub-steps of one pass share."""

    commit: str
    fetched: bool
    interrupted: tuple[Interrupted, ...]
    events: tuple[str, ...] = ()
    signer: Mapping[str, str] | None = None
    before: bool | None = None  # on the VIP networks after the last commit it settled (None: none yet)


def reconcile(agent: Agent, *, fetch: bool, rev: str | None, only: set[str] | None,
              instantiate: bool) -> RunResult:
    with agent.state.lock(wait=30 if rev else 0):
        interrupted = prepare(agent)
        commit, fetched = agent.head(fetch, rev)
        run = Run(commit, fetched, interrupted)
        events: list[str] = [f"interrupted run: {i.action} {i.service} at {i.commit[:12]}" for i in interrupted]
        waiting = agent.resume_after_reboot(events)
        if waiting is not None:
            return RunResult(agent.cfg.node, waiting, fetched, pushed=agent.reporter.push())
        events += cutover_watch(agent, commit)
        if not interrupted and not events and only is None and unchanged(agent, commit):
            pending = agent.ledger.get_meta(POST_PENDING)
            if pending:  # this commit's post steps, or an earlier one's the branch moved past
                upgrader = Upgrader.of(agent, pending, agent.load(pending))
                return post_upgrade(agent, replace(run, commit=pending), upgrader,
                                    RunResult(agent.cfg.node, commit, fetched))
            slots.release(agent)  # a pass killed after its change settled, before it freed its slot
            return RunResult(agent.cfg.node, commit, fetched, pushed=agent.reporter.push())
        verified = verify(agent, run)
        if isinstance(verified, RunResult):
            return verified
        run = replace(run, signer=verified.signer, events=tuple(events))
        rec = agent.ledger.record(commit)
        if rec is not None and rec.verdict is Verdict.FAILED and not rec.retry and not interrupted:
            agent.say_once(("failed", commit), logging.WARNING,
                           "%s: %s failed here before; not retried until a new commit or `reconciler retry`",
                           agent.cfg.node, commit[:12])
            return RunResult(agent.cfg.node, commit, fetched, pushed=agent.reporter.push(),
                             skipped="failed here before: `reconciler retry` to try again")
        run = replace(run, events=run.events + tuple(release_pins(agent, commit)))
        try:
            repo = agent.load(commit)
            # the fleet's suspend is the head's word, even when an owed upgrade would run first
            head, head_repo = commit, repo
            debt = owed(agent, commit, repo)
            if debt.first:  # the head moved past an upgrade this node has not run: that commit first
                agent.say_once(("owed", commit, debt.first), logging.WARNING, "%s: %s is past the upgrade of %s, "
                               "which this node owes: %s first", agent.cfg.node, commit[:12], debt.first[:12],
                               debt.first[:12])
                verified = agent.keeper.vouch(agent.revision(debt.first))
                run = replace(run, commit=debt.first, events=run.events + (
                    f"head {commit[:12]} is past this upgrade, which this node owed: run first",))
                commit, repo = debt.first, agent.load(debt.first)
            run = replace(run, events=run.events + tuple(why for _, why in debt.kept.values()))
            upgrader = Upgrader.of(agent, commit, repo)
            run = replace(run, events=run.events + upgrader.held_events())
            fleet = agent.fleet_view() if upgrader.barriers else None
            run = replace(run, before=agent.ledger.was_attached())
            verdict = agent.rollout_gate(repo, commit, barriers=upgrader.barriers, fleet=fleet, before=run.before)
        except BadInput as exc:
            return stopped(agent, run, Verdict.ERROR, exc)
        # Read here, after trust: only a verified head's reconciler.yaml can suspend the fleet.
        suspension = suspended_by(agent, head_repo, head)
        if suspension is not None:
            return hold(agent, run, verified, repo, suspension)
        if not verdict.go:
            if not verdict.halted:
                agent.say_once(("waiting", commit, verdict.reason), logging.INFO, "%s: %s: %s",
                               agent.cfg.node, commit[:12], verdict.reason)
                pull_ahead(agent, verified, repo)
                return RunResult(agent.cfg.node, commit, fetched, pushed=agent.reporter.push(), waiting=verdict.reason)
            agent.say_once(("halted", commit), logging.ERROR, "%s: %s", agent.cfg.node, verdict.reason)
            undone = upgrader.undo(verdict.reason)
            report = Report(agent.cfg.node, commit, Verdict.HALTED, now_iso(), reason="HALTED", error=verdict.reason,
                            signer=run.signer, events=tuple(undone))
            return settle(agent, run, report, None)
        if fleet is not None and only is None:
            stop = upgrade(agent, run, upgrader, fleet)
            if stop is not None:
                return stop
        pending = agent.ledger.get_meta(POST_PENDING)
        if upgrader.fleet_upgrades and only is None and not pending:
            # Owed from here on: a run killed after the verdict (before the post steps) still runs them.
            agent.ledger.set_meta(POST_PENDING, commit)
        result = converge(agent, run, verified, repo=repo, only=only, instantiate=instantiate)
        if result.report is None or result.report.state is not Verdict.APPLIED:
            if agent.ledger.get_meta(POST_PENDING) == commit:
                agent.ledger.set_meta(POST_PENDING, "")  # not applied here: no post step is owed
            return result
        if pending and pending != commit:  # an earlier upgrade's post steps the branch moved past: first
            earlier = post_upgrade(agent, replace(run, commit=pending), Upgrader.of(agent, pending,
                                                                                   agent.load(pending)), result)
            if earlier.waiting or earlier.error:
                return earlier
            result = earlier
        if upgrader.fleet_upgrades:
            return post_upgrade(agent, run, upgrader, result)
        return result


def pull_ahead(agent: Agent, rev: VerifiedRevision, repo: DeploymentRepo) -> None:
    """While the node waits for an earlier wave: the images the commit will run here, pulled
    meanwhile, so its turn does not wait on the registry. Best effort, nothing else touched: a
    pull that fails is logged, not tried again until the node's turn, when the change pulls again
    (and fails on it with nothing stopped). Done once per commit per agent process."""
    if rev.commit in agent.pulled_ahead:
        return
    try:
        node = agent.cfg.node
        if not any(repo.driver_of(node, s) == "docker" for s in repo.services_of(node) if s in repo.services):
            agent.pulled_ahead.add(rev.commit)  # no container here: nothing to render for it
            return
        desired = agent.desired(rev, repo)
        pulled = pull_images(desired, agent.drivers(desired))
    except ReconcilerError as exc:  # the engine down, a render error: the node's turn says it
        agent.say_once(("pull-ahead", rev.commit, exc.reason), logging.WARNING, "%s: %s: images not pulled ahead: "
                       "%s [%s]", agent.cfg.node, rev.commit[:12], exc, exc.reason)
        agent.pulled_ahead.add(rev.commit)  # tried once: not a render and a registry call every waiting poll
        return
    for p in pulled:
        if p.result == "pulled":
            log.info("%s: %s: pulled %s ahead of this node's turn", agent.cfg.node, rev.commit[:12], p.image)
        elif p.result == "failed":
            agent.say_once(("pull-ahead", rev.commit, p.image), logging.WARNING, "%s: %s: %s", agent.cfg.node,
                           rev.commit[:12], p.detail)
    agent.pulled_ahead.add(rev.commit)  # once per commit, whatever came of it: its turn pulls again


def suspended_by(agent: Agent, repo: DeploymentRepo, commit: str) -> dict[str, str] | None:
    """The suspension in force: the operator's (`reconciler suspend`), else the verified head's
    ``suspend: true``, which is kept in the ledger so status and metrics read the same record."""
    settings = repo.settings
    if settings.get("suspend") is True:
        reason = str(settings.get("suspend_reason") or "suspended fleet-wide in reconciler.yaml")
        agent.ledger.suspend_from_repo({"reason": reason, "by": f"repo at {commit[:12]}", "since": now_iso()})
    else:
        agent.ledger.suspend_from_repo(None)
    return agent.ledger.suspension()


def hold(agent: Agent, run: Run, rev: VerifiedRevision, repo: DeploymentRepo,
         suspension: Mapping[str, str]) -> RunResult:
    """A suspended pass: render, observe and plan as usual, apply nothing. The head is noted
    waiting (SUSPENDED) with what the pass would do and the drift it leaves alone, so an operator
    reads from the note what `resume` will change."""
    node, commit = agent.cfg.node, run.commit
    why = f"suspended by {suspension.get('by', '?')} since {suspension.get('since', '?')}: " \
          f"{suspension.get('reason') or 'no reason given'}"
    try:
        desired = agent.desired(rev, repo)
        with agent.state.services_lock(wait=60):
            drivers = agent.drivers(desired)
            observed = observe(node, drivers)
            the_plan = make_plan(desired, observed)
    except BadInput as exc:
        return stopped(agent, run, Verdict.ERROR, exc)
    except ReconcilerError as exc:  # a runtime that cannot even be observed (engine down)
        return stopped(agent, run, Verdict.FAILED, exc)
    lines = [f"suspended: {o.name} drifted ({o.drifted}), not put back" for o in observed.services if o.drifted]
    lines += [f"suspended: would {a.kind} {a.service}" + (f" ({a.reason})" if a.reason else "")
              for a in the_plan.changes]
    agent.say_once(("suspended", commit, why), logging.WARNING, "%s: %s: %s; nothing applied", node, commit[:12], why)
    slots.release(agent)  # nothing disrupted while suspended: no slot kept from the others
    return held(agent, run, the_plan, "SUSPENDED", why, lines, suspension)


def held(agent: Agent, run: Run, the_plan: Plan, reason: str, why: str, lines: list[str],
         suspension: Mapping[str, str] | None = None) -> RunResult:
    """A pass that held changes back on purpose (SUSPENDED, WINDOW, BUDGET): the commit is noted
    waiting with ``why`` and ``lines`` (what it held back), or, when it settled here already
    (applied, failed), keeps its verdict and gets them as events, once per text. A pass that
    finds the same hold again and nothing new adds no run to the ledger."""
    node, commit = agent.cfg.node, run.commit
    before = agent.ledger.report(commit, node, now_iso())
    also = why if suspension is not None else ""  # RunResult.suspended: only a suspension says it
    if Verdict.WAITING not in ALLOWED[agent.ledger.verdict(commit)]:
        seen = set(before.events) if before is not None else set()
        for text in [why, *lines]:
            if text not in seen:
                agent.ledger.add_event(commit, text)
        write_note(agent, commit)
        return RunResult(node, commit, run.fetched, plan=the_plan, pushed=agent.reporter.push(), waiting=why,
                         suspended=also)
    seen = set(before.events) if before is not None and before.reason == reason else set()
    new_events = tuple(e for e in run.events + tuple(lines) if e not in seen)
    if before is not None and before.reason == reason and before.error == why and not new_events:
        write_note(agent, commit)
        return RunResult(node, commit, run.fetched, plan=the_plan, report=before, pushed=agent.reporter.push(),
                         waiting=why, suspended=also)
    report = Report(node, commit, Verdict.WAITING, now_iso(), reason=reason, error=why, plan_hash=the_plan.hash,
                    signer=run.signer, events=new_events, suspended=suspension)
    return replace(settle(agent, run, report, None), plan=the_plan, waiting=why, suspended=also)


def upgrade(agent: Agent, run: Run, upgrader: Upgrader, fleet: FleetView) -> RunResult | None:
    """This node's upgrade steps of the commit, each after its barrier: None once all are done
    (the pass goes on to converge), a waiting or failed result otherwise."""
    def note() -> None:
        write_note(agent, run.commit)
        agent.reporter.push()

    outcome = upgrader.run(fleet, note)
    node, commit = agent.cfg.node, run.commit
    if outcome.waiting:
        agent.say_once(("barrier", commit, outcome.waiting), logging.INFO, "%s: %s: %s", node, commit[:12],
                       outcome.waiting)
        if Verdict.WAITING in ALLOWED[agent.ledger.verdict(commit)]:
            report = Report(node, commit, Verdict.WAITING, now_iso(), reason="BARRIER", error=outcome.waiting,
                            signer=run.signer, events=run.events)
            return replace(settle(agent, run, report, None), waiting=outcome.waiting)
        write_note(agent, commit)
        return RunResult(node, commit, run.fetched, pushed=agent.reporter.push(), waiting=outcome.waiting)
    if outcome.failed:
        agent.say_once(("failed", commit, outcome.detail), logging.ERROR, "%s: %s failed at %s [UPGRADE_FAILED]",
                       node, commit[:12], agent.redact(outcome.detail))
        undone = upgrader.undo(outcome.detail)
        failed = ServiceResult(outcome.failed, ActionKind.NONE, ResultState.FAILED, "upgrade", detail=outcome.detail)
        report = Report(node, commit, Verdict.FAILED, now_iso(), services=(failed,), reason="UPGRADE_FAILED",
                        error=outcome.detail, signer=run.signer, events=run.events + tuple(undone))
        return settle(agent, run, report, None)
    return None


POST_PENDING = "post_upgrade_pending"  # meta: the commit whose post steps wait on the fleet


def post_upgrade(agent: Agent, run: Run, upgrader: Upgrader, result: RunResult) -> RunResult:
    """After the commit applied here: deployment-wide post steps that name this node, once every
    node that runs their services applied it too (a poll that finds nothing new checks again)."""
    def note() -> None:
        write_note(agent, run.commit)
        agent.reporter.push()

    waiting, failed = upgrader.post(agent.fleet_view(), note)
    if waiting:
        agent.ledger.set_meta(POST_PENDING, run.commit)
        agent.say_once(("post", run.commit, waiting), logging.INFO, "%s: %s", agent.cfg.node, waiting)
        return replace(result, waiting=waiting, pushed=agent.reporter.push())
    if agent.ledger.get_meta(POST_PENDING):
        agent.ledger.set_meta(POST_PENDING, "")
    if failed:
        agent.ledger.add_event(run.commit, failed)
        note()
        agent.say_once(("post-failed", run.commit), logging.ERROR, "%s: %s [POST_UPGRADE_FAILED]", agent.cfg.node,
                       failed)
        return replace(result, error=ReconcilerError(failed, reason="POST_UPGRADE_FAILED"))
    return replace(result, pushed=agent.reporter.push())


def prepare(agent: Agent) -> tuple[Interrupted, ...]:
    """Before anything else: leftovers swept, room checked, owed notes written."""
    # The supervisor writes records between passes (a revived service's): its temp file is not
    # a killed run's, so the sweep waits for it as a pass changing services would.
    with agent.state.services_lock(wait=30):
        swept = agent.state.sweep()
    for path in swept:
        log.warning("%s: removed %s, left half written by a killed run", agent.cfg.node, path)
    agent.state.check_space(int(agent.cfg.min_free_mb * 2**20))
    agent.reporter.recover()
    for commit in agent.ledger.unnoted():
        write_note(agent, commit)
    interrupted = tuple(agent.ledger.interrupted())
    for i in interrupted:
        log.warning("%s: a previous run was interrupted during %s %s at %s; doing it again",
                    agent.cfg.node, i.action, i.service, i.commit[:12])
    return interrupted


def unchanged(agent: Agent, commit: str) -> bool:
    """Cheap no-op check: this commit converged, and every service still runs that slice."""
    done = agent.ledger.converged()
    if done is None or done[0] != commit or agent.ledger.mark().commit != commit:
        return False
    rec = agent.ledger.record(commit)
    if rec is None or rec.verdict is not Verdict.APPLIED or not rec.noted:
        return False
    hashes = done[1]
    seen = observe(agent.cfg.node, agent.drivers(None)).by_name()
    if set(seen) != set(hashes):
        return False
    return all(o.running and not o.drifted and o.hash == hashes[n] for n, o in seen.items())


def verify(agent: Agent, run: Run) -> VerifiedRevision | RunResult:
    """The head, verified; a finished ``RunResult`` when it is refused."""
    rec = agent.ledger.record(run.commit)
    if rec is not None and rec.verdict is Verdict.REFUSED and rec.root_id == agent.keeper.root_id():
        # judged under this same root and noted already: no work, no new note
        exc = TrustError(rec.error, rec.reason)
        return RunResult(agent.cfg.node, run.commit, run.fetched, pushed=agent.reporter.push(), error=exc,
                         skipped="refused before under this trust root")
    try:
        return agent.keeper.verify(agent.revision(run.commit))
    except TrustError as exc:
        report = Report(agent.cfg.node, run.commit, Verdict.REFUSED, now_iso(), reason=exc.reason, error=str(exc),
                        verdicts=tuple(v.to_dict() for v in exc.verdicts if not v.ok))
        # KEY_NOT_YET_VALID may pass later: judged again on every poll (noted once all the same)
        root_id = "" if exc.reason == "KEY_NOT_YET_VALID" else agent.keeper.root_id()
        agent.say_once(("refused", run.commit, exc.reason), logging.ERROR, "%s: refused %s: %s [%s]",
                       agent.cfg.node, run.commit[:12], exc, exc.reason)
        earlier = agent.ledger.verdict(run.commit)
        if earlier is not None and Verdict.REFUSED not in ALLOWED[earlier]:
            # An old commit this node applied, replayed as the head: its own record stays what it
            # was (the fleet gate reads it); the refused move is an event on the node's mark.
            mark = agent.ledger.mark().commit
            text = f"refused head {run.commit[:12]}: {exc.reason}"
            if mark is not None and agent.ledger.last_event(mark) != text:
                agent.ledger.add_event(mark, text)
                write_note(agent, mark)
            return RunResult(agent.cfg.node, run.commit, run.fetched, report=report, pushed=agent.reporter.push(),
                             error=exc)
        result = settle(agent, run, report, None, root_id=root_id)
        return replace(result, error=exc)


def release_pins(agent: Agent, head: str) -> list[str]:
    """A pin holds until the branch moves past the commit it was made on (a fix, a revert)."""
    events = []
    for pin in agent.ledger.pins():
        if pin.head != head:
            agent.ledger.unpin(pin.service)
            events.append(f"pin of {pin.service} at {pin.commit[:12]} released: the branch moved to {head[:12]}")
    return events


def stopped(agent: Agent, run: Run, verdict: Verdict, exc: ReconcilerError) -> RunResult:
    """A run that stopped before applying anything: noted with the error's reason code."""
    agent.say_once(("stopped", run.commit, exc.reason), logging.ERROR, "%s: %s at %s: %s [%s]", agent.cfg.node,
                   verdict, run.commit[:12], exc, exc.reason)
    report = Report(agent.cfg.node, run.commit, verdict, now_iso(), reason=exc.reason, error=str(exc),
                    signer=run.signer, events=run.events)
    return replace(settle(agent, run, report, None), error=exc)


def converge(agent: Agent, run: Run, rev: VerifiedRevision, *, repo: DeploymentRepo | None = None,
             only: set[str] | None = None, instantiate: bool = False, operation: str = "") -> RunResult:
    """Render, observe, plan, apply and settle ``run.commit`` (``only``: these services).
    ``operation`` (a rollback): the services change, the commit's verdict does not."""
    try:
        desired = agent.desired(rev, repo)
    except BadInput as exc:
        if operation:
            raise
        return stopped(agent, run, Verdict.ERROR, exc)
    if only is not None:
        unknown = sorted(only - {s.name for s in desired.services})
        if unknown:
            raise BadInput(f"service {', '.join(unknown)} is not on node {agent.cfg.node} at {run.commit[:12]} "
                           f"(it runs: {', '.join(s.name for s in desired.services) or 'nothing'})",
                           reason="UNKNOWN_SERVICE")
    with agent.state.services_lock(wait=60):
        try:
            drivers = agent.drivers(desired)
            the_plan = make_plan(desired, observe(agent.cfg.node, drivers))
            the_plan = redo_interrupted(the_plan, run.interrupted)
            if not instantiate:
                the_plan = stage(the_plan)
                if not operation and repo is not None:  # an operator's own command is not held by windows
                    the_plan = in_windows(the_plan, repo.windows, agent.clock())
            if not operation and repo is not None and repo.budgets:  # nor by budgets, nor is a rollback
                why = slots.take(agent, repo, the_plan)
                if why is not None:
                    the_plan = hold_back(the_plan, DISRUPTIVE, why, "BUDGET")
            if only is not None:
                the_plan = Plan(the_plan.node, the_plan.commit, tuple(a for a in the_plan.actions if a.service in only))
        except ReconcilerError as exc:  # a runtime that cannot even be observed (engine down)
            if operation:
                raise
            return stopped(agent, run, Verdict.FAILED, exc)
        recheck = frozenset(i.service for i in run.interrupted if i.action is not ActionKind.STOP)
        before = {a.service: agent.ledger.service(a.service) for a in the_plan.changes}
        results = apply_plan(the_plan, drivers, agent.ledger, recheck, agent.redact)
        agent.ledger.clear_interrupted()  # done again above, or moot: only now
        failed = [r for r in results if r.state is ResultState.FAILED]
        attaching = repo is not None and repo.planes.attaches(agent.cfg.node, run.before)
        # A node that fails as it takes the VIPs over leaves them whole: the old plane takes them back.
        if failed and not operation and (attaching or _on_failure(agent, repo, run.commit) == "node"):
            run = replace(run, events=run.events + tuple(put_back(agent, run.commit, results, before, drivers)))
    if operation:
        return rolled_back(agent, run, the_plan, results, operation)
    reboots = any(r.action is ActionKind.REBOOT and r.state is ResultState.OK for r in results)
    waits = [a for a in the_plan.actions if a.waiting]
    if not reboots and not any(a.held_by == "BUDGET" for a in waits):
        slots.release(agent)  # this pass's disruption is over (a reboot keeps it until the node is back)
    if waits and not failed and not reboots:
        return held_for(agent, run, the_plan, results, waits)
    staged = any(a.staged for a in the_plan.actions)
    held_back = only is not None and any(a.kind is not ActionKind.NONE or a.sync
                                         for a in make_plan(desired, observe(agent.cfg.node, drivers)).actions)
    previous = agent.ledger.verdict(run.commit)
    proof: Proof | None = None
    if failed:
        verdict = Verdict.FAILED
    elif reboots:
        verdict = Verdict.REBOOTING
    elif staged or held_back:
        verdict = Verdict.FAILED if previous is Verdict.FAILED else Verdict.STAGED
    else:
        verdict, proof = Verdict.APPLIED, Proof.HEALTHY_RUN
    report = Report(
        agent.cfg.node, run.commit, verdict, now_iso(), services=tuple(results), plan_hash=the_plan.hash,
        signer=run.signer, reason="APPLY_FAILED" if failed else "", error=failed[0].detail if failed else "",
        events=run.events, plane=plane_of(agent.cfg.node, repo, run.before, bool(failed)),
    )
    if failed:
        detail = f"{failed[0].service}: {failed[0].detail}"
        output = next((r.detail.split(" | output: ", 1)[1] for r in agent.ledger.history(failed[0].service, 1)
                       if " | output: " in r.detail), "")
        agent.say_once(("failed", run.commit, detail), logging.ERROR, "%s: %s failed at %s: %s%s [APPLY_FAILED]",
                       agent.cfg.node, run.commit[:12], failed[0].service, failed[0].detail,
                       f" | last output: {output}" if output else "")
    hashes = {s.name: s.hash for s in desired.services} if verdict is Verdict.APPLIED else None
    result = settle(agent, run, report, proof, converged=hashes)
    return replace(result, plan=the_plan)


def plane_of(node: str, repo: DeploymentRepo | None, before: bool | None, failed: bool) -> dict[str, Any] | None:
    """What the note says of the node's place while two control planes run side by side (see
    ``controlplane``): release, mode, on the VIP networks or not, and, where it left them for a
    cutover, the nodes whose attach it watches (their failure puts it back on)."""
    if repo is None or not (repo.planes.active or repo.cutover_aborted):
        return None
    planes = repo.planes
    out = planes[node].to_dict()
    if failed and planes.attaches(node, before):
        out["vip"] = "detached"  # put back where it was
    taking_over = planes.cutover(node) if planes.detaches(node, before) else ()
    if repo.cutover_aborted:
        out["aborted"] = True
    elif taking_over:
        out["watch"] = list(taking_over)
    return out


def cutover_watch(agent: Agent, commit: str) -> list[str]:
    """This node left the VIP networks at ``commit`` for a cutover: while the nodes taking them
    over have not all noted it applied, read their notes; one that failed it aborts the cutover
    here (the next render of ``commit`` puts this node back on them). Returns what the note says."""
    plane = agent.ledger.plane(commit)
    if not plane or not plane.get("watch") or plane.get("aborted"):
        return []
    watched = [str(n) for n in plane["watch"]]
    try:
        fleet = agent.fleet_view(watched)
    except ReconcilerError as exc:  # the remote is away: look again next poll
        agent.say_once(("cutover-watch", commit, exc.reason), logging.WARNING, "%s: %s: cannot read the notes of "
                       "%s: %s", agent.cfg.node, commit[:12], ", ".join(watched), exc)
        return []
    failed = next((note for n in watched if (note := fleet.note(n, commit)) is not None and note.state == "failed"),
                  None)
    if failed is not None:
        why = f"cutover aborted: {failed.node} failed {commit[:12]}" + (f" ({failed.error})" if failed.error else "")
        agent.ledger.replan(commit, {**{k: v for k, v in plane.items() if k != "watch"}, "aborted": True})
        log.error("%s: %s: back onto the VIP networks", agent.cfg.node, why)
        return [f"{why}: back onto the VIP networks"]
    if all(fleet.reached(n, commit) is not None for n in watched):
        agent.ledger.replan(commit, {k: v for k, v in plane.items() if k != "watch"})
        write_note(agent, commit)
    return []


def held_for(agent: Agent, run: Run, the_plan: Plan, results: list[ServiceResult], waits: list[Action]) -> RunResult:
    """Changes a closed maintenance window or a disruption budget holds back: what could go
    went; the commit is noted waiting (WINDOW: with the window's next opening; BUDGET: with the
    nodes whose slots it waits for), so the rollout waits for this node and a later poll
    finishes it."""
    why = f"{waits[0].service}: {waits[0].waiting}" + (f" (and {len(waits) - 1} more)" if len(waits) > 1 else "")
    lines = [f"{a.service}: {a.waiting}" for a in waits]
    lines += [f"{r.service}: {r.action} {r.state}" + (f" ({r.detail})" if r.detail else "")
              for r in results if r.action is not ActionKind.NONE]
    agent.say_once(("held", run.commit, why), logging.INFO, "%s: %s: %s", agent.cfg.node, run.commit[:12], why)
    return held(agent, run, the_plan, waits[0].held_by, why, lines)


def _on_failure(agent: Agent, repo: DeploymentRepo | None, commit: str) -> str:
    settings = (repo or agent.load(commit)).settings
    return str(settings.get("on_failure", "service"))


def put_back(agent: Agent, commit: str, results: list[ServiceResult], before: Mapping[str, ServiceRecord | None],
             drivers: Mapping[str, Driver]) -> list[str]:
    """``on_failure: node``: every service this run changed goes back to the version it ran
    before (a service it started is stopped again). Returns what the note says about it."""
    from reconciler.render.node import render_node

    changed = [r for r in results if r.state is ResultState.OK and r.action is not ActionKind.NONE]
    if not changed:
        return []
    events: list[str] = []
    old: list[DesiredService] = []
    for r in changed:
        rec = before.get(r.service)
        version = rec.running if rec is not None else None
        if version is None:
            for driver in drivers.values():
                if any(o.name == r.service for o in driver.observe()):
                    driver.remove(r.service)
            agent.ledger.removed(r.service)
            events.append(f"on_failure node: {r.service} stopped (it was new in this run)")
            continue
        try:
            svc = render_node(agent.load(version.commit), agent.cfg.node, version.commit).by_name().get(r.service)
        except ReconcilerError as exc:
            events.append(f"on_failure node: {r.service} not put back: {exc}")
            continue
        if svc is None:
            continue
        old.append(replace(svc, origin=version.commit))
    if old:
        names = {s.name for s in old}
        back = make_plan(Desired(agent.cfg.node, commit, tuple(old)), observe(agent.cfg.node, drivers))
        back = Plan(back.node, commit, tuple(a for a in back.actions if a.service in names))
        for r in apply_plan(back, drivers, agent.ledger, redact=agent.redact):
            origin = next(s.origin for s in old if s.name == r.service)
            events.append(f"on_failure node: {r.service} put back to {origin[:12]} ({r.action} {r.state})"
                          + (f": {r.detail}" if r.detail else ""))
    for e in events:
        log.warning("%s: %s", agent.cfg.node, e)
    return events


def redo_interrupted(the_plan: Plan, interrupted: tuple[Interrupted, ...]) -> Plan:
    """A killed run's action may have left its record ahead of its effect (files and record say
    reloaded, the program never got the signal): when the plan now sees nothing to do for that
    service, the action is done again. Every action on the ladder is safe to repeat."""
    redo = {i.service: i.action for i in interrupted if i.action in REDO and i.commit == the_plan.commit}
    if not redo:
        return the_plan
    actions = []
    for a in the_plan.actions:
        kind = redo.get(a.service)
        if kind is not None and a.kind is ActionKind.NONE and a.desired is not None:
            a = Action(kind, a.service, f"{kind}: a killed run was doing it; done again", a.desired, a.driver)
        actions.append(a)
    return Plan(the_plan.node, the_plan.commit, tuple(actions))


def rolled_back(agent: Agent, run: Run, the_plan: Plan, results: list[ServiceResult], what: str) -> RunResult:
    """An operator's rollback: events (and the pin) on the head's record; its verdict stays."""
    for r in results:
        agent.ledger.add_event(run.commit, f"{what}: {r.service} {r.action} {r.state}"
                               + (f": {r.detail}" if r.detail else ""))
    write_note(agent, run.commit)
    report = agent.ledger.report(run.commit, agent.cfg.node, now_iso())
    failed = [r for r in results if r.state is ResultState.FAILED]
    shown = replace(report, services=tuple(results)) if report is not None else Report(
        agent.cfg.node, run.commit, Verdict.FAILED if failed else Verdict.APPLIED, now_iso(), services=tuple(results))
    error = ReconcilerError(f"{what} failed: {failed[0].detail}", reason="APPLY_FAILED") if failed else None
    return RunResult(agent.cfg.node, run.commit, False, plan=the_plan, report=shown, pushed=agent.reporter.push(),
                     error=error, operation=what)


def settle(agent: Agent, run: Run, report: Report, proof: Proof | None, root_id: str = "",
           converged: Mapping[str, str] | None = None) -> RunResult:
    """The verdict into the ledger (one transaction), then the note written and pushed. What the
    report says (a step's output, a service's) is cleaned of secret values first: the ledger
    keeps it, and the command line shows it."""
    report = agent.redact.report(report)
    agent.ledger.settle(report, proof=proof, root_id=root_id, converged=converged)
    write_note(agent, report.commit)
    return RunResult(agent.cfg.node, report.commit, run.fetched, report=report, pushed=agent.reporter.push(),
                     interrupted=run.interrupted)


def write_note(agent: Agent, commit: str) -> None:
    """The note of ``commit`` is the ledger's record of it; written unless it already says that."""
    report = agent.ledger.report(commit, agent.cfg.node, now_iso())
    if report is None:
        return
    from reconciler.fleet import notes

    previous = agent.reporter.read(commit)
    if previous is None or {k: v for k, v in previous.items() if k != "time"} != \
            {k: v for k, v in notes.to_dict(report).items() if k != "time"}:
        agent.reporter.write(report)
    agent.ledger.noted(commit)

