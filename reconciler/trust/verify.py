"""Trust: act only on commits signed under the node's trust root, and only moving forward.

The trust root lives on the node, never in the branch it protects: an SSH allowed-signers
file (git's format), an OpenPGP keyring (its own GNUPGHOME), and a revocation list. The repo
may rotate the SSH part through ``trust/allowed_signers`` and ``trust/revoked``; a rotation is
honoured only from a commit that itself verified under the root in force before it.

Which commits must be signed (policy, strictest wins between the node and the repo):

- ``every-commit``: every commit between the last applied one and the new head, all parents;
- ``first-parent``: the first-parent chain; a signed merge (made by the review system)
  vouches for its second parents;
- ``head``: the new head only.

Anti-rollback: the new head must descend from the high-water mark (the last commit this node
acted on). Key validity is judged by the agent's clock, never by a date inside the commit.

Two trailers in a signed message (git's trailer format; the message is under the signature):

- ``Reconciler-Branch: NAME`` binds a head to the branch it was signed for: a head bound to
  another branch is always refused, and a node or repo may require every head to be bound
  (a signature alone names no branch, so whoever can move a branch could move it onto a
  signed commit made for another);
- ``Reconciler-Seal: REASON``, from a principal in the node's ``sealers`` file, vouches for the
  unsigned (or badly signed) commits before it, so an accident on the branch is recovered
  without rewriting history. Never for a revoked key, a change of ``trust/``, or a commit after it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.core.errors import BadInput, ConfigError, ReconcilerError
from reconciler.trust import sshsig

if TYPE_CHECKING:
    import pygit2

# pygit2 (and ``tree``, which reads through it) is imported where a commit is read, not here:
# the node's trust root loads when the agent starts, and an idle agent never reads a commit
# (see ``source``).

TRUST_DIR = "trust"
BRANCH_TRAILER = "Reconciler-Branch"
SEAL_TRAILER = "Reconciler-Seal"
log = logging.getLogger("reconciler.agent")

UNSEALABLE = frozenset({"KEY_REVOKED"})
"""Failures no seal covers: a revoked key may have signed anything, reviewed or not."""


class Policy(StrEnum):
    HEAD = "head"
    FIRST_PARENT = "first-parent"
    EVERY_COMMIT = "every-commit"

    @property
    def strictness(self) -> int:
        return [Policy.HEAD, Policy.FIRST_PARENT, Policy.EVERY_COMMIT].index(self)

    @staticmethod
    def strictest(*policies: Policy) -> Policy:
        return max(policies, key=lambda p: p.strictness)


class TrustError(ReconcilerError):
    """A refusal: permanent for this head, like bad input (exit 2). Carries every verdict."""

    reason = "UNTRUSTED"
    exit_code = 2

    def __init__(self, message: str, reason: str, verdicts: Sequence[Verdict] = ()) -> None:
        super().__init__(message, reason=reason)
        self.verdicts = tuple(verdicts)


@dataclass(frozen=True)
class Verdict:
    commit: str
    ok: bool
    reason: str = ""
    message: str = ""
    format: str = "none"  # ssh | openpgp | none
    principal: str = ""
    fingerprint: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "commit": self.commit, "ok": self.ok, "reason": self.reason, "message": self.message,
            "format": self.format, "principal": self.principal, "fingerprint": self.fingerprint,
        }


@dataclass(frozen=True)
class TrustRoot:
    signers: tuple[sshsig.AllowedSigner, ...] = ()
    revoked: frozenset[str] = frozenset()
    gpg_home: Path | None = None
    origin: str = "node"  # "node", or "repo@<commit>" after a rotation
    sealers: frozenset[str] = frozenset()
    """Who may seal: SSH principals, or key fingerprints (SSH ``SHA256:...``, OpenPGP hex).
    The node's own, never rotated through the repo."""

    @property
    def empty(self) -> bool:
        return not self.signers and self.gpg_home is None

    def may_seal(self, verdict: Verdict) -> bool:
        # An OpenPGP user id is whatever the key's owner wrote: only its fingerprint names it.
        by_principal = verdict.format == "ssh" and verdict.principal in self.sealers
        by_key = bool(verdict.fingerprint) and _fingerprint(verdict.fingerprint) in map(_fingerprint, self.sealers)
        return verdict.ok and (by_principal or by_key)


