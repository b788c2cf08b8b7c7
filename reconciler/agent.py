"""Wiring and the loop: one place that builds the stages and runs them in order.

``reconcile_once`` is one pass: lock, poll (fetch only on a move), load, render, observe, plan,
apply, report. ``run_daemon`` schedules it with a per-node offset and jitter, backs off while
the remote fails, and supervises the services between polls (restart on crash, with backoff).
"""

from __future__ import annotations

import hashlib
import json
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pygit2

from .apply import apply_plan
from .config import AgentConfig
from .drivers import Driver, HostAccess, drivers_in_use, make_driver
from .errors import BadInput, Busy, ReconcilerError
from .model import ActionKind, Desired, Plan, Report, ResultState, RunState
from .observe import observe
from .plan import plan as make_plan
from .plan import stage
from .report import Reporter
from .source import Source
from .state import State, atomic_write
from .trust import Decision, Gate, Policy, TrustError, TrustRoot, load_root, parse_revoked, tree_file

if TYPE_CHECKING:
    from .repo import DeploymentRepo
    from .rollout import FleetView
    from .rollout import Verdict as RolloutVerdict

log = logging.getLogger("reconciler.agent")

APPLIED_COMMIT = "applied_commit"
APPLIED_HASHES = "applied_hashes"
HIGH_WATER = "high_water"  # the last commit this node acted on: anti-rollback's reference
SIGNER = "high_water_signer"
REFUSED = "refused_head"
FAILED_COMMIT = "failed_commit"  # not retried until the branch moves or `reconciler retry`
TRUST_ORIGIN = "trust_origin"


@dataclass(frozen=True)
class RunResult:
    """What one pass did. ``report`` is None when nothing changed and no note was needed."""

    node: str
    commit: str
    fetched: bool
    plan: Plan | None = None
    report: Report | None = None
    pushed: bool = True
    interrupted: tuple[tuple[str, str, str], ...] = ()
    error: ReconcilerError | None = None
    waiting: str = ""  # a rollout holds this node back: why

    @property
    def exit_code(self) -> int:
        if self.error is not None:
            return self.error.exit_code
        if self.report is not None and self.report.state not in (RunState.APPLIED, RunState.REBOOTING,
                                                                 RunState.STAGED):
            return 1  # failed here, or halted by a failure elsewhere
        return 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "commit": self.commit,
            "fetched": self.fetched,
            "plan": self.plan.to_dict() if self.plan else None,
            "report": self.report.to_dict() if self.report else None,
            "note_pushed": self.pushed,
            "interrupted": [list(i) for i in self.interrupted],
            "error": {"reason": self.error.reason, "message": str(self.error)} if self.error else None,
            "waiting": self.waiting,
        }


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def drivers_for(cfg: AgentConfig, desired: Desired | None) -> dict[str, Driver]:
    """Drivers that hold services of this node (they may have some to stop), plus what the slice names."""
    names = drivers_in_use(cfg.state_dir) | ({s.runtime.driver for s in desired.services} if desired else set())
    return {n: make_driver(n, cfg.state_dir, cfg.node, host_access(cfg)) for n in sorted(names)}


def host_access(cfg: AgentConfig) -> HostAccess:
    h = cfg.host
    return HostAccess(h.root, h.systemctl, h.exec, h.reboot_command, h.boot_id_file)


