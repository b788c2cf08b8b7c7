"""A kolla-ansible all-in-one, imported by `reconciler import kolla-ansible`, converges on the
docker driver with stand-in images (tests/kolla_standin/: kolla's container contract for real,
`kolla_start` copying config.json's files where kolla's set_configs puts them, kolla's health
scripts checking for real; nothing can be pulled here).

The machine is a controller as a user would make it of kolla's all-in-one inventory: its host
left out of [network] and [compute] (Open vSwitch, libvirt and the Neutron agents need kernel
modules, /dev/kvm and privileged host mounts), `network_interface: lo` so every service listens on
127.0.0.1, haproxy, keepalived and proxysql off (one node, no VIP: keepalived needs NET_ADMIN, and
proxysql would listen on the database's own address and port), fluentd off (it needs the host's
log directories, and the inputs kolla's find_custom_fluentd_inputs task finds there).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import secrets
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from conftest import Deployment, SigningKey, git, nodes_file, note_key
from test_import_kolla import SHARE, _deployment, _import, kolla_wheel  # noqa: F401

STANDIN = Path(__file__).parent / "kolla_standin" / "standin.py"
STANDIN_IMAGE = "reconciler-test/kolla-standin"

CONTROLLER_GLOBALS = """\
---
kolla_base_distro: "rocky"
network_interface: "lo"
kolla_internal_vip_address: "127.0.0.1"
neutron_external_interface: "lo"
enable_haproxy: "no"
enable_proxysql: "no"
enable_fluentd: "no"
"""


def reconciler(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reconciler", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def controller(wheel: Path, where: Path, node: str, recipient: str | None = None, stand_ins: bool = False) -> Path:
    """kolla's all-in-one made a controller named ``node`` (see the module's doc), imported into
    ``where/repo``; ``stand_ins``: the node's address and facts given on its inventory line, as a
    review without the node's published facts needs them. Returns the repo."""
    dep = where / "kolla"
    where.mkdir(parents=True, exist_ok=True)
    _deployment(wheel, dep, "all-in-one")
    lines, section = [], ""
    for line in (dep / "all-in-one").read_text().splitlines():
        section = line if line.startswith("[") else section
        if line.startswith("localhost"):
            if section in ("[network]", "[compute]"):
                continue
            line = line.replace("localhost", node, 1)
            if stand_ins:
                line += (f" lo_address=127.0.0.1 ansible_facts=\"{{'processor_vcpus': 2, 'hostname': '{node}', "
                         f"'nodename': '{node}', 'architecture': 'x86_64', 'memtotal_mb': 4096}}\"")
        lines.append(line)
    (dep / "all-in-one").write_text("\n".join(lines) + "\n")
    (dep / "globals.yml").write_text(CONTROLLER_GLOBALS)
    code, said = _import(wheel, dep, where / "repo", [node], key=recipient)
    assert code == 0, said
    return where / "repo"


def with_stand_ins(repo: Path, where: Path, node: str) -> Path:
    """A copy of the imported ``repo`` with the node's address and facts stand-ins (as
    ``controller(stand_ins=True)`` gives them), for a review before the node published its facts."""
    shutil.copytree(repo, where)
    inventory = where / "inventory.yaml"
    text, n = re.subn(r"(\n      age_recipient: \S+\n)", r"\1      lo_address: 127.0.0.1\n      ansible_facts: "
                      f"{{processor_vcpus: 2, hostname: {node}, nodename: {node}, architecture: x86_64, "
                      "memtotal_mb: 4096}\n", inventory.read_text())
    assert n == 1
    inventory.write_text(text)
    return where


def rendered(repo: Path, node: str, out: Path) -> dict[str, dict[str, Any]]:
    """`reconciler render --node` of the repo's work tree: each service's runtime spec."""
    if not (repo / ".git").is_dir():
        subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "import"], cwd=repo,
                   check=True)
    done = reconciler("render", "--node", node, "--repo", str(repo), "--out", str(out))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return {d.name: json.loads((d / "service.json").read_text()) for d in sorted((out / node).iterdir())}


