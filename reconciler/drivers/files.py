"""A service's live config directory: the one path its program reads, changed in place.

Files are replaced one by one atomically (temp, fsync, rename) inside the same directory, so a
process that keeps its working directory, or a container that bind-mounts the directory, sees
the new files without being restarted: what a reload needs. Files no longer in the slice go.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from reconciler.core.atomic import atomic_write, fsync_dir
from reconciler.core.model import FileSpec


def sync_dir(live: Path, files: Iterable[FileSpec]) -> None:
    live.mkdir(parents=True, exist_ok=True)
    wanted = {f.path: f for f in files}
    for f in wanted.values():
        target = live / f.path
        try:
            same = target.read_bytes() == f.content and (target.stat().st_mode & 0o7777) == f.mode
        except OSError:
            same = False
        if not same:
            atomic_write(target, f.content, f.mode)
    for path in sorted(live.rglob("*"), reverse=True):
        rel = path.relative_to(live).as_posix()
        if path.is_file() and rel not in wanted and not path.name.startswith("."):
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            with contextlib.suppress(OSError):
                path.rmdir()
    fsync_dir(live)


def read_dir(live: Path) -> tuple[FileSpec, ...]:
    """The files as they are now (what the service runs with), for a key-level comparison."""
    out = []
    if not live.is_dir():
        return ()
    for path in sorted(live.rglob("*")):
        if path.is_file() and not path.name.startswith("."):
            st = path.stat()
            out.append(FileSpec(path.relative_to(live).as_posix(), st.st_mode & 0o7777, path.read_bytes()))
    return tuple(out)


def write_record(directory: Path, record: dict[str, Any]) -> None:
    """A driver's record of what it applied: private (it holds service environments)."""
    atomic_write(directory / "record.json", json.dumps(record, indent=2, sort_keys=True).encode(), 0o600)


def read_record(directory: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((directory / "record.json").read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def signal_number(name: str) -> int:
    import signal

    return int(getattr(signal, name if name.startswith("SIG") else f"SIG{name}"))


__all__ = ["read_dir", "read_record", "signal_number", "sync_dir", "write_record"]