@dataclass
class Agent:
    """One node's agent: the stages wired together over one state dir."""

    cfg: AgentConfig
    progress: bool | None = None
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    state: State = field(init=False)
    source: Source = field(init=False)
    reporter: Reporter = field(init=False)
    gate: Gate = field(init=False)

    def __post_init__(self) -> None:
        t = self.cfg.trust
        node_root = load_root(t.allowed_signers, t.gpg_home, t.revoked)
        if node_root.empty:
            from .errors import ConfigError

            raise ConfigError("no trust root: set trust.allowed_signers and/or trust.gpg_home "
                              "(--allowed-signers / --gpg-home); the agent applies only signed commits")
        self.state = State(self.cfg.state_dir)
        self.gate = Gate(self._adopted_root(node_root), Policy(t.policy), self.clock, node_root.revoked)
        self.source = Source(
            self.cfg.remote, self.cfg.branch, self.state.mirror,
            ssh_command=self.cfg.ssh_command, progress=self.progress,
        )
        self.reporter = Reporter(self.source, self.state, self.cfg.node)

    def close(self) -> None:
        self.state.close()

    # trust -----------------------------------------------------------------------------
    @property
    def _trust_dir(self) -> Path:
        return self.cfg.state_dir / "trust"

    def _root_id(self) -> str:
        r = self.gate.root
        return hashlib.sha256(repr((r.signers, sorted(r.revoked), str(r.gpg_home), r.origin,
                                    str(self.gate.policy))).encode()).hexdigest()[:16]

    def _adopted_root(self, node_root: TrustRoot) -> TrustRoot:
        """A root rotated through the repo earlier, kept in the state dir; else the node's own."""
        from .sshsig import parse_allowed_signers

        origin = self.state.get(TRUST_ORIGIN)
        signers = self._trust_dir / "allowed_signers"
        if not origin or not signers.exists():
            return node_root
        revoked = self._trust_dir / "revoked"
        return TrustRoot(
            parse_allowed_signers(signers.read_text(), str(signers)),
            (parse_revoked(revoked.read_text()) if revoked.exists() else frozenset()) | node_root.revoked,
            node_root.gpg_home, origin,
        )

    def _adopt(self, decision: Decision) -> None:
        """Persist what a verified head established: the high-water mark, its signer, a rotated root."""
        if decision.root.origin != self.gate.root.origin:
            commit = decision.root.origin.removeprefix("repo@")
            for name in ("allowed_signers", "revoked"):
                blob = self._tree_file(commit, f"trust/{name}")
                atomic_write(self._trust_dir / name, blob or b"", 0o600)
            self.state.put(TRUST_ORIGIN, decision.root.origin)
            log.warning("%s: trust root rotated by %s", self.cfg.node, commit[:12])
            self.gate = self.gate.with_root(decision.root)
        self.state.put(HIGH_WATER, decision.head)
        if decision.signer is not None:
            self.state.put(SIGNER, json.dumps(self._signer_dict(decision.signer.to_dict())))

    @staticmethod
    def _signer_dict(verdict: dict[str, Any]) -> dict[str, str]:
        return {k: str(verdict[k]) for k in ("format", "principal", "fingerprint")}

    def _tree_file(self, commit: str, path: str) -> bytes | None:
        return tree_file(self.source.repo, commit, path)

    def high_water(self) -> str | None:
        """The last commit this node acted on; after the state dir was lost, the newest commit
        that this node's own notes (on the remote, written only by it) say it applied."""
        mark = self.state.get(HIGH_WATER)
        if mark:
            return mark
        newest: tuple[str, str] | None = None
        try:
            notes = list(self.source.repo.notes(self.reporter.ref))  # type: ignore[call-arg]  # stub lacks ref
        except (KeyError, pygit2.GitError):
            return None
        for note in notes:
            try:
                data = json.loads(note.message)
            except (json.JSONDecodeError, TypeError):
                continue
            # The mark moves for every verified commit the node acted on, whatever came of it.
            if not isinstance(data, dict) or data.get("state") == "refused":
                continue
            if newest is None or str(data.get("time", "")) > newest[0]:
                newest = (str(data.get("time", "")), str(note.annotated_id))
        if newest is None:
            return None
        self.state.put(HIGH_WATER, newest[1])
        log.warning("%s: high-water mark %s recovered from this node's notes", self.cfg.node, newest[1][:12])
        return newest[1]

    def _repo_policy(self, *commits: str | None) -> Policy:
        """The strictest policy the repo asks for at these commits (it can only tighten)."""
        from .yamlfile import safe_load  # bounded like every YAML read from a commit

        policies = [Policy.HEAD]
        for commit in commits:
            raw = self._tree_file(commit, "reconciler.yaml") if commit else None
            try:
                data = safe_load(raw, "reconciler.yaml") if raw else None
                wanted = data.get("trust", {}).get("policy") if isinstance(data, dict) else None
                if wanted:
                    policies.append(Policy(wanted))
            except (BadInput, ValueError, AttributeError):
                continue  # a bad file is reported by validation; it cannot loosen anything
        return Policy.strictest(*policies)

    def resume_after_reboot(self, events: list[str]) -> str | None:
        """A reboot this node started for a commit: once the boot id changed, run the undrain
        hook and go on (returns None); before that, the commit it waits for."""
        if "host" not in drivers_in_use(self.cfg.state_dir):
            return None
        from .drivers.host import HostDriver

        driver = make_driver("host", self.cfg.state_dir, self.cfg.node, host_access(self.cfg))
        assert isinstance(driver, HostDriver)
        pending = driver.pending_reboot()
        if pending is None:
            return None
        boot = driver.host.boot_id()
        if boot == pending["boot_id"]:
            log.warning("%s: reboot pending for %s", self.cfg.node, pending["commit"][:12])
            return str(pending["commit"])
        detail = f"rebooted for {pending['commit'][:12]} (boot id {pending['boot_id'][:8]} -> {boot[:8]})"
        if pending.get("undrain"):
            import subprocess

            done = subprocess.run(["/bin/sh", "-c", pending["undrain"]], capture_output=True, text=True, timeout=1800)
            detail += "; undrain hook " + ("ok" if done.returncode == 0 else f"failed: {done.stderr.strip()[-200:]}")
        driver.finish_reboot(pending)
        self.state.record(pending["service"], pending["commit"], pending["hash"], "reboot", "ok", "resumed", detail)
        events.append(detail)
        log.warning("%s: %s", self.cfg.node, detail)
        return None

    def decide(self, commit: str) -> Decision:
        base = self.high_water()
        return self.gate.decide(self.source.repo, commit, base, self._repo_policy(base, commit))

    # stages --------------------------------------------------------------------------
    def load(self, commit: str) -> DeploymentRepo:
        # Imported here: templates and schemas are not needed on a poll that finds nothing new.
        from .repo import load_repo
        from .tree import GitTree

        return load_repo(GitTree(self.source.repo, commit))

    def desired(self, commit: str, repo: DeploymentRepo | None = None) -> Desired:
        """The node's slice at ``commit``, with pinned services at their pinned commit."""
        from .render import render_node

        desired = render_node(repo or self.load(commit), self.cfg.node, commit)
        pins = self.pins()
        if not pins:
            return desired
        services = []
        for svc in desired.services:
            pin = pins.get(svc.name)
            if pin is not None:
                old = render_node(self.load(pin["commit"]), self.cfg.node, pin["commit"]).by_name()
                svc = old.get(svc.name, svc)
            services.append(svc)
        return Desired(desired.node, desired.commit, tuple(services))

    # pins ------------------------------------------------------------------------------
    def pins(self) -> dict[str, dict[str, str]]:
        rows = self.state.db.execute("SELECT key, value FROM kv WHERE key LIKE 'pin:%'").fetchall()
        return {str(k)[4:]: json.loads(v) for k, v in rows}

    def unpin(self, service: str) -> bool:
        cur = self.state.db.execute("DELETE FROM kv WHERE key=?", (f"pin:{service}",))
        return cur.rowcount > 0

    def _release_pins(self, head: str, events: list[str]) -> None:
        """A pin holds until the branch moves past the commit it was made on (a fix, a revert)."""
        for service, pin in self.pins().items():
            if pin["head"] != head:
                self.unpin(service)
                events.append(f"pin of {service} at {pin['commit'][:12]} released: the branch moved to {head[:12]}")

    def previous_good(self, service: str) -> str:
        """The commit of the service's last good version before the one it runs now."""
        rows = self.state.history(service, limit=500)
        current = next((r.hash for r in rows if r.result == "ok" and r.hash), None)
        for r in rows:
            if r.result == "ok" and r.hash and r.hash != current and r.action not in ("stop", "revive"):
                return r.commit
        raise BadInput(f"service {service}: no earlier good version in this node's history")

    def rollback(self, service: str, to: str | None = None) -> RunResult:
        """Put one service back to an earlier commit's version, here and now, without the remote,
        and pin it there (the note says so) until the branch moves on or `unpin`."""
        from .trust import verify_commit

        with self.state.lock(wait=30):
            head = self.state.get(HIGH_WATER)
            if head is None:
                raise BadInput("this node has applied nothing yet: nothing to roll back")
            target = to or self.previous_good(service)
            try:
                target = str(self.source.repo.revparse_single(target).peel(pygit2.Commit).id)
            except (KeyError, ValueError, pygit2.GitError) as exc:
                raise BadInput(f"commit {target!r} is not in this node's mirror") from exc
            verdict = verify_commit(self.source.repo, target, self.gate.root, self.clock())
            if not verdict.ok:
                raise TrustError(f"commit {target[:12]}: {verdict.message}", verdict.reason, [verdict])
            old = self.desired(target).by_name()
            if service not in old:
                raise BadInput(f"service {service} is not on node {self.cfg.node} at {target[:12]}")
            self.state.put(f"pin:{service}", json.dumps({"commit": target, "head": head, "hash": old[service].hash}))
            return self._converge(head, fetched=False, interrupted=(), events=[
                f"rollback of {service} to {target[:12]} by an operator"], signer=None, only={service},
                instantiate=True)

    # fleet -----------------------------------------------------------------------------
    def fleet_view(self) -> FleetView:
        """Every node's notes, fetched now (only refs/notes/reconciler/*, only when a rollout
        waits on them); this node's own from its local ref, the freshest."""
        from .rollout import FleetView, Note

        prefix = "refs/reconciler/fleet/"
        self.source.run("fetch", "--no-tags", "--prune", self.source.url,
                        f"+refs/notes/reconciler/*:{prefix}*", what="notes fetch from")
        repo = self.source.repo
        notes: dict[str, tuple[Note, ...]] = {}
        refs = {r.removeprefix(prefix): r for r in repo.references if r.startswith(prefix)}
        refs[self.cfg.node] = self.reporter.ref
        for node, ref in sorted(refs.items()):
            found = []
            try:
                entries = list(repo.notes(ref))  # type: ignore[call-arg]  # stub lacks ref
            except (KeyError, pygit2.GitError):
                entries = []
            for entry in entries:
                try:
                    data = json.loads(entry.message)
                except (json.JSONDecodeError, TypeError):
                    continue
                found.append(Note.parse(node, str(entry.annotated_id), data))
            notes[node] = tuple(found)

        def descends(a: str, b: str) -> bool:
            from .trust import is_descendant

            return is_descendant(repo, a, b)

        return FleetView(notes, descends)

    def rollout_gate(self, repo: DeploymentRepo, commit: str) -> RolloutVerdict:
        from .rollout import Verdict, decide, plan_rollout

        rollout = plan_rollout(repo.settings, repo.nodes, repo.members)
        if not rollout.enabled:
            return Verdict(True)
        own = self.reporter.read(commit)
        if own is not None and own.get("state") not in ("halted",):
            return Verdict(True, reason="already started")  # started it: finish it whatever others do
        return decide(rollout, self.cfg.node, commit, self.fleet_view(), time.time())

    def head(self, fetch: bool, rev: str | None) -> tuple[str, bool]:
        if rev is not None:
            try:
                return str(self.source.repo.revparse_single(rev).peel(pygit2.Commit).id), False
            except (KeyError, ValueError, pygit2.GitError) as exc:
                raise BadInput(f"revision {rev!r} is not in the node's mirror (fetch first)") from exc
        if fetch:
            return self.source.update()
        local = self.source.local_head()
        if local is None:
            raise BadInput("the node's mirror is empty: run `reconciler agent --once` first")
        return local, False

    def _unchanged(self, commit: str) -> bool:
        """Cheap no-op check: same commit as last applied, every service running that slice."""
        if self.state.get(APPLIED_COMMIT) != commit:
            return False
        hashes: dict[str, str] = json.loads(self.state.get(APPLIED_HASHES) or "{}")
        seen = observe(self.cfg.node, drivers_for(self.cfg, None)).by_name()
        if set(seen) != set(hashes):
            return False
        return all(o.running and not o.drifted and o.hash == hashes[n] for n, o in seen.items())

    # the loop ------------------------------------------------------------------------
    def plan(self, *, fetch: bool = True, rev: str | None = None) -> tuple[Plan, bool]:
        with self.state.lock(wait=30):
            commit, fetched = self.head(fetch, rev)
            self.decide(commit)  # a refusal is raised: nothing unverified is even rendered
            desired = self.desired(commit)
            observed = observe(self.cfg.node, drivers_for(self.cfg, desired))
            return make_plan(desired, observed), fetched

    def reconcile_once(self, *, fetch: bool = True, rev: str | None = None, instantiate: bool = False,
                       only: set[str] | None = None) -> RunResult:
        """One pass. ``instantiate``: an operator's `reconciler apply`, which also applies what
        ``apply: manual`` staged (``only``: just these services)."""
        return self._reconcile(fetch=fetch, rev=rev, only=only, instantiate=instantiate)

    def _reconcile(self, *, fetch: bool, rev: str | None, only: set[str] | None, instantiate: bool) -> RunResult:
        with self.state.lock(wait=30 if rev else 0):
            self.reporter.recover()
            commit, fetched = self.head(fetch, rev)
            interrupted = tuple(self.state.interrupted())
            for c, s, a in interrupted:
                log.warning("%s: a previous run was interrupted during %s %s at %s; re-planning",
                            self.cfg.node, a, s, c[:12])
            self.state.clear_interrupted()
            events = [f"interrupted run: {a} {s} at {c[:12]}" for c, s, a in interrupted]
            waiting = self.resume_after_reboot(events)
            if waiting is not None:
                return RunResult(self.cfg.node, waiting, fetched, pushed=self.reporter.push())
            if not interrupted and not events and self.state.get(HIGH_WATER) == commit and self._unchanged(commit):
                pushed = self.reporter.push()
                return RunResult(self.cfg.node, commit, fetched, pushed=pushed)
            refused = json.loads(self.state.get(REFUSED) or "{}")
            if refused.get("commit") == commit and refused.get("root") == self._root_id():
                # judged under this same root and noted already: no work, no new note
                exc = TrustError(refused["message"], refused["reason"])
                return RunResult(self.cfg.node, commit, fetched, pushed=self.reporter.push(), error=exc)
            try:
                decision = self.decide(commit)
            except TrustError as exc:
                report = Report(self.cfg.node, commit, RunState.REFUSED, now_iso(), reason=exc.reason,
                                error=str(exc), verdicts=tuple(v.to_dict() for v in exc.verdicts if not v.ok))
                if exc.reason != "KEY_NOT_YET_VALID":  # that one may pass later: judge again
                    self.state.put(REFUSED, json.dumps({"commit": commit, "reason": exc.reason, "message": str(exc),
                                                        "root": self._root_id()}))
                self._finish(report)
                log.error("%s: refused %s: %s", self.cfg.node, commit[:12], exc)
                return RunResult(self.cfg.node, commit, fetched, report=report,
                                 pushed=self.reporter.push(), interrupted=interrupted, error=exc)
            self._adopt(decision)
            signer = json.loads(self.state.get(SIGNER) or "null")
            if self.state.get(FAILED_COMMIT) == commit and not interrupted:
                log.warning("%s: %s failed here before; not retried until a new commit or `reconciler retry`",
                            self.cfg.node, commit[:12])
                return RunResult(self.cfg.node, commit, fetched, pushed=self.reporter.push())
            self._release_pins(commit, events)
            try:
                repo = self.load(commit)
                verdict = self.rollout_gate(repo, commit)
                if not verdict.go:
                    return self._hold(commit, fetched, verdict, signer)
            except BadInput as exc:
                return self._stopped(commit, fetched, interrupted, RunState.ERROR, exc, signer)
            return self._converge(commit, fetched, interrupted, events, signer, repo=repo, only=only,
                                  instantiate=instantiate)

    def _converge(self, commit: str, fetched: bool, interrupted: tuple[tuple[str, str, str], ...],
                  events: list[str], signer: Any, repo: DeploymentRepo | None = None,
                  only: set[str] | None = None, instantiate: bool = False) -> RunResult:
        """Render, observe, plan, apply and report ``commit`` (``only``: these services)."""
        try:
            desired = self.desired(commit, repo)
        except BadInput as exc:
            return self._stopped(commit, fetched, interrupted, RunState.ERROR, exc, signer)
        try:
            drivers = drivers_for(self.cfg, desired)
            the_plan = make_plan(desired, observe(self.cfg.node, drivers))
            if not instantiate:
                the_plan = stage(the_plan)
            if only is not None:
                the_plan = Plan(the_plan.node, the_plan.commit, tuple(a for a in the_plan.actions if a.service in only))
        except ReconcilerError as exc:  # a runtime that cannot even be observed (engine down)
            return self._stopped(commit, fetched, interrupted, RunState.FAILED, exc, signer)
        recheck = frozenset(s for _, s, a in interrupted if a != "stop")
        results = apply_plan(the_plan, drivers, self.state, recheck)
        ok = all(r.state is ResultState.OK for r in results)
        reboots = any(r.action is ActionKind.REBOOT and r.state is ResultState.OK for r in results)
        failed = [r for r in results if r.state is ResultState.FAILED]
        staged = [a for a in the_plan.actions if a.reason.startswith("staged (apply: manual)")]
        report = Report(
            self.cfg.node, commit,
            RunState.FAILED if failed else RunState.REBOOTING if reboots else RunState.STAGED if staged
            else RunState.APPLIED, now_iso(),
            services=tuple(results), plan_hash=the_plan.hash, signer=signer,
            reason="APPLY_FAILED" if failed else "",
            error=failed[0].detail if failed else "", events=tuple(events),
            pins={s: p["commit"] for s, p in sorted(self.pins().items())},
        )
        if failed:
            self.state.put(FAILED_COMMIT, commit)
        if ok and not reboots and not staged and only is None:
            self.state.put(APPLIED_COMMIT, commit)
            self.state.put(APPLIED_HASHES, json.dumps({s.name: s.hash for s in desired.services}))
        self._finish(report)
        return RunResult(self.cfg.node, commit, fetched, plan=the_plan, report=report,
                         pushed=self.reporter.push(), interrupted=interrupted)

    def _stopped(self, commit: str, fetched: bool, interrupted: tuple[tuple[str, str, str], ...],
                 state: RunState, exc: ReconcilerError, signer: Any) -> RunResult:
        """A run that stopped before applying anything: noted with the error's reason code."""
        report = Report(self.cfg.node, commit, state, now_iso(), reason=exc.reason, error=str(exc), signer=signer)
        self._finish(report)
        return RunResult(self.cfg.node, commit, fetched, report=report, pushed=self.reporter.push(),
                         interrupted=interrupted, error=exc)

    def _hold(self, commit: str, fetched: bool, verdict: RolloutVerdict, signer: Any) -> RunResult:
        """Not this node's turn: waiting (no note), or halted by a failure elsewhere (noted once)."""
        if not verdict.halted:
            log.info("%s: %s: %s", self.cfg.node, commit[:12], verdict.reason)
            return RunResult(self.cfg.node, commit, fetched, pushed=self.reporter.push(), waiting=verdict.reason)
        report = Report(self.cfg.node, commit, RunState.HALTED, now_iso(), reason="HALTED", error=verdict.reason,
                        signer=signer)
        self._finish(report)
        log.error("%s: %s", self.cfg.node, verdict.reason)
        return RunResult(self.cfg.node, commit, fetched, report=report, pushed=self.reporter.push())

    def retry(self) -> str | None:
        """Forget that the head failed here, so the next run tries it again."""
        failed = self.state.get(FAILED_COMMIT)
        self.state.db.execute("DELETE FROM kv WHERE key=?", (FAILED_COMMIT,))
        return failed

    def _finish(self, report: Report) -> None:
        """Record the run and write its note, unless the same verdict is already noted."""
        self.state.record_run(report.commit, str(report.state), report.reason)
        previous = self.reporter.read(report.commit)
        if report.state in (RunState.ERROR, RunState.REFUSED, RunState.HALTED, RunState.STAGED) and previous \
                and previous.get("state") == str(report.state) and previous.get("error") == report.error:
            return  # a broken or refused commit is noted once, not on every poll
        self.reporter.write(report)


