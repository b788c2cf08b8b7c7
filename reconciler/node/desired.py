"""What this node should run at a revision: the one resolver every caller goes through.

A service runs the version its commit renders, unless something holds it elsewhere: an
operator's pin (``rollback``), a stage the commit's upgrades are limited to, or an upgrade that
failed here and is owed. Each of those is a commit the service is rendered from instead, vouched
for by trust again. Template values an upgrade's pin step holds apply to every render.

The resolver also keeps the one cache of loaded and decrypted repos (a commit never changes;
what a commit decrypts to is learnt by the agent's memory so its output is cleaned of it). The
pass, the put-back of ``on_failure: node``, the upgrade steps and the history walk all load
through it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from reconciler.core.errors import BadInput, ReconcilerError
from reconciler.core.model import Desired, DesiredService, Revision, VerifiedRevision
from reconciler.core.model.facts import Facts
from reconciler.node.facts import gather
from reconciler.upgrades.history import Bases, Owed, bases_in, owed
from reconciler.upgrades.rules import held_back

# The readers of a repo (pygit2, the schemas, Jinja, age) are imported where a repo is loaded or
# rendered, not here: a poll that finds nothing new loads no repo and imports none of them.
if TYPE_CHECKING:
    import pygit2

    from reconciler.ledger import Ledger
    from reconciler.node.keeper import TrustKeeper
    from reconciler.render.facts import NodeFacts
    from reconciler.repo.definitions import DeploymentRepo

CACHED = 32  # loaded repos kept: an upgrade's history walk reads a few, a pass one or two
Accounts = Callable[[str, str], str | None]


class Resolver:
    """One node's desired state at any revision its mirror holds (see the module's docstring)."""

    def __init__(self, node: str, git: Callable[[], pygit2.Repository], ledger: Ledger, keeper: TrustKeeper,
                 identity: Path | None, learn: Callable[[DeploymentRepo], None], accounts: Accounts | None) -> None:
        self.node = node
        self._git = git
        self.ledger = ledger
        self.keeper = keeper
        self.identity = identity
        self._learn = learn  # the agent's memory of secret values, told of every repo decrypted
        self.accounts = accounts  # the process driver's check that a user or group exists here
        self._cache: dict[tuple[str, bool, tuple[int, int, int] | None], DeploymentRepo] = {}
        # How this node's facts are gathered (``node.facts``; a test gives its own), and this pass's.
        self.gatherer: Callable[[], Facts] = gather
        self._facts: NodeFacts | None = None

    def facts(self) -> NodeFacts:
        """This pass's facts, gathered when first asked for (``forget_facts`` starts a pass):
        every render of the pass reads the same, and notes whether it read them."""
        if self._facts is None:
            from reconciler.render.facts import NodeFacts

            self._facts = NodeFacts(self.gatherer(), "gathered")
        return self._facts

    def forget_facts(self) -> None:
        """A new pass: its facts are gathered again if it renders (or looks at them)."""
        self._facts = None

    def revision(self, commit: str) -> Revision:
        """What the mirror holds for ``commit``; nothing trusted yet."""
        import pygit2  # here: an idle poll that finds nothing new reads no commit

        from reconciler.repo.tree import corrupt

        git = self._git()
        try:
            c = git.revparse_single(commit).peel(pygit2.Commit)
        except (KeyError, ValueError) as exc:
            raise BadInput(f"commit {commit!r} is not in the node's mirror") from exc
        except pygit2.GitError as exc:
            raise corrupt(git, exc) from exc
        return Revision(str(c.id), str(c.tree_id), f"{c.author.name} <{c.author.email}>", int(c.commit_time))

    def load(self, commit: str) -> DeploymentRepo:
        """The repo at ``commit``, with this node's secrets decrypted (cached: a commit never
        changes, but the age identity may, e.g. a key installed after the commit that needs it)."""
        # its cutover failed where it attached: the render puts it back (see ``repo.planes``)
        aborted = bool((self.ledger.plane(commit) or {}).get("aborted"))
        key = (commit, aborted, self._identity_stamp())
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        from reconciler.render.vipnets import checked
        from reconciler.repo.load import load_repo
        from reconciler.repo.tree import GitTree

        # as this node reads it: its own services in full, of the others what it reads of them
        repo = checked(load_repo(GitTree(self._git(), commit), node=self.node))
        if aborted:
            repo = replace(repo, cutover_aborted=True)
        if repo.secret_files:
            repo = self.unlock(repo)
        if len(self._cache) >= CACHED:
            self._cache.clear()
        self._cache[key] = repo
        return repo

    def _identity_stamp(self) -> tuple[int, int, int] | None:
        """What says the age identity file changed (None: none, or unreadable: ``unlock`` says)."""
        try:
            st = self.identity.stat() if self.identity is not None else None
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size) if st is not None else None

    def unlock(self, repo: DeploymentRepo) -> DeploymentRepo:
        """The repo with this node's secrets decrypted (only the files encrypted to its key). No
        identity configured: none decrypted, and a template that reads one fails SECRET_UNREADABLE."""
        from reconciler.render.secrets import identities, open_files

        path = self.identity
        if path is None:
            return replace(repo, unlocked={}, no_identity=True)
        text = read_identity(path)
        unlocked = replace(repo, unlocked=open_files(repo.secret_files, identities(text, str(path))))
        self._learn(unlocked)
        return unlocked

    def learn_running(self, commits: Iterable[str]) -> None:
        """Load (and so teach the memory the secret values of) the commits the running services
        were rendered from. Only to clean outputs: a commit the mirror no longer holds, or that
        this node can no longer decrypt (dropped as a recipient), teaches nothing."""
        for commit in sorted(set(commits)):
            if not self._holds_secrets(commit):
                continue  # nothing to learn, and a load to spare (issue 40: 4 ms a commit)
            with contextlib.suppress(ReconcilerError):
                self.load(commit)

    def _holds_secrets(self, commit: str) -> bool:
        """Has ``commit`` a ``secrets/`` tree (where SOPS files are, ``repo.load``)? True when
        that cannot be told here: ``load`` says why."""
        import pygit2

        try:
            return "secrets" in self._git()[commit].peel(pygit2.Commit).tree
        except Exception:  # noqa: BLE001 - whatever it is, ``load`` meets it and tells it apart
            return True

    def bases(self, commit: str, repo: DeploymentRepo) -> Bases:
        """Each node's base for ``commit`` (``upgrades.history``)."""
        return bases_in(self._git(), commit, repo, self.load)

    def owed(self, head: str, repo: DeploymentRepo) -> Owed:
        """What this node owes before it may take ``head``'s versions (``upgrades.history``)."""
        return owed(self.ledger, self._git(), self.node, head, repo, self.load)

    def render(self, commit: str, repo: DeploymentRepo | None = None) -> Desired:
        """The commit's own render of this node's slice, with the values upgrades hold here."""
        from reconciler.render.node import render_node

        repo = repo or self.load(commit)
        if leaving(repo, self.node):  # listed under `decommission`: nothing runs here any more
            return Desired(self.node, commit, ())
        return render_node(repo, self.node, commit, self.accounts, pinned=self.ledger.held(), facts=self.facts())

    def desired(self, rev: VerifiedRevision, repo: DeploymentRepo | None = None) -> Desired:
        """The node's slice at ``rev``, with pinned services at their pinned commit (vouched for
        by trust again); each service knows the commit it was rendered from."""
        commit = rev.commit
        repo = repo or self.load(commit)
        desired = self.render(commit, repo)
        # An operator's pin wins; then what this node keeps as it ran it, being outside the stage
        # the commit's upgrades are limited to.
        staged = held_back(repo, self.node, self.bases(commit, repo)) if repo.stages else {}
        # and what it keeps because the upgrade that brings the new version failed here
        staged.update({s: at for s, (at, _) in self.owed(commit, repo).kept.items()})
        pins = {p.service: p.commit for p in self.ledger.pins()}
        stopped = self.ledger.held_stopped()  # `reconciler stop`: left stopped until `start`
        services = []
        for svc in desired.services:
            if svc.name in stopped:
                continue
            at = pins.get(svc.name) or staged.get(svc.name)
            if at is not None:
                old = self.at(at).by_name()
                if svc.name in old:
                    services.append(replace(old[svc.name], origin=at))
                    continue
            services.append(replace(svc, origin=commit))
        return Desired(desired.node, desired.commit, tuple(services))

    def at(self, commit: str) -> Desired:
        """The slice as ``commit`` renders it, once trust vouches for that commit again (a pin, an
        upgrade's step: nothing unverified is rendered)."""
        pinned = self.keeper.vouch(self.revision(commit))
        return self.render(pinned.commit)

    def service(self, name: str, commit: str, repo: DeploymentRepo | None = None) -> DesiredService:
        """One service as ``commit`` renders it here, knowing its origin; ``repo``: that commit's,
        loaded and verified by the caller already (else it is vouched for again, ``at``)."""
        svc = (self.render(commit, repo) if repo is not None else self.at(commit)).by_name().get(name)
        if svc is None:
            raise BadInput(f"node {self.node} does not run {name} at {commit[:12]}", reason="UNKNOWN_SERVICE")
        return replace(svc, origin=commit)


def leaving(repo: DeploymentRepo, node: str) -> bool:
    """``node`` is listed under the inventory's ``decommission`` (and so not under ``nodes``)."""
    return node in repo.decommission and node not in repo.nodes


def read_identity(path: Path) -> str:
    """The node's age identity file, refused (as ssh refuses such a private key) when its group
    or others may read it: the key may have been copied already, and whoever set it up so must
    hear of it before the node decrypts with it. Its mode is read from the file opened."""
    from reconciler.render.secrets import SecretUnreadable

    try:
        with path.open("rb") as f:
            mode = os.fstat(f.fileno()).st_mode & 0o777
            if mode & 0o077:
                raise SecretUnreadable(f"permissions {mode:04o} for the age identity are too open: it must be "
                                       f"readable by its owner only (chmod 600 {path})", file=str(path))
            return f.read().decode()
    except (OSError, UnicodeDecodeError) as exc:
        raise SecretUnreadable(f"cannot read the age identity: {getattr(exc, 'strerror', None) or exc}",
                               file=str(path)) from None