def test_every_service_of_an_imported_controller_renders_with_its_kolla_config_json(
        kolla_wheel: Path, tmp_path: Path) -> None:  # noqa: F811
    """Each container kolla runs on the controller gets the config.json kolla's tasks write
    (memcached's loops over a list, rabbitmq's and mariadb's name the dir by the role's
    project_name or a task's variable), and every file that config.json names as a source
    (keystone-fernet's crontab and scripts come from one task looping over a list)."""
    repo = controller(kolla_wheel, tmp_path, "ctl", stand_ins=True)
    specs = rendered(repo, "ctl", tmp_path / "out")
    assert {"keystone", "keystone-fernet", "mariadb", "memcached", "rabbitmq", "horizon", "nova-api",
            "neutron-server", "glance-api"} <= set(specs)
    assert not {"nova-compute", "nova-libvirt", "openvswitch-vswitchd", "neutron-l3-agent"} & set(specs)
    # keystone-fernet's crontab: what kolla's own generator (run by a task at deploy time) says
    # for one keystone host and kolla's default rotation interval (expiry 1 day + 2 days window).
    with zipfile.ZipFile(kolla_wheel) as whl:
        generator = whl.read(f"{SHARE}/ansible/roles/keystone/files/fernet_rotate_cron_generator.py")
    (tmp_path / "generator.py").write_bytes(generator)
    jobs = json.loads(subprocess.run([sys.executable, str(tmp_path / "generator.py"), "-t", "4320", "-i", "0", "-n", "1"],
                                     capture_output=True, text=True, check=True).stdout)["cron_jobs"]
    crontab = (tmp_path / "out" / "ctl" / "keystone-fernet" / "crontab").read_text()
    assert [line.split()[:5] for line in crontab.splitlines() if line.endswith("fernet-rotate.sh")] == \
        [[str(j["min"]), str(j["hour"]), "*", "*", str(j["day"])] for j in jobs]
    for name in specs:
        config = json.loads((tmp_path / "out" / "ctl" / name / "config.json").read_text())
        have = {p.name for p in (tmp_path / "out" / "ctl" / name).iterdir()}
        for entry in config.get("config_files", []):
            source = Path(entry["source"])
            if not entry.get("optional") and "*" not in source.name and str(source.parent) == \
                    "/var/lib/kolla/config_files":
                assert source.name in have, (name, entry)


def rendered_files(out: Path, node: str) -> dict[str, dict[str, bytes]]:
    return {d.name: {f.name: f.read_bytes() for f in d.iterdir() if f.name != "service.json"}
            for d in (out / node).iterdir()}


def build_standin(client: docker.DockerClient, base: str, owners: set[str], names: set[str]) -> list[str]:
    """The stand-in image, FROM the local python image (nothing to pull), with the users and
    groups the config.json files name (``owners``: ``user[:group]``), tagged as each image the services render to. Returns the tags made."""
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data, mode in (
            ("Dockerfile", (f"FROM {base}\nCOPY kolla_standin.py kolla_standin_health.py /usr/local/lib/\n"
                            f"RUN [\"python3\", \"/usr/local/lib/kolla_standin.py\", \"install\", "
                            + ", ".join(json.dumps(u) for u in sorted(owners)) + "]\n"
                            "CMD [\"kolla_start\"]\n").encode(), 0o644),
            ("kolla_standin.py", STANDIN.read_bytes(), 0o755),
            ("kolla_standin_health.py", (STANDIN.parent / "kolla_standin_health.py").read_bytes(), 0o644),
        ):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    image, _ = client.images.build(fileobj=context, custom_context=True, tag=f"{STANDIN_IMAGE}:latest", rm=True,
                                   forcerm=True, pull=False)
    for name in names:
        repo, _, tag = name.rpartition(":")
        image.tag(repo, tag)
    return sorted(names)


