"""Kolla's containers as services: each entry of a role's ``<role>_services`` dict that is
enabled (the role's ``enable_*`` and the entry's own ``enabled``), with its image, volumes and
healthcheck, and the files the role's ``tasks/config.yml`` writes into its config directory
(``config.json`` from ``<service>.json.j2``, ``keystone.conf`` from a ``merge_configs``...).

What the tasks do that a service here cannot say (a file named at run time, a condition on a
task's registered result, an included role) is kept as a note for IMPORT.md, never dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reconciler.core.yamlfile import safe_load
from reconciler.importers.kolla_resolve import Resolver, Unresolved, templated, to_bool
from reconciler.importers.kolla_roles import ROLE_INCLUDES, TEMPLATE_MODULES, included_role
from reconciler.importers.kolla_source import KollaRelease
from reconciler.importers.kolla_tasks import TASK_RESULTS, chooses, per_item, set_facts

INCLUDES = ("include_tasks", "ansible.builtin.include_tasks", "import_tasks", "ansible.builtin.import_tasks")
ITEM_KEY = re.compile(r"\{\{\s*item\.key\s*\}\}")
# Roles site.yml reaches through another playbook (nova.yml) or gates on a differently named variable.
ROLE_ENABLE = {"nova": "enable_nova", "nova-cell": "enable_nova"}
UNSUPPORTED_KEYS = ("privileged", "pid_mode", "ipc_mode", "cap_add", "ulimits", "tmpfs", "security_opt",
                    "labels", "command", "dimensions")
CONFIG_DIR = "/var/lib/kolla/config_files"


@dataclass(frozen=True)
class KollaFile:
    path: str  # in the service's config dir (kolla's /etc/kolla/<service>/)
    template: str  # the role template, relative to roles/<role>/templates
    role: str
    merges: tuple[str, ...] = ()  # merge_configs/merge_yaml sources after the template, as written
    # "ini" (merge_configs), "yaml" (merge_yaml), "first_found" (with_first_found: the first
    # source found is the template, the role's last); "" without merges
    merge_kind: str = ""


@dataclass(frozen=True)
class KollaService:
    name: str
    role: str
    group: str
    container: str
    image: str
    volumes: tuple[str, ...]
    healthcheck: dict[str, Any] | None
    env: dict[str, str]
    files: tuple[KollaFile, ...]
    notes: tuple[str, ...]  # what could not be carried over, one line each
    # What kolla's tasks set for this container's templates (the role's vars/main.yml, the
    # template tasks' ``vars:``, ``item`` of their ``with_dict`` loop): the service's defaults.
    defaults: dict[str, Any] = field(default_factory=dict)
    # kolla's ``host_in_groups`` (an expression over ``groups`` and ``inventory_hostname``) where
    # the entry gives one instead of a ``group``: the import places it on the hosts it holds for.
    host_in_groups: str | None = None


def _services_dict(defaults: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    for key, value in defaults.items():
        if key.endswith("_services") and isinstance(value, dict) and value and all(
                isinstance(v, dict) and "container_name" in v for v in value.values()):
            return key, value
    return None


def enabled_services(release: KollaRelease, resolver: Resolver,
                     overrides: frozenset[str] = frozenset()) -> list[KollaService]:
    """The enabled services of every role, in role order. ``overrides``: the deployment's
    config/ files (relative paths), which kolla's ``stat`` tasks look for."""
    resolver.env.filters.update(service_enabled_and_mapped_to_host=lambda s: True,
                                select_services_enabled_and_mapped_to_host=lambda s: s)
    out: list[KollaService] = []
    for role in release.roles():
        found = _services_dict(release.role_defaults(role))
        if found is None or role.startswith("service-"):
            continue
        gate = release.role_enable.get(role) or ROLE_ENABLE.get(role)
        own = f"enable_{role.replace('-', '_')}"
        if any(g in resolver.variables and not _truth(resolver, f"{{{{ {g} | bool }}}}") for g in {gate, own} if g):
            continue
        tasks = _config_tasks(release.role_dir(role))
        for name, spec in found[1].items():
            if not _truth(resolver, spec.get("enabled", True)):
                continue
            out.append(_service(release, resolver, role, name, spec, found[1], tasks, overrides))
    return out


def _truth(resolver: Resolver, raw: Any) -> bool:
    try:
        return to_bool(resolver.value(raw))
    except Unresolved:
        return False


