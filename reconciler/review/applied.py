"""A review's "A as applied": what a node observes once commit A is applied and healthy, the
observed side of the plan ``diff`` makes for B (the same pure planner a node runs).

The planner reads an observed service's hash and fingerprint only to compare them with the
desired service's: equal or not, part by part. So a review need not hash A's files to say that:
a part of A that is the same as B's (same file bytes, mode and key; same runtime and health
check) takes B's value, which B's plan computes anyway; a part that differs takes a value no
hash can be (``_DIFFERS``). The planner then compares exactly as it would with A's real hashes,
and says the same. At 30 services a node, hashing A was a sixth of a fleet diff.
"""

from __future__ import annotations

from reconciler.core.compare import file_decision
from reconciler.core.memo import Bounded, ByIdentity
from reconciler.core.model import Action, ActionKind, Desired, DesiredService, Observed, ObservedService, Plan
from reconciler.drivers.kinds import config_change
from reconciler.plan.planner import changed, unchanged
from reconciler.plan.planner import plan as make_plan

# Not hex: never equal to a part's hash, nor to a slice's.
_DIFFERS = "differs from the commit under review (not hashed)"


def as_applied(desired: Desired) -> Observed:
    """What a node observes once ``desired`` is applied and healthy."""
    return Observed(desired.node, tuple(_applied(s, desired.commit) for s in desired.services))


def applied_against(desired: Desired, then: Desired) -> Observed:
    """``as_applied(desired)`` as a plan for ``then`` reads it: each hash and fingerprint value
    compares with ``then``'s as the real ones would (see the module's doc), without hashing
    ``desired``'s files."""
    after = then.by_name()
    return Observed(desired.node, tuple(_applied(s, desired.commit) if not s.files or s.name not in after
                                        else _applied_against(s, after[s.name], desired.commit)
                                        for s in desired.services))


# A stand-in (``render.node.stand_in``) is one object on every node that does not render its
# service: applied, it reads the same on each, so it is made once per commit, not per node
# (most of a one-service change's diff is the services it does not change).
_APPLIED: ByIdentity[ObservedService] = ByIdentity(4096)


def _applied(s: DesiredService, commit: str) -> ObservedService:
    key = (id(s), commit)
    hit = _APPLIED.get(key) if not s.files else None  # a rendered service is a node's own: never met again
    if hit is None:
        hit = ObservedService(s.name, s.runtime.driver, True, s.hash, commit, None, "",
                              tuple(sorted(s.fingerprint().items())), "", s.files)
        if not s.files:
            _APPLIED.put(key, hit, s)
    return hit


def _applied_against(s: DesiredService, t: DesiredService, commit: str) -> ObservedService:
    if not (s.runtime is t.runtime or s.runtime == t.runtime) or not (s.health is t.health or s.health == t.health):
        return _applied(s, commit)  # how it runs changed (rare): A's parts hashed as they are
    theirs = t.fingerprint()
    if len(s.files) == 1 and len(t.files) == 1 and s.files[0].path == t.files[0].path:
        # One file on both sides (most services): B's parts, that file's value replaced if it differs.
        was, now = s.files[0], t.files[0]
        if now.content == was.content and now.mode == was.mode and now.key == was.key:
            return ObservedService(s.name, s.runtime.driver, True, t.hash, commit, None, "",
                                   tuple(sorted(theirs.items())), "", s.files)
        theirs[f"file:{was.path}"] = _DIFFERS  # a copy: the fingerprint A's parts read as
        return ObservedService(s.name, s.runtime.driver, True, _DIFFERS, commit, None, "",
                               tuple(sorted(theirs.items())), "", s.files)
    mine = {key: value for key, value in theirs.items() if not key.startswith("file:")}  # the spec's parts
    other = {f.path: f for f in t.files}
    for f in s.files:
        key = f"file:{f.path}"
        o = other.get(f.path)
        same = o is not None and o.content == f.content and o.mode == f.mode and o.key == f.key
        mine[key] = theirs[key] if same else _DIFFERS
    same_slice = mine == theirs
    return ObservedService(s.name, s.runtime.driver, True, t.hash if same_slice else _DIFFERS, commit, None, "",
                           tuple(sorted(mine.items())), "", s.files)


