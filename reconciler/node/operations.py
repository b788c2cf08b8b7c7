"""An operator's hands on one node: rollback, unpin, retry, suspend, resume, plan, prepull.
Small operations over the node's context, each reached the same way from the command line
(plan and prepull read ahead and change nothing; prepull touches the engine only).

None of them changes a commit's verdict: a rollback of a service on a node whose head failed
leaves that commit failed (the fleet gate still halts on it); it adds an event and a pin to the
head's note. Only a run of the commit itself that applies it healthy can make it applied.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from reconciler.core.errors import BadInput
from reconciler.core.model import Desired, Plan, Verdict
from reconciler.drivers.observe import observe
from reconciler.ledger import Pin, Version
from reconciler.node.apply import Pulled, pull_images
from reconciler.node.converge import converge, refuse_held
from reconciler.node.reconcile import head
from reconciler.node.run import Run, RunResult, now_iso
from reconciler.node.settle import write_note
from reconciler.plan.planner import in_windows, stage
from reconciler.trust.verify import is_descendant

if TYPE_CHECKING:
    from reconciler.node.context import NodeContext
    from reconciler.repo.definitions import DeploymentRepo


def rollback(ctx: NodeContext, service: str, to: str | None = None, by: str = "an operator") -> RunResult:
    """Put one service back to an earlier commit's version, here and now, without the remote,
    and pin it there (the note says so) until the branch moves on or `unpin`."""
    with ctx.state.lock(wait=30):
        head = ctx.ledger.mark().commit
        if head is None:
            raise BadInput("this node has applied nothing yet: nothing to roll back")
        refuse_held(ctx.node, ctx.ledger.held_stopped(), [service])
        if to is None:
            to = previous_good(ctx, service).commit
        target_rev = ctx.keeper.vouch(ctx.resolver.revision(to))
        target = target_rev.commit
        old = ctx.resolver.desired(target_rev).by_name()
        if service not in old:
            raise BadInput(f"service {service} is not on node {ctx.node} at {target[:12]}")
        previous = next((p for p in ctx.ledger.pins() if p.service == service), None)
        ctx.ledger.pin(Pin(service, target, old[service].hash, head, by, time.time()))
        what = f"rollback of {service} to {target[:12]} by {by}"
        result = converge(ctx, Run(head, False, ()), ctx.keeper.vouch(ctx.resolver.revision(head)), only={service},
                          instantiate=True, operation=what)
        if result.error is not None:
            # It runs what it ran before (the driver put it back): the pin would lie.
            if previous is not None:
                ctx.ledger.pin(previous)
            else:
                ctx.ledger.unpin(service)
            write_note(ctx, head)
        return result


def verified_slice(ctx: NodeContext, *, fetch: bool, rev: str | None) -> tuple[Desired, DeploymentRepo, bool]:
    """The node's slice at the branch head (or ``rev``), with the repo it was rendered from (its
    windows, its budgets), for a command that reads ahead and applies nothing (plan, prepull):
    verified first, nothing moves in the ledger. Call with the pass lock held."""
    commit, fetched = head(ctx, fetch, rev)
    ctx.keeper.decide(commit)  # a refusal is raised: nothing unverified is even rendered
    repo = ctx.resolver.load(commit)
    return ctx.resolver.desired(ctx.keeper.vouch(ctx.resolver.revision(commit)), repo), repo, fetched


def plan(ctx: NodeContext, *, fetch: bool = True, rev: str | None = None) -> tuple[Plan, bool]:
    """What the next pass would do now: apply: manual staged, closed windows waited for."""
    with ctx.state.lock(wait=30):
        desired, repo, fetched = verified_slice(ctx, fetch=fetch, rev=rev)
        observed = observe(ctx.node, ctx.drivers(desired))
        return in_windows(stage(ctx.plan(desired, observed)), repo.windows, ctx.clock()), fetched


def prepull(ctx: NodeContext, *, fetch: bool = True, rev: str | None = None) -> tuple[str, list[Pulled]]:
    """Pull the images the verified head (or ``rev``) runs on this node, ahead of its wave. No
    container, record, verdict or note changes. The pass lock is held only to read the commit:
    a long pull never holds back the agent's own passes."""
    with ctx.state.lock(wait=30):
        desired, _, _ = verified_slice(ctx, fetch=fetch, rev=rev)
    return desired.commit, pull_images(desired, ctx.drivers(desired))


def previous_good(ctx: NodeContext, service: str) -> Version:
    """The newest version that ran healthy here and is older than the running one: rendered
    from an ancestor of the running version's commit, with other content. Going back twice goes
    back two versions, never forward to the version that was just rolled back from."""
    import pygit2  # here: the command line imports this module for every command

    running = observe(ctx.node, ctx.drivers(None)).by_name().get(service)
    if running is None:
        raise BadInput(f"service {service} does not run on node {ctx.node}")
    repo = ctx.source.repo
    for version in ctx.ledger.good_versions(service):
        if version.hash == running.hash:
            continue
        if running.commit and version.commit != running.commit:
            try:
                older = is_descendant(repo, running.commit, version.commit)
            except (KeyError, ValueError, pygit2.GitError):
                older = False
            if not older:
                continue
        return version
    raise BadInput(f"service {service}: no earlier good version in this node's history")


def unpin(ctx: NodeContext, service: str, by: str = "an operator") -> bool:
    """Release a rollback's pin; the next run brings the service to the head's version (when
    the head did not fail here: a failed head waits for `retry` or a new commit)."""
    with ctx.state.lock(wait=30):
        pin = ctx.ledger.unpin(service)
        if pin is None:
            return False
        if ctx.ledger.record(pin.head) is not None:
            ctx.ledger.add_event(pin.head, f"pin of {service} at {pin.commit[:12]} released by {by}")
            write_note(ctx, pin.head)
        ctx.reporter.push()
        return True


def retry(ctx: NodeContext) -> str | None:
    """The head failed (or was halted) here: let the next run try it again. Returns it, or None."""
    with ctx.state.lock(wait=30):
        head = ctx.ledger.mark().commit
        if head is None:
            return None
        rec = ctx.ledger.record(head)
        if rec is None or rec.verdict not in (Verdict.FAILED, Verdict.HALTED):
            return None
        return head if ctx.ledger.retry(head) else None


def invoker() -> str:
    """Who runs the command: the person behind sudo, else the login name (a service user, a
    container without a login: its uid's name, or the uid itself)."""
    import getpass
    import os

    who = os.environ.get("SUDO_USER")
    if who:
        return who
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return str(os.getuid())


def suspend(ctx: NodeContext, reason: str, by: str) -> bool:
    """Passes apply nothing from now on; True when it was suspended already (the reason changes).
    The ledger alone, no lock: a pass under way finishes as it began, the next one holds."""
    return ctx.ledger.suspend(reason, by, now_iso())


def resume(ctx: NodeContext) -> dict[str, str] | None:
    """The operator's suspension lifted (the next pass converges); None when there was none."""
    return ctx.ledger.resume()