def _config_tasks(role_dir: Path, depth: int = 0) -> list[tuple[str, dict[str, Any]]]:
    """``tasks/config.yml`` and the task files of the same role it includes: (file, task)."""
    path = role_dir / "tasks" / "config.yml" if depth == 0 else role_dir
    if not path.is_file():
        return []
    out: list[tuple[str, dict[str, Any]]] = []
    for task in safe_load(path.read_bytes(), str(path)) or []:
        if not isinstance(task, dict):
            continue
        role = next((task[k] for k in ROLE_INCLUDES if k in task), None)
        if isinstance(role, dict) and depth == 0:
            out += included_role(path.parent.parent.parent, role_dir.name, task, role)
            continue
        include = next((task[k] for k in INCLUDES if k in task), None)
        if isinstance(include, str) and depth < 2 and not templated(include):
            out += _config_tasks(path.parent / include, depth + 1)
            continue
        if isinstance(task.get("block"), list):
            out += _block(path.name, task)
            continue
        out.append((path.name, task))
    return out


def _block(file: str, block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A ``block``'s tasks, each with the block's ``vars`` under its own and its ``when`` before."""
    out: list[tuple[str, dict[str, Any]]] = []
    outer = block.get("when")
    for task in block["block"]:
        if not isinstance(task, dict):
            continue
        inner = dict(task)
        if isinstance(block.get("vars"), dict):
            inner["vars"] = {**block["vars"], **(task.get("vars") or {})}
        if outer is not None:
            inner["when"] = [*(outer if isinstance(outer, list) else [outer]),
                             *(task["when"] if isinstance(task.get("when"), list) else
                               [task["when"]] if "when" in task else [])]
        out.append((file, inner))
    return out


def _service(release: KollaRelease, resolver: Resolver, role: str, name: str, spec: dict[str, Any],
             siblings: dict[str, Any], tasks: list[tuple[str, dict[str, Any]]],
             overrides: frozenset[str] = frozenset()) -> KollaService:
    notes: list[str] = []
    play = release.play_vars.get(role, {})
    extra = {**play, "item": {"key": name, "value": spec}, "service": spec, "service_name": name,
             "project_name": role}
    volumes = _volumes(resolver, name, spec.get("volumes", []), extra, notes)
    healthcheck = _healthcheck(resolver, spec.get("healthcheck"), notes)
    env = {"KOLLA_CONFIG_STRATEGY": "COPY_ALWAYS", "KOLLA_SERVICE_NAME": name}
    environment = spec.get("environment")
    if isinstance(environment, dict):
        env.update({str(k): str(v) for k, v in environment.items()})
    elif environment is not None:
        notes.append(f"environment {environment!r}: not a mapping as written; not carried over")
    for key in UNSUPPORTED_KEYS:
        if key in spec and key != "dimensions":
            notes.append(f"container setting {key}: {spec[key]!r} has no counterpart in service.yaml")
    task_vars: dict[str, Any] = {}
    files = _files(release, resolver, role, name, spec, siblings, tasks, extra, notes, task_vars)
    try:
        group = str(resolver.value(spec.get("group", name), extra))
    except Unresolved as exc:
        group = name
        notes.append(f"group {spec.get('group')!r}: not resolved ({exc}); the group {name} is used")
    defaults = {**release.role_vars(role), **play, **set_facts(tasks), **TASK_RESULTS.get(role, {}),
                **_registered(tasks, overrides), **task_vars}
    placed = spec.get("host_in_groups") if "group" not in spec else None
    return KollaService(name, role, group, str(spec.get("container_name", name)),
                        str(spec.get("image", "")), volumes, healthcheck, env, files, tuple(notes), defaults,
                        str(placed) if placed is not None else None)


def _volumes(resolver: Resolver, name: str, raw: Any, extra: dict[str, Any], notes: list[str]) -> tuple[str, ...]:
    try:
        items = resolver.value(raw, extra)
    except Unresolved as exc:
        notes.append(f"volumes {raw!r}: not resolved ({exc}); none carried over")
        return ()
    kept: list[str] = []
    for item in items if isinstance(items, list) else []:
        try:
            value = resolver.value(item, extra)
        except Unresolved:
            kept.append(str(item))  # a template the node renders
            continue
        now = "" if value is None else str(value)  # Jinja's native render of nothing is None
        if not now.strip():
            continue  # kolla's container module drops an empty volume (a feature turned off)
        if now.rstrip("/").endswith(f"/{name}/:{CONFIG_DIR}/:ro") or now.startswith(f"/etc/kolla/{name}/:"):
            continue  # the config dir: the rendered files are mounted there (runtime.config_dir)
        parts = now.split(":")
        if len(parts) == 3 and parts[2] not in ("ro", "rw"):
            # A mount propagation (``:shared``) service.yaml cannot say: the mount without it.
            notes.append(f"volume {now}: mount option {parts[2]!r} has no counterpart in service.yaml; "
                         f"mounted as {parts[0]}:{parts[1]}")
            kept.append(f"{parts[0]}:{parts[1]}")
            continue
        kept.append(str(item))
    return tuple(kept)


def _healthcheck(resolver: Resolver, raw: Any, notes: list[str]) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        spec = resolver.value(raw)
        test = resolver.value(spec.get("test"))
        out: dict[str, Any] = {k: _number(resolver.deep(spec[k])) for k in ("interval", "retries", "timeout",
                                                                          "start_period") if k in spec}
    except (Unresolved, AttributeError) as exc:
        notes.append(f"healthcheck {raw!r}: not resolved ({exc}); not carried over")
        return None
    if test == "NONE" or test is None:
        return None
    if isinstance(test, list) and test and test[0] in ("CMD-SHELL", "CMD"):
        test = " ".join(str(t) for t in test[1:])
    out["test"] = str(test)
    return out


def _number(value: Any) -> float | int:
    text = str(value)
    return int(text) if text.isdigit() else float(text)


def _files(release: KollaRelease, resolver: Resolver, role: str, name: str, spec: dict[str, Any],
           siblings: dict[str, Any], tasks: list[tuple[str, dict[str, Any]]], extra: dict[str, Any],
           notes: list[str], task_vars: dict[str, Any]) -> tuple[KollaFile, ...]:
    """The files the role's tasks template into this container's config dir; ``task_vars``
    gets what those tasks set for their template (see ``_task_vars``)."""
    templates = release.role_dir(role) / "templates"
    out: dict[str, KollaFile] = {}
    project = release.role_vars(role).get("project_name", role)
    for file, task in per_item(tasks):
        module = next((k for k in TEMPLATE_MODULES if k in task), None)
        if module is None:
            continue
        args = task[module] if isinstance(task[module], dict) else {}
        # The role's project_name names the config dir in some roles' tasks (rabbitmq, mariadb).
        given = {**({"project_name": project} if isinstance(project, str) else {}), **(task.get("vars") or {})}
        sources = args.get("sources") if "merge" in module else [args.get("src")]
        listed = isinstance(sources, list) and bool(sources) and isinstance(sources[0], str)
        if not listed and not ("merge" in module and isinstance(sources, str)):
            continue
        loop = str(task.get("with_dict", ""))
        chosen = str((task.get("vars") or {}).get("service", ""))
        if "_services" in loop:
            if name not in siblings:
                continue
        elif chosen:
            if not chooses(chosen, name, given):
                continue
        elif f"/{name}/" not in _dest(str(args.get("dest", "")), given, name):
            continue
        if not listed:  # prometheus.yml: its sources are the files an ansible find task found
            notes.append(f"roles/{role}/tasks/{file}: {task.get('name', module)!r}: {module} of sources {sources!r}, "
                         "a list made at run time; not carried over")
            continue
        assert isinstance(sources, list)
        src = ITEM_KEY.sub(name, sources[0]).replace("{{ role_path }}/templates/", "")
        dest = _dest(ITEM_KEY.sub(name, str(args.get("dest", ""))), given, name)
        owner = str(task.get("_role", role))
        templates = release.role_dir(owner) / "templates"
        prefix = f"{{{{ node_config_directory }}}}/{name}/"
        label = f"roles/{role}/tasks/{file}: {task.get('name', module)!r}"
        if not dest.startswith(prefix):
            continue  # another service's dir, or outside the config dir
        first = _first_found(task.get("with_first_found"), name, templates) if src == "{{ item }}" else None
        if first is not None:
            src, others = first
            sources = [src, *others]
        if templated(src) or not (templates / src).is_file():
            notes.append(f"{label}: template {src!r} is named at run time or not in the role; not carried over")
            continue
        if not _when(resolver, task.get("when"), {**extra, **(task.get("vars") or {})}, label, notes):
            continue
        path = dest[len(prefix):]
        path = path + Path(src).name.removesuffix(".j2") if path.endswith("/") or not path else path
        if templated(path):
            notes.append(f"{label}: destination {path!r} is named at run time; not carried over")
            continue
        merges = tuple(ITEM_KEY.sub(name, str(s)) for s in sources[1:])
        kind = "first_found" if first is not None else "yaml" if module == "merge_yaml" else "ini" if merges else ""
        out[path] = KollaFile(path, src, owner, merges, kind if merges else "")
        _task_vars(task, loop, name, label, task_vars, notes)
    return tuple(out.values())


def _dest(dest: str, given: dict[str, Any], name: str) -> str:
    """A destination with the task's own variables that name the container put in
    (``{{ service_name }}`` where the task sets ``service_name: "{{ item.key }}"``, or the
    container's name)."""
    for key, value in given.items():
        value = ITEM_KEY.sub(name, value) if isinstance(value, str) else None
        if value is not None and not templated(value):
            dest = re.sub(r"\{\{\s*" + re.escape(str(key)) + r"\s*\}\}", value, dest)
    return dest


# Names the repo gives every template itself (docs/repo.md): a task's ``vars:`` cannot set them.
OWN_NAMES = frozenset({"node", "service", "service_version", "release", "pending_release", "groups", "hostvars",
                       "secrets"})
SERVICE_READ = re.compile(r"(?<![\w.])service(?=\s*[.\[])")
SERVICES_LOOP = re.compile(r"\{\{\s*(\w+_services)\b")


def _task_vars(task: dict[str, Any], loop: str, name: str, label: str, task_vars: dict[str, Any],
               notes: list[str]) -> None:
    """What a template task sets for its template: its ``vars:`` and, in a ``with_dict`` over
    the role's ``<role>_services``, ``item`` (``key``: the container, ``value``: its entry). A
    service renders its files in one context: a name two of its tasks set differently keeps the
    first value, noted."""
    found = SERVICES_LOOP.search(loop)
    given: dict[str, Any] = dict(task.get("vars") or {})
    if found:
        given["item"] = {"key": name, "value": f"{{{{ {found.group(1)}['{name}'] }}}}"}
    entry = None
    own = given.get("service")
    if isinstance(own, str) and own.startswith("{{") and own.endswith("}}"):
        entry = own[2:-2].strip()  # the task's ``service`` (the repo's own name): read as its value
    for key, value in given.items():
        if isinstance(value, str):
            value = ITEM_KEY.sub(name, value)  # known here: item.key is the container's name
            if entry is not None and key not in OWN_NAMES:
                value = SERVICE_READ.sub(f"({entry})", value)
        if key in OWN_NAMES:
            continue  # kolla's ``service`` (the container's entry) gates the task; the templates read item
        if key in task_vars and task_vars[key] != value:
            notes.append(f"{label}: sets {key} to {value!r}, another file's task to {task_vars[key]!r}; "
                         "the service's templates see the first")
            continue
        task_vars[key] = value


CUSTOM = re.compile(r"\{\{\s*node_custom_config\s*\}\}/(.+)")
STAT_MODULES = ("stat", "ansible.builtin.stat")


def _registered(tasks: list[tuple[str, dict[str, Any]]], overrides: frozenset[str]) -> dict[str, Any]:
    """What a role's ``stat`` of a file in kolla's config/ registers (``wsrep_notify_stat``):
    whether the deployment has that file, known at import."""
    out: dict[str, Any] = {}
    for _, task in tasks:
        module = next((k for k in STAT_MODULES if k in task), None)
        path = str((task.get(module) or {}).get("path", "")) if module else ""
        found = CUSTOM.fullmatch(path)
        if found and isinstance(task.get("register"), str) and not templated(found.group(1)):
            out[task["register"]] = {"stat": {"exists": found.group(1) in overrides}}
    return out


def _first_found(raw: Any, name: str, templates: Path) -> tuple[str, list[str]] | None:
    """``with_first_found``: the role's own template among the candidates (the one kolla takes
    when no override is there), and the override candidates before it, as written."""
    items = raw if isinstance(raw, list) else []
    flat: list[str] = []
    for item in items:
        flat += [str(f) for f in item.get("files", [])] if isinstance(item, dict) else [str(item)]
    for i, candidate in enumerate(flat):
        src = ITEM_KEY.sub(name, candidate).replace("{{ role_path }}/templates/", "")
        if not templated(src) and (templates / src).is_file():
            return src, [ITEM_KEY.sub(name, c) for c in flat[:i]]
    return None


def _when(resolver: Resolver, raw: Any, extra: dict[str, Any], label: str, notes: list[str]) -> bool:
    """Whether a task's ``when`` holds for this service; a condition that needs what a task
    registered at run time is noted and taken as true (the file is carried over)."""
    for cond in raw if isinstance(raw, list) else [raw] if raw is not None else []:
        text = str(cond) if isinstance(cond, bool) else f"{{{{ {cond} }}}}"
        try:
            if not to_bool(resolver.expr(text, extra)):
                return False
        except Unresolved as exc:
            notes.append(f"{label}: condition `{cond}` not known at import ({exc}); the file is carried over")
    return True