def _fingerprint(text: str) -> str:
    """SSH fingerprints are base64 (case matters); OpenPGP ones hex, written in either case."""
    return text if text.startswith("SHA256:") else text.upper()


_SSH_FINGERPRINT = re.compile(r"SHA256:[A-Za-z0-9+/]{43}")
_KEYGEN_LINE = re.compile(r"\d+\s+(SHA256:[A-Za-z0-9+/]{43})\s.*")  # ssh-keygen -l: bits, fingerprint, comment
_OPENPGP_FINGERPRINT = re.compile(r"[0-9A-Fa-f]{40}|[0-9A-Fa-f]{64}")  # v4, v6


def parse_revoked(text: str, file: str, *, strict: bool = True) -> frozenset[str]:
    """One key per line: its fingerprint (SHA256:... for SSH, alone or as ``ssh-keygen -l``
    prints it; hex for OpenPGP, spaces allowed as gpg prints them) or an SSH public key as a
    .pub file holds it; # comments.

    A line that is none of these is refused, naming it: read as a fingerprint that matches no
    key, a pasted key id or a typo would leave the leaked key trusted without a word. Not
    ``strict`` (a list the node adopted before these checks): such a line is skipped with a
    warning, as it revoked nothing then either, rather than keep the agent from starting."""
    revoked = set()
    for n, raw in enumerate(text.split("\n"), start=1):
        entry = raw.split("#", 1)[0].strip()
        if not entry:
            continue
        try:
            revoked.add(_revoked_key(entry))
        except ValueError as exc:
            problem = BadInput(f"revoked keys: not a key fingerprint (SHA256:... or OpenPGP hex) nor an SSH "
                               f"public key: {exc}", file=file, line=n)
            if strict:
                raise problem from None
            log.warning("%s (skipped)", problem)
    return frozenset(revoked)


def _revoked_key(entry: str) -> str:
    if _SSH_FINGERPRINT.fullmatch(entry):
        return entry
    if keygen := _KEYGEN_LINE.fullmatch(entry):
        return keygen.group(1)
    if _OPENPGP_FINGERPRINT.fullmatch(hexed := entry.replace(" ", "")):
        return hexed.upper()
    return sshsig.public_key_fingerprint(entry)


def parse_sealers(text: str) -> frozenset[str]:
    """One principal or fingerprint per line; # comments."""
    return frozenset(e for line in text.splitlines() if (e := line.split("#", 1)[0].strip()))


def load_root(allowed_signers: Path | None, gpg_home: Path | None, revoked: Path | None,
              sealers: Path | None = None) -> TrustRoot:
    signers: tuple[sshsig.AllowedSigner, ...] = ()
    if allowed_signers is not None:
        signers = sshsig.parse_allowed_signers(_read(allowed_signers, "allowed signers"), str(allowed_signers))
        if not signers and gpg_home is None:
            # Else the caller's "no trust root: give --allowed-signers" would ask for what was given.
            raise ConfigError("allowed signers: holds no keys (only blank or comment lines)",
                              file=str(allowed_signers))
    rev: frozenset[str] = frozenset()
    if revoked is not None:
        rev = parse_revoked(_read(revoked, "revocation list"), str(revoked))
    if gpg_home is not None and not gpg_home.is_dir():
        raise ConfigError("OpenPGP home is not a directory", file=str(gpg_home))
    seal: frozenset[str] = frozenset()
    if sealers is not None:
        seal = parse_sealers(_read(sealers, "sealers"))
    return TrustRoot(signers, rev, gpg_home, sealers=seal)


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {what}: {exc.strerror}", file=str(path)) from exc
    except UnicodeDecodeError as exc:  # a key in binary form, or the wrong file given
        raise ConfigError("not UTF-8 text", file=str(path)) from exc


# ------------------------------------------------------------------ trailers
_TRAILER = re.compile(r"([A-Za-z0-9-]+)[ \t]*:(.*)")
_GIT_GENERATED = ("Signed-off-by: ", "(cherry picked from commit ")


