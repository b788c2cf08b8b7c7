"""A node's ed25519 note key read without the cryptography package (``trust.keyfile``): the
keys ssh-keygen and the agent write are read and sign byte for byte as cryptography signs; any
other file, and every damaged variant of a real one, is left to cryptography, which reads it or
says what is wrong."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.serialization import load_ssh_private_key
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.core.errors import ConfigError
from reconciler.trust.keyfile import BEGIN, END, SodiumEd25519, read_ed25519
from reconciler.trust.notesig import NoteKey

COMMIT = "0123456789abcdef0123456789abcdef01234567"
BODY = {"format": 1, "node": "ctl1", "commit": COMMIT, "state": "applied"}


def keygen(path: Path, kind: str = "ed25519", *extra: str) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "ctl1 note key", *extra, "-f", str(path)],
                   check=True)
    return path


def body_of(path: Path) -> bytes:
    lines = path.read_bytes().strip().splitlines()
    return base64.b64decode(b"".join(lines[1:-1]))


def armour(body: bytes) -> bytes:
    text = base64.b64encode(body)
    return BEGIN + b"\n" + b"\n".join(text[i:i + 70] for i in range(0, len(text), 70)) + b"\n" + END + b"\n"


@pytest.mark.parametrize("made_by", ["ssh-keygen", "the agent"])
def test_an_ed25519_key_is_read_through_libsodium_and_signs_as_cryptography_does(tmp_path: Path, made_by: str) -> None:
    path = keygen(tmp_path / "key") if made_by == "ssh-keygen" else NoteKey.load_or_create(tmp_path / "key").path
    key = NoteKey.load(path)
    assert isinstance(key._key, SodiumEd25519)
    through_cryptography = NoteKey(path, load_ssh_private_key(path.read_bytes(), password=None))
    assert key.public_line == through_cryptography.public_line
    assert key.seal("ctl1", COMMIT, BODY) == through_cryptography.seal("ctl1", COMMIT, BODY)
    if made_by == "ssh-keygen":
        assert key.public_line == " ".join((tmp_path / "key.pub").read_text().split()[:2])
    assert "private" in repr(key._key) and key._key.secret.hex() not in repr(key._key)


def test_other_keys_are_read_by_cryptography_as_before(tmp_path: Path) -> None:
    for kind in ("ecdsa", "rsa"):
        path = keygen(tmp_path / kind, kind)
        assert read_ed25519(path.read_bytes()) is None
        assert not isinstance(NoteKey.load(path)._key, SodiumEd25519)
    locked = tmp_path / "locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "a passphrase", "-f", str(locked)], check=True)
    assert read_ed25519(locked.read_bytes()) is None
    with pytest.raises(ConfigError, match="not an unencrypted OpenSSH private key"):
        NoteKey.load(locked)


def test_a_file_whose_public_key_is_not_its_seeds_is_not_taken(tmp_path: Path) -> None:
    one, other = body_of(keygen(tmp_path / "one")), body_of(keygen(tmp_path / "other"))
    mine, theirs = read_ed25519(armour(one)), read_ed25519(armour(other))
    assert mine is not None and theirs is not None
    # Everywhere the file writes its public key (the blob, the private section, the secret's
    # second half), another key's: what the seed makes no longer matches.
    forged = one.replace(mine.secret[32:], theirs.secret[32:])
    assert forged.count(theirs.secret[32:]) == 3
    assert read_ed25519(armour(forged)) is None


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_damaged_key_file_is_never_read_as_another_key(tmp_path_factory: pytest.TempPathFactory,
                                                          data: st.DataObject) -> None:
    """Any byte of a real key's body changed, or the body cut short: either not read here (left
    to cryptography) or, where the byte is one OpenSSH ignores (the check words, the comment), the
    same key as cryptography reads from it."""
    path = _real_key(tmp_path_factory)
    body = bytearray(body_of(path))
    if data.draw(st.booleans()):
        at = data.draw(st.integers(0, len(body) - 1))
        body[at] ^= data.draw(st.integers(1, 255))
    else:
        del body[data.draw(st.integers(0, len(body) - 1)):]
    got = read_ed25519(armour(bytes(body)))
    if got is None:
        return
    theirs = load_ssh_private_key(armour(bytes(body)), password=None)
    mine = NoteKey(path, got)
    assert mine.seal("ctl1", COMMIT, BODY) == NoteKey(path, theirs).seal("ctl1", COMMIT, BODY)


_KEYS: dict[str, Path] = {}


def _real_key(factory: pytest.TempPathFactory) -> Path:
    if "key" not in _KEYS:
        _KEYS["key"] = keygen(factory.mktemp("keyfile") / "key")
    return _KEYS["key"]
