"""What trust leaves on the node: the root in force (rotated through the repo or the node's
own), the high-water mark and its signer, and their recovery after the state dir was lost.

Next to ``trust`` (which judges commits, pure over a repository) this is the part with memory:
it reads and writes the ledger's mark and the ``trust/`` files of the state dir.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.core.atomic import atomic_write
from reconciler.core.errors import ConfigError
from reconciler.core.model import (
    ActionKind,
    Report,
    ResultState,
    Revision,
    Scope,
    ServiceResult,
    StepRecord,
    StepStatus,
    Verdict,
    VerifiedRevision,
)
from reconciler.fleet import notes
from reconciler.trust.commits import verify_commit
from reconciler.trust.root import Policy, TrustError, TrustRoot, load_root, parse_revoked
from reconciler.trust.verify import Decision, Gate, repo_policy, repo_requires_binding, rotated_root_at, tree_file

if TYPE_CHECKING:
    import pygit2

    from reconciler.ledger import Ledger
    from reconciler.settings import TrustConfig
    from reconciler.trust.notesig import NoteKey

log = logging.getLogger("reconciler.trust")


def configured_root(cfg: TrustConfig) -> TrustRoot:
    """The trust root the node's settings name, read from its files (``ConfigError``: missing,
    unreadable, malformed, or none named)."""
    root = load_root(cfg.allowed_signers, cfg.gpg_home, cfg.revoked, cfg.sealers)
    if root.empty:
        raise ConfigError("no trust root: set trust.allowed_signers and/or trust.gpg_home "
                          "(--allowed-signers / --gpg-home); the agent applies only signed commits")
    return root


class TrustKeeper:
    """The node's trust state over its ledger and mirror."""

    def __init__(self, cfg: TrustConfig, state_root: Path, ledger: Ledger, repo: Callable[[], pygit2.Repository],
                 notes_ref: str, clock: Callable[[], datetime], node: str, branch: str,
                 note_key: Callable[[], NoteKey] | None = None) -> None:
        node_root = configured_root(cfg)
        self.ledger = ledger
        self.dir = state_root / "trust"
        self.repo = repo
        self.notes_ref = notes_ref
        self.node = node
        self.note_key = note_key  # this node's own: its notes on the remote are trusted only if it signed them
        self.node_root = node_root
        self._said_unproven = False
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
        import hashlib  # a refusal's: hashlib loads OpenSSL, 3.5 MB of an idle daemon (issue 40)

        r = self.gate.root
        return hashlib.sha256(repr((r.signers, sorted(r.revoked), str(r.gpg_home), r.origin, sorted(r.sealers),
                                    str(self.gate.policy), self.gate.require_branch_binding)).encode()).hexdigest()[:16]

    def decide(self, commit: str) -> Decision:
        base = self.high_water()
        return self.gate.decide(self.repo(), commit, base, repo_policy(self.repo(), base, commit),
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
            self._keep_root_of(commit)
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
        that this node's own notes (on the remote, signed with its note key) say it acted on,
        with the root in force then and every such note's record taken back into the ledger
        (``Ledger.restore``). A server can withhold notes (the node then starts from an older
        mark, or as a new node under its configured root), never make one up."""
        mark = self.ledger.mark().commit
        if mark:
            return mark
        import pygit2  # only a state dir with no mark reads notes (see ``source``)

        newest: tuple[str, str, str] | None = None
        records: list[Report] = []
        skipped = 0
        try:
            entries = list(self.repo().notes(self.notes_ref))  # type: ignore[call-arg]  # stub lacks ref
        except KeyError:
            return None
        except pygit2.GitError as exc:  # a damaged mirror must not read as "no mark": that would be a first run
            from reconciler.repo.tree import corrupt

            raise corrupt(self.repo(), exc) from exc
        for note in entries:
            data = notes.decode(note.message)
            commit = str(note.annotated_id)
            if data is None or commit == notes.CLAIM_OBJECT:  # a disruption claim is not about a commit
                continue
            if not self._written_here(commit, data):
                skipped += 1  # the remote (or a mirror) can write in our ref: only what we signed counts
                continue
            record = recorded(self.node, commit, data)
            if record is not None:
                records.append(record)
            # The mark moves for every verified commit the node acted on, whatever came of it.
            when = str(data.get("time", ""))
            # the newest by its time; two in the same second: the later one (see ``_later``)
            if data.get("state") != str(Verdict.REFUSED) and (
                    newest is None or when > newest[0]
                    or (when == newest[0] and commit != newest[1] and self._later(commit, data, newest[1]))):
                newest = (when, commit, str(data.get("root") or ""))
        if newest is None:
            self.ledger.restore(records)  # refusals only: nothing this node acted on
            if skipped and not self._said_unproven:
                self._said_unproven = True  # asked more than once a pass (adoption, then the gate)
                # Notes that this key did not sign (an older agent's, a key lost with the state
                # dir, or someone else's): no mark is proven, and the node starts as a new one,
                # under its configured root (which must then be the root in force).
                log.warning("%s: %d notes in this node's ref are not signed by its note key: no high-water mark "
                            "recovered; starting as a new node under the configured trust root", self.node, skipped)
            return None
        origin = self._recover_root(newest[1], newest[2])  # before anything is taken back: it may refuse
        restored = self.ledger.restore(records)
        if restored:
            log.warning("%s: %d records recovered from this node's notes", self.node, restored)
        self.ledger.advance(newest[1], None, origin)
        log.warning("%s: high-water mark %s recovered from this node's notes", self.node, newest[1][:12])
        return newest[1]

    def _keep_root_of(self, commit: str) -> None:
        """The repo's ``trust/`` files at ``commit``, kept in the state dir as the root in force."""
        for name in ("allowed_signers", "revoked"):
            atomic_write(self.dir / name, tree_file(self.repo(), commit, f"trust/{name}") or b"", 0o600)

    def _later(self, commit: str, data: Mapping[str, Any], other: str) -> bool:
        """Of two commits this node noted in the same second, is ``commit`` the later? Yes if its
        note says the node refused ``other`` while running it (a rewind to it), or it descends
        from ``other``; and, when the mirror cannot tell (``commit`` is no longer on the branch:
        a force-push took it away), yes too: the mark must err towards refusing a rewind."""
        refused = data.get("refused")
        if isinstance(refused, Mapping) and refused.get("head") == other:
            return True
        if self._descends(commit, other):
            return True
        import pygit2

        return pygit2.Oid(hex=commit) not in self.repo() and pygit2.Oid(hex=other) in self.repo()

    def _descends(self, commit: str, other: str) -> bool:
        from reconciler.trust.verify import is_descendant

        try:
            return is_descendant(self.repo(), commit, other)
        except (KeyError, ValueError):
            return False  # a commit the mirror lacks

    def _written_here(self, commit: str, data: Mapping[str, Any]) -> bool:
        """A note in this node's ref that this node wrote: signed with its own key. Nothing else
        proves it: the server (or a mirror) can write in the ref, and trust/nodes at the note's
        commit is no proof (that commit is not verified yet: its author would name the keys)."""
        return self.note_key is not None and self.note_key().signed(self.node, commit, data)

    def _recover_root(self, mark: str, named: str) -> str | None:
        """The commit root in force with the recovered ``mark``, as this node's own signed note
        on it names it; adopted here (the origin to keep with the mark), None for the node's own.
        Where nothing can prove it (an older agent's note names none) and the repo carries a
        root of its own at the mark that the node's differs from, the node refuses: it cannot
        tell whether a key retired since is trusted again."""
        if named.startswith("repo@"):
            origin_commit = named.removeprefix("repo@")
            try:
                root = rotated_root_at(self.repo(), origin_commit, self.node_root)
            except (TrustError, KeyError, ValueError) as exc:
                raise TrustError(f"state dir lost: the trust root its notes name ({named[:17]}) cannot be "
                                 f"read: {exc}", "ROOT_UNPROVEN") from exc
            self._keep_root_of(origin_commit)
            self.gate = self.gate.with_root(root)
            log.warning("%s: trust root %s recovered with the mark from this node's notes", self.node, named[:17])
            return root.origin
        if named == "node":
            return None
        raw = tree_file(self.repo(), mark, "trust/allowed_signers")
        if raw is None:
            return None  # the repo never carried a root of its own here: the node's is the one
        try:
            repo_root = rotated_root_at(self.repo(), mark, self.node_root)
        except (TrustError, KeyError, ValueError):
            repo_root = None
        if repo_root is not None and repo_root.signers == self.node_root.signers:
            return None  # the operator gave the node the repo's root: nothing older can come back
        raise TrustError(
            f"state dir lost: the high-water mark {mark[:12]} came back from this node's notes, but not the trust "
            "root in force with it (its note names none, and the repo carries its own in trust/): restore "
            f"{self.dir}, or set trust.allowed_signers to the root in force "
            f"(git show {mark[:12]}:trust/allowed_signers)",
            "ROOT_UNPROVEN")


def _signer(verdict: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(verdict[k]) for k in ("format", "principal", "fingerprint")}


def recorded(node: str, commit: str, data: Mapping[str, Any]) -> Report | None:
    """A note of this node's read back as the ledger's record it was written from (None: not
    one it could have written)."""
    try:
        services = tuple(
            ServiceResult(str(name), ActionKind(r["action"]), ResultState(r["result"]), str(r.get("reason") or ""),
                          str(r.get("detail") or ""), r.get("pid"), r.get("hash"), tuple(r.get("steps") or ()))
            for name, r in (data.get("services") or {}).items())
        steps = tuple(
            StepRecord(str(s.get("service") or ""), str(s["step"]), Scope(s["scope"]), StepStatus(s["status"]),
                       _epoch(s.get("started")), _epoch(s.get("ended")), str(s.get("detail") or ""))
            for s in data.get("upgrade") or ())
        return Report(node, commit, Verdict(str(data.get("state"))), str(data.get("time") or ""), services=services,
                      reason=str(data.get("reason") or ""), error=str(data.get("error") or ""),
                      plan_hash=str(data.get("plan_hash") or ""), signer=data.get("signer") or None,
                      verdicts=tuple(data.get("verdicts") or ()), events=tuple(map(str, data.get("events") or ())),
                      steps=steps, plane=data.get("plane") or None)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def _epoch(text: Any) -> float:
    try:
        return datetime.fromisoformat(str(text)).timestamp() if text else 0.0
    except ValueError:
        return 0.0
