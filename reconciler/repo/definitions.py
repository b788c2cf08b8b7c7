"""The deployment repo at one commit, as loaded (format v1): its services, groups, nodes and
settings, frozen. What ``load`` builds and every stage above reads.

``DeploymentRepo`` answers what follows from the definitions (a node's services, variables,
peers and driver, the control planes), each computed once per repo; the rules themselves are
``placement``'s and ``planes``', so a reader finds them in one place.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from reconciler.core.errors import UnknownNode
from reconciler.core.limits import LIMITS, Limits
from reconciler.core.model import ActionKind, Rule
from reconciler.repo import placement
from reconciler.repo import planes as control
from reconciler.repo.budgets import Budget
from reconciler.repo.placement import GroupDef, NodeDef
from reconciler.repo.planes import Planes
from reconciler.repo.sops import Opened, SopsFile
from reconciler.repo.steps import PostStep, Stage, Step
from reconciler.repo.windows import Window

__all__ = ["DeploymentRepo", "FileDecl", "GroupDef", "Merge", "NodeDef", "ServiceDef"]


@dataclass(frozen=True)
class Merge:
    """A file's ``merge``: override files of the repo (``sources``, repo paths that may hold
    variables) rendered and merged over its template (``render.merge``). ``format``: "ini" or
    "yaml"; "" with ``first_found`` (the first override found replaces the template)."""

    format: str
    sources: tuple[str, ...]
    first_found: bool = False
    extend_lists: bool = False


@dataclass(frozen=True)
class FileDecl:
    path: str
    mode: int
    template: str | None
    source: str | None
    line: int | None
    merge: Merge | None = None


@dataclass(frozen=True)
class ServiceDef:
    name: str
    file: str  # services/<name>/service.yaml, for error messages
    driver: str | None
    depends_on: tuple[str, ...]
    command: tuple[str, ...]
    env: Mapping[str, str]
    container: Mapping[str, Any]  # image, ports, volumes, networks, restart, user, healthcheck, config_dir
    drift: str
    on_change: tuple[Mapping[str, Any], ...]
    reload: Mapping[str, str]
    escalate_to: str
    drain: str
    undrain: str
    manual: bool
    files: tuple[FileDecl, ...]
    health: Mapping[str, Any]
    defaults: Mapping[str, Any]
    # repo path -> text, every file under services/<name>/templates/, and the override files
    # its files' ``merge`` may read (``repo.overrides``)
    templates: Mapping[str, str]
    sources: Mapping[str, bytes]  # repo path -> bytes
    lines: Mapping[str, int | None] = field(default_factory=dict)
    version: str = ""  # the release of the service's software: a change runs ``upgrade``
    upgrade: tuple[Step, ...] = ()
    upgrade_after: tuple[str, ...] = ()

    def template_path(self, name: str) -> str:
        return f"services/{self.name}/templates/{name}"

    @functools.cached_property
    def rules(self) -> tuple[Rule, ...]:
        """``on_change`` as the planner reads it: built once per definition, not once per node."""
        return tuple(Rule(str(r["file"]), ActionKind(r["action"]), tuple(str(k) for k in r.get("keys", ())),
                          str(r.get("unit", "")), str(r.get("command", ""))) for r in self.on_change)

    def source_path(self, name: str) -> str:
        return f"services/{self.name}/files/{name}"

    @functools.cached_property
    def files_in_order(self) -> tuple[FileDecl, ...]:
        """``files`` by path, the order a service's files render and print in."""
        return tuple(sorted(self.files, key=lambda d: d.path))


