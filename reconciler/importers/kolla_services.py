"""Kolla's containers as services: each entry of a role's ``<role>_services`` dict that is
enabled (the role's ``enable_*`` and the entry's own ``enabled``), with its image, volumes and
healthcheck, and the files the role's ``tasks/config.yml`` writes into its config directory
(``config.json`` from ``<service>.json.j2``, ``keystone.conf`` from a ``merge_configs``...).

What the tasks do that a service here cannot say (a file named at run time, a condition on a
task's registered result, an included role) is kept as a note for IMPORT.md, never dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconciler.core.yamlfile import safe_load
from reconciler.importers.kolla_resolve import Resolver, Unresolved, templated, to_bool
from reconciler.importers.kolla_source import KollaRelease

TEMPLATE_MODULES = ("template", "ansible.builtin.template", "merge_configs", "merge_yaml")
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


def _services_dict(defaults: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    for key, value in defaults.items():
        if key.endswith("_services") and isinstance(value, dict) and value and all(
                isinstance(v, dict) and "container_name" in v for v in value.values()):
            return key, value
    return None


def enabled_services(release: KollaRelease, resolver: Resolver) -> list[KollaService]:
    """The enabled services of every role, in role order."""
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
            out.append(_service(release, resolver, role, name, spec, found[1], tasks))
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
        include = next((task[k] for k in INCLUDES if k in task), None)
        if isinstance(include, str) and depth < 2 and not templated(include):
            out += _config_tasks(path.parent / include, depth + 1)
            continue
        out.append((path.name, task))
    return out


def _service(release: KollaRelease, resolver: Resolver, role: str, name: str, spec: dict[str, Any],
             siblings: dict[str, Any], tasks: list[tuple[str, dict[str, Any]]]) -> KollaService:
    notes: list[str] = []
    extra = {"item": {"key": name, "value": spec}, "service": spec, "service_name": name, "project_name": role}
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
    files = _files(release, resolver, role, name, spec, siblings, tasks, extra, notes)
    try:
        group = str(resolver.value(spec.get("group", name), extra))
    except Unresolved as exc:
        group = name
        notes.append(f"group {spec.get('group')!r}: not resolved ({exc}); the group {name} is used")
    return KollaService(name, role, group, str(spec.get("container_name", name)),
                        str(spec.get("image", "")), volumes, healthcheck, env, files, tuple(notes))


def _volumes(resolver: Resolver, name: str, raw: Any, extra: dict[str, Any], notes: list[str]) -> tuple[str, ...]:
    try:
        items = resolver.value(raw, extra)
    except Unresolved as exc:
        notes.append(f"volumes {raw!r}: not resolved ({exc}); none carried over")
        return ()
    kept: list[str] = []
    for item in items if isinstance(items, list) else []:
        try:
            now = str(resolver.value(item, extra))
        except Unresolved:
            kept.append(str(item))  # a template the node renders
            continue
        if not now.strip():
            continue  # kolla's container module drops an empty volume (a feature turned off)
        if now.rstrip("/").endswith(f"/{name}/:{CONFIG_DIR}/:ro") or now.startswith(f"/etc/kolla/{name}/:"):
            continue  # the config dir: the rendered files are mounted there (runtime.config_dir)
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
           notes: list[str]) -> tuple[KollaFile, ...]:
    templates = release.role_dir(role) / "templates"
    out: dict[str, KollaFile] = {}
    for file, task in tasks:
        module = next((k for k in TEMPLATE_MODULES if k in task), None)
        if module is None:
            continue
        args = task[module] if isinstance(task[module], dict) else {}
        sources = args.get("sources") if "merge" in module else [args.get("src")]
        if not isinstance(sources, list) or not sources or not isinstance(sources[0], str):
            continue
        loop = str(task.get("with_dict", ""))
        chosen = str((task.get("vars") or {}).get("service", ""))
        if "_services" in loop:
            if name not in siblings:
                continue
        elif chosen:
            if f"['{name}']" not in chosen and f'["{name}"]' not in chosen:
                continue
        elif f"/{name}/" not in str(args.get("dest", "")):
            continue
        src = ITEM_KEY.sub(name, sources[0]).replace("{{ role_path }}/templates/", "")
        dest = ITEM_KEY.sub(name, str(args.get("dest", "")))
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
        if not _when(resolver, task.get("when"), extra, label, notes):
            continue
        path = dest[len(prefix):]
        path = path + Path(src).name.removesuffix(".j2") if path.endswith("/") or not path else path
        if templated(path):
            notes.append(f"{label}: destination {path!r} is named at run time; not carried over")
            continue
        merges = tuple(ITEM_KEY.sub(name, str(s)) for s in sources[1:])
        out[path] = KollaFile(path, src, role, merges)
    return tuple(out.values())


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
            return src, [ITEM_KEY.sub(name, c) + " (first found)" for c in flat[:i]]
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
