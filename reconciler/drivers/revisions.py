"""A process service's files: each slice's rendered files kept once under ``rev/<hash>/``
(what a failed change restores, what a rollback starts from), the older ones pruned; the live
dir the program reads synced to a slice and given to its user; and drift, the live files
against what the record says was applied; and what a record says of a version."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from reconciler.core import faults
from reconciler.core.atomic import TEMP_PREFIX, atomic_write, fsync_dir
from reconciler.core.model import DesiredService, FileSpec
from reconciler.drivers.files import sync_dir
from reconciler.drivers.runas import account_of

KEEP_REVISIONS = 5


def materialise(revs: Path, svc: DesiredService) -> Path:
    """Write the slice's files into rev/<hash>/ once; an existing revision is reused."""
    rev = revs / svc.hash
    if rev.is_dir():
        return rev
    tmp = rev.with_name(f"{TEMP_PREFIX}rev-{svc.hash}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    for f in svc.files:
        atomic_write(tmp / f.path, f.content, f.mode)
    tmp.mkdir(parents=True, exist_ok=True)
    faults.point("rename", str(rev))
    os.replace(tmp, rev)
    fsync_dir(rev.parent)
    return rev


def prune(revs: Path, keep: str) -> None:
    """Keep the newest revisions (for rollback), drop older ones."""
    entries = sorted(
        (p for p in revs.iterdir() if p.name != keep), key=lambda p: p.stat().st_mtime, reverse=True
    )
    for old in entries[KEEP_REVISIONS - 1 :]:
        shutil.rmtree(old, ignore_errors=True)


def new_record(svc: DesiredService, commit: str, rev: Path, live: Path) -> dict[str, Any]:
    """What the record says of a version: how it runs, where its files are, what they hash to."""
    return {
        "service": svc.name,
        "hash": svc.hash,
        "fingerprint": svc.fingerprint(),
        # The keys of the secret files' hashes, to check the live files against the fingerprint
        # (drift). Private like the record, beside files that hold the values themselves.
        "file_keys": {f.path: f.key.hex() for f in svc.files if f.key},
        "commit": commit,
        "cwd": str(live),
        "rev": str(rev),
        "command": list(svc.runtime.command),
        "env": dict(svc.runtime.env),
        "user": svc.runtime.user,
        "group": svc.runtime.group,
        "reload": {"signal": svc.reload.signal, "command": svc.reload.command},
        "drift": svc.drift,
    }


def sync_live(live: Path, files: Iterable[FileSpec], rec: dict[str, Any]) -> None:
    """The live files as given, owned by the service's user when it has one (a 0600 file
    holds a secret only it may read); the directory stays the agent's."""
    sync_dir(live, files)
    acct = account_of(rec)
    if acct.switched:
        for path in live.rglob("*"):
            if path.is_file() and not path.name.startswith("."):
                os.chown(path, -1 if acct.uid is None else acct.uid, -1 if acct.gid is None else acct.gid)


def file_drift(rec: dict[str, Any], live: tuple[FileSpec, ...]) -> str:
    """What differs between the live files and the content hashes the record says were applied:
    "files: identity.conf changed, notes.txt added"; empty when they match. A secret file's hash
    is keyed (``FileSpec.key``): the record keeps its key, so the live file hashes alike."""
    applied = {k.removeprefix("file:"): v for k, v in rec.get("fingerprint", {}).items() if k.startswith("file:")}
    keys = {path: bytes.fromhex(key) for path, key in (rec.get("file_keys") or {}).items()}
    now = {f.path: f"{f.mode:o}:{replace(f, key=keys.get(f.path, b'')).sha256}" for f in live}
    changes = []
    for path in sorted(set(applied) | set(now)):
        if path not in now:
            changes.append(f"{path} missing")
        elif path not in applied:
            changes.append(f"{path} added")
        elif now[path] != applied[path]:
            same_content = now[path].split(":")[1] == applied[path].split(":")[1]
            changes.append(f"{path} {'mode changed' if same_content else 'changed'}")
    return "files: " + ", ".join(changes) if changes else ""
