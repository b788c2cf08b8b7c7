"""The daemon gives back what a change loaded: it re-executes itself once the node is settled.

A pass that verifies, renders and applies a commit imports pygit2, Jinja2, the signature and
age code and the planner, and CPython cannot unload a module: an idle agent that applied one
change would hold ~58 MB for the rest of its life, where one that never did holds ~30 MB.
So after the first quiet pass that follows work (nothing to do, nothing failed, nothing
waiting), a daemon that grew by ``GROWTH_MB`` or more since it started replaces itself with a
fresh interpreter: ``execv`` of its own command line, same PID (systemd sees nothing), same
cwd, same config.

What must outlive the old interpreter is handed over, not rebuilt:

- the daemon lock's file descriptor and the metrics listening socket stay open across the
  ``execv`` (made inheritable for it alone): no other daemon can start in between, and a scrape
  waits in the socket's backlog instead of being refused;
- the rest is written as JSON to an anonymous memory file (``memfd``), never to disk, because
  it holds the secret values the redactor knows: the supervisor's backoffs and the poll's phase
  (monotonic times, valid across ``execv``), what was already logged once, the commits whose
  images were pulled ahead.

The new interpreter takes it over (``take_over``) before it starts any thread.

A stop must not be lost to the hand-over. The main thread blocks SIGTERM and SIGINT before it
re-executes (a blocked mask and a pending signal survive ``execv``; the new interpreter unblocks
them once its handlers are in place). A signal taken by another thread meanwhile is written by
Python's C handler to the wakeup pipe (``signal.set_wakeup_fd``), which is handed over too and
read by the new interpreter (``Signals``). Worker threads are not made to block them: a thread's
mask is inherited by the processes it starts, and a service must be stoppable.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import sys
from collections.abc import Hashable
from dataclasses import asdict, dataclass, field
from typing import Any, NoReturn

from reconciler.core import faults
from reconciler.core.errors import ReconcilerError

log = logging.getLogger("reconciler.agent")

ENV = "RECONCILER_RESUME_FD"  # the memory file's descriptor, for the new interpreter only
GROWTH_MB = 6.0  # a quiet poll grows an agent by well under 1 MB; a pass that applied, by ~28 MB


class ShedFailed(ReconcilerError):
    reason = "SHED_FAILED"


@dataclass(frozen=True)
class Carry:
    """What the daemon hands to the interpreter that replaces it."""

    lock_fd: int  # ``agent.lock``, flocked: one daemon per state dir, without a gap
    metrics_fd: int | None  # the listening socket of ``/metrics``
    poll_due: float  # time.monotonic() of the next poll: the node keeps its phase in the wave
    supervise_due: float
    failures: dict[str, int] = field(default_factory=dict)  # the supervisor's backoff per service
    next_try: dict[str, float] = field(default_factory=dict)
    up_since: dict[str, float] = field(default_factory=dict)
    verdict: tuple[str, str, str] | None = None  # what the verdict log said last
    said: tuple[Hashable, ...] = ()  # what was logged once (``Agent.say_once``)
    secrets: tuple[tuple[str, str], ...] = ()  # (value, name): the redactor's values
    pulled_ahead: tuple[str, ...] = ()
    sheds: int = 0  # how many times this daemon re-executed itself, this one included
    started_mb: float = 0.0  # RSS of the first interpreter after its start: what growth is measured from
    signal_fds: tuple[int, int] | None = None  # the wakeup pipe (read, write): ``Signals``


def rss_mb() -> float | None:
    """This process's resident memory; None where /proc cannot tell (then nothing is shed)."""
    try:
        with open("/proc/self/statm") as f:
            resident = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return resident * os.sysconf("SC_PAGE_SIZE") / 2**20


def possible() -> bool:
    return hasattr(os, "memfd_create") and rss_mb() is not None


CODE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the package a fresh interpreter imports


def code_files(root: str = CODE) -> frozenset[tuple[str, int, int, int]]:
    """What identifies the agent's code on disk: (path, size, mtime, inode) of each module.
    A re-execution runs what is installed now; an upgrade (pip writes new files) changes this."""
    out: set[tuple[str, int, int, int]] = set()
    dirs = [root]
    while dirs:
        try:
            entries = list(os.scandir(dirs.pop()))
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if entry.name != "__pycache__":
                    dirs.append(entry.path)
            elif entry.name.endswith(".py"):
                with contextlib.suppress(OSError):
                    st = entry.stat()
                    out.add((entry.path, st.st_size, st.st_mtime_ns, st.st_ino))
    return frozenset(out)


