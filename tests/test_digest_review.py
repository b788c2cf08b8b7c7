"""The daemon's hashes without OpenSSL (issue 40, ``core.digest``), as an attacker and an
operator would try them: the same digests as hashlib and hmac for any key and message (a
record written by `agent --once` is checked by the daemon), big files hashed at OpenSSL's
speed, and the CA check's child interpreter failing safe."""

from __future__ import annotations

import hashlib
import hmac
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SigningKey
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler import entry
from reconciler.core import digest
from reconciler.core.model import FileSpec


@pytest.fixture
def builtin() -> Iterator[None]:
    """The interpreter's own SHA-256, as ``without_openssl`` sets it in a daemon."""
    assert digest._BUILTIN is not None
    kept = digest._sha256
    digest._sha256 = digest._BUILTIN
    yield
    digest._sha256 = kept


@settings(max_examples=300, deadline=None)
@given(key=st.binary(max_size=200), data=st.binary(max_size=4096))
def test_the_daemon_s_hmac_is_rfc_2104_s_for_any_key_and_message(key: bytes, data: bytes) -> None:
    assert digest._BUILTIN is not None
    kept, digest._sha256 = digest._sha256, digest._BUILTIN  # not the fixture: hypothesis runs it once
    try:
        said = (digest.hmac_sha256_hex(key, data), digest.sha256_hex(data), digest.sha256(data))
    finally:
        digest._sha256 = kept
    assert said == (hmac.new(key, data, hashlib.sha256).hexdigest(), hashlib.sha256(data).hexdigest(),
                    hashlib.sha256(data).digest())


@pytest.mark.parametrize("key", [b"", b"\0" * 64, b"k" * 65, os.urandom(1000)], ids=["empty", "block", "block+1", "long"])
@pytest.mark.parametrize("size", [0, 3 << 20], ids=["empty", "3MiB"])
def test_a_secret_file_recorded_by_agent_once_is_the_same_to_the_daemon(key: bytes, size: int, builtin: None) -> None:
    content = os.urandom(size)
    recorded = hmac.new(key, content, hashlib.sha256).hexdigest() if key else hashlib.sha256(content).hexdigest()
    assert FileSpec("db.conf", 0o600, content, secret=True, key=key).sha256 == recorded


# A daemon hashes its services' live files at its first poll and every five minutes (the drift
# check, ``drivers.glance``). The interpreter's SHA-256 is 5.6 times OpenSSL's CPU on 100 MB
# (0.33 s against 0.06 s) and holds the GIL throughout (a 0.4 s stall of the supervisor's and the
# receiver's threads), so a file of a MiB or more is OpenSSL's: a node whose live files are
# that big reads them whole every five minutes, beside which libcrypto's 3.5 MB is small.
HASHED = """
import sys
from reconciler.core import digest
digest.without_openssl()
digest.sha256_hex(b"x" * 4096); digest.hmac_sha256_hex(b"k", b"x" * 4096)
small = "_hashlib" in sys.modules
big = digest.sha256_hex(b"x" * (1 << 20)), digest.hmac_sha256_hex(b"k", b"x" * (1 << 20))
print(small, "_hashlib" in sys.modules, big[0] == __import__("hashlib").sha256(b"x" * (1 << 20)).hexdigest())
"""


def test_a_big_live_file_is_hashed_by_openssl_even_in_the_daemon() -> None:
    done = subprocess.run([sys.executable, "-c", HASHED], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == ["False", "True", "True"], done


def _script(path: Path, body: str) -> str:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("child", ["missing", "fails", "says-other", "says-binary", "empty"])
def test_the_ca_check_s_child_failing_is_asked_in_process(child: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """An unusable interpreter for the child (gone after an upgrade, a wrapper, a hostile
    PATH: the child is ``sys.executable``, never looked up) gives the in-process answer."""
    says = {"fails": "exit 1", "says-other": "echo 'Python 3.11: usage'", "says-binary": r"printf '\377\0a\0\376\0b'"}
    exe = {"missing": str(tmp_path / "gone"), "empty": ""}[child] if child not in says else _script(
        tmp_path / "python3", says[child])
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", exe)
    assert entry._verify_paths_in_child() is None
    for missing in (False, True):
        where = tmp_path / "none" if missing else Path(__file__)
        monkeypatch.setenv("SSL_CERT_FILE", str(where))
        monkeypatch.setenv("SSL_CERT_DIR", str(where))
        assert entry.no_ca_paths(daemon=True) is missing


def test_the_ca_check_s_child_says_what_openssl_says(monkeypatch: pytest.MonkeyPatch) -> None:
    import _ssl

    assert entry._verify_paths_in_child() == _ssl.get_default_verify_paths()


@pytest.mark.parametrize("resume", ["junk", "0"])
def test_a_daemon_told_it_was_re_executed_still_checks_the_ca_certificates(resume: str, tmp_path: Path,
                                                                           merge_key: SigningKey) -> None:
    """``RECONCILER_RESUME_FD`` is the shed daemon's hand-over, but anyone writing the unit's
    environment can set it: the CA check is not skipped for it (17 ms a re-execution), so a
    node without CA certificates says so in one line, never a traceback at its first clone."""
    env = {**os.environ, "SSL_CERT_FILE": str(tmp_path / "no-bundle.pem"), "SSL_CERT_DIR": str(tmp_path / "no-dir"),
           "RECONCILER_RESUME_FD": resume}
    done = subprocess.run([sys.executable, "-m", "reconciler", "agent", "--node", "n1", "--remote", "file:///nowhere",
                           "--state-dir", str(tmp_path / "state"), "--allowed-signers", str(merge_key.allowed_signers)],
                          env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert (done.returncode, done.stdout) == (2, ""), done
    [line] = done.stderr.splitlines()
    assert line.startswith("error: no usable CA certificates in ") and line.endswith("[NO_CA_BUNDLE]"), line
