"""The converge step: render, observe, plan, apply (under the services lock), then settle the
verdict. Windows and budgets hold disruptive changes back (an operator's own command is held by
neither); a failure under ``on_failure: node`` (or while taking the VIPs over) puts every service
the pass changed back to the version it ran before; under ``on_failure: service`` a failed
service its driver did not put back (a killed run had moved its record on) goes back alone. An
action a killed run was doing is done again: every action on the ladder is safe to repeat.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import replace
from typing import TYPE_CHECKING

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
from reconciler.drivers.observe import observe
from reconciler.fleet.budget import DISRUPTIVE
from reconciler.ledger import Interrupted, Proof, ServiceRecord, Version
from reconciler.node import peers
from reconciler.node.apply import apply_plan
from reconciler.node.desired import leaving
from reconciler.node.peers import plane_of
from reconciler.node.run import Run, RunResult, now_iso
from reconciler.node.settle import held_for, settle, stopped, write_note
from reconciler.plan.planner import hold_back, in_windows, stage
from reconciler.plan.planner import plan as make_plan

if TYPE_CHECKING:
    from reconciler.drivers import Driver
    from reconciler.node.context import NodeContext
    from reconciler.repo.definitions import DeploymentRepo

log = logging.getLogger("reconciler.agent")

REDO = (ActionKind.RELOAD, ActionKind.RESTART, ActionKind.RECREATE, ActionKind.DRAIN_RESTART)
NOT_RUNNING = ("stop", "revive", "none")  # history rows that say nothing of the version running


def converge_step(ctx: NodeContext, run: Run) -> Run | RunResult:
    assert run.verified is not None  # ``trust`` ran
    result = converge(ctx, run, run.verified, repo=run.repo, only=run.ask.only, instantiate=run.ask.instantiate)
    if result.report is None or result.report.state is not Verdict.APPLIED:
        if ctx.ledger.post_pending() == run.commit:
            ctx.ledger.set_post_pending("")  # not applied here: no post step is owed
        return result
    return replace(run, result=result)


def unknown_services(node: str, commit: str, runs: Iterable[str], only: AbstractSet[str],
                     held: Mapping[str, Mapping[str, str]] | None = None) -> None:
    """``apply --service`` names a service ``node`` does not run at ``commit`` (``runs``):
    ``BadInput`` UNKNOWN_SERVICE, exit 2; or one `reconciler stop` holds (``held``): HELD_STOPPED."""
    refuse_held(node, held or {}, only)
    names = sorted(runs)
    unknown = sorted(only - set(names))
    if unknown:
        raise BadInput(f"service {', '.join(unknown)} is not on node {node} at {commit[:12]} "
                       f"(it runs: {', '.join(names) or 'nothing'})", reason="UNKNOWN_SERVICE")


def refuse_held(node: str, held: Mapping[str, Mapping[str, str]], names: Iterable[str]) -> None:
    """An operator's command on a service `reconciler stop` holds: said, with how to lift it."""
    hit = sorted(n for n in set(names) if n in held)
    if hit:
        h = held[hit[0]]
        raise BadInput(f"service {', '.join(hit)} is held stopped on node {node} by {h.get('by', '?')} since "
                       f"{h.get('since', '?')} (reconciler stop): `reconciler start {' '.join(hit)}` lifts the hold",
                       reason="HELD_STOPPED")


