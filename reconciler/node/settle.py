"""How a pass ends: the verdict into the ledger (through its one table of allowed moves), the
note written as the ledger's projection of the commit's record, and pushed. What a note says is
what the node remembers. A pass that holds changes back on purpose (a suspension, a closed
window, a disruption budget) ends here too, noted waiting with what it held back.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from reconciler.core.model import Action, ActionKind, Plan, Report, ServiceResult, Verdict
from reconciler.fleet import notes
from reconciler.node.run import Run, RunResult, now_iso

if TYPE_CHECKING:
    from reconciler.core.errors import ReconcilerError
    from reconciler.ledger import Proof
    from reconciler.node.context import NodeContext


def settle(ctx: NodeContext, run: Run, report: Report, proof: Proof | None, root_id: str = "",
           converged: Mapping[str, str] | None = None) -> RunResult:
    """The verdict into the ledger (one transaction), then the note written and pushed. What the
    report says (a step's output, a service's) is cleaned of secret values first: the ledger
    keeps it, and the command line shows it."""
    report = ctx.redact.report(report)
    ctx.ledger.settle(report, proof=proof, root_id=root_id, converged=converged)
    write_note(ctx, report.commit)
    return RunResult(ctx.node, report.commit, run.fetched, report=report, pushed=ctx.reporter.push(),
                     interrupted=run.interrupted)


def write_note(ctx: NodeContext, commit: str) -> None:
    """The note of ``commit`` is the ledger's record of it; written unless it already says that."""
    report = ctx.ledger.report(commit, ctx.node, now_iso())
    if report is None:
        return
    # signed with the root: what recovery trusts; the services `reconciler stop` holds: the fleet view's
    report = replace(report, root=ctx.keeper.gate.root.origin, held=tuple(sorted(ctx.ledger.held_stopped())))
    previous = ctx.reporter.read(commit)
    # the signature and the time differ on every writing: the record is what must match
    if previous is None or {k: v for k, v in previous.items() if k not in ("time", "sig")} != \
            {k: v for k, v in notes.to_dict(report).items() if k != "time"}:
        ctx.reporter.write(report)
    ctx.ledger.noted(commit)


def stopped(ctx: NodeContext, run: Run, verdict: Verdict, exc: ReconcilerError) -> RunResult:
    """A run that stopped before applying anything: noted with the error's reason code."""
    ctx.say_once(("stopped", run.commit, exc.reason), logging.ERROR, "%s: %s at %s: %s [%s]", ctx.node,
                   verdict, run.commit[:12], exc, exc.reason)
    report = Report(ctx.node, run.commit, verdict, now_iso(), reason=exc.reason, error=str(exc),
                    signer=run.signer, events=run.events)
    return replace(settle(ctx, run, report, None), error=exc)


def held(ctx: NodeContext, run: Run, the_plan: Plan, reason: str, why: str, lines: list[str],
         suspension: Mapping[str, str] | None = None) -> RunResult:
    """A pass that held changes back on purpose (SUSPENDED, WINDOW, BUDGET): the commit is noted
    waiting with ``why`` and ``lines`` (what it held back), or, when it settled here already
    (applied, failed), keeps its verdict and gets them as events, once per text. A pass that
    finds the same hold again and nothing new adds no run to the ledger."""
    node, commit = ctx.node, run.commit
    before = ctx.ledger.report(commit, node, now_iso())
    also = why if suspension is not None else ""  # RunResult.suspended: only a suspension says it
    if not ctx.ledger.may_become(commit, Verdict.WAITING):
        seen = set(before.events) if before is not None else set()
        for text in [why, *lines]:
            if text not in seen:
                ctx.ledger.add_event(commit, text)
        write_note(ctx, commit)
        return RunResult(node, commit, run.fetched, plan=the_plan, pushed=ctx.reporter.push(), waiting=why,
                         suspended=also)
    seen = set(before.events) if before is not None and before.reason == reason else set()
    new_events = tuple(e for e in run.events + tuple(lines) if e not in seen)
    if before is not None and before.reason == reason and before.error == why and not new_events:
        write_note(ctx, commit)
        return RunResult(node, commit, run.fetched, plan=the_plan, report=before, pushed=ctx.reporter.push(),
                         waiting=why, suspended=also)
    report = Report(node, commit, Verdict.WAITING, now_iso(), reason=reason, error=why, plan_hash=the_plan.hash,
                    signer=run.signer, events=new_events, suspended=suspension)
    return replace(settle(ctx, run, report, None), plan=the_plan, waiting=why, suspended=also)


def held_for(ctx: NodeContext, run: Run, the_plan: Plan, results: list[ServiceResult],
             waits: list[Action]) -> RunResult:
    """Changes a closed maintenance window or a disruption budget holds back: what could go
    went; the commit is noted waiting (WINDOW: with the window's next opening; BUDGET: with the
    nodes whose slots it waits for), so the rollout waits for this node and a later poll
    finishes it."""
    why = f"{waits[0].service}: {waits[0].waiting}" + (f" (and {len(waits) - 1} more)" if len(waits) > 1 else "")
    lines = [f"{a.service}: {a.waiting}" for a in waits]
    lines += [f"{r.service}: {r.action} {r.state}" + (f" ({r.detail})" if r.detail else "")
              for r in results if r.action is not ActionKind.NONE]
    ctx.say_once(("held", run.commit, why), logging.INFO, "%s: %s: %s", ctx.node, run.commit[:12], why)
    return held(ctx, run, the_plan, waits[0].held_by, why, lines)
