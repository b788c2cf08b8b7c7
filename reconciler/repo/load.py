"""Load and check the deployment repo at one commit (format v1).

Layout::

    reconciler.yaml                 settings
    inventory.yaml                  groups -> services, nodes -> groups, vars
    services/<name>/service.yaml    runtime, files, health, depends_on, defaults
    services/<name>/templates/      Jinja2 templates named by files[].template, and what they include
    services/<name>/files/          files copied verbatim, named by files[].source
    secrets/*.yaml                  SOPS files (age): ``secrets.<name>`` in templates (see ``secrets``)

Every problem is collected with its file and line, so ``validate`` reports all at once.
No rendering here (see ``render``), and no I/O beyond reading the ``Tree``. What is read is
bounded by ``Limits`` (file size, YAML nodes) and never goes through a symlink (see ``tree``).
"""

from __future__ import annotations

import functools
import graphlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

from reconciler.core.errors import BadInput, InvalidRepo, UnknownNode
from reconciler.core.limits import LIMITS, Limits
from reconciler.core.model import ActionKind, Rule
from reconciler.fleet.budget import Budget, BudgetError, parse_budgets
from reconciler.plan.windows import Window, WindowError, parse_windows
from reconciler.render.secrets import Opened, SopsFile
from reconciler.render.secrets import parse as parse_sops
from reconciler.repo.tree import Tree
from reconciler.repo.yamlfile import Problem, RepoProblems, YamlDoc, check_schema, load_yaml, safe_load
from reconciler.upgrades.rules import PostStep, Stage, Step, StepAction, check_steps, parse_post, parse_steps

if TYPE_CHECKING:
    from reconciler.repo.planes import Planes


@dataclass(frozen=True)
class FileDecl:
    path: str
    mode: int
    template: str | None
    source: str | None
    line: int | None


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
    templates: Mapping[str, str]  # repo path -> text, every file under services/<name>/templates/
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
    pending_release: str = ""  # what it is being deployed as (see ``controlplane``)
    mode: str = ""  # normal | isolated | cutover; "": derived from the pending release
    line: int | None = None  # in inventory.yaml


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
    # if its cutover nodes were isolated, so the old plane re-attaches (see ``controlplane``).
    cutover_aborted: bool = False

    @functools.cached_property
    def planes(self) -> Planes:
        """Every node's release, mode and VIP attachment at this commit."""
        from reconciler.repo.planes import compute

        return compute(self)

    def node(self, name: str) -> NodeDef:
        try:
            return self.nodes[name]
        except KeyError:
            known = ", ".join(sorted(self.nodes))
            raise UnknownNode(
                f"node {name!r} is not in the inventory (known: {known})", file="inventory.yaml"
            ) from None

    def services_of(self, node: str) -> tuple[str, ...]:
        """The node's services: the union of its groups' services, sorted by name."""
        names: set[str] = set()
        for g in self.node(node).groups:
            names.update(self.groups[g].services)
        if self.vip_services and not self.planes[node].attached:
            names -= self.vip_services  # they hold the VIPs themselves: off the live plane, not run
        return tuple(sorted(names))

    @functools.cached_property
    def vip_services(self) -> frozenset[str]:
        from reconciler.repo.planes import vip_services

        return vip_services(self.settings)

    @functools.cached_property
    def vip_networks(self) -> frozenset[str]:
        from reconciler.repo.planes import vip_networks

        return vip_networks(self.settings)

    def peers(self, node: str) -> tuple[dict[str, list[str]], dict[str, dict[str, Any]]]:
        """``groups`` and ``hostvars`` as ``node``'s templates see them: every node, or only the
        nodes of its own plane when it, or they, are split off (see ``controlplane``)."""
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
        return {g: list(self.members(g)) for g in sorted(self.groups)}

    @functools.cached_property
    def hostvars(self) -> dict[str, dict[str, Any]]:
        """Node -> its variables; computed once per repo, not once per rendered service."""
        return {n: self.node_vars(n) for n in sorted(self.nodes)}

    def members(self, group: str) -> tuple[str, ...]:
        return tuple(sorted(n for n, d in self.nodes.items() if group in d.groups))

    def node_vars(self, node: str) -> dict[str, Any]:
        """Variables of a node, precedence low to high: repo vars, then each of the node's
        groups in the order the node lists them, then the node's own vars."""
        merged: dict[str, Any] = dict(self.vars)
        nd = self.node(node)
        for g in nd.groups:
            merged.update(self.groups[g].vars)
        merged.update(nd.vars)
        return merged

    def check_drivers(self) -> list[Problem]:
        """What each node's driver needs from a service: a command, or an image."""
        problems = []
        for node in sorted(self.nodes):
            for name in self.services_of(node):
                svc, driver = self.services[name], self.driver_of(node, name)
                if driver != "host" and any(r.get("action") == "reboot" for r in svc.on_change):
                    problems.append(Problem(svc.file, svc.lines.get("runtime"),
                                            f"node {node} runs {name} with {driver}: only a host service "
                                            "(driver: host) can ask for a reboot"))
                # Each path on its own: one absolute path among relative ones would be written
                # outside the service's config dir.
                wrong = [f for f in svc.files if f.path.startswith("/") != (driver == "host")]
                if wrong:
                    where = "absolute" if driver == "host" else "relative to its config dir"
                    problems.append(Problem(svc.file, wrong[0].line, f"node {node} runs {name} with {driver}: "
                                            f"file path {wrong[0].path!r} must be {where}"))
                if driver == "docker" and not svc.container.get("image"):
                    problems.append(Problem(svc.file, svc.lines.get("runtime"),
                                            f"node {node} runs {name} with docker: runtime needs an image"))
                elif driver not in ("docker", "host") and not svc.command:
                    problems.append(Problem(svc.file, svc.lines.get("runtime"),
                                            f"node {node} runs {name} with {driver}: runtime needs a command"))
        return problems

    def driver_of(self, node: str, service: str) -> str:
        svc = self.services[service]
        nd = self.node(node)
        return svc.driver or nd.driver or str(self.settings.get("defaults", {}).get("driver", "process"))


