"""Deployment-wide post steps of an upgrade (``post_upgrade``), run on a node once every node
that runs their services applied the commit; a reboot step one batch at a time, in wave order,
each node's reboot noted before it goes down and done once it runs under another boot id.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from reconciler.core import faults
from reconciler.core.errors import ReconcilerError
from reconciler.core.model import ActionKind, Scope, StepRecord, StepStatus
from reconciler.drivers.steprun import host_command
from reconciler.fleet.rollout import FleetView, plan_rollout
from reconciler.repo.steps import PostStep, StepAction
from reconciler.repo.windows import closed
from reconciler.upgrades.rules import (
    STARTED_FRESH,
    holding,
    post_earned,
    post_steps_due,
    post_targets,
    reboot_turn,
)

if TYPE_CHECKING:
    from reconciler.node.upgrader import Upgrader


@dataclass(frozen=True)
class Posted:
    """Where this node's post steps stand: all done (no field set), waiting (``waiting``: why;
    ``waiting_for``: the nodes whose next note may end the wait), or one failed (``failed``)."""

    waiting: str = ""
    failed: str = ""
    waiting_for: tuple[str, ...] = ()


def post(upgrader: Upgrader, fleet: FleetView, note: Callable[[], None]) -> Posted:
    """Post steps due on this node: run those whose services are applied fleet-wide."""
    due = post_steps_due(upgrader.repo, upgrader.node, upgrader.fleet_upgrades,
                         lambda n: n == upgrader.node or fleet.reached(n, upgrader.commit) is not None,
                         upgrader.repo.members, holding(upgrader.repo, upgrader.base))
    done = {r.step: r for r in upgrader.ctx.ledger.steps(upgrader.commit) if r.service == ""}
    for k, (post, waiting) in enumerate(due):
        rec = done.get(post.name)
        if rec is not None and rec.status in (StepStatus.DONE, StepStatus.FAILED, StepStatus.SKIPPED):
            continue
        if waiting:
            return Posted(f"post_upgrade {post.name} waits for {_shown(waiting)} to apply {upgrader.commit[:12]}",
                          waiting_for=waiting)
        if rec is None and (why := _unearned(upgrader, post, fleet)):
            # Every participant noted the commit: no step of it ran anywhere (a revert of an upgrade
            # that never landed), so neither does the post step. Noted, so the fleet sees why.
            now = time.time()
            upgrader.ctx.ledger.step(upgrader.commit, k, StepRecord("", post.name, Scope.NODE, StepStatus.SKIPPED,
                                                                    now, now, why))
            note()
            continue
        if post.action is StepAction.REBOOT:
            turn = _reboot(upgrader, k, post, rec, fleet, note)
            if turn.waiting or turn.failed:
                return turn
            continue
        started = time.time()
        upgrader.ctx.ledger.step(upgrader.commit, k, StepRecord("", post.name, Scope.NODE, StepStatus.STARTED, started))
        ok, detail = _post(upgrader, post)
        detail = upgrader.ctx.redact(detail)
        upgrader.ctx.ledger.step(upgrader.commit, k, StepRecord("", post.name, Scope.NODE,
                                                          StepStatus.DONE if ok else StepStatus.FAILED, started,
                                                          time.time(), detail))
        # Only once the record says done: the scratch directory holds the exit status that tells
        # a pass killed before the record that the command ran (without it, it would run again).
        upgrader.forget("", post.name)
        note()
        if not ok:
            return Posted(failed=f"post_upgrade {post.name} failed on {upgrader.node}: {detail}")
    upgrader.forget("")  # every post step recorded: what a pass killed after a record left goes too
    return Posted()


def _unearned(upgrader: Upgrader, post: PostStep, fleet: FleetView) -> str:
    """Why ``post`` does not run for the commit ('' when some node ran its services' steps)."""
    fresh = {n: note.fresh for n in fleet.notes if (note := fleet.note(n, upgrader.commit)) is not None}
    fresh[upgrader.node] = frozenset(r.service for r in upgrader.ctx.ledger.steps(upgrader.commit)
                                     if r.status is StepStatus.SKIPPED and r.detail == STARTED_FRESH)
    return post_earned(post, upgrader.everyone, upgrader.progress(fleet), fresh)


def _reboot(upgrader: Upgrader, k: int, post: PostStep, rec: StepRecord | None, fleet: FleetView,
            note: Callable[[], None]) -> Posted:
    """This node's reboot for a reboot post step, once every node before its batch (wave
    order) noted its own reboot done. The step is noted ``started`` with the boot id before
    the reboot command runs, and ``done`` once the node runs under another boot id (the
    undrain hook run first)."""
    host = upgrader.ctx.settings.host.access()
    ledger, boot = upgrader.ctx.ledger, host.boot_id()
    if rec is not None and rec.status is StepStatus.STARTED:
        before = rec.detail.removeprefix("rebooting: boot id ")
        if before != boot:
            detail = f"rebooted (boot id {before} -> {boot})"
            if post.undrain:
                failed = host_command(host, post.undrain, post.timeout, upgrader.ctx.redact)
                detail += "; undrain " + (f"failed: {failed}" if failed else "ok")
            ledger.step(upgrader.commit, k, replace(rec, status=StepStatus.DONE, ended=time.time(), detail=detail))
            note()
            return Posted()
        # Same boot: the reboot has not happened (or the run that noted it died first): again.
    else:
        repo = upgrader.repo
        order = [n for _, m in plan_rollout(repo.settings, repo.nodes, repo.members).batches() for n in m]
        before_me = reboot_turn(post, post_targets(upgrader.repo, post, upgrader.repo.members), order, upgrader.node)
        progress = upgrader.progress(fleet)
        waiting = [n for n in before_me if progress.get(n, {}).get(("", post.name)) != StepStatus.DONE]
        if waiting:  # their reboots noted done: this node's turn
            return Posted(f"post_upgrade {post.name} waits for {_shown(waiting)} to reboot", waiting_for=tuple(waiting))
        shut = closed(ActionKind.REBOOT, upgrader.node, upgrader.repo.windows, upgrader.ctx.clock())
        if shut is not None:  # a maintenance window gates reboots here: its turn waits for it
            return Posted(f"post_upgrade {post.name}: reboot {shut}")
        started = time.time()
        failed = host_command(host, post.drain, post.timeout, upgrader.ctx.redact) if post.drain else ""
        if failed:
            why = f"drain failed: {failed}"
            ledger.step(upgrader.commit, k, StepRecord("", post.name, Scope.NODE, StepStatus.FAILED, started,
                                                   time.time(), why))
            note()
            return Posted(failed=f"post_upgrade {post.name} failed on {upgrader.node}: {why}")
        ledger.step(upgrader.commit, k, StepRecord("", post.name, Scope.NODE, StepStatus.STARTED, started,
                                               detail=f"rebooting: boot id {boot}"))
        note()  # the fleet sees this node go down for its reboot before it does
    faults.point("spawn", f"post_upgrade reboot {post.name}")
    failed = host_command(host, host.reboot_command, 120, upgrader.ctx.redact)
    if failed:
        why = f"reboot command failed: {failed}"
        ledger.step(upgrader.commit, k, StepRecord("", post.name, Scope.NODE, StepStatus.FAILED,
                                               rec.started if rec else started, time.time(), why))
        note()
        return Posted(failed=f"post_upgrade {post.name} failed on {upgrader.node}: {why}")
    return Posted(f"post_upgrade {post.name}: rebooting (boot id {boot[:8]})")


def _post(upgrader: Upgrader, post: PostStep) -> tuple[bool, str]:
    mine = set(upgrader.repo.services_of(upgrader.node))
    try:
        with upgrader.ctx.state.services_lock(wait=60):
            if post.action is StepAction.COMMAND:
                return upgrader.command("", post.command, post.timeout, post.name)
            out = []
            for service in post.targets:
                if service not in mine:
                    continue
                # At the commit the service runs: the branch may have moved past this upgrade.
                rec = upgrader.ctx.ledger.service(service)
                at = rec.running.commit if rec is not None and rec.running is not None else upgrader.commit
                if post.action is StepAction.UNPIN:
                    upgrader.ctx.ledger.release(service, post.names)
                    ok, detail = upgrader.apply(service, None, upgrader.render(service, at))
                else:
                    ok, detail = upgrader.apply(service, ActionKind.RELOAD, upgrader.render(service, at))
                out.append(f"{service}: {detail}")
                if not ok:
                    return False, "; ".join(out)
            return True, "; ".join(out) or "no such service here"
    except ReconcilerError as exc:
        if exc.reason == "DISK_FULL":
            raise
        return False, str(exc)


def _shown(nodes: Sequence[str]) -> str:
    return ", ".join(nodes[:5]) + (f" and {len(nodes) - 5} more" if len(nodes) > 5 else "")
