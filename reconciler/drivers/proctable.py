"""The node's process table as the process driver reads it: a process's identity, the
services' processes found by their marker, and processes stopped by signals.

A pid alone is not proof: a process is its pid and its start time from /proc, so a recycled
pid is never mistaken for a service's. Every process a service starts carries
``RECONCILER_INSTANCE=<root>|<node>|<service>|<hash>`` in its environment (``MARKER``), which its
children inherit: what finds a copy a killed run left before its record named it, and what a node that
lost its state dir finds its services by (``unrecorded_of``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from reconciler.core import faults
from reconciler.core.aside import aside, pause
from reconciler.core.errors import ApplyError
from reconciler.drivers.base import Unrecorded

STOP_TIMEOUT = 10.0

MARKER = "RECONCILER_INSTANCE"


@dataclass(frozen=True)
class Proc:
    """A live process as /proc shows it."""

    pid: int
    ppid: int
    pgrp: int
    session: int
    start_time: str  # clock ticks since boot: with the pid, one process for ever

    @property
    def leader(self) -> bool:
        return self.pid == self.pgrp


def read_proc(pid: int) -> Proc | None:
    """The process, None if it is gone or a zombie (reaped here when it is our own child)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)  # reap our own child so the pid can go
        return None
    return Proc(pid, int(fields[1]), int(fields[2]), int(fields[3]), fields[19])


def start_time_of(pid: int) -> str | None:
    """Start time of a live (non-zombie) process, in clock ticks since boot; None if gone."""
    p = read_proc(pid)
    return p.start_time if p else None


def descends(p: Proc, ancestor: int) -> bool:
    """Whether ``p`` is ``ancestor``, in its group or session, or below it in the process tree."""
    seen: Proc | None = p
    for _ in range(64):
        if seen is None or seen.pid <= 1:
            return False
        if ancestor in (seen.pid, seen.pgrp, seen.session):
            return True
        seen = read_proc(seen.ppid)
    return False


def started_at(start_time: str) -> float:
    """A /proc start time as a Unix time."""
    with open("/proc/stat") as f:
        boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    return boot + int(start_time) / os.sysconf("SC_CLK_TCK")


def marker(root: Path, node: str, name: str = "", hash_: str = "") -> str:
    """The value of ``MARKER`` a service's process is started with (``find_marked`` reads it);
    without ``name``, the part every service of the driver at ``root`` on ``node`` shares."""
    return f"{root}|{node}|" + (f"{name}|{hash_}" if name else "")


def find_marked(root: Path, node: str) -> dict[str, list[tuple[Proc, str]]]:
    """Every live process of the services of the driver at ``root`` on ``node``, by service,
    with the hash it was started for: the marker in its environment, which its children
    inherit too."""
    prefix = f"{MARKER}={marker(root, node)}".encode()
    found: dict[str, list[tuple[Proc, str]]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                env = f.read()
        except OSError:  # gone, or not ours to read
            continue
        if prefix not in env:
            continue
        value = next((v for v in env.split(b"\0") if v.startswith(prefix)), None)
        p = read_proc(int(entry.name)) if value else None
        if value is None or p is None:
            continue
        service, _, hash_ = value[len(prefix):].decode(errors="replace").rpartition("|")
        found.setdefault(service, []).append((p, hash_))
    return found


def environ_value(pid: int, key: str) -> str | None:
    """``key`` in the environment ``pid`` was started with (None: not set, gone, not ours to read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:
        return None
    prefix = f"{key}=".encode()
    return next((v[len(prefix):].decode(errors="replace") for v in env.split(b"\0") if v.startswith(prefix)), None)


def newest(procs: Iterable[tuple[Proc, str]], hash_: str | None = None) -> tuple[Proc, str] | None:
    """Of a service's marked processes, the one that stands for it: the newest group leader (a
    copy's children are in its group), else the newest; of ``hash_``'s version, only a leader."""
    found = [(p, h) for p, h in procs if hash_ is None or (h == hash_ and p.leader)]
    return max(found, key=lambda ph: (ph[0].leader, int(ph[0].start_time)), default=None)


def unrecorded_of(marked: dict[str, list[tuple[Proc, str]]], recorded: Callable[[str], bool]) -> list[Unrecorded]:
    """The services whose processes run (found by their marker) though the driver has no record
    of them: the hash each was started for, and the commit in its environment."""
    out = []
    for name, procs in sorted(marked.items()):
        found = newest(procs)
        if found is not None and not recorded(name):
            p, hash_ = found
            out.append(Unrecorded(name, hash_, environ_value(p.pid, "RECONCILER_COMMIT") or "", p.pid))
    return out


def stop_targets(procs: Iterable[Proc], recorded: tuple[int, str] | None = None) -> list[tuple[int, str, bool]]:
    """(pid, start time, whole group?) to signal so that each process goes: a group leader takes
    its group along; a process whose group is not being stopped is signalled alone (its group
    may not be the service's)."""
    procs = list(procs)
    out: dict[int, tuple[str, bool]] = {}
    if recorded is not None:
        out[recorded[0]] = (recorded[1], True)
    leaders = set(out) | {p.pid for p in procs if p.leader}
    for p in procs:
        if p.leader:
            out.setdefault(p.pid, (p.start_time, True))
        elif p.pgrp not in leaders:
            out[p.pid] = (p.start_time, False)
    return [(pid, start_time, group) for pid, (start_time, group) in sorted(out.items())]


def terminate(name: str, targets: list[tuple[int, str, bool]]) -> None:
    """SIGTERM, then SIGKILL after STOP_TIMEOUT, to each (pid, start time, whole group?) until
    every one is gone."""
    def gone() -> bool:
        return all(start_time_of(pid) != start_time for pid, start_time, _ in targets)

    for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT), (signal.SIGKILL, 5.0)):
        signalled = False
        for pid, start_time, group in targets:
            if start_time_of(pid) != start_time:
                continue
            faults.point("signal", f"{name} {sig.name}")
            signalled = True
            with contextlib.suppress(ProcessLookupError):
                (os.killpg if group else os.kill)(pid, sig)
        if not signalled:
            return

        def exits(wait: float = wait) -> None:
            # Most processes are gone within a few ms of SIGTERM: looked at after 2 ms, then
            # twice as long each time, up to 50 ms.
            deadline, step = time.monotonic() + wait, 0.002
            while time.monotonic() < deadline and not gone():
                pause(step)
                step = min(step * 2, 0.05)

        aside(exits)  # a graceful exit takes its time: a batch's other actions go on meanwhile
        if gone():
            return
    left = [pid for pid, start_time, _ in targets if start_time_of(pid) == start_time]
    raise ApplyError(f"service {name}: pid {', '.join(map(str, left))} did not stop")
