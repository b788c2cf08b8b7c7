"""The order a commit moves the VIP networks in, for a review: the nodes that leave them
between two commits first, then those that join them (see ``planes``). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.repo.definitions import DeploymentRepo


def order(before: DeploymentRepo, after: DeploymentRepo, nodes: Iterable[str]) -> tuple[tuple[str, ...],
                                                                                     tuple[str, ...]]:
    """For a review: the nodes that leave the VIP networks between the two commits (first),
    and those that join them (after every node off them at ``after`` noted it)."""
    pb, pa = before.planes, after.planes
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
    pa, pb = after.planes, before.planes
    steps = []
    if detach:
        steps.append(CutoverStep("detach", {n: connects.get(n, ()) for n in detach},
                                 tuple(sorted({pb[n].plane for n in detach}))))
    if attach:
        off = tuple(sorted({m for n in attach for m in pa.off(n)}))
        steps.append(CutoverStep("attach", {n: connects.get(n, ()) for n in attach},
                                 tuple(sorted({pa[n].plane for n in attach})), off))
    return tuple(steps)
