"""`reconciler import kolla-ansible` on kolla-ansible's own example inventories and globals.yml,
with the role templates of the pinned kolla-ansible release from the package index (downloaded
once per session; an index out of reach fails the test, it does not skip it)."""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from cachelock import building

KOLLA_VERSION = "22.2.0"
SHARE = f"kolla_ansible-{KOLLA_VERSION}.data/data/share/kolla-ansible"
MULTINODE = ["control01", "control02", "control03", "network01", "network02", "compute01", "monitoring01",
             "storage01"]
GLOBALS = """\
---
kolla_base_distro: "rocky"
kolla_internal_vip_address: "10.10.10.254"
network_interface: "eth0"
neutron_external_interface: "eth1"
enable_haproxy: "no"
enable_cinder: "no"
"""


@pytest.fixture(scope="session")
def kolla_wheel() -> Path:
    with building("kolla") as cache:
        found = sorted(cache.glob(f"kolla_ansible-{KOLLA_VERSION}-*.whl"))
        if not found:
            done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                                   "-d", str(cache), f"kolla-ansible=={KOLLA_VERSION}"], capture_output=True,
                                  text=True)
            found = sorted(cache.glob(f"kolla_ansible-{KOLLA_VERSION}-*.whl"))
            if done.returncode != 0 or not found:
                pytest.fail(f"pip download kolla-ansible=={KOLLA_VERSION}: {done.stderr[-500:]}")
    return found[0]


def _deployment(wheel: Path, where: Path, inventory: str) -> dict[str, str]:
    """A kolla deployment dir as a user has it: kolla's example inventory, globals.yml set,
    passwords.yml filled as kolla-genpwd does (each value random), a nova override. Returns the
    passwords."""
    where.mkdir()
    with zipfile.ZipFile(wheel) as whl:
        (where / inventory).write_bytes(whl.read(f"{SHARE}/ansible/inventory/{inventory}"))
        example = whl.read(f"{SHARE}/etc_examples/kolla/passwords.yml").decode().splitlines()
    (where / "globals.yml").write_text(GLOBALS)
    filled, values = [], {}
    for i, line in enumerate(example):
        m = re.match(r"^(\s*)([a-z0-9_]+):\s*$", line)
        following = example[i + 1] if i + 1 < len(example) else ""
        if m and not following.startswith(m.group(1) + "  "):
            values[m.group(2)] = f"pw-{secrets.token_hex(10)}"
            line = f"{m.group(1)}{m.group(2)}: {values[m.group(2)]}"
        filled.append(line)
    (where / "passwords.yml").write_text("\n".join(filled) + "\n")
    (where / "config" / "nova").mkdir(parents=True)
    (where / "config" / "nova" / "nova-compute.conf").write_text("[DEFAULT]\ncpu_allocation_ratio = 4.0\n")
    return values


def _recipient() -> str:
    import pyrage

    return str(pyrage.x25519.Identity.generate().to_public())


def _import(wheel: Path, dep: Path, out: Path, nodes: list[str], key: str | None = None) -> tuple[int, str]:
    key = key or _recipient()
    args = ["import", "kolla-ansible", str(dep), str(out), "--kolla", str(wheel)]
    for node in nodes:
        args += ["--age-recipient", f"{node}={key}"]
    done = _reconciler(*args)
    return done.returncode, done.stdout + done.stderr


