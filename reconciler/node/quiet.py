"""A no-op `agent --once` answered from what the last full no-op pass proved (issue 40).

Most runs of `agent --once` from a systemd timer or cron find nothing new. The full pass proves
that at the price of its imports (the settings, the ledger, the drivers, the trust code: most of
its CPU). Here, with the standard library only, a plain `agent --once` command line (``entry``)
checks that nothing a no-op depends on changed since the last full pass that ended as a pure
no-op, and answers as that pass would have:

- the full pass (``node.reconcile.noop``, through ``node.quietmark``) writes ``noop.json`` in
  the state dir when it ended as nothing at all: nothing interrupted, swept, owed or pending,
  nothing logged at WARNING or above, the note pushed, only process-driver services, a slice
  that reads no facts, no outputs (notify, metrics) to refresh. Every other pass and every
  command that may change the node removes it before anything else (``ledger.statedir.State``:
  its creation and the pass lock);
- this check takes the pass lock as a pass does (held: the full pass, which says so), then
  compares, in turn: the marker's format and the package version; a digest of the command
  line, the agent's environment variables, the installed package's ``__init__`` (a patch
  release keeps the version), the config file's bytes and those of every file the settings
  name (trust files, keys, identities); the free space a pass needs; the services' records,
  their processes (pid and start time), no stray process with a service's mark, and every live
  file's stat and bytes (``node.quietlook``); the ledger file's stat (a restore from a backup)
  and its empty write-ahead log; the mirror's branch and this node's notes ref; then the same
  poll the pass runs (``git ls-remote`` of the branch, given ``POLL_TIMEOUT``) and the same read
  of the head commit and its tree (``git cat-file``).

Any doubt (no marker, a malformed one, anything different, any error) is None: the full pass
runs, silently, and the marker says no more than a pass could already have claimed (it lives in
the root-owned state dir and is read as hostile input). The marker is found at --state-dir, at
the ``state_dir`` line of the config, or at the default; it counts only when it names the state
dir it is in, written by a pass with the very same settings.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import reconciler
from reconciler.node.quietlook import file_print, ledger_print, observed, sha256, wal_empty

MARKER = "noop.json"  # ``ledger.statedir.NOOP_MARKER``: the same file
FORMAT = 2
DEFAULT_CONFIG = Path("/etc/reconciler/agent.yaml")  # ``cli.common.DEFAULT_CONFIG``
DEFAULT_STATE = "/var/lib/reconciler"  # ``settings.AgentConfig.state_dir``
GIT_TIMEOUT = 120.0  # ``source.gitrun.GIT_TIMEOUT``: the read of the mirror's own objects
# The remote's answer, here. A remote that answers at all answers `ls-remote` in well under a
# second; one that does not in this time is left to the full pass, which waits its own
# ``GIT_TIMEOUT`` and says why it failed: a hung remote costs this plus that, not twice that.
POLL_TIMEOUT = 10.0
_MAX_MARKER = 1 << 16
_OID = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")
_STATE_LINE = re.compile(r"^state_dir:[ \t]*(['\"]?)([^'\"#\n]+?)\1[ \t]*(#.*)?$", re.MULTILINE)
_GIT_ENV = frozenset({"GIT_TERMINAL_PROMPT", "GIT_SSH_COMMAND"})


class Asked(NamedTuple):
    """A plain `agent --once` command line, as far as a no-op depends on it. (Not a dataclass:
    ``dataclasses`` imports ``inspect``, more than the rest of this check's imports.)"""

    words: tuple[tuple[str, str], ...]  # option key -> value, as given (not the output format)
    env: tuple[tuple[str, str], ...]  # the agent's variables (RECONCILER_*) and HOME (``~`` in paths)
    cwd: str  # relative paths are read from here
    config: str  # the config file read ("": none)
    node: str | None  # --node, when given
    state_dir: Path

    def settings(self, named: list[str]) -> str:
        """The digest of everything the settings are made of: these words, the config's bytes,
        and the bytes (or listing) and stat of every file the settings name (``named``)."""
        h = sha256(repr((FORMAT, reconciler.__version__, sys.version, self.words, self.env, self.cwd,
                                 self.config)).encode())
        # The installation too: a distribution's patch release (or another copy on the path)
        # keeps the version, and a package manager writes every file of it anew.
        for path in (reconciler.__file__ or "", self.config, *named):
            if path:
                h.update(f"\0{path}\0{file_print(Path(path))}".encode(errors="surrogateescape"))
        return h.hexdigest()


ARMED: Asked | None = None
"""The command line of a plain `agent --once` that was not answered here: its full pass, when it
ends as a pure no-op, writes the marker for the next one (``node.quietmark``)."""


def answer(agent_opts: dict[str, Any], settings: dict[str, Any], output: str) -> int | None:
    """Print what the full no-op pass would and return its exit code (0); None: run the full pass."""
    global ARMED
    try:
        asked = ask(agent_opts, settings)
        ARMED = asked
        if asked is None:
            return None
        said = _check(asked)
    except Exception:  # any doubt: the full pass, which says what is wrong, if anything
        return None
    if said is None:
        return None
    node, commit = said
    if output == "json":
        result = {"node": node, "commit": commit, "fetched": False, "plan": None, "report": None, "note_pushed": True,
                  "interrupted": [], "error": None, "waiting": "", "skipped": "", "suspended": ""}
        print(json.dumps(result, indent=2, sort_keys=True), flush=True)  # ``node.run.RunResult.to_dict``
    else:
        print(f"{node} @ {commit[:12]}: unchanged, nothing to do", flush=True)
    return 0


def ask(agent_opts: dict[str, Any], settings: dict[str, Any]) -> Asked | None:
    """The command line as the check reads it; None when its pass has outputs (a metrics file)."""
    if settings.get("metrics_textfile") is not None:
        return None
    words = tuple(sorted((k, str(v)) for k, v in {**agent_opts, **settings}.items() if v is not None))
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("RECONCILER_") or k == "HOME"))
    config = agent_opts.get("config_file")
    if config is None and DEFAULT_CONFIG.is_file():
        config = DEFAULT_CONFIG
    state = agent_opts.get("state_dir")
    if state is None:
        found = _STATE_LINE.search(Path(config).read_text(errors="replace")) if config is not None else None
        state = found.group(2) if found else DEFAULT_STATE
    return Asked(words, env, os.getcwd(), str(config or ""), agent_opts.get("node"), Path(str(state)).expanduser())


