"""From nothing to a node converging: ``reconciler init`` makes a deployment repo signed from its
first commit, ``reconciler node add`` puts a node's keys in it (its secrets re-encrypted with the
real sops), ``reconciler check`` says what a node's settings will meet. Real git, real
ssh-keygen, real sops, a real agent running the skeleton's service with the process driver.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import free_port, wait_for

from reconciler.agent import Agent
from reconciler.render.secrets import identities, open_files
from reconciler.repo.load import load_repo
from reconciler.repo.tree import open_tree
from reconciler.settings import SecretsConfig, TrustConfig

SOPS = Path(sys.executable).parent / "sops"


@dataclass(frozen=True)
class Operator:
    """The operator's machine: a HOME of its own (no global git config), the repo, its keys,
    and the bare remote the nodes pull from."""

    home: Path
    repo: Path
    keys: Path
    bare: Path

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "HOME": str(self.home), "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}

    @property
    def url(self) -> str:
        return f"file://{self.bare}"

    def cli(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "reconciler", *args], capture_output=True, text=True,
                              timeout=120, env=self.env, cwd=cwd or self.home)

    def ok(self, *args: str, cwd: Path | None = None) -> str:
        done = self.cli(*args, cwd=cwd)
        assert done.returncode == 0, f"{args}: rc {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def git(self, *args: str) -> str:
        return subprocess.run(["git", "-C", str(self.repo), *args], check=True, capture_output=True, text=True,
                              env=self.env).stdout

    def push(self) -> None:
        self.git("push", "-q", self.url, "HEAD:refs/heads/main")


@pytest.fixture
def operator(tmp_path: Path) -> Operator:
    """``reconciler init`` run on a new operator's machine; the hello port moved to a free one
    (all of a test's nodes share this machine)."""
    op = Operator(tmp_path / "home", tmp_path / "home" / "cloud", tmp_path / "home" / "keys", tmp_path / "cloud.git")
    op.home.mkdir()
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(op.bare)], check=True)
    said = op.ok("init", str(op.repo), "--keys-dir", str(op.keys), "--email", "ops@example.org")
    assert f"{op.keys / 'operator.agekey'}" in said and "keep it safe" in said
    inventory = op.repo / "inventory.yaml"
    inventory.write_text(inventory.read_text().replace("hello_port: 8080", f"hello_port: {free_port()}"))
    return op


