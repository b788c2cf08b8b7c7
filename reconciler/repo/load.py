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

from collections.abc import Callable, Mapping
from dataclasses import replace
from fnmatch import fnmatchcase
from typing import Any

from reconciler.core.errors import BadInput, InvalidRepo
from reconciler.core.limits import LIMITS, Limits
from reconciler.core.yamlfile import Problem, RepoProblems, YamlDoc, check_schema, load_yaml, safe_load_all
from reconciler.drivers.kinds import ceiling
from reconciler.repo.budgets import Budget, BudgetError, parse_budgets
from reconciler.repo.checks import (
    check_dependencies,
    check_driver_names,
    check_drivers,
    check_planes,
    check_upgrades,
    check_var_names,
    check_waves,
    selected,
)
from reconciler.repo.definitions import DeploymentRepo, FileDecl, GroupDef, NodeDef, ServiceDef
from reconciler.repo.nodeslice import other_service, read_of_others, slice_of
from reconciler.repo.overrides import load_merge
from reconciler.repo.sops import SopsFile
from reconciler.repo.sops import parse_documents as parse_sops
from reconciler.repo.steps import Stage, check_steps, parse_post, parse_steps
from reconciler.repo.tree import Tree
from reconciler.repo.windows import Window, WindowError, parse_windows


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


def _doc(tree: Tree, path: str, schema_name: str, problems: list[Problem], limits: Limits,
         read: Callable[[Any], Any] | None = None) -> YamlDoc | None:
    """The file checked against its schema; ``read``: only the part of it that function takes
    out of it is checked, and kept (what a node reads of a service it does not run)."""
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
    if read is not None:
        doc = replace(doc, data=read(doc.data))
        found = check_schema(doc, schema_name)
    else:
        found = check_schema(doc, schema_name) + check_driver_names(doc, schema_name)
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


def _load_service(tree: Tree, name: str, problems: list[Problem], limits: Limits,
                  full: bool = True) -> ServiceDef | None:
    """The service, checked and read in full (``full``), or as far as a node that does not run
    it reads it (``read_of_others``: no file, template or check of its own read)."""
    base = f"services/{name}"
    file = f"{base}/service.yaml"
    doc = _doc(tree, file, "service", problems, limits, None if full else read_of_others)
    if doc is None:
        return None
    if not full:
        # Its upgrade steps are read here (a barrier of ours may wait on them): their rules too.
        other = other_service(name, file, doc)
        problems.extend(Problem(file, doc.line(("upgrade", i)), f"upgrade/{i}: {message}")
                        for i, message in check_steps(other.upgrade))
        return other
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
        merge = load_merge(tree, f, i, tpl, templates, limits, file, line, problems)
        files.append(FileDecl(f["path"], _mode(f.get("mode"), default_mode), tpl, src, line, merge))
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
        escalate_to=str(data.get("escalate_to", ceiling(data.get("driver")))),
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
            # each default's own line: a templated one that fails is named by it (see render.lazyvars)
            **{f"defaults/{k}": doc.line(("defaults", k)) for k in data.get("defaults", {})},
        },
    )


def load_repo(tree: Tree, limits: Limits = LIMITS, node: str | None = None) -> DeploymentRepo:
    """Read and check the whole repo; raise ``RepoProblems`` listing everything wrong.
    ``limits`` bound what is read here and travel with the repo to ``render``. ``node``: the
    repo as that node reads it (issue 40): the settings, the inventory, the secrets and its own
    services (and what they depend on) checked in full; of another node's service only what it
    reads of it (``read_of_others``), its files and templates neither read nor checked. The
    nodes that run it refuse it; ``validate`` and the review, which give no node, check all."""
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
    mine = slice_of(node, settings, inventory)
    full = set(names) if mine is None else set()
    loaded: dict[str, ServiceDef | None] = {}
    wanted = sorted(mine or ())
    while wanted:  # a node's own services, and what they depend on, in full
        name = wanted.pop(0)
        if name in full or name not in names or not tree.exists(f"services/{name}/service.yaml"):
            continue
        full.add(name)
        svc = loaded[name] = _load_service(tree, name, problems, limits)
        wanted += svc.depends_on if svc is not None else ()
    for name in names:
        if tree.exists(f"services/{name}/service.yaml"):
            svc = loaded[name] if name in loaded else _load_service(tree, name, problems, limits, name in full)
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

    decommission: tuple[str, ...] = ()
    if inventory is not None:
        problems.extend(check_var_names(inventory, services))
        decommission = tuple(str(n) for n in inventory.data.get("decommission", ()))
        problems.extend(Problem("inventory.yaml", inventory.line(("decommission", i)),
                                f"node {name!r} is under both `nodes` and `decommission`: a node is one or the other")
                        for i, name in enumerate(decommission) if name in nodes)
    secret_files = _secret_files(tree, limits, problems)
    problems.extend(check_dependencies(services))
    post = parse_post(settings.data.get("post_upgrade", ())) if settings is not None else ()
    problems.extend(check_upgrades(services, post, groups, nodes, settings))
    stages = _stages(settings, groups, nodes, problems) if settings is not None else {}
    if settings is not None:
        check_waves(settings, groups, nodes, problems)
    windows = _windows(settings, groups, nodes, problems) if settings is not None else ()
    budgets = _budgets(settings, groups, nodes, problems) if settings is not None else ()
    if problems:
        raise RepoProblems(problems)
    assert settings is not None and inventory is not None
    templates = settings.data.get("templates") or {}
    dialect = str(templates.get("dialect", "jinja"))
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
        decommission=decommission,
        template_dialect=dialect,
        template_variables=templates.get("variables", "templated" if dialect == "ansible" else "literal")
        == "templated",
        inventory_lines=inventory.lines,
    )
    # A node reads only its own services in full: what another's driver needs of another's is theirs.
    others = {svc.file for name, svc in services.items() if name not in full}
    problems = [p for p in check_drivers(repo) if p.file not in others]
    if not problems:
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
            out[path] = parse_sops(path, safe_load_all(raw, path, limits.yaml_nodes))  # sops writes ---
        except BadInput as exc:
            problems.append(_problem(exc, path))
    return out


def _stages(settings: YamlDoc, groups: Mapping[str, GroupDef], nodes: Mapping[str, NodeDef],
            problems: list[Problem]) -> dict[str, Stage]:
    """reconciler.yaml's ``stages``, each a group or node names/globs, and the one
    ``rollout.stage`` names."""
    out = {}
    for name, spec in (settings.data.get("stages") or {}).items():
        chosen = selected(spec, f"stage {name!r}", settings.line(("stages", name)), groups, nodes, problems)
        out[str(name)] = Stage(str(name), chosen)
    wanted = (settings.data.get("rollout") or {}).get("stage")
    if wanted and wanted not in out:
        known = ", ".join(sorted(out)) or "none: add `stages:`"
        problems.append(Problem("reconciler.yaml", settings.line(("rollout", "stage")),
                                f"rollout.stage {wanted!r} is not a stage (stages: {known})"))
    return out


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
