"""Services applied together: a plan cut into batches of mutually independent services, and
the batch's actions run so that only their waiting overlaps.

Most of a change's time is the health hold (``min_healthy``) and the service's own start, not
the agent's work: thirty services held one after another take thirty holds. A batch holds
together. What a batch must not do is change the order of side effects: every rename, spawn,
signal and ledger write is numbered (``core.faults``) and the crash tests kill the agent at
each in turn, so the numbering must be the same on every run. Hence ``Turns``: each action of
a batch runs in a thread of its own, but only the thread whose turn it is may run; it keeps
the turn until it starts waiting (its health check), then hands it to the next action in plan
order, round and round. Side effects thus happen one at a time, in an order fixed by the plan
and by what each service does (never by which check happened to pass first); waits overlap.
A runtime's own wait (an old process's graceful exit) is one too (``core.aside``). The turn is
not handed to whichever thread's wait ended first: that would number the side effects by
timing. A Ctrl-C in the main thread stops every action at its next turn or wait step, and the
main thread unwinds only once they are gone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
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


def batches(actions: Sequence[Action], max_parallel: int, busy: Callable[[Action], bool]) -> list[list[int]]:
    """The plan's actions (by index, in plan order) in consecutive batches: each holds at most
    ``max_parallel`` actions that do something (``busy``), none of which depends on another of
    the same batch (the plan puts what a service depends on before it, so a dependent starts
    only once its dependency's batch is done and healthy). A stop, or an action that may drain
    or reboot the node, is a batch of its own: a stop knows no dependencies, a drain is the
    operator's "take this out of service carefully" (two at once would take out two), a reboot
    waits for nothing."""
    out: list[list[int]] = []
    names: set[str] = set()
    count, closed = 0, True
    for i, a in enumerate(actions):
        alone = max_parallel <= 1 or a.desired is None or a.kind is ActionKind.STOP or _may_drain(a)
        deps = set(a.desired.depends_on) if a.desired is not None else set()
        doing = busy(a)
        if closed or alone or deps & names or (doing and count >= max_parallel):
            out.append([])
            names, count = set(), 0
        out[-1].append(i)
        names.add(a.service)
        count += doing
        closed = alone
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


class Turns:
    """Whose turn it is among the threads of one batch (see the module's docstring)."""

    def __init__(self, n: int) -> None:
        self._cond = threading.Condition()
        self._turn = 0
        self._done = [False] * n
        self.stopping = threading.Event()  # cuts the waits short (``core.aside.pause``)

    def take(self, i: int) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._turn == i)
            if self.stopping.is_set():
                raise Stopped  # in its turn: what its unwinding does still comes one at a time

    def give(self, i: int) -> None:
        """The turn to the next action after ``i`` still under way (``i`` itself last: it may be
        the only one left, waiting)."""
        n = len(self._done)
        with self._cond:
            self._turn = next(((i + k) % n for k in range(1, n + 1) if not self._done[(i + k) % n]), -1)
            self._cond.notify_all()

    def aside(self, i: int) -> Wait:
        def wait(what: Callable[[], None]) -> None:
            self.give(i)
            carry(None)  # a wait inside this one is part of it
            try:
                what()
            finally:
                carry(wait)
                self.take(i)
        return wait

    def finish(self, i: int) -> None:
        with self._cond:
            self._done[i] = True
        self.give(i)

    def stop(self, unstarted: Sequence[int]) -> None:
        """Each action stops at its next turn; ``unstarted`` (threads that could not start)
        never take theirs."""
        with self._cond:
            self.stopping.set()
            for i in unstarted:
                self._done[i] = True
            if self._turn >= 0 and self._done[self._turn]:
                n = len(self._done)
                t = self._turn
                self._turn = next(((t + k) % n for k in range(1, n + 1) if not self._done[(t + k) % n]), -1)
            self._cond.notify_all()


def together(tasks: Sequence[Callable[[Wait], T]]) -> list[Outcome[T]]:
    """Run ``tasks`` (each given how to wait) so that their side effects take turns in order
    and their waits overlap; what each returned or raised, in order. One task runs inline."""
    if not tasks:
        return []
    if len(tasks) == 1:
        try:
            return [Outcome(tasks[0](inline))]
        except Exception as exc:  # what it raised is the caller's to judge, as for the others
            return [Outcome(error=exc)]
    turns = Turns(len(tasks))
    out: list[Outcome[T]] = [Outcome() for _ in tasks]

    def run(i: int) -> None:
        watch(turns.stopping)
        try:
            turns.take(i)
            wait = turns.aside(i)
            carry(wait)  # for a runtime's own waits (an old process's exit), see ``core.aside``
            out[i] = Outcome(tasks[i](wait))
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which judges it
            out[i] = Outcome(error=exc)
        finally:
            carry(None)
            watch(None)
            turns.finish(i)

    # Daemon threads: an agent stopped half way (SIGTERM's exit) is not held by a hold.
    threads = [threading.Thread(target=run, args=(i,), name=f"apply-{i}", daemon=True) for i in range(len(tasks))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    except BaseException:
        # Ctrl-C (or a thread that could not start): the caller is about to unwind (its locks
        # released, its ledger closed), so the actions stop at their next turn, and are gone
        # before it does. A wait stops at its next step (``pause``).
        turns.stop([i for i, t in enumerate(threads) if t.ident is None])
        for t in threads:
            if t.ident is not None:
                t.join()
        raise
    return out