def hello(op: Operator) -> str:
    port = yaml.safe_load((op.repo / "inventory.yaml").read_text())["vars"]["hello_port"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
        return str(r.read().decode())


def node_agent(op: Operator, agents: Callable[..., Agent], node: str) -> Agent:
    """The node as `node add` told the operator to provision it: the repo's trust root copied,
    its note key and age identity from the keys dir."""
    keys = op.keys / "nodes" / node
    root = keys / "allowed_signers"
    root.write_text((op.repo / "trust" / "allowed_signers").read_text())
    return agents(node, op.url, trust=TrustConfig(allowed_signers=root), note_key=keys / "note_key",
                  secrets=SecretsConfig(keys / "age.key"))


def test_init_makes_a_signed_repo_that_validates_and_its_node_converges(
        operator: Operator, agents: Callable[..., Agent]) -> None:
    op = operator
    # Signed by the key the trust root names, as git itself checks it (the repo's own config).
    op.git("verify-commit", "HEAD")
    assert op.git("config", "--local", "gpg.format").strip() == "ssh"
    assert "ops@example.org namespaces=\"git\" ssh-ed25519 " in (op.repo / "trust" / "allowed_signers").read_text()
    assert "age1" in (op.repo / ".sops.yaml").read_text()
    op.ok("validate", "--repo", str(op.repo))

    op.ok("node", "add", "node1", "--commit", "--keys-dir", str(op.keys / "nodes"), cwd=op.repo)
    op.git("verify-commit", "HEAD")
    op.push()
    result = node_agent(op, agents, "node1").reconcile_once()

    assert result.exit_code == 0, result
    wait_for(lambda: "Hello from reconciler (node1)" in hello(op), what="hello answering on node1")


def test_init_refuses_a_directory_that_is_not_empty(tmp_path: Path) -> None:
    (tmp_path / "cloud").mkdir()
    (tmp_path / "cloud" / "notes.txt").write_text("mine\n")
    op = Operator(tmp_path, tmp_path / "cloud", tmp_path / "keys", tmp_path / "x.git")

    done = op.cli("init", str(op.repo), "--keys-dir", str(op.keys))

    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "not empty" in done.stderr
    assert not (op.keys).exists() and (tmp_path / "cloud" / "notes.txt").read_text() == "mine\n"


def test_node_add_reencrypts_the_secrets_and_the_new_node_converges_with_them(
        operator: Operator, agents: Callable[..., Agent]) -> None:
    op = operator
    nodes = op.keys / "nodes"
    op.ok("node", "add", "node1", "--keys-dir", str(nodes), "--commit", cwd=op.repo)
    # The operator adds a secret (sops encrypts it to .sops.yaml's recipients: the operator and
    # node1) and the service reads it.
    (op.repo / "secrets").mkdir()
    (op.repo / "secrets" / "web.yaml").write_text("token: tok-Pw-5e1d0c9b\n")
    subprocess.run([str(SOPS), "--encrypt", "--in-place", "secrets/web.yaml"], cwd=op.repo, check=True,
                   capture_output=True, env=op.env)
    template = op.repo / "services" / "hello" / "templates" / "hello.toml.j2"
    template.write_text(template.read_text().replace("({{ node }})", "({{ node }}) {{ secrets.token }}"))
    op.git("add", "-A")
    op.git("commit", "-q", "-m", "the token")

    said = op.ok("node", "add", "n2", "--keys-dir", str(nodes), "--age-identity",
                 str(op.keys / "operator.agekey"), "--git-path", "/srv/git/cloud.git", cwd=op.repo)

    # Staged for review, not committed; the git server's lines for n2's own notes ref.
    assert "git diff --cached" in said and op.git("status", "--porcelain").startswith("M ")
    public = (nodes / "n2" / "note_key.pub").read_text().split()[1]
    assert "RW+ refs/notes/reconciler/n2$ = n2" in said
    assert f'command="/usr/local/lib/reconciler/node-shell n2 /srv/git/cloud.git",restrict ssh-ed25519 {public} n2' \
        in said
    assert f'n2 namespaces="reconciler-note" ssh-ed25519 {public}' in (op.repo / "trust" / "nodes").read_text()
    op.ok("validate", "--repo", str(op.repo))
    # n2 opens the secret with its own key, through the project's decryption.
    key = nodes / "n2" / "age.key"
    repo = load_repo(open_tree(op.repo, None))
    opened = open_files(repo.secret_files, identities(key.read_text(), str(key)))
    assert opened["secrets/web.yaml"].values == {"token": "tok-Pw-5e1d0c9b"}

    op.git("commit", "-q", "-m", "Add node n2")  # signed: init set commit.gpgsign in the repo
    op.git("verify-commit", "HEAD")
    op.push()
    result = node_agent(op, agents, "n2").reconcile_once()

    assert result.exit_code == 0, result
    wait_for(lambda: "(n2) tok-Pw-5e1d0c9b" in hello(op), what="hello answering on n2 with the secret")


def test_node_add_refuses_a_node_listed_already_and_an_unknown_group(operator: Operator) -> None:
    op = operator
    op.ok("node", "add", "node1", "--keys-dir", str(op.keys / "nodes"), cwd=op.repo)

    again = op.cli("node", "add", "node1", "--keys-dir", str(op.keys / "nodes"), cwd=op.repo)
    group = op.cli("node", "add", "n3", "--group", "dbs", "--keys-dir", str(op.keys / "nodes"), cwd=op.repo)

    assert again.returncode == 2 and "already has a key in trust/nodes" in again.stderr
    assert group.returncode == 2 and "--group dbs: no such group" in group.stderr


@pytest.fixture
def checked(operator: Operator) -> Iterator[tuple[Operator, list[str]]]:
    """node1 added and pushed; the settings a node would have, as flags."""
    op = operator
    op.ok("node", "add", "node1", "--keys-dir", str(op.keys / "nodes"), "--commit", cwd=op.repo)
    op.push()
    keys = op.keys / "nodes" / "node1"
    (keys / "allowed_signers").write_text((op.repo / "trust" / "allowed_signers").read_text())
    yield op, ["check", "--node", "node1", "--remote", op.url, "--state-dir", str(op.home / "state"),
               "--allowed-signers", str(keys / "allowed_signers"), "--note-key", str(keys / "note_key"),
               "--age-identity", str(keys / "age.key")]


def test_check_passes_on_a_node_set_up_as_node_add_says(checked: tuple[Operator, list[str]]) -> None:
    op, args = checked

    done = op.cli(*args, "-o", "json")

    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    status = {c["name"]: c["status"] for c in report["checks"]}
    assert report["ok"] is True and report["node"] == "node1"
    for name in ("trust root", "note key", "age identity", "remote", "signed head", "inventory", "trust/nodes",
                 "age recipient", "driver process", "state dir", "clock"):
        assert status[name] == "ok", (name, report)
    assert not (op.home / "state").exists()  # changes nothing


def test_check_says_each_failure_with_what_to_do(checked: tuple[Operator, list[str]], tmp_path: Path) -> None:
    op, args = checked
    identity = op.keys / "nodes" / "node1" / "age.key"
    identity.chmod(0o644)
    # A head signed by a key the node does not trust.
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    op.git("-c", f"user.signingkey={stranger}", "commit", "-q", "--allow-empty", "-m", "not ours")
    op.push()

    done = op.cli(*args)

    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert any(line.startswith("FAIL  age identity") and "too open" in line for line in lines), done.stdout
    assert any(line.startswith("FAIL  signed head") and "is not in the allowed signers" in line for line in lines), done.stdout
    assert "-> an age key readable by its owner only: chmod 600" in done.stdout
    assert "-> sign the branch with a key of the trust root" in done.stdout
    assert any(line.startswith("ok    remote") for line in lines)


def test_check_of_bad_settings_is_exit_2(checked: tuple[Operator, list[str]]) -> None:
    op, args = checked
    bad = [a if not a.startswith("file://") else "htps://git.example.org/cloud.git" for a in args]

    done = op.cli(*bad)

    assert done.returncode == 2 and "--remote" in done.stderr and done.stdout == ""


# Review of issue 38's onboarding: node add checks everything before its first write and is all
# or nothing, says what sops gives each file, follows no symlink out of the repo; init keeps
# its keys out of the commit; check says an unexpected error as one line and runs the rest.


def encrypt(op: Operator, name: str, text: str) -> Path:
    path = op.repo / "secrets" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    subprocess.run([str(SOPS), "--encrypt", "--in-place", f"secrets/{name}"], cwd=op.repo, check=True,
                   capture_output=True, env=op.env)
    return path


def stranger_age_key(path: Path) -> str:
    """An age identity nobody gave the repo, and its recipient."""
    import pyrage

    key = pyrage.x25519.Identity.generate()
    path.write_text(f"{key}\n")
    path.chmod(0o600)
    return str(key.to_public())


def test_node_add_checks_the_operator_identity_before_it_writes_anything(operator: Operator, tmp_path: Path) -> None:
    op = operator
    nodes = op.keys / "nodes"
    encrypt(op, "web.yaml", "token: tok-1\n")
    op.git("add", "-A")
    op.git("commit", "-q", "-m", "a secret")
    stranger = tmp_path / "stranger.agekey"
    stranger_age_key(stranger)

    without = op.cli("node", "add", "n2", "--keys-dir", str(nodes), cwd=op.repo)
    untrusted = op.cli("node", "add", "n2", "--keys-dir", str(nodes), "--age-identity", str(stranger), cwd=op.repo)

    assert without.returncode == 2 and without.stderr.count("\n") == 1 and "--age-identity" in without.stderr
    assert untrusted.returncode == 2 and "is not one of secrets/web.yaml's" in untrusted.stderr, untrusted.stderr
    # Nothing half-done: the repo as it was, no key made; the rerun with the identity works.
    assert op.git("status", "--porcelain") == ""
    assert not (nodes / "n2").exists() or not any((nodes / "n2").iterdir())
    op.ok("node", "add", "n2", "--keys-dir", str(nodes), "--age-identity", str(op.keys / "operator.agekey"),
          cwd=op.repo)


def test_node_add_puts_every_file_back_when_sops_fails_on_the_second(operator: Operator) -> None:
    op = operator
    nodes = op.keys / "nodes"
    encrypt(op, "a.yaml", "one: 1\n")
    b = encrypt(op, "b.yaml", "two: 2\n")
    # b's data key, as encrypted to the operator, damaged: sops cannot open it (a.yaml it can).
    lines = b.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if "BEGIN AGE ENCRYPTED FILE" in line) + 1
    lines[at] = lines[at][:30] + ("A" if lines[at][30] != "A" else "B") + lines[at][31:]
    b.write_text("".join(lines))
    op.git("add", "-A")
    op.git("commit", "-q", "-m", "two secrets")
    before = {p: p.read_bytes() for p in op.repo.rglob("*") if p.is_file() and ".git" not in p.parts}

    done = op.cli("node", "add", "n2", "--keys-dir", str(nodes), "--age-identity", str(op.keys / "operator.agekey"),
                  cwd=op.repo)

    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "sops updatekeys on secrets/b.yaml failed" in done.stderr, done.stderr
    after = {p: p.read_bytes() for p in op.repo.rglob("*") if p.is_file() and ".git" not in p.parts}
    assert after == before and op.git("status", "--porcelain") == ""  # a.yaml too, re-encrypted then put back
    assert not (nodes / "n2").exists() or not any((nodes / "n2").iterdir())


