"""``Desired`` + ``Observed`` -> ``Plan``. Pure: no I/O, no clock, same input, same plan.

Per service, the least that makes observed match desired:

- not observed: ``start``;
- observed under another driver: ``stop`` there, ``start`` here;
- slice differs: the least disruptive action every changed domain allows (see ``core.compare``):
  ``recreate`` if how it runs changed (image, command, ports...); for changed files, what the
  ``on_change`` rules say per file and key (``none``, ``reload``, ``restart``...), ``restart``
  where no rule says; ``connect`` if only networks changed;
- same slice but not running: ``start`` (it crashed or was stopped by hand);
- same slice, changed by hand (drift): put back, or only noted under ``drift: report``; live
  files changed by hand take what the ``on_change`` rules give the same change from the repo;
- same slice, running: ``none``, said explicitly;
- observed but no longer desired: ``stop`` (drivers only report what they started).

Stops come first; then the rest in dependency order (``depends_on``), ties broken by name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from reconciler.core.compare import decide
from reconciler.core.memo import ByIdentity
from reconciler.core.model import Action, ActionKind, Desired, DesiredService, Observed, ObservedService, Plan
from reconciler.drivers.kinds import config_change
from reconciler.repo.windows import Window, closed


def dependency_order(services: Iterable[DesiredService]) -> list[DesiredService]:
    """Dependencies first, deterministic (``order_of``)."""
    by_name = {s.name: s for s in services}
    shape = tuple([(n, s.depends_on) for n, s in by_name.items()])
    order = _ORDERS.get(shape)
    if order is None:
        if len(_ORDERS) >= 1024:
            _ORDERS.clear()
        order = _ORDERS[shape] = tuple(order_of(dict(shape)))
    return [by_name[n] for n in order]


# The order of a node's services by their names and dependencies: the nodes of a group run the
# same services, so a fleet's diff orders each set once, not once per node.
_ORDERS: dict[tuple[tuple[str, tuple[str, ...]], ...], tuple[str, ...]] = {}


def order_of(depends_on: Mapping[str, Iterable[str]]) -> list[str]:
    """Kahn's algorithm with a sorted ready set: each name after what it depends on (among
    these names), ties by name. Its reverse is the order to stop them in."""
    waiting = {n: {d for d in deps if d in depends_on} for n, deps in depends_on.items()}
    out: list[str] = []
    while waiting:
        ready = sorted(n for n, deps in waiting.items() if not deps)
        if not ready:  # repo validation rejects cycles; keep going by name rather than loop
            ready = [min(waiting)]
        for n in ready:
            out.append(n)
            del waiting[n]
        for deps in waiting.values():
            deps.difference_update(ready)
    return out


def _changed_parts(desired: DesiredService, observed: ObservedService) -> list[tuple[str, str]]:
    """(part, description) for each part of the slice that differs: file:<path>, runtime,
    networks, health."""
    before: Mapping[str, str] = dict(observed.fingerprint)
    after = desired.fingerprint()
    if not before:
        return [("runtime", "slice changed")]
    parts = []
    for key in sorted(set(before) | set(after)):
        if before.get(key) != after.get(key):
            kind, _, name = key.partition(":")
            if kind == "file":
                what = "added" if key not in before else "removed" if key not in after else "changed"
                parts.append((kind, f"{name} {what}"))
            else:
                parts.append((kind, f"{kind} changed"))
    return parts or [("runtime", "slice changed")]


def _short(commit: str | None) -> str:
    return commit[:12] if commit else "unknown commit"


def plan(desired: Desired, observed: Observed, held: Mapping[str, str] | None = None, *,
         shared: ByIdentity[Action] | None = None) -> Plan:
    """``held``: services an operator holds stopped (`reconciler stop`), left out of ``desired``
    on purpose: service -> who holds it, said as the reason of its stop. ``shared``: a review's
    table of the actions of (desired, observed) pairs that hold no files, by the pair's identity
    (a stand-in and its record applied are one pair on every node that does not render it). A
    node passes none: its observation is new objects every pass, and a table keyed by them would
    only grow in its daemon."""
    seen = observed.by_name()
    wanted = desired.by_name()
    held = held or {}
    actions: list[Action] = []

    for o in observed.services:
        if o.name not in wanted:
            why = f"held stopped by {held[o.name]} (reconciler stop)" if o.name in held \
                else "no longer assigned to this node"
            actions.append(Action(ActionKind.STOP, o.name, why, driver=o.driver))
        elif o.driver != wanted[o.name].runtime.driver:
            actions.append(Action(
                ActionKind.STOP, o.name, f"moves from driver {o.driver} to {wanted[o.name].runtime.driver}",
                driver=o.driver,
            ))

    for svc in dependency_order(desired.services):
        was = seen.get(svc.name)
        if shared is None or svc.files or was is None or was.files:
            actions.append(_action_for(svc, was))
            continue
        # Both frozen: the same pair, the same action, wherever it is met.
        key = (id(svc), id(was))
        hit = shared.get(key)
        actions.append(hit if hit is not None else shared.put(key, _action_for(svc, was), svc, was))

    return Plan(node=desired.node, commit=desired.commit, actions=tuple(actions))


def stage(plan: Plan) -> Plan:
    """Hold back the changes of services under ``apply: manual``: they become "none", their
    reason says what `reconciler apply` will do."""
    held = []
    for a in plan.actions:
        if a.desired is not None and a.desired.manual and (a.kind is not ActionKind.NONE or a.sync):
            held.append(Action(ActionKind.NONE, a.service, f"staged (apply: manual): {a.kind}: {a.reason}",
                               a.desired, a.driver, staged=True))
        else:
            held.append(a)
    return Plan(plan.node, plan.commit, tuple(held))


def in_windows(plan: Plan, windows: Iterable[Window], now: datetime) -> Plan:
    """Hold back each change whose kind a closed maintenance window gates on this node: it
    becomes "none" (its files are not touched either), its reason and ``waiting`` say which
    window it waits for and when that opens."""
    windows = tuple(windows)
    if not windows:
        return plan
    actions = []
    for a in plan.actions:
        shut = closed(a.kind, plan.node, windows, now) if a.kind is not ActionKind.NONE else None
        actions.append(a if shut is None else _held(a, str(shut), "WINDOW"))
    return Plan(plan.node, plan.commit, tuple(actions))


def hold_back(plan: Plan, kinds: Iterable[ActionKind], why: str, held_by: str) -> Plan:
    """Hold back every change of these kinds, for ``why`` (``held_by``: a disruption budget's
    BUDGET)."""
    kinds = frozenset(kinds)
    return Plan(plan.node, plan.commit, tuple(_held(a, why, held_by) if a.kind in kinds else a for a in plan.actions))


def _held(a: Action, why: str, held_by: str) -> Action:
    return Action(ActionKind.NONE, a.service, f"{why}: {a.kind}: {a.reason}", a.desired, a.driver,
                  waiting=f"{a.kind}: {why}", held_by=held_by)


def _put_back(svc: DesiredService, o: ObservedService, what: str) -> Action:
    """Live files changed by hand: the repo's files go back, and the program is brought back onto
    them with what the ``on_change`` rules ask for the same change made through the repo (the
    program may have read the hand edit: a reload rule re-reads, a restart rule restarts)."""
    default = config_change(svc.runtime.driver)
    kind, why = decide({"file"}, o.files, svc.files, svc.rules, default)
    if kind is ActionKind.NONE:
        return Action(kind, svc.name, f"{what}; put back, nothing restarted ({why})", svc, svc.runtime.driver,
                      sync=True)
    return Action(kind, svc.name, f"{what}; {kind} puts the repo's version back ({why})", svc, svc.runtime.driver)


def _action_for(svc: DesiredService, o: ObservedService | None) -> Action:
    drv = svc.runtime.driver
    if o is None or o.driver != drv:
        return Action(ActionKind.START, svc.name, "not running on this node yet", svc, drv)
    if o.hash != svc.hash:
        parts = {p for p, _ in _changed_parts(svc, o)}
        default = config_change(svc.runtime.driver)
        kind, reason = decide(parts, o.files, svc.files, svc.rules, default)
        # The new version goes over a hand edit (under drift: report too): said, not done silently.
        over = f"; replaces a hand edit ({o.drifted.removeprefix('files: ')})" if o.drifted else ""
        if not o.running:  # nothing to reload or connect: start it with the new slice
            return Action(ActionKind.START, svc.name, f"not running ({o.detail or 'stopped'}); {reason}{over}", svc,
                          drv)
        return changed(kind, reason, svc.name, drv, svc, over)
    if o.drifted or not o.running:
        stopped = f"not running ({o.detail or 'stopped'})"
        if o.drifted.startswith("files:"):  # a start writes the repo's files anyway
            what = f"{o.drifted} by hand" if o.running else f"{stopped}, {o.drifted} by hand"
        else:
            what = f"{o.drifted} changed by hand" if o.drifted else stopped
        if svc.drift == "report":
            return Action(ActionKind.NONE, svc.name, f"drift not corrected (policy report): {what}", svc, drv)
        if o.drifted.startswith("files:") and o.running:
            return _put_back(svc, o, what)
        if o.drifted and not o.drifted.startswith("files:"):
            kind = ActionKind.CONNECT if o.drifted == "networks" else ActionKind.RECREATE
            return Action(kind, svc.name, what, svc, drv)
        return Action(ActionKind.START, svc.name, f"{what}; same slice as {_short(o.commit)}", svc, drv)
    return unchanged(svc.name, drv, o.commit, svc)


def changed(kind: ActionKind, reason: str, service: str, driver: str, svc: DesiredService | None = None,
            over: str = "") -> Action:
    """A running service's action for files changed as ``decide`` said (``kind``, ``reason``):
    "none" only writes them (``sync``). ``over``: the hand edit the new version replaces. Also
    the review's (``review.applied``), which makes it without the planner."""
    if kind is ActionKind.NONE:
        return Action(kind, service, f"{reason}: files updated, nothing restarted{over}", svc, driver, sync=True)
    return Action(kind, service, reason + over, svc, driver)


def unchanged(service: str, driver: str, commit: str | None, svc: DesiredService | None = None) -> Action:
    """A running service whose slice is the one it runs (noted at ``commit``)."""
    return Action(ActionKind.NONE, service, f"unchanged since {_short(commit)}", svc, driver)

