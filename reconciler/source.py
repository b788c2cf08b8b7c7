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


CAUSE_MAX = 400
"""Characters of git's own words kept in a message: enough for a cause, never a screenful."""

_USERINFO = re.compile(r"\b([a-z][a-z0-9+.-]*://)[^@/\s]*@", re.IGNORECASE)
_NOISE = re.compile(r"^(hint: |remote: (Enumerating|Counting|Compressing|Total)|(Receiving|Resolving) objects|"
                    r"Looking up .* done\.$)")
# With --progress git writes "Connecting to host (port 9418) ... fatal: ..." on one line.
_CAUSE = re.compile(r"(?:^|\.\.\. )(fatal|error): ", re.IGNORECASE)


def safe_url(url: str) -> str:
    """The URL without credentials, for messages and notes."""
    return _USERINFO.sub(r"\1", url)


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
            raise self.error(what, exc) from None

    def error(self, what: str, exc: git.GitCommandError, progress: _Progress | None = None) -> RemoteError:
        """``what URL failed: <git's cause>``, free of credentials."""
        # With a progress handler GitPython keeps only the lines after the first "fatal:" as
        # stderr; the handler saw them all.
        stderr = "\n".join(progress.other_lines + progress.error_lines) if progress else exc.stderr.strip()
        # GitPython wraps git's stderr as "stderr: '...'"; unwrap to git's own lines
        if stderr.startswith("stderr: '") and stderr.endswith("'"):
            stderr = stderr[len("stderr: '"):-1]
        cause = git_cause(stderr) or f"git exited with {exc.status}"
        return RemoteError(scrub(f"{what} {safe_url(self.url)} failed: {cause}", self.url))

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
        if self.progress:
            progress = _Progress()
            repo = git.Repo(str(self.path))
            try:
                with repo.git.custom_environment(**self.env):
                    remote = self._origin(repo)
                    remote.fetch(refspec, progress=progress, no_tags=True, kill_after_timeout=GIT_TIMEOUT)
            except git.GitCommandError as exc:
                raise self.error("fetch from", exc, progress) from None
        else:
            self.run("fetch", "--no-tags", self.url, refspec, what="fetch from")
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
