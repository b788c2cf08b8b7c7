"""Runs this node's part of an upgrade: each step once its barrier passes, recorded in the
ledger (and so in the note other nodes wait on); a failed or halted upgrade taken back.

The rules (who takes part, which barrier holds which step) are ``upgrades.rules``, pure; the
history (each node's base, what a node owes) is ``upgrades.history``; a step's command runs
through ``drivers.steprun``; deployment-wide post steps are ``node.poststeps``. Here they meet
the ledger. A step is recorded ``started`` before it runs and ``done`` after its effect, so a
killed run resumes at that step; a ``once`` command whose run was interrupted is not run again
unless it says it is ``idempotent`` (the upgrade stops for an operator instead), so a migration
never runs twice unasked.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from reconciler.core.errors import ReconcilerError
from reconciler.core.model import (
    PASSED,
    Action,
    ActionKind,
    Desired,
    DesiredService,
    Plan,
    ResultState,
    Scope,
    StepRecord,
    StepStatus,
)
from reconciler.drivers.kinds import kind_of, prefetches
from reconciler.drivers.observe import observe
from reconciler.drivers.steprun import INTERRUPTED, run_command
from reconciler.fleet.rollout import FleetView, plan_rollout
from reconciler.node.apply import apply_plan, pull_images
from reconciler.repo.steps import Step, StepAction
from reconciler.upgrades.rules import (
    STARTED_FRESH,
    Bases,
    Upgrade,
    barrier,
    fleet_upgrades_of,
    held_back,
    plan_upgrades,
    stage_of,
    upgraded,
    version_of,
)

if TYPE_CHECKING:
    from reconciler.node.context import NodeContext
    from reconciler.repo.definitions import DeploymentRepo

log = logging.getLogger("reconciler.upgrade")


@dataclass(frozen=True)
class Outcome:
    """How far this node got: every upgrade done (neither field set), waiting at a barrier, or a
    step failed (``failed``: the service; ``detail``: the step, the node and the output)."""

    waiting: str = ""
    failed: str = ""
    detail: str = ""
    waiting_for: tuple[str, ...] = ()  # the nodes a barrier waits for: their next note may pass it


@dataclass
class Upgrader:
    ctx: NodeContext
    commit: str
    repo: DeploymentRepo
    fleet_upgrades: tuple[str, ...]
    mine: tuple[Upgrade, ...]
    everyone: Mapping[str, Upgrade]  # every upgrade of the commit, as the fleet runs it
    base: Bases  # node -> the commit that last took it in (its parent, unless stages say otherwise)

    @property
    def node(self) -> str:
        return self.ctx.node

    # what this commit upgrades -----------------------------------------------------------
    @staticmethod
    def of(ctx: NodeContext, commit: str, repo: DeploymentRepo) -> Upgrader:
        base = ctx.resolver.bases(commit, repo)
        has_steps = any(svc.upgrade for svc in repo.services.values())
        fleet_upgrades = upgraded(repo, base) if has_steps else ()
        mine: tuple[Upgrade, ...] = ()
        everyone: dict[str, Upgrade] = {}
        if fleet_upgrades:
            rollout = plan_rollout(repo.settings, repo.nodes, repo.members)
            order = [n for _, members in rollout.batches() for n in members]
            running = {}
            for name in fleet_upgrades:
                begun = ctx.ledger.upgrade(commit, name)
                if begun is not None:
                    running[name] = begun[1]
                    continue
                rec = ctx.ledger.service(name)
                if rec is not None and rec.running is not None:
                    running[name] = version_of(ctx.resolver.load(rec.running.commit).services.get(name))
                elif (prior := ctx.ledger.upgrade_under_way(name, commit)) is not None:
                    running[name] = prior[2]  # stopped by an upgrade the branch moved past: still that version
            mine = plan_upgrades(repo, ctx.node, fleet_upgrades, running, order)
            everyone = fleet_upgrades_of(repo, fleet_upgrades, order)
        return Upgrader(ctx, commit, repo, fleet_upgrades, mine, everyone, base)

    @property
    def held(self) -> dict[str, str]:
        """service -> commit: what this node keeps at its base, being outside the commit's stage."""
        return held_back(self.repo, self.node, self.base)

    def held_events(self) -> tuple[str, ...]:
        stage = stage_of(self.repo)
        if not self.held or stage is None:
            return ()
        base = next(iter(self.held.values()))
        return (f"not in stage {stage.name}: {', '.join(sorted(self.held))} kept as at {base[:12]}",)

    @property
    def barriers(self) -> bool:
        """This node takes part in an upgrade of this commit (barriers order it, not waves)."""
        return bool(self.mine)

    # the steps ---------------------------------------------------------------------------
    def run(self, fleet: FleetView, note: Callable[[], None]) -> Outcome:
        ledger = self.ctx.ledger
        others = self.everyone
        for up in self.mine:
            begun = ledger.upgrade(self.commit, up.service)
            if begun is not None and begun[3] == "done":
                self.forget(up.service)  # what a pass killed between the record and the removal left
                continue
            if begun is not None and begun[3] == "undone":
                ledger.reset_upgrade(self.commit, up.service)  # the fleet goes on (a retry): from the top
                self.forget(up.service)
                begun = None
            if begun is None:
                running = ledger.service(up.service)
                back = running.running.commit if running and running.running else ""
                prior = ledger.upgrade_under_way(up.service, self.commit)
                if prior is not None:  # superseded: this upgrade takes over what it would have put back
                    back = back or prior[1]
                    ledger.end_upgrade(prior[0], up.service, "superseded")
                ledger.begin_upgrade(self.commit, up.service, back, up.from_version, up.to_version)
            if not up.needed:
                self._skip_all(up, f"runs {up.to_version or 'nothing'} already" if up.from_version == up.to_version
                               else STARTED_FRESH)
                note()
                continue
            outcome = self._steps(up, fleet, others, note)
            if outcome.waiting or outcome.failed:
                return outcome
            ledger.end_upgrade(self.commit, up.service, "done")
            self.forget(up.service)  # the records keep each step's output; the scratch files go
        return Outcome()

    def _skip_all(self, up: Upgrade, why: str) -> None:
        now = time.time()
        for k, step in enumerate(up.steps):
            self.ctx.ledger.step(self.commit, k, StepRecord(up.service, step.name, step.scope, StepStatus.SKIPPED,
                                                             now, now, why))
        self.ctx.ledger.end_upgrade(self.commit, up.service, "done")

    def progress(self, fleet: FleetView) -> dict[str, dict[tuple[str, str], str]]:
        progress = fleet.progress(self.commit)
        progress[self.node] = {(r.service, r.step): str(r.status) for r in self.ctx.ledger.steps(self.commit)}
        return progress

    def _steps(self, up: Upgrade, fleet: FleetView, others: Mapping[str, Upgrade], note: Callable[[], None]) -> Outcome:
        ledger = self.ctx.ledger
        if not any(r.service == up.service for r in ledger.steps(self.commit)):
            why = self._pull_first(up.service)
            if why:
                return Outcome(failed=up.service, detail=f"{up.service}: upgrade on {self.node}: {why}")
        for k, step in enumerate(up.steps):
            mine = {r.step: r for r in ledger.steps(self.commit) if r.service == up.service}
            rec = mine.get(step.name)
            if rec is not None and rec.status in PASSED:
                continue
            gate = barrier(up, k, self.progress(fleet), others)
            if not gate.go:
                return Outcome(waiting=gate.reason, waiting_for=gate.waiting_for)
            if step.scope is Scope.ONCE and up.once_node != self.node:
                now = time.time()
                ledger.step(self.commit, k, StepRecord(up.service, step.name, step.scope, StepStatus.SKIPPED, now, now,
                                                       f"runs once, on {up.once_node}"))
                note()
                continue
            started = rec.started if rec is not None and rec.status is StepStatus.STARTED else time.time()
            if rec is None or rec.status is not StepStatus.STARTED:
                ledger.step(self.commit, k, StepRecord(up.service, step.name, step.scope, StepStatus.STARTED, started))
            log.info("%s: upgrade %s: step %s (%s)", self.node, up.service, step.name, step.action)
            ok, detail = self._do(up, step)
            if detail == INTERRUPTED and (step.idempotent or step.scope is Scope.NODE):
                self.forget(up.service, step.name)  # safe to repeat: run again
                ok, detail = self._do(up, step)
            elif detail == INTERRUPTED:
                detail = (f"{INTERRUPTED}; a once step is not run twice unasked: check what it did, then "
                          "`reconciler retry` (or mark it idempotent: true)")
            detail = self.ctx.redact(detail)  # a step's output may print a secret it was given
            status = StepStatus.DONE if ok else StepStatus.FAILED
            ledger.step(self.commit, k, StepRecord(up.service, step.name, step.scope, status, started, time.time(),
                                                   detail))
            if not ok:
                return Outcome(failed=up.service,
                               detail=f"{up.service}: upgrade step {step.name} failed on {self.node}: {detail}")
            note()
        return Outcome()

    def _do(self, up: Upgrade, step: Step) -> tuple[bool, str]:
        """One step's effect; (ok, what happened)."""
        try:
            with self.ctx.state.services_lock(wait=60):
                match step.action:
                    case StepAction.COMMAND:
                        return self.command(up.service, step.command, step.timeout, step.name)
                    case StepAction.STOP:
                        return self.apply(up.service, ActionKind.STOP, None)
                    case StepAction.START:
                        return self.apply(up.service, None, self.render(up.service, self.commit))
                    case StepAction.RELOAD:
                        return self.apply(up.service, ActionKind.RELOAD, self.render(up.service, self._running(up)))
                    case StepAction.PIN:
                        self.ctx.ledger.hold(up.service, step.values, self.commit)
                        return self.apply(up.service, None, self.render(up.service, self._running(up)))
                    case StepAction.UNPIN:
                        self.ctx.ledger.release(up.service, step.names)
                        return self.apply(up.service, None, self.render(up.service, self._running(up)))
        except ReconcilerError as exc:
            if exc.reason == "DISK_FULL":
                raise
            return False, str(exc)
        return False, f"unknown action {step.action}"  # pragma: no cover - the schema allows no other

    def forget(self, service: str, name: str = "") -> None:
        """A step's scratch directory (or, without ``name``, all of the service's) removed."""
        d = self.ctx.settings.state_dir / "upgrade" / self.commit[:12] / (service or "post")
        shutil.rmtree(d / name if name else d, ignore_errors=True)

    def _running(self, up: Upgrade) -> str:
        """The commit the service's running version was rendered from (the new one once started)."""
        rec = self.ctx.ledger.service(up.service)
        if rec is not None and rec.running is not None:
            return rec.running.commit
        begun = self.ctx.ledger.upgrade(self.commit, up.service)
        return begun[0] if begun and begun[0] else self.commit

    def _pull_first(self, service: str) -> str:
        """A service's new image (its driver prefetches images), there before its first step runs (often a
        stop): a pull that fails fails the upgrade with nothing stopped. Why it failed, or ''."""
        if not prefetches(self.repo.driver_of(self.node, service)):
            return ""
        try:
            desired = Desired(self.node, self.commit, (self.render(service, self.commit),))
            failed = [p for p in pull_images(desired, self.ctx.drivers(desired)) if p.result == "failed"]
        except ReconcilerError as exc:
            return str(exc)
        return f"{failed[0].detail}; nothing was stopped for it" if failed else ""

    def render(self, service: str, commit: str) -> DesiredService:
        """The service as ``commit`` renders it here (another commit than this one: vouched for
        by trust again, through the resolver)."""
        return self.ctx.resolver.service(service, commit, self.repo if commit == self.commit else None)

    def apply(self, service: str, kind: ActionKind | None, svc: DesiredService | None) -> tuple[bool, str]:
        """``kind`` for this service (a stop, a reload), or whatever the planner says it needs to
        run ``svc`` (a start after a stop, a reload for a pinned value)."""
        drivers = self.ctx.drivers(Desired(self.node, self.commit, (svc,) if svc else ()))
        seen = observe(self.node, drivers).by_name()
        if kind is ActionKind.STOP:
            if service not in seen:
                return True, "stopped already"
            actions: tuple[Action, ...] = (Action(ActionKind.STOP, service, "upgrade step", None,
                                                  seen[service].driver),)
        elif kind is not None:
            assert svc is not None
            actions = (Action(kind, service, "upgrade step", svc, svc.runtime.driver),)
        else:
            assert svc is not None
            # through the context: the reasons cleaned of secret values, as every plan is
            planned = self.ctx.plan(Desired(self.node, self.commit, (svc,)), observe(self.node, drivers))
            actions = tuple(a for a in planned.actions if a.service == service)
        results = apply_plan(Plan(self.node, self.commit, actions), drivers, self.ctx.ledger,
                             redact=self.ctx.redact)
        failed = [r for r in results if r.state is ResultState.FAILED]
        if failed:
            output = self.ctx.last_output(service)
            return False, failed[0].detail + (f" | output: {output}" if output else "")
        return True, "; ".join(f"{r.action}" + (f" ({r.reason})" if r.reason and r.action is not ActionKind.STOP
                                                   else "") for r in results) or "nothing to do"

    def command(self, service: str, command: str, timeout: float, name: str) -> tuple[bool, str]:
        """A step's shell command, in a directory of the new version's rendered files, with a
        clean environment plus the service's own and what says where it runs; never run twice
        because the agent died (``drivers.steprun``)."""
        d = self.ctx.settings.state_dir / "upgrade" / self.commit[:12] / (service or "post") / name
        where = {"RECONCILER_NODE": self.node, "RECONCILER_SERVICE": service, "RECONCILER_COMMIT": self.commit,
                 "RECONCILER_STEP": name}
        container = bool(service) and kind_of(self.repo.driver_of(self.node, service)).steps_in_image
        return run_command(d, where, command, timeout, lambda: self.render(service, self.commit) if service else None,
                           container, self.ctx.redact)

    def undo(self, why: str) -> list[str]:
        """A step failed here or elsewhere: each upgrade this node has under way is taken back.
        Command steps' ``rollback`` run (newest first), pins this upgrade made are released, and
        the service runs the version it ran before. Returns what the note says about it."""
        ledger = self.ctx.ledger
        events = []
        for up in self.mine:
            begun = ledger.upgrade(self.commit, up.service)
            if begun is None or begun[3] != "running":
                continue
            steps = {s.name: (k, s) for k, s in enumerate(up.steps)}
            records = [r for r in ledger.steps(self.commit) if r.service == up.service]
            for rec in reversed(records):
                k, step = steps.get(rec.step, (0, None))
                if step is None or rec.status not in (StepStatus.DONE, StepStatus.FAILED, StepStatus.STARTED):
                    continue
                detail = "taken back"
                if step.action is StepAction.COMMAND:
                    if not step.rollback:
                        continue  # a command without a rollback stays what it did
                    with self.ctx.state.services_lock(wait=60):
                        ok, out = self.command(up.service, step.rollback, step.timeout, f"{step.name}-rollback")
                    detail = f"rollback {'ok' if ok else 'failed'}: {out}"
                    events.append(f"upgrade of {up.service}: step {step.name} rolled back on {self.node} ({detail})")
                ledger.step(self.commit, k, replace(rec, status=StepStatus.UNDONE, detail=f"{rec.detail}; {detail}"
                                                    if rec.detail else detail))
            ledger.release(up.service, commit=self.commit)
            back = begun[0]
            if back:
                try:
                    with self.ctx.state.services_lock(wait=60):
                        ok, detail = self.apply(up.service, None, self.render(up.service, back))
                except ReconcilerError as exc:
                    ok, detail = False, str(exc)
                events.append(f"upgrade of {up.service} taken back ({why}): {up.from_version} put back from "
                              f"{back[:12]}, {'ok' if ok else 'failed'}: {detail}")
            ledger.end_upgrade(self.commit, up.service, "undone")
        for e in events:
            log.warning("%s: %s", self.node, e)
        return events

    # deployment-wide post steps ----------------------------------------------------------
