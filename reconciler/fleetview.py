"""Every node's notes as a ``FleetView``, from any git repo: the node's mirror or a reviewer's
clone. The one place that reads ``refs/notes/reconciler/*``; the agent's rollout gate,
``status --fleet`` and ``history --fleet`` all go through it.

A clone gets the notes with ``fetch_from_clone``: one fetch of the notes refs (and the branch)
into refs of our own under ``refs/reconciler/``, so the operator's own refs and notes are
left alone. No node settings, state dir or trust root: notes are reports, not instructions.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

import pygit2

from . import notes
from .errors import BadInput, RemoteError
from .notes import CLAIM_OBJECT, Claim, Note
from .refs import NOTES_PREFIX
from .rollout import FleetView
from .source import GIT_TIMEOUT, git_cause, scrub

FLEET_PREFIX = "refs/reconciler/fleet/"  # where a fetch puts each node's notes ref
BRANCH_PREFIX = "refs/reconciler/branch/"  # where a clone's fetch puts the branch followed


def fleet_view(repo: pygit2.Repository, prefix: str = FLEET_PREFIX,
               own: Mapping[str, str] | None = None) -> FleetView:
    """The notes under ``prefix`` (one ref per node, named after it); ``own``: node -> ref for
    notes kept elsewhere (a node's own, fresher than what it fetched back)."""
    refs = {r.removeprefix(prefix): r for r in repo.references if r.startswith(prefix)}
    refs.update(own or {})
    found: dict[str, tuple[Note, ...]] = {}
    claims: dict[str, Claim] = {}
    for node, ref in sorted(refs.items()):
        try:
            entries = list(repo.notes(ref))  # type: ignore[call-arg]  # stub lacks ref
        except (KeyError, pygit2.GitError):
            entries = []
        parsed = []
        for entry in entries:
            data = notes.decode(entry.message)
            if data is None:  # a note that is not ours is not a node's report
                continue
            if str(entry.annotated_id) == CLAIM_OBJECT:
                claim = Claim.parse(node, data)
                if claim is not None:
                    claims[node] = claim
            else:
                parsed.append(Note.parse(node, str(entry.annotated_id), data))
        found[node] = tuple(parsed)

    def descends(a: str, b: str) -> bool:
        from .trust import is_descendant

        return is_descendant(repo, a, b)

    return FleetView(found, descends, claims)


def open_clone(repo_dir: Path) -> pygit2.Repository:
    try:
        return pygit2.Repository(str(repo_dir))
    except pygit2.GitError as exc:
        raise BadInput(f"{repo_dir}: not a git repository (give --repo, a clone of the deployment repo)") from exc


def fetch_from_clone(repo_dir: Path, remote: str, branch: str) -> str:
    """Fetch every node's notes and ``branch`` from ``remote`` (a remote's name or a URL) into
    the clone at ``repo_dir``; the branch head's commit id."""
    repo = open_clone(repo_dir)
    if "/" not in remote and ":" not in remote and remote not in repo.remotes.names():
        raise BadInput(f"{repo_dir}: no remote named {remote!r} (give --remote NAME_OR_URL)")
    url = repo.remotes[remote].url if remote in repo.remotes.names() else remote
    try:
        subprocess.run(
            ["git", "-c", "protocol.version=2", "fetch", "--quiet", "--no-tags", "--prune", "--no-write-fetch-head",
             remote, f"+{NOTES_PREFIX}*:{FLEET_PREFIX}*", f"+refs/heads/{branch}:{BRANCH_PREFIX}{branch}"],
            cwd=repo_dir, check=True, capture_output=True, text=True, timeout=GIT_TIMEOUT)
    except subprocess.CalledProcessError as exc:
        cause = git_cause(exc.stderr) or f"git exited with {exc.returncode}"
        raise RemoteError(scrub(f"notes fetch from {url} failed: {cause}", url or "")) from None
    except subprocess.TimeoutExpired:
        raise RemoteError(scrub(f"notes fetch from {url} timed out after {GIT_TIMEOUT:.0f}s", url or "")) from None
    return str(open_clone(repo_dir).references[f"{BRANCH_PREFIX}{branch}"].target)


def resolve(repo: pygit2.Repository, rev: str) -> str:
    try:
        return str(repo.revparse_single(rev).peel(pygit2.Commit).id)
    except (KeyError, ValueError, pygit2.GitError) as exc:
        raise BadInput(f"unknown commit {rev!r} in {repo.workdir or repo.path}") from exc