class Supervisor:
    """Restart services that died, with exponential backoff per service."""

    BACKOFF_MAX = 60.0
    STABLE_AFTER = 30.0

    def __init__(self, agent: Agent, clock: Callable[[], float] = time.monotonic) -> None:
        self.agent = agent
        self.clock = clock
        self.failures: dict[str, int] = {}
        self.next_try: dict[str, float] = {}
        self.up_since: dict[str, float] = {}

    def tick(self) -> list[str]:
        """One check; returns the services restarted. Skips while a run holds the lock."""
        restarted = []
        try:
            with self.agent.state.lock():
                for driver in drivers_for(self.agent.cfg, None).values():
                    for o in driver.observe():
                        if o.drift == "report":
                            continue  # hands off: a stop by hand is noted by the next run, not undone
                        if self._check(driver, o.name, o.running, o.commit or ""):
                            restarted.append(o.name)
        except Busy:
            pass
        return restarted

    def _check(self, driver: Driver, svc: str, running: bool, commit: str) -> bool:
        now = self.clock()
        if running:
            if now - self.up_since.setdefault(svc, now) >= self.STABLE_AFTER:
                self.failures.pop(svc, None)
            return False
        self.up_since.pop(svc, None)
        if now < self.next_try.get(svc, 0.0):
            return False
        n = self.failures.get(svc, 0)
        self.failures[svc] = n + 1
        self.next_try[svc] = now + min(self.BACKOFF_MAX, 2.0**n)
        try:
            driver.revive(svc)
            ok, detail = True, f"restart #{n + 1} after crash"
        except ReconcilerError as exc:
            ok, detail = False, str(exc)
        log.warning("%s: service %s was not running: %s", self.agent.cfg.node, svc, detail)
        self.agent.state.record(svc, commit, None, "revive", "ok" if ok else "failed", "supervisor", detail)
        return ok


