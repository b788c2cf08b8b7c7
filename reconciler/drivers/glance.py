"""The no-op poll's look at the process driver's services: what can have changed, not everything.

A poll that found nothing new asks only whether every service still runs its slice
(``node.reconcile.unchanged``). The full observation (``ProcessDriver.observe``) reads every
process's environment in /proc for strays and every live file's bytes: a few ms a poll, most
of an idle agent's own CPU. Here instead:

- each service's record and its process's ``/proc/<pid>/stat`` (its start time): a killed
  process is seen at this poll, as before (and by the supervisor within its tick);
- the live files' stat (inode, size, mode, mtime and ctime, with nanoseconds): a file edited by
  hand, added or removed changes its entry, so it is read again and compared at this poll;
  unchanged entries reuse what the last read found. An entry changed too recently to be sure
  of (within ``RACY_NS`` of the read, git's "racy" case) is read again next time;
- everything (strays in /proc, every file's bytes: damage that keeps a file's stat, such as
  bit rot) at the first poll of a process and then every ``FULL_EVERY`` seconds, and whenever a
  service is down (its strays are swept before anything revives it).

The cache is this process's (a daemon's): ``agent --once`` always looks at everything.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.core.model import FileSpec, ObservedService
from reconciler.drivers.files import read_dir, read_record
from reconciler.drivers.proctable import start_time_of
from reconciler.drivers.revisions import file_drift

if TYPE_CHECKING:
    from reconciler.drivers.process import ProcessDriver

FULL_EVERY = 300.0  # seconds between full observations of an idle daemon's services
RACY_NS = 2_000_000_000  # a stat this close to the read may not show a write in the same tick

Stat = tuple[str, int, int, int, int, int]  # path, inode, size, mode, mtime_ns, ctime_ns


@dataclass(frozen=True)
class _Seen:
    """A live dir as last read: its entries' stat, its files, and the drift they gave."""

    stat: tuple[Stat, ...]
    applied: str  # the record's fingerprint and file keys the drift was computed against
    files: tuple[FileSpec, ...]
    drifted: str


class Glance:
    """What one process remembers of its driver's services between polls."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self.clock = clock
        self.full_at: dict[Path, float] = {}
        self.seen: dict[Path, _Seen] = {}

    def look(self, driver: ProcessDriver) -> list[ObservedService]:
        root = driver.root
        now = self.clock()
        if now - self.full_at.get(root, -FULL_EVERY) >= FULL_EVERY or not root.is_dir():
            self.full_at[root] = now
            return driver.observe()
        out = []
        for d in sorted(root.iterdir()):
            rec = read_record(d)
            if rec is None:
                continue
            pid, start = rec.get("pid"), rec.get("start_time")
            if not (pid and start is not None and start_time_of(pid) == start):
                self.full_at.pop(root, None)  # down: strays swept, adoption, as a full look does
                return driver.observe()
            files, drifted = self._files(Path(rec["cwd"]), rec)
            out.append(ObservedService(
                name=d.name, driver=driver.name, running=True, hash=rec.get("hash"), commit=rec.get("commit"),
                pid=pid, fingerprint=tuple(sorted(rec.get("fingerprint", {}).items())), files=files,
                drift=str(rec.get("drift", "correct")), drifted=drifted,
            ))
        return out

    def _files(self, live: Path, rec: dict[str, Any]) -> tuple[tuple[FileSpec, ...], str]:
        applied = repr((rec.get("fingerprint"), rec.get("file_keys")))
        read_at = time.time_ns()
        stat = stat_tree(live)
        seen = self.seen.get(live)
        if seen is not None and seen.stat == stat and seen.applied == applied:
            return seen.files, seen.drifted
        files = read_dir(live)
        drifted = file_drift(rec, files)
        if all(max(s[4], s[5]) < read_at - RACY_NS for s in stat):
            self.seen[live] = _Seen(stat, applied, files, drifted)
        else:
            self.seen.pop(live, None)
        return files, drifted


def stat_tree(live: Path) -> tuple[Stat, ...]:
    """Every entry under ``live`` (hidden ones too: a superset of what ``read_dir`` reads), by
    path, with what a write, a chmod, a rename or a replacement changes."""
    out: list[Stat] = []
    todo = [(str(live), "")]
    while todo:
        top, rel = todo.pop()
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for e in entries:
            try:
                st = e.stat()  # follows a symlink, as ``read_dir`` does
            except OSError:
                st = e.stat(follow_symlinks=False)
            out.append((rel + e.name, st.st_ino, st.st_size, st.st_mode, st.st_mtime_ns, st.st_ctime_ns))
            # Never into a linked directory: a link to / would walk the machine every poll, a
            # link to . forever (``read_dir`` follows neither).
            with contextlib.suppress(OSError):
                if e.is_dir(follow_symlinks=False):
                    todo.append((e.path, f"{rel}{e.name}/"))
    return tuple(sorted(out))


GLANCE = Glance()  # the daemon's: one per process
