"""The adopt step: what this node's drivers find running with no record of theirs is taken back
as the node's own, or stopped, and the node says which.

A node that lost its state dir (a disk replaced, the directory removed, the ledger rebuilt) must
neither leave what it started running unmanaged (the supervisor revives, `status` lists and the
planner sees only what a driver has a record of) nor stop it for want of memory. The kinds that
can find their own instances without records (``Kind.adopts``: the process driver by the marker
in each process's environment, the docker driver by its containers' labels) name each one: the
service, the hash of its version and the commit it was rendered from. That commit, vouched for
by trust under the root in force, renders the same version again: its files and record are
written and the instance runs on untouched (adopted), so the plan that follows starts from what
runs (nothing to do when it matches the head). One that cannot be told apart (its commit not in
the mirror, not signed under the root, another version than it runs) is stopped. Either way a
log line and an event on the note of the node's mark (its notes give it back first).

Before trust: a refused head, or a head that failed here, leaves what runs managed all the same.
Cheap when nothing is found: the process driver reads the environments its sweep reads; a kind
with no records on the node is asked only while the ledger remembers nothing yet this node's own
notes say it acted (once, after the loss).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from reconciler.core.errors import BadInput, ReconcilerError
from reconciler.drivers import drivers_in_use, kinds, make_driver
from reconciler.ledger import Version
from reconciler.node.settle import write_note
from reconciler.trust.root import TrustError

if TYPE_CHECKING:
    from reconciler.drivers.base import Driver, Unrecorded
    from reconciler.node.context import NodeContext
    from reconciler.node.run import Run

log = logging.getLogger("reconciler.agent")


def adopt_step(ctx: NodeContext, run: Run) -> Run:
    with ctx.state.services_lock(wait=60):
        found = unrecorded(ctx)
        if not found:
            return run
        mark = _recovered(ctx)  # after a loss: from the node's notes, their records with it
        events = [adopt(ctx, kind, driver, f) for kind, driver, f in found]
    for text in events:
        log.warning("%s: %s", ctx.node, text)
    if mark is not None and ctx.ledger.record(mark) is not None:
        for text in events:
            ctx.ledger.add_event(mark, text)
        write_note(ctx, mark)
    return run


def _recovered(ctx: NodeContext) -> str | None:
    """The high-water mark, recovered from the node's notes after a loss; None while the trust
    root in force with it cannot be proven (the trust step refuses the head and says what the
    operator must give: nothing is adopted under a root the node cannot name)."""
    try:
        return ctx.keeper.high_water()
    except TrustError:
        return None


def unrecorded(ctx: NodeContext) -> list[tuple[str, Driver, Unrecorded]]:
    """(kind, driver, instance) for each instance a driver finds running with no record of it."""
    cfg = ctx.settings
    names = drivers_in_use(cfg.state_dir)
    if ctx.ledger.mark().commit is None and _recovered(ctx) is not None:
        names |= {n for n in kinds.names() if kinds.kind_of(n).adopts}  # forgot it all: every kind asked
    out: list[tuple[str, Driver, Unrecorded]] = []
    for name in sorted(names):
        driver = make_driver(name, cfg.state_dir, cfg.node, cfg.host.access(), cfg.docker.registries)
        adopting = kinds.adopting(name, driver)
        if adopting is None:
            continue
        try:
            out.extend((name, driver, f) for f in adopting.unrecorded())
        except ReconcilerError as exc:  # an engine down: its instances wait for a later pass
            ctx.say_once(("adopt", name, exc.reason), logging.WARNING, "%s: %s instances not looked for: %s [%s]",
                         ctx.node, name, exc, exc.reason)
    return out


def adopt(ctx: NodeContext, kind: str, driver: Driver, found: Unrecorded) -> str:
    """``found`` adopted, or stopped when the node cannot tell what it runs; what the note says."""
    adopting = kinds.adopting(kind, driver)
    assert adopting is not None
    name, commit = found.service, found.commit
    try:
        if not commit:
            raise BadInput("it does not say which commit it runs")
        svc = ctx.resolver.at(commit).by_name().get(name)  # vouched for under the root in force
        if svc is None or svc.runtime.driver != kind:
            raise BadInput(f"{commit[:12]} does not run it on this node's {kind} driver")
        if svc.hash != found.hash:
            raise BadInput(f"{commit[:12]} renders another version of it ({svc.hash[:12]}, not {found.hash[:12]})")
        pid = adopting.adopt(svc, commit)
    except ReconcilerError as exc:
        driver.remove(name)
        ctx.ledger.log(name, commit, found.hash, "stop", "ok", "found running with no record of it", str(exc))
        return f"stopped {name} (pid {found.pid}): found running with no record of it, and {exc}"
    ctx.ledger.ran(name, Version(commit, svc.hash), healthy=False)
    ctx.ledger.log(name, commit, svc.hash, "adopt", "ok", "found running with no record of it", f"pid {pid}")
    return f"adopted {name} (pid {pid}): found running {commit[:12]} with no record of it"