def hand_over(carry: Carry, argv: list[str] | None = None) -> NoReturn:
    """Re-execute this interpreter with ``carry``; returns only by raising ``ShedFailed``, with
    nothing changed (the descriptors are private again, the environment as it was)."""
    argv = list(argv or sys.orig_argv)
    keep = [fd for fd in (carry.lock_fd, carry.metrics_fd, *(carry.signal_fds or ())) if fd is not None]
    memory = -1
    try:
        memory = os.memfd_create("reconciler-resume", 0)  # no MFD_CLOEXEC: it must survive execv
        os.write(memory, _encode(carry))
        os.lseek(memory, 0, os.SEEK_SET)
        for fd in keep:
            os.set_inheritable(fd, True)
        os.environ[ENV] = str(memory)
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        faults.point("exec", sys.executable)
        os.execv(sys.executable, argv)
    except (OSError, TypeError, ValueError) as exc:
        os.environ.pop(ENV, None)
        for fd in keep:
            with contextlib.suppress(OSError):
                os.set_inheritable(fd, False)
        if memory >= 0:
            os.close(memory)
        raise ShedFailed(f"cannot re-execute {sys.executable}: {getattr(exc, 'strerror', None) or exc}") from None


def take_over() -> Carry | None:
    """What the interpreter this one replaced handed over, if it did (read once: the memory
    file is closed and the variable removed, so no child sees either). ``ShedFailed`` when it
    cannot be read: then the lock and socket it holds cannot be found either, and only an exit
    (which closes them) lets the next start begin clean."""
    value = os.environ.pop(ENV, None)
    if value is None:
        return None
    try:
        fd = int(value)
        with os.fdopen(fd, "rb") as f:
            return _decode(f.read())
    except (OSError, ValueError, TypeError, KeyError, IndexError) as exc:
        raise ShedFailed(f"{ENV}={value}: cannot take over from the agent this one replaced ({exc}); "
                         "exiting, for a clean start") from None


def _encode(carry: Carry) -> bytes:
    data = asdict(carry)
    data["said"] = [key for key in (_plain(k) for k in carry.said) if key is not None]
    return json.dumps(data).encode()


def _decode(raw: bytes) -> Carry:
    data: dict[str, Any] = json.loads(raw)
    verdict = data.get("verdict")
    return Carry(
        lock_fd=int(data["lock_fd"]),
        metrics_fd=None if data.get("metrics_fd") is None else int(data["metrics_fd"]),
        poll_due=float(data["poll_due"]),
        supervise_due=float(data["supervise_due"]),
        failures={str(k): int(v) for k, v in data.get("failures", {}).items()},
        next_try={str(k): float(v) for k, v in data.get("next_try", {}).items()},
        up_since={str(k): float(v) for k, v in data.get("up_since", {}).items()},
        verdict=None if verdict is None else (str(verdict[0]), str(verdict[1]), str(verdict[2])),
        said=tuple(_tuples(k) for k in data.get("said", [])),
        secrets=tuple((str(v), str(n)) for v, n in data.get("secrets", [])),
        pulled_ahead=tuple(str(c) for c in data.get("pulled_ahead", [])),
        sheds=int(data.get("sheds", 0)),
        started_mb=float(data.get("started_mb", 0.0)),
        signal_fds=None if not data.get("signal_fds") else (int(data["signal_fds"][0]), int(data["signal_fds"][1])),
    )


class Signals:
    """The wakeup pipe Python's C signal handler writes each signal's number to, whichever
    thread took it: a record of every stop asked for, that ``execv`` does not wipe (the flag
    that makes the main thread run the Python handler, it does). Set up in the main thread."""

    STOPS = frozenset({signal.SIGTERM, signal.SIGINT})

    def __init__(self, carried: tuple[int, int] | None = None) -> None:
        if carried is not None:
            self.read_fd, self.write_fd = carried
        else:
            self.read_fd, self.write_fd = os.pipe()
        for fd in (self.read_fd, self.write_fd):
            os.set_blocking(fd, False)
            os.set_inheritable(fd, False)
        signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)

    @property
    def fds(self) -> tuple[int, int]:
        return self.read_fd, self.write_fd

    def nudge(self) -> None:
        """Wake the thread in ``wait`` (a byte no signal has: 0)."""
        with contextlib.suppress(BlockingIOError):  # full: it is awake already
            os.write(self.write_fd, b"\0")

    def wait(self) -> None:
        """Until a signal's number or a nudge is in the pipe (left there for ``stop_asked``)."""
        select.select([self.read_fd], [], [])

    def drain(self) -> frozenset[int]:
        """The numbers of the signals that came since the last look (the pipe is emptied): a
        stop, and a `reconciler poll` (``wake.WAKE``) that a thread of the interpreter this one
        replaced took, whose handler never ran there."""
        seen = b""
        while True:
            try:
                chunk = os.read(self.read_fd, 512)
            except BlockingIOError:
                break
            if not chunk:
                break
            seen += chunk
        return frozenset(seen) - {0}

    def stop_asked(self) -> bool:
        """Whether a SIGTERM or SIGINT came since the last look (the pipe is emptied)."""
        return bool(self.drain() & self.STOPS)


def _plain(key: Hashable) -> Any:
    """``key`` as JSON can carry it and give back the same (tuples as lists of strings,
    numbers, None), or None: a key that cannot be carried is dropped, and its message may be
    logged once more."""
    if key is None or isinstance(key, str | int | float | bool):
        return key
    if isinstance(key, tuple):
        items = [_plain(k) for k in key]
        return None if any(i is None and k is not None for i, k in zip(items, key, strict=True)) else items
    return None


def _tuples(value: Any) -> Hashable:
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value  # type: ignore[no-any-return]