@dataclass(frozen=True)
class DeploymentRepo:
    label: str  # commit id or directory
    name: str
    settings: Mapping[str, Any]
    release: str
    vars: Mapping[str, Any]
    groups: Mapping[str, GroupDef]
    nodes: Mapping[str, NodeDef]
    services: Mapping[str, ServiceDef]
    limits: Limits = LIMITS  # what rendering this repo may cost (see ``render``)
    post_upgrade: tuple[PostStep, ...] = ()
    stages: Mapping[str, Stage] = field(default_factory=dict)  # reconciler.yaml `stages`, by name
    windows: tuple[Window, ...] = ()  # reconciler.yaml `windows`: when each kind of disruption may happen
    budgets: tuple[Budget, ...] = ()  # reconciler.yaml `disruption_budgets`: how many of a group at once
    secret_files: Mapping[str, SopsFile] = field(default_factory=dict)  # secrets/*.yaml, still encrypted
    # Path -> the secret files this node decrypted, values and hash key (the agent sets it with
    # its identity); None where no key is at hand (review, validate): templates see placeholders.
    unlocked: Mapping[str, Opened] | None = None
    # The agent has no age identity configured (so ``unlocked`` is empty): said in the error of a
    # template that reads a secret, which is then a setup to fix on the node, not a rotation.
    no_identity: bool = False
    # This commit's cutover failed where it attached (the agent read the failed note): placed as
    # if its cutover nodes were isolated, so the old plane re-attaches (see ``planes``).
    cutover_aborted: bool = False
    # inventory.yaml `decommission`: nodes taken out of the fleet on purpose (never one of
    # ``nodes``). Mere absence from ``nodes`` stops nothing: a typo or a rename must not.
    decommission: tuple[str, ...] = ()
    # reconciler.yaml `templates.dialect`: "jinja" (Jinja's own filters), or "ansible" (Ansible's
    # filters and tests, kolla's address filters, `inventory_hostname`, `lookup('template')`).
    template_dialect: str = "jinja"
    # reconciler.yaml `templates.variables`: a variable's templated value (`b: "{{ a }}"`) is
    # rendered when read, per node (see ``render.lazyvars``); on by default with the Ansible dialect.
    template_variables: bool = False
    # inventory.yaml's line of each value by its path (("nodes", "n1", "vars", "a") -> 12): where
    # a templated variable that fails is.
    inventory_lines: Mapping[tuple[str | int, ...], int] = field(default_factory=dict)

    @functools.cached_property
    def planes(self) -> Planes:
        """Every node's release, mode and VIP attachment at this commit."""
        return control.compute(self.nodes, self.group_members, self.release, self.cutover_aborted)

    def node(self, name: str) -> NodeDef:
        try:
            return self.nodes[name]
        except KeyError:
            known = ", ".join(sorted(self.nodes))
            raise UnknownNode(
                f"node {name!r} is not in the inventory (known: {known})", file="inventory.yaml"
            ) from None

    def services_of(self, node: str) -> tuple[str, ...]:
        """The node's services: the union of its groups' services, sorted by name, without the
        VIP services off the live plane (``placement.off_plane``)."""
        kept = self._services_by_node.get(node)  # asked of every node at both commits in a diff
        if kept is None:
            # The planes are computed only for a repo that has VIP services: without, nothing moves.
            nd = self.node(node)  # an unknown node: UnknownNode, before the planes are asked about it
            attached = not self.vip_services or self.planes[node].attached
            kept = self._services_by_node[node] = placement.services_of(nd, self.groups, self.vip_services, attached)
        return kept

    @functools.cached_property
    def _services_by_node(self) -> dict[str, tuple[str, ...]]:
        return {}

    @functools.cached_property
    def vip_services(self) -> frozenset[str]:
        return control.vip_services(self.settings)

    @functools.cached_property
    def vip_networks(self) -> frozenset[str]:
        return control.vip_networks(self.settings)

    def peers(self, node: str) -> tuple[dict[str, list[str]], dict[str, dict[str, Any]]]:
        """``groups`` and ``hostvars`` as ``node``'s templates see them: every node, or only the
        nodes of its own plane when it, or they, are split off (see ``planes``)."""
        planes = self.planes
        if not planes.active:
            return self.group_members, self.hostvars
        seen = planes.visible(node)
        hit = self._peer_views.get(seen)
        if hit is None:
            hit = ({g: [n for n in ns if n in seen] for g, ns in self.group_members.items()},
                   {n: v for n, v in self.hostvars.items() if n in seen})
            self._peer_views[seen] = hit
        return hit

    @functools.cached_property
    def _peer_views(self) -> dict[frozenset[str], tuple[dict[str, list[str]], dict[str, dict[str, Any]]]]:
        return {}

    @functools.cached_property
    def group_members(self) -> dict[str, list[str]]:
        """Group -> sorted member nodes; computed once per repo (templates of every node use it)."""
        return placement.group_members(self.groups, self.nodes)

    @functools.cached_property
    def hostvars(self) -> dict[str, dict[str, Any]]:
        """Node -> its variables; computed once per repo, not once per rendered service."""
        return {n: self.node_vars(n) for n in sorted(self.nodes)}

    def members(self, group: str) -> tuple[str, ...]:
        return placement.members(self.nodes, group)

    def node_vars(self, node: str) -> dict[str, Any]:
        """Variables of a node, precedence low to high: repo vars, then each of the node's
        groups in the order the node lists them, then the node's own vars."""
        merged: dict[str, Any] = dict(self.vars)
        nd = self.node(node)
        for g in nd.groups:
            merged.update(self.groups[g].vars)
        merged.update(nd.vars)
        return merged

    def driver_of(self, node: str, service: str) -> str:
        return placement.driver_of(self.services[service].driver, self.node(node), self.settings)
