"""Runs this node's part of an upgrade: each step once its barrier passes, recorded in the
ledger (and so in the note other nodes wait on); a failed or halted upgrade taken back.

The rules (who takes part, which barrier holds which step) are ``upgrade``, pure; here they
meet the drivers and the ledger. A step is recorded ``started`` before it runs and ``done``
after its effect, so a killed run resumes at that step; a ``once`` command whose run was
interrupted is not run again unless it says it is ``idempotent`` (the upgrade stops for an
operator instead), so a migration never runs twice unasked.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from reconciler.core import faults
from reconciler.core.atomic import atomic_write
from reconciler.core.errors import BadInput, ReconcilerError
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
    Verdict,
)
from reconciler.core.redact import NONE as NO_SECRETS
from reconciler.core.redact import Redactor
from reconciler.drivers.base import clean_env
from reconciler.drivers.observe import observe
from reconciler.fleet.rollout import FleetView, plan_rollout
from reconciler.node.apply import apply_plan, pull_images
from reconciler.plan.planner import plan as make_plan
from reconciler.plan.windows import closed
from reconciler.upgrades.rules import (
    Bases,
    PostStep,
    Step,
    StepAction,
    Upgrade,
    barrier,
    bases,
    fleet_upgrades_of,
    held_back,
    holding,
    plan_upgrades,
    post_steps_due,
    post_targets,
    reboot_turn,
    stage_of,
    upgraded,
    version_changed,
    version_of,
)

if TYPE_CHECKING:
    import pygit2

    from reconciler.agent import Agent
    from reconciler.drivers.hostaccess import HostAccess
    from reconciler.repo.load import DeploymentRepo, ServiceDef

log = logging.getLogger("reconciler.upgrade")

OUTPUT = 2000  # characters of a step's output kept in its record
INTERRUPTED = "interrupted: the command started and never finished (the node or the agent died)"
# Runs a step's command; "started" (its pid) first and "status" last, each by a rename.
WRAPPER = ('echo $$ > ../started.tmp && mv ../started.tmp ../started && '
           '(/bin/sh -c "$RECONCILER_STEP_COMMAND") > ../output 2>&1 < /dev/null; '
           'echo $? > ../status.tmp && mv ../status.tmp ../status')


@dataclass(frozen=True)
class Outcome:
    """How far this node got: every upgrade done (neither field set), waiting at a barrier, or a
    step failed (``failed``: the service; ``detail``: the step, the node and the output)."""

    waiting: str = ""
    failed: str = ""
    detail: str = ""


@dataclass
class Upgrader:
    agent: Agent
    commit: str
    repo: DeploymentRepo
    fleet_upgrades: tuple[str, ...]
    mine: tuple[Upgrade, ...]
    everyone: Mapping[str, Upgrade]  # every upgrade of the commit, as the fleet runs it
    base: Bases  # node -> the commit that last took it in (its parent, unless stages say otherwise)

    @property
    def node(self) -> str:
        return self.agent.cfg.node

    # what this commit upgrades -----------------------------------------------------------
    @staticmethod
    def of(agent: Agent, commit: str, repo: DeploymentRepo) -> Upgrader:
        base = stage_bases(agent, commit, repo)
        has_steps = any(svc.upgrade for svc in repo.services.values())
        fleet_upgrades = upgraded(repo, base) if has_steps else ()
        mine: tuple[Upgrade, ...] = ()
        everyone: dict[str, Upgrade] = {}
        if fleet_upgrades:
            rollout = plan_rollout(repo.settings, repo.nodes, repo.members)
            order = [n for _, members in rollout.batches() for n in members]
            running = {}
            for name in fleet_upgrades:
                begun = agent.ledger.upgrade(commit, name)
                if begun is not None:
                    running[name] = begun[1]
                    continue
                rec = agent.ledger.service(name)
                if rec is not None and rec.running is not None:
                    running[name] = version_of(_load(agent, rec.running.commit).services.get(name))
                elif (prior := agent.ledger.upgrade_under_way(name, commit)) is not None:
                    running[name] = prior[2]  # stopped by an upgrade the branch moved past: still that version
            mine = plan_upgrades(repo, agent.cfg.node, fleet_upgrades, running, order)
            everyone = fleet_upgrades_of(repo, fleet_upgrades, order)
        return Upgrader(agent, commit, repo, fleet_upgrades, mine, everyone, base)

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
        ledger = self.agent.ledger
        others = self.everyone
        for up in self.mine:
            begun = ledger.upgrade(self.commit, up.service)
            if begun is not None and begun[3] == "done":
                continue
            if begun is not None and begun[3] == "undone":
                ledger.reset_upgrade(self.commit, up.service)  # the fleet goes on (a retry): from the top
                self._forget(up.service)
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
                               else "not running here before: started at the new version")
                note()
                continue
            outcome = self._steps(up, fleet, others, note)
            if outcome.waiting or outcome.failed:
                return outcome
            ledger.end_upgrade(self.commit, up.service, "done")
            self._forget(up.service)  # the records keep each step's output; the scratch files go
        return Outcome()

    def _skip_all(self, up: Upgrade, why: str) -> None:
        now = time.time()
        for k, step in enumerate(up.steps):
            self.agent.ledger.step(self.commit, k, StepRecord(up.service, step.name, step.scope, StepStatus.SKIPPED,
                                                             now, now, why))
        self.agent.ledger.end_upgrade(self.commit, up.service, "done")

    def _progress(self, fleet: FleetView) -> dict[str, dict[tuple[str, str], str]]:
        progress = fleet.progress(self.commit)
        progress[self.node] = {(r.service, r.step): str(r.status) for r in self.agent.ledger.steps(self.commit)}
        return progress

    def _steps(self, up: Upgrade, fleet: FleetView, others: Mapping[str, Upgrade], note: Callable[[], None]) -> Outcome:
        ledger = self.agent.ledger
        if not any(r.service == up.service for r in ledger.steps(self.commit)):
            why = self._pull_first(up.service)
            if why:
                return Outcome(failed=up.service, detail=f"{up.service}: upgrade on {self.node}: {why}")
        for k, step in enumerate(up.steps):
            mine = {r.step: r for r in ledger.steps(self.commit) if r.service == up.service}
            rec = mine.get(step.name)
            if rec is not None and rec.status in PASSED:
                continue
            gate = barrier(up, k, self._progress(fleet), others)
            if not gate.go:
                return Outcome(waiting=gate.reason)
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
                self._forget(up.service, step.name)  # safe to repeat: run again
                ok, detail = self._do(up, step)
            elif detail == INTERRUPTED:
                detail = (f"{INTERRUPTED}; a once step is not run twice unasked: check what it did, then "
                          "`reconciler retry` (or mark it idempotent: true)")
            detail = self.agent.redact(detail)  # a step's output may print a secret it was given
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
            with self.agent.state.services_lock(wait=60):
                match step.action:
                    case StepAction.COMMAND:
                        return self._command(up.service, step.command, step.timeout, step.name)
                    case StepAction.STOP:
                        return self._apply(up.service, ActionKind.STOP, None)
                    case StepAction.START:
                        return self._apply(up.service, None, self._render(up.service, self.commit))
                    case StepAction.RELOAD:
                        return self._apply(up.service, ActionKind.RELOAD, self._render(up.service, self._running(up)))
                    case StepAction.PIN:
                        self.agent.ledger.hold(up.service, step.values, self.commit)
                        return self._apply(up.service, None, self._render(up.service, self._running(up)))
                    case StepAction.UNPIN:
                        self.agent.ledger.release(up.service, step.names)
                        return self._apply(up.service, None, self._render(up.service, self._running(up)))
        except ReconcilerError as exc:
            if exc.reason == "DISK_FULL":
                raise
            return False, str(exc)
        return False, f"unknown action {step.action}"  # pragma: no cover - the schema allows no other

    def _forget(self, service: str, name: str = "") -> None:
        """A step's scratch directory (or, without ``name``, all of the service's) removed."""
        d = self.agent.cfg.state_dir / "upgrade" / self.commit[:12] / (service or "post")
        shutil.rmtree(d / name if name else d, ignore_errors=True)

    def _running(self, up: Upgrade) -> str:
        """The commit the service's running version was rendered from (the new one once started)."""
        rec = self.agent.ledger.service(up.service)
        if rec is not None and rec.running is not None:
            return rec.running.commit
        begun = self.agent.ledger.upgrade(self.commit, up.service)
        return begun[0] if begun and begun[0] else self.commit

    def _pull_first(self, service: str) -> str:
        """A docker service's new image, on the engine before its first step runs (often a
        stop): a pull that fails fails the upgrade with nothing stopped. Why it failed, or ''."""
        if self.repo.driver_of(self.node, service) != "docker":
            return ""
        try:
            desired = Desired(self.node, self.commit, (self._render(service, self.commit),))
            failed = [p for p in pull_images(desired, self.agent.drivers(desired)) if p.result == "failed"]
        except ReconcilerError as exc:
            return str(exc)
        return f"{failed[0].detail}; nothing was stopped for it" if failed else ""

    def _render(self, service: str, commit: str) -> DesiredService:
        from reconciler.drivers.process import check_account
        from reconciler.render.node import render_node

        repo = self.repo if commit == self.commit else _load(self.agent, commit)
        if commit != self.commit:
            self.agent.keeper.vouch(self.agent.revision(commit))  # only a verified commit is rendered
        desired = render_node(repo, self.node, commit, check_account, pinned=self.agent.ledger.held())
        svc = desired.by_name().get(service)
        if svc is None:
            raise BadInput(f"node {self.node} does not run {service} at {commit[:12]}", reason="UNKNOWN_SERVICE")
        return replace(svc, origin=commit)

    def _apply(self, service: str, kind: ActionKind | None, svc: DesiredService | None) -> tuple[bool, str]:
        """``kind`` for this service (a stop, a reload), or whatever the planner says it needs to
        run ``svc`` (a start after a stop, a reload for a pinned value)."""
        drivers = self.agent.drivers(Desired(self.node, self.commit, (svc,) if svc else ()))
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
            planned = make_plan(Desired(self.node, self.commit, (svc,)), observe(self.node, drivers))
            actions = tuple(a for a in planned.actions if a.service == service)
        results = apply_plan(Plan(self.node, self.commit, actions), drivers, self.agent.ledger,
                             redact=self.agent.redact)
        failed = [r for r in results if r.state is ResultState.FAILED]
        if failed:
            output = self.agent.last_output(service)
            return False, failed[0].detail + (f" | output: {output}" if output else "")
        return True, "; ".join(f"{r.action}" + (f" ({r.reason})" if r.reason and r.action is not ActionKind.STOP
                                                   else "") for r in results) or "nothing to do"

    def _command(self, service: str, command: str, timeout: float, name: str) -> tuple[bool, str]:
        """A shell command in a directory of the new version's rendered files, with a clean
        environment plus the service's own and what says where it runs. It runs in its own
        session under a small wrapper that writes its pid first and its exit status last, so
        an agent killed meanwhile finds, on its next run, a command still running (waited for)
        or finished (its status used): a step is never run twice because the agent died."""
        d = self.agent.cfg.state_dir / "upgrade" / self.commit[:12] / (service or "post") / name
        mark = f"{self.commit}/{service}/{name}"
        status = self._finished(d, mark, timeout, lambda: self._remove_container(service, name))
        if status is None:
            if (d / "started").exists():
                return False, INTERRUPTED
            shutil.rmtree(d, ignore_errors=True)
            svc = self._render(service, self.commit) if service else None
            # Private: it holds the rendered files (secret ones too) and the command's raw output.
            d.mkdir(parents=True, mode=0o700, exist_ok=True)
            d.chmod(0o700)
            (d / "files").mkdir(exist_ok=True)
            for f in svc.files if svc else ():
                atomic_write(d / "files" / f.path, f.content, f.mode)
            where = {"RECONCILER_NODE": self.node, "RECONCILER_SERVICE": service, "RECONCILER_COMMIT": self.commit,
                     "RECONCILER_STEP": name}
            env = {**clean_env(), **(dict(svc.runtime.env) if svc else {}), **where,
                   "RECONCILER_STEP_ID": mark, "RECONCILER_STEP_COMMAND": command}
            if svc is not None and svc.runtime.driver == "docker":  # in a one-off container of the new image
                from reconciler.drivers import dockerstep  # the docker SDK only where it is used

                env.update(dockerstep.engine_env(), PYTHONPATH=str(Path(__file__).resolve().parents[2]),
                           RECONCILER_STEP_SPEC=json.dumps(dockerstep.spec(svc, self.node, name, d / "files",
                                                                           command, where)),
                           RECONCILER_STEP_COMMAND=f"{shlex.quote(sys.executable)} -m reconciler.drivers.dockerstep")
            faults.point("spawn", f"upgrade step {service}/{name}")
            proc = subprocess.Popen(["/bin/sh", "-c", WRAPPER], cwd=d / "files", env=env, start_new_session=True,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                self._remove_container(service, name)
                return False, f"timed out after {timeout:g}s"
            status = self._finished(d, mark, 0, lambda: None)
            if status is None:
                return False, "the command's wrapper ended without an exit status"
        try:
            raw = (d / "output").read_bytes()
        except FileNotFoundError:
            raw = b""
        text = raw.decode(errors="replace")
        clean = self.agent.redact(text)  # whole, then cut: a value cut in half would match none
        if clean != text:  # what stays on disk after the step: names, not values
            atomic_write(d / "output", clean.encode(), 0o600)
        output = clean[-OUTPUT:].strip()
        if status != 0:
            return False, f"exit {status}" + (f": {output[-500:]}" if output else "")
        return True, output[-200:] or "ok"

    def _remove_container(self, service: str, name: str) -> None:
        """A docker service's step container, removed once its command is killed."""
        if service and self.repo.driver_of(self.node, service) == "docker":
            from reconciler.drivers import dockerstep

            dockerstep.remove(dockerstep.step_name(self.node, service, name))

    @staticmethod
    def _finished(d: Path, mark: str, timeout: float, killed: Callable[[], None]) -> int | None:
        """The exit status a step's command left, waiting (up to ``timeout``) for one that a
        killed agent left running; None when it never finished (or never started)."""
        started = d / "started"
        if started.exists() and not (d / "status").exists():
            try:
                pid = int(started.read_text().strip())
            except ValueError:
                pid = 0
            deadline = time.monotonic() + timeout
            while pid and _runs(pid, mark) and time.monotonic() < deadline:
                time.sleep(0.1)
            if pid and _runs(pid, mark):  # past its timeout: stopped, never left running beside a new run
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                while _runs(pid, mark):
                    time.sleep(0.05)
                killed()
        try:
            return int((d / "status").read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    # taking it back ----------------------------------------------------------------------
    def undo(self, why: str) -> list[str]:
        """A step failed here or elsewhere: each upgrade this node has under way is taken back.
        Command steps' ``rollback`` run (newest first), pins this upgrade made are released, and
        the service runs the version it ran before. Returns what the note says about it."""
        ledger = self.agent.ledger
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
                    with self.agent.state.services_lock(wait=60):
                        ok, out = self._command(up.service, step.rollback, step.timeout, f"{step.name}-rollback")
                    detail = f"rollback {'ok' if ok else 'failed'}: {out}"
                    events.append(f"upgrade of {up.service}: step {step.name} rolled back on {self.node} ({detail})")
                ledger.step(self.commit, k, replace(rec, status=StepStatus.UNDONE, detail=f"{rec.detail}; {detail}"
                                                    if rec.detail else detail))
            ledger.release(up.service, commit=self.commit)
            back = begun[0]
            if back:
                try:
                    with self.agent.state.services_lock(wait=60):
                        ok, detail = self._apply(up.service, None, self._render(up.service, back))
                except ReconcilerError as exc:
                    ok, detail = False, str(exc)
                events.append(f"upgrade of {up.service} taken back ({why}): {up.from_version} put back from "
                              f"{back[:12]}, {'ok' if ok else 'failed'}: {detail}")
            ledger.end_upgrade(self.commit, up.service, "undone")
        for e in events:
            log.warning("%s: %s", self.node, e)
        return events

    # deployment-wide post steps ----------------------------------------------------------
    def post(self, fleet: FleetView, note: Callable[[], None]) -> tuple[str, str]:
        """Post steps due on this node: run those whose services are applied fleet-wide.
        Returns (waiting reason, failure detail); both empty when none is left."""
        due = post_steps_due(self.repo, self.node, self.fleet_upgrades,
                             lambda n: n == self.node or fleet.reached(n, self.commit) is not None,
                             self.repo.members, holding(self.repo, self.base))
        done = {r.step: r for r in self.agent.ledger.steps(self.commit) if r.service == ""}
        for k, (post, waiting) in enumerate(due):
            rec = done.get(post.name)
            if rec is not None and rec.status in (StepStatus.DONE, StepStatus.FAILED):
                continue
            if waiting:
                return f"post_upgrade {post.name} waits for {_shown(waiting)} to apply {self.commit[:12]}", ""
            if post.action is StepAction.REBOOT:
                waits, failed = self._reboot(k, post, rec, fleet, note)
                if waits or failed:
                    return waits, failed
                continue
            started = time.time()
            self.agent.ledger.step(self.commit, k, StepRecord("", post.name, Scope.NODE, StepStatus.STARTED, started))
            ok, detail = self._post(post)
            detail = self.agent.redact(detail)
            self._forget("", post.name)
            self.agent.ledger.step(self.commit, k, StepRecord("", post.name, Scope.NODE,
                                                              StepStatus.DONE if ok else StepStatus.FAILED, started,
                                                              time.time(), detail))
            note()
            if not ok:
                return "", f"post_upgrade {post.name} failed on {self.node}: {detail}"
        return "", ""

    def _reboot(self, k: int, post: PostStep, rec: StepRecord | None, fleet: FleetView,
                note: Callable[[], None]) -> tuple[str, str]:
        """This node's reboot for a reboot post step, once every node before its batch (wave
        order) noted its own reboot done. The step is noted ``started`` with the boot id before
        the reboot command runs, and ``done`` once the node runs under another boot id (the
        undrain hook run first). Returns (waiting reason, failure detail)."""
        host = self.agent.cfg.host.access()
        ledger, boot = self.agent.ledger, host.boot_id()
        if rec is not None and rec.status is StepStatus.STARTED:
            before = rec.detail.removeprefix("rebooting: boot id ")
            if before != boot:
                detail = f"rebooted (boot id {before} -> {boot})"
                if post.undrain:
                    failed = _host_command(host, post.undrain, post.timeout, self.agent.redact)
                    detail += "; undrain " + (f"failed: {failed}" if failed else "ok")
                ledger.step(self.commit, k, replace(rec, status=StepStatus.DONE, ended=time.time(), detail=detail))
                note()
                return "", ""
            # Same boot: the reboot has not happened (or the run that noted it died first): again.
        else:
            order = [n for _, m in plan_rollout(self.repo.settings, self.repo.nodes, self.repo.members).batches()
                     for n in m]
            before_me = reboot_turn(post, post_targets(self.repo, post, self.repo.members), order, self.node)
            progress = self._progress(fleet)
            waiting = [n for n in before_me if progress.get(n, {}).get(("", post.name)) != StepStatus.DONE]
            if waiting:
                return f"post_upgrade {post.name} waits for {_shown(waiting)} to reboot", ""
            shut = closed(ActionKind.REBOOT, self.node, self.repo.windows, self.agent.clock())
            if shut is not None:  # a maintenance window gates reboots here: its turn waits for it
                return f"post_upgrade {post.name}: reboot {shut}", ""
            started = time.time()
            failed = _host_command(host, post.drain, post.timeout, self.agent.redact) if post.drain else ""
            if failed:
                why = f"drain failed: {failed}"
                ledger.step(self.commit, k, StepRecord("", post.name, Scope.NODE, StepStatus.FAILED, started,
                                                       time.time(), why))
                note()
                return "", f"post_upgrade {post.name} failed on {self.node}: {why}"
            ledger.step(self.commit, k, StepRecord("", post.name, Scope.NODE, StepStatus.STARTED, started,
                                                   detail=f"rebooting: boot id {boot}"))
            note()  # the fleet sees this node go down for its reboot before it does
        faults.point("spawn", f"post_upgrade reboot {post.name}")
        failed = _host_command(host, host.reboot_command, 120, self.agent.redact)
        if failed:
            why = f"reboot command failed: {failed}"
            ledger.step(self.commit, k, StepRecord("", post.name, Scope.NODE, StepStatus.FAILED,
                                                   rec.started if rec else started, time.time(), why))
            note()
            return "", f"post_upgrade {post.name} failed on {self.node}: {why}"
        return f"post_upgrade {post.name}: rebooting (boot id {boot[:8]})", ""

    def _post(self, post: PostStep) -> tuple[bool, str]:
        mine = set(self.repo.services_of(self.node))
        try:
            with self.agent.state.services_lock(wait=60):
                if post.action is StepAction.COMMAND:
                    return self._command("", post.command, post.timeout, post.name)
                out = []
                for service in post.targets:
                    if service not in mine:
                        continue
                    # At the commit the service runs: the branch may have moved past this upgrade.
                    rec = self.agent.ledger.service(service)
                    at = rec.running.commit if rec is not None and rec.running is not None else self.commit
                    if post.action is StepAction.UNPIN:
                        self.agent.ledger.release(service, post.names)
                        ok, detail = self._apply(service, None, self._render(service, at))
                    else:
                        ok, detail = self._apply(service, ActionKind.RELOAD, self._render(service, at))
                    out.append(f"{service}: {detail}")
                    if not ok:
                        return False, "; ".join(out)
                return True, "; ".join(out) or "no such service here"
        except ReconcilerError as exc:
            if exc.reason == "DISK_FULL":
                raise
            return False, str(exc)


@dataclass(frozen=True)
class Owed:
    """An upgrade this node owes at the head: the head moved past the commit that brought a
    service's new version with steps before this node ran them (it never saw that commit, or
    was mid-upgrade). ``first``: that commit, to run before the head; ``kept``: services held
    at the version they run because their upgrade failed or was halted here (a new version
    without its steps would skip a migration), with why."""

    first: str = ""
    kept: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # service -> (commit it runs, why)


def owed(agent: Agent, head: str, repo: DeploymentRepo) -> Owed:
    """What this node owes before it may take ``head``'s version of each service with steps."""
    node = agent.cfg.node
    if node not in repo.nodes or not any(repo.services[s].upgrade for s in repo.services_of(node)):
        return Owed()
    base = stage_bases(agent, head, repo)
    skip = set(upgraded(repo, base)) | set(held_back(repo, node, base)) | {p.service for p in agent.ledger.pins()}
    first: list[tuple[int, str]] = []
    kept: dict[str, tuple[str, str]] = {}
    for name in repo.services_of(node):
        svc = repo.services[name]
        if not svc.upgrade or name in skip:
            continue
        running, at = _running_version(agent, name)
        target = version_of(svc)
        if not running or running == target or not _changed_since(agent, at, name, svc):
            continue
        depth, intro = 0, head
        for back, (commit, old) in enumerate(_ancestors(agent, head), start=1):
            if name not in old.services or version_of(old.services[name]) != target:
                break
            depth, intro = back, commit
        if intro == head or name not in upgraded(_load(agent, intro), stage_bases(agent, intro, _load(agent, intro))):
            continue  # no commit upgrades it with steps: as before, the head's version
        verdict = agent.ledger.verdict(intro)
        if verdict in (Verdict.FAILED, Verdict.HALTED):
            kept[name] = (at, f"{name} kept at {running}: its upgrade to {target} ({intro[:12]}) was {verdict} here; "
                              "`reconciler retry`, or a new version, upgrades it")
        else:
            first.append((depth, intro))
    return Owed(max(first)[1] if first else "", kept)  # the oldest first


def _changed_since(agent: Agent, commit: str, name: str, svc: ServiceDef) -> bool:
    """``svc`` is a new version of what ``commit`` said (True when that cannot be read)."""
    try:
        then = _load(agent, commit).services.get(name) if commit else None
    except ReconcilerError:
        return True
    return then is None or version_changed(then, svc)


def _running_version(agent: Agent, service: str) -> tuple[str, str]:
    """(version, commit) the service runs here: as last applied, or, stopped by an upgrade under
    way, the version that upgrade started from."""
    rec = agent.ledger.service(service)
    if rec is not None and rec.running is not None:
        try:
            return version_of(_load(agent, rec.running.commit).services.get(service)), rec.running.commit
        except ReconcilerError:
            return "", ""
    prior = agent.ledger.upgrade_under_way(service, "")
    return (prior[2], prior[1]) if prior is not None else ("", "")


def _host_command(host: HostAccess, command: str, timeout: float, redact: Redactor = NO_SECRETS) -> str:
    """A reboot step's hook or reboot command on the host: "" when it succeeded, else why not
    (its output's end, a timeout, a command that cannot start): a failed step, never a traceback."""
    try:
        done = host.sh(command, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:g}s"
    except OSError as exc:
        return str(exc)
    if done.returncode == 0:
        return ""
    return redact((done.stderr or done.stdout).strip())[-200:] or f"exit {done.returncode}"


def _shown(nodes: Sequence[str]) -> str:
    return ", ".join(nodes[:5]) + (f" and {len(nodes) - 5} more" if len(nodes) > 5 else "")


WALK = 200  # ancestors read at most to find a node's base (stages a fleet is upgraded by are few)


def stage_bases(agent: Agent, commit: str, repo: DeploymentRepo) -> Bases:
    """Each node's base for ``commit``, read from the node's mirror (``bases_in``)."""
    return bases_in(agent.source.repo, commit, repo, lambda c: _load(agent, c))


def bases_in(git: pygit2.Repository, commit: str, repo: DeploymentRepo,
             load: Callable[[str], DeploymentRepo]) -> Bases:
    """Each node's base for ``commit``: its parent, or, past commits staged to other nodes, the
    nearest ancestor that took the node in. Read only when the repo has upgrade steps or
    stages: most commits of most repos have neither."""
    if not repo.stages and not any(svc.upgrade for svc in repo.services.values()):
        return {}
    return bases(repo.nodes, _walk(git, commit, load))


def _ancestors(agent: Agent, commit: str) -> Iterator[tuple[str, DeploymentRepo]]:
    return _walk(agent.source.repo, commit, lambda c: _load(agent, c))


def _walk(git: pygit2.Repository, commit: str,
          load: Callable[[str], DeploymentRepo]) -> Iterator[tuple[str, DeploymentRepo]]:
    """The commit's first parent, its first parent, ...: each loaded (a commit that does not
    load ends the walk: no version to compare there, no upgrade)."""
    import pygit2  # here, not at the top: an idle agent never walks history (see ``source``)

    try:
        current = git.revparse_single(commit).peel(pygit2.Commit)
    except (KeyError, ValueError, pygit2.GitError):
        return
    for _ in range(WALK):
        try:
            parents = current.parent_ids
            if not parents:
                return
            parent = git.get(parents[0])
            if parent is None:
                return
            current = parent.peel(pygit2.Commit)
            loaded = load(str(current.id))
        except (KeyError, ValueError, AttributeError, pygit2.GitError, ReconcilerError):
            return
        yield str(current.id), loaded


_CACHE: dict[tuple[str, str], DeploymentRepo] = {}


def _load(agent: Agent, commit: str) -> DeploymentRepo:
    key = (os.fspath(agent.cfg.state_dir), commit)
    hit = _CACHE.get(key)
    if hit is None:
        if len(_CACHE) > 32:
            _CACHE.clear()
        hit = _CACHE[key] = agent.load(commit)
    else:
        agent.learn(hit)  # another agent of this node decrypted it: this one cleans its output of it too
    return hit


def _runs(pid: int, mark: str) -> bool:
    """The process ``pid`` is alive and is the step's wrapper (not a reused pid)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"RECONCILER_STEP_ID={mark}".encode() in environ.split(b"\0")
