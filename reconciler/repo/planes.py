"""Releases, isolation and cutover: two control planes side by side (Fuel's isolated upgrade). Pure.

A node runs a ``release`` (its own, or the inventory's) and may have a ``pending_release``,
the release it is being deployed as now: its *plane* is ``pending_release or release``. Two
planes that hold the same virtual IPs on one network break each other, so at any commit each
group has one *live* plane, the only one attached to the networks reconciler.yaml marks as
VIP networks (``vip.networks``) and the only one running the VIP services (``vip.services``):

- the planes of the group's ``mode: cutover`` members when it has any (the reviewed commit
  that switches the fleet), else those of its members that have no pending release and are
  not isolated by hand;
- a node whose pending release is not its groups' live plane is ``isolated`` on its own (a new
  control plane built beside the old one); ``mode: normal`` opts out, ``mode: isolated`` opts in;
- an isolated node and a node of a plane that is not live (the old controllers after a
  cutover) are *split*: each sees as peers (``groups``, ``hostvars``) only the nodes of its own
  plane, and nobody else sees it: the new cluster never learns the old one's members, and the
  old one's config does not change when the new one is added. Both still render the same VIP
  addresses (variables): only the attachment differs.

Order, gated on the notes like a wave (``rollout.cutover_gate``): at a commit where a node attaches (it was not
attached at the commit it ran before), it waits until every node of its groups that is off the
VIP networks at this commit has noted it applied and detached: detach first, then attach, so
there is never a moment with both planes attached. A revert of a cutover is the same rule run
backwards (the new plane detaches, then the old attaches).

A cutover commit that fails on a node that attaches is *aborted* (``cutover_aborted``, set by
the agent of an old node that reads the failure): the commit is then placed as if its cutover
nodes were isolated, so the old plane re-attaches; the fleet gate halts everyone else on the
failed note.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from reconciler.repo.yamlfile import Problem

if TYPE_CHECKING:
    from reconciler.repo.load import DeploymentRepo


class Mode(StrEnum):
    NORMAL = "normal"
    ISOLATED = "isolated"
    CUTOVER = "cutover"


@dataclass(frozen=True)
class Placement:
    """Where one node stands at one commit."""

    release: str  # what it runs: its own release, or the inventory's
    pending: str  # what it is being deployed as ("": nothing pending)
    mode: Mode
    derived: bool  # the mode comes from its pending release, not from `mode:`
    attached: bool  # on the VIP networks, running the VIP services
    split: bool  # sees, and is seen by, the nodes of its own plane only

    @property
    def plane(self) -> str:
        return self.pending or self.release

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"release": self.release, "mode": str(self.mode),
                               "vip": "attached" if self.attached else "detached"}
        if self.pending:
            out["pending_release"] = self.pending
        if self.derived:
            out["derived"] = True
        return out


@dataclass(frozen=True)
class Planes:
    """Every node's placement at one commit, and what follows from it."""

    placements: Mapping[str, Placement]
    members: Mapping[str, tuple[str, ...]]  # group -> its nodes
    groups_of: Mapping[str, tuple[str, ...]]  # node -> its groups
    active: bool  # more than one plane, or a mode set: anything below differs from "everyone, attached"
    _views: dict[tuple[str, bool], frozenset[str]] = field(default_factory=dict, compare=False, repr=False)

    def __getitem__(self, node: str) -> Placement:
        return self.placements[node]

    def sees(self, node: str, other: str) -> bool:
        a, b = self.placements[node], self.placements[other]
        return a.plane == b.plane or not (a.split or b.split)

    def visible(self, node: str) -> frozenset[str]:
        """The nodes ``node`` sees as peers: the same for every node of one plane and split
        state, so computed once per such pair (a fleet of 10,000 renders in linear time)."""
        me = self.placements[node]
        key = (me.plane, me.split)
        if key not in self._views:
            self._views[key] = frozenset(n for n in self.placements if self.sees(node, n))
        return self._views[key]

    def cohort(self, node: str) -> frozenset[str]:
        """The nodes sharing one of ``node``'s groups (itself too)."""
        return frozenset(m for g in self.groups_of.get(node, ()) for m in self.members.get(g, ()))

    def off(self, node: str) -> tuple[str, ...]:
        """The nodes of ``node``'s groups that are off the VIP networks at this commit."""
        return tuple(sorted(n for n in self.cohort(node) if n != node and not self.placements[n].attached))

    def attaches(self, node: str, before: bool | None) -> bool:
        """``node`` goes onto the VIP networks at this commit, coming from ``before`` (attached
        after the commit it ran last; None: it ran nothing)."""
        return self.active and self.placements[node].attached and not before

    def detaches(self, node: str, before: bool | None) -> bool:
        return self.active and not self.placements[node].attached and bool(before)

    def cutover(self, node: str) -> tuple[str, ...]:
        """The nodes of ``node``'s groups that take the VIP networks over at this commit."""
        return tuple(sorted(n for n in self.cohort(node) if n != node and self.placements[n].mode is Mode.CUTOVER))


