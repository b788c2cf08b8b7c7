"""kolla-ansible's configs as this project renders them from `reconciler import kolla-ansible`'s
output, against ansible-core's own `template` module on the same role templates and variables
(the peer, run here in a venv of its own with kolla-ansible's filter plugins); and the review
seeing what kolla's filters read without a template naming it."""

from __future__ import annotations

import difflib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_import_kolla import _deployment, _import, kolla_wheel  # noqa: F401 - kolla_wheel: the session's wheel

ANSIBLE = "templates: {dialect: ansible}\n"


def reconciler(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reconciler", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args], cwd=root, check=True,
                   capture_output=True)


def _write(root: Path, files: dict[str, str]) -> None:
    """A small repo of ``files`` (repo path -> text) under ``root``."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_a_review_sees_an_interface_change_read_only_through_kolla_address(tmp_path: Path) -> None:
    # kolla_address reads hostvars[node].api_interface and <iface>_address: the template names
    # neither, and the diff must still render it when they change.
    root = tmp_path / "repo"
    files = {
        "reconciler.yaml": "format: 1\nname: p\n" + ANSIBLE,
        "inventory.yaml": "vars: {api_interface: eth0}\ngroups:\n  g: {services: [s]}\nnodes:\n"
                          "  n1: {groups: [g], vars: {eth0_address: 10.0.0.1, eth1_address: 10.1.0.1}}\n",
        "services/s/service.yaml": "runtime: {command: [x]}\nfiles: [{path: out, template: t.j2}]\n",
        "services/s/templates/t.j2": "bind = {{ 'api' | kolla_address }}\n",
    }
    _write(root, files)
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "a")
    for old, new in (("api_interface: eth0", "api_interface: eth1"), ("eth0_address: 10.0.0.1", "eth0_address: 10.0.0.2")):
        (root / "inventory.yaml").write_text(files["inventory.yaml"].replace(old, new))
        proc = reconciler("diff", "--repo", str(root), "--local", "-o", "json")
        assert proc.returncode == 0, proc.stderr
        seen = {n["node"]: sorted(f["path"] for f in n["files"]) for n in json.loads(proc.stdout)["nodes"]
                if n["files"]}
        assert seen == {"n1": ["out"]}, (new, proc.stdout)


SMALL_CLOUD = """\
enable_horizon: "no"
enable_fluentd: "no"
enable_heat: "no"
"""


def _facts(host: str) -> str:
    """What the import asks of a node kolla gathers facts on: its address on network_interface
    (the stand-in eth0_address) and the facts kolla's templates read (CPUs, architecture)."""
    return (f"eth0_address=10.10.10.{ {'localhost': 11, 'control01': 11, 'network01': 21}.get(host, 31)} "
            f"ansible_facts=\"{{'processor_vcpus': 4, 'hostname': '{host}', 'nodename': '{host}', "
            "'architecture': 'x86_64', 'memtotal_mb': 4096}\"")


@pytest.mark.parametrize(("inventory", "nodes"), [
    ("all-in-one", ["localhost"]), ("multinode", ["control01", "network01", "compute01"])])