def _reconciler(*args: str) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it (its errors and exit codes are main()'s)."""
    return subprocess.run([sys.executable, "-m", "reconciler", *args], capture_output=True, text=True, timeout=120)


def test_multinode_import_makes_a_repo_with_every_enabled_service_and_no_password_in_clear(
        kolla_wheel: Path, tmp_path: Path) -> None:
    passwords = _deployment(kolla_wheel, tmp_path / "kolla", "multinode")
    code, said = _import(kolla_wheel, tmp_path / "kolla", tmp_path / "repo", MULTINODE)
    assert code == 0, said
    repo = tmp_path / "repo"
    assert "kolla-ansible 22.2.0" in (repo / "reconciler.yaml").read_text()
    assert "dialect: ansible" in (repo / "reconciler.yaml").read_text()
    services = {p.name for p in (repo / "services").iterdir()}
    assert {"keystone", "nova-api", "nova-compute", "neutron-server", "neutron-l3-agent", "glance-api",
            "placement-api", "mariadb", "rabbitmq"} <= services
    assert not any(s.startswith("cinder") for s in services)  # enable_cinder: "no"
    keystone = (repo / "services" / "keystone" / "service.yaml").read_text()
    assert "network_mode: host" in keystone and "{{ keystone_image_full }}" in keystone
    assert (repo / "services" / "keystone" / "templates" / "keystone.json.j2").is_file()  # kolla's config.json
    inventory = (repo / "inventory.yaml").read_text()
    assert "kolla_internal_vip_address: 10.10.10.254" in inventory
    assert "keystone_admin_password: '{{ secrets.keystone_admin_password }}'" in inventory
    every = "\n".join(p.read_text(errors="replace") for p in repo.rglob("*") if p.is_file())
    for name in ("keystone_admin_password", "database_password", "rabbitmq_password", "nova_keystone_password"):
        assert passwords[name] not in every
    assert all("ENC[AES256_GCM" in p.read_text() for p in (repo / "secrets").glob("*.yaml"))  # split by readers
    report = (repo / "IMPORT.md").read_text()
    assert "`service_name`: read by" in report and "`item`: read by" in report  # task-set variables
    # kolla's deploy does more than write configs and run containers: its databases, users and
    # endpoints, keystone's fernet keys. Not carried over, so said, task file by task file.
    assert re.search(r"roles/keystone/tasks/deploy\.yml: .*bootstrap\.yml.*distribute_fernet\.yml.*register\.yml", report)
    assert "roles/memcached" not in report.split("## Deploy tasks")[1].split("##")[0]  # config and containers only
    assert "kolla-config/nova/nova-compute.conf" in (repo / "services/nova-compute/service.yaml").read_text()  # merged
    # kolla deploys the database, queue, caches and keystone before the services that use them;
    # reconciler starts independent services in parallel, so the import says what waits for what.
    depends = {name: yaml.safe_load((repo / "services" / name / "service.yaml").read_text()).get("depends_on", [])
               for name in ("mariadb", "rabbitmq", "keystone", "nova-api", "nova-compute", "glance-api")}
    assert "haproxy" in depends["mariadb"] and "keystone" not in depends["mariadb"]  # the load balancer first
    assert {"mariadb", "memcached"} <= set(depends["rabbitmq"])
    assert {"mariadb", "memcached", "rabbitmq"} <= set(depends["keystone"]) and "keystone-ssh" not in depends["keystone"]
    assert {"keystone", "mariadb", "rabbitmq"} <= set(depends["nova-api"]) <= {
        s for s in services if not s.startswith(("nova", "neutron", "glance", "placement", "horizon"))}
    assert depends["nova-compute"] == depends["nova-api"] == depends["glance-api"]


def test_all_in_one_import_without_node_addresses_asks_for_them(kolla_wheel: Path, tmp_path: Path) -> None:
    """Given no address for the node, `validate` stops on what kolla reads from facts; IMPORT.md
    asks for it (test_kolla_render.py gives it, and the import validates)."""
    _deployment(kolla_wheel, tmp_path / "kolla", "all-in-one")
    with (tmp_path / "kolla" / "globals.yml").open("a") as f:
        f.write('enable_fluentd: "no"\n')  # its task-set variables (a find in config/fluentd/) are not carried over
    code, said = _import(kolla_wheel, tmp_path / "kolla", tmp_path / "repo", ["localhost"])
    assert code == 0, said
    done = _reconciler("validate", "--repo", str(tmp_path / "repo"))
    problems = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == 2 and problems
    report = (tmp_path / "repo" / "IMPORT.md").read_text()
    asked = {m.group(1) for line in problems for m in re.finditer(r"set the inventory variable '(\w+)'", line)}
    assert asked == {"eth0_address"}, problems
    assert "node localhost: no address for api" in report and "set `eth0_address`" in report


@pytest.mark.parametrize(("inventory", "globals_yml", "error"), [
    ("[control]\ncontrol01\n[bad\n", GLOBALS, r"multinode:3: '\[bad' is not a section header"),
    ("[control]\ncontrol01 ansible_host\n", GLOBALS, r"multinode:2: 'ansible_host' is not a host variable"),
    ("[control]\ncontrol01\n", "- a\n- list\n", r"globals.yml:1: globals.yml is not a mapping"),
])
def test_bad_input_is_one_line_naming_file_and_line_and_nothing_is_written(
        kolla_wheel: Path, tmp_path: Path, inventory: str, globals_yml: str, error: str) -> None:
    _deployment(kolla_wheel, tmp_path / "kolla", "multinode")
    (tmp_path / "kolla" / "multinode").write_text(inventory)
    (tmp_path / "kolla" / "globals.yml").write_text(globals_yml)
    code, said = _import(kolla_wheel, tmp_path / "kolla", tmp_path / "repo", ["control01"])
    assert code == 2
    assert re.search(error, said), said
    assert not (tmp_path / "repo").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["kolla"]


def test_no_inventory_is_an_error(kolla_wheel: Path, tmp_path: Path) -> None:
    _deployment(kolla_wheel, tmp_path / "kolla", "multinode")
    (tmp_path / "kolla" / "multinode").unlink()
    code, said = _import(kolla_wheel, tmp_path / "kolla", tmp_path / "repo", ["control01"])
    assert code == 2 and "no such inventory file" in said


def test_credentials_and_secret_files_of_the_deployment_never_reach_the_repo_in_clear(
        kolla_wheel: Path, tmp_path: Path) -> None:
    """What kolla inventories and config/ often hold: Ansible's become and ssh passwords on a
    host line and in [group:vars], an external Ceph keyring, an override holding a password of
    passwords.yml, a symlink to a file outside config/. No value of them is in any file of the
    repo (IMPORT.md included); IMPORT.md names each; the secret files are carried encrypted."""
    import pyrage
    import yaml

    from reconciler.render.secrets import identities, unlock
    from reconciler.repo.sops import parse_documents

    dep = tmp_path / "kolla"
    passwords = _deployment(kolla_wheel, dep, "multinode")
    inventory = (dep / "multinode").read_text()
    assert "\ncompute01\n" in inventory
    inventory = inventory.replace("\ncompute01\n", "\ncompute01 ansible_become_password=hunter2-secret "
                                  "ansible_user=kolla\n")
    (dep / "multinode").write_text(inventory + "\n[compute:vars]\nansible_ssh_pass=ssh-pass-secret\n"
                                   "nova_compute_virt_type=qemu\n")
    keyring = "[client.nova]\n\tkey = AQBkeyringSecretValue0123456789abcdefg==\n"
    (dep / "config" / "nova" / "ceph.client.nova.keyring").write_text(keyring)
    db_password = passwords["keystone_database_password"]
    keystone_conf = f"[database]\nconnection = mysql+pymysql://keystone:{db_password}@db/keystone\n"
    (dep / "config" / "keystone.conf").write_text(keystone_conf)
    (tmp_path / "elsewhere.txt").write_text("outside-secret-value\n")
    (dep / "config" / "glance.conf").symlink_to(tmp_path / "elsewhere.txt")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "cinder.conf").write_text("outside-directory-secret\n")
    (dep / "config" / "cinder").symlink_to(tmp_path / "elsewhere")
    identity = pyrage.x25519.Identity.generate()

    code, said = _import(kolla_wheel, dep, tmp_path / "repo", MULTINODE, key=str(identity.to_public()))
    assert code == 0, said
    repo = tmp_path / "repo"
    every = {str(p.relative_to(repo)): p.read_bytes() for p in repo.rglob("*") if p.is_file()}
    for value in ("hunter2-secret", "ssh-pass-secret", "keyringSecretValue", db_password, "outside-secret-value",
                  "outside-directory-secret"):
        assert [rel for rel, body in every.items() if value.encode() in body] == [], value
        assert value not in said
    assert not [p for p in repo.rglob("*") if p.is_symlink()]
    assert "nova_compute_virt_type: qemu" in every["inventory.yaml"].decode()  # the group's own variable stays
    report = every["IMPORT.md"].decode()
    for named in ("ansible_become_password", "ansible_user", "ansible_ssh_pass",
                  "config/nova/ceph.client.nova.keyring", "config/keystone.conf", "config/glance.conf",
                  "config/cinder: a symbolic link"):
        assert named in report, named
    assert (repo / "kolla-config/nova/nova-compute.conf").is_file()  # read by nova-compute's merge
    # The keyring and the override holding a password: in a SOPS file a node's key opens.
    sops = parse_documents("secrets/kolla-config.yaml", list(yaml.safe_load_all(every["secrets/kolla-config.yaml"])))
    opened = unlock({"secrets/kolla-config.yaml": sops}, identities(str(identity), "node.key"))
    assert sorted(opened["secrets/kolla-config.yaml"].values()) == sorted([keyring, keystone_conf])