def trailers(message: str) -> list[tuple[str, str]]:
    """``(key, value)`` of a commit message's trailers, as ``git interpret-trailers --parse
    --no-divider`` reads them: the last paragraph (never the subject's), if all its lines are
    trailers, or a quarter of them with one git itself writes (Signed-off-by); indented lines
    continue the one above."""
    lines = [line for line in message.split("\n") if not line.startswith("#")]
    while lines and not lines[-1].strip():
        lines.pop()
    start = len(lines)
    while start > 0 and lines[start - 1].strip():
        start -= 1
    if start == 0:
        return []  # one paragraph: the subject
    found: list[list[str]] = []
    trailer_lines = other_lines = 0
    recognised = last_was_trailer = False
    for line in lines[start:]:
        if line[:1].isspace():
            if last_was_trailer:
                trailer_lines += 1
                if found:
                    found[-1][1] += " " + line.strip()
            else:
                other_lines += 1
            continue
        match = _TRAILER.fullmatch(line)
        generated = line.startswith(_GIT_GENERATED)
        recognised = recognised or generated
        last_was_trailer = bool(match) or generated
        if match:
            found.append([match.group(1), match.group(2).strip()])
        if last_was_trailer:
            trailer_lines += 1
        else:
            other_lines += 1
    if not trailer_lines or (other_lines and not (recognised and trailer_lines * 3 >= other_lines)):
        return []
    return [(key, value) for key, value in found]


def trailer_values(message: str, key: str) -> list[str]:
    return [v for k, v in trailers(message) if k.lower() == key.lower()]


# ------------------------------------------------------------------ one commit
def _committer_email(commit: pygit2.Commit) -> str:
    return commit.committer.email or ""


def _commit(repo: pygit2.Repository, commit_id: str) -> pygit2.Commit:
    """A commit a ref or a walk of the mirror named: if it cannot be read, the mirror is damaged."""
    import pygit2

    from reconciler.repo.tree import corrupt

    try:
        commit = repo[commit_id]
    except (KeyError, pygit2.GitError) as exc:
        raise corrupt(repo, exc) from exc
    if not isinstance(commit, pygit2.Commit):
        raise corrupt(repo, ValueError(f"{commit_id} is a {commit.type_str}, not a commit"))
    return commit


def verify_commit(repo: pygit2.Repository, commit_id: str, root: TrustRoot, now: datetime) -> Verdict:
    commit = _commit(repo, commit_id)
    try:
        signature, payload = commit.gpg_signature
    except (TypeError, ValueError):
        signature, payload = None, None
    if not signature or payload is None:
        return Verdict(commit_id, False, "UNSIGNED", "commit is not signed")
    if signature.lstrip().startswith(b"-----BEGIN SSH SIGNATURE-----"):
        return _verify_ssh(commit_id, signature, payload, _committer_email(commit), root, now)
    if signature.lstrip().startswith(b"-----BEGIN PGP SIGNATURE-----"):
        return _verify_openpgp(commit_id, signature, payload, root, now)
    return Verdict(commit_id, False, "BAD_SIGNATURE", "unknown signature format")


def _verify_ssh(commit_id: str, signature: bytes, payload: bytes, principal: str,
                root: TrustRoot, now: datetime) -> Verdict:
    try:
        sig = sshsig.verify(signature, payload, "git")
        entry = sshsig.find_signer(root.signers, sig, principal, now, "git")
    except sshsig.SignatureError as exc:
        fpr = ""
        with contextlib.suppress(sshsig.SignatureError):
            fpr = sshsig.parse_signature(signature).fingerprint
        return Verdict(commit_id, False, exc.reason, str(exc), "ssh", principal, fpr)
    fingerprints = {sig.fingerprint, entry.fingerprint}
    if fingerprints & root.revoked:
        return Verdict(commit_id, False, "KEY_REVOKED", f"key {sig.fingerprint} is revoked", "ssh",
                       principal, sig.fingerprint)
    return Verdict(commit_id, True, format="ssh", principal=principal, fingerprint=sig.fingerprint)


