"""Trust: a node applies only commits signed under its trust root, and only moving forward.

Real ssh-keygen keys and gpg keys made at run time, real signed git commits. For the SSH
cases, every verdict is checked against `ssh-keygen -Y verify` on the same signature.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pygit2
import pytest
from conftest import Deployment, SigningKey, git, make_key
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.agent import Agent
from reconciler.settings import TrustConfig
from reconciler.trust.commits import verify_commit
from reconciler.trust.root import Policy, TrustError, load_root
from reconciler.trust.verify import Gate, verify_range


def ssh_keygen_agrees(repo_dir: Path, commit: str, allowed: Path, accepted: bool) -> None:
    """`ssh-keygen -Y verify` must reach the same verdict as the agent on this commit."""
    repo = pygit2.Repository(str(repo_dir))
    c = repo.get(commit)
    try:
        sig, payload = c.gpg_signature  # type: ignore[union-attr]
    except (TypeError, ValueError):
        sig, payload = None, None
    if not sig:
        assert not accepted
        return
    with tempfile.NamedTemporaryFile() as f:
        f.write(sig)
        f.flush()
        proc = subprocess.run(
            ["ssh-keygen", "-Y", "verify", "-f", str(allowed), "-I", c.committer.email, "-n", "git",  # type: ignore[union-attr]
             "-s", f.name], input=payload, capture_output=True,
        )
    assert (proc.returncode == 0) == accepted, f"ssh-keygen says {proc.returncode}: {proc.stderr!r}"


def refusal(agent: Agent) -> str:
    result = agent.reconcile_once()
    assert result.exit_code == 2 and result.report is not None, result
    assert result.report.state == "refused"
    return result.report.reason


def test_unsigned_head_is_refused_noted_and_nothing_changes(deployment: Deployment,
                                                           agents: Callable[..., Agent]) -> None:
    cmp1 = agents("cmp1", deployment.url)
    good = cmp1.reconcile_once()
    assert good.exit_code == 0
    assert good.report is not None and good.report.signer is not None
    assert good.report.signer["principal"] == "merge@example.org"
    assert good.report.signer["fingerprint"] == deployment.key.fingerprint  # type: ignore[union-attr]
    pids = {o.name: o.pid for o in cmp1_observed(cmp1)}

    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    bad = deployment.commit("unsigned change", key=None)

    assert refusal(cmp1) == "UNSIGNED"
    note = deployment.note("cmp1", bad)
    assert note is not None and note["state"] == "refused" and note["reason"] == "UNSIGNED"
    assert {o.name: o.pid for o in cmp1_observed(cmp1)} == pids
    # A second poll neither re-judges nor re-notes, and still refuses.
    again = cmp1.reconcile_once()
    assert again.exit_code == 2 and again.report is None
    ssh_keygen_agrees(deployment.work, bad, deployment.key.allowed_signers, False)  # type: ignore[union-attr]


def cmp1_observed(agent: Agent) -> list:  # type: ignore[type-arg]
    from reconciler.drivers.observe import observe
    from reconciler.node.context import drivers_for

    return list(observe(agent.cfg.node, drivers_for(agent.cfg, None)).services)


def test_signed_merge_over_an_unsigned_commit(deployment: Deployment, agents: Callable[..., Agent],
                                              merge_key: SigningKey) -> None:
    # main:  C1 ---------- M (signed merge by the review system)
    #          \\          /
    # topic:    U (unsigned, the contributor's)
    strict = agents("ctl1", deployment.url, trust=TrustConfig(allowed_signers=merge_key.allowed_signers))
    merges = agents("ctl2", deployment.url, trust=TrustConfig(allowed_signers=merge_key.allowed_signers,
                                                               policy="first-parent"))
    for a in (strict, merges):
        assert a.reconcile_once().exit_code == 0
    git("checkout", "-q", "-b", "topic", cwd=deployment.work)
    deployment.edit("inventory.yaml", "token_ttl: 3600", "token_ttl: 1200")
    deployment.commit("contributor change", key=None, push=False)
    git("checkout", "-q", "main", cwd=deployment.work)
    git("-c", "gpg.format=ssh", "-c", f"user.signingkey={merge_key.key}", "merge", "-S", "--no-ff", "-q",
        "-m", "Merge topic (reviewed)", "topic", cwd=deployment.work)
    deployment.push()

    assert refusal(strict) == "UNSIGNED"
    result = merges.reconcile_once()
    assert result.exit_code == 0 and result.report is not None and result.report.state == "applied"


def test_force_push_back_to_an_older_signed_commit_is_refused_even_after_state_loss(
    deployment: Deployment, agents: Callable[..., Agent]
) -> None:
    import shutil

    c1 = git("rev-parse", "HEAD", cwd=deployment.work)
    node = agents("cmp2", deployment.url)
    node.reconcile_once()
    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    deployment.commit("kvm")
    assert node.reconcile_once().exit_code == 0

    deployment.push(c1, force=True)  # replay of an older, validly signed commit
    assert refusal(node) == "NOT_DESCENDANT"

    # The node's disk is replaced: the high-water mark comes back from its own notes.
    node.close()
    shutil.rmtree(node.cfg.state_dir)
    fresh = agents("cmp2", deployment.url)
    result = fresh.reconcile_once()
    assert result.exit_code == 2 and result.error is not None and result.error.reason == "NOT_DESCENDANT"


def test_a_rewind_is_refused_after_state_loss_when_both_notes_bear_the_same_second(
    deployment: Deployment, agents: Callable[..., Agent], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The notes' times are seconds: a fast node notes C1, then C2, then refuses the force-push
    back to C1 in one second. C2 is no longer on the branch, so the mirror cannot tell which
    came later; C2's note, which says the node refused C1 while running it, does."""
    import shutil

    import reconciler.node.run

    second = datetime.now(UTC).replace(microsecond=0)

    class SameSecond(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
            return second

    monkeypatch.setattr(reconciler.node.run, "datetime", SameSecond)  # every note's time
    c1 = git("rev-parse", "HEAD", cwd=deployment.work)
    node = agents("cmp2", deployment.url)
    node.reconcile_once()
    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    # The notes are read in the order of their commits' ids: C1's first, the case a tie went wrong.
    for attempt in range(200):
        c2 = deployment.commit(f"kvm ({attempt})", push=False)
        if c2 > c1:
            break
        git("reset", "-q", "--soft", "HEAD~1", cwd=deployment.work)
    assert c2 > c1
    deployment.push()
    assert node.reconcile_once().exit_code == 0
    deployment.push(c1, force=True)
    assert refusal(node) == "NOT_DESCENDANT"
    node.close()
    shutil.rmtree(node.cfg.state_dir)
    fresh = agents("cmp2", deployment.url)
    result = fresh.reconcile_once()
    assert result.exit_code == 2 and result.error is not None and result.error.reason == "NOT_DESCENDANT"


@pytest.mark.parametrize("case", ["outside", "wrong-principal", "expired-backdated", "not-yet-valid", "revoked",
                                  "revoked-as-public-key", "revoked-as-ssh-keygen-prints-it"])
def test_keys_the_root_does_not_accept(case: str, deployment: Deployment, agents: Callable[..., Agent],
                                       merge_key: SigningKey, tmp_path: Path) -> None:
    day = timedelta(days=1)
    now = datetime.now(UTC)
    stranger = make_key(tmp_path / "k", "stranger")
    trust = TrustConfig(allowed_signers=merge_key.allowed_signers)
    signer = stranger
    allowed = merge_key.allowed_signers
    expected = {"outside": "UNTRUSTED_KEY", "wrong-principal": "WRONG_PRINCIPAL",
                "expired-backdated": "KEY_EXPIRED", "not-yet-valid": "KEY_NOT_YET_VALID",
                "revoked": "KEY_REVOKED", "revoked-as-public-key": "KEY_REVOKED",
                "revoked-as-ssh-keygen-prints-it": "KEY_REVOKED"}[case]
    if case == "wrong-principal":
        allowed = tmp_path / "allowed"
        allowed.write_text(merge_key.allowed_signers.read_text() + f"alice@example.org {stranger.public}\n")
    elif case in ("expired-backdated", "not-yet-valid"):
        window = (f'valid-before="{(now - day).strftime("%Y%m%d%H%M%SZ")}"' if case == "expired-backdated"
                  else f'valid-after="{(now + day).strftime("%Y%m%d%H%M%SZ")}"')
        allowed = tmp_path / "allowed"
        allowed.write_text(merge_key.allowed_signers.read_text() +
                           f'merge@example.org namespaces="git",{window} {stranger.public}\n')
    elif case.startswith("revoked"):
        signer = merge_key
        revoked = tmp_path / "revoked"
        # The key as the operator has it at hand: its fingerprint, or its line from a .pub file.
        entry = {"revoked": merge_key.fingerprint, "revoked-as-public-key": merge_key.public,
                 "revoked-as-ssh-keygen-prints-it": subprocess.run(
                     ["ssh-keygen", "-l", "-f", str(merge_key.key)], capture_output=True, text=True, check=True,
                 ).stdout.strip()}[case]
        revoked.write_text(f"# leaked on the build host\n{entry}\n")
        trust = TrustConfig(allowed_signers=merge_key.allowed_signers, revoked=revoked)
    if allowed != merge_key.allowed_signers:
        trust = TrustConfig(allowed_signers=allowed)
    node = agents("cmp1", deployment.url, trust=trust)
    if not case.startswith("revoked"):
        assert node.reconcile_once().exit_code == 0

    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    if case == "expired-backdated":  # the committer date claims the key was still valid
        os.environ["GIT_COMMITTER_DATE"] = (now - 2 * day).isoformat()
    try:
        bad = deployment.commit(f"signed by {case}", key=signer)
    finally:
        os.environ.pop("GIT_COMMITTER_DATE", None)

    assert refusal(node) == expected
    if not case.startswith("revoked"):  # ssh-keygen has its own revocation format (KRL); ours is a fingerprint list
        ssh_keygen_agrees(deployment.work, bad, allowed, False)
    else:
        ssh_keygen_agrees(deployment.work, bad, allowed, True)


def test_trust_root_rotation_through_the_repo(deployment: Deployment, agents: Callable[..., Agent],
                                             merge_key: SigningKey, tmp_path: Path) -> None:
    new_key = make_key(tmp_path / "k", "merge-2026")
    node = agents("cmp1", deployment.url)
    assert node.reconcile_once().exit_code == 0

    # An outsider cannot rotate: the commit adding their key is not signed under the root.
    deployment.write("trust/allowed_signers", f"merge@example.org {new_key.public}\n")
    deployment.commit("rotate (forged)", key=new_key)
    assert refusal(node) == "UNTRUSTED_KEY"
    git("reset", "-q", "--hard", "HEAD~1", cwd=deployment.work)
    deployment.push(force=True)

    # The current root signs the rotation: the new key replaces the old one.
    fresh = agents("cmp2", deployment.url)
    assert fresh.reconcile_once().exit_code == 0
    deployment.write("trust/allowed_signers", f"merge@example.org namespaces=\"git\" {new_key.public}\n")
    deployment.commit("rotate the merge key", key=merge_key)
    assert fresh.reconcile_once().exit_code == 0
    assert fresh.gate.root.origin.startswith("repo@")
    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    deployment.commit("first change under the new key", key=new_key)
    assert fresh.reconcile_once().exit_code == 0
    deployment.edit("inventory.yaml", "hypervisor: kvm", "hypervisor: xen")
    deployment.commit("old key after rotation", key=merge_key)
    assert refusal(fresh) == "UNTRUSTED_KEY"
    # The rotated root survives a restart of the agent (kept in the state dir).
    fresh.close()
    again = agents("cmp2", deployment.url)
    assert again.gate.root.origin == fresh.gate.root.origin


@pytest.fixture
def gpg_homes(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A signer's and a node's GNUPGHOME; the gpg-agents they start are stopped after."""
    homes = (tmp_path / "gpg-signer", tmp_path / "gpg-node")
    for home in homes:
        home.mkdir(mode=0o700)
    yield homes
    for home in homes:
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"], capture_output=True)


def test_openpgp_signed_commits(deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path,
                                gpg_homes: tuple[Path, Path]) -> None:
    signer_home, node_home = gpg_homes
    env = {**os.environ, "GNUPGHOME": str(signer_home)}
    gpg = ["gpg", "--batch", "--passphrase", "", "--pinentry-mode", "loopback"]
    subprocess.run([*gpg, "--quick-gen-key", "Merge Bot <merge@example.org>", "ed25519", "sign", "never"],
                   env=env, check=True, capture_output=True)
    fpr = subprocess.run(["gpg", "--with-colons", "--list-keys"], env=env, capture_output=True,
                         text=True).stdout.split("fpr:::::::::")[1].split(":")[0]
    pub = subprocess.run(["gpg", "--armor", "--export", fpr], env=env, capture_output=True, check=True).stdout
    subprocess.run(["gpg", "--batch", "--import"], input=pub, env={**os.environ, "GNUPGHOME": str(node_home)},
                   check=True, capture_output=True)

    def commit_gpg(message: str) -> str:
        deployment.edit("inventory.yaml", "token_ttl: 3600", "token_ttl: 3601") if "first" in message else \
            deployment.write("NOTES.md", message)
        git("add", "-A", cwd=deployment.work)
        subprocess.run(["git", "-c", f"user.signingkey={fpr}", "commit", "-S", "-q", "-m", message],
                       cwd=deployment.work, env={**env, "GIT_COMMITTER_EMAIL": "merge@example.org",
                                                 "GIT_COMMITTER_NAME": "Merge Bot", "GIT_AUTHOR_NAME": "a",
                                                 "GIT_AUTHOR_EMAIL": "a@b"}, check=True)
        deployment.push()
        return git("rev-parse", "HEAD", cwd=deployment.work)

    c = commit_gpg("first gpg-signed change")
    trusted = agents("cmp1", deployment.url, trust=TrustConfig(gpg_home=node_home, policy="head"))
    result = trusted.reconcile_once()
    assert result.exit_code == 0 and result.report is not None and result.report.signer is not None
    assert result.report.signer["format"] == "openpgp" and result.report.signer["fingerprint"] == fpr
    empty_home = tmp_path / "gpg-empty"
    empty_home.mkdir(mode=0o700)
    untrusted = agents("cmp2", deployment.url, trust=TrustConfig(gpg_home=empty_home, policy="head"))
    assert refusal(untrusted) == "UNTRUSTED_KEY"

    # The key is revoked (its revocation certificate imported into the node's keyring).
    rev = subprocess.run([*gpg, "--gen-revoke", "--output", "-", fpr], env=env, capture_output=True,
                         input=b"y\n0\n\ny\n")
    cert = rev.stdout or (signer_home / "openpgp-revocs.d" / f"{fpr}.rev").read_bytes().replace(b":-----", b"-----")
    subprocess.run(["gpg", "--batch", "--import"], input=cert, env={**os.environ, "GNUPGHOME": str(node_home)},
                   capture_output=True)
    commit_gpg("second change, key now revoked")
    assert refusal(trusted) == "KEY_REVOKED"
    del c


def test_malformed_signature_on_a_commit(deployment: Deployment, merge_key: SigningKey) -> None:
    head = git("rev-parse", "HEAD", cwd=deployment.work)
    raw = git("cat-file", "commit", head, cwd=deployment.work)
    # Cut the armoured signature short, as a broken proxy or a tampering tool would.
    lines = raw.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("gpgsig "))
    end = next(i for i, line in enumerate(lines) if "END SSH SIGNATURE" in line)
    broken = "\n".join(lines[: start + 2] + [lines[end]] + lines[end + 1:])
    bad = subprocess.run(["git", "hash-object", "-t", "commit", "-w", "--stdin"], cwd=deployment.work,
                         input=broken, capture_output=True, text=True, check=True).stdout.strip()
    repo = pygit2.Repository(str(deployment.work))
    verdict = verify_commit(repo, bad, load_root(merge_key.allowed_signers, None, None), datetime.now(UTC))
    assert not verdict.ok and verdict.reason == "BAD_SIGNATURE"
    ssh_keygen_agrees(deployment.work, bad, merge_key.allowed_signers, False)


# -------------------------------------------------------------------- property
OPS = st.lists(st.sampled_from(["signed", "unsigned", "rewind", "poll"]), min_size=1, max_size=8)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, policy=st.sampled_from(list(Policy)))
def test_no_bad_commit_is_ever_accepted(ops: list[str], policy: Policy, merge_key: SigningKey) -> None:
    """Histories mixing signed, unsigned and rewound commits: the gate accepts a head exactly
    when it is a descendant of what it accepted before (or that commit) and every commit the
    policy covers is signed (the first head: when it is signed)."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        git("init", "-q", "-b", "main", cwd=work)
        sign = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={merge_key.key}", "commit", "-S"]
        git(*sign, "-q", "--allow-empty", "-m", "root", cwd=work)
        gate = Gate(load_root(merge_key.allowed_signers, None, None), policy)
        repo = pygit2.Repository(str(work))
        accepted: str | None = None

        def signed(commit: str) -> bool:
            return "\ngpgsig " in git("cat-file", "commit", commit, cwd=work)

        for i, op in enumerate(ops):
            if op == "signed":
                git(*sign, "-q", "--allow-empty", "-m", f"s{i}", cwd=work)
            elif op == "unsigned":
                git("commit", "-q", "--allow-empty", "-m", f"u{i}", cwd=work)
            elif op == "rewind":
                if git("rev-list", "--count", "HEAD", cwd=work) != "1":
                    git("reset", "-q", "--hard", "HEAD~1", cwd=work)
                continue
            head = git("rev-parse", "HEAD", cwd=work)
            if accepted is None:
                acceptable = signed(head)
            elif head != accepted and not repo.descendant_of(head, accepted):
                acceptable = False
            else:
                covered = git("rev-list", *(["--first-parent"] if policy is Policy.FIRST_PARENT else []),
                              f"{accepted}..{head}", cwd=work).split()
                if policy is Policy.HEAD:
                    covered = [head] if head != accepted else []
                acceptable = all(signed(c) for c in covered)
            try:
                decision = gate.decide(repo, head, accepted)
            except TrustError as exc:
                assert not acceptable, f"{ops[:i + 1]}: a good head refused: {exc}"
                continue
            assert acceptable, f"{ops[:i + 1]}: a bad head accepted"
            assert decision.head == head
            accepted = head


def test_the_repo_can_tighten_the_policy_but_never_loosen_it(deployment: Deployment, agents: Callable[..., Agent],
                                                              merge_key: SigningKey) -> None:
    lax = agents("cmp1", deployment.url, trust=TrustConfig(allowed_signers=merge_key.allowed_signers, policy="head"))
    strict = agents("cmp2", deployment.url, trust=TrustConfig(allowed_signers=merge_key.allowed_signers))
    deployment.edit("reconciler.yaml", "format: 1\n", "format: 1\ntrust:\n  policy: every-commit\n")
    deployment.commit("require every commit signed")
    for node in (lax, strict):
        assert node.reconcile_once().exit_code == 0
    deployment.write("NOTES.md", "unsigned\n")
    deployment.commit("unsigned", key=None, push=False)
    deployment.commit("signed on top")
    # The node asked for `head` only; the repo's every-commit wins.
    assert refusal(lax) == "UNSIGNED"

    git("reset", "-q", "--hard", "HEAD~2", cwd=deployment.work)
    deployment.edit("reconciler.yaml", "policy: every-commit", "policy: head")
    deployment.commit("try to loosen", push=False)
    deployment.write("NOTES.md", "unsigned again\n")
    deployment.commit("unsigned", key=None, push=False)
    deployment.commit("signed on top", push=False)
    deployment.push(force=True)
    assert refusal(strict) == "UNSIGNED"  # the node's own every-commit still applies


def test_cli_verify_prints_each_commit_and_signer(deployment: Deployment, merge_key: SigningKey) -> None:
    import json
    import sys

    first = git("rev-parse", "HEAD", cwd=deployment.work)
    deployment.write("NOTES.md", "x\n")
    unsigned = deployment.commit("unsigned", key=None)
    proc = subprocess.run(
        [sys.executable, "-m", "reconciler", "verify", "--repo", str(deployment.work), "--allowed-signers",
         str(merge_key.allowed_signers), "-o", "json", f"{first}~0..{unsigned}"], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    verdicts = json.loads(proc.stdout)
    assert [(v["commit"], v["ok"], v["reason"]) for v in verdicts] == [(unsigned, False, "UNSIGNED")]
    proc = subprocess.run(
        [sys.executable, "-m", "reconciler", "verify", "--repo", str(deployment.work), "--allowed-signers",
         str(merge_key.allowed_signers), "-o", "json", first], capture_output=True, text=True)
    assert proc.returncode == 0
    [v] = json.loads(proc.stdout)
    assert (v["principal"], v["fingerprint"], v["format"]) == ("merge@example.org", merge_key.fingerprint, "ssh")


@pytest.mark.parametrize(("option", "content", "message"), [
    ("--allowed-signers", b"merge@example.org ssh-ed25519 \xff\n", "not UTF-8 text"),
    ("--revoked", b"SHA256:\xff\n", "not UTF-8 text"),
    ("--allowed-signers", b"# the keys go here\n\n", "allowed signers: holds no keys (only blank or comment lines)"),
], ids=["binary-signers", "binary-revoked", "empty-signers"])
def test_a_trust_file_that_cannot_be_used_is_named_with_why(
    deployment: Deployment, merge_key: SigningKey, tmp_path: Path, option: str, content: bytes, message: str
) -> None:
    import sys

    bad = tmp_path / "trust-file"
    bad.write_bytes(content)
    given = {"--allowed-signers": str(merge_key.allowed_signers), option: str(bad)}
    flags = [word for pair in given.items() for word in pair]
    for where in (["--repo", str(deployment.work)],  # a reviewer's check
                  ["--node", "ctl1", "--remote", deployment.url, "--state-dir", str(tmp_path / "ctl1")]):
        proc = subprocess.run([sys.executable, "-m", "reconciler", "verify", *where, *flags, "HEAD"],
                              capture_output=True, text=True)
        assert (proc.returncode, proc.stderr) == (2, f"error: {bad}: {message} [BAD_CONFIG]\n")


@pytest.mark.parametrize("line", [
    "3AA5C34371567BD2",  # an OpenPGP long key id: names no key for certain
    "SHA256:2EYmUqx1nmW2XyZ",  # a fingerprint cut short in the paste
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBadKey",  # a public key that is not one
    "merge@example.org ssh-ed25519 AAAA",  # an allowed_signers line, principal and all
])
def test_a_revocation_that_names_no_key_is_refused_not_read_as_revoking_nothing(
    deployment: Deployment, merge_key: SigningKey, tmp_path: Path, line: str
) -> None:
    import sys

    revoked = tmp_path / "revoked"
    revoked.write_text(f"# leaked 2026-11-20\n{merge_key.fingerprint}\n{line}\n")
    proc = subprocess.run([sys.executable, "-m", "reconciler", "verify", "--repo", str(deployment.work),
                           "--allowed-signers", str(merge_key.allowed_signers), "--revoked", str(revoked), "HEAD"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"error: {revoked}:3: revoked keys: not a key fingerprint"), proc.stderr
    assert proc.stderr.count("\n") == 1


def test_a_revocation_list_the_node_adopted_before_these_checks_still_loads_without_its_bad_lines(
        caplog: pytest.LogCaptureFixture) -> None:
    from reconciler.trust.root import parse_revoked

    good = "SHA256:" + "A" * 43
    assert parse_revoked(f"3AA5C34371567BD2\n{good}\n", "state/revoked", strict=False) == {good}
    assert "state/revoked:1: revoked keys: not a key fingerprint" in caplog.text


def test_a_revocation_list_takes_openpgp_fingerprints_as_gpg_prints_them() -> None:
    from reconciler.trust.root import parse_revoked

    printed = "  0D69 E11F 12BD BA07 7B37  2642 6AE8 DB89 19C6 F80F  # gpg --fingerprint"
    v6 = "a" * 64
    assert parse_revoked(f"{printed}\n\n{v6}\n", "revoked") == {"0D69E11F12BDBA077B3726426AE8DB8919C6F80F",
                                                                 "A" * 64}


def test_a_rotation_whose_revocation_list_cannot_be_read_is_refused(
        deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey) -> None:
    node = agents("cmp1", deployment.url)
    assert node.reconcile_once().exit_code == 0
    deployment.write("trust/allowed_signers", merge_key.allowed_signers.read_text())
    deployment.write("trust/revoked", "3AA5C34371567BD2\n")  # a key id: would revoke nothing
    deployment.commit("rotate, revoking the build host's key", key=merge_key)
    result = node.reconcile_once()
    assert result.exit_code != 0 and result.error is not None
    assert result.error.reason == "BAD_TRUST_ROOT"
    assert "trust/revoked@" in str(result.error) and ":1: revoked keys: not a key fingerprint" in str(result.error)


def test_a_sealers_file_that_is_not_text_is_named(tmp_path: Path) -> None:
    from reconciler.core.errors import ConfigError

    sealers = tmp_path / "sealers"
    sealers.write_bytes(b"release-bot\xff\n")
    with pytest.raises(ConfigError, match=f"^{sealers}: not UTF-8 text$"):
        load_root(None, None, None, sealers)


# -------------------------------------------------------------------- branch binding
def bound(subject: str, branch: str) -> str:
    return f"{subject}\n\nReviewed-on: https://review.example.org/c/cloud/+/4711\nReconciler-Branch: {branch}\n"


def test_main_moved_onto_a_commit_signed_for_another_branch_is_refused(
    deployment: Deployment, agents: Callable[..., Agent]
) -> None:
    # main:        C1
    #                \
    # experiment:     E  (signed, "Reconciler-Branch: experiment")
    # Someone who can move main on the server, and holds no key, points main at E.
    node = agents("cmp1", deployment.url)
    assert node.reconcile_once().exit_code == 0
    git("checkout", "-q", "-b", "experiment", cwd=deployment.work)
    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    experiment = deployment.commit(bound("try kvm", "experiment"), push=False)
    deployment.push(experiment)

    assert refusal(node) == "WRONG_BRANCH"  # even though this node does not require bindings
    note = deployment.note("cmp1", experiment)
    assert note is not None and "signed for branch 'experiment', not 'main'" in str(note["error"])


def test_a_node_that_requires_bindings_applies_only_heads_bound_to_its_branch(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey
) -> None:
    node = agents("cmp1", deployment.url, trust=TrustConfig(allowed_signers=merge_key.allowed_signers,
                                                            require_branch_binding=True))
    assert refusal(node) == "BRANCH_UNBOUND"  # the initial commit names no branch

    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    main = deployment.commit(bound("kvm", "main"))

    result = node.reconcile_once()
    assert result.exit_code == 0 and result.commit == main
    assert result.report is not None and result.report.state == "applied"


def test_the_repo_can_require_bindings_and_cannot_drop_the_requirement_unbound(
    deployment: Deployment, agents: Callable[..., Agent]
) -> None:
    node = agents("cmp1", deployment.url)
    deployment.edit("reconciler.yaml", "format: 1\n", "format: 1\ntrust:\n  require_branch_binding: true\n")
    deployment.commit(bound("bind every head to its branch", "main"))
    assert node.reconcile_once().exit_code == 0

    deployment.edit("reconciler.yaml", "require_branch_binding: true", "require_branch_binding: false")
    deployment.commit("drop the binding requirement")  # signed, but names no branch

    assert refusal(node) == "BRANCH_UNBOUND"  # the requirement in force before it still holds


@pytest.mark.parametrize("second", ["experiment", "main"])
def test_a_head_bound_twice_is_refused_as_ambiguous(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey, second: str
) -> None:
    # A PR description ending in "Reconciler-Branch: main", the merge bot adding its own trailer:
    # which branch did the signer mean? Not for the node to guess, even when both say the same.
    node = agents("cmp1", deployment.url, trust=TrustConfig(allowed_signers=merge_key.allowed_signers,
                                                            require_branch_binding=True))
    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    head = deployment.commit(f"kvm\n\nReconciler-Branch: main\nReconciler-Branch: {second}\n")

    assert refusal(node) == "AMBIGUOUS_BINDING"
    note = deployment.note("cmp1", head)
    assert note is not None and note["state"] == "refused"
    assert str(note["error"]) == (f"commit {head[:12]}: ambiguous branch binding ('main', {second!r}): "
                                  "a head carries one 'Reconciler-Branch' trailer")


@pytest.mark.parametrize("message", [
    "subject only: Reconciler-Branch: main",
    "subject\n\nReconciler-Branch: main\n",
    "subject\n\nbody text\n\nReconciler-Branch:main\nreconciler-branch : experiment\n",
    "subject\n\nReconciler-Branch: main\nthis line is prose, so the paragraph holds no trailers\n",
    "subject\n\nSigned-off-by: A <a@example.org>\nprose\nReconciler-Branch: main\n",
    "subject\n\nReconciler-Seal: pushed by mistake,\n  reviewed in CHG-1234\nReconciler-Branch: main\n",
    "subject\n\nReconciler-Branch: main\n\nlast paragraph is prose\n",
])
def test_trailers_are_read_as_git_reads_them(message: str, tmp_path: Path) -> None:
    from reconciler.trust.commits import trailers

    out = subprocess.run(["git", "interpret-trailers", "--parse", "--no-divider"], input=message,
                         capture_output=True, text=True, check=True).stdout
    expected = [tuple(part.strip() for part in line.split(":", 1)) for line in out.splitlines()]
    assert trailers(message) == expected


# -------------------------------------------------------------------- seals
def sealers_file(tmp_path: Path, *principals: str) -> Path:
    path = tmp_path / "sealers"
    path.write_text("# who may seal unsigned commits\n" + "".join(f"{p}\n" for p in principals))
    return path


@pytest.mark.parametrize("sealer", ["merge@example.org", "security@example.org"], ids=["sealer", "not-a-sealer"])
def test_an_unsigned_commit_is_accepted_once_a_sealer_seals_it(
    sealer: str, deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey, tmp_path: Path
) -> None:
    # main:  C1 --- U (unsigned, pushed by mistake) --- S (signed: "Reconciler-Seal: ...")
    trust = TrustConfig(allowed_signers=merge_key.allowed_signers, sealers=sealers_file(tmp_path, sealer))
    node = agents("cmp1", deployment.url, trust=trust)
    c1 = node.reconcile_once().commit
    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    unsigned = deployment.commit("kvm, pushed without review", key=None)
    assert refusal(node) == "UNSIGNED"
    # The trust page's recipe (docs/trust.md), as a sealer runs it.
    git("-c", "gpg.format=ssh", "-c", f"user.signingkey={merge_key.key}", "commit", "-S", "-q", "--allow-empty",
        "-m", "Seal the unsigned kvm change", "--trailer", "Reconciler-Seal: reviewed in CHG-1234", cwd=deployment.work)
    deployment.push()
    seal = git("rev-parse", "HEAD", cwd=deployment.work)

    if sealer != "merge@example.org":
        assert refusal(node) == "UNSIGNED"
        return
    result = node.reconcile_once()
    assert result.exit_code == 0 and result.commit == seal
    assert result.report is not None and result.report.state == "applied"
    [u, s] = verify_range(node.source.repo, f"{c1}..{seal}", node.gate)  # what `reconciler verify` prints
    assert (u.commit, u.ok, u.reason) == (unsigned, True, "SEALED")
    assert u.message == f"sealed by {seal} (reviewed in CHG-1234)"
    assert (s.commit, s.ok, s.principal) == (seal, True, "merge@example.org")


@pytest.mark.parametrize("case", ["after-the-seal", "revoked-key", "seal-without-trailer", "changes-trust"])
def test_what_a_seal_never_vouches_for(case: str, tmp_path: Path, merge_key: SigningKey) -> None:
    work = tmp_path / "repo"
    git("init", "-q", "-b", "main", str(work))
    leaked = make_key(tmp_path / "k", "leaked")
    both = tmp_path / "allowed"
    both.write_text(merge_key.allowed_signers.read_text() + leaked.allowed_signers.read_text())
    revoked = tmp_path / "revoked"
    revoked.write_text(f"{leaked.fingerprint}\n")

    def commit(message: str, key: SigningKey | None) -> str:
        (work / "log").write_text((work / "log").read_text() + message if (work / "log").exists() else message)
        git("add", "-A", cwd=work)
        sign = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={key.key}", "commit", "-S"] if key else ["commit"]
        git(*sign, "-q", "-m", message, cwd=work)
        return git("rev-parse", "HEAD", cwd=work)

    base = commit("base", merge_key)
    seal = "\n\nReconciler-Seal: reviewed after the fact"
    if case == "after-the-seal":
        # base --- U1 --- S (seals U1) --- U2 --- T (signed, no seal)
        commit("u1", None)
        commit("s" + seal, merge_key)
        bad = commit("u2", None)
        commit("t", merge_key)
        expected = "UNSIGNED"
    elif case == "revoked-key":
        bad = commit("signed with the leaked key", leaked)
        commit("s" + seal, merge_key)
        expected = "KEY_REVOKED"
    elif case == "seal-without-trailer":
        bad = commit("u1", None)
        commit("s\n\nReviewed-on: CHG-1234", merge_key)
        expected = "UNSIGNED"
    else:
        (work / "trust").mkdir()
        (work / "trust" / "allowed_signers").write_text(leaked.allowed_signers.read_text())
        bad = commit("u1 hands the root to another key", None)
        commit("s" + seal, merge_key)
        expected = "UNSIGNED"
    head = git("rev-parse", "HEAD", cwd=work)
    gate = Gate(load_root(both, None, revoked, sealers_file(tmp_path, "merge@example.org")))

    with pytest.raises(TrustError) as info:
        gate.decide(pygit2.Repository(str(work)), head, base)

    assert info.value.reason == expected
    assert [v.commit for v in info.value.verdicts if not v.ok] == [bad]


SEAL_OPS = st.lists(st.sampled_from(["signed", "unsigned", "seal", "seal-by-non-sealer", "rewind"]),
                   min_size=1, max_size=8)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=SEAL_OPS)
def test_a_range_is_accepted_exactly_when_every_unsigned_commit_has_a_seal_after_it(
    ops: list[str], merge_key: SigningKey, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Linear histories: the gate accepts a new head iff it is signed and each unsigned commit
    since the last accepted one has, later in the range, a commit signed by a sealer (named here
    by key fingerprint) that carries Reconciler-Seal."""
    keys = tmp_path_factory.mktemp("seal-keys")
    dev = make_key(keys, "dev")  # a trusted signer, but not a sealer
    allowed = keys / "allowed"
    allowed.write_text(merge_key.allowed_signers.read_text() + dev.allowed_signers.read_text())
    sealers = keys / "sealers"
    sealers.write_text(f"{merge_key.fingerprint}\n")
    gate = Gate(load_root(allowed, None, None, sealers))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        git("init", "-q", "-b", "main", cwd=work)

        def commit(message: str, key: SigningKey | None) -> None:
            sign = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={key.key}", "commit", "-S"] if key else ["commit"]
            git(*sign, "-q", "--allow-empty", "-m", message, cwd=work)

        commit("root", merge_key)
        repo = pygit2.Repository(str(work))
        accepted = git("rev-parse", "HEAD", cwd=work)
        kinds = {accepted: "signed"}
        for i, op in enumerate(ops):
            if op == "rewind":
                if git("rev-list", "--count", "HEAD", cwd=work) != "1":
                    git("reset", "-q", "--hard", "HEAD~1", cwd=work)
                continue
            key = {"signed": merge_key, "unsigned": None, "seal": merge_key, "seal-by-non-sealer": dev}[op]
            commit(f"c{i}" + ("\n\nReconciler-Seal: reviewed" if op.startswith("seal") else ""), key)
            head = git("rev-parse", "HEAD", cwd=work)
            kinds[head] = op
            if not repo.descendant_of(head, accepted):
                continue
            span = git("rev-list", "--reverse", f"{accepted}..{head}", cwd=work).split()
            sealed_up_to = max((n for n, c in enumerate(span) if kinds[c] == "seal"), default=-1)
            expected = kinds[head] != "unsigned" and all(
                kinds[c] != "unsigned" or n < sealed_up_to for n, c in enumerate(span))
            try:
                gate.decide(repo, head, accepted)
                ok = True
            except TrustError:
                ok = False
            assert ok == expected, f"{[kinds[c] for c in span]}: accepted={ok}"
            if ok:
                accepted = head


def test_trust_settings_for_seals_and_bindings_are_read_and_checked(tmp_path: Path) -> None:
    from reconciler.core.errors import ConfigError
    from reconciler.settings import load_config

    cfg_file = tmp_path / "agent.yaml"
    cfg_file.write_text("node: cmp1\nremote: /srv/cloud.git\ntrust:\n  allowed_signers: /etc/r/allowed\n"
                        "  sealers: /etc/r/sealers\n  require-branch-binding: true\n")
    cfg = load_config(cfg_file, {})
    assert cfg.trust.sealers == Path("/etc/r/sealers") and cfg.trust.require_branch_binding is True
    cfg_file.write_text("node: cmp1\nremote: /srv/cloud.git\ntrust:\n  require_branch_binding: sometimes\n")
    with pytest.raises(ConfigError, match="require_branch_binding must be true or false"):
        load_config(cfg_file, {})
    missing = tmp_path / "no-such-sealers"
    with pytest.raises(ConfigError, match="cannot read sealers"):
        load_root(None, None, None, missing)
