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
from typing import Any

from .apply import apply_plan
from .config import AgentConfig
from .drivers import Driver, make_driver
from .errors import BadInput, Busy, ReconcilerError
from .model import Desired, Plan, Report, ResultState, RunState
from .observe import observe
from .plan import plan as make_plan
from .report import Reporter
from .source import Source
from .state import State

log = logging.getLogger("reconciler.agent")

APPLIED_COMMIT = "applied_commit"
APPLIED_HASHES = "applied_hashes"


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

    @property
    def exit_code(self) -> int:
        if self.error is not None:
            return self.error.exit_code
        if self.report is not None and self.report.state is not RunState.APPLIED:
            return 1
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
        }


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def drivers_for(cfg: AgentConfig, desired: Desired | None) -> dict[str, Driver]:
    """The process driver always (it may hold services to stop), plus what the slice names."""
    names = {"process"} | ({s.runtime.driver for s in desired.services} if desired else set())
    return {n: make_driver(n, cfg.state_dir, cfg.node) for n in sorted(names)}


@dataclass
class Agent:
    """One node's agent: the stages wired together over one state dir."""

    cfg: AgentConfig
    progress: bool | None = None
    state: State = field(init=False)
    source: Source = field(init=False)
    reporter: Reporter = field(init=False)

    def __post_init__(self) -> None:
        self.state = State(self.cfg.state_dir)
        self.source = Source(
            self.cfg.remote, self.cfg.branch, self.state.mirror,
            ssh_command=self.cfg.ssh_command, progress=self.progress,
        )
        self.reporter = Reporter(self.source, self.state, self.cfg.node)

    def close(self) -> None:
        self.state.close()

    # stages --------------------------------------------------------------------------
    def desired(self, commit: str) -> Desired:
        # Imported here: templates and schemas are not needed on a poll that finds nothing new.
        from .render import render_node
        from .repo import load_repo
        from .tree import GitTree

        repo = load_repo(GitTree(self.source.repo, commit))
        return render_node(repo, self.cfg.node, commit)

    def head(self, fetch: bool, rev: str | None) -> tuple[str, bool]:
        if rev is not None:
            try:
                return str(self.source.repo.revparse_single(rev).peel(None).id), False
            except (KeyError, ValueError) as exc:
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
        return all(o.running and o.hash == hashes[n] for n, o in seen.items())

    # the loop ------------------------------------------------------------------------
    def plan(self, *, fetch: bool = True, rev: str | None = None) -> tuple[Plan, bool]:
        with self.state.lock(wait=30):
            commit, fetched = self.head(fetch, rev)
            desired = self.desired(commit)
            observed = observe(self.cfg.node, drivers_for(self.cfg, desired))
            return make_plan(desired, observed), fetched

    def reconcile_once(self, *, fetch: bool = True, rev: str | None = None) -> RunResult:
        with self.state.lock(wait=30 if rev else 0):
            self.reporter.recover()
            commit, fetched = self.head(fetch, rev)
            interrupted = tuple(self.state.interrupted())
            for c, s, a in interrupted:
                log.warning("%s: a previous run was interrupted during %s %s at %s; re-planning",
                            self.cfg.node, a, s, c[:12])
            self.state.clear_interrupted()
            if not interrupted and self._unchanged(commit):
                pushed = self.reporter.push()
                return RunResult(self.cfg.node, commit, fetched, pushed=pushed)
            try:
                desired = self.desired(commit)
            except BadInput as exc:
                report = Report(self.cfg.node, commit, RunState.ERROR, now_iso(), reason=exc.reason, error=str(exc))
                self._finish(report)
                return RunResult(self.cfg.node, commit, fetched, report=report,
                                 pushed=self.reporter.push(), interrupted=interrupted, error=exc)
            drivers = drivers_for(self.cfg, desired)
            the_plan = make_plan(desired, observe(self.cfg.node, drivers))
            recheck = frozenset(s for _, s, a in interrupted if a != "stop")
            results = apply_plan(the_plan, drivers, self.state, recheck)
            ok = all(r.state is ResultState.OK for r in results)
            report = Report(
                self.cfg.node, commit, RunState.APPLIED if ok else RunState.FAILED, now_iso(),
                services=tuple(results), plan_hash=the_plan.hash,
                reason="" if ok else "APPLY_FAILED",
                error="" if ok else next(r.detail for r in results if r.state is ResultState.FAILED),
            )
            if ok:
                self.state.put(APPLIED_COMMIT, commit)
                self.state.put(APPLIED_HASHES, json.dumps({s.name: s.hash for s in desired.services}))
            self._finish(report)
            return RunResult(self.cfg.node, commit, fetched, plan=the_plan, report=report,
                             pushed=self.reporter.push(), interrupted=interrupted)

    def _finish(self, report: Report) -> None:
        """Record the run and write its note, unless the same verdict is already noted."""
        self.state.record_run(report.commit, str(report.state), report.reason)
        previous = self.reporter.read(report.commit)
        if report.state is RunState.ERROR and previous and previous.get("state") == "error" \
                and previous.get("error") == report.error:
            return  # a broken commit is noted once, not on every poll
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