@pytest.fixture
def kolla_node(docker_engine: docker.DockerClient, docker_cleanup: dict[str, str]) -> Iterator[str]:
    """A test node's name; at the end its containers go (docker_cleanup: t-...), then the named
    volumes kolla's services mount (kolla_logs, mariadb...), then the stand-in's kolla tags."""
    node = f"t-kolla{secrets.token_hex(2)}"
    yield node
    tags: list[str] = []
    volumes: set[str] = set()
    for c in docker_engine.containers.list(all=True, filters={"label": f"reconciler.node={node}"}):
        volumes |= {m["Name"] for m in c.attrs.get("Mounts", []) if m.get("Type") == "volume"}
        c.remove(force=True, v=True)
    for name in volumes:
        with contextlib.suppress(docker.errors.APIError):
            docker_engine.volumes.get(name).remove(force=True)
    for image in docker_engine.images.list(name=STANDIN_IMAGE):
        tags += [t for t in image.tags if not t.startswith(STANDIN_IMAGE)]
    for tag in tags:
        with contextlib.suppress(docker.errors.APIError):
            docker_engine.images.remove(tag, noprune=True)


def agent_once(node: str, dep: Deployment, state: Path, merge_key: SigningKey, identity: Path,
               config: Path) -> subprocess.CompletedProcess[str]:
    """`reconciler agent --once` as a node runs it: its settings file, trust root, age identity
    and notes key."""
    return reconciler("agent", "--once", "--config", str(config), "--node", node, "--remote", dep.url,
                      "--state-dir", str(state), "--allowed-signers", str(merge_key.allowed_signers),
                      "--age-identity", str(identity), "--note-key", str(note_key(node)))


def said_by(client: docker.DockerClient, node: str) -> str:
    """The last lines of each of the node's containers that is not running and healthy."""
    out = []
    for c in client.containers.list(all=True, filters={"label": f"reconciler.node={node}"}):
        if c.status != "running" or (c.attrs["State"].get("Health") or {}).get("Status") != "healthy":
            out.append(f"--- {c.name} ({c.status}): {c.logs(tail=15).decode(errors='replace')}")
    return "\n".join(out)


def started(client: docker.DockerClient, node: str) -> dict[str, tuple[str, str]]:
    """service -> (container id, start time) of the node's containers."""
    found = client.containers.list(all=True, filters={"label": f"reconciler.node={node}"})
    return {c.labels["reconciler.service"]: (c.id, c.attrs["State"]["StartedAt"]) for c in found}