def test_node_add_refuses_recipients_the_rule_would_add_besides_the_node(operator: Operator, tmp_path: Path) -> None:
    op = operator
    nodes, identity = op.keys / "nodes", str(op.keys / "operator.agekey")
    mine = (op.keys / "operator.agekey").read_text().split("public key: ")[1].split()[0]
    encrypt(op, "web.yaml", "token: tok-1\n")
    # Someone slipped a recipient into the rule after the secret was encrypted.
    slipped = stranger_age_key(tmp_path / "slipped.agekey")
    sops_yaml = op.repo / ".sops.yaml"
    sops_yaml.write_text(sops_yaml.read_text().replace(f"age: {mine}", f"age: {mine},{slipped}"))
    op.git("add", "-A")
    op.git("commit", "-q", "-m", "a secret, and a recipient more")

    refused = op.cli("node", "add", "n2", "--keys-dir", str(nodes), "--age-identity", identity, cwd=op.repo)

    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert f"secrets/web.yaml: sops updatekeys would also encrypt it to {slipped}" in refused.stderr
    assert op.git("status", "--porcelain") == ""

    said = op.ok("node", "add", "n2", "--keys-dir", str(nodes), "--age-identity", identity, "--yes", cwd=op.repo)

    n2 = (nodes / "n2" / "age.key").read_text().split("public key: ")[1].split()[0]
    assert f"re-encrypted secrets/web.yaml (sops updatekeys):\n  was: {mine}\n  now: " in said, said
    now = said.split("  now: ")[1].splitlines()[0].split(", ")
    assert sorted(now) == sorted([mine, slipped, n2])


