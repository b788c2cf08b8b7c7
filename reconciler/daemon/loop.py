"""The long-running agent: a scheduler for polls, a supervisor for services, signals.

The supervisor never waits on the network: a pass holds the services lock only while it
observes and changes services, not while it fetches or pushes, and the supervisor runs in its
own scheduler thread. One daemon per state dir (``agent.lock``, held for the daemon's life).
Here the daemon's life: its start (or its resumption after a re-execution), its passes, the
signals that stop it and the hand-over that re-executes it. The timers and the supervisor are
``supervisor``; what follows each pass, ``afterpass``.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from reconciler.agent import Agent
from reconciler.core import digest
from reconciler.core.errors import Busy, ReconcilerError
from reconciler.daemon import shed, wake
from reconciler.daemon.afterpass import Outputs, Shedding, VerdictLog
from reconciler.daemon.supervisor import Every, Supervisor, WaitPolls, node_offset
from reconciler.node.run import RunResult
from reconciler.settings import AgentConfig

log = logging.getLogger("reconciler.agent")

STOP_GRACE = 10.0  # seconds a stop waits for a pass in flight
# Held back across a re-execution (and taken by the new interpreter's handlers): a stop, and a
# `reconciler poll`, whose default action would end a daemon that has no handler for it yet.
HELD = shed.Signals.STOPS | {wake.WAKE}


def run_daemon(agent: Agent, on_result: Callable[[RunResult], None] | None = None,
               reload: Callable[[], AgentConfig] | None = None) -> None:
    """The daemon. ``reload``: the config as a fresh start would load it (see ``Shedding``)."""
    carry = shed.take_over()
    digest.without_openssl()  # its few hashes: 3.5 MB less of it, idle (issue 40)
    stopping = threading.Event()

    def stop(signum: int, frame: Any) -> None:
        del signum, frame
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    woken = threading.Event()  # `reconciler poll` before the timers exist: the first poll is now
    signal.signal(wake.WAKE, lambda signum, frame: woken.set())
    signals = shed.Signals(None if carry is None else carry.signal_fds)
    seen = signals.drain()  # taken by a thread of the interpreter this one replaced
    if seen & shed.Signals.STOPS:
        stopping.set()
    if wake.WAKE in seen:
        woken.set()
    # Blocked when this interpreter replaced another (see ``shed``): one that came during the
    # execv comes now, to the handler, before any thread starts (threads inherit the mask).
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)
    with agent.state.daemon_lock(held=None if carry is None else carry.lock_fd) as lock_fd:
        running = _Running(agent, on_result, reload, carry, lock_fd, signals, stopping)
        signal.signal(wake.WAKE, lambda signum, frame: running.polls.now())
        if woken.is_set():
            running.polls.now()
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
        self.waits = WaitPolls(agent, self.polls, self.polling, stopping, self.cfg.wait_poll)
        # Not behind `polling`: a pass stuck on a stalled git server must not stop restarts.
        self.receiver = wake.start_receiver(self.cfg.receiver.listen, self.cfg.receiver.secret_file,
                                            self.polls.soon, self.cfg.node)
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
        # Waits out a wait-poll in flight (it holds the lock for a look at a few notes tips),
        # which a skipped pass would cost a whole interval; a re-execution holds it until the execv.
        if not self.polling.acquire(timeout=WaitPolls.HELD):
            return
        if self.stopping.is_set():  # stopped while it waited: no pass begins now
            self.polling.release()
            return
        shed_now = False
        try:
            result = self.agent.reconcile_once()
            self.failures = 0
            self.say(result)
            self.outputs(result)
            self.waits.after(result.waiting)
            shed_now = self.shedding.after(result)
        except Busy:
            self.waits.busy()
            return
        except ReconcilerError as exc:
            self.waits.after("")  # no wait-poll cuts its back-off short
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
            if shed_now:  # once the pass let go: a re-execution finding it held would give up
                self.shed_due = True
                self.signals.nudge()

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
                signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
                try:
                    self.re_execute()
                finally:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)

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
                seen = self.signals.drain()  # their handlers may not have run yet
                if seen & shed.Signals.STOPS:
                    self.stopping.set()  # no re-execution
                if wake.WAKE in seen:
                    self.polls.now()  # in the poll's due time handed over
                if self.stopping.is_set():
                    return
                now = shed.rss_mb() or 0.0
                started = self.shedding.start_mb or 0.0
                log.info("%s: re-executing to give back %.1f MB that its work loaded (%.1f MB now, %.1f MB "
                         "at its start)", self.cfg.node, now - started, now, started)
                supervisor, agent = self.supervisor, self.agent
                shed.hand_over(shed.Carry(
                    lock_fd=self.lock_fd, metrics_fd=self.outputs.listening(), poll_due=self.polls.next_due(),
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
        self.polls.wake()
        self.supervising.wake()
        self.waits.wake()
        if self.receiver is not None:
            self.receiver.close()
        if self.polling.acquire(timeout=STOP_GRACE):
            self.polling.release()
        else:
            log.warning("%s: a pass is still running after %.0fs; stopping without it (the next start finishes "
                        "it)", self.cfg.node, STOP_GRACE)
