"""Read mirrors, a write primary and bundles: the agent polls the first read remote that
answers, pushes its notes to the primary, stays put on a mirror that lags, refuses one that
rewrote history, and converges on a site with no network from a bundle file.

Real git servers: the primary and a mirror, each behind its own `git daemon`; the mirror is
replicated from the primary by the test (as Gerrit replication or a cron'd `git fetch` would).

History::

    C0 initial --- C1 identity: four workers --- C2 identity: eight workers
                                              \\
                                               X  (the mirror's rewritten history: refused)
"""

from __future__ import annotations

import base64
import os
import shutil
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import ROOT, Deployment, SigningKey, git, wait_for
from needs import unavailable
from nginx import Nginx
from ports import free_port, wait_listening
from test_cli import as_json, cli

from reconciler.agent import Agent
from reconciler.settings import RemoteConfig

WORKERS = "port = {{ port_base + ports.identity }}"


class Daemon:
    """A `git daemon` serving the repos under ``base``; stopped and started again at will."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, name: str) -> str:
        return f"git://127.0.0.1:{self.port}/{name}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["git", "daemon", "--reuseaddr", f"--base-path={self.base}", "--export-all", "--enable=receive-pack",
             f"--port={self.port}", "--listen=127.0.0.1", str(self.base)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_listening(self.port, "git daemon", self.proc)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


@pytest.fixture
def servers(tmp_path: Path, deployment: Deployment) -> Iterator[tuple[Daemon, Daemon, Path]]:
    """The primary (the deployment's bare repo) and a mirror of it, each behind a git daemon."""
    mirror = tmp_path / "mirror" / "cloud.git"
    git("init", "-q", "--bare", "-b", "main", str(mirror))
    primary, second = Daemon(deployment.bare.parent), Daemon(mirror.parent)
    primary.start()
    second.start()
    try:
        yield primary, second, mirror
    finally:
        primary.stop()
        second.stop()


def replicate(deployment: Deployment, mirror: Path) -> None:
    git("--git-dir", str(mirror), "fetch", "-q", "--prune", str(deployment.bare), "+refs/heads/*:refs/heads/*",
        "+refs/notes/*:refs/notes/*")


def identity_workers(deployment: Deployment, n: int, push: bool = True) -> str:
    text = deployment.read("services/identity/templates/identity.conf.j2")
    text = "\n".join(line for line in text.splitlines() if not line.startswith("workers ="))
    deployment.write("services/identity/templates/identity.conf.j2", text.replace(WORKERS, f"{WORKERS}\nworkers = {n}"))
    return deployment.commit(f"identity: {n} workers", push=push)


def live(agent: Agent) -> str:
    return (agent.cfg.state_dir / "services" / "identity" / "live" / "identity.conf").read_text()


def test_polls_go_to_the_mirror_fail_over_to_the_primary_and_notes_go_to_the_primary(
    deployment: Deployment, agents: Callable[..., Agent], servers: tuple[Daemon, Daemon, Path]
) -> None:
    primary, second, mirror = servers
    replicate(deployment, mirror)
    remotes = (RemoteConfig(second.url("cloud.git"), "read"), RemoteConfig(primary.url("cloud.git"), "both"))
    ctl1 = agents("ctl1", primary.url("cloud.git"), remotes=remotes)

    first = ctl1.reconcile_once()
    assert first.exit_code == 0 and ctl1.source.url == second.url("cloud.git")  # read from the mirror
    assert (deployment.note("ctl1", first.commit) or {}).get("state") == "applied"  # noted on the primary
    assert git("--git-dir", str(mirror), "for-each-ref", "refs/notes/") == ""  # never pushed to the mirror

    second.stop()  # the mirror goes down mid-run; a commit lands on the primary
    c1 = identity_workers(deployment, 4)
    result = ctl1.reconcile_once()
    assert result.exit_code == 0 and result.commit == c1 and ctl1.source.url == primary.url("cloud.git")
    assert "workers = 4" in live(ctl1)

    # The mirror comes back, not yet replicated: it lags; the node stays where it is (no refusal)
    second.start()
    lagging = ctl1.reconcile_once()
    assert lagging.exit_code == 0 and lagging.commit == c1 and ctl1.source.url == second.url("cloud.git")
    assert lagging.report is None and (deployment.note("ctl1", c1) or {}).get("state") == "applied"

    # replicated: back on the mirror for the next commit
    c2 = identity_workers(deployment, 8)
    replicate(deployment, mirror)
    assert ctl1.reconcile_once().commit == c2 and "workers = 8" in live(ctl1)
    assert ctl1.source.url == second.url("cloud.git")
    assert (deployment.note("ctl1", c2) or {}).get("state") == "applied"


def test_a_mirror_that_rewrites_history_is_refused_like_a_force_push(
    deployment: Deployment, agents: Callable[..., Agent], servers: tuple[Daemon, Daemon, Path], merge_key: SigningKey
) -> None:
    primary, second, mirror = servers
    c1 = identity_workers(deployment, 4)
    replicate(deployment, mirror)
    remotes = (RemoteConfig(second.url("cloud.git"), "read"), RemoteConfig(primary.url("cloud.git"), "write"))
    ctl1 = agents("ctl1", primary.url("cloud.git"), remotes=remotes)
    assert ctl1.reconcile_once().commit == c1

    # the mirror's branch is replaced by another history: signed by the merge key, but not a descendant
    git("reset", "-q", "--hard", "HEAD~1", cwd=deployment.work)
    other = identity_workers(deployment, 16, push=False)
    git("push", "-q", "--force", str(mirror), f"{other}:refs/heads/main", cwd=deployment.work)
    result = ctl1.reconcile_once()
    assert result.exit_code == 2 and result.error is not None, result
    assert "does not descend from" in str(result.error)
    assert "workers = 4" in live(ctl1)  # still running what it had


def test_a_site_with_no_network_converges_from_a_bundle_and_pushes_its_notes_when_the_primary_answers(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path
) -> None:
    c0 = git("rev-parse", "HEAD", cwd=deployment.work)
    c1 = identity_workers(deployment, 4)
    usb = tmp_path / "usb" / "cloud.bundle"
    usb.parent.mkdir()
    made = cli("bundle", "create", "--repo", str(deployment.work), "--remote", deployment.url, "main", str(usb),
               "-o", "json")
    assert made.returncode == 0, made.stderr
    assert as_json(made)["head"] == c1

    # the site: it reads the bundle; its write remote is a server it cannot reach yet
    unreachable = tmp_path / "primary-at-hq" / "cloud.git"
    remotes = (RemoteConfig(str(usb), "read"), RemoteConfig(f"file://{unreachable}", "write"))
    site = agents("ctl1", f"file://{unreachable}", remotes=remotes)
    first = site.reconcile_once()
    assert first.exit_code == 0 and first.commit == c1 and not first.pushed, first
    assert "workers = 4" in live(site)
    assert site.reporter.read(c1) is not None  # the note is kept on the node

    # the next bundle carries only what the site lacks
    c2 = identity_workers(deployment, 8)
    later = cli("bundle", "create", "--repo", str(deployment.work), "--remote", deployment.url, f"{c1}..main",
                str(usb), "-o", "json")
    assert later.returncode == 0 and as_json(later)["since"] == c1, later.stderr
    assert site.reconcile_once().commit == c2 and "workers = 8" in live(site)
    git("checkout", "-q", "-b", "side", c0, cwd=deployment.work)
    side = deployment.commit("a side branch", push=False)
    git("push", "-q", deployment.url, "side", cwd=deployment.work)
    git("checkout", "-q", "main", cwd=deployment.work)
    for since in ("0123456789abcdef0123456789abcdef01234567", side):
        bad = cli("bundle", "create", "--repo", str(deployment.work), "--remote", deployment.url, f"{since}..main",
                  str(tmp_path / "x.bundle"))
        assert bad.returncode == 2 and "not a commit of main" in bad.stderr, bad.stderr
        assert "Traceback" not in bad.stderr

    # headquarters comes within reach: the notes written offline go there
    unreachable.parent.mkdir()
    subprocess.run(["cp", "-a", str(deployment.bare), str(unreachable)], check=True)
    assert site.reconcile_once().pushed
    for commit in (c1, c2):
        note = git("--git-dir", str(unreachable), "notes", "--ref=reconciler/ctl1", "show", commit)
        assert '"state": "applied"' in note


def test_bundle_create_refuses_bad_input_in_one_line_with_exit_2_and_writes_nothing(
    deployment: Deployment, tmp_path: Path
) -> None:
    head = git("rev-parse", "HEAD", cwd=deployment.work)
    here = tmp_path / "here"  # where the operator runs it: relative FILEs land here
    here.mkdir()
    os.mkfifo(here / "fifo")  # stands for /dev/full: renamed over, the device node became a plain file
    git("remote", "add", "origin", deployment.url, cwd=deployment.work)
    cases = [
        (["main", ""], "FILE '': not a file name"),
        (["nope", "x.bundle"], f"nope: no such branch at {deployment.work.resolve()}"),
        (["main..main", "x.bundle"], f"main..main: nothing to bundle, main is at main ({head[:12]})"),
        (["main", "usb/x.bundle"], "usb/x.bundle: usb does not exist"),
        (["main", "fifo"], "fifo: not a regular file (a bundle would replace it)"),
        (["--remote", "orign", "main", "x.bundle"],  # a typo of a remote's name: git read it as a path
         f"--remote 'orign': not a remote of {deployment.work} (it has: origin) nor a URL or path"),
        (["--repo", str(here), "main", "x.bundle"],
         f"{here}: not a git repository (give --repo, a clone of the deployment repo)"),
    ]
    for args, message in cases:
        proc = subprocess.run([sys.executable, "-m", "reconciler", "bundle", "create", "--repo",
                               str(deployment.work), *args], capture_output=True, text=True, timeout=60, cwd=here)
        assert (proc.returncode, proc.stderr) == (2, f"error: {message} [BAD_INPUT]\n"), args
    assert [p.name for p in here.iterdir()] == ["fifo"] and stat.S_ISFIFO((here / "fifo").lstat().st_mode)
    # A path relative to where the operator stands names the remote too (git fetches elsewhere).
    relative = os.path.relpath(deployment.bare, here)
    proc = subprocess.run([sys.executable, "-m", "reconciler", "bundle", "create", "--repo", str(deployment.work),
                           "--remote", relative, "main", str(tmp_path / "rel.bundle")],
                          capture_output=True, text=True, timeout=60, cwd=here)
    assert proc.returncode == 0 and (tmp_path / "rel.bundle").is_file(), (relative, proc.stderr)


NODE_SHELL = ROOT / "contrib" / "git-server" / "node-shell"


def _advertised(command: str, url: str) -> list[str]:
    """The refs the server's receive-pack advertises to this key: its first words, read with
    nothing sent back (pkt-lines: 4 hex digits of length, then "<id> <ref>")."""
    host, _, path = url.removeprefix("ssh://").partition("/")
    user_host, _, port = host.rpartition(":")
    argv = [*command.split(), user_host, f"git-receive-pack '/{path}'"]
    done = subprocess.run(argv, input=b"0000", capture_output=True, timeout=60)
    out = done.stdout
    refs = []
    while len(out) >= 4 and out[:4] != b"0000":
        size = int(out[:4], 16)
        line, out = out[4:size], out[size:]
        refs.append(line.split(b"\0")[0].decode().split(" ", 1)[1].strip())
    return refs


def test_a_node_key_behind_node_shell_pushes_its_own_notes_and_sees_and_writes_no_other_ref(
    deployment: Deployment, agents: Callable[..., Agent], ssh_remote: tuple[str, str], tmp_path: Path
) -> None:
    url, command = ssh_remote
    ctl1 = agents("ctl1", deployment.url)  # another node's notes on the server, pushed plainly
    assert ctl1.reconcile_once().exit_code == 0
    keys = tmp_path / "sshd" / "authorized_keys"
    keys.write_text(f'command="{NODE_SHELL} cmp1 {deployment.bare}",restrict {keys.read_text()}')

    # Before cmp1 ever pushed: nothing to see (git's placeholder line for no refs).
    assert _advertised(command, url) == ["capabilities^{}"]
    cmp1 = agents("cmp1", url, ssh_command=command)
    result = cmp1.reconcile_once()
    assert result.exit_code == 0 and result.pushed
    assert (deployment.note("cmp1") or {}).get("state") == "applied"
    # What a push from this key is shown: its own notes ref, not the branch nor ctl1's notes.
    assert _advertised(command, url) == ["refs/notes/reconciler/cmp1"]

    # Writing another node's notes is refused by the server itself.
    mirror = cmp1.cfg.state_dir / "mirror.git"
    env = {"GIT_SSH_COMMAND": command, "PATH": "/usr/bin:/bin"}
    other = subprocess.run(["git", "--git-dir", str(mirror), "push", url,
                            "refs/notes/reconciler/cmp1:refs/notes/reconciler/ctl1"],
                           capture_output=True, text=True, env=env, timeout=60)
    assert other.returncode != 0 and "hidden ref" in other.stderr, other.stderr
    assert git("--git-dir", str(deployment.bare), "rev-parse", "refs/notes/reconciler/ctl1").strip() != \
        git("--git-dir", str(deployment.bare), "rev-parse", "refs/notes/reconciler/cmp1").strip()
    branch = subprocess.run(["git", "--git-dir", str(mirror), "push", url, "refs/notes/reconciler/cmp1:refs/heads/x"],
                            capture_output=True, text=True, env=env, timeout=60)
    assert branch.returncode != 0 and "hidden ref" in branch.stderr, branch.stderr
    # And the key is no shell, nor a way into another repository of the server.
    host = url.removeprefix("ssh://").split("/")[0].rpartition(":")[0]
    shell = subprocess.run([*command.split(), host, "id"], capture_output=True, text=True, timeout=60)
    assert shell.returncode != 0 and "may fetch and push its notes, nothing else" in shell.stderr, shell.stderr
    elsewhere = subprocess.run([*command.split(), host, f"git-upload-pack '{tmp_path / 'other.git'}'"],
                               capture_output=True, text=True, timeout=60)
    assert elsewhere.returncode != 0 and f"may reach {deployment.bare} only" in elsewhere.stderr, elsewhere.stderr


NGINX_NOTES = ROOT / "contrib" / "git-server" / "nginx-node-notes.conf"


@pytest.fixture
def nodes_http(tmp_path: Path, deployment: Deployment) -> Iterator[Callable[[str], str]]:
    """The primary over smart HTTP as an operator serves it to the nodes: a real nginx with
    ``contrib/git-server/nginx-node-notes.conf`` (its site paths set), fcgiwrap running the real
    `git http-backend`, one login per node. Gives a node's remote URL, its password in it."""
    server = Nginx(tmp_path / "www", tmp_path / "nginx", free_port())
    if not server.available:
        unavailable("nginx", f"{server.binary} not found")
    fcgiwrap = shutil.which("fcgiwrap") or "/usr/sbin/fcgiwrap"
    if not os.access(fcgiwrap, os.X_OK):
        unavailable("fcgiwrap", f"{fcgiwrap} not found (apt-get install fcgiwrap)")
    sock = tmp_path / "fcgiwrap.sock"
    fcgi = subprocess.Popen([fcgiwrap, "-s", f"unix:{sock}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for(sock.exists, 10, "fcgiwrap")
    logins = tmp_path / "nodes.htpasswd"
    for node in ("cmp1", "ctl1"):
        subprocess.run(["htpasswd", "-b", "-B", *(["-c"] if node == "cmp1" else []), str(logins), node,
                        f"pw-{node}"], check=True, capture_output=True)
    site = NGINX_NOTES.read_text()
    for default, ours in (("/etc/nginx/reconciler-nodes.htpasswd", logins), ("/run/fcgiwrap.socket", sock),
                          ("/srv/git", deployment.bare.parent),
                          ("/usr/lib/git-core", git("--exec-path").strip())):
        assert default in site, default
        site = site.replace(default, str(ours))
    server.extra = site
    (tmp_path / "www").mkdir()
    server.start()
    try:
        yield lambda node: server.url(f"git/{deployment.bare.name}").replace("://", f"://{node}:pw-{node}@")
    finally:
        server.stop()
        fcgi.terminate()
        fcgi.wait(10)


def _advertised_http(url: str) -> list[str]:
    """The refs receive-pack advertises to this login over smart HTTP (protocol v0: a service
    line, a flush, then "<id> <ref>" pkt-lines)."""
    login, _, rest = url.removeprefix("http://").rpartition("@")
    request = urllib.request.Request(f"http://{rest}/info/refs?service=git-receive-pack")
    if login:
        request.add_header("Authorization", "Basic " + base64.b64encode(login.encode()).decode())
    with urllib.request.urlopen(request, timeout=30) as answer:
        out = answer.read()
    refs, flushes = [], 0
    while len(out) >= 4 and flushes < 2:
        size = int(out[:4], 16)
        if size == 0:
            flushes, out = flushes + 1, out[4:]
            continue
        line, out = out[4:size], out[size:]
        if flushes == 1:
            refs.append(line.split(b"\0")[0].decode().split(" ", 1)[1].strip())
    return refs


def test_a_node_login_over_smart_http_pushes_its_own_notes_and_writes_no_other_ref(
    deployment: Deployment, agents: Callable[..., Agent], nodes_http: Callable[[str], str]
) -> None:
    ctl1 = agents("ctl1", deployment.url)  # another node's notes on the server, pushed plainly
    assert ctl1.reconcile_once().exit_code == 0
    url = nodes_http("cmp1")
    assert _advertised_http(url) == ["capabilities^{}"]

    cmp1 = agents("cmp1", url)
    result = cmp1.reconcile_once()
    assert result.exit_code == 0 and result.pushed
    note = deployment.note("cmp1") or {}
    assert note.get("state") == "applied" and "pw-cmp1" not in str(note)
    assert _advertised_http(url) == ["refs/notes/reconciler/cmp1"]

    # The server refuses this login's push to another node's notes, or to the branch.
    mirror = cmp1.cfg.state_dir / "mirror.git"
    for target in ("refs/notes/reconciler/ctl1", "refs/heads/x"):
        push = subprocess.run(["git", "--git-dir", str(mirror), "push", url, f"refs/notes/reconciler/cmp1:{target}"],
                              capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin",
                                                                               "GIT_TERMINAL_PROMPT": "0"})
        assert push.returncode != 0 and "hidden ref" in push.stderr, push.stderr
    assert git("--git-dir", str(deployment.bare), "rev-parse", "refs/notes/reconciler/ctl1").strip() != \
        git("--git-dir", str(deployment.bare), "rev-parse", "refs/notes/reconciler/cmp1").strip()
    # ctl1's own login may write ctl1's notes: the rule follows the login, not a fixed name.
    assert _advertised_http(nodes_http("ctl1")) == ["refs/notes/reconciler/ctl1"]
    # Without a login, or with another node's password, there is no push at all.
    for login in ("", "cmp1:pw-ctl1@"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            _advertised_http(url.replace("cmp1:pw-cmp1@", login))
        assert refused.value.code == 401