def _check(asked: Asked) -> tuple[str, str] | None:
    root = asked.state_dir
    try:
        fd = os.open(root / "lock", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return None  # a pass under way: the full pass waits or says so
        marker = _read_marker(root / MARKER)
        if marker is None or marker["state_dir"] != str(root) or asked.node not in (None, marker["node"]):
            return None
        # The holder, as ``State.lock`` writes it (``State.held`` may read it): the next pass
        # knows another process held the lock. (No marker, no write: the full pass runs now.)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} quick-{os.urandom(4).hex()}\n".encode(), 0)
        if asked.settings(marker["named"]) != marker["settings"]:
            return None
        fs = os.statvfs(root)  # ``shutil.disk_usage``, without importing shutil (and bz2, lzma)
        if fs.f_bavail * fs.f_frsize < marker["free"]:
            return None  # the full pass says the disk is full
        if any(_used(root / d) for d in marker["empty"]) or observed(root) != marker["observed"]:
            return None
        if ledger_print(root) != marker["ledger"] or not wal_empty(root):
            return None  # the ledger restored from a backup, or written since: the full pass reads it
        if not _mirror_at(root / "mirror.git", marker):
            return None
        return marker["node"], marker["commit"]
    finally:
        os.close(fd)


def _read_marker(path: Path) -> dict[str, Any] | None:
    """The marker, each field of the type it must have; None when anything is off."""
    try:
        # Not through a symlink, never waiting (a fifo), and only a plain file of this user's
        # that nobody else may write, as ``atomic_write`` leaves it.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022 or st.st_nlink != 1:
                return None
            raw = os.read(fd, _MAX_MARKER + 1)
        finally:
            os.close(fd)
        data = json.loads(raw) if len(raw) <= _MAX_MARKER else None
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("v") != FORMAT or data.get("version") != reconciler.__version__:
        return None
    strings = ("node", "commit", "state_dir", "settings", "observed", "url", "branch", "ledger")
    if not all(isinstance(data.get(k), str) for k in strings) or not isinstance(data.get("free"), int):
        return None
    lists = (data.get("named"), data.get("empty"))
    env, notes = data.get("env"), data.get("notes") or []
    if not all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in (*lists, notes)) or not (
            isinstance(env, dict) and all(k in _GIT_ENV and isinstance(v, str) for k, v in env.items())):
        return None
    node, branch, url = data["node"], data["branch"], data["url"]
    if (not _OID.fullmatch(data["commit"]) or not node or not node.isprintable() or len(node) > 253
            or not re.fullmatch(r"[A-Za-z0-9._/-]{1,200}", branch) or ".." in branch or url.startswith("-")
            or not url or any(not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", d) for d in data["empty"])
            or len(notes) != 2 or not notes[0].startswith("refs/notes/") or ".." in notes[0]
            or not _OID.fullmatch(notes[1])):
        return None
    return data


def _used(directory: Path) -> bool:
    """A driver's state dir that holds anything (``drivers.drivers_in_use``)."""
    try:
        return any(os.scandir(directory))
    except FileNotFoundError:
        return False


def _mirror_at(mirror: Path, marker: dict[str, Any]) -> bool:
    """The pass's poll, its answer the same: the mirror and the branch on the remote at the
    marker's commit, no repair left half done, the head commit and its tree read back."""
    commit, ref = marker["commit"], f"refs/heads/{marker['branch']}"
    if any(mirror.with_name(mirror.name + s).exists() for s in (".new", ".broken")):
        return False  # ``Source._sweep`` removes them: a side effect
    if _local_ref(mirror, ref) != commit or _local_ref(mirror, marker["notes"][0]) != marker["notes"][1]:
        return False  # the branch moved, or the notes a pass would look for (and fetch) are not there
    env = {**os.environ, **marker["env"], "LANGUAGE": "C", "LC_ALL": "C"}
    # ``Remotes.run`` and ``Remotes._git_head``: the same command, in its own session.
    proc = subprocess.Popen(["git", "-c", "protocol.version=2", "ls-remote", "--heads", marker["url"], ref],
                            cwd=mirror, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=POLL_TIMEOUT)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    if proc.returncode != 0 or f"{commit}\t{ref}" not in out.decode(errors="replace").splitlines():
        return False
    # ``Source.check``, as a new process runs it: the head commit and its tree read by git.
    read = subprocess.run(["git", "--no-replace-objects", "-c", "core.commitGraph=false", "cat-file", "-p",
                           f"{commit}^{{tree}}"], cwd=mirror, capture_output=True, timeout=GIT_TIMEOUT,
                          env={**os.environ, "GIT_TERMINAL_PROMPT": "0", "LANGUAGE": "C", "LC_ALL": "C"})
    return read.returncode == 0


def _local_ref(mirror: Path, ref: str) -> str | None:
    """The mirror's branch as its files say it plainly (``source.refs.read_ref``): loose, else
    packed; None (the full pass reads it) for anything else."""
    try:
        loose = (mirror / ref).read_text().strip()
    except FileNotFoundError:
        loose = None
    if loose is not None:
        return loose if _OID.fullmatch(loose) else None
    with open(mirror / "packed-refs") as f:
        for line in f:
            oid, _, name = line.rstrip("\n").partition(" ")
            if name == ref and _OID.fullmatch(oid):
                return oid
    return None
