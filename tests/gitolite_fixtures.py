"""Pytest plugin: a real gitolite3 server behind its own sshd on a loopback port (registered in conftest.py).

``gitolite`` gives one test its own gitolite instance, for tests where several nodes push their own
notes refs and must not be able to push anything else::

    def test_notes(gitolite: Gitolite) -> None:
        merge, ctl1 = gitolite.add_user("merge"), gitolite.add_user("ctl1")
        gitolite.configure("cloud", ["ctl1", "ctl2"])          # creates the repo, applies the rules
        env = {**os.environ, "GIT_SSH_COMMAND": gitolite.ssh_command(ctl1)}
        subprocess.run(["git", "push", gitolite.url("cloud"), "refs/notes/reconciler/ctl1"], env=env, check=True)
        assert (gitolite.bare_path("cloud") / "refs").is_dir()

Per test: a unix user ``gl<6 hex>`` (``useradd -m``, unlocked with ``usermod -p '*'`` or sshd refuses
its keys), ``gitolite setup -pk admin.pub`` as that user, and ``sshd -D`` with its own config on a free
127.0.0.1 port allowing only that user. Teardown stops sshd and removes the user and its home.

The user's home is not under ``tmp_path``: pytest keeps ``/tmp/pytest-of-<user>`` at mode 0700 (and
resets it at each session start), so the git user could not reach a home there. It lives in its own
``/tmp/reconciler-gitolite-*`` directory (mode 0711) instead; keys and the sshd files stay in tmp_path.

``configure`` writes ``~/.gitolite/conf/repos/<repo>.conf`` (included from gitolite.conf) directly and
runs ``gitolite compile`` and ``gitolite trigger POST_COMPILE`` as the git user: this creates the repos
named in the config and rebuilds ~/.ssh/authorized_keys from ``~/.gitolite/keydir`` (where ``add_user``
puts the public keys). The gitolite-admin repo is not used: pushing to it would overwrite these files.

Needs root (useradd) and the gitolite3 and openssh-server packages; scripts/gitolite-server.sh installs
them when missing. When that cannot be had the test fails on CI (``$CI`` set) and is skipped elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest
from needs import unavailable
from ports import free_port, wait_listening

ROOT = Path(__file__).resolve().parent.parent
SERVER_SCRIPT = ROOT / "scripts" / "gitolite-server.sh"
GITOLITE_NAME = re.compile(r"[0-9A-Za-z][-0-9A-Za-z._@+]*")  # gitolite's user and repo name pattern (no '/')
ADMIN_CONF = "repo gitolite-admin\n    RW+ = admin\n\ninclude \"repos/*.conf\"\n"


def _perl_quote(name: str) -> str:
    """A gitolite name as a literal in a refex (only '.' and '+' of its characters are special)."""
    return re.sub(r"([.+])", r"\\\1", name)


def _unavailable(reason: str) -> NoReturn:
    unavailable("gitolite server", reason)


def _sshd() -> str | None:
    return shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)


def _gitolite() -> str | None:
    return shutil.which("gitolite") or ("/usr/bin/gitolite" if Path("/usr/bin/gitolite").exists() else None)


def _ensure_installed() -> str:
    """sshd's path; runs scripts/gitolite-server.sh when gitolite or sshd is missing."""
    if _gitolite() is None or _sshd() is None:
        if os.geteuid() != 0:
            _unavailable("gitolite3/openssh-server missing and not root (run scripts/gitolite-server.sh as root)")
        proc = subprocess.run([str(SERVER_SCRIPT)], capture_output=True, text=True)
        if proc.returncode != 0:
            _unavailable(f"{SERVER_SCRIPT.name} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    sshd = _sshd()
    if _gitolite() is None or sshd is None:
        _unavailable("gitolite or sshd still missing after scripts/gitolite-server.sh")
    return sshd


def _keygen(path: Path, comment: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True)


def _root_cmd(*args: str) -> None:
    """Run a user-management command, retrying while another process holds the passwd lock."""
    for attempt in range(10):
        proc = subprocess.run(args, capture_output=True, text=True)
        if proc.returncode == 0:
            return
        if "lock" not in proc.stderr.lower() or attempt == 9:
            raise subprocess.CalledProcessError(proc.returncode, args, proc.stdout, proc.stderr)
        time.sleep(0.2)


def _userdel(user: str) -> None:
    """userdel -r, waiting a little for the user's last ssh sessions to end (then forcing it)."""
    for _ in range(20):
        proc = subprocess.run(["userdel", "-r", user], capture_output=True, text=True)
        if proc.returncode == 0 or "does not exist" in proc.stderr:
            return
        time.sleep(0.1)
    subprocess.run(["userdel", "-r", "-f", user], capture_output=True)


@dataclass(frozen=True)
class Gitolite:
    """One test's gitolite instance: unix user ``user`` with home ``home``, sshd on 127.0.0.1:``port``."""

    user: str
    home: Path
    port: int
    keys: Path  # client private keys (root-owned, in tmp_path)
    admin_key: Path

    @property
    def _pw(self) -> pwd.struct_passwd:
        return pwd.getpwnam(self.user)

    def url(self, repo: str) -> str:
        return f"ssh://{self.user}@127.0.0.1:{self.port}/{repo}"

    def ssh_command(self, key: Path) -> str:
        return (f"ssh -i {key} -p {self.port} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
                "-o BatchMode=yes -o IdentitiesOnly=yes -o LogLevel=ERROR")

    def bare_path(self, repo: str) -> Path:
        return self.home / "repositories" / f"{repo}.git"

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a command as the git user in its home (e.g. ``run("gitolite", "list-repos")``)."""
        pw = self._pw
        env = {"HOME": str(self.home), "USER": self.user, "LOGNAME": self.user, "PATH": "/usr/bin:/bin",
               "LANG": "C.UTF-8", "SHELL": "/bin/sh"}
        proc = subprocess.run(args, cwd=self.home, env=env, user=pw.pw_uid, group=pw.pw_gid, extra_groups=[],
                              capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(args)} as {self.user} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def _write(self, path: Path, text: str) -> None:
        """Write a file in the git user's home, owned by that user."""
        pw = self._pw
        for parent in reversed(path.relative_to(self.home).parents[:-1]):
            if not (self.home / parent).is_dir():
                (self.home / parent).mkdir()
                os.chown(self.home / parent, pw.pw_uid, pw.pw_gid)
        path.write_text(text)
        os.chown(path, pw.pw_uid, pw.pw_gid)

    def add_user(self, name: str) -> Path:
        """A fresh ed25519 key for gitolite user ``name``; its public key goes into gitolite's keydir and
        is accepted after the next ``configure``. Returns the private key's path."""
        if not GITOLITE_NAME.fullmatch(name) or name.endswith(".pub"):
            raise ValueError(f"not a gitolite user name: {name!r}")
        key = self.keys / name
        _keygen(key, name)
        self._write(self.home / ".gitolite" / "keydir" / f"{name}.pub", key.with_name(f"{name}.pub").read_text())
        return key

    def configure(self, repo: str, nodes: list[str], merger: str = "merge") -> None:
        """Write the rules for ``repo`` and apply them (creates the repo when new): ``merger`` may push
        branches, each node only ``refs/notes/reconciler/<node>``, everyone may read."""
        for name in (repo, merger, *nodes):
            if not GITOLITE_NAME.fullmatch(name):
                raise ValueError(f"not a gitolite name: {name!r}")
        # gitolite substitutes USER only between slashes, so one rule per node; refexes are Perl regexes
        rules = [f"    RW+ refs/heads/ = {merger}"]
        rules += [f"    RW+ refs/notes/reconciler/{_perl_quote(n)}$ = {n}" for n in nodes]
        rules.append("    R = @all")
        self._write(self.home / ".gitolite" / "conf" / "repos" / f"{repo}.conf",
                    f"repo {repo}\n" + "\n".join(rules) + "\n")
        self.run("gitolite", "compile")
        self.run("gitolite", "trigger", "POST_COMPILE")


_RC: list[str] = []


def _rc(server: Gitolite) -> str:
    """gitolite's default rc without the gitweb and daemon features: their POST_COMPILE triggers took
    about 0.55 s of every `configure`, for files nothing here reads."""
    if not _RC:
        text = server.run("gitolite", "print-default-rc").stdout
        for feature in ("daemon", "gitweb"):
            text, n = re.subn(rf"^(\s*)'{feature}',", rf"\1# '{feature}',", text, flags=re.M)
            assert n == 1, f"feature {feature!r} not found in gitolite's default rc"
        _RC.append(text)
    return _RC[0]


@pytest.fixture
def gitolite(tmp_path: Path) -> Iterator[Gitolite]:
    """A real gitolite3 behind its own sshd on a loopback port, for one test (see the module docstring)."""
    if os.geteuid() != 0:
        _unavailable("needs root to create a unix user for the git server")
    sshd = _ensure_installed()
    d = tmp_path / "gitolite"
    keys = d / "keys"
    _keygen(d / "host_key", "host")
    _keygen(keys / "admin", "admin")
    user = "gl" + secrets.token_hex(3)
    base = Path(tempfile.mkdtemp(prefix=f"reconciler-gitolite-{user}-"))
    base.chmod(0o711)
    home = base / "home"
    proc: subprocess.Popen[str] | None = None
    created = False
    try:
        _root_cmd("useradd", "-m", "-d", str(home), "-s", "/bin/sh", user)
        created = True
        _root_cmd("usermod", "-p", "*", user)  # unlocked ('!' would make sshd refuse the keys), no password
        server = Gitolite(user, home, free_port(), keys, keys / "admin")
        # written before `gitolite setup`, which keeps an existing rc and conf (so no `testing` repo is made)
        server._write(home / ".gitolite" / "logs" / ".keep", "")  # gitolite exits 1 when it cannot log
        server._write(home / ".gitolite.rc", _rc(server))
        server._write(home / ".gitolite" / "conf" / "gitolite.conf", ADMIN_CONF)
        server._write(home / ".gitolite" / "conf" / "repos" / ".keep", "")
        server._write(home / "admin.pub", (keys / "admin.pub").read_text())  # must be readable by the git user
        server.run("gitolite", "setup", "-pk", "admin.pub")
        (home / "admin.pub").unlink()
        (d / "sshd_config").write_text(
            f"Port {server.port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_key'}\nPidFile {d / 'sshd.pid'}\n"
            "AuthorizedKeysFile .ssh/authorized_keys\nUsePAM no\nStrictModes no\nPasswordAuthentication no\n"
            f"KbdInteractiveAuthentication no\nAllowUsers {user}\nLogLevel ERROR\n"
            # the default sntrup761x25519 key exchange took ~0.25 s of every connection here
            "KexAlgorithms curve25519-sha256,curve25519-sha256@libssh.org\n"
        )
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(d / "sshd_config")], stderr=subprocess.PIPE, text=True)
        wait_listening(server.port, "sshd", proc)
        yield server
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if created:
            with contextlib.suppress(Exception):
                _userdel(user)
        shutil.rmtree(base, ignore_errors=True)

