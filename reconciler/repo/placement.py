"""Which node runs which service: the inventory's groups and nodes, a group's members, a node's
services and the driver each runs with. Pure.

A node runs the union of its groups' services, with one placement rule on top: the VIP
services (reconciler.yaml ``vip.services``) run only on the live control plane. A node off the
VIP networks (isolated, or of a plane that is not live: see ``planes``) does not run them, as
the services that hold the VIPs themselves would fight the live plane's for them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GroupDef:
    name: str
    services: tuple[str, ...]
    vars: Mapping[str, Any]


@dataclass(frozen=True)
class NodeDef:
    name: str
    groups: tuple[str, ...]
    driver: str | None
    vars: Mapping[str, Any]
    manual: bool = False
    release: str = ""  # what it runs ("": the inventory's)
    pending_release: str = ""  # what it is being deployed as (see ``planes``)
    mode: str = ""  # normal | isolated | cutover; "": derived from the pending release
    line: int | None = None  # in inventory.yaml


def members(nodes: Mapping[str, NodeDef], group: str) -> tuple[str, ...]:
    """The group's nodes, sorted by name."""
    return tuple(sorted(n for n, d in nodes.items() if group in d.groups))


def group_members(groups: Iterable[str], nodes: Mapping[str, NodeDef]) -> dict[str, list[str]]:
    """Group -> sorted member nodes, every group by name."""
    return {g: list(members(nodes, g)) for g in sorted(groups)}


def off_plane(vip_services: frozenset[str], attached: bool) -> frozenset[str]:
    """The placement rule of the VIP services: what a node its groups give them to does not run.
    Off the VIP networks (``attached`` False) it runs none of them: they hold the VIPs themselves,
    so off the live plane they are not run; on it, all of them."""
    return frozenset() if attached else vip_services


def services_of(node: NodeDef, groups: Mapping[str, GroupDef], vip_services: frozenset[str],
                attached: bool) -> tuple[str, ...]:
    """The node's services: the union of its groups' services, less what ``off_plane`` keeps
    off it, sorted by name."""
    names: set[str] = set()
    for g in node.groups:
        names.update(groups[g].services)
    return tuple(sorted(names - off_plane(vip_services, attached)))


def driver_of(service_driver: str | None, node: NodeDef, settings: Mapping[str, Any]) -> str:
    """The driver a node runs a service with: the service's, else the node's, else the repo's
    default (reconciler.yaml ``defaults.driver``), else process."""
    return service_driver or node.driver or str(settings.get("defaults", {}).get("driver", "process"))
