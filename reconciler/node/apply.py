"""``Plan`` -> results, through the drivers: journal first, then act, then check health.

Each change is written to the intent journal before it happens and settled after, so a run
killed half way leaves a record of what it was doing; the next run re-plans from what it
observes, which makes applying twice the same as applying once.

A failed service stops the run for this commit: the services after it are skipped, not
half-applied (those already under way beside it finish; see ``batches``), and the result
says which service failed first. What a failure says (its error, the service's own last
output, each escalation step) is cleaned of the node's secret values (``redact``) before it
reaches a result, the history, a note or the log.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from reconciler.core.aside import pause
from reconciler.core.errors import ApplyError, ReconcilerError
from reconciler.core.model import (
    LADDER,
    Action,
    ActionKind,
    Desired,
    DesiredService,
    Health,
    Plan,
    ResultState,
    ServiceResult,
    rank,
)
from reconciler.core.redact import NONE as NO_SECRETS
from reconciler.core.redact import Redactor
from reconciler.drivers import Driver, kinds
from reconciler.drivers.base import Check, clean_env
from reconciler.drivers.registry import PullFailed
from reconciler.ledger import Ledger, Version
from reconciler.node.batches import Outcome, Wait, Window, alone, inline, startable, together

log = logging.getLogger("reconciler.apply")

# A process that survives this long after start is taken as started when no probe is set.
SETTLE = 0.5
STEP = 0.1  # seconds between health checks
# Between a port's or a URL's checks until it first answers: 2 ms, then a fifth longer each time,
# up to 50 ms. A start is seen at most 2 ms and a fifth of its time after it, in few checks of a
# slow one (13 in its first 0.1 s, 32 in 1 s; a docker driver's check is an API call).
FIRST_STEP, FIRST_STEP_GROWTH, FIRST_STEP_MAX = 0.002, 1.2, 0.05


def _probe(health: Health, driver: Driver, name: str) -> bool:
    if health.kind == "command":
        return driver.run_check(name, health.target)
    if health.kind == "tcp":
        host, _, port = health.target.rpartition(":")
        try:
            with socket.create_connection((host or "127.0.0.1", int(port)), timeout=1.0):
                return True
        except OSError:
            return False
    if health.kind == "http":
        import http.client
        import urllib.error
        import urllib.request

        if urlsplit(health.target).scheme not in ("http", "https"):
            return False
        try:
            with urllib.request.urlopen(health.target, timeout=2.0) as resp:  # noqa: S310
                return 200 <= int(resp.status) < 300
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException):
            return False
    return True


def wait_healthy(driver: Driver, svc: DesiredService, sleep: Callable[[float], None] = time.sleep) -> None:
    """Return once the service has passed its check without a break for ``min_healthy`` seconds
    and its own process (container) is still the one running; ``ApplyError`` on exit, on an
    unhealthy verdict, when it never passes within ``timeout``, or when it keeps flapping."""
    h = svc.health
    # Without a probe, surviving a short settle time is the only sign of life we have.
    hold = max(h.min_healthy, min(SETTLE, h.timeout)) if h.kind == "running" else h.min_healthy
    start = time.monotonic()
    since: float | None = None  # when the check last started passing
    first = FIRST_STEP
    while True:
        if not driver.running(svc.name):
            raise _exited(driver, svc, since)
        native = driver.native_health(svc.name)
        if native == "unhealthy":
            raise ApplyError(f"service {svc.name} reports unhealthy (its own healthcheck)")
        passing = native in (None, "healthy") and _probe(h, driver, svc.name)
        now = time.monotonic()
        if passing:
            since = now if since is None else since
            if now - since >= hold:
                # Another program on the same port can answer the probe: only our own process counts.
                if not driver.running(svc.name):
                    raise _exited(driver, svc, since)
                return
        else:
            since = None
            if now >= start + h.timeout:
                what = f"{h.kind} {h.target}".strip()
                # What it printed says why, more often than not (kept in the history, redacted).
                raise ApplyError(f"service {svc.name} not healthy after {h.timeout:g}s ({what})",
                                 output=_last_output(driver, svc.name))
        if now >= start + h.timeout + hold:
            raise ApplyError(f"service {svc.name} did not stay healthy for {hold:g}s in a row "
                             f"within {h.timeout + hold:g}s (its check keeps failing and passing)",
                             output=_last_output(driver, svc.name))
        # A check every step, and one right as the hold ends (not up to a step after it); a cheap
        # probe (a port, a URL) more often until it first passes, so a start is seen soon.
        step = STEP if passing or h.kind == "command" else first
        first = min(first * FIRST_STEP_GROWTH, FIRST_STEP_MAX)
        sleep(min(step, since + hold - now) if since is not None else step)


def _last_output(driver: Driver, name: str) -> str:
    """The service's last lines, for the error that explains its failure ("" if unreadable)."""
    try:
        return driver.last_output(name)
    except Exception:  # a log that cannot be read must not hide the failure it would explain
        return ""


