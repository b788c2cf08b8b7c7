"""A forge that signs merges itself: which key a node trusts, and that key's rotation, tested
with merges GitHub really signed (tests/data/forge: GitHub's published web-flow keys and two of
its web-UI merges, one from before its key rotation of 2024-01-16, one from after).

Trusting GitHub's key trusts every merge GitHub's web UI makes for anyone who may press the
button; docs/operations/signed-merges.md says when that is acceptable and how to rotate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data" / "forge"
OLD_KEY = "5DE3E0509C47EA3CF04A42D34AEE18F83AFDEB23"  # expired 2024-01-16
NEW_KEY = "968479A1AFF927E37D1A566BB5690EEEBB952194"
MERGED_2023 = "4e0492377defddb90916296247dc4d0e5ffaae96"  # signed with the old key
MERGED_2024 = "bb5358741a14771a850a63e60ebd274768643625"  # signed with the new key


@pytest.fixture
def merges(tmp_path: Path) -> Path:
    repo = tmp_path / "github-merges"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    with (DATA / "github-merges.pack").open("rb") as pack:
        subprocess.run(["git", "index-pack", "--stdin"], stdin=pack, cwd=repo, check=True, capture_output=True)
    return repo


def keyring(tmp_path: Path, name: str, *fingerprints: str) -> Path:
    """A node's OpenPGP keyring holding GitHub's keys as published (or only the ones named)."""
    home = tmp_path / name
    home.mkdir(mode=0o700)
    published = (DATA / "github-web-flow.gpg").read_bytes()
    if fingerprints:  # an older copy of the file: exported from a full keyring
        full = keyring(tmp_path, f"{name}-full")
        published = subprocess.run(["gpg", "--homedir", str(full), "--batch", "--no-autostart", "--armor", "--export", *fingerprints],
                                   capture_output=True, check=True).stdout
    subprocess.run(["gpg", "--homedir", str(home), "--batch", "--no-autostart", "--import"], input=published, check=True,
                   capture_output=True)
    return home


def verify(repo: Path, commit: str, *trust: str) -> dict[str, object]:
    proc = subprocess.run([sys.executable, "-m", "reconciler", "verify", "--repo", str(repo), *trust, commit,
                           "-o", "json"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "LC_ALL": "C"})
    verdicts = json.loads(proc.stdout)
    assert len(verdicts) == 1 and proc.returncode == (0 if verdicts[0]["ok"] else 2), proc.stderr
    return dict(verdicts[0])


def test_a_merge_made_in_githubs_web_ui_verifies_under_githubs_published_key(merges: Path, tmp_path: Path) -> None:
    v = verify(merges, MERGED_2024, "--gpg-home", str(keyring(tmp_path, "node")))
    assert v["ok"] and v["format"] == "openpgp"
    assert v["fingerprint"] == NEW_KEY and v["principal"] == "GitHub <noreply@github.com>"


def test_githubs_rotation_a_merge_signed_before_it_is_refused_now_and_an_old_keyring_refuses_new_merges(
        merges: Path, tmp_path: Path) -> None:
    node = keyring(tmp_path, "node")
    # The node's clock judges the key, never the commit's date: the old key expired in 2024.
    old = verify(merges, MERGED_2023, "--gpg-home", str(node))
    assert not old["ok"] and old["reason"] == "KEY_EXPIRED" and old["fingerprint"] == OLD_KEY
    # A node provisioned before the rotation (the old key only) refuses every merge after it.
    stale = verify(merges, MERGED_2024, "--gpg-home", str(keyring(tmp_path, "stale", OLD_KEY)))
    assert not stale["ok"] and stale["reason"] == "UNTRUSTED_KEY"


def test_the_nodes_own_revocation_list_retires_githubs_key(merges: Path, tmp_path: Path) -> None:
    revoked = tmp_path / "revoked"
    revoked.write_text("# GitHub's web-flow key, as gpg --fingerprint prints it\n"
                       "9684 79A1 AFF9 27E3 7D1A  566B B569 0EEE BB95 2194\n")
    v = verify(merges, MERGED_2024, "--gpg-home", str(keyring(tmp_path, "node")), "--revoked", str(revoked))
    assert not v["ok"] and v["reason"] == "KEY_REVOKED"
