"""Shared fixtures: real git repos and remotes, real processes, one state dir per node.

A ``Deployment`` is the operator's side: a work tree copied from examples/repo (ports moved to
a free range so tests never collide with a running demo), committed and pushed to a bare repo.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from ports import free_port as free_port  # re-exported: tests import it from here
from ports import wait_listening

from reconciler.agent import Agent
from reconciler.settings import AgentConfig, SecretsConfig, TrustConfig

pytest_plugins = ["leftovers", "docker_fixtures", "systemd_fixtures", "gitolite_fixtures", "registry_fixtures"]

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "repo"
# The example's age identities (DEMO ONLY, committed): examples/repo/secrets/ is encrypted to them.
DEMO_KEYS = ROOT / "examples" / "demo-keys"
NODES = ("cmp1", "cmp2", "ctl1", "ctl2", "ctl3")
GIT_ENV = {
    "GIT_AUTHOR_NAME": "Operator", "GIT_AUTHOR_EMAIL": "op@example.org",
    "GIT_COMMITTER_NAME": "Merge Bot", "GIT_COMMITTER_EMAIL": "merge@example.org",
    "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1",
}
# The user's cache (fleet.known: the notes `status --fleet --repo` verified before) is this test
# process's own, never the developer's ~/.cache; the commands the tests start inherit it.
os.environ["XDG_CACHE_HOME"] = _CACHE = tempfile.mkdtemp(prefix="reconciler-test-cache-")
atexit.register(shutil.rmtree, _CACHE, True)


# What shares the one Docker engine: its test nodes (t-...) and a cleanup that removes any run's.
ENGINE_FIXTURES = {"docker_engine", "systemd_host"}


def pytest_itemcollected(item: pytest.Item) -> None:
    """Under xdist (``-n 2 --dist loadgroup``), every test that touches the Docker engine runs in
    the same worker, one after the other; the rest are spread over both. (Marked as each test is
    collected: xdist reads the groups in its own pytest_collection_modifyitems.)"""
    if set(getattr(item, "fixturenames", ())) & ENGINE_FIXTURES:
        item.add_marker(pytest.mark.xdist_group("engine"))


def git(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env={**os.environ, **GIT_ENV}
    ).stdout.strip()


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_port_bases(count: int) -> list[int]:
    """Port ranges of 100 whose service ports (base + 0..99 used ones) are all free."""
    offsets = (0, 5, 6, 10, 90)
    # Below the kernel's ephemeral range (32768-60999 here), where git daemons, sshd and clients
    # get their ports, and a share of it per xdist worker, so two workers never pick the same.
    low, high = 20000, 32700
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    span = (high - low) // workers // 100 * 100
    low = low + worker * span
    high = low + span
    bases: list[int] = []
    base = low + (os.getpid() % max(1, span // 100)) * 100
    for _ in range(span // 100):
        if len(bases) == count:
            break
        if all(_port_free(base + o) for o in offsets):
            bases.append(base)
        base += 100
        if base >= high:
            base = low
    assert len(bases) == count, f"no {count} free port ranges in {low}-{high}"
    return bases


def wait_for(predicate: Callable[[], bool], timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@dataclass(frozen=True)
class SigningKey:
    """A throwaway SSH signing key, made at run time, and an allowed-signers file naming it."""

    key: Path
    principal: str
    allowed_signers: Path

    @property
    def public(self) -> str:
        return (self.key.parent / (self.key.name + ".pub")).read_text().strip()

    @property
    def fingerprint(self) -> str:
        out = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(self.key)], capture_output=True,
                             text=True, check=True).stdout
        return out.split()[1]


def make_key(directory: Path, name: str, principal: str = "merge@example.org", kind: str = "ed25519",
             options: str = 'namespaces="git"') -> SigningKey:
    directory.mkdir(parents=True, exist_ok=True)
    key = directory / name
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", name, "-f", str(key)], check=True)
    allowed = directory / f"{name}.allowed_signers"
    pub = (directory / f"{name}.pub").read_text().strip()
    allowed.write_text(f"{principal} {options} {pub}\n")
    return SigningKey(key, principal, allowed)


@pytest.fixture(scope="session")
def merge_key(tmp_path_factory: pytest.TempPathFactory) -> SigningKey:
    """The review system's merge key: the node's trust root in most tests."""
    return make_key(tmp_path_factory.mktemp("keys"), "merge")


@dataclass
class Deployment:
    """The operator's work tree and the bare remote every node pulls from.
    Commits are signed with ``key`` (the merge bot's), or left unsigned when it is None."""

    work: Path
    bare: Path
    key: SigningKey | None
    port_bases: dict[str, int] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"file://{self.bare}"

    def write(self, rel: str, text: str) -> None:
        p = self.work / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)

    def read(self, rel: str) -> str:
        return (self.work / rel).read_text()

    def edit(self, rel: str, old: str, new: str) -> None:
        text = self.read(rel)
        assert old in text, f"{old!r} not in {rel}"
        self.write(rel, text.replace(old, new, 1))

    def commit(self, message: str, key: SigningKey | None | bool = True, push: bool = True) -> str:
        """Commit everything, signed with ``key`` (True: the deployment's key; None: unsigned)."""
        signer = self.key if key is True else key or None
        git("add", "-A", cwd=self.work)
        sign = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={signer.key}", "commit", "-S"] if signer else ["commit"]
        git(*sign, "-q", "--allow-empty", "-m", message, cwd=self.work)
        if push:
            self.push()
        return git("rev-parse", "HEAD", cwd=self.work)

    def push(self, rev: str = "HEAD", force: bool = False) -> None:
        git("push", "-q", *(["--force"] if force else []), self.url, f"{rev}:refs/heads/main", cwd=self.work)

    def note(self, node: str, commit: str | None = None) -> dict[str, object] | None:
        import json

        try:
            text = git("--git-dir", str(self.bare), "notes", f"--ref=reconciler/{node}", "show",
                       commit or "refs/heads/main")
        except subprocess.CalledProcessError:
            return None
        data: dict[str, object] = json.loads(text)
        return data