def _exited(driver: Driver, svc: DesiredService, since: float | None) -> ApplyError:
    if since is None:
        text = f"service {svc.name} exited at once"
    elif svc.health.kind == "running":
        text = f"service {svc.name} exited {time.monotonic() - since:.1f}s after it started (min_healthy " \
               f"{svc.health.min_healthy:g}s)"
    else:
        text = (f"service {svc.name} exited {time.monotonic() - since:.1f}s after its health check passed "
                f"(min_healthy {svc.health.min_healthy:g}s): the check may be answered by another program")
    return ApplyError(text, output=_last_output(driver, svc.name))


def apply_plan(
    plan: Plan, drivers: Mapping[str, Driver], ledger: Ledger, recheck: frozenset[str] = frozenset(),
    redact: Redactor = NO_SECRETS, max_parallel: int = 1,
) -> list[ServiceResult]:
    """Apply in order. ``recheck``: services a killed run had started but not yet seen healthy;
    they are health-checked even when the plan leaves them alone. ``redact``: the node's secret
    values, replaced in whatever a failure says (a service may print its own password).
    ``max_parallel``: how many services that do not depend on each other are under way at once
    (``batches``: a sliding window, a service starting as soon as a slot frees and what it
    depends on is healthy): their starts and health holds overlap, their side effects take turns;
    a service that fails is put back alone, those under way beside it finish, and what had not
    started is skipped. A stop, drain or reboot runs alone, in this thread.

    Each action is journalled before it runs and settled only after its effect (or after the
    previous version was put back), so a run killed in between leaves the entry, and the next
    run does the action again. A service's version is filed under the commit it was rendered
    from (a pinned service's is its pin's), which is what a later rollback looks for."""
    results: dict[int, ServiceResult] = {}
    failed: str | None = None
    actions = plan.actions
    pending = list(range(len(actions)))
    running: dict[int, tuple[int, list[str]]] = {}  # under way: journal entry, steps tried

    def busy(a: Action) -> bool:
        return a.kind is not ActionKind.NONE or a.sync or a.service in recheck

    def settle(i: int, entry: int, steps: list[str], outcome: Outcome[tuple[int | None, ActionKind]]) -> None:
        nonlocal failed
        results[i] = _record(plan, actions[i], entry, steps, outcome, ledger, redact)
        if results[i].state is ResultState.FAILED:
            failed = failed or f"not applied: {actions[i].service} failed first"
        elif results[i].action is ActionKind.REBOOT:
            failed = "not applied yet: the node reboots first"

    with Window[tuple[int | None, ActionKind]]() as window:
        while pending or running:
            while window.finished():  # judged before anything else starts: a failure stops the rest
                i, outcome = window.collect()
                settle(i, *running.pop(i), outcome)
            if failed is not None:  # nothing more starts; what is under way finishes
                results.update((i, _left(actions[i], failed)) for i in pending)
                pending = []
            ready = startable(actions, pending, running, max_parallel, busy)
            assert ready or running or not pending, "nothing under way and nothing may start"
            for i in ready:
                if window.finished():  # one under way completed (perhaps failed) as the last started
                    break
                pending.remove(i)
                action = actions[i]
                if action.kind is ActionKind.NONE and not action.sync and not (
                        action.desired and action.service in recheck):
                    results[i] = _left(action, "")  # nothing to do, nothing to check
                    continue
                entry, steps = ledger.intent(plan.commit, action.service, action.kind), list[str]()
                task = partial(_attempt, action, drivers, _origin(plan, action), steps, redact)
                if alone(action, max_parallel):  # in this thread, with nothing beside it
                    settle(i, entry, steps, together([task])[0])
                    break
                window.start(i, task)
                running[i] = (entry, steps)
            else:
                if running and not ready:  # (one with nothing to do may have let a dependent start)
                    i, outcome = window.collect()
                    settle(i, *running.pop(i), outcome)
    return [results[i] for i in range(len(actions))]


