"""A node's note signature: what real ``ssh-keygen -Y verify`` accepts, bound to the node and the
object the note is on; and which notes count under ``trust/nodes`` and the ``notes:`` policy."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from reconciler.core.errors import ConfigError
from reconciler.trust.notesig import (
    NAMESPACE,
    SIGNED,
    UNSIGNED_ALLOWED,
    NoteKey,
    NoteTrust,
    note_policy,
    parse_nodes,
    payload,
    public_line,
)

NOW = datetime.now(UTC)
COMMIT = "0123456789abcdef0123456789abcdef01234567"
BODY = {"format": 1, "node": "ctl1", "commit": COMMIT, "state": "applied", "time": "2026-11-26T10:00:00Z",
        "services": {"db": {"result": "ok"}}}


def key_of(tmp_path: Path, kind: str) -> NoteKey:
    path = tmp_path / f"key-{kind}"
    if kind == "ed25519":
        return NoteKey.load_or_create(path)  # made by the agent itself
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path)], check=True)
    return NoteKey.load(path)


@pytest.mark.parametrize("kind", ["ed25519", "ecdsa", "rsa"])
def test_a_sealed_note_verifies_with_ssh_keygen_and_here_only_for_its_node_and_object(
    tmp_path: Path, kind: str
) -> None:
    key = key_of(tmp_path, kind)
    sealed = key.seal("ctl1", COMMIT, BODY)
    allowed = tmp_path / "nodes"
    allowed.write_text(public_line("ctl1", key) + "\n")
    (tmp_path / "sig").write_text(sealed["sig"])
    real = subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(allowed), "-I", "ctl1", "-n", NAMESPACE,
                           "-s", str(tmp_path / "sig")], input=payload("ctl1", COMMIT, BODY), capture_output=True)
    assert real.returncode == 0, real.stderr

    trust = NoteTrust(parse_nodes(allowed.read_text(), "trust/nodes"))
    assert trust.judge("ctl1", COMMIT, sealed, NOW) is None
    assert "bad signature" in str(trust.judge("ctl2", COMMIT, sealed, NOW))  # another node's ref
    assert "bad signature" in str(trust.judge("ctl1", "f" * 40, sealed, NOW))  # another commit
    assert "bad signature" in str(trust.judge("ctl1", COMMIT, {**sealed, "state": "failed"}, NOW))


def test_whose_unsigned_notes_count_under_each_policy(tmp_path: Path) -> None:
    key = key_of(tmp_path, "ed25519")
    listed = parse_nodes(public_line("ctl1", key), "trust/nodes")
    signed, migrating = NoteTrust(listed, SIGNED), NoteTrust(listed, UNSIGNED_ALLOWED)
    assert signed.judge("ctl2", COMMIT, BODY, NOW) == "unsigned, and ctl2 has no key in trust/nodes"
    assert migrating.judge("ctl2", COMMIT, BODY, NOW) is None  # not listed yet: counts while migrating
    assert migrating.judge("ctl1", COMMIT, BODY, NOW) == "unsigned"  # listed: must sign
    other = key_of(tmp_path, "ecdsa")
    # an upgraded agent that signs before it is listed counts as it did while the fleet moves over
    assert migrating.judge("ctl2", COMMIT, other.seal("ctl2", COMMIT, BODY), NOW) is None
    assert "not in the allowed signers" in str(signed.judge("ctl2", COMMIT, other.seal("ctl2", COMMIT, BODY), NOW))
    assert "bad signature" in str(migrating.judge("ctl1", COMMIT, other.seal("ctl1", COMMIT, BODY), NOW))
    assert note_policy(b"trust:\n  notes: unsigned-allowed\n") == UNSIGNED_ALLOWED
    assert note_policy(b"format: 1\n") == SIGNED and note_policy(b"trust: [") == SIGNED


def test_a_retired_key_past_its_valid_before_speaks_for_nobody(tmp_path: Path) -> None:
    key = key_of(tmp_path, "ed25519")
    line = f'ctl1 namespaces="{NAMESPACE}",valid-before="20200101" {key.public_line}'
    trust = NoteTrust(parse_nodes(line, "trust/nodes"))
    assert not trust.timeless
    assert "expired" in str(trust.judge("ctl1", COMMIT, key.seal("ctl1", COMMIT, BODY), NOW))


def test_a_note_key_others_can_read_or_with_a_passphrase_is_refused_in_one_line(tmp_path: Path) -> None:
    key = key_of(tmp_path, "ed25519")
    key.path.chmod(0o640)
    with pytest.raises(ConfigError, match="permissions 0640 for the note key are too open"):
        NoteKey.load(key.path)
    locked = tmp_path / "locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(locked)], check=True)
    with pytest.raises(ConfigError, match="not an unencrypted OpenSSH private key"):
        NoteKey.load(locked)
