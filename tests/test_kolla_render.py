"""kolla-ansible's configs as this project renders them from `reconciler import kolla-ansible`'s
output, against ansible-core's own `template` module on the same role templates and variables
(the peer, run here in a venv of its own with kolla-ansible's filter plugins); and the review
seeing what kolla's filters read without a template naming it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_import_kolla import _deployment, _import, kolla_wheel  # noqa: F401 - kolla_wheel: the session's wheel

ANSIBLE = "templates: {dialect: ansible}\n"


def reconciler(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reconciler", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args], cwd=root, check=True,
                   capture_output=True)


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
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
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
enable_proxysql: "no"
"""


def _facts(host: str) -> str:
    """What the import asks of a node kolla gathers facts on: its address on network_interface
    (the stand-in eth0_address) and the facts kolla's templates read (CPUs, architecture)."""
    return (f"eth0_address=10.10.10.{ {'localhost': 11, 'control01': 11, 'network01': 21}.get(host, 31)} "
            f"ansible_facts=\"{{'processor_vcpus': 4, 'hostname': '{host}', 'nodename': '{host}', "
            "'architecture': 'x86_64'}\"")


@pytest.mark.parametrize(("inventory", "nodes"), [
    ("all-in-one", ["localhost"]), ("multinode", ["control01", "network01", "compute01"])])
def test_the_import_of_a_small_cloud_validates(kolla_wheel: Path, tmp_path: Path,  # noqa: F811
                                               inventory: str, nodes: list[str]) -> None:
    dep = tmp_path / "kolla"
    _deployment(kolla_wheel, dep, inventory)
    (dep / "globals.yml").write_text((dep / "globals.yml").read_text() + SMALL_CLOUD)
    lines = []
    for line in (dep / inventory).read_text().splitlines():
        host = line.split()[0] if line.strip() and not line.startswith(("#", "[")) else ""
        if host in ("control02", "control03", "network02", "monitoring01", "storage01"):
            continue  # three nodes: a controller, a network node, a compute
        lines.append(f"{line} {_facts(host)}" if host in nodes else line)
    (dep / inventory).write_text("\n".join(lines) + "\n")
    code, said = _import(kolla_wheel, dep, tmp_path / "repo", nodes)
    assert code == 0, said
    done = reconciler("validate", "--repo", str(tmp_path / "repo"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(nodes)} nodes" in done.stdout
    repo = tmp_path / "repo"
    nova = (repo / "services" / "nova-api" / "service.yaml").read_text()
    assert "service_name: nova-api" in nova  # the template task's vars, item.key known at import
    assert "project_name: nova" in nova  # the role's vars/main.yml
