"""The trust gate's own reading, bounded: what a pusher without the signing key can make every
node read before a signature is checked, and what a revoked CA still signs.

Real git repos, real ssh-keygen keys and certificates, a real agent on a real remote.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pygit2
import pytest
from conftest import Deployment, SigningKey, git, make_key, small_deployment

from reconciler.agent import Agent
from reconciler.core.errors import RepoLimit
from reconciler.core.limits import LIMITS, MiB
from reconciler.trust.root import Policy, TrustError, load_root
from reconciler.trust.verify import Gate, repo_policy, tree_file

FILES = {
    "reconciler.yaml": "format: 1\nname: bounds\n",
    "inventory.yaml": "groups:\n  all: {services: []}\nnodes:\n  n1: {groups: [all]}\n",
}


def big_yaml(size: int, head: str = "format: 1\nname: bounds\n") -> str:
    """A valid reconciler.yaml of ``size`` bytes: ``head`` and then one long comment."""
    return head + "#" + "x" * (size - len(head) - 2) + "\n"


def commit_file(work: Path, rel: str, text: str, key: SigningKey | None) -> str:
    (work / rel).parent.mkdir(parents=True, exist_ok=True)
    (work / rel).write_text(text)
    git("add", "-A", cwd=work)
    sign = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={key.key}", "commit", "-S"] if key else ["commit"]
    git(*sign, "-q", "--allow-empty", "-m", f"{rel}: {len(text)} bytes", cwd=work)
    return git("rev-parse", "HEAD", cwd=work)


# ------------------------------------------------------------------ a huge reconciler.yaml
def test_a_head_whose_reconciler_yaml_is_past_the_file_limit_is_refused_unread(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]
) -> None:
    dep: Deployment = small_deployment(tmp_path, merge_key, FILES)
    node = agents("n1", dep.url)
    good = node.reconcile_once()
    assert good.exit_code == 0, good
    # Signed by the trusted key even: a file no node may read is refused before anything of it is.
    dep.write("reconciler.yaml", big_yaml(11 * MiB))
    huge = dep.commit("an 11 MiB reconciler.yaml")

    result = node.reconcile_once()

    assert result.exit_code == 2 and result.report is not None, result
    assert (result.report.state, result.report.reason) == ("refused", "REPO_LIMIT")
    assert f"{huge[:12]}:reconciler.yaml" in str(result.error) and str(11 * MiB) in str(result.error)
    assert "\n" not in str(result.error)
    assert node.ledger.mark().commit == good.commit  # the node keeps its last good commit
    note = dep.note("n1", huge)
    assert note is not None and note["state"] == "refused" and note["reason"] == "REPO_LIMIT"


def test_the_gate_reads_the_size_not_the_blob(tmp_path: Path, merge_key: SigningKey) -> None:
    work = tmp_path / "repo"
    git("init", "-q", "-b", "main", str(work))
    base = commit_file(work, "reconciler.yaml", "format: 1\n", merge_key)
    # unsigned: what anyone who can push may do; refused for its size (REPO_LIMIT), not as unsigned:
    # the size is asked before the signature, and before anything reads the blob
    huge = commit_file(work, "reconciler.yaml", big_yaml(11 * MiB), None)
    repo = pygit2.Repository(str(work))
    gate = Gate(load_root(merge_key.allowed_signers, None, None))

    with pytest.raises(TrustError) as info:
        gate.decide(repo, huge, base, repo_policy(repo, base, huge))

    assert info.value.reason == "REPO_LIMIT"
    assert [(v.commit, v.ok, v.reason) for v in info.value.verdicts] == [(huge, False, "REPO_LIMIT")]


def test_the_limit_is_the_repo_file_limit_and_a_file_under_it_still_reads(
    tmp_path: Path, merge_key: SigningKey
) -> None:
    work = tmp_path / "repo"
    git("init", "-q", "-b", "main", str(work))
    edge = commit_file(work, "reconciler.yaml", big_yaml(LIMITS.file_bytes), None)
    past = commit_file(work, "reconciler.yaml", big_yaml(LIMITS.file_bytes + 1), None)
    nine = commit_file(work, "reconciler.yaml", big_yaml(9 * MiB, "trust: {policy: every-commit}\n"), None)
    repo = pygit2.Repository(str(work))

    assert len(tree_file(repo, edge, "reconciler.yaml") or b"") == LIMITS.file_bytes
    with pytest.raises(RepoLimit) as info:
        tree_file(repo, past, "reconciler.yaml")
    assert str(info.value) == (f"{past[:12]}:reconciler.yaml: {LIMITS.file_bytes + 1} bytes, "
                               "larger than 10 MiB (repo limit)")
    assert info.value.exit_code == 2
    # A 9 MiB file is read, and what it asks for is honoured.
    assert repo_policy(repo, nine) is Policy.EVERY_COMMIT
    # The one past the limit asks for nothing (the gate refuses that head itself).
    assert repo_policy(repo, past) is Policy.HEAD


# ------------------------------------------------------------------ a revoked CA
def certificate(directory: Path, principal: str) -> tuple[SigningKey, str]:
    """A user key with a certificate from a new CA (``ssh-keygen -s``): the key to sign
    with (its certificate beside it, as git passes it to ``ssh-keygen -Y sign``), and the CA's
    fingerprint."""
    ca = make_key(directory, "ca")
    user = make_key(directory, "user", principal)
    subprocess.run(["ssh-keygen", "-q", "-s", str(ca.key), "-I", "user", "-n", principal, "-V", "-1h:+1h",
                    str(user.key) + ".pub"], check=True)
    cert = user.key.with_name("user-cert.pub")
    # Listed directly, as one exact certificate (no cert-authority line).
    user.allowed_signers.write_text(f'{principal} namespaces="git" {cert.read_text().strip()}\n')
    return SigningKey(cert, principal, user.allowed_signers), ca.fingerprint


@pytest.mark.parametrize("where", ["node", "repo"])
def test_a_revoked_ca_refuses_a_certificate_listed_directly(where: str, tmp_path: Path,
                                                            merge_key: SigningKey) -> None:
    cert, ca_fpr = certificate(tmp_path / "keys", merge_key.principal)
    work = tmp_path / "repo"
    git("init", "-q", "-b", "main", str(work))
    signers = merge_key.allowed_signers.read_text() + cert.allowed_signers.read_text()
    base = commit_file(work, "README", "base\n", merge_key)
    if where == "repo":  # a rotation, signed by the root in force, that revokes the CA
        commit_file(work, "trust/allowed_signers", signers, merge_key)
        commit_file(work, "trust/revoked", f"{ca_fpr}\n", merge_key)
    head = commit_file(work, "README", "signed with the certificate\n", cert)
    repo = pygit2.Repository(str(work))
    allowed, revoked = tmp_path / "allowed", tmp_path / "revoked"
    allowed.write_text(signers)
    revoked.write_text(f"{ca_fpr}\n" if where == "node" else "")

    # The certificate is trusted as listed...
    decision = Gate(load_root(allowed, None, None)).decide(repo, head, None)
    assert decision.signer is not None and decision.signer.ok
    # ...until its CA is revoked.
    gate = Gate(load_root(allowed, None, revoked))
    with pytest.raises(TrustError) as info:
        gate.decide(repo, head, base)
    assert info.value.reason == "KEY_REVOKED"
    assert [(v.commit, v.reason) for v in info.value.verdicts if not v.ok] == [(head, "KEY_REVOKED")]
    assert ca_fpr in str(info.value)