def planes(repo: DeploymentRepo) -> Planes:
    """Computed once per repo (``DeploymentRepo.planes``)."""
    return repo.planes


def compute(repo: DeploymentRepo) -> Planes:
    nodes = repo.nodes
    release = {n: d.release or repo.release for n, d in nodes.items()}
    pending = {n: d.pending_release for n, d in nodes.items()}
    plane = {n: pending[n] or release[n] for n in nodes}
    explicit = {n: Mode(d.mode) if d.mode else None for n, d in nodes.items()}
    if repo.cutover_aborted:  # the cutover failed where it attached: its nodes go back to isolated
        explicit = {n: Mode.ISOLATED if m is Mode.CUTOVER else m for n, m in explicit.items()}
    live: dict[str, set[str]] = {}
    group_members = repo.group_members
    for g in repo.groups:
        members = group_members.get(g, [])
        cut = {plane[n] for n in members if explicit[n] is Mode.CUTOVER}
        live[g] = cut or {plane[n] for n in members if explicit[n] is Mode.NORMAL
                          or (not pending[n] and explicit[n] is not Mode.ISOLATED)}
    placements = {}
    for n, d in nodes.items():
        mode, derived = explicit[n], False
        if mode is None:
            derived = bool(pending[n]) and any(live[g] and pending[n] not in live[g] for g in d.groups)
            mode = Mode.ISOLATED if derived else Mode.NORMAL
        if mode is Mode.ISOLATED:
            attached = False
        elif mode is Mode.CUTOVER:
            attached = True
        else:
            attached = all(not live[g] or plane[n] in live[g] for g in d.groups)
        placements[n] = Placement(release[n], pending[n], mode, derived, attached,
                                  split=mode is not Mode.NORMAL or not attached)
    active = len(set(plane.values())) > 1 or any(m is not None for m in explicit.values())
    return Planes(placements, {g: tuple(m) for g, m in group_members.items()},
                  {n: d.groups for n, d in nodes.items()}, active)


def vip_networks(settings: Mapping[str, Any]) -> frozenset[str]:
    return frozenset(str(n) for n in (settings.get("vip") or {}).get("networks", ()))


def vip_services(settings: Mapping[str, Any]) -> frozenset[str]:
    return frozenset(str(n) for n in (settings.get("vip") or {}).get("services", ()))