def _left(action: Action, failed: str) -> ServiceResult:
    """An action not run: one with nothing to do is fine as it is; another, after a failure
    (``failed`` says which), is skipped."""
    h = action.desired.hash if action.desired else None
    if action.kind is ActionKind.NONE and not action.sync:
        return ServiceResult(action.service, action.kind, ResultState.OK, action.reason, hash=h)
    return ServiceResult(action.service, action.kind, ResultState.SKIPPED, action.reason, detail=failed, hash=h)


def _origin(plan: Plan, action: Action) -> str:
    return (action.desired.origin or plan.commit) if action.desired else plan.commit


def _attempt(action: Action, drivers: Mapping[str, Driver], origin: str, steps: list[str], redact: Redactor,
             wait: Wait) -> tuple[int | None, ActionKind]:
    try:
        return _do(action, drivers[action.driver], origin, steps, redact, wait)
    except ReconcilerError:
        raise
    except Exception as exc:  # a runtime's own error (API, OS, timeout): a failed action, noted
        raise ApplyError(f"service {action.service}: {type(exc).__name__}: {exc}") from exc


def _record(plan: Plan, action: Action, entry: int, steps: list[str],
            outcome: Outcome[tuple[int | None, ActionKind]], ledger: Ledger, redact: Redactor) -> ServiceResult:
    """What one action came to, into the ledger (history, version, journal entry settled)."""
    h = action.desired.hash if action.desired else None
    origin = _origin(plan, action)
    exc = outcome.error
    if exc is not None:
        if not isinstance(exc, ReconcilerError) or exc.reason == "DISK_FULL":
            raise exc  # not the service's fault: the run stops, the next one finishes
        said, output = redact(str(exc)), redact(_output(exc))
        ledger.log(action.service, origin, h, str(action.kind), "failed", action.reason,
                   said + (f" | output: {output}" if output else ""), head=plan.commit)
        ledger.failed(action.service, plan.commit)
        ledger.done(entry, ok=False)
        log.error("%s %s failed: %s", action.kind, action.service, said)
        return ServiceResult(action.service, action.kind, ResultState.FAILED, action.reason, detail=said, hash=h,
                             steps=tuple(steps))
    assert outcome.value is not None
    pid, done = outcome.value
    ledger.log(action.service, origin, h, str(done), "ok", action.reason, "; ".join(steps), head=plan.commit)
    if action.kind is ActionKind.STOP:
        ledger.removed(action.service)
    elif h is not None:
        ledger.ran(action.service, Version(origin, h), healthy=done is not ActionKind.REBOOT)
    ledger.done(entry, ok=True)
    log.info("%s %s: %s", done, action.service, action.reason)
    return ServiceResult(action.service, done, ResultState.OK, action.reason, pid=pid, hash=h, steps=tuple(steps))


EXECUTABLE = (ActionKind.RELOAD, ActionKind.RESTART, ActionKind.RECREATE, ActionKind.DRAIN_RESTART,
              ActionKind.REBOOT)


def escalation(kind: ActionKind, ceiling: ActionKind) -> list[ActionKind]:
    """``kind``, then each step up the ladder the driver can take, up to ``ceiling``."""
    return [k for k in LADDER if rank(kind) <= rank(k) <= max(rank(ceiling), rank(kind)) and k in EXECUTABLE]


def _output(exc: BaseException | None) -> str:
    """The service's own output, from anywhere in the chain of causes (escalation wraps them)."""
    seen = 0
    while exc is not None and seen < 20:
        if isinstance(exc, ApplyError) and exc.output:
            return exc.output
        exc = exc.__cause__
        seen += 1
    return ""


def hook(svc: DesiredService, which: str, commit: str, redact: Redactor = NO_SECRETS) -> None:
    """Run a drain or undrain hook on this node; a failing drain stops the action. Its output
    is cleaned of secret values before it is cut (a value cut in half would match none)."""
    import subprocess

    command = svc.drain if which == "drain" else svc.undrain
    if not command:
        return
    env = {**clean_env(), "RECONCILER_SERVICE": svc.name, "RECONCILER_COMMIT": commit}
    try:
        done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, env=env, timeout=1800)
    except subprocess.TimeoutExpired as exc:
        raise ApplyError(f"service {svc.name}: {which} hook timed out") from exc
    if done.returncode != 0:
        said = redact((done.stderr or done.stdout).strip())[-200:]
        raise ApplyError(f"service {svc.name}: {which} hook failed: {said}")


