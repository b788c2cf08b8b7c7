"""The node's state directory: where things are, who may change them, what a crash left.

Layout of ``state_dir``::

    lock                    flock: one pass at a time (poll, verify, apply, note)
    services.lock           flock: whoever changes services (a pass's apply, the supervisor)
    agent.lock              flock held by a running daemon: one daemon per state dir
    noop.json               what the last pass, a pure no-op, proved (``node.quiet``): removed by
                            every other pass and command before it does anything
    state.db                the ledger (reconciler.ledger): SQLite, WAL
    mirror.git/             bare mirror of the deployment repo (source)
    trust/                  a trust root rotated through the repo
    services/<svc>/, docker/, systemd/, host/   driver-owned records and files

A pass holds ``lock`` from start to end but ``services.lock`` only while it observes and changes
services, so the supervisor keeps restarting crashed services while a pass waits on the network.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from reconciler.core.atomic import TEMP_PREFIX, atomic_write, fsync_dir
from reconciler.core.errors import Busy, ConfigError, DiskFull, StateMissing

# A pass needs room for a revision of files, a few ledger pages and note objects; below this
# it stops before changing anything rather than half way through.
MIN_FREE_BYTES = 16 * 2**20


class State:
    """The node's state directory. ``create=False`` for commands that only read."""

    def __init__(self, root: Path, *, create: bool = True) -> None:
        self.root = root
        # Whether what a killed run left may be here (``sweep``): until this process's first
        # sweep, and again once another process held a lock or a body under one raised.
        self.dirty = True
        if not create:
            if root.exists() and not root.is_dir():
                raise StateMissing(f"state dir {root} is not a directory (is --state-dir right?)")
            if not root.is_dir():
                raise StateMissing(f"state dir {root} does not exist (is --state-dir right?)")
            return
        try:
            # Search, not read, for others: a service that runs as its own user reaches its
            # files by path. What is private (records, the ledger, logs) is 0600 inside.
            root.mkdir(parents=True, exist_ok=True, mode=0o711)
            root.chmod(0o711)
            forget_noop(root)  # every command that may change the node builds its State so
        except OSError as exc:
            raise ConfigError(f"state dir {root}: {exc.strerror or exc}") from exc

    @property
    def mirror(self) -> Path:
        return self.root / "mirror.git"

    @contextlib.contextmanager
    def lock(self, wait: float = 0.0, name: str = "lock", what: str = "another reconciler run",
             held: int | None = None) -> Iterator[int]:
        """Exclusive flock on ``name``; ``Busy`` if someone else holds it after ``wait`` seconds.
        Yields the descriptor. ``held``: a descriptor of that file this process already holds
        the lock through (a daemon that re-executed itself, ``shed``): kept, no gap."""
        fd = self._adopt(held, name) if held is not None else None
        if fd is not None:
            # Re-executed (``shed``): the same process, a new token; the lock file names it again.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, holder_line(), 0)
            try:
                yield fd
            finally:
                os.close(fd)
            return
        fd = os.open(self.root / name, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + wait
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                    if time.monotonic() >= deadline:
                        raise Busy(f"{self.root}: {what} holds the lock") from None
                    time.sleep(0.1)
            if name == "lock":
                forget_noop(self.root)  # before this pass or command changes anything
            # The pid and a token of this process: two processes in different pid namespaces
            # (a daemon container, a `docker run ... reconciler apply` on the same volume) may
            # both be pid 1, and the other's leftovers must still be swept.
            mine = holder_line()
            # Written only when another process held it last (a read is cheaper than the
            # truncate and write, twice a poll): that holder may also have left half a write.
            if os.pread(fd, 32, 0) != mine:
                self.dirty = True
                os.ftruncate(fd, 0)
                os.write(fd, mine)
            try:
                yield fd
            except BaseException:
                self.dirty = True  # the body may have left a temp file or a revision dir behind
                raise
        finally:
            os.close(fd)  # closing releases the flock

    def _adopt(self, fd: int, name: str) -> int | None:
        """``fd`` when it is ``name`` and its flock is ours (taking it again through the same
        open file succeeds at once); otherwise closed, and None."""
        try:
            mine, there = os.fstat(fd), os.stat(self.root / name)
            if (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.set_inheritable(fd, False)  # the services this daemon starts must not hold it
                return fd
        except OSError:
            pass
        with contextlib.suppress(OSError):
            os.close(fd)
        return None

    def held(self, name: str = "lock", locks: Path = Path("/proc/locks")) -> bool | None:
        """Whether a process holds the flock on ``name`` now, read without taking it (a reader
        that took it, even for an instant, would make a pass starting then give up, ``Busy``):
        True or False only when sure, None when it cannot tell. The kernel's table (``locks``)
        lists the lock by device and inode, but on btrfs or overlay its device number can differ
        from what stat says; the holder's pid, which ``lock`` writes in the file once it holds
        it, names the lock there too. A holder that is gone holds nothing."""
        path = self.root / name
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return False  # never taken: no pass has run here
        except OSError:
            return None
        pid = _pid_in(path)
        try:
            table = locks.read_text()
        except OSError:
            table = None
        if table is not None:
            where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
            flocks = [f for line in table.splitlines() if len(f := line.split()) > 5 and f[1] == "FLOCK"]
            if any(f[5] == where for f in flocks):
                return True
            if pid is not None and any(f[4] == str(pid) and f[5].rsplit(":", 1)[-1] == str(st.st_ino) for f in flocks):
                return True  # the same inode under another device number: the holder it names
            if pid is not None and not any(f[4] == str(pid) for f in flocks):
                return False  # the last holder (a daemon between passes, say) holds no lock at all
        if pid is not None and not _alive(pid):
            return False
        return None

    def holder(self, name: str = "lock", locks: Path = Path("/proc/locks")) -> int | None:
        """The pid the kernel's lock table (``locks``) lists as holding the flock on ``name`` now;
        None when none does or it cannot tell. Never the pid written in the file: ``lock`` writes
        it only once it holds the flock, so for a moment the file names the previous holder,
        whose pid may be another process's by then. Where the table's device number differs
        from stat's (btrfs, overlay), a pid listed for the same inode counts only if it has
        this very file open."""
        path = self.root / name
        try:
            st = os.stat(path)
            table = locks.read_text()
        except OSError:
            return None
        where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        # "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"; a waiter's line says "->" before FLOCK.
        flocks = [f for line in table.splitlines() if len(f := line.split()) > 5 and f[1] == "FLOCK"]
        pids = {f[4] for f in flocks if f[5] == where}
        if not pids:
            pids = {f[4] for f in flocks if f[5].rsplit(":", 1)[-1] == str(st.st_ino)
                    and f[4].isdigit() and _has_open(int(f[4]), st)}
        if len(pids) != 1 or not (pid := next(iter(pids))).isdigit() or int(pid) <= 0:
            return None  # pid 0: a holder in a pid namespace this one cannot see
        return int(pid)

    def services_lock(self, wait: float = 0.0) -> contextlib.AbstractContextManager[int]:
        return self.lock(wait, "services.lock", "another run changing services")

    def daemon_lock(self, held: int | None = None) -> contextlib.AbstractContextManager[int]:
        return self.lock(0.0, "agent.lock", "another `reconciler agent`", held)

    def sweep(self) -> list[Path]:
        """Remove what a killed run left half written: temp files and unfinished revision dirs.
        Called under the run lock and the services lock (the supervisor's), so nothing in flight
        can be swept. Nothing to do, and no walk of the state dir, when this process swept
        before and no other process held a lock since (``dirty``): a no-op poll does not sweep."""
        swept: list[Path] = []
        if not self.dirty:
            return swept
        self.dirty = False
        for dirpath, dirnames, filenames in os.walk(self.root):
            if dirpath == str(self.root) and "mirror.git" in dirnames:
                dirnames.remove("mirror.git")  # git sweeps its own
            for d in [d for d in dirnames if d.startswith(TEMP_PREFIX)]:
                shutil.rmtree(Path(dirpath) / d, ignore_errors=True)
                dirnames.remove(d)
                swept.append(Path(dirpath) / d)
            for f in filenames:
                if f.startswith(TEMP_PREFIX):
                    with contextlib.suppress(FileNotFoundError):
                        (Path(dirpath) / f).unlink()
                    swept.append(Path(dirpath) / f)
        return swept

    def check_space(self, need: int = MIN_FREE_BYTES) -> None:
        """Before a pass changes anything: ``DiskFull`` if the state dir's filesystem is too full."""
        free = shutil.disk_usage(self.root).free
        if free < need:
            raise DiskFull(f"state dir {self.root}: {free / 2**20:.1f} MiB free, a run needs "
                           f"{need / 2**20:.0f} MiB; nothing was changed")


NOOP_MARKER = "noop.json"
"""What the last pass proved when it ended as a pure no-op, for the next `agent --once` to check
instead of a full pass (``node.quiet``). Only that pass writes it, under the pass lock; every
pass and every command that may change the node removes it first (``State``: made, locked), so
a pass killed half way, a `stop`, a `retry`, a suspension leave none behind."""


def forget_noop(root: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(root / NOOP_MARKER)


_TOKEN = os.urandom(6).hex()  # this process's, beside its pid in the lock files it holds


def holder_line() -> bytes:
    """What a lock file holds while this process holds the lock: its pid and its token."""
    return f"{os.getpid()} {_TOKEN}\n".encode()


def holder_in(text: str) -> tuple[int | None, bool]:
    """A lock file's holder: its pid (None: none written) and whether it is this process (the
    pid alone cannot say: another pid namespace may have the same)."""
    words = text.split()
    pid = int(words[0]) if words and words[0].isdigit() and int(words[0]) > 0 else None
    return pid, words == [str(os.getpid()), _TOKEN]


def _pid_in(path: Path) -> int | None:
    """The pid ``State.lock`` wrote in a lock file (None: none there, or not one)."""
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return None
    first = text.split(maxsplit=1)[0] if text else ""
    return int(first) if first.isdigit() and int(first) > 0 else None


def _has_open(pid: int, st: os.stat_result) -> bool:
    """Whether process ``pid`` has the file ``st`` describes open (False when it cannot be seen)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            there = os.stat(f"/proc/{pid}/fd/{fd}")
            if (there.st_dev, there.st_ino) == (st.st_dev, st.st_ino):
                return True
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it runs, as another user
        return True
    return True


def require_agent_state(root: Path, *, empty_ok: bool = False) -> None:
    """For a command that steers a node between passes (suspend, resume, retry, unpin): ``root``
    must be a state dir an agent made (its ledger is there), else ``StateMissing``. Only the agent
    makes one: a mistyped --state-dir made into a new, empty node would be "suspended" while
    the real one keeps applying. ``empty_ok``: an empty directory made for the node before its
    first run (an installer's, systemd's ``StateDirectory=``) will do too."""
    if (root / "state.db").is_file():
        return
    with contextlib.suppress(OSError):
        if empty_ok and root.is_dir() and not any(root.iterdir()):
            return
    raise StateMissing(f"no state dir at {root}: the agent has not run there")


__all__ = ["MIN_FREE_BYTES", "NOOP_MARKER", "State", "forget_noop", "atomic_write", "fsync_dir", "require_agent_state"]
