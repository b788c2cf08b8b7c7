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

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from reconciler.repo.placement import NodeDef


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


def compute(nodes: Mapping[str, NodeDef], group_members: Mapping[str, list[str]], release: str,
            cutover_aborted: bool) -> Planes:
    """Every node's placement at one commit (``DeploymentRepo.planes``, computed once per repo):
    ``release`` is the inventory's, ``group_members`` every group's nodes."""
    release_of = {n: d.release or release for n, d in nodes.items()}
    pending = {n: d.pending_release for n, d in nodes.items()}
    plane = {n: pending[n] or release_of[n] for n in nodes}
    explicit = {n: Mode(d.mode) if d.mode else None for n, d in nodes.items()}
    if cutover_aborted:  # the cutover failed where it attached: its nodes go back to isolated
        explicit = {n: Mode.ISOLATED if m is Mode.CUTOVER else m for n, m in explicit.items()}
    live: dict[str, set[str]] = {}
    for g, members in group_members.items():
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
        placements[n] = Placement(release_of[n], pending[n], mode, derived, attached,
                                  split=mode is not Mode.NORMAL or not attached)
    active = len(set(plane.values())) > 1 or any(m is not None for m in explicit.values())
    return Planes(placements, {g: tuple(m) for g, m in group_members.items()},
                  {n: d.groups for n, d in nodes.items()}, active)


def vip_networks(settings: Mapping[str, Any]) -> frozenset[str]:
    return frozenset(str(n) for n in (settings.get("vip") or {}).get("networks", ()))


def vip_services(settings: Mapping[str, Any]) -> frozenset[str]:
    return frozenset(str(n) for n in (settings.get("vip") or {}).get("services", ()))
