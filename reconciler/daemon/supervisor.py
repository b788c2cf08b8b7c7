"""What the daemon runs on timers: the schedule (``Every``, a thread per job at a fixed phase,
each node at its own offset) and the supervisor, which restarts services that died between
passes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from reconciler.agent import Agent
from reconciler.core import digest
from reconciler.core.errors import Busy, ReconcilerError
from reconciler.drivers import Driver, kinds

log = logging.getLogger("reconciler.agent")


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
                for name, driver in self.agent.drivers(None).items():
                    keeper = kinds.housekeeping(name, driver)
                    if keeper is not None:
                        keeper.housekeep()  # the services' own logs must not fill the disk
                    if not kinds.kind_of(name).supervised:
                        continue
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
    h = int.from_bytes(digest.sha256(node.encode())[:8], "big")
    return (h / 2**64) * jitter


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
        self._woken = threading.Event()  # ``soon`` (or a stop) cuts the wait short
        self._lock = threading.Lock()
        self._running = False
        self._asked = float("inf")  # asked (``soon``) during a run: taken once it is over
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def later(self, delay: float) -> None:
        self.due = time.monotonic() + delay

    def now(self) -> None:
        """Run as soon as the run in flight (if any) is over: `reconciler poll`, a webhook."""
        self.soon(0.0)

    def soon(self, delay: float) -> None:
        """Run within ``delay`` seconds (or at the due time, if sooner), and after the run in
        flight if any: a webhook coalesced into the end of its rate limit's gap."""
        at = time.monotonic() + delay
        with self._lock:
            if self._running:  # the run's end sets the next due time: this one is taken after it
                self._asked = min(self._asked, at)
            else:
                self.due = min(self.due, at)
        self._woken.set()

    def next_due(self) -> float:
        """When the next run is due, a run asked for during the one in flight included."""
        with self._lock:
            return min(self.due, self._asked)

    def wake(self) -> None:
        """Look at ``stop`` again now (it was set)."""
        self._woken.set()

    def _run(self) -> None:
        while not self.stop.is_set():
            self._woken.wait(max(0.0, self.due - time.monotonic()))
            self._woken.clear()
            if self.stop.is_set():
                break
            if time.monotonic() < self.due:
                continue  # woken for a stop that did not come
            with self._lock:
                self._running = True
                due = self.due
            try:
                self.job()
            except Exception:  # a bug in one run must not end the schedule
                log.exception("%s: unexpected error", self._thread.name)
            with self._lock:
                self._running = False
                if self.due == due:  # the job did not reschedule itself
                    # The next due time of the same phase that is still ahead (a long run skips some).
                    behind = max(0.0, time.monotonic() - due)
                    self.due = due + self.seconds * (1 + int(behind // self.seconds))
                self.due, self._asked = min(self.due, self._asked), float("inf")


class WaitPolls:
    """While a pass waits in the rollout on other nodes' notes: a wait-poll every ``wait_poll``
    seconds (``Agent.notes_tips``, then ``Agent.notes_moved``: their tips, from the probe or a
    fetch of those refs alone), and the pass made due at once (``polls.now()``) when one moved,
    so a wave starts on the note of the wave before, not on the next poll. Outside a wait, its
    thread sleeps (made only when a pass first waits). ``polling``: the daemon's
    one-pass-at-a-time lock, held for the mirror's part only (the probe's GETs are not behind
    it; a pass in flight reads the notes itself)."""

    ASLEEP = 3600.0
    HELD = 30.0  # seconds a pass waits for a wait-poll in flight (its one fetch, if it fetches)
    # A wait-poll that fetches (no probe, or one down or doubted) is a git request to the git
    # server: at most this often, or a waiting fleet would ask it once a second a node.
    FETCH_EVERY = 10.0
    BUSY_PAUSE = 5.0  # after a pass found the node's lock held: the next try of what it was for

    def __init__(self, agent: Agent, polls: Every, polling: threading.Lock, stop: threading.Event,
                 wait_poll: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.agent, self.polls, self.polling, self.stop, self.wait_poll = agent, polls, polling, stop, wait_poll
        self.clock = clock
        self.watch: tuple[str, ...] = ()
        self.timer: Every | None = None
        self.fetch_due = float("-inf")
        self.passes = 0  # passes ended (``after``): a probe's word read before one is stale

    def after(self, waiting: str) -> None:
        """A pass ended (``waiting``: why it waits, if it does; "" as well for a pass that
        failed, whose back-off a wait-poll must not cut short): wait-poll what it waits on."""
        self.passes += 1
        self.watch = self.agent.waiting_on() if waiting and self.wait_poll > 0 else ()
        if not self.watch:
            return
        if self.timer is None:
            self.timer = Every("wait-poll", self.wait_poll, self.tick, self.stop, first=self.wait_poll)
            self.timer.start()
        else:
            self.timer.soon(self.wait_poll)

    def busy(self) -> None:
        """The pass found the node's lock held: the watch stays (what a wait-poll saw is said
        again), a little later."""
        if self.timer is not None and self.watch:
            self.timer.later(max(self.wait_poll, self.BUSY_PAUSE))

    def tick(self) -> None:
        watch = self.watch
        if not watch:
            assert self.timer is not None
            self.timer.later(self.ASLEEP)  # until a pass waits again (``after``)
            return
        passes = self.passes
        tips = self.agent.notes_tips(watch)
        if self.stop.is_set() or not self.polling.acquire(blocking=False):
            return
        try:
            if self.passes != passes:  # a pass fetched the notes since: the tips read are older
                return
            moved = self.agent.notes_moved(watch, tips, self._may_fetch)
        except ReconcilerError as exc:  # the remote away: the next wait-poll, or the next pass, says
            log.debug("%s: wait-poll: %s", self.agent.cfg.node, exc)
            return
        finally:
            self.polling.release()
        if moved and self.watch:  # (a pass that failed meanwhile: its back-off holds)
            log.info("%s: the notes of %s moved: polling now", self.agent.cfg.node, ", ".join(moved))
            self.polls.now()

    def _may_fetch(self) -> bool:
        now = self.clock()
        if now < self.fetch_due:
            return False
        self.fetch_due = now + max(self.wait_poll, self.FETCH_EVERY)
        return True

    def wake(self) -> None:
        if self.timer is not None:
            self.timer.wake()
