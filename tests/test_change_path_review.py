"""A review of issue 40's change path (b6fb7dd): the note key read through libsodium takes no file
cryptography refused, a key cryptography cannot open is said in a line, not a traceback, and the
imports done while a fetch waits never leave the cyclic collector off."""

from __future__ import annotations

import base64
import gc
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import wait_for

from reconciler.core.errors import ConfigError
from reconciler.core.warmup import warming
from reconciler.trust.keyfile import BEGIN, END, MAGIC, read_ed25519
from reconciler.trust.notesig import NoteKey
from reconciler.trust.sshkeys import WireReader, wire_string


@pytest.fixture
def collector() -> Iterator[None]:
    """The collector on before, and on again after, whatever the test did to it."""
    assert gc.isenabled()
    yield
    gc.enable()


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A module no test imported yet (gone from ``sys.modules`` after)."""
    name = f"warm_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text("loaded = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def padded_further(path: Path, more: int) -> bytes:
    """The key file at ``path`` with ``more`` bytes of padding past the 0-7 every writer puts,
    the 1, 2, 3... run kept and the private section still a multiple of 8: OpenSSH's rule
    allows it, cryptography's (at most 16 bytes) does not."""
    lines = path.read_bytes().strip().splitlines()
    body = base64.b64decode(b"".join(lines[1:-1]))
    r = WireReader(body[len(MAGIC):])
    for _ in range(3):
        r.string()
    r.u32()
    r.string()
    at = len(MAGIC) + r.pos
    private = r.string()
    longer = private + bytes(range(len(private) - _padding_start(private) + 1, 256))[:more]
    text = base64.b64encode(body[:at] + wire_string(longer))
    return BEGIN + b"\n" + b"\n".join(text[i:i + 70] for i in range(0, len(text), 70)) + b"\n" + END + b"\n"


def _padding_start(private: bytes) -> int:
    p = WireReader(private)
    p.u32(), p.u32()
    for _ in range(4):  # type, public key, secret, comment
        p.string()
    return p.pos


def test_a_key_file_cryptography_refuses_for_its_padding_is_not_read_through_libsodium(tmp_path: Path) -> None:
    path = tmp_path / "key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    assert read_ed25519(path.read_bytes()) is not None
    odd = tmp_path / "odd"
    odd.write_bytes(padded_further(path, 24))
    odd.chmod(0o600)
    # Before the libsodium path this file was a one-line error: it still is.
    assert read_ed25519(odd.read_bytes()) is None
    with pytest.raises(ConfigError, match="not an unencrypted OpenSSH private key"):
        NoteKey.load(odd)


def test_a_note_key_in_a_cipher_cryptography_cannot_open_is_said_in_a_line(tmp_path: Path) -> None:
    path = tmp_path / "key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "a passphrase", "-Z", "aes128-ctr", "-f", str(path)],
                   check=True)
    with pytest.raises(ConfigError, match="not an unencrypted OpenSSH private key") as caught:
        NoteKey.load(path)
    assert caught.value.file == str(path)


def test_the_collector_is_on_again_once_the_imports_are_in_while_the_fetch_still_runs(
        collector: None, module: str) -> None:
    with warming([module]):
        # The fetch goes on (a slow remote: up to git's time limit) after the imports are done:
        # the supervisor's and the receiver's threads run meanwhile, the collector on for them.
        wait_for(lambda: not any(t.name == "reconciler-warmup" for t in threading.enumerate()), what="imports")
        assert module in sys.modules
        assert gc.isenabled()
    assert gc.isenabled()


def test_no_thread_to_be_had_leaves_the_fetch_to_run_and_the_collector_on(
        collector: None, module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A pids limit reached cannot be made here as root: a thread that cannot start stands in.
    def refused(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refused)
    fetched = []
    with warming([module]):
        fetched.append(True)
    assert fetched == [True]
    assert gc.isenabled()
    assert module not in sys.modules  # imported by the pass itself, later
