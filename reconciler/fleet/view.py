"""Every node's notes as a ``FleetView``, from any git repo: the node's mirror or a reviewer's
clone. The one place that reads ``refs/notes/reconciler/*``; the agent's rollout gate,
``status --fleet`` and ``history --fleet`` all go through it.

A clone gets the notes with ``fetch_from_clone``: one fetch of the notes refs (and the branch)
into refs of our own under ``refs/reconciler/``, so the operator's own refs and notes are
left alone. No node settings, state dir or trust root: notes are reports, not instructions.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pygit2

from reconciler.core.errors import BadInput, RemoteError
from reconciler.core.memo import Bounded
from reconciler.fleet import notes
from reconciler.fleet.known import KnownNotes
from reconciler.fleet.notejson import MAX_NOTE
from reconciler.fleet.notes import CLAIM_OBJECT, Claim, Note
from reconciler.fleet.rollout import FleetView
from reconciler.source.gitrun import GIT_TIMEOUT, git_cause, scrub
from reconciler.source.refs import NOTES_PREFIX
from reconciler.trust.notesig import NoteTrust

log = logging.getLogger("reconciler.fleet")

FLEET_PREFIX = "refs/reconciler/fleet/"  # where a fetch puts each node's notes ref
BRANCH_PREFIX = "refs/reconciler/branch/"  # where a clone's fetch puts the branch followed


def fleet_view(repo: pygit2.Repository, prefix: str = FLEET_PREFIX,
               own: Mapping[str, str] | None = None, trust: NoteTrust | None = None,
               at: datetime | None = None, known: KnownNotes | None = None,
               about: str | None = None) -> FleetView:
    """The notes under ``prefix`` (one ref per node, named after it); ``own``: node -> ref for
    notes kept elsewhere (a node's own, fresher than what it fetched back). Only notes that
    ``trust`` accepts (signed by their node's key in ``trust/nodes``) count; None: no note
    counts, since nothing says whose key speaks for whom. ``known``: the notes that counted
    under this same trust before (``fleet.known``, the user's cache), decoded as any note is
    but their signatures not checked again; the notes that count now are added to it.
    ``about``: a view of that commit only (``status --fleet``), of the notes it shows
    (``Shown``): the rest of each node's history is neither verified nor in the view."""
    # Each node's notes ref and its commit, listed in one pass (a lookup by name costs as much again)
    refs = {r.name.removeprefix(prefix): _target(r) for r in repo.references.iterator() if r.name.startswith(prefix)}
    refs.update({node: _target(repo.references.get(ref)) for node, ref in (own or {}).items()})
    trust = trust if trust is not None else NoteTrust(problem="no trust/nodes to check notes against")
    at = at or datetime.now(UTC)
    from reconciler.repo.tree import reading

    commits: dict[pygit2.Oid, bool] = {}  # object -> a commit: a fleet's notes are on a few
    shown = None if about is None else Shown(repo, about)
    found: dict[str, list[Note]] = {}
    claims: dict[str, Claim] = {}
    rejected: dict[str, list[tuple[str, str]]] = {}
    # Notes read, not yet judged: judged a batch at a time, their outcomes taken in the order they
    # were read. Reading a batch, then checking its signatures, costs some 0.3 s less CPU for
    # 10,000 notes than one note after the other (git's, JSON's and the signature check's code
    # and tables each stay warm); a batch keeps few bodies alive besides those ``_DECODED`` keeps.
    batch: list[tuple[str, str, str, dict[str, Any] | notes.Malformed, Note | None, bool]] = []

    def settle() -> None:
        judged = batch.copy()  # (taken first: a judge that raises leaves none to judge again)
        batch.clear()
        for node, obj, blob, data, note, kept in judged:
            if isinstance(data, notes.Malformed):
                _said(data, blob)
                rejected.setdefault(node, []).append((data.obj, str(data)))
                continue
            why = None if kept else _judged(trust, node, obj, blob, data, at)
            if why is not None:
                rejected.setdefault(node, []).append((obj, why))
                continue
            if known is not None and not kept:
                known.add(node, obj, blob)
            if note is not None:
                found[node].append(note)
            elif (claim := Claim.parse(node, data)) is not None:
                claims[node] = claim

    with reading(repo):
        try:
            for node, ref in sorted(refs.items()):
                try:
                    entries = notes_in(repo, ref)
                except (KeyError, ValueError, pygit2.GitError):  # no commit, or a tree the object store lacks
                    entries = []
                found[node] = []
                for obj_id, blob_id in entries:
                    obj, blob = str(obj_id), str(blob_id)
                    kept = known is not None and known.holds(node, obj, blob)
                    data = _read(repo, node, obj_id, blob_id, kept, commits)
                    if data is None:  # on a tree or a blob: no node's report (nor mirror damage)
                        continue
                    note = None
                    if not isinstance(data, notes.Malformed):  # (a malformed one: said, in its turn)
                        # What it says, not yet that it counts.
                        note = None if obj == CLAIM_OBJECT else Note.parse(node, obj, data)
                        if shown is not None and (note is None or not shown(note)):
                            continue  # not in this commit's status (a claim is in none): neither judged nor shown
                    batch.append((node, obj, blob, data, note, kept))
                    if len(batch) >= _BATCH:
                        settle()
        finally:  # a read that failed (damage): the notes read before it judged and said, as one at a time
            settle()
    if known is not None:
        known.save()

    def descends(a: str, b: str) -> bool:
        from reconciler.trust.verify import is_descendant

        return is_descendant(repo, a, b)

    return FleetView({n: tuple(f) for n, f in found.items()}, descends, claims,
                     {n: tuple(r) for n, r in rejected.items()})


_BATCH = 64  # notes read before they are judged: at most 4 MiB of bodies (64 KiB each) kept for it


def _target(ref: pygit2.Reference | None) -> pygit2.Oid | None:
    """The object a (notes) ref names, through a symbolic one; None for none."""
    try:
        target = None if ref is None else ref.target if isinstance(ref.target, pygit2.Oid) else ref.resolve().target
    except (KeyError, pygit2.GitError):
        return None
    return target if isinstance(target, pygit2.Oid) else None


_HEX = "0123456789abcdefABCDEF"
_TREE, _GITLINK = int(pygit2.enums.ObjectType.TREE), int(pygit2.enums.ObjectType.COMMIT)  # an entry's ``type``
_NOTE_NAME = 40  # hex digits of the object a note is on: its path in the notes tree, fanout's slashes aside


def notes_in(repo: pygit2.Repository, commit: pygit2.Oid | None) -> list[tuple[pygit2.Oid, pygit2.Oid]]:
    """(the object, the note's blob) of each note in the notes commit ``commit``: what libgit2's
    ``repo.notes(ref)`` lists (a path of hex digits naming an object, split by fanout directories
    or not, in the order the trees hold them), read off the commit's tree directly: 7 us a ref
    against 11 (a fleet's 10,000 refs, cold). No note for what the iterator reads as garbage (a
    path that is no object's name: it hands out an object id it never set), nor for a gitlink
    (which it lists, and git does not: its commit is not here to read). KeyError, ValueError
    or GitError where it fails: no commit there, a tree missing or not one."""
    if commit is None:
        return []
    made = repo[commit]
    if not isinstance(made, pygit2.Commit):
        raise ValueError(f"{commit}: not a commit")
    found: list[tuple[pygit2.Oid, pygit2.Oid]] = []
    frames, paths = [iter(made.tree)], [""]
    while frames:
        for entry in frames[-1]:
            path = paths[-1] + (entry.name or "").replace("/", "")
            if len(path) > _NOTE_NAME or path.strip(_HEX):
                continue  # no object's name, whatever is below
            kind = entry.type  # by the mode as git stores it (``filemode`` is libgit2's reading of it)
            if kind == _TREE:
                below = repo[entry.id]
                if not isinstance(below, pygit2.Tree):
                    raise ValueError(f"{entry.id}: not a tree")
                frames.append(iter(below))
                paths.append(path)
                break  # its notes before the next entry's, as libgit2 walks a tree
            # A gitlink names a commit no repository need hold (a push takes one, absent, where
            # it takes no absent blob): no note, as git reads it, and not an object to read.
            if len(path) == _NOTE_NAME and kind != _GITLINK:
                found.append((pygit2.Oid(hex=path.lower()), entry.id))
        else:
            frames.pop()
            paths.pop()
    return found


class Shown:
    """Which notes the status of ``commit`` shows: those on it, on a commit that descends from
    it (a node that applied a later one), and one that refused to rewind to it (on the commit
    the node runs); not the rest of a node's history, nor its claim."""

    def __init__(self, repo: pygit2.Repository, commit: str) -> None:
        self.repo, self.commit = repo, commit
        self._below: dict[str, bool] = {}  # object -> descends from the commit

    def __call__(self, note: Note) -> bool:
        if note.commit == self.commit or note.refused_head == self.commit:
            return True
        below = self._below.get(note.commit)
        if below is None:
            from reconciler.trust.verify import is_descendant

            below = self._below[note.commit] = is_descendant(self.repo, note.commit, self.commit)
        return below


def _read(repo: pygit2.Repository, node: str, obj_id: pygit2.Oid, blob_id: pygit2.Oid, kept: bool = False,
          commits: dict[pygit2.Oid, bool] | None = None) -> dict[str, Any] | notes.Malformed | None:
    """``node``'s note (``blob_id``) on ``obj_id`` through the one bounded decoder
    (``fleet.notejson``): its body, why it is malformed, or None for a note on an object that
    is neither a commit nor the claim object (a tree's would otherwise reach the commit graph,
    which would read it as damage and re-clone the mirror on every poll). ``kept``: a note
    that counted before (``fleet.known``), on a commit then (an id names its type too).
    ``commits``: what the object ids asked before are, a commit or not. Within ``reading``."""
    obj = str(obj_id)
    odb = repo.odb
    if obj != CLAIM_OBJECT and not kept:  # kept: on a commit when it counted (an id names its type too)
        is_commit = commits.get(obj_id) if commits is not None else None
        if is_commit is None:
            try:
                is_commit = odb.read_header(obj_id)[0] == pygit2.enums.ObjectType.COMMIT
            except KeyError:
                is_commit = True  # not here (another branch's commit): no commit this reader asks about
            if commits is not None:
                commits[obj_id] = is_commit
        if not is_commit:
            return None
    blob = str(blob_id)
    read = _DECODED.lookup(blob)[1]  # a body or a reason, never None once kept
    if read is None:
        size = odb.read_header(blob_id)[1]  # the size first: a 20 MB note is never read
        if size > MAX_NOTE:
            read = f"{size} bytes, more than {MAX_NOTE // 1024} KiB"
        else:
            # Kept or not, through the decoder: the cache vouches for a signature, never
            # for a parse (plain json.loads takes what the bounds refuse: 1e999, a lone
            # surrogate, a 5,000-digit number, a text of megabytes).
            body = notes.body(node, obj, odb.read(blob_id)[1])
            read = body.why if isinstance(body, notes.Malformed) else body
        _DECODED.put(blob, read, size if isinstance(read, dict) else len(read))
    return read if isinstance(read, dict) else notes.Malformed(node, obj, read)


def _said(data: notes.Malformed, blob: str) -> None:
    """A malformed note said once per note (node, object, blob), not on every read."""
    if (key := (data.node, data.obj, blob)) not in _SAID:
        _SAID.put(key, True)
        log.warning("%s", data)


# Notes are content-addressed (``blob``): each is decoded once per process, and checked once
# per trust, not on every view of every pass. The bodies are bounded by bytes too: a note
# written to decode big (``[{}, {}, ...]``) takes some 24 times its text as objects (4 MiB of
# notes: about 100 MiB at worst, ~2000 honest notes). A body kept is shared by every reader
# after it: each only reads it.
_DECODED: Bounded[str, dict[str, Any] | str] = Bounded(8192, 4 * 1024 * 1024)  # blob -> body, or why malformed
_SAID: Bounded[tuple[str, str, str], bool] = Bounded(4096)  # malformed notes said already: (node, object, blob)
_CHECKED: Bounded[tuple[int, str, str, str, int], str | None] = Bounded(8192)  # -> why it does not count


def _judged(trust: NoteTrust, node: str, obj: str, blob: str, data: Mapping[str, Any], at: datetime) -> str | None:
    """Why ``node``'s note on ``obj`` does not count (None: it does); judged again each minute
    only where a key has a validity window."""
    key = (trust.ident, node, obj, blob, 0 if trust.timeless else int(at.timestamp()) // 60)
    known, why = _CHECKED.lookup(key)
    return why if known else _CHECKED.put(key, trust.judge(node, obj, data, at))


def open_clone(repo_dir: Path) -> pygit2.Repository:
    try:
        return pygit2.Repository(str(repo_dir))
    except pygit2.GitError as exc:
        raise BadInput(f"{repo_dir}: not a git repository (give --repo, a clone of the deployment repo)") from exc


def remote_source(repo: pygit2.Repository, repo_dir: Path, remote: str) -> str:
    """What git fetches from for ``--remote``: a remote of the clone (its URL), a URL or git's
    scp form as given, or a path that exists (made absolute: git may run in another directory).
    Anything else is a typo of a remote's name, not a directory for git to try."""
    names = [n for n in repo.remotes.names() if n]
    if remote in names:
        return str(repo.remotes[remote].url)
    if "://" in remote or (":" in remote and "/" not in remote.split(":", 1)[0]):
        return remote
    if Path(remote).exists():
        return str(Path(remote).resolve())
    raise BadInput(f"--remote {remote!r}: not a remote of {repo_dir} (it has: {', '.join(names) or 'none'}) "
                   "nor a URL or path")


def fetch_from_clone(repo_dir: Path, remote: str, branch: str) -> str:
    """Fetch every node's notes and ``branch`` from ``remote`` (a remote's name or a URL) into
    the clone at ``repo_dir``; the branch head's commit id."""
    repo = open_clone(repo_dir)
    url = remote_source(repo, repo_dir, remote)
    named = remote in repo.remotes.names()  # by its name: the remote's own settings apply
    try:
        subprocess.run(
            ["git", "-c", "protocol.version=2", "fetch", "--quiet", "--no-tags", "--prune", "--no-write-fetch-head",
             remote if named else url, f"+{NOTES_PREFIX}*:{FLEET_PREFIX}*",
             f"+refs/heads/{branch}:{BRANCH_PREFIX}{branch}"],
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
