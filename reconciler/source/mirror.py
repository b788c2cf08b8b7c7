"""The node's mirror of the deployment repo: a cheap ref check, and a fetch only on a move.

Transport is the git CLI through GitPython, so ssh config, credential helpers and protocol v2
behave as they do for the operator's own git. Objects are read with pygit2 (see ``tree``), but
not on a poll that finds nothing new: its two ref reads are files (``refs``) and its check of
the head is a stat of the files that hold it (a ``git cat-file`` when they changed, and every
few minutes), so an idle agent never loads pygit2 (~19 MB of RSS, issue 17) and, with a tip
probe, runs no git at all.

A poll is one ``ls-remote --heads`` of the one branch with protocol v2: the client sends
``ref-prefix refs/heads/`` so the server lists branches only, and the cost stays flat however
many other refs (tags, review refs, other nodes' notes) the remote has. A read remote with a
tip probe (``probe``) is asked over HTTP first, and git only when the probe does not name the
head the node has, or a check is due.

The mirror is a cache. The node's memory (high-water mark, verdicts) lives in its state db and
its notes, so a mirror with a damaged or missing object is re-cloned (``repair``), keeping the
node's own notes refs when they still read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.core import faults
from reconciler.core.errors import CorruptMirror, RemoteError
from reconciler.core.redact import without_userinfo
from reconciler.source.probe import TipProbe
from reconciler.source.refs import NOTES_PREFIX, NotPlain, read_ref

if TYPE_CHECKING:
    import git
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

GIT_TIMEOUT = 120.0
RECHECK_EVERY = 300.0
"""Seconds between reads of the head by git while the files that hold it did not change (a
disk's bit rot keeps a file's stat): how long such damage can wait for the next poll to see it."""


CAUSE_MAX = 400
"""Characters of git's own words kept in a message: enough for a cause, never a screenful."""

_NOISE = re.compile(r"^(hint: |remote: (Enumerating|Counting|Compressing|Total)|(Receiving|Resolving) objects|"
                    r"Looking up .* done\.$)")
# With --progress git writes "Connecting to host (port 9418) ... fatal: ..." on one line.
_CAUSE = re.compile(r"(?:^|\.\.\. )(fatal|error): ", re.IGNORECASE)


def safe_url(url: str) -> str:
    """The URL without credentials, for messages and notes."""
    return without_userinfo(url)


def scrub(text: str, url: str) -> str:
    """``text`` with no credential of ``url`` left in it: git echoes a URL's user part back
    where it takes it for a host name (``git://user:pw@host``), with no scheme in front."""
    text = safe_url(text)
    userinfo = url.partition("://")[2].split("/", 1)[0].rpartition("@")[0]
    if userinfo:
        text = text.replace(userinfo + "@", "")
        secret = userinfo.partition(":")[2]
        if secret:
            text = text.replace(secret, "***")
    return text


def git_cause(stderr: str) -> str:
    """What git said went wrong, on one line: its first paragraph and every ``fatal:`` and
    ``error:`` line with the lines that continue it, without hints and progress."""
    kept: list[str] = []
    first_paragraph, continuing = True, False
    for raw in stderr.replace("\r", "\n").splitlines():
        line = raw.strip()
        if not line:
            first_paragraph = continuing = False
            continue
        if _NOISE.match(line):
            continue
        cause = _CAUSE.search(line)
        if cause or continuing or first_paragraph:
            line = line[cause.end():] if cause else line
            if line not in kept:
                kept.append(line)
            continuing = continuing or bool(cause)
    text = ""
    for line in kept:
        # "unable to connect to host:" continues on the next line with the socket's error
        text += (" " if text.endswith(":") else "; " if text else "") + line
    return text if len(text) <= CAUSE_MAX else text[: CAUSE_MAX - 3] + "..."


_LOCKED = re.compile(r"Unable to create '([^']+\.lock)': File exists")


def stale_lock(stderr: str, root: Path) -> Path | None:
    """The lock file git could not create in the repository at ``root``, when it is older than
    ``GIT_TIMEOUT``: a git process that died holding it left it (git refuses to guess, and
    every later fetch fails the same way). None for any other failure, or a younger lock."""
    found = _LOCKED.search(stderr)
    if found is None:
        return None
    lock = Path(found.group(1))
    lock = Path(os.path.normpath(lock if lock.is_absolute() else root / lock))
    try:
        inside = lock.resolve().is_relative_to(root.resolve())
        old = time.time() - lock.stat().st_mtime > GIT_TIMEOUT
    except OSError:
        return None
    return lock if inside and old else None


def git_env(ssh_command: str | None = None) -> dict[str, str]:
    env = {"GIT_TERMINAL_PROMPT": "0"}
    if ssh_command:
        env["GIT_SSH_COMMAND"] = ssh_command
    return env


@dataclass(frozen=True)
class Poll:
    remote_head: str
    local_head: str | None

    @property
    def moved(self) -> bool:
        return self.remote_head != self.local_head