def test_an_imported_all_in_one_converges_on_stand_in_images_and_a_globals_change_restarts_what_it_changes(
        kolla_wheel: Path, tmp_path: Path, kolla_node: str, docker_engine: docker.DockerClient,  # noqa: F811
        python_image: str, merge_key: SigningKey, docker_cleanup: dict[str, str]) -> None:
    import pyrage

    clock = time.monotonic()
    node = kolla_node
    identity = pyrage.x25519.Identity.generate()
    key = tmp_path / "age.key"
    key.write_text(f"{identity}\n")
    key.chmod(0o600)
    repo = controller(kolla_wheel, tmp_path / "node", node, recipient=str(identity.to_public()))
    # What review sees (the node has published no facts yet: the inventory's stand-ins), before
    # and after the change: the images to stand in for, and which services' files change.
    review = with_stand_ins(repo, tmp_path / "review", node)
    specs = rendered(review, node, tmp_path / "before")
    before = rendered_files(tmp_path / "before", node)
    region = "openstack_region_name: RegionOne"
    inventory = review / "inventory.yaml"
    inventory.write_text(inventory.read_text().replace(region, "openstack_region_name: RegionTwo"))
    rendered(review, node, tmp_path / "after")
    after = rendered_files(tmp_path / "after", node)
    changed = {s for s in before if before[s] != after[s]}
    assert changed and changed != set(before), changed  # some services change, some do not
    owners: set[str] = set()
    for s in specs:
        config = json.loads(before[s]["config.json"])
        owners |= {e["owner"] for e in [*config.get("config_files", []),
                                                          *config.get("permissions", [])] if "owner" in e}
    build_standin(docker_engine, python_image, owners, {str(spec["runtime"]["image"]) for spec in specs.values()})
    prepared = time.monotonic()

    # The imported repo as the deployment: a git repo, the node's notes key listed, signed.
    bare = tmp_path / "cloud.git"
    git("init", "-q", "--bare", "-b", "main", str(bare))
    git("init", "-q", "-b", "main", cwd=repo)
    dep = Deployment(repo, bare, merge_key)
    dep.write("trust/nodes", nodes_file(node))
    first = dep.commit("imported from kolla-ansible")
    # kolla's keystone bootstrap, which the import does not carry over: the fernet keys.
    keystone_fernet = str(specs["keystone-fernet"]["runtime"]["image"])
    docker_engine.containers.run(keystone_fernet, ["kolla_keystone_bootstrap", "keystone", "keystone"], remove=True,
                                 labels=docker_cleanup, volumes={"keystone_fernet_tokens": {
                                     "bind": "/etc/keystone/fernet-keys", "mode": "rw"}})
    state = tmp_path / "state"
    config = tmp_path / "agent.yaml"
    config.write_text("max_parallel: 32\n")  # every kolla container at once: their health holds overlap

    done = agent_once(node, dep, state, merge_key, key, config)
    converged = time.monotonic()

    assert done.returncode == 0, done.stderr[-3000:] + said_by(docker_engine, node)
    assert (dep.note(node, first) or {}).get("state") == "applied"
    containers = {c.labels["reconciler.service"]: c for c in
                  docker_engine.containers.list(all=True, filters={"label": f"reconciler.node={node}"})}
    assert set(containers) == set(specs)
    for name, c in containers.items():
        assert c.status == "running", name
        if specs[name]["runtime"].get("healthcheck"):  # kolla's own check, run by the engine
            assert c.attrs["State"]["Health"]["Status"] == "healthy", (name, c.attrs["State"]["Health"])
    unchecked = {name for name in specs if not specs[name]["runtime"].get("healthcheck")}
    assert unchecked == {"cron", "kolla-toolbox"}  # kolla gives these two no healthcheck
    # keystone.conf as rendered, copied by kolla_start to kolla's dest, owned as config.json says.
    live = (state / "docker" / "keystone" / "live" / "keystone.conf").read_bytes()
    assert b"[database]" in live
    inside = containers["keystone"].exec_run(["cat", "/etc/keystone/keystone.conf"])
    assert inside.exit_code == 0 and inside.output == live
    owner = containers["keystone"].exec_run(["stat", "-c", "%U %a", "/etc/keystone/keystone.conf"])
    assert owner.output.decode().split() == ["keystone", "600"]

    was = started(docker_engine, node)
    dep.edit("inventory.yaml", region, "openstack_region_name: RegionTwo")
    second = dep.commit("globals.yml: openstack_region_name RegionTwo")
    again = agent_once(node, dep, state, merge_key, key, config)
    finished = time.monotonic()

    assert again.returncode == 0, again.stderr[-3000:] + said_by(docker_engine, node)
    now = started(docker_engine, node)
    assert {s for s in now if now[s][0] == was[s][0] and now[s][1] != was[s][1]} == changed  # restarted in place
    assert {s for s in now if now[s] == was[s]} == set(specs) - changed
    note = dep.note(node, second) or {}
    assert note.get("state") == "applied", note
    noted: dict[str, dict[str, str]] = note["services"]  # type: ignore[assignment]
    assert {s for s, what in noted.items() if what["action"] == "restart"} == changed
    assert {s for s, what in noted.items() if what["action"] == "none"} == set(specs) - changed
    print(f"kolla converge: {len(specs)} services, prepare {prepared - clock:.1f}s, first apply "
          f"{converged - prepared:.1f}s, change ({len(changed)} restarted) {finished - converged:.1f}s")
