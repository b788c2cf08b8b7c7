"""Pytest plugin: a real image registry on loopback (registered in conftest.py).

Debian's ``docker-registry`` package is the CNCF distribution registry (the one Docker Hub's
``registry:2`` image runs). Each registry here runs from a temp dir, on 127.0.0.1 and a port
the kernel picks (read back from its log), with filesystem storage; ``private_registry`` also
asks for a password (htpasswd, bcrypt, made with apache2-utils' ``htpasswd``). The Docker
engine pulls from 127.0.0.0/8 over plain HTTP: loopback is insecure-allowed by default.

Without the binaries the tests fail on CI (``$CI`` set: ``.ci/run`` installs them) and are
skipped elsewhere, as the other real parts are.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest
from needs import unavailable

REGISTRY_BIN = "docker-registry"
HTPASSWD_BIN = "htpasswd"


def _unavailable(reason: str) -> NoReturn:
    unavailable("image registry", reason)


@dataclass(frozen=True)
class Registry:
    host: str  # 127.0.0.1:PORT, as image names spell it
    username: str = ""
    password: str = ""  # empty: no login asked

    def image(self, path: str) -> str:
        return f"{self.host}/{path}"

    @property
    def auth(self) -> dict[str, str] | None:
        return {"username": self.username, "password": self.password} if self.username else None


def _start(directory: Path, login: tuple[str, str] | None) -> tuple[subprocess.Popen[bytes], Registry]:
    binary = shutil.which(REGISTRY_BIN)
    if binary is None:
        _unavailable(f"{REGISTRY_BIN} is not installed")
    directory.mkdir(parents=True)
    auth = ""
    if login is not None:
        if shutil.which(HTPASSWD_BIN) is None:
            _unavailable(f"{HTPASSWD_BIN} is not installed")
        # -i: the password on stdin, not on a command line other users can read in ps
        made = subprocess.run([HTPASSWD_BIN, "-iBn", login[0]], input=login[1], capture_output=True, text=True)
        if made.returncode != 0:
            _unavailable(f"htpasswd: {made.stderr.strip()}")
        (directory / "htpasswd").write_text(made.stdout)
        auth = f"auth: {{htpasswd: {{realm: reconciler-test, path: {directory / 'htpasswd'}}}}}\n"
    config = directory / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log: {level: info, accesslog: {disabled: true}}\n"  # info: it logs the address it listens on
        f"storage: {{filesystem: {{rootdirectory: {directory / 'data'}}}, delete: {{enabled: true}}}}\n"
        f"http: {{addr: '127.0.0.1:0', secret: {secrets.token_hex(16)}}}\n" + auth
    )
    log = directory / "registry.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([binary, "serve", str(config)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        found = re.search(r"listening on (127\.0\.0\.1:\d+)", log.read_text(errors="replace"))
        if found:
            registry = Registry(found.group(1), *(login or ("", "")))
            try:
                urllib.request.urlopen(f"http://{registry.host}/v2/", timeout=2).close()
            except urllib.error.HTTPError as exc:  # 401 without a login: it answers
                if exc.code != 401:
                    raise
            return proc, registry
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    proc.wait()
    _unavailable(f"{REGISTRY_BIN} did not start: {log.read_text(errors='replace')[-800:]}")


@contextlib.contextmanager
def _running(directory: Path, login: tuple[str, str] | None) -> Iterator[Registry]:
    proc, registry = _start(directory, login)
    try:
        yield registry
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def open_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A registry anyone may pull from and push to."""
    with _running(tmp_path_factory.mktemp("registry") / "open", None) as registry:
        yield registry


@pytest.fixture(scope="session")
def private_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A registry that asks for a user and password (basic auth over htpasswd) to pull or push."""
    login = ("puller", f"pw-{secrets.token_hex(12)}")
    with _running(tmp_path_factory.mktemp("registry") / "private", login) as registry:
        yield registry