def test_the_import_of_a_small_cloud_validates(kolla_wheel: Path, tmp_path: Path,  # noqa: F811
                                               inventory: str, nodes: list[str]) -> None:
    _small_cloud(kolla_wheel, tmp_path, inventory, nodes)
    done = reconciler("validate", "--repo", str(tmp_path / "repo"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(nodes)} nodes" in done.stdout
    repo = tmp_path / "repo"
    nova = (repo / "services" / "nova-api" / "service.yaml").read_text()
    assert "service_name: nova-api" in nova  # the template task's vars, item.key known at import
    assert "project_name: nova" in nova  # the role's vars/main.yml


def _small_cloud(kolla_wheel: Path, tmp_path: Path, inventory: str, nodes: list[str]) -> Path:  # noqa: F811
    """kolla's example inventory cut to ``nodes``, each with its address and facts stand-ins,
    globals.yml of a small cloud, imported into tmp_path/repo. Returns the deployment dir."""
    dep = tmp_path / "kolla"
    _deployment(kolla_wheel, dep, inventory)
    (dep / "globals.yml").write_text((dep / "globals.yml").read_text() + SMALL_CLOUD)
    # config/ overrides kolla merges (besides _deployment's nova-compute.conf): every service's, one node's.
    (dep / "config" / "global.conf").write_text("[DEFAULT]\ndebug = True\n[oslo_messaging_rabbitmq]\n"
                                                "heartbeat_rate = '3'\n")
    (dep / "config" / "nova" / nodes[-1]).mkdir()
    (dep / "config" / "nova" / nodes[-1] / "nova.conf").write_text(
        "[DEFAULT]\n  {% if enable_nova | bool %}\nmy_ip = {{ inventory_hostname }}\n  {% endif %}\n")
    lines = []
    for line in (dep / inventory).read_text().splitlines():
        host = line.split()[0] if line.strip() and not line.startswith(("#", "[")) else ""
        if host in ("control02", "control03", "network02", "monitoring01", "storage01"):
            continue  # three nodes: a controller, a network node, a compute
        lines.append(f"{line} {_facts(host)}" if host in nodes else line)
    (dep / inventory).write_text("\n".join(lines) + "\n")
    code, said = _import(kolla_wheel, dep, tmp_path / "repo", nodes)
    assert code == 0, said
    return dep


# The template tasks compared, by their name in the role's tasks/config.yml: keystone.conf and
# its uWSGI config (kolla's keystone runs under uWSGI; httpd-keystone.conf only with federation),
# nova.conf of nova-api (role nova) and of nova-compute (role nova-cell), neutron.conf and
# ml2_conf.ini, nova's and neutron's uWSGI configs, the config.json of keystone's containers.
COMPARED = {
    "keystone": ["Copying over config.json files for services", "Copying over keystone.conf",
                 "Configure uWSGI for Keystone"],
    "nova": ["Copying over nova.conf", "Configure uWSGI for Nova"],
    "nova-cell": ["Copying over nova.conf"],
    "neutron": ["Copying over neutron.conf", "Copying over ml2_conf.ini", "Configure uWSGI for Neutron"],
    "loadbalancer": ["Copying over proxysql config"],  # kolla's database_shards_info
}
# Differences that are meant, by file: none today. (A password shows in the review's render as
# "<secret NAME digest>", never its value: both sides are compared with it as "<secret NAME>".)
INTENDED: dict[str, str] = {}


def _lines(text: str) -> list[str]:
    """Up to whitespace: trailing spaces and blank lines do not count."""
    return [line.rstrip() for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize(("inventory", "nodes"), [
    ("all-in-one", ["localhost"]), ("multinode", ["control01", "network01", "compute01"])])
def test_kolla_configs_render_as_ansible_renders_them(kolla_wheel: Path, tmp_path: Path,  # noqa: F811
                                                      inventory: str, nodes: list[str]) -> None:
    """The differential test against the real peer: ansible-playbook's template module on the
    same role templates, variables and facts stand-ins (kolla_peer.py), every file it writes
    compared with `reconciler render --out` of the imported repo."""
    from kolla_peer import peer_venv, run_peer
    from test_import_kolla import KOLLA_VERSION

    dep = _small_cloud(kolla_wheel, tmp_path, inventory, nodes)
    ours = tmp_path / "ours"
    done = reconciler("render", "--repo", str(tmp_path / "repo"), "--all", "--out", str(ours))
    assert done.returncode == 0, done.stdout + done.stderr
    peer = tmp_path / "peer" / "out"
    peer.mkdir(parents=True)
    run_peer(peer_venv(KOLLA_VERSION), dep, inventory, nodes, peer, COMPARED)
    passwords = {k: str(v) for k, v in yaml.safe_load((dep / "passwords.yml").read_text()).items()
                 if isinstance(v, str | int) and not isinstance(v, bool)}
    compared, differ = [], []
    for theirs in sorted(p for p in peer.rglob("*") if p.is_file()):
        rel = str(theirs.relative_to(peer))
        expected = theirs.read_text()
        for name, value in sorted(passwords.items(), key=lambda kv: -len(kv[1])):
            expected = expected.replace(value, f"<secret {name}>")
        mine = ours / rel
        got = re.sub(r"<secret (\w+) [0-9a-f]+>", r"<secret \1>", mine.read_text()) if mine.is_file() else ""
        compared.append(rel)
        if _lines(got) != _lines(expected) and rel not in INTENDED:
            diff = difflib.unified_diff(_lines(expected), _lines(got), "ansible", "reconciler", lineterm="", n=1)
            differ.append(f"{rel}:\n" + ("\n".join(list(diff)[:12]) if mine.is_file() else "  not rendered"))
    assert not differ, "\n".join(differ)
    for wanted in ("keystone/keystone.conf", "keystone/keystone-uwsgi.ini", "nova-api/nova.conf",
                   "nova-compute/nova.conf", "neutron-server/neutron.conf", "neutron-server/ml2_conf.ini",
                   "proxysql/proxysql.yaml"):
        assert any(rel.endswith(wanted) for rel in compared), (wanted, compared)


def test_a_service_default_reading_only_node_variables_stays_that_services(tmp_path: Path) -> None:
    # kolla's include_role of service-uwsgi-config: each service sets the port its own way, from
    # node-wide variables; one service's value must not be cached for the node's other services.
    root = tmp_path / "repo"
    files = {
        "reconciler.yaml": "format: 1\nname: p\n" + ANSIBLE,
        "inventory.yaml": "vars: {a_port: 1, b_port: 2}\ngroups:\n  g: {services: [a, b]}\nnodes:\n"
                          "  n1: {groups: [g]}\n",
    }
    for name in ("a", "b"):
        files[f"services/{name}/service.yaml"] = ("runtime: {command: [x]}\nfiles: [{path: out, template: t.j2}]\n"
                                                  f"defaults: {{port: '{{{{ {name}_port }}}}'}}\n")
        files[f"services/{name}/templates/t.j2"] = "port = {{ port }}\n"
    _write(root, files)
    done = reconciler("render", "--repo", str(root), "--all", "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert [(tmp_path / "out" / "n1" / s / "out").read_text() for s in ("a", "b")] == ["port = 1\n", "port = 2\n"]


def test_an_entry_of_a_mapping_reads_without_the_others_failing(tmp_path: Path) -> None:
    # kolla's neutron_services['neutron-server'].wsgi, where another entry's volumes read a fact
    # the node lacks: Ansible renders the entry read; printing the whole mapping still fails.
    root = tmp_path / "repo"
    files = {
        "reconciler.yaml": "format: 1\nname: p\n" + ANSIBLE,
        "inventory.yaml": "vars:\n  svcs: {a: {wsgi: x}, b: {vol: '{{ os_family }}'}}\n"
                          "groups:\n  g: {services: [s]}\nnodes:\n  n1: {groups: [g]}\n",
        "services/s/service.yaml": "runtime: {command: [x]}\nfiles: [{path: out, template: t.j2}]\n",
        "services/s/templates/t.j2": "{{ svcs.a.wsgi }} {{ svcs.b.vol is defined }}\n",
    }
    _write(root, files)
    done = reconciler("render", "--repo", str(root), "--all", "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "out" / "n1" / "s" / "out").read_text() == "x False\n"
    (root / "services/s/templates/t.j2").write_text("{{ svcs }}\n")
    done = reconciler("render", "--repo", str(root), "--all", "--out", str(tmp_path / "out2"))
    assert done.returncode == 2 and "svcs (inventory.yaml:2) -> undefined 'os_family'" in done.stderr, done.stderr