def node_offset(node: str, jitter: float) -> float:
    """A fixed offset per node in [0, jitter): nodes spread out even with identical clocks."""
    if jitter <= 0:
        return 0.0
    h = int.from_bytes(hashlib.sha256(node.encode()).digest()[:8], "big")
    return (h / 2**64) * jitter


def run_daemon(agent: Agent, on_result: Callable[[RunResult], None] | None = None) -> None:
    from apscheduler.schedulers.blocking import BlockingScheduler
    from apscheduler.triggers.interval import IntervalTrigger

    cfg = agent.cfg
    scheduler = BlockingScheduler(timezone="UTC")
    supervisor = Supervisor(agent)
    failures = 0
    lock = threading.Lock()  # apscheduler runs jobs in threads; keep passes apart in-process

    def poll() -> None:
        nonlocal failures
        with lock:
            try:
                result = agent.reconcile_once()
                failures = 0
                if on_result:
                    on_result(result)
            except Busy:
                return
            except ReconcilerError as exc:
                failures += 1
                delay = min(cfg.interval * 2**failures, max(cfg.interval, 600.0))
                log.error("%s: %s (next try in %.0fs)", cfg.node, exc, delay)
                job.modify(next_run_time=datetime.fromtimestamp(time.time() + delay, UTC))

    def supervise() -> None:
        with lock:
            supervisor.tick()

    first = datetime.fromtimestamp(time.time() + node_offset(cfg.node, cfg.jitter), UTC)
    job = scheduler.add_job(
        poll, IntervalTrigger(seconds=cfg.interval, jitter=cfg.jitter or None),
        next_run_time=first, max_instances=1, coalesce=True, id="poll",
    )
    scheduler.add_job(supervise, IntervalTrigger(seconds=cfg.supervise_interval), max_instances=1,
                      coalesce=True, id="supervise")

    def stop(signum: int, frame: Any) -> None:
        del signum, frame
        scheduler.shutdown(wait=False)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("%s: agent started; polling %s every %.0fs (jitter %.0fs)", cfg.node, cfg.branch, cfg.interval, cfg.jitter)
    scheduler.start()
