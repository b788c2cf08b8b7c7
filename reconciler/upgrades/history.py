"""The upgrade history of a branch: each node's base, and the upgrades a node owes.

Steps of an upgrade run when a commit brings a service's new version. Which commit that was for
a node depends on the branch's history: the nearest ancestor that took the node in (stages send
commits to some nodes only), and, for a node that never ran the commit that brought a version
(it was away, or its upgrade failed), the commit it owes before the head. Both are read by
walking first parents, each commit loaded through the caller's loader (the desired-state
resolver's cache).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from reconciler.core.errors import ReconcilerError
from reconciler.core.model import Verdict
from reconciler.upgrades.rules import Bases, bases, held_back, upgraded, version_changed, version_of

if TYPE_CHECKING:
    import pygit2

    from reconciler.ledger import Ledger
    from reconciler.repo.definitions import DeploymentRepo, ServiceDef

Load = Callable[[str], "DeploymentRepo"]

WALK = 200  # ancestors read at most to find a node's base (stages a fleet is upgraded by are few)

__all__ = ["WALK", "Bases", "Owed", "bases_in", "owed"]


@dataclass(frozen=True)
class Owed:
    """An upgrade this node owes at the head: the head moved past the commit that brought a
    service's new version with steps before this node ran them (it never saw that commit, or
    was mid-upgrade). ``first``: that commit, to run before the head; ``kept``: services held
    at the version they run because their upgrade failed or was halted here (a new version
    without its steps would skip a migration), with why."""

    first: str = ""
    kept: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # service -> (commit it runs, why)


def owed(ledger: Ledger, git: pygit2.Repository, node: str, head: str, repo: DeploymentRepo, load: Load) -> Owed:
    """What this node owes before it may take ``head``'s version of each service with steps."""
    if node not in repo.nodes or not any(repo.services[s].upgrade for s in repo.services_of(node)):
        return Owed()
    base = bases_in(git, head, repo, load)
    skip = set(upgraded(repo, base)) | set(held_back(repo, node, base)) | {p.service for p in ledger.pins()}
    first: list[tuple[int, str]] = []
    kept: dict[str, tuple[str, str]] = {}
    for name in repo.services_of(node):
        svc = repo.services[name]
        if not svc.upgrade or name in skip:
            continue
        running, at = _running_version(ledger, name, load)
        target = version_of(svc)
        if not running or running == target or not _changed_since(at, name, svc, load):
            continue
        depth, intro = 0, head
        for back, (commit, old) in enumerate(_walk(git, head, load), start=1):
            if name not in old.services or version_of(old.services[name]) != target:
                break
            depth, intro = back, commit
        if intro == head or name not in upgraded(load(intro), bases_in(git, intro, load(intro), load)):
            continue  # no commit upgrades it with steps: as before, the head's version
        verdict = ledger.verdict(intro)
        if verdict in (Verdict.FAILED, Verdict.HALTED):
            kept[name] = (at, f"{name} kept at {running}: its upgrade to {target} ({intro[:12]}) was {verdict} here; "
                              "`reconciler retry`, or a new version, upgrades it")
        else:
            first.append((depth, intro))
    return Owed(max(first)[1] if first else "", kept)  # the oldest first


def _changed_since(commit: str, name: str, svc: ServiceDef, load: Load) -> bool:
    """``svc`` is a new version of what ``commit`` said (True when that cannot be read)."""
    try:
        then = load(commit).services.get(name) if commit else None
    except ReconcilerError:
        return True
    return then is None or version_changed(then, svc)


def _running_version(ledger: Ledger, service: str, load: Load) -> tuple[str, str]:
    """(version, commit) the service runs here: as last applied, or, stopped by an upgrade under
    way, the version that upgrade started from."""
    rec = ledger.service(service)
    if rec is not None and rec.running is not None:
        try:
            return version_of(load(rec.running.commit).services.get(service)), rec.running.commit
        except ReconcilerError:
            return "", ""
    prior = ledger.upgrade_under_way(service, "")
    return (prior[2], prior[1]) if prior is not None else ("", "")


def bases_in(git: pygit2.Repository, commit: str, repo: DeploymentRepo, load: Load) -> Bases:
    """Each node's base for ``commit``: its parent, or, past commits staged to other nodes, the
    nearest ancestor that took the node in. Read only when the repo has upgrade steps or
    stages: most commits of most repos have neither."""
    if not repo.stages and not any(svc.upgrade for svc in repo.services.values()):
        return {}
    return bases(repo.nodes, _walk(git, commit, load))


def _walk(git: pygit2.Repository, commit: str, load: Load) -> Iterator[tuple[str, DeploymentRepo]]:
    """The commit's first parent, its first parent, ...: each loaded (a commit that does not
    load ends the walk: no version to compare there, no upgrade)."""
    import pygit2  # here, not at the top: an idle agent never walks history (see ``source``)

    try:
        current = git.revparse_single(commit).peel(pygit2.Commit)
    except (KeyError, ValueError, pygit2.GitError):
        return
    for _ in range(WALK):
        try:
            parents = current.parent_ids
            if not parents:
                return
            parent = git.get(parents[0])
            if parent is None:
                return
            current = parent.peel(pygit2.Commit)
            loaded = load(str(current.id))
        except (KeyError, ValueError, AttributeError, pygit2.GitError, ReconcilerError):
            return
        yield str(current.id), loaded
