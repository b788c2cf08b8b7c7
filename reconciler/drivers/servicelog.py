"""A process service's own output: ``service.log`` in its directory, appended to by the
program (stdout and stderr), rotated so it never fills the disk, read back for ``logs`` and
for error messages."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from reconciler.core import faults

LOG_LIMIT = 16 * 1024 * 1024  # service.log is rotated past this many bytes (one older file kept)


def rotate_logs(root: Path, limit: int = LOG_LIMIT) -> list[str]:
    """Each service.log past ``limit`` bytes copied to service.log.1 (the one before it
    dropped) and cut to nothing. The service keeps writing through its O_APPEND descriptor,
    so its next line lands at the start of the cut file: nothing restarts. What it writes
    between the copy and the cut is lost (logrotate's copytruncate has the same gap)."""
    rotated = []
    for log in sorted(root.glob("*/service.log")):
        try:
            if log.stat().st_size <= limit:
                continue
            older = log.with_name("service.log.1")
            tmp = log.with_name(".service.log.1.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with open(fd, "wb") as out, log.open("rb") as src:
                shutil.copyfileobj(src, out)
            faults.point("rename", str(older))
            os.replace(tmp, older)
            faults.point("truncate", str(log))  # killed here: the next tick copies it again
            os.truncate(log, 0)
        except OSError:
            continue  # a log that cannot be rotated now is tried again on the next tick
        rotated.append(log.parent.name)
    return rotated


def last_output(log: Path, lines: int = 5) -> str:
    """The tail of this start's output in ``log``, for error messages."""
    try:
        text = log.read_bytes()[-4000:].decode(errors="replace")
    except FileNotFoundError:
        return ""
    since_start = text.rsplit("\n--- ", 1)[-1].split("\n", 1)[-1]  # this start's output only
    return " | ".join(t.strip() for t in since_start.splitlines()[-lines:] if t.strip())


def tail_file(path: Path, lines: int, follow: bool, poll: float = 0.2) -> Iterator[bytes]:
    """The last ``lines`` lines of a log file, then (``follow``) what is appended to it; a file
    cut short or replaced (rotated) is read again from its start."""
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return
    with f:
        f.seek(0, os.SEEK_END)
        end = f.tell()
        f.seek(max(0, end - 64 * 1024 * max(1, lines // 100)))
        tail = f.read()  # and the position is at the end: following starts from there
        yield b"".join(tail.splitlines(keepends=True)[-lines:]) if lines else b""
        while follow:
            chunk = f.read()
            if chunk:
                yield chunk
                continue
            try:
                moved = path.stat().st_ino != os.fstat(f.fileno()).st_ino or path.stat().st_size < f.tell()
            except FileNotFoundError:
                moved = False
            if moved:
                yield from tail_file(path, 1 << 30, follow, poll)
                return
            time.sleep(poll)
