"""What ``validate`` refuses in a repo beyond its schemas, each problem at its file and line:
unknown names and cycles between services, upgrade and post-upgrade steps that cannot run,
waves and stages that name nobody, variables the render would shadow, what a node's driver
needs from a service, VIP networks attached to two control planes at once, and names that
hold a control character or a line break (``unprintable``: a path that puts a line of its own
into a review comment or a log). Pure.
"""

from __future__ import annotations

import graphlib
import re
import unicodedata
from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import Any

from reconciler.core.yamlfile import Problem, YamlDoc
from reconciler.drivers.kinds import kind_of, names
from reconciler.repo.definitions import DeploymentRepo, GroupDef, NodeDef, ServiceDef
from reconciler.repo.planes import Mode
from reconciler.repo.steps import PostStep, StepAction

_ABSENT = object()  # a key a file does not have (a null is a value: the enum refused it)

# Control characters, invisible format characters (a right-to-left override) and line or
# paragraph separators: none belongs in a name a reviewer reads.
_UNPRINTABLE = frozenset(("Cc", "Cf", "Zl", "Zp"))


def unprintable(name: str) -> bool:
    return not name.isprintable() and any(unicodedata.category(ch) in _UNPRINTABLE for ch in name)


def check_file_names(services: Mapping[str, ServiceDef]) -> list[Problem]:
    """Each file a service declares: its path, template and source, printable on one line."""
    return [Problem(s.file, f.line, f"{what} {value!r} has a control character or a line break")
            for s in services.values() for f in s.files
            for what, value in (("path", f.path), ("template", f.template), ("source", f.source))
            if value is not None and unprintable(value)]


def check_drivers(repo: DeploymentRepo) -> list[Problem]:
    """What each node's driver needs from a service: a command, or an image (its kind says).
    Judged once per service and driver (a fleet's nodes share a few), said for each node."""
    problems = []
    judged: dict[tuple[str, str], list[tuple[int | None, str]]] = {}
    for node in sorted(repo.nodes):
        for name in repo.services_of(node):
            driver = repo.driver_of(node, name)
            found = judged.get((name, driver))
            if found is None:
                found = judged[name, driver] = _needs(repo.services[name], driver)
            if found:
                file = repo.services[name].file
                problems += [Problem(file, line, f"node {node} runs {name} with {driver}: {what}")
                             for line, what in found]
    return problems


def _needs(svc: ServiceDef, driver: str) -> list[tuple[int | None, str]]:
    """What ``driver`` needs of ``svc`` that it lacks: (line, what), in the order said."""
    kind = kind_of(driver)
    found: list[tuple[int | None, str]] = []
    if not kind.may_reboot and any(r.get("action") == "reboot" for r in svc.on_change):
        found.append((svc.lines.get("runtime"), "only a host service (driver: host) can ask for a reboot"))
    # Each path on its own: one absolute path among relative ones would be written outside
    # the service's config dir.
    wrong = [f for f in svc.files if f.path.startswith("/") != kind.absolute_paths]
    if wrong:
        where = "absolute" if kind.absolute_paths else "relative to its config dir"
        found.append((wrong[0].line, f"file path {wrong[0].path!r} must be {where}"))
    if kind.needs_image and not svc.container.get("image"):
        found.append((svc.lines.get("runtime"), "runtime needs an image"))
    elif kind.needs_command and not svc.command:
        found.append((svc.lines.get("runtime"), "runtime needs a command"))
    return found


def check_driver_names(doc: YamlDoc, schema_name: str) -> list[Problem]:
    """Each driver a file names where its schema has one (a service's ``driver``, an inventory
    node's, reconciler.yaml's ``defaults.driver``) is a registered kind: the schemas leave the
    names to the registry, and this says what their enum said (a null included). A service's
    ``defaults`` are template variables: a ``driver`` among them is no driver."""
    data = doc.data if isinstance(doc.data, dict) else {}
    nodes = data.get("nodes") if schema_name == "inventory" else None
    where: dict[str, list[tuple[str, ...]]] = {
        "service": [("driver",)],
        "reconciler": [("defaults", "driver")],
        "inventory": [("nodes", str(n), "driver") for n in (nodes if isinstance(nodes, dict) else {})],
    }
    places = where.get(schema_name, [])
    problems = []
    for path in places:
        value: Any = data
        for key in path:
            value = value.get(key, _ABSENT) if isinstance(value, dict) else _ABSENT
        if value is not _ABSENT and value not in names():
            problems.append(Problem(doc.file, doc.line(path),
                                    f"{'/'.join(path)}: {value!r} is not one of {list(names())!r}"))
    return problems


