"""The fleet guide, run as a reader runs it: docs/fleet-guide.md, block by block, in order.

Each block the page runs is marked by an HTML comment before its fence (invisible on the site):
``<!-- run: operator -->``, ``<!-- run: git-server -->``, ``<!-- run: node n1 n2 n3 -->`` (with
``exit N`` when the page says the block ends so), ``<!-- write: operator PATH -->`` for a file
the page shows. Each runs with ``bash -euo pipefail`` where it says:

- operator: this machine, in a workspace with its own HOME and this project's venv first on PATH
  (``reconciler``, ``sops``), in the directory the previous operator block ended in;
- git-server: gitolite's admin, on the same machine (the admin's ssh key given as GIT_SSH_COMMAND);
- node: ``docker exec`` as root in one of three Debian 12 containers with systemd as PID 1, whose
  host names are n1, n2, n3, all three at once.

The only substitutions are the reader's: the git server's address, port and unix user
(GIT_SERVER, GIT_PORT, GIT_USER, which the page asks the reader to set), and the copies the
page's prose asks for (the nodes' public keys to the operator; wheels, contrib/ and the trust root
to the nodes). The git server is a real gitolite (tests/gitolite_fixtures.py) whose sshd also
listens on the Docker bridge's gateway, the address the containers reach this machine at.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
from gitolite_fixtures import Gitolite
from needs import unavailable
from systemd_fixtures import BOOT_TIMEOUT, RUN_LABEL
from test_install import wheels  # noqa: F401  (the session's wheels, built by the install page's block)

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "fleet-guide.md"
NODES = ("n1", "n2", "n3")
NODE_DIR = "/root"  # root's home: where node blocks run and the operator copied wheels/, contrib/, allowed_signers
MARKED = re.compile(r"<!-- (run|write): ([^>]*?) -->\n```(\w*)\n(.*?)```", re.S)


@dataclass(frozen=True)
class Block:
    section: str  # the "## N. Title" it sits under, as "N"
    kind: str  # run | write
    place: str  # operator | git-server | node
    nodes: tuple[str, ...]
    path: str  # write: the file, relative to the operator's directory
    exit_code: int
    body: str


def guide_blocks() -> list[Block]:
    text = GUIDE.read_text()
    heads = [(m.start(), m[1]) for m in re.finditer(r"^## (\d+)\. ", text, re.M)]
    blocks = []
    for m in MARKED.finditer(text):
        section = [n for at, n in heads if at < m.start()][-1]
        words = m[2].split()
        kind, place = m[1], words[0]
        exit_code = int(words[words.index("exit") + 1]) if "exit" in words else 0
        blocks.append(Block(section, kind, place, tuple(w for w in words[1:] if w in NODES),
                            words[1] if kind == "write" else "", exit_code, m[4]))
    return blocks


def test_every_shell_block_of_the_guide_is_run() -> None:
    text = GUIDE.read_text()
    fences = re.findall(r"(?:<!-- (?:run|write): [^>]*-->\n)?```(\w*)\n", text)
    unmarked = len([f for f in fences if f == "sh"]) - len([b for b in guide_blocks() if b.kind == "run"])
    assert unmarked == 0, "a ```sh block of docs/fleet-guide.md has no <!-- run: ... --> marker"
    assert {b.place for b in guide_blocks()} == {"operator", "git-server", "node"}


def _gateway(client: docker.DockerClient) -> str:
    """The address containers on the default bridge reach this machine at: the one its IPAM
    config names, or (an engine that names only the subnet: Debian's docker.io 20.10.24 on a
    fresh machine) the subnet's first address, which the engine gives the bridge."""
    config = client.networks.get("bridge").attrs["IPAM"]["Config"][0]
    return str(config.get("Gateway") or next(ipaddress.ip_network(config["Subnet"]).hosts()))