def _verify_openpgp(commit_id: str, signature: bytes, payload: bytes, root: TrustRoot, now: datetime) -> Verdict:
    del now  # gpg judges expiry by the system clock, which is the agent's clock
    if root.gpg_home is None:
        return Verdict(commit_id, False, "UNTRUSTED_KEY", "OpenPGP signature but no keyring configured", "openpgp")
    with tempfile.NamedTemporaryFile(suffix=".sig") as sigfile:
        sigfile.write(signature)
        sigfile.flush()
        proc = subprocess.run(
            ["gpg", "--homedir", str(root.gpg_home), "--batch", "--no-tty", "--no-auto-key-retrieve",
             "--trust-model", "always", "--status-fd", "1", "--verify", sigfile.name, "-"],
            input=payload, capture_output=True, env={**os.environ, "LC_ALL": "C"},
        )
    status: dict[str, list[str]] = {}
    for line in proc.stdout.decode(errors="replace").splitlines():
        if line.startswith("[GNUPG:] "):
            word, *rest = line[9:].split()
            status.setdefault(word, rest)
    uid = " ".join(status.get("GOODSIG", status.get("EXPKEYSIG", status.get("REVKEYSIG", ["", ""])))[1:])
    fpr = (status.get("VALIDSIG") or [""])[0]
    primary = (status.get("VALIDSIG") or [""] * 10)[-1] if "VALIDSIG" in status else ""
    if "REVKEYSIG" in status:
        return Verdict(commit_id, False, "KEY_REVOKED", "OpenPGP key is revoked", "openpgp", uid, fpr)
    if "EXPKEYSIG" in status or "KEYEXPIRED" in status:
        return Verdict(commit_id, False, "KEY_EXPIRED", "OpenPGP key has expired", "openpgp", uid, fpr)
    if "NO_PUBKEY" in status or ("ERRSIG" in status and "BADSIG" not in status):
        return Verdict(commit_id, False, "UNTRUSTED_KEY", "signed by a key not in the node's keyring", "openpgp")
    if "GOODSIG" not in status or "VALIDSIG" not in status or proc.returncode != 0:
        return Verdict(commit_id, False, "BAD_SIGNATURE", "OpenPGP signature does not verify", "openpgp", uid)
    if {fpr.upper(), primary.upper()} & root.revoked:
        return Verdict(commit_id, False, "KEY_REVOKED", f"key {fpr} is revoked", "openpgp", uid, fpr)
    return Verdict(commit_id, True, format="openpgp", principal=uid, fingerprint=fpr)


# ------------------------------------------------------------------ a range
def commits_to_verify(repo: pygit2.Repository, head: str, base: str | None, policy: Policy) -> list[str]:
    """The commits the policy requires, oldest first. Without a base (a node's first run) the
    head alone: the node has no earlier commit to measure history against."""
    if base is None or policy is Policy.HEAD:
        return [head]
    import pygit2

    from reconciler.repo.tree import reading

    flags = pygit2.enums.SortMode.TOPOLOGICAL | pygit2.enums.SortMode.REVERSE
    with reading(repo):
        walker = repo.walk(pygit2.Oid(hex=head), flags)
        walker.hide(pygit2.Oid(hex=base))
        if policy is Policy.FIRST_PARENT:
            walker.simplify_first_parent()
        return [str(c.id) for c in walker]


def is_descendant(repo: pygit2.Repository, head: str, base: str) -> bool:
    if head == base:
        return True
    import pygit2

    from reconciler.repo.tree import reading

    if pygit2.Oid(hex=base) not in repo or pygit2.Oid(hex=head) not in repo:
        return False  # the base is not in the mirror: the branch no longer contains it
    # Both ends are here: an object between them that cannot be read is damage, not an answer
    # (a "no" would be a permanent NOT_DESCENDANT refusal).
    with reading(repo):
        return bool(repo.descendant_of(head, base))


def tree_file(repo: pygit2.Repository, commit_id: str, path: str) -> bytes | None:
    """A file's bytes at a commit, or None."""
    import pygit2

    from reconciler.repo.tree import corrupt, reading

    if pygit2.Oid(hex=commit_id) not in repo:
        return None
    commit = _commit(repo, commit_id)
    try:
        obj = commit.tree[path]
    except pygit2.GitError as exc:  # "not found" is a KeyError too: test it first
        raise corrupt(repo, exc) from exc
    except KeyError:
        return None
    with reading(repo):
        return bytes(obj.data) if isinstance(obj, pygit2.Blob) else None