def test_node_add_refuses_files_that_lead_out_of_the_repo(operator: Operator, tmp_path: Path) -> None:
    op = operator
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "inventory.yaml").write_text((op.repo / "inventory.yaml").read_text())
    (op.repo / "inventory.yaml").unlink()
    (op.repo / "inventory.yaml").symlink_to(outside / "inventory.yaml")

    linked = op.cli("node", "add", "n2", "--keys-dir", str(op.keys / "nodes"), cwd=op.repo)

    assert linked.returncode == 2 and linked.stderr.count("\n") == 1, linked.stderr
    assert "inventory.yaml is a symlink" in linked.stderr
    assert "n2" not in (outside / "inventory.yaml").read_text()

    (op.repo / "inventory.yaml").unlink()
    (op.repo / "inventory.yaml").write_text((outside / "inventory.yaml").read_text())
    (op.repo / "trust").rename(outside / "trust")
    (op.repo / "trust").symlink_to(outside / "trust")
    moved = op.cli("node", "add", "n2", "--keys-dir", str(op.keys / "nodes"), cwd=op.repo)

    assert moved.returncode == 2 and moved.stderr.count("\n") == 1, moved.stderr
    assert "trust/nodes resolves outside the repo" in moved.stderr
    assert "n2" not in (outside / "trust" / "nodes").read_text()


def test_a_failing_git_command_is_named_with_the_repo(operator: Operator) -> None:
    op = operator
    (op.keys / "operator_ed25519").unlink()  # commit.gpgsign: git cannot sign any more

    done = op.cli("node", "add", "node1", "--keys-dir", str(op.keys / "nodes"), "--commit", cwd=op.repo)

    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert f"git commit on {op.repo} failed: " in done.stderr and "staged" in done.stderr


def test_init_refuses_a_keys_dir_inside_the_new_repo(tmp_path: Path) -> None:
    op = Operator(tmp_path, tmp_path / "cloud", tmp_path / "cloud" / ".keys", tmp_path / "x.git")

    done = op.cli("init", str(op.repo), "--keys-dir", str(op.keys))

    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--keys-dir" in done.stderr, done.stderr
    assert not op.keys.exists() and not (op.repo / ".git").exists()


def test_check_says_an_unexpected_error_as_its_line_and_runs_the_rest(checked: tuple[Operator, list[str]]) -> None:
    op, args = checked
    at = args.index("--state-dir") + 1
    args = [*args[:at], str(op.home / ("x" * 300) / "state"), *args[at + 1:]]  # a name the OS refuses

    done = op.cli(*args)

    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("FAIL  state dir") and "internal error in check state dir: OSError:" in line
               for line in lines), done.stdout + done.stderr
    assert any(line.startswith("ok    clock") for line in lines) and any(line.startswith("ok    remote")
                                                                         for line in lines)
