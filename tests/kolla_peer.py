"""The peer of the kolla differential test: ansible-core's own ``template`` module, run by
``ansible-playbook`` on localhost (connection=local), on kolla-ansible's role templates with the
variables kolla-ansible itself gives them.

The play is what ``kolla-ansible genconfig`` runs, cut down to the template tasks compared: the
inventory as given, ``-e @globals.yml -e @passwords.yml -e CONFIG_DIR=... -e kolla_action=config``
as kolla-ansible's CLI passes them, kolla's ``group_vars/all`` beside the playbook, each role's
own defaults, vars, templates and filter plugins (symlinked from the release), kolla's
``filter_plugins`` on the filter path, and the template tasks of the role's ``tasks/config.yml``
taken as kolla writes them (their ``vars``, ``with_dict`` loop and ``when``): a ``merge_configs``
or ``merge_yaml`` runs kolla's own action plugin (config/ overrides merged as kolla merges them),
and the destination is the output directory instead of ``/etc/kolla``.

Facts: the inventory's stand-ins (``ansible_facts="{...}"``, ``eth0_address=``) become the host's
real facts (``ansible_facts.eth0.ipv4.address``) through a one-line module, since a playbook
cannot set ``ansible_facts`` from its inventory.

The venv: kolla-ansible (for its filter plugins' ``kolla_ansible`` package), the same ansible-core
as the project's, netaddr, and the ``ansible.utils`` collection (kolla's group_vars use
``ansible.utils.ipaddr``) taken out of the ``ansible`` package's wheel: all from the package
index, once per machine (a marker file says the venv is complete).
"""

from __future__ import annotations

import ast
import ipaddress
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from cachelock import building

ANSIBLE_CORE = "2.19.14"
ANSIBLE_WITH_COLLECTIONS = "ansible>=12,<13"  # the community package built on ansible-core 2.19


def peer_venv(kolla_version: str) -> Path:
    """The peer's venv under the test cache; a failing install fails the test (no skip)."""
    with building(f"kolla-peer-{kolla_version}") as venv:
        if not (venv / "complete").is_file():
            _make_venv(venv, kolla_version)
    return venv


def _make_venv(venv: Path, kolla_version: str) -> None:
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(venv)],
        [str(venv / "bin" / "pip"), "install", "-q", f"kolla-ansible=={kolla_version}",
         f"ansible-core=={ANSIBLE_CORE}", "netaddr"],
        [str(venv / "bin" / "pip"), "download", "-q", "--no-deps", "--only-binary", ":all:", "-d",
         str(venv / "wheels"), ANSIBLE_WITH_COLLECTIONS],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            pytest.fail(f"peer venv: {shlex.join(step)}: {done.stderr[-800:]}")
    wheel = next((venv / "wheels").glob("ansible-*.whl"))
    with zipfile.ZipFile(wheel) as whl:
        whl.extractall(venv / "collections",
                       [n for n in whl.namelist() if n.startswith("ansible_collections/ansible/utils/")])
    (venv / "complete").write_text(wheel.name + "\n")


FACTS_MODULE = """\
#!/usr/bin/python
from ansible.module_utils.basic import AnsibleModule

module = AnsibleModule(argument_spec={"facts": {"type": "dict", "required": True}})
module.exit_json(changed=False, ansible_facts=module.params["facts"])
"""

TEMPLATE_MODULES = ("ansible.builtin.template", "template", "merge_configs", "merge_yaml")
MERGE_MODULES = ("merge_configs", "merge_yaml")
FACT_MODULES = ("stat", "ansible.builtin.stat", "set_fact", "ansible.builtin.set_fact")
ROLE_PARTS = ("defaults", "vars", "templates", "filter_plugins")


def _peer_tasks(task: dict[str, Any], dest: str | None = None) -> list[dict[str, Any]]:
    """A kolla template task as the peer runs it: the ``template`` module into ``peer_out``,
    after a task making its directory (same loop, same condition)."""
    out = {k: v for k, v in task.items() if k not in (*TEMPLATE_MODULES, "become", "notify", "mode")}
    module = next((k for k in TEMPLATE_MODULES if k in task), None)
    if module is None:
        return [out]  # include_role: kept as written
    args = task[module]
    src = str(args["sources"][0] if module in MERGE_MODULES else args["src"])
    dest = dest or str(args["dest"]).replace("{{ node_config_directory }}", "{{ peer_out }}")
    # Its loop but a with_first_found's (searched in the role's files/ for this module, not found).
    kept = {k: v for k, v in out.items() if k != "with_first_found"}
    mkdir = {**kept, "name": f"{task.get('name', src)}: its directory",
             "ansible.builtin.file": {"path": f"{dest.removesuffix(' }}')} | dirname }}}}", "state": "directory"}}
    if module in MERGE_MODULES:  # kolla's own action plugin, config/ overrides merged
        return [mkdir, {**out, module: {k: v for k, v in args.items() if k != "mode"} | {"dest": dest}}]
    return [mkdir, {**out, "ansible.builtin.template": {"src": src.replace("{{ role_path }}/templates/", ""),
                                                         "dest": dest}}]