def small_deployment(tmp_path: Path, key: SigningKey, files: dict[str, str], message: str = "initial",
                     cls: type[Deployment] = Deployment) -> Deployment:
    """A deployment made of ``files`` (repo path -> text), committed, signed and pushed; with
    its nodes' notes keys in ``trust/nodes`` unless ``files`` has one."""
    work = tmp_path / "work"
    files = {**_nodes_of(files.get("inventory.yaml")), **files}
    for rel, text in files.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    bare = tmp_path / "cloud.git"
    git("init", "-q", "--bare", "-b", "main", str(bare))
    git("init", "-q", "-b", "main", cwd=work)
    dep = cls(work, bare, key)
    dep.commit(message)
    return dep


def _nodes_of(inventory: str | None) -> dict[str, str]:
    """``trust/nodes`` for the nodes an inventory names (none for one that does not parse: a
    test of bad input)."""
    try:
        nodes = (yaml.safe_load(inventory or "") or {}).get("nodes") or {}
    except (yaml.YAMLError, AttributeError):
        return {}
    return {"trust/nodes": nodes_file(*sorted(map(str, nodes)))} if isinstance(nodes, dict) and nodes else {}


@pytest.fixture
def deployment(tmp_path: Path, merge_key: SigningKey) -> Deployment:
    work = tmp_path / "work"
    shutil.copytree(EXAMPLE, work)
    inv_path = work / "inventory.yaml"
    inv = yaml.safe_load(inv_path.read_text())
    bases = dict(zip(sorted(inv["nodes"]), free_port_bases(len(inv["nodes"])), strict=True))
    text = inv_path.read_text()
    for node, old in ((n, inv["nodes"][n]["vars"]["port_base"]) for n in inv["nodes"]):
        text = text.replace(f"port_base: {old}", f"port_base: {bases[node]}")
    inv_path.write_text(text)
    bare = tmp_path / "cloud.git"
    git("init", "-q", "--bare", "-b", "main", str(bare))
    git("init", "-q", "-b", "main", cwd=work)
    dep = Deployment(work, bare, merge_key, bases)
    # Each node's notes key, as an operator lists them (``reconciler note-key``): the rollout
    # tests' notes count only when signed by these.
    dep.write("trust/nodes", nodes_file(*sorted(inv["nodes"])))
    dep.commit("initial deployment")
    return dep


_DEMO_KEY_COPIES: list[Path] = []


def demo_secrets(node: str) -> SecretsConfig:
    """The agent setting that gives ``node`` its demo age key, when the example has one for it:
    a copy of mode 0600, as on a node (a checkout leaves the committed one 0644, which the agent
    refuses as ssh refuses such a key)."""
    key = DEMO_KEYS / f"{node}.key"
    if not key.is_file():
        return SecretsConfig(None)
    if not _DEMO_KEY_COPIES:
        _DEMO_KEY_COPIES.append(Path(tempfile.mkdtemp(prefix="reconciler-demo-keys-")))
        atexit.register(shutil.rmtree, _DEMO_KEY_COPIES[0], True)
    copy = _DEMO_KEY_COPIES[0] / key.name
    if not copy.exists():
        copy.write_bytes(key.read_bytes())
        copy.chmod(0o600)
    return SecretsConfig(copy)


def age_args(agent: Agent) -> list[str]:
    """The CLI flags that give a node command the agent's own keys: its age identity (if any)
    and the key it signs its notes with."""
    key = agent.cfg.secrets.age_identity
    note = ["--note-key", str(agent.cfg.note_key)] if agent.cfg.note_key else []
    return (["--age-identity", str(key)] if key else []) + note


_NOTE_KEYS: list[Path] = []


def note_key(node: str) -> Path:
    """The key ``node`` signs its notes with in the tests (made once per test session)."""
    from reconciler.trust.notesig import NoteKey

    if not _NOTE_KEYS:
        _NOTE_KEYS.append(Path(tempfile.mkdtemp(prefix="reconciler-note-keys-")))
        atexit.register(shutil.rmtree, _NOTE_KEYS[0], True)
    path = _NOTE_KEYS[0] / node
    NoteKey.load_or_create(path)
    return path