def check(repo: DeploymentRepo, lines: Mapping[str, int | None]) -> list[Problem]:
    """What ``validate`` refuses: a VIP network attached to nodes of two releases at once,
    cutover nodes of one group on two releases, a VIP name no service uses. ``lines``: node ->
    its line in inventory.yaml."""
    problems: list[Problem] = []
    p = planes(repo)
    nets, vsvcs = vip_networks(repo.settings), vip_services(repo.settings)
    used = {str(_net_name(e)) for s in repo.services.values() for e in s.container.get("networks", ())}
    for name in sorted(nets - used):
        problems.append(Problem("reconciler.yaml", None, f"vip.networks: no service names network {name!r}"))
    for name in sorted(vsvcs - set(repo.services)):
        problems.append(Problem("reconciler.yaml", None, f"vip.services: unknown service {name!r}"))
    for g in sorted(repo.groups):
        members = repo.members(g)
        cut = sorted({p[n].plane for n in members if p[n].mode is Mode.CUTOVER})
        if len(cut) > 1:
            problems.append(Problem("inventory.yaml", lines.get(members[0]),
                                    f"group {g}: cutover nodes on releases {', '.join(cut)}: one plane at a time"))
    for net in sorted(nets):
        on: dict[str, list[str]] = {}
        for n in sorted(repo.nodes):
            if not p[n].attached:
                continue
            if any(net in {str(_net_name(e)) for e in repo.services[s].container.get("networks", ())}
                   for s in repo.services_of(n) if s in repo.services):
                on.setdefault(p[n].plane, []).append(n)
        if len(on) > 1:
            where = "; ".join(f"release {r}: {', '.join(ns)}" for r, ns in sorted(on.items()))
            last = max(on.items(), key=lambda kv: kv[0])[1][0]
            problems.append(Problem("inventory.yaml", lines.get(last),
                                    f"VIP network {net!r} would be attached to two releases at once ({where}); "
                                    "isolate the new one (pending_release, mode: isolated) or cut over "
                                    "(mode: cutover)"))
    return problems


def _net_name(entry: Any) -> Any:
    return entry.get("name") if isinstance(entry, Mapping) else entry


def order(before: DeploymentRepo, after: DeploymentRepo, nodes: Iterable[str]) -> tuple[tuple[str, ...],
                                                                                     tuple[str, ...]]:
    """For a review: the nodes that leave the VIP networks between the two commits (first),
    and those that join them (after every node off them at ``after`` noted it)."""
    pb, pa = planes(before), planes(after)
    detach, attach = [], []
    for n in sorted(nodes):
        was = pb[n].attached if n in before.nodes else None
        now = pa[n].attached if n in after.nodes else None
        if was and not now:
            detach.append(n)
        elif now and not was and (pa.active or pb.active) and n in before.nodes:
            attach.append(n)
    return tuple(detach), tuple(attach)


@dataclass(frozen=True)
class CutoverStep:
    """One step of a review's cutover order: nodes leaving (or joining) the VIP networks, and
    per node the services whose networks change live."""

    verb: str  # "detach" | "attach"
    nodes: Mapping[str, tuple[str, ...]]  # node -> services connected or disconnected
    releases: tuple[str, ...]
    after: tuple[str, ...] = ()  # attach: the nodes whose notes it waits for

    def line(self, n: int) -> str:
        who = "; ".join(f"{node} ({', '.join(svcs) or 'no service'})" for node, svcs in self.nodes.items())
        text = f"{n}. {self.verb} {who}: release {', '.join(self.releases)}"
        if self.after:
            text += f", once {', '.join(self.after)} noted the commit applied and detached"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.verb, "nodes": {n: list(s) for n, s in self.nodes.items()},
                "releases": list(self.releases), "after": list(self.after)}


def cutover_steps(before: DeploymentRepo, after: DeploymentRepo, nodes: Iterable[str],
                  connects: Mapping[str, tuple[str, ...]]) -> tuple[CutoverStep, ...]:
    """The order a commit moves the VIP networks in: detach first, then attach (empty when it
    moves nothing). ``connects``: node -> the services whose networks change there (the plan's)."""
    detach, attach = order(before, after, nodes)
    pa, pb = planes(after), planes(before)
    steps = []
    if detach:
        steps.append(CutoverStep("detach", {n: connects.get(n, ()) for n in detach},
                                 tuple(sorted({pb[n].plane for n in detach}))))
    if attach:
        off = tuple(sorted({m for n in attach for m in pa.off(n)}))
        steps.append(CutoverStep("attach", {n: connects.get(n, ()) for n in attach},
                                 tuple(sorted({pa[n].plane for n in attach})), off))
    return tuple(steps)
