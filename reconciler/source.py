"""The node's mirror of the deployment repo: a cheap ref check, and a fetch only on a move.

Transport is the git CLI through GitPython, so ssh config, credential helpers and protocol v2
behave as they do for the operator's own git. Objects are read with pygit2 (see ``tree``).

A poll is one ``ls-remote --heads`` of the one branch with protocol v2: the client sends
``ref-prefix refs/heads/`` so the server lists branches only, and the cost stays flat however
many other refs (tags, review refs, other nodes' notes) the remote has.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import git
import pygit2

from .errors import RemoteError

GIT_TIMEOUT = 120.0


def safe_url(url: str) -> str:
    """The URL without credentials, for messages and notes."""
    return re.sub(r"^([a-z+]+://)[^@/]*@", r"\1", url)


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


class _Progress(git.RemoteProgress):
    """Fetch progress on a terminal; silent otherwise."""

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


class Source:
    def __init__(
        self, url: str, branch: str, mirror: Path, *, ssh_command: str | None = None,
        progress: bool | None = None,
    ) -> None:
        self.url = url
        self.branch = branch
        self.path = mirror
        self.env = git_env(ssh_command)
        self.progress = sys.stderr.isatty() if progress is None else progress
        if not (mirror / "HEAD").exists():
            mirror.parent.mkdir(parents=True, exist_ok=True)
            pygit2.init_repository(str(mirror), bare=True)
        self._git = git.Git(str(mirror))
        self._git.update_environment(**self.env)
        self.repo = pygit2.Repository(str(mirror))

    @property
    def ref(self) -> str:
        return f"refs/heads/{self.branch}"

    def run(self, *args: str, what: str) -> str:
        """A git command against the remote; its failure is a ``RemoteError`` with git's words."""
        try:
            out: str = self._git.execute(
                ["git", "-c", "protocol.version=2", *args],
                kill_after_timeout=GIT_TIMEOUT,
                env={**os.environ, **self.env},
            )
            return out
        except git.GitCommandError as exc:
            detail = (exc.stderr or "").strip().splitlines()
            last = detail[-1].strip().removeprefix("stderr: '").rstrip("'") if detail else str(exc.status)
            raise RemoteError(f"{what} {safe_url(self.url)} failed: {last}") from None

    def local_head(self) -> str | None:
        try:
            return str(self.repo.references[self.ref].target)
        except KeyError:
            return None

    def remote_head(self) -> str:
        # --heads makes git send "ref-prefix refs/heads/" (a bare pattern would not: ls-remote
        # patterns match from the tail), so review refs, tags and notes are never listed.
        out = self.run("ls-remote", "--heads", self.url, self.ref, what="ref check of")
        for line in out.splitlines():
            oid, _, name = line.partition("\t")
            if name == self.ref:
                return oid
        raise RemoteError(f"branch {self.branch!r} not found on {safe_url(self.url)}", reason="NO_BRANCH")

    def poll(self) -> Poll:
        return Poll(self.remote_head(), self.local_head())

    def fetch(self) -> str:
        """Fetch the branch into the mirror; return its new head."""
        refspec = f"+{self.ref}:{self.ref}"
        try:
            if self.progress:
                repo = git.Repo(str(self.path))
                with repo.git.custom_environment(**self.env):
                    remote = self._origin(repo)
                    remote.fetch(refspec, progress=_Progress(), no_tags=True,
                                 kill_after_timeout=GIT_TIMEOUT)
            else:
                self.run("fetch", "--no-tags", self.url, refspec, what="fetch from")
        except git.GitCommandError as exc:
            lines = (exc.stderr or "").strip().splitlines()
            raise RemoteError(f"fetch from {safe_url(self.url)} failed: {lines[-1] if lines else exc.status}") from None
        self.repo = pygit2.Repository(str(self.path))
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
        """One poll; fetch only if the branch moved. Returns (head, fetched)."""
        p = self.poll()
        if not p.moved:
            return p.remote_head, False
        return self.fetch(), True
