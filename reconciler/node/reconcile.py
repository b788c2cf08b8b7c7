"""One pass of the loop, as an explicit list of steps.

Each step takes the node's context and the run so far, and returns the run for the next step,
or a ``RunResult`` that ends the pass (a stop: nothing to do, refused, waiting, halted, failed,
each with its reason):

    prepare   sweep a killed run's leftovers, check for room, finish notes a killed run owed
    source    the branch head (a ref check; a fetch only when it moved)
    retired   a decommissioned node: ends here (pushing what is pending), unless the verified
              head names it under ``nodes`` again, which lifts it   (``node.decommission``)
    resume    a reboot this node started: wait for it, or finish it; a cutover it watches
    noop      same commit, converged, every service running its slice: nothing at all (unless
              post_upgrade steps here wait on the fleet)
    adopt     what runs with no record (the state dir was lost) taken back, or stopped (``node.adopt``)
    trust     verified and forward, or refused (noted once per root)          (``node.gate``)
    gate      a commit that failed here waits for `retry`; pins released when the branch moved;
              the repo loads; an owed upgrade first; suspended; the rollout says go, wait or
              halted (an upgrade under way here is taken back when halted)    (``node.gate``)
    decommission  listed under ``decommission``: a node with no mark stops nothing (UNKNOWN_NODE);
              else its slice is empty and converge stops everything  (``node.decommission``)
    upgrade   the commit's upgrade steps this node takes part in, each after its barrier
    converge  render, observe, plan, apply (under the services lock), then settle the verdict
    retire    a ``decommission`` commit applied: noted, the ledger retired (``node.decommission``)
    post      deployment-wide post_upgrade steps, once the fleet applied the commit

Every verdict goes through ``Ledger.settle`` (the one table of allowed moves) and every note
is the ledger's projection (``node.settle``), so what a note says is what the node remembers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from reconciler.core.errors import BadInput
from reconciler.core.model import Verdict
from reconciler.core.model.facts import BadFacts, Facts, changes
from reconciler.drivers.afterboot import after_boot
from reconciler.drivers.observe import glance
from reconciler.node import peers, quiet, quietlook
from reconciler.node.context import NodeContext
from reconciler.node.decommission import retired_step
from reconciler.node.peers import cutover_watch
from reconciler.node.run import Request, Run, RunResult
from reconciler.node.settle import write_note

if TYPE_CHECKING:
    from reconciler.ledger import Interrupted

log = logging.getLogger("reconciler.agent")

Step = Callable[[NodeContext, Run], Run | RunResult]


def reconcile(ctx: NodeContext, ask: Request) -> RunResult:
    """One pass: each of ``STEPS`` in turn, under the pass lock, until one ends it."""
    with ctx.state.lock(wait=30 if ask.rev else 0):
        run = Run("", False, (), ask=ask)
        for step in STEPS:
            if step is adopt:
                # Past the no-op check, this pass may act; an action that fails is caught, not
                # raised through the lock, and may leave a temp file: the next pass sweeps.
                ctx.state.dirty = True
            out = step(ctx, run)
            if isinstance(out, RunResult):
                return out
            run = out
    raise AssertionError("the post step ends every pass that gets that far")  # pragma: no cover


def prepare(ctx: NodeContext) -> tuple[Interrupted, ...]:
    """Before anything else: leftovers swept, room checked, owed notes written."""
    # The supervisor writes records between passes (a revived service's): its temp file is not
    # a killed run's, so the sweep waits for it as a pass changing services would.
    with ctx.state.services_lock(wait=30):
        swept = ctx.state.sweep()
    for path in swept:
        log.warning("%s: removed %s, left half written by a killed run", ctx.node, path)
    ctx.state.check_space(int(ctx.settings.min_free_mb * 2**20))
    ctx.reporter.recover()
    for commit in ctx.ledger.unnoted():
        write_note(ctx, commit)
    interrupted = tuple(ctx.ledger.interrupted())
    for i in interrupted:
        log.warning("%s: a previous run was interrupted during %s %s at %s; doing it again",
                    ctx.node, i.action, i.service, i.commit[:12])
    return interrupted


def start(ctx: NodeContext, run: Run) -> Run:
    ctx.resolver.forget_facts()  # gathered again if this pass renders, or its slice read them
    interrupted = prepare(ctx)
    events = tuple(f"interrupted run: {i.action} {i.service} at {i.commit[:12]}" for i in interrupted)
    damaged = ctx.ledger.damaged()
    if damaged is not None and not ctx.ledger.damage_noted():
        # A corrupt ledger was set aside when it was opened: the passes carry it (no no-op) until
        # a settled note does; the rest of the pass is the one after a lost state dir.
        events += (damaged[0].event,)
    return replace(run, interrupted=interrupted, events=events)


def source(ctx: NodeContext, run: Run) -> Run:
    commit, fetched = head(ctx, run.ask.fetch, run.ask.rev)
    return replace(run, commit=commit, fetched=fetched)


def head(ctx: NodeContext, fetch: bool, rev: str | None) -> tuple[str, bool]:
    """The commit a pass is about: ``rev`` in the mirror, the branch head (fetched, when
    ``fetch``: a ref check, a fetch only when it moved), or the mirror's head."""
    if rev is not None:
        import pygit2  # here: a pass at the head resolves no revision

        try:
            return str(ctx.source.repo.revparse_single(rev).peel(pygit2.Commit).id), False
        except (KeyError, ValueError, pygit2.GitError) as exc:
            raise BadInput(f"revision {rev!r} is not in the node's mirror (fetch first)") from exc
    if fetch:
        return ctx.source.update()
    local = ctx.source.local_head()
    if local is None:
        raise BadInput("the node's mirror is empty: run `reconciler agent --once` first")
    return local, False