def nodes_file(*nodes: str) -> str:
    """A repo's ``trust/nodes`` naming the test key of each node."""
    from reconciler.trust.notesig import NoteKey, public_line

    return "".join(public_line(n, NoteKey.load(note_key(n))) + "\n" for n in nodes)


@pytest.fixture
def agents(tmp_path: Path, merge_key: SigningKey) -> Iterator[Callable[..., Agent]]:
    """Make a node's agent (trusting the merge key unless told otherwise, and holding the
    example's age identity for its name, as the demo's nodes do); every service any of them
    started is stopped at teardown."""
    made: list[Agent] = []

    def make(node: str, remote: str, trust: TrustConfig | None = None, clock: Any = None, **kw: Any) -> Agent:
        trust = trust or TrustConfig(allowed_signers=merge_key.allowed_signers)
        kw.setdefault("state_dir", tmp_path / "nodes" / node)
        kw.setdefault("secrets", demo_secrets(node))
        kw.setdefault("note_key", note_key(node))
        cfg = AgentConfig(node=node, remote=remote, trust=trust, **kw)
        agent = Agent(cfg, progress=False, **({"clock": clock} if clock else {}))
        made.append(agent)
        return agent

    yield make
    from reconciler.node.context import drivers_for

    for agent in made:
        with contextlib.suppress(Exception):
            for driver in drivers_for(agent.cfg, None).values():
                for o in driver.observe():
                    with contextlib.suppress(Exception):
                        driver.remove(o.name)
        agent.close()


@pytest.fixture
def git_daemon(tmp_path: Path, deployment: Deployment) -> Iterator[str]:
    """A real `git daemon` on a loopback port serving the deployment's bare repo (push enabled)."""
    port = free_port()
    proc = subprocess.Popen(
        ["git", "daemon", "--reuseaddr", f"--base-path={deployment.bare.parent}", "--export-all",
         "--enable=receive-pack", f"--port={port}", "--listen=127.0.0.1", str(deployment.bare.parent)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(port, "git daemon", proc)
        yield f"git://127.0.0.1:{port}/{deployment.bare.name}"
    finally:
        proc.terminate()
        proc.wait(10)


def _http_backend(root: Path):  # type: ignore[no-untyped-def]
    """A WSGI app that runs the real `git http-backend` (smart HTTP, fetch and push) per request."""

    def app(environ, start_response):  # type: ignore[no-untyped-def]
        env = {
            **os.environ, "GIT_PROJECT_ROOT": str(root), "GIT_HTTP_EXPORT_ALL": "1",
            "REQUEST_METHOD": environ["REQUEST_METHOD"], "PATH_INFO": environ["PATH_INFO"],
            "QUERY_STRING": environ.get("QUERY_STRING", ""), "CONTENT_TYPE": environ.get("CONTENT_TYPE", ""),
            "REMOTE_USER": "node", "REMOTE_ADDR": "127.0.0.1",
            "GIT_PROTOCOL": environ.get("HTTP_GIT_PROTOCOL", ""),
            "HTTP_CONTENT_ENCODING": environ.get("HTTP_CONTENT_ENCODING", ""),
        }
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True).stdout
        head, _, rest = out.partition(b"\r\n\r\n")
        headers = [tuple(h.split(": ", 1)) for h in head.decode().split("\r\n") if ": " in h]
        status = next((v for k, v in headers if k.lower() == "status"), "200 OK")
        start_response(status, [(k, v) for k, v in headers if k.lower() != "status"])
        return [rest]

    return app


@pytest.fixture
def http_remote(deployment: Deployment) -> Iterator[str]:
    """The deployment's bare repo over smart HTTP on a loopback port."""
    import socketserver
    import threading
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    class Threaded(socketserver.ThreadingMixIn, WSGIServer):
        daemon_threads = True

    server = make_server("127.0.0.1", 0, _http_backend(deployment.bare.parent), Threaded, Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/{deployment.bare.name}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def ssh_remote(tmp_path: Path, deployment: Deployment) -> Iterator[tuple[str, str]]:
    """A real sshd on a loopback port, serving the deployment's bare repo to a throwaway key.
    Yields (URL, GIT_SSH_COMMAND). Fails (not skips) under CI when sshd cannot start."""
    sshd = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)
    if sshd is None:
        if os.environ.get("CI"):
            pytest.fail("sshd is not installed (.ci/run installs openssh-server)")
        pytest.skip("sshd is not installed; ./test.sh installs openssh-server when run as root")
    d = tmp_path / "sshd"
    d.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key")], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "client_key")], check=True)
    (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
    port = free_port()
    user = os.environ.get("USER") or subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_key'}\nPidFile {d / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nUsePAM no\nStrictModes no\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nLogLevel ERROR\n"
    )
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(d / "sshd_config")], stderr=subprocess.PIPE, text=True)
    try:
        wait_listening(port, "sshd", proc)
        command = (f"ssh -i {d / 'client_key'} -p {port} -o StrictHostKeyChecking=no "
                   "-o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR")
        yield f"ssh://{user}@127.0.0.1:{port}{deployment.bare}", command
    finally:
        proc.terminate()
        proc.wait(10)
