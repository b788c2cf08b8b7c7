"""IMPORT.md: everything the import did not carry over, so nothing is dropped silently.

- the task-set variables the carried templates read (``item``, ``service_name``, a registered
  result): names no variable file, globals.yml or passwords.yml defines;
- ``lookup(...)`` calls and filters the Ansible dialect does not provide;
- the config merges kolla makes at deploy time that the services' ``merge`` entries do not say
  (``kolla_merges``), and the override files of config/ no merge reads;
- the credentials and secret files not written in clear (``kolla_secrets``), by name;
- each service's container settings, files named at run time and conditions left untested;
- the task files each role's ``deploy.yml`` runs besides writing configs and containers
  (databases, service users, endpoints, keystone's fernet keys): kolla's one-off deploy work.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from reconciler.importers.kolla_inventory import KollaDeployment
from reconciler.importers.kolla_merges import reads, unexpressed
from reconciler.importers.kolla_services import KollaService
from reconciler.importers.kolla_source import KollaRelease

# What a template sees besides the inventory's variables (docs/repo.md, the Ansible dialect).
PROVIDED = frozenset({"node", "service", "release", "groups", "hostvars", "secrets", "inventory_hostname",
                      "ansible_facts", "facts", "lookup", "omit", "range", "dict", "lipsum", "cycler", "joiner",
                      "namespace", "loop", "true", "false", "none", "True", "False", "None"})
# Filters the Ansible dialect implements (issue 39's list, kolla's own filters included).
DIALECT = frozenset({"bool", "ternary", "regex_replace", "regex_search", "regex_escape", "to_json", "to_nice_json",
                     "to_yaml", "to_nice_yaml", "from_json", "from_yaml", "combine", "dict2items", "items2dict",
                     "zip", "basename", "dirname", "b64encode", "b64decode", "hash", "password_hash", "mandatory",
                     "ipaddr", "ipv4", "ipv6", "ipwrap", "ansible.utils.ipaddr", "ansible.utils.ipwrap",
                     "put_address_in_context", "kolla_address", "kolla_url", "flatten", "unique", "difference",
                     "union", "intersect", "quote", "bcrypt_hash", "split", "dict", "customise_fluentd",
                     "database_shards_info"})


def _always(*_args: Any) -> bool:
    return True


def _scan(text: str) -> tuple[set[str], set[str], list[str]]:
    """Names read, filters used, lookup calls of one template (parsed as Jinja; a template Jinja
    cannot parse reports its error as its one filter)."""
    from jinja2 import Environment, meta, nodes

    env = Environment(extensions=["jinja2.ext.do", "jinja2.ext.loopcontrols"])
    try:
        tree = env.parse(text)
    except Exception as exc:  # noqa: BLE001 - any parse error is reported, not raised
        return set(), {f"<does not parse: {exc}>"}, []
    filters = {f.name for f in tree.find_all(nodes.Filter)} | {t.name for t in tree.find_all(nodes.Test)
                                                               if "." in t.name}
    # find_undeclared_variables compiles the tree: every filter and test it names must exist.
    env.filters.update({name: str for name in filters if name not in env.filters})
    env.tests.update({t.name: _always for t in tree.find_all(nodes.Test) if t.name not in env.tests})
    lookups = [m.group(0) for m in re.finditer(r"lookup\(\s*['\"][^'\"]+['\"][^)]*\)", text)]
    return set(meta.find_undeclared_variables(tree)), filters, lookups


def report(release: KollaRelease, dep: KollaDeployment, services: list[KollaService], merged: dict[str, Any],
           lost: list[str], copied: list[Path], withheld: list[str], secret: list[Path]) -> tuple[str, int]:
    """IMPORT.md and the number of its items. ``copied``: the config/ overrides copied as they
    are; ``withheld``: the credentials and secret files not written in clear (names, no values);
    ``secret``: the overrides carried as secrets."""
    from jinja2 import Environment

    builtin = set(Environment().filters)
    known = set(merged) | set(dep.passwords) | PROVIDED
    task_vars: dict[str, set[str]] = defaultdict(set)
    filters: dict[str, set[str]] = defaultdict(set)
    lookups: dict[str, set[str]] = defaultdict(set)
    seen: set[tuple[str, str]] = set()
    for svc in services:
        for f in svc.files:
            if (f.role, f.template) in seen:
                continue
            seen.add((f.role, f.template))
            where = f"roles/{f.role}/templates/{f.template}"
            names, used, calls = _scan((release.role_dir(f.role) / "templates" / f.template).read_text(
                errors="replace"))
            for name in names - known:
                task_vars[name].add(where)
            for name in used - DIALECT - builtin:
                filters[name].add(where)
            for call in calls:
                lookups[call].add(where)
    lines = [f"# What the import from kolla-ansible {release.version} did not carry over", "",
             "Each line is something kolla-ansible does at deploy time that this repo does not say by itself.", ""]
    count = 0

    def section(title: str, items: list[str]) -> None:
        nonlocal count
        lines.extend([f"## {title}", ""] + [f"- {i}" for i in items] + (["- (none)"] if not items else []) + [""])
        count += len(items)

    section("Task-set variables (set by a task or a loop, not by any variable file)",
            [f"`{n}`: read by {', '.join(sorted(w))}" for n, w in sorted(task_vars.items())])
    section("Lookups", [f"`{c}` in {', '.join(sorted(w))}" for c, w in sorted(lookups.items())])
    section("Filters the Ansible dialect does not provide",
            [f"`{n}` in {', '.join(sorted(w))}" for n, w in sorted(filters.items())])
    section("Config merges not expressed", unexpressed(services, secret))
    section("Override files of config/ (copied under kolla-config/, read by no merge)",
            [f"config/{p}" for p in copied if not any(reads(f, p) for s in services for f in s.files)])
    section("Deploy tasks not carried over (kolla runs them at deploy: databases, service users, endpoints, "
            "keys; run them once with kolla-ansible before the move, or as this repo's upgrade steps)",
            _deploy_tasks(release, sorted({s.role for s in services})))
    section("Credentials and secret material (never written in clear)", withheld)
    section("Per service", [f"{s.name}: {n}" for s in services for n in s.notes])
    section("Other", lost)
    return "\n".join(lines), count


# Written as configs and containers by the import itself (kolla_services); the rest of a deploy is not.
_CARRIED = frozenset({"config.yml", "check-containers.yml"})


def _deploy_tasks(release: KollaRelease, roles: list[str]) -> list[str]:
    """Per role, the task files its ``tasks/deploy.yml`` imports or includes besides the config
    and the containers, with their ``when`` if any: what a kolla deploy does that this repo does
    not say. The release's files are read as data (``yaml.safe_load``), never run."""
    import yaml

    out = []
    for role in roles:
        path = release.role_dir(role) / "tasks" / "deploy.yml"
        try:
            tasks = yaml.safe_load(path.read_text(errors="replace"))
        except (OSError, yaml.YAMLError):
            continue
        runs = []
        for task in tasks if isinstance(tasks, list) else ():
            if not isinstance(task, dict):
                continue
            name = next((v for k, v in task.items() if str(k).endswith(("import_tasks", "include_tasks"))), None)
            if not isinstance(name, str) or name in _CARRIED:
                continue
            when = task.get("when")
            conds = [str(w) for w in (when if isinstance(when, list) else [when] if when is not None else [])]
            runs.append(f"{name} (when {' and '.join(conds)})" if conds else name)
        if runs:
            out.append(f"roles/{role}/tasks/deploy.yml: {', '.join(runs)}")
    return out