def resume(ctx: NodeContext, run: Run) -> Run | RunResult:
    """A reboot this node started: until the node is back, the pass waits for it; a cutover
    this node watches: the nodes taking over the VIPs, read."""
    events = list(run.events)
    waiting = resume_after_reboot(ctx, events)
    if waiting is not None:
        return RunResult(ctx.node, waiting, run.fetched, pushed=ctx.reporter.push())
    return replace(run, events=(*events, *cutover_watch(ctx, run.commit)))


def resume_after_reboot(ctx: NodeContext, events: list[str]) -> str | None:
    """A reboot this node started for a commit: once the boot id changed, run the undrain
    hook and go on (returns None); before that, the commit it waits for."""
    back = after_boot(ctx.settings.state_dir, ctx.node, ctx.settings.host.access())
    if back is None:
        return None
    if back.waiting:
        ctx.say_once(("reboot", back.commit), logging.WARNING, "%s: reboot pending for %s", ctx.node, back.commit[:12])
        return back.commit
    ctx.ledger.log(back.service, back.commit, back.hash, "reboot", "ok", "resumed", back.detail)
    events.append(back.detail)
    log.warning("%s: %s", ctx.node, back.detail)
    return None


def noop(ctx: NodeContext, run: Run) -> Run | RunResult:
    """Nothing new and nothing changed: the pass ends here (the post steps of an upgrade that
    wait on the fleet looked at again; a disruption slot a killed pass kept, freed)."""
    if run.interrupted or run.events or run.ask.only is not None:
        return run
    # A plain `agent --once` leaves a marker when this ends as nothing at all (``node.quiet``):
    # the services as they were before they are looked at, for it.
    before = quietlook.observed(ctx.settings.state_dir) if quiet.ARMED is not None else None
    if not unchanged(ctx, run.commit):
        return run
    changed = facts_changed(ctx)
    if changed:  # a change of facts the slice reads: rendered, planned and noted like any other
        log.warning("%s: %s", ctx.node, "; ".join(changed))
        return replace(run, events=run.events + changed)
    pending = ctx.ledger.post_pending()
    if pending:  # this commit's post steps, or an earlier one's the branch moved past
        from reconciler.node.upgrade import post_upgrade
        from reconciler.node.upgrader import Upgrader

        upgrader = Upgrader.of(ctx, pending, ctx.resolver.load(pending))
        return post_upgrade(ctx, replace(run, commit=pending), upgrader, RunResult(ctx.node, run.commit, run.fetched))
    peers.release(ctx)  # a pass killed after its change settled, before it freed its slot
    result = RunResult(ctx.node, run.commit, run.fetched, pushed=ctx.reporter.push())
    if quiet.ARMED is not None:
        from reconciler.node.quietmark import remember

        remember(ctx, run, result, before)
    return result


