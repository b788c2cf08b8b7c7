"""Files written whole or not at all: temp file, fsync, rename, fsync of the directory.

A crash leaves the old content or the new, never half of one. Temp files carry ``TEMP_PREFIX``
so the next run can sweep what a killed one left behind (``state.NodeDir.sweep``) without
touching anything else.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path

from reconciler.core import faults
from reconciler.core.errors import DiskFull

TEMP_PREFIX = ".rc-tmp-"


def atomic_write(path: Path, data: bytes, mode: int = 0o644, *, durable: bool = True) -> None:
    """``durable=False``: still whole or not at all for a reader, but no fsync of the file or its
    directory. For output a person reads and can make again (``render --out``): an fsync per file
    made a 30,000-file render ten times slower, and a crash there loses nothing the node needs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{TEMP_PREFIX}{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        faults.point("rename", str(path))
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise DiskFull.at(path.parent, f"cannot write {path}: no space left on device") from exc
        raise
    if durable:
        fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
