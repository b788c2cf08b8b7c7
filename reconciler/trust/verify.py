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
  another branch, or naming a branch more than once (ambiguous), is always refused, and a node
  or repo may require every head to be bound
  (a signature alone names no branch, so whoever can move a branch could move it onto a
  signed commit made for another);
- ``Reconciler-Seal: REASON``, from a principal in the node's ``sealers`` file, vouches for the
  unsigned (or badly signed) commits before it, so an accident on the branch is recovered
  without rewriting history. Never for a revoked key, a change of ``trust/``, or a commit after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from reconciler.core.errors import BadInput, ReconcilerError, RepoLimit
from reconciler.core.limits import LIMITS
from reconciler.core.limits import size as limit_size
from reconciler.trust import sshsig
from reconciler.trust.commits import read_commit, trailer_values, verify_commit
from reconciler.trust.root import (
    TRUST_DIR,
    UNSEALABLE,
    Policy,
    TrustError,
    TrustRoot,
    Verdict,
    parse_revoked,
)

if TYPE_CHECKING:
    import pygit2

# pygit2 (and ``tree``, which reads through it) is imported where a commit is read, not here:
# the node's trust root loads when the agent starts, and an idle agent never reads a commit
# (see ``source``).

BRANCH_TRAILER = "Reconciler-Branch"
SEAL_TRAILER = "Reconciler-Seal"


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


def _blob(repo: pygit2.Repository, commit_id: str, path: str) -> pygit2.Blob | None:
    """The blob at ``path`` of a commit, not loaded yet; None if there is none."""
    import pygit2

    from reconciler.repo.tree import corrupt

    if pygit2.Oid(hex=commit_id) not in repo:
        return None
    commit = read_commit(repo, commit_id)
    try:
        obj = commit.tree[path]
    except pygit2.GitError as exc:  # "not found" is a KeyError too: test it first
        raise corrupt(repo, exc) from exc
    except KeyError:
        return None
    return obj if isinstance(obj, pygit2.Blob) else None


def blob_size(repo: pygit2.Repository, commit_id: str, path: str) -> int | None:
    """A file's size at a commit, from its object's header (the blob itself is not read), or None."""
    obj = _blob(repo, commit_id, path)
    return None if obj is None else _size(repo, obj)


def _size(repo: pygit2.Repository, obj: pygit2.Blob) -> int:
    from reconciler.repo.tree import reading

    with reading(repo):
        return int(repo.odb.read_header(obj.id)[1])


def tree_file(repo: pygit2.Repository, commit_id: str, path: str,
              max_bytes: int | None = LIMITS.file_bytes) -> bytes | None:
    """A file's bytes at a commit, or None. Past ``max_bytes`` (the repo's file limit) a
    ``RepoLimit`` naming it, its commit and its size, and nothing of it read: the gate reads
    files of commits not verified yet, which anyone who can push may make as large as they like."""
    from reconciler.repo.tree import reading

    obj = _blob(repo, commit_id, path)
    if obj is None:
        return None
    if max_bytes is not None and (size := _size(repo, obj)) > max_bytes:
        raise too_large(path, commit_id, size, max_bytes)
    with reading(repo):
        return bytes(obj.data)


def too_large(path: str, commit_id: str, size: int, max_bytes: int) -> RepoLimit:
    return RepoLimit(f"{size} bytes, larger than {limit_size(max_bytes)} (repo limit)", file=path).in_commit(commit_id)


def changes_trust(repo: pygit2.Repository, commit_id: str) -> bool:
    """Does the commit change the repo's ``trust/`` files against its first parent? Compared by
    object id, unread: a seal asks this of commits that did not verify."""
    parents = read_commit(repo, commit_id).parent_ids
    parent = str(parents[0]) if parents else None

    def blob_id(commit: str | None, name: str) -> object:
        obj = _blob(repo, commit, f"{TRUST_DIR}/{name}") if commit else None
        return obj.id if obj is not None else None

    return any(blob_id(commit_id, n) != blob_id(parent, n) for n in ("allowed_signers", "revoked"))


def rotated_root(repo: pygit2.Repository, commit_id: str, root: TrustRoot, node_revoked: frozenset[str]) -> TrustRoot:
    """The root after ``commit_id`` (already verified under ``root``): the repo's trust/ if this
    commit changed it (against its first parent). The node's own revocation list always stays
    in force."""
    if _blob(repo, commit_id, f"{TRUST_DIR}/allowed_signers") is None:
        return root
    if read_commit(repo, commit_id).parent_ids and not changes_trust(repo, commit_id):
        return root
    new = rotated_root_at(repo, commit_id, replace(root, revoked=node_revoked))
    if (new.signers, new.revoked) == (root.signers, root.revoked):
        return root
    return new


