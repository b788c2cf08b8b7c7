"""The remotes of the deployment repo as the node's mirror meets them: the read remotes it
polls in order, the write remote its notes go to, and the git commands run against them.

A poll is one ``ls-remote --heads`` of the one branch with protocol v2: the client sends
``ref-prefix refs/heads/`` so the server lists branches only, and the cost stays flat however
many other refs (tags, review refs, other nodes' notes) the remote has. A read remote with a
tip probe (``probe``) is asked over HTTP first, and git only when the probe does not name the
head the node has, or a check is due.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.core import faults
from reconciler.core.errors import RemoteError
from reconciler.source.gitrun import GIT_TIMEOUT, git_cause, git_env, in_group, safe_url, scrub, stale_lock
from reconciler.source.probe import TipProbe

if TYPE_CHECKING:
    import git

log = logging.getLogger("reconciler.source")


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


class Remotes:
    """Where the mirror's branch comes from and its notes go: the git commands against the
    remotes, their failures as ``RemoteError`` with git's words. ``Source`` is the mirror."""

    def __init__(
        self, url: str, branch: str, mirror: Path, *, ssh_command: str | None = None,
        progress: bool | None = None, reads: tuple[str, ...] = (), write: str | None = "",
        probes: Mapping[str, TipProbe] | None = None,
    ) -> None:
        self.reads = reads or (url,)
        self.probes = dict(probes or {})  # read remote -> its tip probe (see ``probe``)
        self.url = self.reads[0]  # the read remote this pass uses: the first that answered
        self.write_url = url if write == "" else write  # this node's notes go there (None: nowhere yet)
        self.branch = branch
        self.path = mirror
        self.env = git_env(ssh_command)
        self.progress = sys.stderr.isatty() if progress is None else progress

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
        # Its own process group (``in_group``): on a timeout, the ssh or https helper git started
        # goes with it (killing git alone left one orphan per poll of a hung remote).
        done = in_group(["git", "-c", "protocol.version=2", *args], cwd or self.path, env)
        if done is None:
            raise RemoteError(scrub(f"{what} {safe_url(url)} failed: git did not answer within "
                                    f"{GIT_TIMEOUT} s", url))
        if done.returncode != 0:
            stderr = done.stderr.decode(errors="replace").strip()
            if not retried and self._unlock(stderr, cwd or self.path):
                return self.run(*args, what=what, cwd=cwd, url=url, retried=True)
            raise self._failed(what, stderr, done.returncode, url)
        return done.stdout.decode(errors="replace").removesuffix("\n")

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
            stderr, status = self._stderr(exc, progress), exc.status
        else:
            return None
        finally:
            # GitPython keeps `git cat-file` processes per Repo until it is closed: a failed
            # fetch's traceback would keep them alive past the command.
            repo.close()
        if not retried and self._unlock(stderr, self.path):
            return self._fetch_shown(refspec, retried=True)
        raise self._failed("fetch from", stderr, status) from None

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
        """The head the mirror has (``Source``): a tip probe compares it with the remote's."""
        raise NotImplementedError

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
    def _origin(self, repo: git.Repo) -> git.Remote:
        if "origin" not in [r.name for r in repo.remotes]:
            return repo.create_remote("origin", self.url)
        origin = repo.remote("origin")
        if origin.url != self.url:
            origin.set_url(self.url)
        return origin
