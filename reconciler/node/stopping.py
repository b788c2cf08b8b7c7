"""An operator's `reconciler stop` and `reconciler start`: services stopped on purpose and kept
stopped, a node-local hold like a suspension or a pin.

Naming a service holds what runs and depends on it too (as `systemctl stop` stops the units
that Require it): a dependent left running without what it needs would only fail. The hold and
its event (on the mark's record) are written to the ledger first, in one transaction, then each
service is stopped through its driver in reverse dependency order (the planner's order, turned
round), each stop journalled (``node.apply``) as any pass's. A stop killed half way leaves the
hold and the journal: the next pass no longer wants the held services (``node.desired`` leaves
them out) and stops what still runs of them, its plan saying who holds them. `start` lifts the
hold (its event in the same transaction); the next pass starts them again, in dependency order,
at the versions the head renders.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
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


def depends_on(ctx: NodeContext, commit: str | None) -> dict[str, tuple[str, ...]]:
    """Each service's ``depends_on`` as the definitions at ``commit`` say ({} when there is no
    commit or it cannot be read: an order is a courtesy, stopping must not wait on the repo)."""
    if not commit:
        return {}
    try:
        return {n: tuple(s.depends_on) for n, s in ctx.resolver.load(commit).services.items()}
    except Exception as exc:
        log.warning("%s: dependency order unknown (%s): stopping by name", ctx.node, exc)
        return {}


def stop_order(deps: Mapping[str, Iterable[str]], names: Iterable[str]) -> list[str]:
    """``names`` dependents first: the reverse of the order the planner starts them in."""
    from reconciler.plan.planner import order_of  # here: an idle poll imports no planner

    return list(reversed(order_of({n: tuple(deps.get(n, ())) for n in set(names)})))


def dependents(deps: Mapping[str, Iterable[str]], names: Iterable[str], running: Iterable[str]) -> list[str]:
    """What runs and needs one of ``names`` (directly or through another): stopped with them,
    as `systemctl stop` stops the units that Require the one it stops."""
    wanted, found = set(names), set[str]()
    grew = True
    while grew:
        more = {n for n in running if n not in wanted | found and set(deps.get(n, ())) & (wanted | found)}
        found |= more
        grew = bool(more)
    return sorted(found)


def stop_services(ctx: NodeContext, commit: str, names: Iterable[str], reason: str,
                  order_from: str | None = None) -> list[ServiceResult]:
    """Stop ``names`` (those that run) through their drivers, dependents first, each journalled
    under ``commit``: a killed stop is seen by the next pass. Call with the pass lock held."""
    drivers = ctx.drivers(None)
    with ctx.state.services_lock(wait=60):
        running = observe(ctx.node, drivers).by_name()
        order = stop_order(depends_on(ctx, order_from or commit), (n for n in names if n in running))
        actions = tuple(Action(ActionKind.STOP, n, reason, driver=running[n].driver) for n in order)
        return apply_plan(Plan(ctx.node, commit, actions), drivers, ctx.ledger, redact=ctx.redact)


@dataclass(frozen=True)
class Stopped:
    """What `reconciler stop` did."""

    held: list[str]  # held stopped now, named or not (sorted)
    dependents: list[str]  # of those, the ones stopped because they need a service named
    results: list[ServiceResult]  # each stop, dependents first


def stop(ctx: NodeContext, services: list[str], by: str) -> Stopped:
    """`reconciler stop [SERVICE...]`: hold them (all that run, when none is named), and what
    runs that depends on them, stopped, and stop them. The mark's note says so."""
    with ctx.state.lock(wait=30):
        running = observe(ctx.node, ctx.drivers(None)).by_name()
        held = ctx.ledger.held_stopped()
        unknown = sorted(set(services) - set(running) - set(held))
        if unknown:
            raise BadInput(f"service {', '.join(unknown)} does not run on node {ctx.node} "
                           f"(it runs: {', '.join(sorted(running)) or 'nothing'})", reason="UNKNOWN_SERVICE")
        mark = ctx.ledger.mark().commit
        deps = depends_on(ctx, mark)
        also = dependents(deps, services, running) if services else []
        names = sorted(set(services) | set(also) if services else set(running))
        if not names:
            return Stopped([], [], [])
        text = f"held stopped by {by} (reconciler stop): {', '.join(names)}"
        if also:
            text += f" ({', '.join(also)} with what they depend on)"
        # First, the hold and its event in one transaction: a stop killed after it is finished by
        # the next pass (which no longer wants them), and its note says so.
        ctx.ledger.hold_stopped(names, by, now_iso(), event=(mark, text) if mark else None)
        results = stop_services(ctx, mark or "", names, f"held stopped by {by} (reconciler stop)")
        if mark is not None:
            write_note(ctx, mark)
            ctx.reporter.push()
        return Stopped(names, also, results)


def start(ctx: NodeContext, services: list[str], by: str) -> list[str]:
    """`reconciler start [SERVICE...]`: lift the hold of `stop` (all of it, when none is
    named); the next pass starts them. Returns the services it lifted it from."""
    with ctx.state.lock(wait=30):
        mark = ctx.ledger.mark().commit
        event = (mark, f"hold lifted by {by} (reconciler start): {{}}") if mark else None
        lifted = ctx.ledger.release_stopped(services or None, event)  # with its event: one transaction
        if lifted and mark is not None:
            write_note(ctx, mark)
            ctx.reporter.push()
        return lifted