def _problem(exc: BadInput, file: str) -> Problem:
    """The error as a Problem, its location taken back out of the message."""
    where = exc.file or file
    message = str(exc).removeprefix(f"{where}:{exc.line}: " if exc.line else f"{where}: ")
    return Problem(where, exc.line, message, exc.reason if isinstance(exc, InvalidRepo) else None)


def _read(tree: Tree, path: str, limits: Limits, problems: list[Problem]) -> bytes | None:
    """The file's bytes, or None with the problem noted (a symlink, too large, not a file).
    A missing file raises FileNotFoundError: each caller says what was expected there."""
    try:
        return tree.read(path, limits.file_bytes)
    except BadInput as exc:
        problems.append(_problem(exc, path))
        return None


def _doc(tree: Tree, path: str, schema_name: str, problems: list[Problem], limits: Limits) -> YamlDoc | None:
    try:
        raw = _read(tree, path, limits, problems)
    except FileNotFoundError:
        problems.append(Problem(path, None, "missing"))
        return None
    if raw is None:
        return None
    try:
        doc = load_yaml(raw, path, limits.yaml_nodes)
    except BadInput as exc:
        problems.append(_problem(exc, path))
        return None
    found = check_schema(doc, schema_name)
    problems.extend(found)
    return None if found else doc


def _mode(text: str | None, default: int) -> int:
    return int(text, 8) if text else default


def _templates(tree: Tree, base: str, limits: Limits, problems: list[Problem]) -> dict[str, str]:
    """Every file under the service's templates/, so templates can include and import each other
    (by a name relative to that folder) without the renderer ever reading from the tree."""
    templates: dict[str, str] = {}
    try:
        paths = tree.files(f"{base}/templates")
    except BadInput as exc:
        problems.append(_problem(exc, f"{base}/templates"))
        return templates
    for rel in paths:
        try:
            raw = _read(tree, rel, limits, problems)
        except FileNotFoundError:
            continue  # not a file (a submodule): nothing a template can include
        if raw is None:
            continue
        try:
            templates[rel] = raw.decode("utf-8")
        except UnicodeDecodeError:
            problems.append(Problem(rel, None, "template is not UTF-8 text"))
    return templates