def changes_trust(repo: pygit2.Repository, commit_id: str) -> bool:
    """Does the commit change the repo's ``trust/`` files against its first parent?"""
    parents = _commit(repo, commit_id).parent_ids
    parent = str(parents[0]) if parents else None
    return any(tree_file(repo, commit_id, f"{TRUST_DIR}/{n}") != (tree_file(repo, parent, f"{TRUST_DIR}/{n}")
                                                                  if parent else None)
               for n in ("allowed_signers", "revoked"))


def rotated_root(repo: pygit2.Repository, commit_id: str, root: TrustRoot, node_revoked: frozenset[str]) -> TrustRoot:
    """The root after ``commit_id`` (already verified under ``root``): the repo's trust/ if this
    commit changed it (against its first parent). The node's own revocation list always stays
    in force."""
    signers_raw = tree_file(repo, commit_id, f"{TRUST_DIR}/allowed_signers")
    if signers_raw is None:
        return root
    if _commit(repo, commit_id).parent_ids and not changes_trust(repo, commit_id):
        return root
    revoked_raw = tree_file(repo, commit_id, f"{TRUST_DIR}/revoked") or b""
    file = f"{TRUST_DIR}/allowed_signers@{commit_id[:12]}"
    try:
        signers = sshsig.parse_allowed_signers(signers_raw.decode(), file)
        # A revocation the node cannot read must refuse the rotation, not revoke nothing.
        revoked = parse_revoked(revoked_raw.decode(), f"{TRUST_DIR}/revoked@{commit_id[:12]}")
    except (UnicodeDecodeError, ReconcilerError) as exc:
        raise TrustError(f"rotation refused: {exc}", "BAD_TRUST_ROOT") from exc
    new = TrustRoot(signers, revoked | node_revoked,
                    root.gpg_home, f"repo@{commit_id}", root.sealers)
    if (new.signers, new.revoked) == (root.signers, root.revoked):
        return root
    return new


@dataclass(frozen=True)
class Decision:
    """The outcome for a new head: verdicts oldest first, and the root in force after it."""

    head: str
    verdicts: tuple[Verdict, ...]
    root: TrustRoot
    policy: Policy

    @property
    def signer(self) -> Verdict | None:
        """The head's verdict (walks end at the head); None when the head was verified before."""
        return self.verdicts[-1] if self.verdicts else None


def _sealed(repo: pygit2.Repository, verdicts: list[Verdict], seal: Verdict, root: TrustRoot) -> list[Verdict]:
    """``verdicts`` with the failures that ``seal`` (a valid signature under ``root``) seals
    marked ok: its ancestors, when its signer is a sealer and its message carries the trailer."""
    failed = [v for v in verdicts if not v.ok and v.reason not in UNSEALABLE]
    if not failed or not root.may_seal(seal):
        return verdicts
    reasons = trailer_values(_commit(repo, seal.commit).message, SEAL_TRAILER)
    if not reasons:
        return verdicts
    out = []
    for v in verdicts:
        if v in failed and is_descendant(repo, seal.commit, v.commit):
            if changes_trust(repo, v.commit):
                # The root rotates only through commits verified under the root before them.
                v = replace(v, message=f"{v.message.rstrip('.')}; it changes {TRUST_DIR}/, which no seal vouches for")
            else:
                v = replace(v, ok=True, reason="SEALED", message=f"sealed by {seal.commit} ({'; '.join(reasons)})")
        out.append(v)
    return out


def _judge(repo: pygit2.Repository, commits: Sequence[str], root: TrustRoot, now: datetime,
           node_revoked: frozenset[str], *, stop: bool) -> tuple[list[Verdict], TrustRoot]:
    """Verdicts oldest first, and the root in force after them. The root rotates only through
    commits that verified. ``stop``: return at the first failure no later seal could cover."""
    verdicts: list[Verdict] = []
    for commit in commits:
        verdict = verify_commit(repo, commit, root, now)
        if verdict.ok:
            verdicts = _sealed(repo, verdicts, verdict, root)
            root = rotated_root(repo, commit, root, node_revoked)
        verdicts.append(verdict)
        if stop and not verdict.ok and (not root.sealers or verdict.reason in UNSEALABLE):
            break
    return verdicts, root


