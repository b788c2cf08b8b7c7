"""A node taken out of the fleet: listed under ``decommission`` in inventory.yaml, it stops its
services, notes it, and then idles until a verified head names it under ``nodes`` again.

Mere absence from ``nodes`` stops nothing (the pass errs, UNKNOWN_NODE, as it always did): a
typo or a rename must not stop a node, let alone a fleet. Only a signed commit that lists the
node under ``decommission`` does, and only as that node's apply of the commit: after the gate
(a failed head waits for `retry`, suspensions hold it, the rollout's waves order it and a
failure elsewhere halts it), through converge (windows and budgets hold its stops back as any
other's), the slice it renders being empty (``node.desired``). A node that never applied
anything here (no commit applied: a fresh node whose agent starts before its `node add`, a
name reused) stops nothing: it errs as an unknown node does.

The steps: ``decommission_step`` (after the gate) refuses a node that applied nothing; converge stops
everything and settles the commit applied, without the no-op marker (``node.converge``), so a
pass killed before the node is retired does it again; ``retire_step`` (after converge) adds the
event ``decommissioned at <commit>: ...`` (once), writes the note, marks the ledger retired,
then pushes. ``retired_step`` (after the source step: a retired node still polls) ends every
later pass, pushing what a killed pass left unpushed, until a verified head names the node under
``nodes`` again: then the retirement is lifted and that pass converges as any other.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from reconciler.core.errors import ReconcilerError, UnknownNode
from reconciler.core.model import ActionKind, ResultState, Verdict
from reconciler.node.desired import leaving
from reconciler.node.run import Run, RunResult, now_iso
from reconciler.node.settle import stopped, write_note

if TYPE_CHECKING:
    from reconciler.node.context import NodeContext

log = logging.getLogger("reconciler.agent")

EVENT = "decommissioned at"  # how the note's event starts: said once per commit


def retired_step(ctx: NodeContext, run: Run) -> Run | RunResult:
    """After the source step: a retired node does nothing more (it pushes what is pending),
    unless this verified head names it under ``nodes`` again: then it converges as any node."""
    record = ctx.ledger.retired()
    if record is None:
        return run
    head = run.commit
    if record.get("seen") != head:
        if named_again(ctx, head):
            ctx.ledger.unretire()
            text = f"decommission lifted: {head[:12]} names node {ctx.node} under `nodes` again"
            log.warning("%s: %s", ctx.node, text)
            return replace(run, events=(*run.events, text))
        ctx.ledger.retired_seen(head)  # judged once per head: a poll of the same head judges nothing
    why = idle_reason(record)
    ctx.say_once(("retired", record.get("commit")), logging.WARNING, "%s: %s", ctx.node, why)
    return RunResult(ctx.node, str(record.get("commit", "")), run.fetched, pushed=ctx.reporter.push(), skipped=why)


def named_again(ctx: NodeContext, head: str) -> bool:
    """``head`` verifies and its inventory names this node under ``nodes``. A head that does
    not verify or load says nothing: the node stays retired (its refusal is a live node's)."""
    try:
        ctx.keeper.verify(ctx.resolver.revision(head))
        return ctx.node in ctx.resolver.load(head).nodes
    except ReconcilerError as exc:
        ctx.say_once(("retired, head unread", head), logging.INFO, "%s: retired; head %s not read: %s",
                     ctx.node, head[:12], exc)
        return False


def idle_reason(record: dict[str, Any]) -> str:
    commit = str(record.get("commit", ""))
    return f"decommissioned at {commit[:12]}: nothing more to do until a commit lists node under `nodes` " \
           "again; to take the node down, see docs/day2.md"


def decommission_step(ctx: NodeContext, run: Run) -> Run | RunResult:
    """After the gate: a node listed under ``decommission`` that never applied a commit here
    stops nothing (an unknown node's error); one that did goes on to converge, which stops
    everything (its slice is empty)."""
    if run.repo is None or not leaving(run.repo, ctx.node) or ctx.ledger.last_applied() is not None:
        return run
    exc = UnknownNode(f"node {ctx.node!r} is listed under `decommission` and never applied anything here: "
                      "nothing to stop", file="inventory.yaml")
    return stopped(ctx, run, Verdict.ERROR, exc)


def retire_step(ctx: NodeContext, run: Run) -> Run | RunResult:
    """After converge applied a ``decommission`` commit: the event (once), the note, the ledger
    retired, then the push (a push that fails is the next pass's, in ``retired_step``)."""
    if run.repo is None or not leaving(run.repo, ctx.node) or run.result is None:
        return run
    commit = run.commit
    report = run.result.report
    stops = [r.service for r in (report.services if report is not None else ())
             if r.action is ActionKind.STOP and r.state is ResultState.OK]
    before = ctx.ledger.report(commit, ctx.node, now_iso())
    if before is None or not any(e.startswith(EVENT) for e in before.events):
        text = f"{EVENT} {commit[:12]}: node {ctx.node} is listed under `decommission`; stopped " \
               + (", ".join(stops) or "nothing (nothing ran any more)")
        log.warning("%s: %s", ctx.node, text)
        ctx.ledger.add_event(commit, text)
    write_note(ctx, commit)
    ctx.ledger.retire(commit, now_iso(), stops)  # last: a pass killed before does it all again
    return replace(run.result, report=ctx.ledger.report(commit, ctx.node, now_iso()), pushed=ctx.reporter.push(),
                   skipped=idle_reason({"commit": commit}))