def converge(ctx: NodeContext, run: Run, rev: VerifiedRevision, *, repo: DeploymentRepo | None = None,
             only: AbstractSet[str] | None = None, instantiate: bool = False, operation: str = "") -> RunResult:
    """Render, observe, plan, apply and settle ``run.commit`` (``only``: these services).
    ``operation`` (a rollback): the services change, the commit's verdict does not."""
    try:
        desired = ctx.resolver.desired(rev, repo)
    except BadInput as exc:
        if operation:
            raise
        return stopped(ctx, run, Verdict.ERROR, exc)
    if only is not None:  # checked at the gate already; a rollback's service comes here first
        unknown_services(ctx.node, run.commit, [s.name for s in desired.services], only, ctx.ledger.held_stopped())
    with ctx.state.services_lock(wait=60):
        try:
            drivers = ctx.drivers(desired)
            the_plan = ctx.plan(desired, observe(ctx.node, drivers))
            the_plan = redo_interrupted(the_plan, run.interrupted)
            if not instantiate:
                the_plan = stage(the_plan)
                if not operation and repo is not None:  # an operator's own command is not held by windows
                    the_plan = in_windows(the_plan, repo.windows, ctx.clock())
            if not operation and repo is not None and repo.budgets:  # nor by budgets, nor is a rollback
                why = peers.take(ctx, repo, the_plan)
                if why is not None:
                    the_plan = hold_back(the_plan, DISRUPTIVE, why, "BUDGET")
            if only is not None:
                the_plan = Plan(the_plan.node, the_plan.commit, tuple(a for a in the_plan.actions if a.service in only))
        except ReconcilerError as exc:  # a runtime that cannot even be observed (engine down)
            if operation:
                raise
            return stopped(ctx, run, Verdict.FAILED, exc)
        recheck = frozenset(i.service for i in run.interrupted if i.action is not ActionKind.STOP)
        before = {a.service: ran_before(ctx, a.service, run.commit) for a in the_plan.actions}
        results = apply_plan(the_plan, drivers, ctx.ledger, recheck, ctx.redact, ctx.settings.max_parallel)
        ctx.ledger.clear_interrupted()  # done again above, or moot: only now
        failed = [r for r in results if r.state is ResultState.FAILED]
        attaching = repo is not None and ctx.node in repo.nodes and repo.planes.attaches(ctx.node, run.before)
        # A node that fails as it takes the VIPs over leaves them whole: the old plane takes them back.
        if failed and not operation and (attaching or _on_failure(ctx, repo, run.commit) == "node"):
            run = replace(run, events=run.events + tuple(put_back(ctx, run.commit, results, before, drivers)))
        elif failed and not operation:
            run = replace(run, events=run.events + tuple(keep_back(ctx, run.commit, failed, before, drivers)))
    if operation:
        return rolled_back(ctx, run, the_plan, results, operation)
    reboots = any(r.action is ActionKind.REBOOT and r.state is ResultState.OK for r in results)
    waits = [a for a in the_plan.actions if a.waiting]
    if not reboots and not any(a.held_by == "BUDGET" for a in waits):
        peers.release(ctx)  # this pass's disruption is over (a reboot keeps it until the node is back)
    if waits and not failed and not reboots:
        return held_for(ctx, run, the_plan, results, waits)
    staged = any(a.staged for a in the_plan.actions)
    held_back = only is not None and any(a.kind is not ActionKind.NONE or a.sync
                                         for a in make_plan(desired, observe(ctx.node, drivers)).actions)
    previous = ctx.ledger.verdict(run.commit)
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
        ctx.node, run.commit, verdict, now_iso(), services=tuple(results), plan_hash=the_plan.hash,
        signer=run.signer, reason="APPLY_FAILED" if failed else "", error=failed[0].detail if failed else "",
        events=run.events, plane=plane_of(ctx.node, repo, run.before, bool(failed)),
    )
    if failed:
        detail = f"{failed[0].service}: {failed[0].detail}"
        output = next((r.detail.split(" | output: ", 1)[1] for r in ctx.ledger.history(failed[0].service, 1)
                       if " | output: " in r.detail), "")
        ctx.say_once(("failed", run.commit, detail), logging.ERROR, "%s: %s failed at %s: %s%s [APPLY_FAILED]",
                       ctx.node, run.commit[:12], failed[0].service, failed[0].detail,
                       f" | last output: {output}" if output else "")
    # A decommission sets no no-op marker: a pass killed before the node is retired does it again.
    decommission = repo is not None and leaving(repo, ctx.node)
    hashes = {s.name: s.hash for s in desired.services} if verdict is Verdict.APPLIED and not decommission else None
    facts = ctx.resolver.facts()
    if facts.facts is not None:  # published on this commit's note: what its render read, if it did
        ctx.ledger.set_facts_rendered(run.commit, facts.read, facts.facts.to_dict(), facts.reads)
    result = settle(ctx, run, report, proof, converged=hashes)
    return replace(result, plan=the_plan)


def _on_failure(ctx: NodeContext, repo: DeploymentRepo | None, commit: str) -> str:
    settings = (repo or ctx.resolver.load(commit)).settings
    return str(settings.get("on_failure", "service"))


def ran_before(ctx: NodeContext, service: str, commit: str) -> ServiceRecord | None:
    """The service's record, running what it ran before ``commit`` was first tried: a run of
    ``commit`` killed after it recorded the new version would otherwise make the new version
    the one a put-back goes back to. Its history says what the last pass of another head left."""
    rec = ctx.ledger.service(service)
    if rec is None or rec.running is None or rec.running.commit != commit:
        return rec
    for row in ctx.ledger.history(service, 200):
        if row.head != commit and row.result == "ok" and row.hash and row.action not in NOT_RUNNING:
            return replace(rec, running=Version(row.commit, row.hash))
    return replace(rec, running=None)  # new at ``commit``


