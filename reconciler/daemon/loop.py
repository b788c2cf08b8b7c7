"""The long-running agent: a scheduler for polls, a supervisor for services, signals.

The supervisor never waits on the network: a pass holds the services lock only while it
observes and changes services, not while it fetches or pushes, and the supervisor runs in its
own scheduler thread. One daemon per state dir (``agent.lock``, held for the daemon's life).
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from reconciler.agent import Agent
from reconciler.core.errors import Busy, ReconcilerError
from reconciler.daemon import shed
from reconciler.daemon.notify import Notifier
from reconciler.drivers import Driver
from reconciler.drivers.process import ProcessDriver
from reconciler.node.steps import RunResult
from reconciler.settings.agent import AgentConfig

if TYPE_CHECKING:
    from reconciler.daemon.metrics import Metrics

log = logging.getLogger("reconciler.agent")

STOP_GRACE = 10.0  # seconds a stop waits for a pass in flight


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
        """One check; returns the services restarted. Skips while a pass changes services."""
        restarted = []
        try:
            with self.agent.state.services_lock():
                for driver in self.agent.drivers(None).values():
                    if isinstance(driver, ProcessDriver):
                        driver.rotate_logs()  # the services' own logs must not fill the disk
                    for o in driver.liveness():
                        if o.drift == "report":
                            continue  # hands off: a stop by hand is noted by the next run, not undone
                        if self._check(driver, o.name, o.running, o.commit or "", o.hash):
                            restarted.append(o.name)
        except Busy:
            pass
        return restarted

    def _check(self, driver: Driver, svc: str, running: bool, commit: str, hash_: str | None) -> bool:
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
            ok, detail = False, self.agent.redact(str(exc))
        log.warning("%s: service %s was not running: %s", self.agent.cfg.node, svc, detail)
        self.agent.ledger.log(svc, commit, hash_, "revive", "ok" if ok else "failed", "supervisor", detail)
        return ok


def node_offset(node: str, jitter: float) -> float:
    """A fixed offset per node in [0, jitter): nodes spread out even with identical clocks."""
    if jitter <= 0:
        return 0.0
    h = int.from_bytes(hashlib.sha256(node.encode()).digest()[:8], "big")
    return (h / 2**64) * jitter


class VerdictLog:
    """Logs what a pass came to, once, and again only when it changes. Failures, refusals and
    halts are logged by the pass itself (once per commit and reason, with the reason code and
    the service's last output); this adds the quiet outcomes: applied, staged, waiting."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.last: tuple[str, str, str] | None = None

    def __call__(self, result: RunResult) -> None:
        if result.error is not None or result.skipped or (result.report is not None and result.report.reason):
            self.last = None
            return
        if result.report is not None:
            key = (result.commit, str(result.report.state), "")
            text = str(result.report.state)
        elif result.waiting:
            key = (result.commit, "waiting", result.waiting)
            text = f"waiting: {result.waiting}"
        else:
            key = (result.commit, "unchanged", "")
            text = "unchanged"
        if key == self.last:
            return
        self.last = key
        log.info("%s @ %s: %s", result.node, result.commit[:12], text)


class Outputs:
    """What follows every pass: notifications sent, metrics refreshed (and the textfile written).
    Built before the first pass, so a bad setting (a secret's variable unset, an address in use)
    stops the start with a one-line error. After a pass, neither may fail it: a problem is
    logged once (``strict``: raised, for ``agent --once``, whose exit code should say so)."""

    def __init__(self, agent: Agent) -> None:
        cfg = agent.cfg
        self.agent = agent
        self.notifier = Notifier(cfg.notify, cfg.state_dir) if cfg.notify.enabled else None
        self.metrics: Metrics | None = None
        if cfg.metrics.listen or cfg.metrics.textfile:
            # Imported only when asked for: prometheus-client is 12 MB of an idle agent's RSS.
            from reconciler.daemon.metrics import Metrics

            self.metrics = Metrics(agent)

    def serve(self, adopt: int | None = None) -> int | None:
        """``/metrics`` on the configured address; the port it listens on. ``adopt``: the
        socket the interpreter this one replaced listened on."""
        if self.metrics is None or self.agent.cfg.metrics.listen is None:
            if adopt is not None:
                os.close(adopt)
            return None
        return self.metrics.serve(self.agent.cfg.metrics.listen, adopt)

    def listening(self) -> int | None:
        return None if self.metrics is None else self.metrics.listening()

    def __call__(self, result: RunResult | None, error: ReconcilerError | None = None, strict: bool = False) -> None:
        if self.notifier is not None and result is not None:
            try:
                self.notifier.after_pass(result)
            except Exception as exc:  # a notification must never cost the node its pass
                if strict and isinstance(exc, ReconcilerError):
                    raise
                self.agent.say_once(("notify", str(exc)), logging.WARNING, "%s: notifications: %s", self.agent.cfg.node,
                                    exc)
        if self.metrics is not None:
            try:
                self.metrics.after_pass(result, error)
            except ReconcilerError as exc:
                if strict:
                    raise
                self.agent.say_once(("metrics", str(exc)), logging.WARNING, "%s: metrics: %s", self.agent.cfg.node,
                                    exc)

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()


class Every:
    """Run ``job`` in its own thread at ``first``, then every ``seconds`` after each due time,
    one run at a time; runs missed while one was in flight are not made up. ``later(delay)``:
    the next run waits ``delay`` seconds from now (a backoff). The phase is fixed: no random
    delay per run, so a node waiting on a wave notices its predecessors' notes within one
    interval (nodes are spread by their offsets, ``node_offset``). A thread per job, so a pass
    stuck on a stalled git server never holds up the supervisor's restarts. (Replaces
    apscheduler: two interval jobs did not need its ~150 modules and ~8 MB in an idle agent.)"""

    def __init__(self, name: str, seconds: float, job: Callable[[], object], stop: threading.Event, *,
                 first: float = 0.0) -> None:
        self.seconds, self.job, self.stop = seconds, job, stop
        self.due = time.monotonic() + first
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def later(self, delay: float) -> None:
        self.due = time.monotonic() + delay

    def _run(self) -> None:
        while not self.stop.wait(max(0.0, self.due - time.monotonic())):
            due = self.due
            try:
                self.job()
            except Exception:  # a bug in one run must not end the schedule
                log.exception("%s: unexpected error", self._thread.name)
            if self.due == due:  # the job did not reschedule itself
                # The next due time of the same phase that is still ahead (a long run skips some).
                behind = max(0.0, time.monotonic() - due)
                self.due = due + self.seconds * (1 + int(behind // self.seconds))


class Shedding:
    """Whether the daemon should re-execute itself now (``shed``): after a quiet pass (nothing to
    do, nothing failed, nothing waiting) that follows work, when the work left it heavier by
    ``GROWTH_MB``. A fresh interpreter has done no work, so it never sheds on its first quiet
    polls, whatever they load: no loop of re-executions."""

    def __init__(self, agent: Agent, reload: Callable[[], AgentConfig] | None) -> None:
        self.agent = agent
        self.reload = reload
        self.start_mb = shed.rss_mb()
        self.worked = False
        self.off = not shed.possible()
        self.code = shed.code_files()  # what this interpreter started from

    def after(self, result: RunResult | None) -> bool:
        quiet = result is not None and result.error is None and result.report is None and not (
            result.waiting or result.operation or result.suspended)
        if not quiet:
            self.worked = True
            return False
        now = shed.rss_mb()
        return (not self.off and self.worked and now is not None and self.start_mb is not None
                and now - self.start_mb >= shed.GROWTH_MB)

    def same_config(self) -> bool:
        """A fresh interpreter reads the config file again: when it no longer says what this
        one runs with (or no longer parses), keep running; the operator's restart applies it."""
        if self.reload is None:
            return True
        try:
            same = self.reload() == self.agent.cfg
        except ReconcilerError as exc:
            same, why = False, f"it no longer loads: {exc}"
        else:
            why = "it changed"
        if not same:
            self.agent.say_once(("shed", "config"), logging.WARNING, "%s: not re-executing to give back memory: "
                                "the config file differs from what this agent started with (%s); restart it "
                                "to apply the file", self.agent.cfg.node, why)
        return same

    def same_code(self) -> bool:
        """A fresh interpreter imports the code installed now: when it is not what this one
        started from (an upgrade that did not restart the unit), keep running; the operator's
        restart runs the new code, not a re-execution the operator did not ask for."""
        if shed.code_files() == self.code:
            return True
        self.agent.say_once(("shed", "code"), logging.WARNING, "%s: not re-executing to give back memory: the "
                            "agent's code in %s changed since it started (an upgrade without a restart); restart "
                            "it to run the new code", self.agent.cfg.node, shed.CODE)
        return False


def run_daemon(agent: Agent, on_result: Callable[[RunResult], None] | None = None,
               reload: Callable[[], AgentConfig] | None = None) -> None:
    """The daemon. ``reload``: the config as a fresh start would load it (see ``Shedding``)."""
    carry = shed.take_over()
    stopping = threading.Event()

    def stop(signum: int, frame: Any) -> None:
        del signum, frame
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signals = shed.Signals(None if carry is None else carry.signal_fds)
    if signals.stop_asked():  # taken by a thread of the interpreter this one replaced
        stopping.set()
    # Blocked when this interpreter replaced another (see ``shed``): one that came during the
    # execv comes now, to the handler, before any thread starts (threads inherit the mask).
    signal.pthread_sigmask(signal.SIG_UNBLOCK, shed.Signals.STOPS)
    with agent.state.daemon_lock(held=None if carry is None else carry.lock_fd) as lock_fd:
        running = _Running(agent, on_result, reload, carry, lock_fd, signals, stopping)
        running.start()
        running.wait()
        running.finish()
    # Exit here: what a thread left (a scrape being answered, a pool) must not hold the stop.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class _Running:
    """A daemon holding its state dir's lock: its parts, resumed from the interpreter it
    replaced (``carry``) if any, and what it does with them: passes (``poll``, on the poll
    thread), re-executions (``re_execute``, on the main thread, between passes), waiting for a
    stop (``wait``, the main thread)."""

    def __init__(self, agent: Agent, on_result: Callable[[RunResult], None] | None,
                 reload: Callable[[], AgentConfig] | None, carry: shed.Carry | None, lock_fd: int,
                 signals: shed.Signals, stopping: threading.Event) -> None:
        self.agent, self.cfg, self.carry, self.lock_fd = agent, agent.cfg, carry, lock_fd
        self.signals, self.stopping = signals, stopping
        self.shed_due = False
        self.supervisor = Supervisor(agent)
        self.failures = 0  # passes failed in a row (temporary errors): the backoff's exponent
        self.polling = threading.Lock()  # one pass at a time in-process
        self.say = on_result or VerdictLog(agent)
        self.outputs = Outputs(agent)
        port = self.outputs.serve(None if carry is None else carry.metrics_fd)
        self.shedding = Shedding(agent, reload)  # its start: with what metrics and notifications import
        if carry is not None:
            self.supervisor.failures, self.supervisor.next_try, self.supervisor.up_since = (
                dict(carry.failures), dict(carry.next_try), dict(carry.up_since))
            if isinstance(self.say, VerdictLog):
                self.say.last = carry.verdict
            agent.take_back(carry.said, carry.secrets, carry.pulled_ahead)
            self.shedding.start_mb = carry.started_mb or self.shedding.start_mb
        elif port is not None:
            log.info("%s: metrics on http://%s/metrics", self.cfg.node, self.cfg.metrics.listen)
        now = time.monotonic()
        first_poll = node_offset(self.cfg.node, self.cfg.jitter) if carry is None else max(0.0, carry.poll_due - now)
        self.polls = Every("poll", self.cfg.interval, self.poll, stopping, first=first_poll)
        # Not behind `polling`: a pass stuck on a stalled git server must not stop restarts.
        self.supervising = Every("supervise", self.cfg.supervise_interval, self.supervisor.tick, stopping,
                                 first=self.cfg.supervise_interval if carry is None
                                 else max(0.0, carry.supervise_due - now))

    def start(self) -> None:
        if self.stopping.is_set():
            return
        self.polls.start()  # after the assignment: a first poll that fails at once backs off through `polls`
        self.supervising.start()
        if self.carry is None:
            log.info("%s: agent started; polling %s every %.0fs (jitter %.0fs)", self.cfg.node, self.cfg.branch,
                     self.cfg.interval, self.cfg.jitter)
        else:
            log.info("%s: agent re-executed (%d so far): %.1f MB", self.cfg.node, self.carry.sheds,
                     shed.rss_mb() or 0.0)

    def poll(self) -> None:
        if not self.polling.acquire(blocking=False):
            return
        try:
            result = self.agent.reconcile_once()
            self.failures = 0
            self.say(result)
            self.outputs(result)
            if self.shedding.after(result):
                self.shed_due = True
                self.signals.nudge()
        except Busy:
            return
        except ReconcilerError as exc:
            self.shedding.after(None)
            self.outputs(None, exc)
            node = self.cfg.node
            if not exc.temporary:  # the same input fails the same way: say it once, poll on for a new one
                self.agent.say_once(("poll", exc.reason, str(exc)), logging.ERROR, "%s: %s [%s]", node, exc,
                                    exc.reason)
                return
            self.failures += 1
            delay = min(self.cfg.interval * 2**self.failures, max(self.cfg.interval, 600.0))
            self.agent.say_once(("poll", exc.reason, str(exc)), logging.ERROR, "%s: %s [%s] (next try in %.0fs)",
                                node, exc, exc.reason, delay)
            self.polls.later(delay)
        finally:
            self.polling.release()

    def wait(self) -> None:
        """Until a stop; meanwhile, re-execute when a pass asks for it."""
        while not self.stopping.is_set():
            # Woken by the wakeup pipe: a signal's number, whichever thread the kernel gave it
            # to (its Python handler runs only in this thread, once this thread wakes), or a
            # pass that asks for a re-execution.
            self.signals.wait()
            if self.signals.stop_asked():
                self.stopping.set()
            if self.shed_due and not self.stopping.is_set():
                self.shed_due = False
                # A signal to the main thread is held back across the execv, not lost; one taken
                # by another thread is in the wakeup pipe, read before and handed over.
                signal.pthread_sigmask(signal.SIG_BLOCK, shed.Signals.STOPS)
                try:
                    self.re_execute()
                finally:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, shed.Signals.STOPS)

    def re_execute(self) -> None:
        """Hand over and re-execute, with no pass or supervisor tick in flight; on any
        obstacle, keep running (the next quiet pass after more work asks again)."""
        if not self.polling.acquire(blocking=False):
            return  # a pass began meanwhile
        try:
            if not (self.shedding.same_config() and self.shedding.same_code()):
                self.shedding.off = True
                return
            with self.agent.state.services_lock(wait=5.0):
                if self.signals.stop_asked():
                    self.stopping.set()  # its handler may not have run yet: no re-execution
                if self.stopping.is_set():
                    return
                now = shed.rss_mb() or 0.0
                started = self.shedding.start_mb or 0.0
                log.info("%s: re-executing to give back %.1f MB that its work loaded (%.1f MB now, %.1f MB "
                         "at its start)", self.cfg.node, now - started, now, started)
                supervisor, agent = self.supervisor, self.agent
                shed.hand_over(shed.Carry(
                    lock_fd=self.lock_fd, metrics_fd=self.outputs.listening(), poll_due=self.polls.due,
                    supervise_due=self.supervising.due, failures=supervisor.failures,
                    next_try=supervisor.next_try, up_since=supervisor.up_since,
                    verdict=self.say.last if isinstance(self.say, VerdictLog) else None,
                    said=agent.said(), secrets=agent.redact.known, pulled_ahead=tuple(agent.pulled_ahead),
                    sheds=(self.carry.sheds if self.carry is not None else 0) + 1, started_mb=started,
                    signal_fds=self.signals.fds,
                ))
        except (Busy, shed.ShedFailed) as exc:
            self.shedding.off = isinstance(exc, shed.ShedFailed)
            self.agent.say_once(("shed", str(exc)), logging.WARNING, "%s: not re-executing: %s", self.cfg.node, exc)
        finally:
            self.polling.release()

    def finish(self) -> None:
        """Stopped. A pass in flight gets a grace period; one stuck on the network is left:
        every step of a pass is safe to cut short, and the next start finishes what it began."""
        if self.polling.acquire(timeout=STOP_GRACE):
            self.polling.release()
        else:
            log.warning("%s: a pass is still running after %.0fs; stopping without it (the next start finishes "
                        "it)", self.cfg.node, STOP_GRACE)
