"""A node that left the inventory: decommissioned, then idle.

When a verified head's inventory no longer names this node, its pass stops every service it
runs (dependents first, each stop journalled as any pass's), notes the head applied with an
event ``decommissioned at <commit>: ...`` and marks the ledger retired. From then on every pass
ends at once (exit 0), fetching nothing: the node is the operator's to take down (docs/day2.md).

Crash safety: the stops come first, the note second, the retired mark last. A pass killed
before the mark does it all again: what was stopped stays stopped, the note says the same.
A stop that fails leaves the node not retired; the next pass tries again.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from reconciler.core.errors import ApplyError, BadInput
from reconciler.core.model import Report, ResultState, Verdict
from reconciler.drivers.observe import observe
from reconciler.ledger import Proof
from reconciler.node.run import Run, RunResult, now_iso
from reconciler.node.settle import settle
from reconciler.node.stopping import stop_services

if TYPE_CHECKING:
    from reconciler.node.context import NodeContext

log = logging.getLogger("reconciler.agent")


def retired_step(ctx: NodeContext, run: Run) -> Run | RunResult:
    """First of a pass: a retired node does nothing more, and says so once."""
    record = ctx.ledger.retired()
    if record is None:
        return run
    why = idle_reason(record)
    ctx.say_once(("retired", record.get("commit")), logging.WARNING, "%s: %s", ctx.node, why)
    return RunResult(ctx.node, str(record.get("commit", "")), False, skipped=why)


def idle_reason(record: dict[str, object]) -> str:
    commit = str(record.get("commit", ""))
    return f"decommissioned at {commit[:12]} (the node left the inventory): nothing more to do; " \
           "remove its state dir to take it down (docs/day2.md)"


def decommission_step(ctx: NodeContext, run: Run) -> Run | RunResult:
    """After trust: the verified head's inventory still names this node (the pass goes on), or
    it does not (the node is decommissioned here). A repo that does not load is the gate's."""
    try:
        repo = ctx.resolver.load(run.commit)
    except BadInput:
        return run
    if ctx.node in repo.nodes:
        return run
    return decommission(ctx, run)


def decommission(ctx: NodeContext, run: Run) -> RunResult:
    """Stop everything, note it, retire the ledger (see the module's docstring)."""
    commit = run.commit
    mark = ctx.ledger.mark().commit
    running = sorted(o.name for o in observe(ctx.node, ctx.drivers(None)).services)
    results = stop_services(ctx, commit, running, f"decommissioned: node {ctx.node} left the inventory",
                            order_from=mark)
    failed = [r for r in results if r.state is ResultState.FAILED]
    if failed:
        exc = ApplyError(f"decommission of node {ctx.node} at {commit[:12]}: stop of {failed[0].service} "
                         f"failed: {failed[0].detail}; the next pass tries again")
        ctx.say_once(("decommission failed", commit), logging.ERROR, "%s: %s", ctx.node, exc)
        return RunResult(ctx.node, commit, run.fetched, error=exc)
    event = f"decommissioned at {commit[:12]}: node {ctx.node} left the inventory; stopped " \
            + (", ".join(r.service for r in results) or "nothing")
    log.warning("%s: %s", ctx.node, event)
    report = Report(ctx.node, commit, Verdict.APPLIED, now_iso(), services=tuple(results), signer=run.signer,
                    events=(*run.events, event))
    result = settle(ctx, run, report, Proof.HEALTHY_RUN, converged={})
    ctx.ledger.retire(commit, now_iso(), running)  # last: a pass killed before does it all again
    return RunResult(result.node, commit, run.fetched, report=result.report, pushed=result.pushed,
                     interrupted=run.interrupted, skipped=idle_reason({"commit": commit}))
