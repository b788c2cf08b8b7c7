"""Running git: the one helper every git command of the agent goes through (``git_result``),
its time limit, and the reading of what git said (its cause on one line, without credentials).

A git that hangs (a stalled disk, a remote that never answers) is killed after ``GIT_TIMEOUT``
and is a failed result, never an exception; git runs in the C locale so its English words can
be read (``git_cause``, ``stale_lock``, ``Source.note``, ``bundles``).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

from reconciler.core.redact import without_userinfo

GIT_TIMEOUT = 120.0


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
        done = in_group(argv, cwd, {**os.environ, "GIT_TERMINAL_PROMPT": "0", "LANGUAGE": "C", "LC_ALL": "C"})
    except OSError as exc:
        return subprocess.CompletedProcess(argv, 128, "", f"fatal: cannot run git in {cwd}: {exc.strerror}")
    if done is None:
        return subprocess.CompletedProcess(argv, -signal.SIGKILL, "", f"fatal: git did not answer within "
                                           f"{GIT_TIMEOUT:.0f} s")
    return subprocess.CompletedProcess(argv, done.returncode, done.stdout.decode(errors="replace"),
                                       done.stderr.decode(errors="replace"))


def in_group(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[bytes] | None:
    """``argv`` run in a process group of its own, no stdin, its output kept; None when it did not
    end within ``GIT_TIMEOUT``, and then the whole group is killed: what git started (an ssh, an
    https helper, a hook) would otherwise outlive it, an orphan per hung call."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=GIT_TIMEOUT)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)