def _role(share: Path, roles: Path, role: str, tasks: list[dict[str, Any]]) -> None:
    own = share / "roles" / role
    (roles / role / "tasks").mkdir(parents=True)
    for part in ROLE_PARTS:
        if (own / part).exists():
            (roles / role / part).symlink_to(own / part)
    (roles / role / "tasks" / "main.yml").write_text(yaml.safe_dump(tasks, sort_keys=False))


def _facts(text: str, host_vars: Path) -> None:
    """Each host's facts from the inventory's stand-ins: its ``ansible_facts="{...}"`` and, for
    each ``IFACE_address=IP``, ``IFACE: {ipv4: {address: IP}}`` (as Ansible gathers them)."""
    host_vars.mkdir()
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith(("#", ";", "[")):
            continue
        host, *pairs = shlex.split(line)
        facts: dict[str, Any] = {}
        for pair in pairs:
            key, _, value = pair.partition("=")
            if key == "ansible_facts":
                facts.update(ast.literal_eval(value))
            elif key.endswith("_address") and _ip(value):
                facts[key.removesuffix("_address")] = {
                    "ipv6" if ":" in value else "ipv4": {"address": value}}
        if facts:
            (host_vars / f"{host}.yml").write_text(yaml.safe_dump({"peer_facts": facts}))


def _ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


PRELUDE = {
    "name": "the inventory's stand-ins as the hosts' facts",
    "hosts": "all", "gather_facts": False,
    "tasks": [{"peer_facts": {"facts": "{{ peer_facts }}"}, "when": "peer_facts is defined"}],
}


def run_peer(venv: Path, deployment: Path, inventory: str, nodes: list[str], out: Path,
             wanted: dict[str, list[str]]) -> None:
    """Render, for each of ``nodes`` (ansible-playbook's --limit), the template tasks of ``wanted`` (role -> names
    of the tasks in its tasks/config.yml) into ``out/<host>/<service>/<file>``."""
    share = venv / "share" / "kolla-ansible" / "ansible"
    work = out.parent / "peer-play"
    (work / "roles").mkdir(parents=True)
    (work / "library").mkdir()
    (work / "library" / "peer_facts.py").write_text(FACTS_MODULE)
    (work / "group_vars").mkdir()
    (work / "group_vars" / "all").symlink_to(share / "group_vars" / "all")
    plays: list[dict[str, Any]] = [PRELUDE]
    for role, names in wanted.items():
        tasks = yaml.safe_load((share / "roles" / role / "tasks" / "config.yml").read_text())
        assert {t.get("name") for t in tasks} >= set(names), (role, names)
        # What a template reads that an earlier task registers (a stat of config/, a set_fact)
        # comes from those tasks before them, run as written.
        last = max(i for i, t in enumerate(tasks) if t.get("name") in names)
        chosen = [t for t in tasks[:last + 1] if t.get("name") in names or any(m in t for m in FACT_MODULES)]
        chosen = [peer for t in chosen for peer in _peer_tasks(t)]
        _role(share, work / "roles", role, chosen)
        plays.append({"name": f"role {role}", "hosts": "all", "gather_facts": False, "roles": [role]})
    uwsgi = yaml.safe_load((share / "roles" / "service-uwsgi-config" / "tasks" / "main.yml").read_text())
    uwsgi = [peer for t in uwsgi for peer in _peer_tasks(
        t, "{{ service_uwsgi_config_file | replace(node_config_directory, peer_out) }}")]
    _role(share, work / "roles", "service-uwsgi-config", uwsgi)
    (work / "play.yml").write_text(yaml.safe_dump(plays, sort_keys=False))
    (work / "inventory").mkdir()
    text = (deployment / inventory).read_text()
    (work / "inventory" / "hosts").write_text(re.sub(r"\bansible_facts=(\"[^\"]*\"|'[^']*'|\S+)", "", text))
    _facts(text, work / "inventory" / "host_vars")
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(work), "ANSIBLE_LOCAL_TEMP": str(work / "tmp"),
           "ANSIBLE_FILTER_PLUGINS": str(share / "filter_plugins"),
           "ANSIBLE_ACTION_PLUGINS": str(share / "action_plugins"),
           "ANSIBLE_COLLECTIONS_PATH": str(venv / "collections"),
           "ANSIBLE_PYTHON_INTERPRETER": str(venv / "bin" / "python"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_HOST_KEY_CHECKING": "0", "ANSIBLE_RETRY_FILES_ENABLED": "0"}
    done = subprocess.run(
        [str(venv / "bin" / "ansible-playbook"), "-i", str(work / "inventory" / "hosts"), "-c", "local",
         "--limit", ",".join(nodes),
         "-e", f"@{deployment / 'globals.yml'}", "-e", f"@{deployment / 'passwords.yml'}",
         "-e", f"CONFIG_DIR={deployment}", "-e", "kolla_action=config",
         "-e", f"peer_out={out}/{{{{ inventory_hostname }}}}", str(work / "play.yml")],
        cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