def unchanged(ctx: NodeContext, commit: str) -> bool:
    """Cheap no-op check: this commit converged, and every service still runs that slice."""
    done = ctx.ledger.converged()
    if done is None or done[0] != commit or ctx.ledger.mark().commit != commit:
        return False
    rec = ctx.ledger.record(commit)
    if rec is None or rec.verdict is not Verdict.APPLIED or not rec.noted:
        return False
    hashes = done[1]
    seen = glance(ctx.node, ctx.drivers(None)).by_name()
    if set(seen) != set(hashes):
        return False
    return all(o.running and not o.drifted and o.hash == hashes[n] for n, o in seen.items())


def facts_changed(ctx: NodeContext) -> tuple[str, ...]:
    """What changed in the node's facts since the slice it runs was rendered, one event a fact
    (``facts changed: eth0 ipv4 10.0.0.5/24 -> 10.0.0.6/24``), of those that render read only: a
    VM's tap device appearing is no change to a slice that reads the hostname. Gathered only when
    that render read them: a slice that reads none cannot change with them, and its idle poll
    reads nothing. (A record from before reads were kept compares every fact, until a render.)"""
    used = ctx.ledger.facts_rendered()
    if used is None or not used[1]:
        return ()
    reads = ctx.ledger.facts_reads()
    if reads == frozenset():  # it read the inventory's stand-ins only
        return ()
    try:
        before: Facts | None = Facts.from_dict(used[2])
    except BadFacts:
        before = None
    now = ctx.resolver.facts().facts
    if now is None:
        return ()
    if before is None:
        return ("facts changed: the facts last rendered with are not readable",)
    return tuple(f"facts changed: {line}" for line in changes(before, now, reads))


# The steps past the no-op check, each imported when a pass first gets that far: a pass that
# finds nothing new (the most of them: `agent --once` from a timer, the idle daemon) imports none
# of the change path (the signature check, the gate, the upgrade runner, the converge).
def adopt(ctx: NodeContext, run: Run) -> Run | RunResult:
    from reconciler.node.adopt import adopt_step

    return adopt_step(ctx, run)


def trust(ctx: NodeContext, run: Run) -> Run | RunResult:
    from reconciler.node.gate import trust

    return trust(ctx, run)


def gate(ctx: NodeContext, run: Run) -> Run | RunResult:
    from reconciler.node.gate import gate

    return gate(ctx, run)


def decommission(ctx: NodeContext, run: Run) -> Run | RunResult:
    from reconciler.node.decommission import decommission_step

    return decommission_step(ctx, run)


def upgrade(ctx: NodeContext, run: Run) -> Run | RunResult:
    from reconciler.node.upgrade import upgrade_step

    return upgrade_step(ctx, run)


def converge(ctx: NodeContext, run: Run) -> Run | RunResult:
    from reconciler.node.converge import converge_step

    return converge_step(ctx, run)


def retire(ctx: NodeContext, run: Run) -> Run | RunResult:
    from reconciler.node.decommission import retire_step

    return retire_step(ctx, run)


def post(ctx: NodeContext, run: Run) -> Run | RunResult:
    from reconciler.node.upgrade import post_step

    return post_step(ctx, run)


# What a pass that fetched a new head imports next (the steps past the no-op check and what they
# read with); imported while the fetch waits on git (``core.warmup``). A module left out is only
# imported later, by the step that needs it; one here that a pass ends up not needing costs its
# import, once.
CHANGE_IMPORTS = ("pygit2", "nacl.bindings", "reconciler.node.adopt", "reconciler.node.gate",
                  "reconciler.node.converge", "reconciler.node.upgrade", "reconciler.repo.load", "reconciler.repo.tree",
                  "reconciler.render.vipnets", "reconciler.render.node", "reconciler.trust.notesig")

STEPS: tuple[Step, ...] = (start, source, retired_step, resume, noop, adopt, trust, gate, decommission, upgrade,
                          converge, retire, post)
