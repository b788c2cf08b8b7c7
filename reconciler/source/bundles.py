"""Offline and air-gapped sites: the deployment repo carried as a git bundle.

``create`` writes the branch (from a commit the site already has, or whole) and every node's
notes refs into one bundle file. On the site, the file's path is a read remote like any other
(``remotes: [{url: /media/usb/cloud.bundle, role: read}]``): the agent polls it, verifies what
it brings exactly as it would from a server, and keeps its notes until a write remote answers.
"""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from reconciler.core import faults
from reconciler.core.errors import BadInput, DiskFull, RemoteError
from reconciler.source.gitrun import git_cause, git_result, safe_url, scrub
from reconciler.source.refs import NOTES_PREFIX


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
    check_out(out)
    with tempfile.TemporaryDirectory(prefix="reconciler-bundle-") as scratch:
        _git(Path(scratch), "init", "-q", "--bare")
        if _run(Path(scratch), "check-ref-format", f"refs/heads/{branch}").returncode != 0:
            raise BadInput(f"{branch!r}: not a branch name")
        proc = _run(Path(scratch), "fetch", "--no-tags", source, f"+refs/heads/{branch}:refs/heads/{branch}",
                    f"+{NOTES_PREFIX}*:{NOTES_PREFIX}*")
        if proc.returncode != 0:
            if "couldn't find remote ref" in proc.stderr:  # git's words under LC_ALL=C (see _run)
                raise BadInput(f"{branch}: no such branch at {safe_url(source)}")
            raise _failed(proc, f"fetch from {safe_url(source)}", source)
        head = _git(Path(scratch), "rev-parse", f"refs/heads/{branch}").strip()
        if since is not None:
            given = since
            try:
                since = _git(Path(scratch), "rev-parse", "--verify", f"{since}^{{commit}}").strip()
            except RemoteError:
                # only the branch's history was fetched: a commit off it is not found either
                raise BadInput(f"{since}: not a commit of {branch} at {safe_url(source)} (SINCE must be one "
                               f"the site has)") from None
            if since == head:  # git would refuse "to create empty bundle"
                raise BadInput(f"{given}..{branch}: nothing to bundle, {branch} is at {given} ({head[:12]})")
        notes = tuple(line.removeprefix(NOTES_PREFIX) for line in
                      _git(Path(scratch), "for-each-ref", "--format=%(refname)", NOTES_PREFIX).split())
        spec = [f"refs/heads/{branch}", *(f"{NOTES_PREFIX}{n}" for n in notes)]
        if since is not None:
            spec.append(f"^{since}")
        tmp = out.with_name(f".{out.name}.tmp")
        faults.point("spawn", "git bundle create")
        proc = _run(Path(scratch), "bundle", "create", "-q", str(tmp.resolve()), *spec)
        if proc.returncode != 0:  # the operator's FILE, not the remote
            cause = git_cause(proc.stderr) or f"git exited with {proc.returncode}"
            if "No space left on device" in proc.stderr:
                raise DiskFull.at(out.parent, f"cannot write {out}: {cause}")
            raise BadInput(f"cannot write: {cause}", file=str(out))
        faults.point("rename", f"{tmp} -> {out}")
        try:
            os.replace(tmp, out)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise BadInput(f"cannot write: {exc.strerror}", file=str(out)) from exc
    return Bundle(out, head, since, notes)


def check_out(out: Path) -> None:
    """Refuse a FILE the bundle cannot take, before anything is fetched: a bundle replaces FILE
    whole, and renamed over a device node (/dev/full) or a FIFO it would put a file there."""
    if not out.parent.is_dir():
        there = "is not a directory" if out.parent.exists() else "does not exist"
        raise BadInput(f"{out.parent} {there}", file=str(out))
    try:
        mode = out.stat().st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise BadInput(f"cannot write: {exc.strerror}", file=str(out)) from exc
    if not stat.S_ISREG(mode):
        raise BadInput("not a regular file (a bundle would replace it)", file=str(out))


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # A remote that hangs, or no git at all, is a failed result ("did not answer"), not a traceback.
    return git_result(cwd, "-c", "protocol.version=2", *args)


def _failed(proc: subprocess.CompletedProcess[str], what: str, url: str = "") -> RemoteError:
    cause = git_cause(proc.stderr) or f"git exited with {proc.returncode}"
    return RemoteError(scrub(f"{what} failed: {cause}", url))


def _git(cwd: Path, *args: str) -> str:
    proc = _run(cwd, *args)
    if proc.returncode != 0:
        raise _failed(proc, f"git {args[0]}")
    return proc.stdout
