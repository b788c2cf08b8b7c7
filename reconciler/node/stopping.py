"""An operator's `reconciler stop` and `reconciler start`: services stopped on purpose and kept
stopped, a node-local hold like a suspension or a pin.

The hold is written to the ledger first, then each service is stopped through its driver in
reverse dependency order, each stop journalled (``node.apply``) as any pass's. A stop killed
half way leaves the hold and the journal: the next pass no longer wants the held services
(``node.desired`` leaves them out) and stops what still runs of them. `start` lifts the hold;
the next pass starts them again, in dependency order, at the versions the head renders.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from reconciler.core.errors import BadInput
from reconciler.core.model import Action, ActionKind, Plan, ServiceResult
from reconciler.drivers.observe import observe
from reconciler.node.apply import apply_plan
from reconciler.node.run import now_iso
from reconciler.node.settle import write_note

if TYPE_CHECKING:
    from reconciler.node.context import NodeContext

log = logging.getLogger("reconciler.agent")


def stop_order(ctx: NodeContext, names: Iterable[str], commit: str | None) -> list[str]:
    """``names`` dependents first (the reverse of the order they start in), as the service
    definitions at ``commit`` say; by name when there is no commit or it cannot be read."""
    wanted = sorted(set(names))
    deps: dict[str, set[str]] = {n: set() for n in wanted}
    if commit:
        try:
            services = ctx.resolver.load(commit).services
            deps = {n: set(services[n].depends_on) & set(wanted) if n in services else set() for n in wanted}
        except Exception as exc:  # an order is a courtesy: stopping must not wait on a readable repo
            log.warning("%s: dependency order unknown (%s): stopping by name", ctx.node, exc)
    # Kahn's algorithm the other way round: a service goes once nothing left depends on it.
    out: list[str] = []
    while deps:
        needed = set().union(*deps.values())
        ready = sorted(n for n in deps if n not in needed) or [min(deps)]  # a cycle: by name
        for n in ready:
            out.append(n)
            del deps[n]
    return out


def stop_services(ctx: NodeContext, commit: str, names: Iterable[str], reason: str,
                  order_from: str | None = None) -> list[ServiceResult]:
    """Stop ``names`` (those that run) through their drivers, dependents first, each journalled
    under ``commit``: a killed stop is seen by the next pass. Call with the pass lock held."""
    drivers = ctx.drivers(None)
    with ctx.state.services_lock(wait=60):
        running = observe(ctx.node, drivers).by_name()
        order = stop_order(ctx, (n for n in names if n in running), order_from or commit)
        actions = tuple(Action(ActionKind.STOP, n, reason, driver=running[n].driver) for n in order)
        return apply_plan(Plan(ctx.node, commit, actions), drivers, ctx.ledger, redact=ctx.redact)


def stop(ctx: NodeContext, services: list[str], by: str) -> tuple[list[str], list[ServiceResult]]:
    """`reconciler stop [SERVICE...]`: hold them (all that run, when none is named) stopped and
    stop them. Returns the services held and what each stop did; the mark's note says so."""
    with ctx.state.lock(wait=30):
        running = observe(ctx.node, ctx.drivers(None)).by_name()
        known = set(running) | set(ctx.ledger.held_stopped())
        unknown = sorted(set(services) - known)
        if unknown:
            raise BadInput(f"service {', '.join(unknown)} does not run on node {ctx.node} "
                           f"(it runs: {', '.join(sorted(running)) or 'nothing'})", reason="UNKNOWN_SERVICE")
        names = sorted(set(services) if services else set(running))
        if not names:
            return [], []
        ctx.ledger.hold_stopped(names, by, now_iso())  # first: a killed stop is finished by the next pass
        mark = ctx.ledger.mark().commit
        results = stop_services(ctx, mark or "", names, f"stopped by {by}")
        if mark is not None and ctx.ledger.record(mark) is not None:
            ctx.ledger.add_event(mark, f"stopped {', '.join(r.service for r in results) or 'nothing'} "
                                       f"by {by} (held stopped: {', '.join(names)})")
            write_note(ctx, mark)
            ctx.reporter.push()
        return names, results


def start(ctx: NodeContext, services: list[str], by: str) -> list[str]:
    """`reconciler start [SERVICE...]`: lift the hold of `stop` (all of it, when none is
    named); the next pass starts them. Returns the services it lifted it from."""
    with ctx.state.lock(wait=30):
        lifted = ctx.ledger.release_stopped(services or None)
        mark = ctx.ledger.mark().commit
        if lifted and mark is not None and ctx.ledger.record(mark) is not None:
            ctx.ledger.add_event(mark, f"start of {', '.join(lifted)} asked by {by}")
            write_note(ctx, mark)
            ctx.reporter.push()
        return lifted