def _load_service(tree: Tree, name: str, problems: list[Problem], limits: Limits) -> ServiceDef | None:
    base = f"services/{name}"
    file = f"{base}/service.yaml"
    doc = _doc(tree, file, "service", problems, limits)
    if doc is None:
        return None
    data = doc.data
    files: list[FileDecl] = []
    templates = _templates(tree, base, limits, problems)
    sources: dict[str, bytes] = {}
    seen_paths: set[str] = set()
    for i, f in enumerate(data.get("files", [])):
        line = doc.line(("files", i))
        path = f["path"]
        parts = path.split("/")
        normal = "/".join(p for p in parts if p not in ("", "."))
        if (not normal or ".." in parts or path.endswith("/") or "." in parts or "//" in path
                or normal in seen_paths or any(s.startswith(normal + "/") or normal.startswith(s + "/")
                                               for s in seen_paths)):
            problems.append(Problem(file, line, f"files/{i}: bad, duplicate or clashing path {path!r}"))
            continue
        seen_paths.add(normal)
        tpl, src = f.get("template"), f.get("source")
        if tpl is not None:
            rel = f"{base}/templates/{tpl}"
            if rel not in templates and any(t.startswith(f"{rel}/") for t in templates):
                problems.append(Problem(file, line, f"template {tpl!r}: {rel} is a directory, not a file"))
            elif rel not in templates and not tree.exists(rel):  # if it exists, its problem is noted
                problems.append(Problem(file, line, f"template {tpl!r} not found at {rel}"))
        if src is not None:
            rel = f"{base}/files/{src}"
            try:
                raw = _read(tree, rel, limits, problems)
                if raw is not None:
                    sources[rel] = raw
            except FileNotFoundError:
                problems.append(Problem(file, line, f"source {src!r} not found at {rel}"))
        default_mode = 0o755 if src is not None and src.endswith((".py", ".sh")) else 0o644
        files.append(FileDecl(f["path"], _mode(f.get("mode"), default_mode), tpl, src, line))
    for i, rule in enumerate(data.get("on_change", [])):
        # A rule for no file is a typo that never applies: the change it meant takes the default.
        if isinstance(rule, dict) and "file" in rule and files and not any(
                fnmatchcase(f.path, str(rule["file"])) for f in files):
            problems.append(Problem(file, doc.line(("on_change", i)), f"on_change/{i}: {rule['file']!r} matches no "
                                    f"file of this service ({', '.join(f.path for f in files)})"))
    runtime = data.get("runtime", {})
    steps = parse_steps(data.get("upgrade", ()))
    for i, message in check_steps(steps):
        problems.append(Problem(file, doc.line(("upgrade", i)), f"upgrade/{i}: {message}"))
    return ServiceDef(
        name=name,
        file=file,
        driver=data.get("driver"),
        depends_on=tuple(data.get("depends_on", [])),
        command=tuple(runtime.get("command", ())),
        env={k: str(v) for k, v in runtime.get("env", {}).items()},
        container={k: v for k, v in runtime.items() if k not in ("command", "env")},
        drift=str(data.get("drift", "correct")),
        on_change=tuple(data.get("on_change", [])),
        reload={k: str(v) for k, v in data.get("reload", {}).items()},
        escalate_to=str(data.get("escalate_to", "reboot" if data.get("driver") == "host" else "recreate")),
        drain=str(data.get("drain", "")),
        manual=data.get("apply") == "manual",
        undrain=str(data.get("undrain", "")),
        files=tuple(files),
        health=dict(data.get("health", {})),
        defaults=dict(data.get("defaults", {})),
        templates=templates,
        sources=sources,
        version=str(data.get("version", "")),
        upgrade=steps,
        upgrade_after=tuple(str(a) for a in data.get("upgrade_after", ())),
        lines={
            "runtime": doc.line(("runtime",)),
            "command": doc.line(("runtime", "command")),
            "env": doc.line(("runtime", "env")),
            "health": doc.line(("health",)),
            "depends_on": doc.line(("depends_on",)),
            "upgrade_after": doc.line(("upgrade_after",)),
            "upgrade": doc.line(("upgrade",)),
            "defaults": doc.line(("defaults",)),
        },
    )