def _progress() -> Any:
    """Fetch progress on a terminal; silent otherwise. GitPython is imported here only: it is
    12 MB of RSS and a quarter second of import that an idle daemon never needs (issue 17)."""
    import git

    class _Progress(git.RemoteProgress):
        def __init__(self) -> None:
            super().__init__()
            self._last = ""

        def update(self, op_code: int, cur_count: Any, max_count: Any = None, message: str = "") -> None:
            if max_count:
                stage = {self.COUNTING: "counting", self.COMPRESSING: "compressing",
                         self.RECEIVING: "receiving", self.RESOLVING: "resolving"}.get(
                    op_code & self.OP_MASK, "fetching")
                line = f"\r  fetch: {stage} {int(cur_count)}/{int(max_count)} {message}"
                if line != self._last:
                    sys.stderr.write(line.ljust(60))
                    self._last = line
            if op_code & self.END and self._last:
                sys.stderr.write("\n")
                self._last = ""

    return _Progress()


class Source:
    def __init__(
        self, url: str, branch: str, mirror: Path, *, ssh_command: str | None = None,
        progress: bool | None = None, reads: tuple[str, ...] = (), write: str | None = "",
        probes: Mapping[str, TipProbe] | None = None, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reads = reads or (url,)
        self.clock = clock
        self._read: HeadRead | None = None
        self.probes = dict(probes or {})  # read remote -> its tip probe (see ``probe``)
        self.url = self.reads[0]  # the read remote this pass uses: the first that answered
        self.write_url = url if write == "" else write  # this node's notes go there (None: nowhere yet)
        self._lag_said = ""
        self.branch = branch
        self.path = mirror
        self.env = git_env(ssh_command)
        self.progress = sys.stderr.isatty() if progress is None else progress
        self._repo: pygit2.Repository | None = None
        if not (mirror / "HEAD").exists():
            import pygit2

            mirror.parent.mkdir(parents=True, exist_ok=True)
            pygit2.init_repository(str(mirror), bare=True)
        # Opened by git, not pygit2 (see the module's words): HEAD or config unreadable is
        # found now all the same. What git reads and libgit2 does not is found at the first
        # use of ``repo``, and handled there the same way.
        opened = git_result(self.path, f"--git-dir={os.path.abspath(self.path)}", "rev-parse", "--git-dir")
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

    @property
    def ref(self) -> str:
        return f"refs/heads/{self.branch}"

    def run(self, *args: str, what: str, cwd: Path | None = None, url: str | None = None,
            retried: bool = False) -> str:
        """A git command against the remote (``url``: another than the read remote this pass
        uses, for messages); its failure is a ``RemoteError`` with git's words. A plain
        subprocess, as GitPython ran it: C locale (git's messages in English, which
        ``git_cause`` reads), no stdin, a time limit, one trailing newline stripped."""
        env = {**os.environ, **self.env, "LANGUAGE": "C", "LC_ALL": "C"}
        url = url or self.url
        # Its own process group: on a timeout, the ssh or https helper git started goes with it
        # (killing git alone left one orphan per poll of a hung remote).
        proc = subprocess.Popen(["git", "-c", "protocol.version=2", *args], cwd=cwd or self.path, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=GIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise RemoteError(scrub(f"{what} {safe_url(url)} failed: git did not answer within "
                                    f"{GIT_TIMEOUT} s", url)) from None
        if proc.returncode != 0:
            stderr = err.decode(errors="replace").strip()
            if not retried and self._unlock(stderr, cwd or self.path):
                return self.run(*args, what=what, cwd=cwd, url=url, retried=True)
            raise self._failed(what, stderr, proc.returncode, url)
        return out.decode(errors="replace").removesuffix("\n")

    def _fetch_shown(self, refspec: str, retried: bool = False) -> None:
        """The fetch through GitPython, its progress on the terminal; a stale ref lock is
        cleared as ``run`` clears it."""
        import git

        progress = _progress()
        repo = git.Repo(str(self.path))
        try:
            with repo.git.custom_environment(**self.env):
                remote = self._origin(repo)
                remote.fetch(refspec, progress=progress, no_tags=True, kill_after_timeout=GIT_TIMEOUT)
        except git.GitCommandError as exc:
            stderr = self._stderr(exc, progress)
            if not retried and self._unlock(stderr, self.path):
                return self._fetch_shown(refspec, retried=True)
            raise self._failed("fetch from", stderr, exc.status) from None

    def _unlock(self, stderr: str, root: Path) -> bool:
        """Removed the stale ref lock git failed on (see ``stale_lock``): try once more."""
        lock = stale_lock(stderr, root)
        if lock is None:
            return False
        # A git of ours killed while it held the lock (its timeout, or a stop that took the
        # whole cgroup): no git we run lives past GIT_TIMEOUT, so none holds it.
        with contextlib.suppress(OSError):  # gone already (another command of ours removed it): try again
            log.warning("removing %s, left by a git process killed %.0f s ago; trying again", lock,
                        time.time() - lock.stat().st_mtime)
        faults.point("remove", str(lock))
        lock.unlink(missing_ok=True)
        return True

    def _failed(self, what: str, stderr: str, status: object, url: str | None = None) -> RemoteError:
        """``what URL failed: <git's cause>``, free of credentials."""
        cause = git_cause(stderr) or f"git exited with {status}"
        url = url or self.url
        return RemoteError(scrub(f"{what} {safe_url(url)} failed: {cause}", url))

    @staticmethod
    def _stderr(exc: git.GitCommandError, progress: Any = None) -> str:
        """git's own lines of a failed GitPython command."""
        # With a progress handler GitPython keeps only the lines after the first "fatal:" as
        # stderr; the handler saw them all.
        stderr = "\n".join(progress.other_lines + progress.error_lines) if progress else exc.stderr.strip()
        # GitPython wraps git's stderr as "stderr: '...'"; unwrap to git's own lines
        if stderr.startswith("stderr: '") and stderr.endswith("'"):
            stderr = stderr[len("stderr: '"):-1]
        return str(stderr)

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
        proc = git_result(self.path, "notes", f"--ref={ref}", "show", obj)
        if proc.returncode == 0:
            return proc.stdout
        if proc.returncode == 1 and proc.stderr.startswith("error: no note found for object"):
            return None
        try:
            return str(self.repo.lookup_note(obj, ref).message)
        except KeyError:
            return None

    def remote_head(self) -> str:
        """The branch head on the first read remote that answers, from the first on every poll
        (a mirror that failed is asked again first once it is back); ``self.url`` is that remote
        for the rest of the pass."""
        first: RemoteError | None = None
        for url in self.reads:
            self.url = url
            try:
                return self._head_at(url)
            except RemoteError as exc:
                if len(self.reads) == 1:
                    raise
                first = first or exc
                log.warning("%s; trying the next read remote", exc)
        assert first is not None
        raise RemoteError(f"no read remote answered ({len(self.reads)} tried); the first: {first}",
                          reason=first.reason)

    def _head_at(self, url: str) -> str:
        probe = self.probes.get(url)
        if probe is None:
            return self._git_head(url)
        local = self.local_head()
        if probe.unmoved(self.ref, local):
            assert local is not None
            return local
        head = self._git_head(url)
        probe.checked(self.ref, head, local)
        return head

    def _git_head(self, url: str) -> str:
        # --heads makes git send "ref-prefix refs/heads/" (a bare pattern would not: ls-remote
        # patterns match from the tail), so review refs, tags and notes are never listed.
        out = self.run("ls-remote", "--heads", url, self.ref, what="ref check of")
        for line in out.splitlines():
            oid, _, name = line.partition("\t")
            if name == self.ref:
                return oid
        raise RemoteError(f"branch {self.branch!r} not found on {safe_url(url)}", reason="NO_BRANCH")

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

    def _origin(self, repo: git.Repo) -> git.Remote:
        if "origin" not in [r.name for r in repo.remotes]:
            return repo.create_remote("origin", self.url)
        origin = repo.remote("origin")
        if origin.url != self.url:
            origin.set_url(self.url)
        return origin

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
        proc = git_result(self.path, "--no-replace-objects", "-c", "core.commitGraph=false",
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
        proc = git_result(self.path, "--no-replace-objects", "rev-parse", "--verify", "-q", f"{head}^{{tree}}")
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
        proc = git_result(self.path, "fsck", "--connectivity-only", "--no-dangling", "--no-progress")
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
            copied = git_result(fresh, "-c", "fetch.negotiationAlgorithm=noop", "fetch", "--no-tags",
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


def commit_time(mirror: Path, commit: str) -> int | None:
    """The committer time of ``commit`` in ``mirror`` (None: not there), read by git: the
    metrics of an idle agent ask it after every pass, and must not load pygit2 for it."""
    proc = git_result(mirror, "show", "-s", "--format=%ct", f"{commit}^{{commit}}", "--")
    text = proc.stdout.strip()
    return int(text) if proc.returncode == 0 and text.isdigit() else None


def git_result(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """git, never asking a terminal for credentials: its result, never raised (a git that does
    not answer in time, or a directory that is gone, is a failed result whose words say so).
    C locale: ``git_cause``, ``note`` and ``bundles`` read git's English."""
    argv = ["git", *args]
    try:
        return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=GIT_TIMEOUT,
                              env={**os.environ, "GIT_TERMINAL_PROMPT": "0", "LANGUAGE": "C", "LC_ALL": "C"})
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, -signal.SIGKILL, "", f"fatal: git did not answer within "
                                           f"{GIT_TIMEOUT:.0f} s")
    except OSError as exc:
        return subprocess.CompletedProcess(argv, 128, "", f"fatal: cannot run git in {cwd}: {exc.strerror}")