@contextlib.contextmanager
def _bridge_sshd(server: Gitolite, tmp_path: Path, address: str) -> Iterator[None]:
    """gitolite's sshd, a second time, listening on ``address`` (the fixture's listens on 127.0.0.1)."""
    conf = (tmp_path / "gitolite" / "sshd_config").read_text()
    conf = conf.replace("ListenAddress 127.0.0.1", f"ListenAddress {address}")
    conf = re.sub(r"PidFile .*", f"PidFile {tmp_path / 'bridge-sshd.pid'}", conf)
    (tmp_path / "bridge_sshd_config").write_text(conf)
    proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(tmp_path / "bridge_sshd_config")],
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection((address, server.port), 0.5):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                unavailable("gitolite server", f"sshd on {address}:{server.port}: {proc.stderr.read() if proc.stderr else ''}")
            time.sleep(0.05)
        yield
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.contextmanager
def _three_nodes(client: docker.DockerClient, image: str, run_id: str) -> Iterator[dict[str, str]]:
    """Three booted systemd containers, host names n1 n2 n3: {node: container name}."""
    names = {n: f"reconciler-systemd-{run_id}-{n}-{secrets.token_hex(3)}" for n in NODES}
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        for node, name in names.items():
            client.containers.run(image, detach=True, name=name, hostname=node, labels={RUN_LABEL: run_id},
                                  cap_add=["SYS_ADMIN"], security_opt=["seccomp=unconfined"],
                                  tmpfs={"/run": "", "/run/lock": ""},
                                  volumes={"/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "ro"}})
        deadline = time.monotonic() + BOOT_TIMEOUT
        for name in names.values():
            while subprocess.run(["docker", "-H", host, "exec", name, "systemctl", "is-system-running"],
                                 capture_output=True, text=True).stdout.strip() not in ("running", "degraded"):
                if time.monotonic() > deadline:
                    unavailable("systemd container", f"{name} did not boot in {BOOT_TIMEOUT:.0f} s")
                time.sleep(0.1)
        yield names
    finally:
        for name in names.values():
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                client.containers.get(name).remove(force=True, v=True)


class Fleet:
    """Where the guide's blocks run, and the reader's copies between them."""

    def __init__(self, tmp_path: Path, server: Gitolite, gateway: str, containers: dict[str, str]) -> None:
        self.workspace = tmp_path / "operator"
        home = self.workspace / "home"
        home.mkdir(parents=True)
        self.cwd = self.workspace
        self.server = server
        self.containers = containers
        self.docker = ("docker", "-H", os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock")
        self.vars = {"GIT_SERVER": gateway, "GIT_PORT": str(server.port), "GIT_USER": server.user}
        self.env = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home),
                    "LANG": "C.UTF-8", "GIT_CONFIG_NOSYSTEM": "1", **self.vars}
        self.ran: list[Block] = []

    def operator(self, block: Block) -> None:
        env = dict(self.env)
        if block.place == "git-server":
            env.update(GIT_SSH_COMMAND=self.server.ssh_command(self.server.admin_key), GIT_AUTHOR_NAME="admin",
                       GIT_AUTHOR_EMAIL="admin@example.org", GIT_COMMITTER_NAME="admin",
                       GIT_COMMITTER_EMAIL="admin@example.org")
        if block.kind == "write":
            (self.cwd / block.path).write_text(block.body)
            return
        where = self.workspace / "where"
        script = f"{block.body}\npwd > {where}\n"
        try:
            proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=self.cwd, env=env,
                                  capture_output=True, text=True, timeout=150)
        except subprocess.TimeoutExpired as e:  # a --watch that never ends: what each node says
            out = e.stdout.decode()[-3000:] if isinstance(e.stdout, bytes) else ""
            raise AssertionError(f"{block.place} block of section {block.section} still running after "
                                 f"{e.timeout:g} s:\n{block.body}\n--- stdout\n{out}\n"
                                 + "\n".join(f"--- {n}\n{self.journal(n)}" for n in self.containers)) from None
        assert proc.returncode == block.exit_code, f"{block.place} block of section {block.section} exited " \
            f"{proc.returncode}:\n{block.body}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
        if block.place == "operator" and block.exit_code == 0:
            self.cwd = Path(where.read_text().strip())

    def node_sh(self, node: str, script: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        env = [a for k, v in self.vars.items() for a in ("-e", f"{k}={v}")]
        return subprocess.run([*self.docker, "exec", "-w", NODE_DIR, *env, self.containers[node],
                               "bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True,
                              timeout=timeout)

    def nodes(self, block: Block) -> None:
        with ThreadPoolExecutor(len(block.nodes)) as pool:
            procs = dict(zip(block.nodes, pool.map(lambda n: self.node_sh(n, block.body), block.nodes), strict=True))
        for node, proc in procs.items():
            assert proc.returncode == block.exit_code, (
                f"node {node}, block of section {block.section} exited {proc.returncode}:\n{block.body}\n"
                f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}\n{self.journal(node)}")

    def journal(self, node: str) -> str:
        return self.node_sh(node, "journalctl -u reconciler-agent --no-pager | tail -30 || true").stdout

    def section(self, number: str) -> None:
        """Every block of section ``number``, in order."""
        for block in guide_blocks():
            if block.section == number:
                self.nodes(block) if block.place == "node" else self.operator(block)
                self.ran.append(block)

    # The copies the page's prose asks of the reader.
    def copy_public_keys(self) -> None:
        for node, name in self.containers.items():
            for src, dst in (("id_ed25519.pub", f"{node}.id_ed25519.pub"), ("age.pub", f"{node}.age.pub")):
                subprocess.run([*self.docker, "cp", f"{name}:/etc/reconciler/{src}", str(self.workspace / dst)],
                               check=True, capture_output=True)

    def copy_to_nodes(self, wheel_dir: Path) -> None:
        for name in self.containers.values():
            for src, dst in ((wheel_dir, "wheels"), (ROOT / "contrib", "contrib"),
                             (self.cwd / "trust" / "allowed_signers", "allowed_signers")):
                subprocess.run([*self.docker, "cp", str(src), f"{name}:{NODE_DIR}/{dst}"], check=True,
                               capture_output=True)

    # What the page promises, read where it lands: the nodes' notes on the git server, the pages.
    def notes(self, rev: str = "HEAD") -> dict[str, dict[str, Any]]:
        bare = self.server.bare_path("cloud")
        commit = subprocess.run(["git", "-C", str(self.cwd), "rev-parse", rev], check=True, capture_output=True,
                                text=True).stdout.strip()
        found = {}
        for node in NODES:
            proc = subprocess.run(["git", "--git-dir", str(bare), "notes", f"--ref=reconciler/{node}", "show",
                                   commit], capture_output=True, text=True)
            found[node] = json.loads(proc.stdout) if proc.returncode == 0 else {}
        return found

    def page(self, node: str) -> str:
        return self.node_sh(node, "python3 -c 'import urllib.request; "
                                  "print(urllib.request.urlopen(\"http://127.0.0.1:8080/\").read().decode())'").stdout


def test_the_fleet_guide_takes_three_nodes_from_nothing_to_a_reverted_canary(
    docker_engine: docker.DockerClient, systemd_image: str, docker_run_id: str, gitolite: Gitolite,
    wheels: Path, tmp_path: Path,  # noqa: F811
) -> None:
    gateway = _gateway(docker_engine)
    with _bridge_sshd(gitolite, tmp_path, gateway), \
            _three_nodes(docker_engine, systemd_image, docker_run_id) as containers:
        fleet = Fleet(tmp_path, gitolite, gateway, containers)

        fleet.section("2")  # the keys: the merge key here, each node's on the node
        fleet.copy_public_keys()
        fleet.section("3")  # gitolite: the merge key writes main, each node its own notes
        fleet.section("4")  # the repo, its nodes, an encrypted secret, pushed signed
        assert fleet.cwd.name == "cloud"
        fleet.copy_to_nodes(wheels)
        fleet.section("6")  # install, settings, check, start
        fleet.section("7")  # the first rollout: --watch returned 0
        notes = fleet.notes()
        assert {n: notes[n].get("state") for n in NODES} == dict.fromkeys(NODES, "applied"), notes
        for node in NODES:
            assert fleet.page(node).strip() == f"<h1>{node} runs release 1</h1>"

        fleet.section("8")  # a canary that fails: --watch returned 1
        notes = fleet.notes()
        assert notes["n1"].get("state") == "failed", notes["n1"]
        for node in ("n2", "n3"):
            assert notes[node].get("state") == "halted", notes[node]
            assert "n1" in json.dumps(notes[node]) and "web" in json.dumps(notes[node]), notes[node]
        for node in NODES:  # n1 put the previous version back; the others never left it
            assert fleet.page(node).strip() == f"<h1>{node} runs release 1</h1>"

        fleet.section("9")  # the revert: --watch returned 0
        notes = fleet.notes()
        assert {n: notes[n].get("state") for n in NODES} == dict.fromkeys(NODES, "applied"), notes

        assert len(fleet.ran) == len(guide_blocks()), "a marked block sits outside sections 2-9"