# The planner's actions of a stand-in and its record applied (``plan.planner``'s ``shared``):
# one pair, so one action, on every node that does not render the service.
SHARED_ACTIONS: ByIdentity[Action] = ByIdentity(4096)

# A stand-in's action is one object on every node that does not render it (``SHARED_ACTIONS``):
# what a review keeps of it is made once too.
_KEPT: ByIdentity[Action] = ByIdentity(4096)


# A rendered service's action as kept, by value: a change made alike on every node ("only
# [DEFAULT] region changed in svc.conf") keeps one object for all of them, not one per node.
_ALIKE: Bounded[tuple[object, ...], Action] = Bounded(4096)


def kept_of(a: Action) -> Action:
    """The action without the rendered service it carries (what a review keeps)."""
    if a.desired is None:
        return a
    if a.desired.files:
        key = (a.kind, a.service, a.reason, a.driver, a.sync, a.staged, a.waiting, a.held_by)
        _, alike = _ALIKE.lookup(key)
        return alike if alike is not None else _ALIKE.put(key, a.without_desired())
    hit = _KEPT.get(id(a))
    return hit if hit is not None else _KEPT.put(id(a), a.without_desired(), a)


def planned(da: Desired, db: Desired) -> tuple[Plan, Desired, Desired]:
    """``plan(db, applied_against(da, db))`` with its actions as a review keeps them (``kept_of``),
    and both slices without their stand-ins (which have no file to show).

    A stand-in (``render.node.stand_in``) is one object on every node of a group, and its action
    against its record applied is one action: a one-service change across 1000 nodes would plan
    29 of 30 services alike 1000 times. So the plan is made whole once per shape (the stand-ins
    at both commits by identity, the rendered services by name, driver and dependencies: all the
    order and the stand-ins' actions read), and on the other nodes of that shape only the rendered
    services are planned, each action put where the whole plan has it."""
    own_a, shape_a = _split(da)
    own_b, shape_b = _split(db)
    shown_a, shown_b = Desired(da.node, da.commit, own_a), Desired(db.node, db.commit, own_b)
    if sorted([s.name for s in own_a]) != sorted([s.name for s in own_b]):
        return _whole(da, db), da, db  # a service added, removed, or rendered at one commit only
    key = (da.commit, shape_a, shape_b)
    shape = _SHAPES.get(key)
    if shape is None:
        whole = _whole(da, db)
        if not any(a.kind is ActionKind.STOP for a in whole.actions):  # a stop reads the observed order
            rendered = {s.name for s in own_b}
            _SHAPES.put(key, tuple([(a.service, None if a.service in rendered else a) for a in whole.actions]),
                        *(s for s in (*da.services, *db.services) if _standing(s)))
        return whole, shown_a, shown_b
    quick = _quickly(own_a, own_b, da.commit)
    if quick is not None:
        return Plan(db.node, db.commit, tuple([quick[name] if a is None else a for name, a in shape])), \
            shown_a, shown_b
    mine = {a.service: a for a in make_plan(shown_b, applied_against(shown_a, shown_b), shared=SHARED_ACTIONS).actions}
    if any(a.kind is ActionKind.STOP for a in mine.values()):
        return _whole(da, db), da, db
    return Plan(db.node, db.commit, tuple([kept_of(mine[name]) if a is None else a for name, a in shape])), \
        shown_a, shown_b


