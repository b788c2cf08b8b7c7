"""Services applied together: a sliding window of ``max_parallel`` slots over the plan, and
the actions in it run so that only their waiting overlaps.

Most of a change's time is the health hold (``min_healthy``) and the service's own start, not
the agent's work: thirty services held one after another take thirty holds. In the window, a
service starts as soon as a slot frees and what it depends on is healthy (``startable``), not
once the slowest of a batch is. What the window must not do is make two side effects at once:
every rename, spawn, signal and ledger write is numbered (``core.faults``) and the crash tests
kill the agent at each in turn. Hence one baton (``Window``): each action runs in a thread of
its own, but only the holder of the baton may act; an action gives it up while it waits (its
health check, a runtime's own wait for an old process's graceful exit: ``core.aside``) and takes
it back when its wait ends. The main thread holds it for the ledger (one sqlite connection):
it writes each action's intent, hands the baton to the new action's thread until that one first
waits (so starts come in plan order), and records each action as it completes. Which action
acts after a wait depends on which wait ended first: the order of side effects follows the
services' timing, and the recovery from a kill before any of them is the journal's, as it is
one after another. A Ctrl-C in the main thread stops every action at its next turn or wait
step, and the main thread unwinds only once they are gone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from reconciler.core.aside import Stopped, carry, watch
from reconciler.core.model import Action, ActionKind, rank

T = TypeVar("T")

Wait = Callable[[Callable[[], None]], None]
"""Runs a wait (a health check and its hold): inline, or aside while the other actions of its
batch take their turns."""


def inline(wait: Callable[[], None]) -> None:
    wait()


def alone(a: Action, max_parallel: int) -> bool:
    """An action that runs with nothing beside it: a stop knows no dependencies, a drain is the
    operator's "take this out of service carefully" (two at once would take out two), a reboot
    waits for nothing; and every action at ``max_parallel`` 1."""
    return max_parallel <= 1 or a.desired is None or a.kind is ActionKind.STOP or _may_drain(a)


def startable(actions: Sequence[Action], pending: Sequence[int], running: Collection[int], max_parallel: int,
              busy: Callable[[Action], bool]) -> list[int]:
    """Of the actions not started yet (``pending``, by index, in plan order), those that may start
    now beside ``running``: at most ``max_parallel`` that do something (``busy``) under way at
    once, none before every action earlier in the plan that it depends on is done (the plan puts
    what a service depends on before it), and an ``alone`` action only when nothing else is under
    way, nothing after it starting before it is done. An action whose dependency is not done
    lets the independent ones after it pass."""
    if any(alone(actions[j], max_parallel) for j in running):
        return []
    slots = max_parallel - sum(1 for j in running if busy(actions[j]))
    earlier = sorted(running)
    undone: set[str] = set()  # the services not done yet of the actions before ``i``
    out: list[int] = []
    for i in pending:
        while earlier and earlier[0] < i:
            undone.add(actions[earlier.pop(0)].service)
        a = actions[i]
        if alone(a, max_parallel):
            if not running and not undone and not out:
                out.append(i)
            break
        deps = set(a.desired.depends_on) if a.desired is not None else set()
        if not deps & undone and (not busy(a) or slots > 0):
            slots -= busy(a)
            out.append(i)
        undone.add(a.service)
    return out


def _may_drain(a: Action) -> bool:
    """A drain, a reboot, or a step whose escalation may reach one (its ``ceiling``)."""
    top = max(rank(a.kind), rank(a.desired.ceiling)) if a.desired is not None else rank(a.kind)
    return top >= rank(ActionKind.DRAIN_RESTART)


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """What one action of a batch came to: its value, or what it raised."""

    value: T | None = None
    error: BaseException | None = None


MAIN = -1  # the main thread's number, before every action's: it takes the baton first


class Window(Generic[T]):
    """Actions under way, each in a thread of its own, and the baton that lets one of them (or
    the main thread) act at a time (see the module's docstring). The main thread holds the
    baton from the start; a context manager: leaving it by an exception stops every action at
    its next turn, and leaving it at all waits for every thread."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._holder: int | None = MAIN
        self._wanting: set[int] = set()
        self._collecting = False  # the main thread waits for an action to complete
        self._done: list[tuple[int, Outcome[T]]] = []
        self._threads: list[threading.Thread] = []
        self.stopping = threading.Event()  # cuts the waits short (``core.aside.pause``)

    def __enter__(self) -> Window[T]:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is not None:
            # Ctrl-C, a thread that could not start, a ledger that failed: the caller is about to
            # unwind (its locks released, its ledger closed), so the actions stop at their next
            # turn, and are gone before it does. A wait stops at its next step (``pause``).
            with self._cond:
                self.stopping.set()
                self._wanting.discard(MAIN)
                self._collecting = False
                if self._holder == MAIN:
                    self._holder = None
                self._cond.notify_all()
        for t in self._threads:
            t.join()

    def _take(self, who: int) -> None:
        """The baton to ``who`` once it is free and no one before ``who`` wants it (or once it
        was handed to ``who``); in an action's thread, ``Stopped`` once the window stops."""
        with self._cond:
            self._wanting.add(who)
            try:
                self._cond.wait_for(lambda: self._holder == who or (
                    self._holder is None and who == min(self._wanting)))
            finally:
                self._wanting.discard(who)
            self._holder = who
            if who != MAIN and self.stopping.is_set():
                raise Stopped  # holding the baton: what its unwinding does still comes one at a time

    def _give(self, who: int) -> None:
        with self._cond:
            if self._holder == who:
                self._holder = None
                self._cond.notify_all()

    def start(self, i: int, task: Callable[[Wait], T]) -> None:
        """``task`` (number ``i``) under way: in a thread of its own, which the main thread
        (holding the baton) hands the baton to until the task first waits or ends."""
        def run() -> None:
            watch(self.stopping)
            out: Outcome[T] = Outcome()
            try:
                self._take(i)
                wait = self._aside(i)
                carry(wait)  # for a runtime's own waits (an old process's exit), see ``core.aside``
                out = Outcome(task(wait))
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which judges it
                out = Outcome(error=exc)
            finally:
                carry(None)
                watch(None)
                with self._cond:
                    self._done.append((i, out))
                    if self._holder == i:
                        self._holder = MAIN if self._collecting else None
                    self._cond.notify_all()

        # Daemon threads: an agent stopped half way (SIGTERM's exit) is not held by a hold.
        thread = threading.Thread(target=run, name=f"apply-{i}", daemon=True)
        with self._cond:
            self._holder = i
        try:
            thread.start()
        except BaseException:
            with self._cond:
                self._holder = MAIN
            raise
        self._threads.append(thread)
        self._take(MAIN)

    def _aside(self, i: int) -> Wait:
        def wait(what: Callable[[], None]) -> None:
            self._give(i)
            carry(None)  # a wait inside this one is part of it
            try:
                what()
            finally:
                carry(wait)
                self._take(i)
        return wait

    def finished(self) -> bool:
        """An action completed and not yet collected (an action completes only while the main
        thread has given the baton away: while it starts one, or collects)."""
        with self._cond:
            return bool(self._done)

    def collect(self) -> tuple[int, Outcome[T]]:
        """The next action to complete (in the order they did), the baton back with the main
        thread; only while one is under way."""
        with self._cond:
            self._give(MAIN)
            self._collecting = True
            try:
                self._cond.wait_for(lambda: bool(self._done) and self._holder in (None, MAIN))
            finally:
                self._collecting = False
            self._holder = MAIN
            return self._done.pop(0)


def together(tasks: Sequence[Callable[[Wait], T]]) -> list[Outcome[T]]:
    """Run ``tasks`` (each given how to wait) all at once in a window, their side effects one
    at a time and their waits overlapping; what each returned or raised, in order. One task
    runs inline, in the calling thread."""
    if not tasks:
        return []
    if len(tasks) == 1:
        try:
            return [Outcome(tasks[0](inline))]
        except Exception as exc:  # what it raised is the caller's to judge, as for the others
            return [Outcome(error=exc)]
    out: list[Outcome[T]] = [Outcome() for _ in tasks]
    with Window[T]() as window:
        for i, task in enumerate(tasks):
            window.start(i, task)
        for _ in tasks:
            i, outcome = window.collect()
            out[i] = outcome
    return out