def load_repo(tree: Tree, limits: Limits = LIMITS) -> DeploymentRepo:
    """Read and check the whole repo; raise ``RepoProblems`` listing everything wrong.
    ``limits`` bound what is read here and travel with the repo to ``render``."""
    problems: list[Problem] = []
    settings = _doc(tree, "reconciler.yaml", "reconciler", problems, limits)
    inventory = _doc(tree, "inventory.yaml", "inventory", problems, limits)

    services: dict[str, ServiceDef] = {}
    unreadable = False  # services/ itself is refused: no service can be called unknown
    try:
        names = tree.listdir("services")
    except BadInput as exc:
        names, unreadable = [], True
        problems.append(_problem(exc, "services"))
    for name in names:
        if tree.exists(f"services/{name}/service.yaml"):
            svc = _load_service(tree, name, problems, limits)
            if svc is not None:
                services[name] = svc
        else:
            problems.append(Problem(f"services/{name}", None, "service folder without service.yaml"))
    broken_services = {p.file.split("/")[1] for p in problems if p.file.startswith("services/")}

    groups: dict[str, GroupDef] = {}
    nodes: dict[str, NodeDef] = {}
    if inventory is not None:
        inv = inventory.data
        for gname, g in inv["groups"].items():
            for i, s in enumerate(g.get("services", [])):
                if s not in services and s not in broken_services and not unreadable:
                    problems.append(Problem(
                        "inventory.yaml", inventory.line(("groups", gname, "services", i)),
                        f"group {gname!r}: unknown service {s!r} (no services/{s}/service.yaml)",
                    ))
            groups[gname] = GroupDef(gname, tuple(g.get("services", [])), dict(g.get("vars", {})))
        for nname, n in inv["nodes"].items():
            for i, gname in enumerate(n["groups"]):
                if gname not in inv["groups"]:
                    problems.append(Problem(
                        "inventory.yaml", inventory.line(("nodes", nname, "groups", i)),
                        f"node {nname!r}: unknown group {gname!r}",
                    ))
            nodes[nname] = NodeDef(nname, tuple(n["groups"]), n.get("driver"), dict(n.get("vars", {})),
                                   n.get("apply") == "manual", str(n.get("release", "")),
                                   str(n.get("pending_release", "")), str(n.get("mode", "")),
                                   inventory.line(("nodes", nname)))

    if inventory is not None:
        problems.extend(_check_var_names(inventory, services))
    secret_files = _secret_files(tree, limits, problems)
    problems.extend(_check_dependencies(services))
    post = parse_post(settings.data.get("post_upgrade", ())) if settings is not None else ()
    problems.extend(_check_upgrades(services, post, groups, nodes, settings))
    stages = _stages(settings, groups, nodes, problems) if settings is not None else {}
    if settings is not None:
        _check_waves(settings, groups, nodes, problems)
    windows = _windows(settings, groups, nodes, problems) if settings is not None else ()
    budgets = _budgets(settings, groups, nodes, problems) if settings is not None else ()
    if problems:
        raise RepoProblems(problems)
    assert settings is not None and inventory is not None
    repo = DeploymentRepo(
        label=tree.label,
        name=settings.data["name"],
        settings=settings.data,
        release=str(inventory.data.get("release", "")),
        vars=dict(inventory.data.get("vars", {})),
        groups=groups,
        nodes=nodes,
        services=services,
        limits=limits,
        post_upgrade=post,
        stages=stages,
        windows=windows,
        budgets=budgets,
        secret_files=secret_files,
    )
    problems = repo.check_drivers()
    if not problems:
        from reconciler.repo.planes import check as check_planes

        problems = check_planes(repo, {n: d.line for n, d in nodes.items()})
    if problems:
        raise RepoProblems(problems)
    return repo


def _secret_files(tree: Tree, limits: Limits, problems: list[Problem]) -> dict[str, SopsFile]:
    """``secrets/*.yaml`` as SOPS files: metadata and ciphertext only, nothing decrypted here."""
    out: dict[str, SopsFile] = {}
    try:
        paths = tree.files("secrets")
    except BadInput as exc:
        problems.append(_problem(exc, "secrets"))
        return out
    for path in paths:
        if not path.endswith((".yaml", ".yml")):
            problems.append(Problem(path, None, "only SOPS YAML files belong under secrets/ (*.yaml)"))
            continue
        raw = _read(tree, path, limits, problems)
        if raw is None:
            continue
        try:
            out[path] = parse_sops(path, safe_load(raw, path, limits.yaml_nodes))
        except BadInput as exc:
            problems.append(_problem(exc, path))
    return out