def _changed_before(ctx: NodeContext, service: str, before: Mapping[str, ServiceRecord | None]) -> bool:
    """A run of this commit killed after it changed ``service``: this run found nothing left to do."""
    rec, now = before.get(service), ctx.ledger.service(service)
    return rec is not None and now is not None and rec.running != now.running


def _ran(before: Mapping[str, ServiceRecord | None], service: str) -> bool:
    """It ran before this commit (it failed now: its driver put back what its own record said
    ran, which a killed run may already have moved on, or stopped; the ledger knows)."""
    rec = before.get(service)
    return rec is not None and rec.running is not None


def keep_back(ctx: NodeContext, commit: str, failed: list[ServiceResult], before: Mapping[str, ServiceRecord | None],
              drivers: Mapping[str, Driver]) -> list[str]:
    """``on_failure: service``: a failed service alone back on the version it ran before. Its
    driver put back what its own record said ran, which a killed run of this commit may have
    moved on (the new version again: "restored but not healthy") or left stopped (then this run
    only started the new one, with nothing to restore); the ledger knows what ran."""
    seen = observe(ctx.node, drivers).by_name()

    def not_back(r: ServiceResult) -> bool:
        rec, now = before.get(r.service), seen.get(r.service)
        return (rec is not None and rec.running is not None
                and (now is None or not now.running or now.hash != rec.running.hash))
    return put_back(ctx, commit, [r for r in failed if not_back(r)], before, drivers, "on_failure service")


def put_back(ctx: NodeContext, commit: str, results: list[ServiceResult], before: Mapping[str, ServiceRecord | None],
             drivers: Mapping[str, Driver], why: str = "on_failure node") -> list[str]:
    """``on_failure: node``: every service this run (or a killed run of the same commit)
    changed goes back to the version it ran before (a service it started is stopped again).
    Returns what the note says about it (each line starts with ``why``)."""
    changed = [r for r in results if (r.state is ResultState.OK and (
        r.action is not ActionKind.NONE or _changed_before(ctx, r.service, before)))
        or (r.state is ResultState.FAILED and _ran(before, r.service))]
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
            ctx.ledger.removed(r.service)
            events.append(f"{why}: {r.service} stopped (it was new in this run)")
            continue
        try:
            svc = ctx.resolver.render(version.commit).by_name().get(r.service)  # as it ran: with the held values
        except ReconcilerError as exc:
            events.append(f"{why}: {r.service} not put back: {exc}")
            continue
        if svc is None:
            continue
        old.append(replace(svc, origin=version.commit))
    if old:
        names = {s.name for s in old}
        back = ctx.plan(Desired(ctx.node, commit, tuple(old)), observe(ctx.node, drivers))
        back = Plan(back.node, commit, tuple(a for a in back.actions if a.service in names))
        for r in apply_plan(back, drivers, ctx.ledger, redact=ctx.redact, max_parallel=ctx.settings.max_parallel):
            if r.action is ActionKind.NONE:
                continue  # already back: its driver put it back
            origin = next(s.origin for s in old if s.name == r.service)
            events.append(f"{why}: {r.service} put back to {origin[:12]} ({r.action} {r.state})"
                          + (f": {r.detail}" if r.detail else ""))
    for e in events:
        log.warning("%s: %s", ctx.node, e)
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


def rolled_back(ctx: NodeContext, run: Run, the_plan: Plan, results: list[ServiceResult], what: str) -> RunResult:
    """An operator's rollback: events (and the pin) on the head's record; its verdict stays."""
    for r in results:
        ctx.ledger.add_event(run.commit, f"{what}: {r.service} {r.action} {r.state}"
                               + (f": {r.detail}" if r.detail else ""))
    write_note(ctx, run.commit)
    report = ctx.ledger.report(run.commit, ctx.node, now_iso())
    failed = [r for r in results if r.state is ResultState.FAILED]
    shown = replace(report, services=tuple(results)) if report is not None else Report(
        ctx.node, run.commit, Verdict.FAILED if failed else Verdict.APPLIED, now_iso(), services=tuple(results))
    error = ReconcilerError(f"{what} failed: {failed[0].detail}", reason="APPLY_FAILED") if failed else None
    return RunResult(ctx.node, run.commit, False, plan=the_plan, report=shown, pushed=ctx.reporter.push(),
                     error=error, operation=what)
