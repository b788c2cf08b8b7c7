"""What a kolla role's ``include_role`` of another role templates: kolla's
``service-uwsgi-config``, included by keystone, nova, neutron... with ``vars`` (and nova's with a
``loop``) to write each API's uWSGI config into the container's directory. The import takes its
template tasks as the including role's own (kolla_services.py carries them like any other).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from reconciler.core.yamlfile import safe_load
from reconciler.importers.kolla_resolve import templated

TEMPLATE_MODULES = ("template", "ansible.builtin.template", "merge_configs", "merge_yaml")
ROLE_INCLUDES = ("include_role", "ansible.builtin.include_role", "import_role", "ansible.builtin.import_role")
ONE_VAR = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def included_role(roles: Path, parent: str, task: dict[str, Any],
                   ref: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """An ``include_role`` of a role that templates one file (kolla's ``service-uwsgi-config``):
    its template tasks as the including role's, with the included role's defaults under the
    include's ``vars``, Ansible's ``ansible_parent_role_names`` and the include's ``when``. A
    destination that is one variable (``{{ service_uwsgi_config_file }}``) is that variable's
    value, so the file lands in the container's directory as kolla's task puts it there."""
    name = ref.get("name")
    main = roles / str(name) / "tasks" / "main.yml"
    if not isinstance(name, str) or templated(name) or "tasks_from" in ref or not main.is_file():
        return [("config.yml", task)]  # the file list notes what it could not follow
    defaults_file = roles / name / "defaults" / "main.yml"
    defaults = (safe_load(defaults_file.read_bytes(), str(defaults_file)) or {}) if defaults_file.is_file() else {}
    loop = task.get("loop", task.get("with_items"))
    items = loop if isinstance(loop, list) and all(isinstance(i, dict) for i in loop) else [None]
    inner_tasks = [t for t in safe_load(main.read_bytes(), str(main)) or [] if isinstance(t, dict)]
    out: list[tuple[str, dict[str, Any]]] = []
    for item in items:  # nova's loop: one file per {name, port, workers}
        given = {**defaults, **{k: _item(v, item) for k, v in (task.get("vars") or {}).items()},
                 "ansible_parent_role_names": [parent]}
        for inner in inner_tasks:
            module = next((k for k in TEMPLATE_MODULES if k in inner), None)
            if module is None or not isinstance(inner[module], dict):
                continue
            args = dict(inner[module])
            one = ONE_VAR.fullmatch(str(args.get("dest", "")))
            if one and isinstance(given.get(one.group(1)), str):
                args["dest"] = given[one.group(1)]
            out.append(("config.yml", {"name": task.get("name", f"include_role {name}"), module: args,
                                       "vars": given, "_role": name,
                                       **({"when": task["when"]} if "when" in task else {})}))
    return out


ITEM_FIELD = re.compile(r"\bitem\.(\w+)\b")


def _item(value: Any, item: dict[str, Any] | None) -> Any:
    """A loop variable's value with the loop item's fields put in: ``"{{ item.port }}"`` is the
    field as written, ``nova_services[item.name]`` reads ``nova_services['nova-api']``."""
    if item is None or not isinstance(value, str):
        return value
    whole = re.fullmatch(r"\{\{\s*item\.(\w+)\s*\}\}", value)
    if whole and whole.group(1) in item:
        return item[whole.group(1)]

    def field(found: re.Match[str]) -> str:
        got = item.get(found.group(1))
        return repr(got) if isinstance(got, str) and not templated(got) else found.group(0)

    return ITEM_FIELD.sub(field, value)