def rotated_root_at(repo: pygit2.Repository, commit_id: str, node_root: TrustRoot) -> TrustRoot:
    """The root the repo's ``trust/`` holds at ``commit_id``, as a node adopts it there: its
    signers and revocations, plus the node's own revocations, OpenPGP keyring and sealers."""
    try:
        signers_raw = tree_file(repo, commit_id, f"{TRUST_DIR}/allowed_signers")
        revoked_raw = tree_file(repo, commit_id, f"{TRUST_DIR}/revoked") or b""
    except RepoLimit as exc:
        raise TrustError(f"rotation refused: {exc}", "BAD_TRUST_ROOT") from exc
    if signers_raw is None:
        raise TrustError(f"no {TRUST_DIR}/allowed_signers at {commit_id[:12]}", "BAD_TRUST_ROOT")
    file = f"{TRUST_DIR}/allowed_signers@{commit_id[:12]}"
    try:
        signers = sshsig.parse_allowed_signers(signers_raw.decode(), file)
        # A revocation the node cannot read must refuse the rotation, not revoke nothing.
        revoked = parse_revoked(revoked_raw.decode(), f"{TRUST_DIR}/revoked@{commit_id[:12]}")
    except (UnicodeDecodeError, ReconcilerError) as exc:
        raise TrustError(f"rotation refused: {exc}", "BAD_TRUST_ROOT") from exc
    return TrustRoot(signers, revoked | node_root.revoked, node_root.gpg_home, f"repo@{commit_id}", node_root.sealers)


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
    reasons = trailer_values(read_commit(repo, seal.commit).message, SEAL_TRAILER)
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


def _oversized(repo: pygit2.Repository, head: str) -> Verdict | None:
    """The head refused when its reconciler.yaml is past the repo's file limit: no node could
    load it, and its size is read from the object's header, so a pusher without the key cannot
    make every node read (and parse) a huge blob before its signature is checked. The base is
    not asked: it was verified, and refusing every head after it would wedge the node."""
    size = blob_size(repo, head, "reconciler.yaml")
    if size is None or size <= LIMITS.file_bytes:
        return None
    return Verdict(head, False, "REPO_LIMIT", str(too_large("reconciler.yaml", head, size, LIMITS.file_bytes)))


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
        read_commit(repo, head)  # a head the mirror lost is damage, never "not a descendant"
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
        oversized = _oversized(repo, head)
        if oversized is not None:
            raise TrustError(oversized.message, oversized.reason, [oversized])  # names the commit
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
        named = [b.removeprefix("refs/heads/") for b in trailer_values(read_commit(repo, head.commit).message,
                                                                       BRANCH_TRAILER)]
        if len(named) > 1:
            # Two trailers (a PR description ending in one, the merge bot adding another): which
            # one the signer meant is not for the node to guess, even when they agree.
            values = ", ".join(repr(b) for b in named)
            return replace(head, ok=False, reason="AMBIGUOUS_BINDING", message=f"ambiguous branch binding "
                           f"({values}): a head carries one '{BRANCH_TRAILER}' trailer")
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
    from reconciler.core.yamlfile import safe_load

    for commit in commits:
        try:
            # past the file limit: not read (a RepoLimit), and the gate refuses that head itself
            raw = tree_file(repo, commit, "reconciler.yaml") if commit else None
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


def repo_policy(repo: pygit2.Repository, *commits: str | None) -> Policy:
    """The strictest policy reconciler.yaml asks for at these commits (it can only tighten: a
    file that does not parse asks for nothing, and validation reports it)."""
    from reconciler.core.yamlfile import safe_load

    policies = [Policy.HEAD]
    for commit in commits:
        try:
            # past the file limit: not read (a RepoLimit), and the gate refuses that head itself
            raw = tree_file(repo, commit, "reconciler.yaml") if commit else None
            data = safe_load(raw, "reconciler.yaml") if raw else None  # bounded: not verified yet
            wanted = data.get("trust", {}).get("policy") if isinstance(data, dict) else None
            if wanted:
                policies.append(Policy(wanted))
        except (BadInput, ValueError, AttributeError):
            continue
    return Policy.strictest(*policies)
