"""Each node's facts as review tools render with them: what the node last published in its
notes (read from a clone, decoded within bounds and checked against ``trust/nodes``), else the
inventory's stand-ins, and which of the two it was, said per node.

A node's notes are in a clone as the node pushed them (``refs/notes/reconciler/<node>``, when
the reviewer fetched them) or as ``status --fleet`` fetched them (``refs/reconciler/fleet/``);
the newest note that carries facts wins, by its time. A note that does not count (unsigned,
signed by another key, out of bounds) gives none: a node's word on its facts is only its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from reconciler.core.model.facts import Facts
from reconciler.render.facts import NodeFacts
from reconciler.repo.definitions import DeploymentRepo

NOTES = ("refs/notes/reconciler/", "refs/reconciler/fleet/")  # a node's own ref, status --fleet's copy


@dataclass(frozen=True)
class Published:
    facts: Facts
    commit: str  # the commit whose note carries them
    time: str  # when the node wrote that note


def published(repo_dir: Path, trusted_at: str | None) -> dict[str, Published]:
    """Node -> its last published facts, from the notes in the clone at ``repo_dir`` (none when
    it is no git repository, or holds no notes). ``trusted_at``: the commit whose
    ``trust/nodes`` says whose signature counts (None: HEAD)."""
    import pygit2

    from reconciler.fleet.view import fleet_view
    from reconciler.trust.notesig import note_trust

    try:
        repo = pygit2.Repository(str(repo_dir))
        at = str(repo.revparse_single(trusted_at or "HEAD").peel(pygit2.Commit).id)
    except (pygit2.GitError, KeyError, ValueError):
        return {}
    trust = note_trust(repo, at)
    found: dict[str, Published] = {}
    for prefix in NOTES:
        if not any(r.startswith(prefix) for r in repo.references):
            continue
        for node, notes in fleet_view(repo, prefix, trust=trust).notes.items():
            for note in notes:
                if note.facts is not None and (node not in found or note.time > found[node].time):
                    found[node] = Published(note.facts, note.commit, note.time)
    return found


def for_review(repo: DeploymentRepo, node: str, known: Mapping[str, Published]) -> NodeFacts:
    """The facts ``node`` renders with in review, and where they come from."""
    values = repo.node_vars(node) if node in repo.nodes else {}
    if "facts" in values or "ansible_facts" in values:
        return NodeFacts(known[node].facts if node in known else None, "the inventory's stand-ins")
    if node in known:
        p = known[node]
        return NodeFacts(p.facts, f"as {node} published them on {p.commit[:12]} at {p.time}")
    return NodeFacts(None, f"none: no note of {node} publishes facts, and its inventory has no 'facts' stand-in")


def said(used: Iterable[tuple[str, NodeFacts]]) -> list[str]:
    """One line per node whose render read facts that were not the node's published ones."""
    return [f"node {node}: facts: {f.source}" for node, f in used if f.read and not f.source.startswith("as ")]