def _stages(settings: YamlDoc, groups: Mapping[str, GroupDef], nodes: Mapping[str, NodeDef],
            problems: list[Problem]) -> dict[str, Stage]:
    """reconciler.yaml's ``stages``, each a group or node names/globs, and the one
    ``rollout.stage`` names."""
    out = {}
    for name, spec in (settings.data.get("stages") or {}).items():
        chosen = _selected(spec, f"stage {name!r}", settings.line(("stages", name)), groups, nodes, problems)
        out[str(name)] = Stage(str(name), chosen)
    wanted = (settings.data.get("rollout") or {}).get("stage")
    if wanted and wanted not in out:
        known = ", ".join(sorted(out)) or "none: add `stages:`"
        problems.append(Problem("reconciler.yaml", settings.line(("rollout", "stage")),
                                f"rollout.stage {wanted!r} is not a stage (stages: {known})"))
    return out


def _selected(spec: Mapping[str, Any], what: str, line: int | None, groups: Mapping[str, GroupDef],
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


def _check_waves(settings: YamlDoc, groups: Mapping[str, GroupDef], nodes: Mapping[str, NodeDef],
                 problems: list[Problem]) -> None:
    """A wave that names no node would be dropped from the rollout without a word, and a batch
    of 0 read as 1: each is a typo the operator should hear of before the commit goes out."""
    for i, wave in enumerate((settings.data.get("rollout") or {}).get("waves") or ()):
        name = wave.get("name", f"wave{i + 1}")
        _selected(wave, f"rollout wave {name!r}", settings.line(("rollout", "waves", i)), groups, nodes, problems)
        batch = str(wave.get("batch", "1"))
        digits = re.fullmatch(r"([0-9]+)(%?)", batch)  # anything else, the schema's check reports
        if digits and not (0 < int(digits[1]) <= 100 if digits[2] else int(digits[1]) >= 1):
            problems.append(Problem("reconciler.yaml", settings.line(("rollout", "waves", i, "batch")),
                                    f"rollout wave {name!r}: batch {batch!r} must be at least 1 node, or a "
                                    "percentage above 0 and at most 100"))


def _windows(settings: YamlDoc, groups: Mapping[str, GroupDef], nodes: Mapping[str, NodeDef],
             problems: list[Problem]) -> tuple[Window, ...]:
    members = {g: [n for n, d in nodes.items() if g in d.groups] for g in groups}
    out = []
    for i, w in parse_windows(settings.data.get("windows") or (), nodes, members):
        if isinstance(w, WindowError):
            problems.append(Problem("reconciler.yaml", settings.line(("windows", i)), str(w)))
        else:
            out.append(w)
    return tuple(out)


def _budgets(settings: YamlDoc, groups: Mapping[str, GroupDef], nodes: Mapping[str, NodeDef],
             problems: list[Problem]) -> tuple[Budget, ...]:
    members = {g: [n for n, d in nodes.items() if g in d.groups] for g in groups}
    out = []
    for i, b in parse_budgets(settings.data.get("disruption_budgets") or (), members):
        if isinstance(b, BudgetError):
            problems.append(Problem("reconciler.yaml", settings.line(("disruption_budgets", i)), str(b)))
        else:
            out.append(b)
    return tuple(out)


# The names a render gives every template (render.py builds them); a variable of one of these
# names would be shadowed by the render's own value without a word.
RENDER_NAMES = frozenset({"node", "release", "pending_release", "groups", "hostvars", "secrets", "service",
                          "service_version"})


def _check_var_names(inventory: YamlDoc, services: Mapping[str, ServiceDef]) -> list[Problem]:
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


def _check_dependencies(services: Mapping[str, ServiceDef]) -> list[Problem]:
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


def _check_upgrades(services: Mapping[str, ServiceDef], post: tuple[PostStep, ...], groups: Mapping[str, GroupDef],
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
