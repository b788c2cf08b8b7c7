"""What trust leaves on the node: the root in force (rotated through the repo or the node's
own), the high-water mark and its signer, and their recovery after the state dir was lost.

Next to ``trust`` (which judges commits, pure over a repository) this is the part with memory:
it reads and writes the ledger's mark and the ``trust/`` files of the state dir.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.core.atomic import atomic_write
from reconciler.core.errors import ConfigError
from reconciler.core.model import Revision, Verdict, VerifiedRevision
from reconciler.fleet import notes
from reconciler.trust.commits import verify_commit
from reconciler.trust.root import Policy, TrustError, TrustRoot, load_root, parse_revoked
from reconciler.trust.verify import Decision, Gate, repo_requires_binding, tree_file

if TYPE_CHECKING:
    import pygit2

    from reconciler.ledger import Ledger
    from reconciler.settings import TrustConfig

log = logging.getLogger("reconciler.trust")


class TrustKeeper:
    """The node's trust state over its ledger and mirror."""

    def __init__(self, cfg: TrustConfig, state_root: Path, ledger: Ledger, repo: Callable[[], pygit2.Repository],
                 notes_ref: str, clock: Callable[[], datetime], node: str, branch: str) -> None:
        node_root = load_root(cfg.allowed_signers, cfg.gpg_home, cfg.revoked, cfg.sealers)
        if node_root.empty:
            raise ConfigError("no trust root: set trust.allowed_signers and/or trust.gpg_home "
                              "(--allowed-signers / --gpg-home); the agent applies only signed commits")
        self.ledger = ledger
        self.dir = state_root / "trust"
        self.repo = repo
        self.notes_ref = notes_ref
        self.node = node
        self.gate = Gate(self._adopted(node_root), Policy(cfg.policy), clock, node_root.revoked, branch,
                         cfg.require_branch_binding)

    def _adopted(self, node_root: TrustRoot) -> TrustRoot:
        """A root rotated through the repo earlier, kept in the state dir; else the node's own."""
        from reconciler.trust.sshsig import parse_allowed_signers

        origin = self.ledger.mark().trust_origin
        signers = self.dir / "allowed_signers"
        if not origin or not signers.exists():
            return node_root
        revoked = self.dir / "revoked"
        # Adopted before lines that name no key were refused: skipped (they revoked nothing), so
        # an upgraded agent still starts.
        adopted = parse_revoked(revoked.read_text(), str(revoked), strict=False) if revoked.exists() else frozenset()
        return TrustRoot(
            parse_allowed_signers(signers.read_text(), str(signers)),
            adopted | node_root.revoked,
            node_root.gpg_home, origin, node_root.sealers,
        )

    def root_id(self) -> str:
        """Names the root and policy a refusal was judged under: a new root judges again."""
        r = self.gate.root
        return hashlib.sha256(repr((r.signers, sorted(r.revoked), str(r.gpg_home), r.origin, sorted(r.sealers),
                                    str(self.gate.policy), self.gate.require_branch_binding)).encode()).hexdigest()[:16]

    def decide(self, commit: str) -> Decision:
        base = self.high_water()
        return self.gate.decide(self.repo(), commit, base, self.repo_policy(base, commit),
                                repo_requires_binding(self.repo(), base, commit))

    def verify(self, rev: Revision) -> VerifiedRevision:
        """The head, judged against the mark and the root (``TrustError`` if refused); what it
        established (mark, signer, a rotated root) is kept."""
        return VerifiedRevision(rev, self.adopt(self.decide(rev.commit)))

    def vouch(self, rev: Revision) -> VerifiedRevision:
        """A commit this node goes back to (a rollback's target, a pin's commit): signed under
        the root in force now. The mark does not move."""
        if rev.commit == self.ledger.mark().commit:
            return VerifiedRevision(rev, self.ledger.mark().signer)
        verdict = verify_commit(self.repo(), rev.commit, self.gate.root, self.gate.clock())
        if not verdict.ok:
            raise TrustError(f"commit {rev.commit[:12]}: {verdict.message}", verdict.reason, [verdict])
        return VerifiedRevision(rev, _signer(verdict.to_dict()))

    def adopt(self, decision: Decision) -> Mapping[str, str] | None:
        """Persist what a verified head established: the mark, its signer, a rotated root.
        Returns the signer the head's note names."""
        origin = None
        if decision.root.origin != self.gate.root.origin:
            commit = decision.root.origin.removeprefix("repo@")
            for name in ("allowed_signers", "revoked"):
                blob = tree_file(self.repo(), commit, f"trust/{name}")
                atomic_write(self.dir / name, blob or b"", 0o600)
            origin = decision.root.origin
            log.warning("%s: trust root rotated by %s", self.node, commit[:12])
            self.gate = self.gate.with_root(decision.root)
        signer = _signer(decision.signer.to_dict()) if decision.signer is not None else None
        mark = self.ledger.mark()
        if mark.commit != decision.head or signer or origin is not None:
            self.ledger.advance(decision.head, signer, origin)
        return signer or self.ledger.mark().signer

    def high_water(self) -> str | None:
        """The last commit this node acted on; after the state dir was lost, the newest commit
        that this node's own notes (on the remote, written only by it) say it acted on."""
        mark = self.ledger.mark().commit
        if mark:
            return mark
        import pygit2  # only a state dir with no mark reads notes (see ``source``)

        newest: tuple[str, str, dict[str, Any]] | None = None
        try:
            entries = list(self.repo().notes(self.notes_ref))  # type: ignore[call-arg]  # stub lacks ref
        except KeyError:
            return None
        except pygit2.GitError as exc:  # a damaged mirror must not read as "no mark": that would be a first run
            from reconciler.repo.tree import corrupt

            raise corrupt(self.repo(), exc) from exc
        for note in entries:
            data = notes.decode(note.message)
            # The mark moves for every verified commit the node acted on, whatever came of it.
            # (a disruption claim is not about a commit)
            if data is None or data.get("state") == str(Verdict.REFUSED) \
                    or str(note.annotated_id) == notes.CLAIM_OBJECT:
                continue
            if newest is None or str(data.get("time", "")) > newest[0]:
                newest = (str(data.get("time", "")), str(note.annotated_id), data)
        if newest is None:
            return None
        self.ledger.advance(newest[1], None)
        if newest[2].get("state") == str(Verdict.FAILED):
            self.ledger.recover_failure(newest[1], str(newest[2].get("reason", "")), str(newest[2].get("error", "")))
        log.warning("%s: high-water mark %s recovered from this node's notes", self.node, newest[1][:12])
        return newest[1]

    def repo_policy(self, *commits: str | None) -> Policy:
        """The strictest policy the repo asks for at these commits (it can only tighten)."""
        from reconciler.core.errors import BadInput
        from reconciler.core.yamlfile import safe_load

        policies = [Policy.HEAD]
        for commit in commits:
            raw = tree_file(self.repo(), commit, "reconciler.yaml") if commit else None
            try:
                # Bounded: this commit is not verified yet, and a hostile file must not exhaust the node.
                data = safe_load(raw, "reconciler.yaml") if raw else None
                wanted = data.get("trust", {}).get("policy") if isinstance(data, dict) else None
                if wanted:
                    policies.append(Policy(wanted))
            except (BadInput, ValueError, AttributeError):
                continue  # a bad file is reported by validation; it cannot loosen anything
        return Policy.strictest(*policies)


def _signer(verdict: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(verdict[k]) for k in ("format", "principal", "fingerprint")}
