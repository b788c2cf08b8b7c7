"""The adopt step: what this node's drivers find running with no record of theirs is taken back
as the node's own, or stopped, and the node says which.

A node that lost its state dir (a disk replaced, the directory removed, the ledger rebuilt) must
neither leave what it started running unmanaged (the supervisor revives, `status` lists and the
planner sees only what a driver has a record of) nor stop it for want of memory. The kinds that
can find their own instances without records (``Kind.adopts``: the process driver by the marker
in each process's environment, the docker driver by its containers' labels) name each one: the
service, the hash of its version and the commit it was rendered from. That commit, if the mirror
holds it, is rendered again as it ran, without vouching for it under the root in force (as the
put-back of ``on_failure: node`` renders it): this node started that instance, so whatever key
signed its commit, even one a rotation retired since, it already runs, and adopting it runs
nothing new. Rendered to the same hash, its files and record are written and the instance runs
on untouched (adopted); the plan that follows, from a verified head, decides what changes
(nothing when it matches the head). One that cannot be tied to a version (no commit named, its
commit not in the mirror, a render of another hash) is stopped, saying why. Either way a log
line and an event on the note of the node's mark (its notes give it back first).

While the trust root in force with the recovered mark cannot be proven, nothing is adopted and
nothing stopped: the trust step refuses the head and says what the operator must give.

Before trust: a refused head, or a head that failed here, leaves what runs managed all the same.
Cheap when nothing is found: the process driver reads the environments its sweep reads; a kind
with no records on the node is asked only while the ledger remembers nothing yet this node's own
notes say it acted (once, after the loss).
"""

from __future__ import annotations

import logging
import re
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
FULL_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # a commit id as the driver wrote it (SHA-1, SHA-256)


def adopt_step(ctx: NodeContext, run: Run) -> Run:
    forgot = ctx.ledger.mark().commit is None
    try:
        mark = ctx.keeper.high_water()  # after a loss: from the node's notes, their records with it
    except TrustError:
        return run  # the root in force cannot be proven: the trust step refuses and says what to give
    with ctx.state.services_lock(wait=60):
        # a node with no mark asks every kind: it lost its state dir (its notes may not prove it,
        # with a note key lost alongside) or it is new (then nothing is found, once per pass
        # until its first verified head)
        found = unrecorded(ctx, every=forgot)
        if not found:
            return run
        events = [adopt(ctx, kind, driver, f) for kind, driver, f in found]
    for text in events:
        log.warning("%s: %s", ctx.node, text)
    if mark is not None and ctx.ledger.record(mark) is not None:
        for text in events:
            ctx.ledger.add_event(mark, text)
        write_note(ctx, mark)
    return run


def unrecorded(ctx: NodeContext, every: bool) -> list[tuple[str, Driver, Unrecorded]]:
    """(kind, driver, instance) for each instance a driver finds running with no record of it;
    ``every``: every kind that adopts is asked, not only those with records here (the ledger
    remembers no mark)."""
    cfg = ctx.settings
    names = drivers_in_use(cfg.state_dir)
    if every:
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
        if not FULL_ID.fullmatch(commit) or ctx.resolver.revision(commit).commit != commit:
            raise BadInput(f"it names {commit[:40]!r}, not a commit id")  # never a ref or an abbreviation
        # As it ran, not vouched for again: whatever key signed it (one retired since included),
        # this node started it, and the hash below ties the instance to this very render.
        svc = ctx.resolver.render(commit).by_name().get(name)
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