def _do(action: Action, driver: Driver, commit: str, steps: list[str],
        redact: Redactor = NO_SECRETS, wait: Wait = inline) -> tuple[int | None, ActionKind]:
    """Run the action (escalating on failure); return the pid and the step that worked. Each
    step tried goes into ``steps`` (redacted: it reaches the note). ``wait`` runs each health
    check: aside, in a batch, while the batch's other actions take their turns."""
    if action.kind is ActionKind.STOP:
        driver.remove(action.service)
        return None, action.kind
    svc = action.desired
    assert svc is not None

    def check() -> None:
        wait(lambda: wait_healthy(driver, svc, pause))  # cut short by a Ctrl-C in a batch

    match action.kind:
        case ActionKind.NONE:
            if action.sync:
                driver.update(svc, commit)
            check()  # after an interrupted run, or to see that new files did no harm
            return None, action.kind
        case ActionKind.CONNECT:
            driver.connect(svc, commit, check)  # a VIP it joins must leave it working
            return None, action.kind
        case ActionKind.START:
            return driver.start(svc, commit, check), action.kind
    ladder = escalation(action.kind, svc.ceiling)

    def drain_restart(svc: DesiredService, commit: str, check: Check) -> int | None:
        hook(svc, "drain", commit, redact)
        try:
            return driver.restart(svc, commit, check)
        finally:
            hook(svc, "undrain", commit, redact)  # work comes back whether the restart worked or not

    def reboot(svc: DesiredService, commit: str, check: Check) -> int | None:
        do_reboot = getattr(driver, "reboot", None)
        if do_reboot is None:
            raise ApplyError(f"service {svc.name}: only a host service (driver: host) can reboot the node")
        hook(svc, "drain", commit, redact)
        do_reboot(svc, commit)
        return None

    methods: dict[ActionKind, Callable[[DesiredService, str, Check], int | None]] = {
        ActionKind.RELOAD: driver.reload, ActionKind.RESTART: driver.restart, ActionKind.RECREATE: driver.recreate,
        ActionKind.DRAIN_RESTART: drain_restart, ActionKind.REBOOT: reboot,
    }
    last: ReconcilerError | None = None
    for step in ladder:
        try:
            pid = methods[step](svc, commit, check)
        except PullFailed as exc:
            # No step up the ladder brings a missing image; a drain+restart would restart the old
            # container on the new files and record a version it is not running.
            steps.append(f"{step}: failed: {redact(str(exc))}")
            raise
        except ReconcilerError as exc:
            steps.append(f"{step}: failed: {redact(str(exc))}")
            log.warning("%s %s failed, escalating: %s", step, svc.name, redact(str(exc)))
            last = exc
            continue
        steps.append(f"{step}: ok")
        return pid, step
    assert last is not None
    raise ApplyError(f"{last} (tried {', '.join(str(s) for s in ladder)})") from last


@dataclass(frozen=True)
class Pulled:
    """One image a node's slice needs, fetched ahead of the change that uses it."""

    image: str
    services: tuple[str, ...]
    result: str  # "pulled" | "present" | "failed"
    detail: str = ""  # why it failed: the registry's reason, credentials stripped

    def to_dict(self) -> dict[str, Any]:
        return {"image": self.image, "services": list(self.services), "result": self.result, "detail": self.detail}


def pull_images(desired: Desired, drivers: Mapping[str, Driver]) -> list[Pulled]:
    """Every image the services of ``desired`` whose kind pulls ahead (docker's) run, on the
    node: pulled when missing, nothing else touched (no container, no record, no ledger). An
    image that cannot be pulled is a ``failed`` entry; an engine that does not answer raises
    ``EngineDown``."""
    images: dict[tuple[str, str], list[str]] = {}
    for svc in desired.services:
        kind = kinds.find(svc.runtime.driver)
        if kind is not None and kind.prefetch:
            images.setdefault((svc.runtime.image, svc.runtime.driver), []).append(svc.name)
    out = []
    for (image, driver), services in sorted(images.items()):
        puller = kinds.prefetching(driver, drivers[driver])
        assert puller is not None
        try:
            out.append(Pulled(image, tuple(services), "pulled" if puller.pull(image) else "present"))
        except PullFailed as exc:
            out.append(Pulled(image, tuple(services), "failed", str(exc)))
    return out