def check_planes(repo: DeploymentRepo, lines: Mapping[str, int | None]) -> list[Problem]:
    """What ``validate`` refuses: a VIP network attached to nodes of two releases at once,
    cutover nodes of one group on two releases, a VIP name no service uses; on the network
    names as written (``render.vipnets`` checks those written through a variable as each node
    renders them). ``lines``: node -> its line in inventory.yaml."""
    problems: list[Problem] = []
    p = repo.planes
    nets, vsvcs = repo.vip_networks, repo.vip_services
    names = written_networks(repo)
    written = {n for texts in names.values() for n in texts}
    # A name written through a variable is what a node renders it to: ``render.vipnets`` checks
    # those per node. Two releases on a name written out is a conflict whatever the others render.
    if not any(templated(n) for n in written):
        for name in sorted(nets - written):
            problems.append(unnamed(name))
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
            if any(net in names[s] for s in repo.services_of(n) if s in repo.services):
                on.setdefault(p[n].plane, []).append(n)
        if len(on) > 1:
            problems.append(two_releases(net, on, lines))
    return problems


def unnamed(net: str, said: str = "") -> Problem:
    """A VIP network no service names (``said``: what the names written through a variable
    render to instead)."""
    return Problem("reconciler.yaml", None, f"vip.networks: no service names network {net!r}{said}")


def two_releases(net: str, on: Mapping[str, list[str]], lines: Mapping[str, int | None]) -> Problem:
    """A VIP network that nodes of more than one release (``on``: release -> its nodes) would
    be attached to at once, at the line of the newest release's first node."""
    where = "; ".join(f"release {r}: {', '.join(ns)}" for r, ns in sorted(on.items()))
    last = max(on.items(), key=lambda kv: kv[0])[1][0]
    return Problem("inventory.yaml", lines.get(last),
                   f"VIP network {net!r} would be attached to two releases at once ({where}); "
                   "isolate the new one (pending_release, mode: isolated) or cut over (mode: cutover)")


def templated(text: str) -> bool:
    """A runtime string a node renders (the render's own test: a plain one is kept as it is)."""
    return "{" in text


def written_networks(repo: DeploymentRepo) -> dict[str, tuple[str, ...]]:
    """Service -> its network names as written (an entry is a name, or a mapping with one)."""
    return {name: tuple(str(e.get("name") if isinstance(e, Mapping) else e) for e in s.container.get("networks", ()))
            for name, s in repo.services.items()}


def selected(spec: Mapping[str, Any], what: str, line: int | None, groups: Mapping[str, GroupDef],
              nodes: Mapping[str, NodeDef], problems: list[Problem]) -> frozenset[str]:
    """The nodes a stage or a wave names (a ``group``, or ``nodes``: names or globs); an unknown
    group, or a pattern that names no node, is a problem (a typo would select nobody)."""
    if "group" in spec:
        if spec["group"] not in groups:
            problems.append(Problem("reconciler.yaml", line, f"{what}: unknown group {spec['group']!r}"))
        return frozenset(n for n, d in nodes.items() if spec["group"] in d.groups)
    chosen: set[str] = set()
    for pattern in spec.get("nodes", ()):
        hits = {n for n in nodes if fnmatchcase(n, str(pattern))}
        if not hits:
            problems.append(Problem("reconciler.yaml", line, f"{what}: {pattern!r} names no node"))
        chosen |= hits
    return frozenset(chosen)


def check_waves(settings: YamlDoc, groups: Mapping[str, GroupDef], nodes: Mapping[str, NodeDef],
                 problems: list[Problem]) -> None:
    """A wave that names no node would be dropped from the rollout without a word, and a batch
    of 0 read as 1: each is a typo the operator should hear of before the commit goes out."""
    for i, wave in enumerate((settings.data.get("rollout") or {}).get("waves") or ()):
        name = wave.get("name", f"wave{i + 1}")
        selected(wave, f"rollout wave {name!r}", settings.line(("rollout", "waves", i)), groups, nodes, problems)
        batch = str(wave.get("batch", "1"))
        digits = re.fullmatch(r"([0-9]+)(%?)", batch)  # anything else, the schema's check reports
        if digits and not (0 < int(digits[1]) <= 100 if digits[2] else int(digits[1]) >= 1):
            problems.append(Problem("reconciler.yaml", settings.line(("rollout", "waves", i, "batch")),
                                    f"rollout wave {name!r}: batch {batch!r} must be at least 1 node, or a "
                                    "percentage above 0 and at most 100"))


