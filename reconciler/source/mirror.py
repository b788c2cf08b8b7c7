"""The node's mirror of the deployment repo: a cheap ref check, and a fetch only on a move.

Transport is the git CLI through GitPython, so ssh config, credential helpers and protocol v2
behave as they do for the operator's own git. Objects are read with pygit2 (see ``tree``), but
not on a poll that finds nothing new: its two ref reads are files (``refs``) and its check of
the head is a stat of the files that hold it (a ``git cat-file`` when they changed, and every
few minutes), so an idle agent never loads pygit2 (~19 MB of RSS, issue 17) and, with a tip
probe, runs no git at all.

The mirror is a cache. The node's memory (high-water mark, verdicts) lives in its state db and
its notes, so a mirror with a damaged or missing object is re-cloned (``repair``), keeping the
node's own notes refs when they still read.

Running git is ``gitrun``; the remotes the mirror polls and fetches from are ``remotes``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from reconciler.core import faults
from reconciler.core.errors import CorruptMirror, RemoteError
from reconciler.core.warmup import warming
from reconciler.source import gitrun
from reconciler.source.gitrun import git_cause, safe_url
from reconciler.source.probe import TipProbe
from reconciler.source.refs import NOTES_PREFIX, NotPlain, read_ref
from reconciler.source.remotes import Remotes

if TYPE_CHECKING:
    import pygit2

log = logging.getLogger("reconciler.source")

Stat = tuple[tuple[str, int, int, int, int], ...] | None


@dataclass(frozen=True)
class HeadRead:
    """The head git last read whole (``Source.check``): its root tree, the stat of the files
    that hold both, and when."""

    head: str
    tree: str
    files: Stat
    at: float


RECHECK_EVERY = 300.0
"""Seconds between reads of the head by git while the files that hold it did not change (a
disk's bit rot keeps a file's stat): how long such damage can wait for the next poll to see it."""


@dataclass(frozen=True)
class Poll:
    remote_head: str
    local_head: str | None

    @property
    def moved(self) -> bool:
        return self.remote_head != self.local_head


class Source(Remotes):
    """The node's mirror: its head, its notes, a poll and a fetch, and a repair when damaged."""

    def __init__(
        self, url: str, branch: str, mirror: Path, *, ssh_command: str | None = None,
        progress: bool | None = None, reads: tuple[str, ...] = (), write: str | None = "",
        probes: Mapping[str, TipProbe] | None = None, clock: Callable[[], float] = time.monotonic,
        warm: Sequence[str] = (),
    ) -> None:
        super().__init__(url, branch, mirror, ssh_command=ssh_command, progress=progress, reads=reads,
                         write=write, probes=probes)
        self.clock = clock
        self.warm = warm  # imported while a fetch waits on git (``core.warmup``)
        self._read: HeadRead | None = None
        self._lag_said = ""
        self._repo: pygit2.Repository | None = None
        if not (mirror / "HEAD").exists():
            import pygit2

            mirror.parent.mkdir(parents=True, exist_ok=True)
            pygit2.init_repository(str(mirror), bare=True)
        # Opened by git, not pygit2 (see the module's words): HEAD or config unreadable is
        # found now all the same. What git reads and libgit2 does not is found at the first
        # use of ``repo``, and handled there the same way.
        opened = gitrun.git_result(self.path, f"--git-dir={os.path.abspath(self.path)}", "rev-parse", "--git-dir")
        if opened.returncode != 0:
            self._start_again(git_cause(opened.stderr) or f"git exited with {opened.returncode}")

    @property
    def repo(self) -> pygit2.Repository:
        """The mirror through pygit2, opened on first use: a poll that finds nothing new
        never needs it."""
        if self._repo is None:
            import pygit2

            try:
                self._repo = pygit2.Repository(str(self.path))
            except pygit2.GitError as exc:
                self._start_again(exc)
        assert self._repo is not None
        return self._repo

    def _start_again(self, cause: object) -> None:
        """HEAD or config unreadable: start empty; the next poll finds no head and clones."""
        import pygit2

        log.warning("mirror %s cannot be opened (%s): replaced by an empty one, re-cloned on the next poll",
                    self.path, cause)
        fresh = self._sibling(".new")
        faults.point("clone", str(fresh))
        pygit2.init_repository(str(fresh), bare=True)
        self._swap(fresh)
    def local_head(self) -> str | None:
        return self.ref_target(self.ref)

    def ref_target(self, name: str) -> str | None:
        """Where the mirror's ref ``name`` points (None: it has none), read from its files when
        they say it plainly, else by pygit2."""
        try:
            return read_ref(self.path, name)
        except NotPlain:
            pass
        try:
            return str(self.repo.references[name].target)
        except KeyError:
            return None

    def note(self, ref: str, obj: str) -> str | None:
        """The note ``ref`` holds on ``obj`` (None: none), read by git, not pygit2 (see the
        module's words); what git cannot read is asked of pygit2, which says what it always said."""
        proc = gitrun.git_result(self.path, "notes", f"--ref={ref}", "show", obj)
        if proc.returncode == 0:
            return proc.stdout
        if proc.returncode == 1 and proc.stderr.startswith("error: no note found for object"):
            return None
        try:
            return str(self.repo.lookup_note(obj, ref).message)
        except KeyError:
            return None
    def lags(self, remote_head: str, local_head: str | None) -> bool:
        """A read mirror behind what this node has (its head an ancestor of ours): it lags, and
        the node stays where it is. Only a mirror: the write remote (the primary) going back is a
        rewind, and is judged by trust like any other head."""
        if local_head is None or self.url == self.write_url or remote_head not in self.repo:
            return False
        import pygit2

        try:
            return bool(self.repo.descendant_of(local_head, remote_head))
        except pygit2.GitError:
            return False

    def poll(self) -> Poll:
        return Poll(self.remote_head(), self.local_head())

    def fetch(self) -> str:
        """Fetch the branch into the mirror; return its new head. ``CorruptMirror`` when the
        fetch failed on our side (git walks the mirror's commits to negotiate)."""
        refspec = f"+{self.ref}:{self.ref}"
        try:
            if self.progress:
                self._fetch_shown(refspec)
            else:
                with warming(self.warm):
                    self.run("fetch", "--no-tags", self.url, refspec, what="fetch from")
        except RemoteError as exc:
            if self.damaged():
                raise CorruptMirror(f"{exc}; git fsck finds {self.path} damaged") from exc
            raise
        import pygit2

        self._repo = pygit2.Repository(str(self.path))
        head = self.local_head()
        if head is None:
            raise RemoteError(f"fetch from {safe_url(self.url)} brought no {self.ref}")
        return head

    def update(self) -> tuple[str, bool]:
        """One poll; fetch only if the branch moved. Returns (head, fetched). A damaged mirror
        met on the way (its head unreadable, a fetch failing on our side) is re-cloned."""
        self._sweep()
        p = self.poll()
        try:
            if p.moved and self.lags(p.remote_head, p.local_head):
                if self._lag_said != p.remote_head:
                    log.warning("read remote %s lags (at %s, an ancestor of %s): staying at %s",
                                safe_url(self.url), p.remote_head[:12], str(p.local_head)[:12], str(p.local_head)[:12])
                    self._lag_said = p.remote_head
                self.check(p.local_head)
                return str(p.local_head), False
            if not p.moved:
                self.check(p.local_head)
                return p.remote_head, False
            return self.fetch(), True
        except CorruptMirror as exc:
            return self.repair(exc), True

    # a damaged mirror ------------------------------------------------------------------
    def check(self, head: str | None) -> None:
        """``CorruptMirror`` unless the head commit and its root tree read back: two object
        reads, so every poll notices a damaged head without waiting for a new commit. Read by
        git when the head moved, when a file that can hold either object changed (written,
        replaced, removed, a pack added) since the last read, and every ``RECHECK_EVERY``
        seconds; a stat of those files otherwise, so an idle poll runs no git (issue 17)."""
        if head is None:
            return
        last = self._read if self._read is not None and self._read.head == head else None
        # Stat before the read: a file changed during it differs from this next time.
        before = self._stat(head, last.tree) if last is not None else None
        if (last is not None and before is not None and before == last.files
                and 0 <= self.clock() - last.at < RECHECK_EVERY):
            return
        self._read = None
        # A git process, not pygit2 (an idle agent does not load it): always a fresh read, of
        # the whole of both objects, their hashes checked (git's parse_object), as libgit2's
        # strict verification did. No commit-graph: it could name the tree without reading
        # the commit; no replace refs: libgit2 did not follow them.
        proc = gitrun.git_result(self.path, "--no-replace-objects", "-c", "core.commitGraph=false",
                          "cat-file", "-p", f"{head}^{{tree}}")
        if proc.returncode != 0:
            cause = git_cause(proc.stderr) or f"git exited with {proc.returncode}"
            raise CorruptMirror(f"{os.path.abspath(self.path)}: cannot read an object ({cause})")
        if last is not None:
            self._read = HeadRead(head, last.tree, before, self.clock())
        elif tree := self._tree(head):  # once per head
            self._read = HeadRead(head, tree, self._stat(head, tree), self.clock())

    def _tree(self, head: str) -> str:
        """The head's root tree ("": unknown, and every poll reads the head by git)."""
        proc = gitrun.git_result(self.path, "--no-replace-objects", "rev-parse", "--verify", "-q", f"{head}^{{tree}}")
        return proc.stdout.strip() if proc.returncode == 0 else ""

    def _stat(self, *oids: str) -> Stat:
        """What changes when a file that can hold these objects does: their loose files (or
        their absence), every file of the packs directory. None (never the same): objects
        borrowed from another repository (alternates), or a directory that cannot be read."""
        objects = self.path / "objects"
        try:
            if (objects / "info" / "alternates").exists():
                return None
            seen: list[tuple[str, int, int, int, int]] = []
            for oid in oids:
                with contextlib.suppress(FileNotFoundError):
                    st = os.stat(objects / oid[:2] / oid[2:])
                    seen.append((oid, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
            with os.scandir(objects / "pack") as entries:
                for e in entries:
                    st = e.stat(follow_symlinks=False)
                    seen.append((e.name, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        except OSError:
            return None
        return tuple(sorted(seen))

    def damaged(self) -> bool:
        """Does the mirror fail git's connectivity check (every reachable commit and tree
        parsed, blobs looked up)? Asked only when a fetch failed, to tell our damage from the
        remote's trouble."""
        proc = gitrun.git_result(self.path, "fsck", "--connectivity-only", "--no-dangling", "--no-progress")
        return proc.returncode != 0

    def repair(self, cause: object = "") -> str:
        """Re-clone the mirror from the remote and return the branch head. The clone is made
        beside the damaged mirror and swapped in once complete, so a remote that fails now
        leaves things as they were; the node's notes refs come along when they read."""
        self._sweep()
        fresh = self._sibling(".new")
        faults.point("clone", str(fresh))
        import pygit2

        pygit2.init_repository(str(fresh), bare=True)
        try:
            self.run("fetch", "--no-tags", self.url, f"+{self.ref}:{self.ref}", what="re-clone from", cwd=fresh)
            kept, lost = self._carry_notes(fresh)
        except BaseException:
            shutil.rmtree(fresh, ignore_errors=True)
            raise
        self._swap(fresh)
        log.warning("mirror %s was damaged: re-cloned from %s%s%s; the damage: %s", self.path, safe_url(self.url),
                    f"; kept notes {', '.join(kept)}" if kept else "",
                    f"; notes {', '.join(lost)} unreadable, fetched again from the remote" if lost else "", cause)
        head = self.local_head()
        if head is None:
            raise RemoteError(f"re-clone from {safe_url(self.url)} brought no {self.ref}")
        return head

    def _carry_notes(self, fresh: Path) -> tuple[list[str], list[str]]:
        """Copy the notes refs from the damaged mirror: a note whose push failed is nowhere
        else. One that cannot be read is left behind; the reporter fetches the node's own from
        the remote when it finds none (``Reporter.recover``)."""
        import pygit2

        try:
            refs = sorted(r for r in self.repo.references if r.startswith(NOTES_PREFIX))
        except pygit2.GitError:
            return [], [NOTES_PREFIX + "*"]
        kept: list[str] = []
        lost: list[str] = []
        for ref in refs:
            # A real fetch, not a copy of files: index-pack inflates every object it receives.
            # No "have"s: the damaged side would have to read the commits they name.
            copied = gitrun.git_result(fresh, "-c", "fetch.negotiationAlgorithm=noop", "fetch", "--no-tags",
                                str(self.path), f"+{ref}:{ref}").returncode == 0
            (kept if copied else lost).append(ref)
        return kept, lost

    def _sibling(self, suffix: str) -> Path:
        return self.path.with_name(self.path.name + suffix)

    def _swap(self, fresh: Path) -> None:
        """Put ``fresh`` where the mirror is; the old one is moved aside, then deleted."""
        aside = self._sibling(".broken")
        if self.path.exists():
            faults.point("rename", f"{self.path} -> {aside}")
            os.rename(self.path, aside)
        faults.point("rename", f"{fresh} -> {self.path}")
        os.rename(fresh, self.path)
        faults.point("remove", str(aside))
        shutil.rmtree(aside, ignore_errors=True)
        import pygit2

        self._repo = pygit2.Repository(str(self.path))

    def _sweep(self) -> None:
        """Remove what a repair killed half-way left: a partial clone, a damaged copy."""
        for suffix in (".new", ".broken"):
            left = self._sibling(suffix)
            if left.exists():
                faults.point("remove", str(left))
                shutil.rmtree(left, ignore_errors=True)

