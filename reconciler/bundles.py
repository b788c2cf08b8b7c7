"""Offline and air-gapped sites: the deployment repo carried as a git bundle.

``create`` writes the branch (from a commit the site already has, or whole) and every node's
notes refs into one bundle file. On the site, the file's path is a read remote like any other
(``remotes: [{url: /media/usb/cloud.bundle, role: read}]``): the agent polls it, verifies what
it brings exactly as it would from a server, and keeps its notes until a write remote answers.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import faults
from .errors import BadInput, RemoteError
from .refs import NOTES_PREFIX
from .source import GIT_TIMEOUT, git_cause, safe_url, scrub


@dataclass(frozen=True)
class Bundle:
    path: Path
    head: str
    since: str | None
    notes: tuple[str, ...]  # the nodes whose notes it carries


def create(source: str, branch: str, since: str | None, out: Path) -> Bundle:
    """A bundle of ``branch`` at ``source`` (a repo path or URL) past ``since``, with every
    ``refs/notes/reconciler/*``. Made in a scratch repository, so the refs in the bundle have the
    names the agent fetches, whatever names the operator's clone keeps them under."""
    with tempfile.TemporaryDirectory(prefix="reconciler-bundle-") as scratch:
        _git(Path(scratch), "init", "-q", "--bare")
        _git(Path(scratch), "fetch", "--no-tags", source, f"+refs/heads/{branch}:refs/heads/{branch}",
             f"+{NOTES_PREFIX}*:{NOTES_PREFIX}*", what=f"fetch from {safe_url(source)}", url=source)
        head = _git(Path(scratch), "rev-parse", f"refs/heads/{branch}").strip()
        if since is not None:
            try:
                since = _git(Path(scratch), "rev-parse", "--verify", f"{since}^{{commit}}").strip()
            except RemoteError:
                # only the branch's history was fetched: a commit off it is not found either
                raise BadInput(f"{since}: not a commit of {branch} at {safe_url(source)} (SINCE must be one "
                               f"the site has)") from None
        notes = tuple(line.removeprefix(NOTES_PREFIX) for line in
                      _git(Path(scratch), "for-each-ref", "--format=%(refname)", NOTES_PREFIX).split())
        spec = [f"refs/heads/{branch}", *(f"{NOTES_PREFIX}{n}" for n in notes)]
        if since is not None:
            spec.append(f"^{since}")
        tmp = out.with_name(f".{out.name}.tmp")
        faults.point("spawn", "git bundle create")
        _git(Path(scratch), "bundle", "create", "-q", str(tmp.resolve()), *spec)
        faults.point("rename", f"{tmp} -> {out}")
        os.replace(tmp, out)
    return Bundle(out, head, since, notes)


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-c", "protocol.version=2", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=GIT_TIMEOUT, env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})


def _git(cwd: Path, *args: str, what: str = "", url: str = "") -> str:
    proc = _run(cwd, *args)
    if proc.returncode != 0:
        cause = git_cause(proc.stderr) or f"git exited with {proc.returncode}"
        raise RemoteError(scrub(f"{what or 'git ' + args[0]} failed: {cause}", url))
    return proc.stdout