# The names a render gives every template (render.variables builds them); a variable of one of these
# names would be shadowed by the render's own value without a word.
RENDER_NAMES = frozenset({"node", "release", "pending_release", "groups", "hostvars", "secrets", "service",
                          "service_version"})


def check_var_names(inventory: YamlDoc, services: Mapping[str, ServiceDef]) -> list[Problem]:
    inv = inventory.data
    places: list[tuple[str, int | None, str, Mapping[str, Any]]] = [
        ("inventory.yaml", inventory.line(("vars",)), "vars", inv.get("vars") or {})]
    places += [("inventory.yaml", inventory.line(("groups", g, "vars")), f"group {g!r}: vars", d.get("vars") or {})
               for g, d in inv["groups"].items()]
    places += [("inventory.yaml", inventory.line(("nodes", n, "vars")), f"node {n!r}: vars", d.get("vars") or {})
               for n, d in inv["nodes"].items()]
    places += [(svc.file, svc.lines.get("defaults"), "defaults", svc.defaults) for svc in services.values()]
    return [Problem(file, line, f"{what}: {name!r} is a name the render gives every template "
                                f"({', '.join(sorted(RENDER_NAMES))}): rename the variable")
            for file, line, what, values in places for name in sorted(set(values) & RENDER_NAMES)]


def check_dependencies(services: Mapping[str, ServiceDef]) -> list[Problem]:
    problems = []
    graph: dict[str, set[str]] = {}
    for svc in services.values():
        for dep in svc.depends_on:
            if dep not in services:
                problems.append(Problem(svc.file, svc.lines.get("depends_on"), f"depends_on: unknown service {dep!r}"))
        graph[svc.name] = {d for d in svc.depends_on if d in services}
    return problems + _cycle(services, graph, "depends_on", "dependency cycle")


def _cycle(services: Mapping[str, ServiceDef], graph: Mapping[str, set[str]], key: str, what: str) -> list[Problem]:
    """A cycle in ``graph`` (service -> those it waits on), at the first service's ``key``."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        first = services[exc.args[1][0]]
        return [Problem(first.file, first.lines.get(key), f"{what}: {' -> '.join(exc.args[1])}")]
    return []


def check_upgrades(services: Mapping[str, ServiceDef], post: tuple[PostStep, ...], groups: Mapping[str, GroupDef],
                    nodes: Mapping[str, NodeDef], settings: YamlDoc | None) -> list[Problem]:
    problems = []
    for svc in services.values():
        for name in svc.upgrade_after:
            if name not in services:
                problems.append(Problem(svc.file, svc.lines.get("upgrade_after"),
                                        f"upgrade_after: unknown service {name!r}"))
        if svc.upgrade and not svc.version and not svc.container.get("image"):
            problems.append(Problem(svc.file, svc.lines.get("upgrade"),
                                    "upgrade steps need a `version` (or a runtime image) whose change runs them"))
    # Each upgrade would wait at its first step for the other to finish: neither would start.
    problems += _cycle(services, {s.name: {a for a in s.upgrade_after if a in services} for s in services.values()},
                       "upgrade_after", "upgrade_after cycle")
    for i, p in enumerate(post):
        line = settings.line(("post_upgrade", i)) if settings is not None else None
        for name in (*p.after, *p.services):
            if name not in services:
                problems.append(Problem("reconciler.yaml", line, f"post_upgrade {p.name!r}: unknown service {name!r}"))
        if p.node and p.node not in nodes:
            problems.append(Problem("reconciler.yaml", line, f"post_upgrade {p.name!r}: unknown node {p.node!r}"))
        if p.group and p.group not in groups:
            problems.append(Problem("reconciler.yaml", line, f"post_upgrade {p.name!r}: unknown group {p.group!r}"))
        if (p.action is StepAction.COMMAND) != bool(p.command.strip()):
            problems.append(Problem("reconciler.yaml", line,
                                    f"post_upgrade {p.name!r}: a command (and only action command) needs `command`"))
        if p.action is not StepAction.REBOOT and (p.drain or p.undrain or p.batch != 1):
            problems.append(Problem("reconciler.yaml", line,
                                    f"post_upgrade {p.name!r}: `batch`, `drain` and `undrain` are for action reboot"))
        if p.action is StepAction.UNPIN and not p.names:
            problems.append(Problem("reconciler.yaml", line, f"post_upgrade {p.name!r}: action unpin needs `vars`"))
    return problems
