"""SOPS files as the real ``sops`` writes them, beyond a plain mapping of strings: an unquoted
date (``type:time``), several YAML documents in one file, an ``ssh-ed25519`` recipient. Each is
encrypted here with the real ``sops`` and read back by the node as ``sops -d`` reads it; and
``validate`` without a key refuses a file the nodes would refuse, naming the file.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyrage
import pytest
import yaml
from conftest import Deployment
from test_secrets import SOPS

from reconciler.agent import Agent
from reconciler.core.errors import BadInput
from reconciler.render.secrets import identities, open_files, unlock
from reconciler.repo.load import load_repo
from reconciler.repo.tree import open_tree
from reconciler.review.diff import validate_tree
from reconciler.settings import SecretsConfig


def age_key(tmp_path: Path, name: str = "node") -> tuple[Path, str]:
    """An age identity file, as provisioned on a node, and its public key."""
    identity = pyrage.x25519.Identity.generate()
    path = tmp_path / f"{name}.agekey"
    path.write_text(f"{identity}\n")
    path.chmod(0o600)
    return path, str(identity.to_public())


def ssh_key(tmp_path: Path, name: str = "id_ed25519", passphrase: str = "") -> tuple[Path, str]:
    """A real ssh-keygen ed25519 key: the private key file and its public line (with a comment)."""
    path = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", f"ops@{name}", "-f", str(path)],
                   check=True)
    return path, (tmp_path / f"{name}.pub").read_text().strip()


def seal(tmp_path: Path, deployment: Deployment, rel: str, plain: str, *recipients: str) -> None:
    """What an operator does: write the plain file and ``sops --encrypt`` it to ``recipients``
    (outside the repo, whose .sops.yaml has rules for its own files only), then commit it in."""
    scratch = tmp_path / "seal"
    scratch.mkdir(exist_ok=True)
    (scratch / "file.yaml").write_text(plain)
    done = subprocess.run([SOPS or "sops", "--encrypt", "--in-place", "--age", ",".join(recipients), "file.yaml"],
                          cwd=scratch, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    deployment.write(rel, (scratch / "file.yaml").read_text())


def sops_d(deployment: Deployment, rel: str, **env: str) -> str:
    """``sops -d`` of a repo file, as the operator runs it with their key."""
    done = subprocess.run([SOPS or "sops", "--decrypt", rel], cwd=deployment.work, capture_output=True, text=True,
                          env={**os.environ, "SOPS_AGE_KEY_FILE": os.devnull, **env})
    assert done.returncode == 0, done.stderr
    return done.stdout


def applied_files(state: Path, name: str) -> list[Path]:
    return [p for p in state.rglob(name) if p.is_file()]


def opened(deployment: Deployment, key: Path) -> dict[str, dict[str, Any]]:
    repo = load_repo(open_tree(deployment.work, None))
    return unlock(repo.secret_files, identities(key.read_text(), str(key)))


def test_an_unquoted_date_sops_encrypts_as_time_reads_as_sops_d_prints_it(
        deployment: Deployment, tmp_path: Path) -> None:
    key, public = age_key(tmp_path)
    seal(tmp_path, deployment, "secrets/cert.yaml",
         "expires: 2027-01-01\n"
         "renewed: 2026-05-04T10:20:30.25+02:00\n"
         "windows:\n  - 2026-12-24 08:00:00\n"
         "issued_unencrypted: 2026-01-01\n"  # left plain by sops, still under its MAC
         "issuer: ops\n", public)
    assert "type:time" in deployment.read("secrets/cert.yaml")

    values = opened(deployment, key)["secrets/cert.yaml"]

    # The text sops -d prints for each value (BaseLoader: every scalar as the text it is).
    printed = yaml.load(sops_d(deployment, "secrets/cert.yaml", SOPS_AGE_KEY_FILE=str(key)), Loader=yaml.BaseLoader)
    assert values == printed
    assert values["expires"] == "2027-01-01T00:00:00Z"
    assert values["renewed"] == "2026-05-04T10:20:30.25+02:00"


def test_a_multi_document_file_reads_as_the_names_of_all_its_documents(
        deployment: Deployment, tmp_path: Path) -> None:
    key, public = age_key(tmp_path)
    seal(tmp_path, deployment, "secrets/split.yaml", "db_user: app\ndb_port: 5432\n---\napi_token: t0k-9f8e\n", public)

    values = opened(deployment, key)["secrets/split.yaml"]

    printed = list(yaml.safe_load_all(sops_d(deployment, "secrets/split.yaml", SOPS_AGE_KEY_FILE=str(key))))
    assert printed == [{"db_user": "app", "db_port": 5432}, {"api_token": "t0k-9f8e"}]
    assert values == {"db_user": "app", "db_port": 5432, "api_token": "t0k-9f8e"}

    # One name in two documents would be two values for one secrets.<name>: refused, located.
    seal(tmp_path, deployment, "secrets/split.yaml", "api_token: a\n---\napi_token: b\n", public)
    _, problems, _, _ = validate_tree(open_tree(deployment.work, None))
    assert [str(p) for p in problems] == [
        "secrets/split.yaml: secret api_token is defined in documents 1 and 2 of the file"]


def test_an_ssh_ed25519_recipient_decrypts_with_the_ssh_private_key(
        deployment: Deployment, tmp_path: Path, agents: Callable[..., Agent]) -> None:
    ctl1, ctl1_public = ssh_key(tmp_path, "ctl1")
    others = {n: age_key(tmp_path, n) for n in ("ctl2", "ctl3")}
    seal(tmp_path, deployment, "secrets/controllers.yaml", "db_password: ssh-Pw-4c2b9d1e\n",
         ctl1_public, *(public for _, public in others.values()))
    inv = yaml.safe_load(deployment.read("inventory.yaml"))
    inv["nodes"]["ctl1"]["vars"]["age_recipient"] = ctl1_public
    for node, (_, public) in others.items():
        inv["nodes"][node]["vars"]["age_recipient"] = public
    deployment.write("inventory.yaml", yaml.safe_dump(inv, sort_keys=False))

    # A reviewer, without a key, sees ctl1 reads the file through its ssh public key.
    _, problems, nodes, _ = validate_tree(open_tree(deployment.work, None))
    assert problems == [] and nodes == len(inv["nodes"])
    # ctl1 holds only its ssh key, as sops -d reads it with that key.
    repo = load_repo(open_tree(deployment.work, None))
    on_ctl1 = open_files(repo.secret_files, identities(ctl1.read_text(), str(ctl1)))
    printed = yaml.safe_load(sops_d(deployment, "secrets/controllers.yaml", SOPS_AGE_SSH_PRIVATE_KEY_FILE=str(ctl1)))
    assert dict(on_ctl1["secrets/controllers.yaml"].values) == printed == {"db_password": "ssh-Pw-4c2b9d1e"}
    # Another ssh key is not a recipient: nothing opened.
    stranger, _ = ssh_key(tmp_path, "stranger")
    assert open_files(repo.secret_files, identities(stranger.read_text(), str(stranger))) == {}

    # ctl1's agent, its ssh key as its age identity, applies the commit.
    deployment.commit("db password encrypted to ctl1's ssh key")
    applied = agents("ctl1", deployment.url, secrets=SecretsConfig(ctl1)).reconcile_once()
    assert applied.exit_code == 0, applied.error
    live = applied_files(tmp_path / "nodes" / "ctl1", "db-auth.conf")
    assert live and all("ssh-Pw-4c2b9d1e" in p.read_text() for p in live)


def test_an_ssh_key_with_a_passphrase_is_refused_in_one_line_without_the_key(tmp_path: Path) -> None:
    key, _ = ssh_key(tmp_path, "locked", passphrase="correct horse")

    with pytest.raises(BadInput) as err:
        identities(key.read_text(), str(key))

    message = str(err.value)
    assert str(key) in message and "passphrase" in message and "\n" not in message
    assert "OPENSSH" not in message and key.read_text().splitlines()[1][:20] not in message


BROKEN = {
    # what is changed in a file sops wrote -> what validate says of it
    "type:str]": ("type:complex]", "a value of type complex"),
    "    version: ": ("    version: 4.0.0\n    x_version: ", "written by sops 4.0.0"),
    "    unencrypted_suffix: _unencrypted\n": ("    unencrypted_comment_regex: keep\n",
                                              "unencrypted_comment_regex"),
    "- recipient: age1": ("- recipient: ssh-dss AAAA\n          x: age1", "'ssh-dss AAAA' is not an age recipient"),
}


def test_validate_without_a_key_refuses_each_file_the_nodes_would_refuse(
        deployment: Deployment, tmp_path: Path) -> None:
    key, public = age_key(tmp_path)
    for n, (old, (new, _)) in enumerate(BROKEN.items()):
        seal(tmp_path, deployment, f"secrets/broken{n}.yaml", f"secret{n}: value-{n}\n", public)
        deployment.edit(f"secrets/broken{n}.yaml", old, new)
    # a plain value where sops writes ENC[...]: what a hand edit without the key leaves
    seal(tmp_path, deployment, "secrets/plain.yaml", "pasted: x\n", public)
    text = deployment.read("secrets/plain.yaml")
    deployment.write("secrets/plain.yaml", "pasted: 1234\n" + text.split("\n", 1)[1])

    _, problems, _, _ = validate_tree(open_tree(deployment.work, None))

    said = {p.file: p.message for p in problems}
    assert sorted(said) == [*(f"secrets/broken{n}.yaml" for n in range(len(BROKEN))), "secrets/plain.yaml"]
    for n, (_, what) in enumerate(BROKEN.values()):
        assert what in said[f"secrets/broken{n}.yaml"], said
    assert "pasted: a plain value where SOPS writes ENC[...]" in said["secrets/plain.yaml"]
    assert all("\n" not in m and "value-" not in m for m in said.values())