@dataclass
class Gate:
    """Decides whether a node may act on a new head."""

    root: TrustRoot
    policy: Policy = Policy.EVERY_COMMIT
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    node_revoked: frozenset[str] = frozenset()
    """The node's own revocation list: stays in force whatever the repo rotates to."""
    branch: str | None = None
    """The branch the node follows; a head bound to another is refused (None: not checked)."""
    require_branch_binding: bool = False
    """Refuse a head that names no branch (the repo may require it too, per decision)."""

    def decide(
        self, repo: pygit2.Repository, head: str, base: str | None, repo_policy: Policy | None = None,
        require_binding: bool = False,
    ) -> Decision:
        policy = Policy.strictest(self.policy, repo_policy or Policy.HEAD)
        _commit(repo, head)  # a head the mirror lost is damage, never "not a descendant"
        if base is not None and not is_descendant(repo, head, base):
            raise TrustError(
                f"{head[:12]} does not descend from {base[:12]}, the last commit this node applied "
                "(force-push or replay of an older commit)", "NOT_DESCENDANT",
                [Verdict(head, False, "NOT_DESCENDANT", "history went backwards")],
            )
        if head == base:
            return Decision(head, (), self.root, policy)
        if self.root.empty:
            raise TrustError("the node has no trust root (allowed signers or OpenPGP keyring)", "NO_TRUST_ROOT")
        verdicts, root = _judge(repo, commits_to_verify(repo, head, base, policy), self.root, self.clock(),
                                self.node_revoked, stop=True)
        bad = next((v for v in verdicts if not v.ok), None)
        if bad is not None:
            raise TrustError(f"commit {bad.commit[:12]}: {bad.message}", bad.reason, verdicts)
        unbound = self._binding(repo, verdicts[-1], self.require_branch_binding or require_binding)
        if unbound is not None:
            raise TrustError(f"commit {head[:12]}: {unbound.message}", unbound.reason, [*verdicts[:-1], unbound])
        return Decision(head, tuple(verdicts), root, policy)

    def _binding(self, repo: pygit2.Repository, head: Verdict, required: bool) -> Verdict | None:
        """The head's verdict turned into a refusal when its branch binding fails, else None."""
        if self.branch is None:
            return None
        named = [b.removeprefix("refs/heads/") for b in trailer_values(_commit(repo, head.commit).message,
                                                                       BRANCH_TRAILER)]
        if named and self.branch not in named:
            signed_for = ", ".join(repr(b) for b in named)
            return replace(head, ok=False, reason="WRONG_BRANCH",
                           message=f"signed for branch {signed_for}, not {self.branch!r}")
        if required and not named:
            return replace(head, ok=False, reason="BRANCH_UNBOUND",
                           message=f"names no branch: a '{BRANCH_TRAILER}: {self.branch}' trailer is required")
        return None

    def with_root(self, root: TrustRoot) -> Gate:
        return replace(self, root=root)


def repo_requires_binding(repo: pygit2.Repository, *commits: str | None) -> bool:
    """Does reconciler.yaml ask for branch bindings at any of these commits? (It can only
    tighten: a file that does not parse asks for nothing, and validation reports it.)"""
    from reconciler.repo.yamlfile import safe_load

    for commit in commits:
        raw = tree_file(repo, commit, "reconciler.yaml") if commit else None
        try:
            data = safe_load(raw, "reconciler.yaml") if raw else None  # bounded: not verified yet
        except BadInput:
            continue
        trust = data.get("trust") if isinstance(data, dict) else None
        if isinstance(trust, dict) and trust.get("require_branch_binding") is True:
            return True
    return False


def verify_range(repo: pygit2.Repository, spec: str, gate: Gate) -> list[Verdict]:
    """Verdicts for ``REV`` or every commit of ``A..B`` (oldest first), rotating the root and
    honouring seals as a node would, but going on past a bad commit so the whole range is
    reported."""
    import pygit2

    def resolve(rev: str) -> str:
        try:
            return str(repo.revparse_single(rev).peel(pygit2.Commit).id)
        except (KeyError, ValueError, pygit2.GitError) as exc:
            raise BadInput(f"unknown revision {rev!r}") from exc

    if ".." in spec:
        a, _, b = spec.partition("..")
        commits = commits_to_verify(repo, resolve(b or "HEAD"), resolve(a), Policy.EVERY_COMMIT)
    else:
        commits = [resolve(spec)]
    return _judge(repo, commits, gate.root, gate.clock(), gate.node_revoked, stop=False)[0]