def _quickly(own_a: tuple[DesiredService, ...], own_b: tuple[DesiredService, ...],
             commit_a: str) -> dict[str, Action] | None:
    """The kept action of each rendered service, as the planner would make it against A as
    applied, when every one of them runs as at A and has one file at both commits (most
    services); None: ask the planner.

    Against A as applied (``applied_against``) such a service is either the same slice (A's
    file bytes, mode and key: "unchanged since A") or differs in that file alone; the planner
    then asks ``decide`` about that file's change and says what ``_action_for`` says of a running
    service with no hand edit. Worked out here without B's hashes, its fingerprint or a record
    applied, none of which the action reads beyond "equal or not" (at 30,000 changed services a
    third of a fleet diff's planning). The first node of each shape is planned whole by the
    planner, and tests/test_diff_speed4.py holds the two to the same plans."""
    before = {s.name: s for s in own_a}
    out: dict[str, Action] = {}
    for t in own_b:
        s = before.get(t.name)
        if s is None or len(s.files) != 1 or len(t.files) != 1:
            return None
        if not (s.runtime is t.runtime or _equal(s.runtime, t.runtime)) or \
                not (s.health is t.health or _equal(s.health, t.health)):
            return None
        was, now = s.files[0], t.files[0]
        if was.path != now.path:
            return None
        driver = t.runtime.driver
        # The driver's default asked afresh, as the planner does: a kind can be registered again.
        said = _UNCHANGED if now.content == was.content and now.mode == was.mode and now.key == was.key else \
            file_decision(was, now, t.rules, config_change(driver))
        # What ``decide`` said is one object wherever the same change of the same rules is met:
        # the action made of it is found by that object, not by hashing each of its fields.
        key = (id(said), t.name, driver, commit_a)
        hit = _QUICK.get(key)
        out[t.name] = hit if hit is not None else _QUICK.put(key, _action(t.name, driver, said, commit_a), said)
    return out


_UNCHANGED = (ActionKind.NONE, "")  # the slice is A's: "unchanged since" A
# (what ``decide`` said, service, driver, A's commit) -> the kept action.
_QUICK: ByIdentity[Action] = ByIdentity(4096)


def _action(service: str, driver: str, said: tuple[ActionKind, str], commit_a: str) -> Action:
    """The kept action the planner makes of a running service, no hand edit, whose files changed
    as ``said`` says, or that is as at A (``_UNCHANGED``): its own ``changed`` and ``unchanged``."""
    made = unchanged(service, driver, commit_a) if said is _UNCHANGED else changed(*said, service, driver)
    key = (made.kind, service, made.reason, driver, made.sync, False, "", "")
    _, alike = _ALIKE.lookup(key)
    return alike if alike is not None else _ALIKE.put(key, made)


# Whether two runtimes (or health checks) are equal, by their identities: a service's at A and
# at B are each one object on every node that renders it alike, compared field by field once.
_EQUAL: ByIdentity[bool] = ByIdentity(4096)


def _equal(a: object, b: object) -> bool:
    key = (id(a), id(b))
    said = _EQUAL.get(key)
    return said if said is not None else _EQUAL.put(key, a == b, a, b)


# A plan's shape -> per action, its service and, for a stand-in, the action as kept.
_SHAPES: ByIdentity[tuple[tuple[str, Action | None], ...]] = ByIdentity(1024)


def _standing(s: DesiredService) -> bool:
    """Made as a stand-in: no file, no command, no image (a rendered service has one of these;
    one that had none would only be planned whole on each node, as before)."""
    return not s.files and not s.runtime.command and not s.runtime.image


def _split(d: Desired) -> tuple[tuple[DesiredService, ...], tuple[object, ...]]:
    """The rendered services, and the slice's shape: a stand-in's identity, a rendered
    service's name, driver and dependencies."""
    own: list[DesiredService] = []
    shape: list[object] = []
    for s in d.services:
        if s.files or s.runtime.command or s.runtime.image:
            own.append(s)
            shape.append((s.name, s.runtime.driver, s.depends_on))
        else:
            shape.append(id(s))
    return tuple(own), tuple(shape)


def _whole(da: Desired, db: Desired) -> Plan:
    p = make_plan(db, applied_against(da, db), shared=SHARED_ACTIONS)
    return Plan(p.node, p.commit, tuple([kept_of(a) for a in p.actions]))
