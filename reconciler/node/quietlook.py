"""What the quick no-op check of `agent --once` looks at on the node (``node.quiet``): the
process driver's services (records, processes, live files, strays), the ledger file, and the
stat and bytes of files, with the standard library only.

Also what the full pass fingerprints for it (``node.quietmark``, ``node.reconcile.noop``): the
same functions on both sides, so the two digests can only differ when the node did.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import hashlib

LEDGER = "state.db"  # ``ledger.Ledger``'s file in the state dir


def observed(state_dir: Path) -> str | None:
    """A digest of what the process driver's look at its services reads: every service's
    record, its process alive with the start time the record says, and every entry under its
    live dir (stat and bytes). None: a service is down (the pass restarts it)."""
    h = sha256()
    root = state_dir / "services"
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        names = []
    owners: dict[str, int] = {}
    for name in names:
        try:
            raw = (root / name / "record.json").read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            h.update(f"\0{name}\0-".encode(errors="surrogateescape"))
            continue
        h.update(f"\0{name}\0".encode(errors="surrogateescape") + raw)
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        pid, start = rec.get("pid"), rec.get("start_time")
        if not (isinstance(pid, int) and pid > 0 and start is not None and _start_time(pid) == start):
            return None
        owners[name] = pid
        if isinstance(rec.get("cwd"), str):
            h.update(f"\0{rec['cwd']}\0{tree_print(Path(rec['cwd']))}".encode(errors="surrogateescape"))
    return None if _strays(root, owners) else h.hexdigest()


def _strays(services: Path, owners: dict[str, int]) -> bool:
    """A live process with the mark of a service of this state dir (``drivers.proctable``'s
    ``find_marked``, of any node) that is not its recorded process, nor in its group, session
    or tree: a run killed between a spawn and its record, a child that left the tree. Every full
    pass stops (or adopts) it (``ProcessDriver._sweep``): a pass, not a no-op."""
    prefix = f"RECONCILER_INSTANCE={services.absolute()}|".encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                env = f.read()
        except OSError:  # gone, or not ours to read (as ``find_marked``)
            continue
        if prefix not in env:
            continue
        value = next((v for v in env.split(b"\0") if v.startswith(prefix)), None)
        if value is None:
            continue
        parts = value[len(prefix):].decode(errors="replace").split("|")  # node|service|hash
        owner = owners.get(parts[1]) if len(parts) == 3 else None
        if owner is None or not _descends(int(entry.name), owner):
            return True
    return False


def _descends(pid: int, ancestor: int) -> bool:
    """``drivers.proctable.descends``: ``pid`` is ``ancestor``, in its group or session, or
    below it in the process tree (a process gone or a zombie: not a stray either)."""
    for step in range(64):
        try:
            with open(f"/proc/{pid}/stat") as f:
                text = f.read()
        except OSError:
            return step == 0  # itself gone: ``find_marked`` would not list it; a parent gone: a stray
        fields = text[text.rindex(")") + 2:].split()
        if fields[0] in ("Z", "X"):
            return step == 0
        if pid <= 1:
            return False
        if ancestor in (pid, int(fields[2]), int(fields[3])):
            return True
        pid = int(fields[1])
    return False


def ledger_print(state_dir: Path) -> str:
    """The ledger file's stat: a no-op pass writes nothing to it, a restore from a backup (by
    copy, rename or ``cp -p``: its ctime) changes it."""
    return _stat(os.stat(state_dir / LEDGER))


def wal_empty(state_dir: Path) -> bool:
    """The ledger's write-ahead log holds nothing (closed cleanly, as a pass leaves it): what it
    held would be read, unseen by the ledger file's stat."""
    try:
        return os.stat(state_dir / f"{LEDGER}-wal").st_size == 0
    except FileNotFoundError:
        return True


def _start_time(pid: int) -> str | None:
    """``drivers.proctable.start_time_of``: a live process's start time; None when gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def file_print(path: Path) -> str:
    """A file's stat and bytes, or why it has none. A directory (a GnuPG home, the host's root
    ``/``): its own stat only, which an entry added, removed or replaced by rename changes."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"absent {exc.errno}"
    return f"{_stat(st)} {_digest(path, st)}"


def tree_print(live: Path) -> str:
    """Every entry under ``live`` with its stat and, for a file, its bytes' digest
    (``drivers.glance.stat_tree``, plus the bytes a full look reads)."""
    out: list[str] = []
    todo = [(str(live), "")]
    while todo:
        top, rel = todo.pop()
        try:
            entries = list(os.scandir(top))
        except OSError:
            out.append(f"{rel}: unreadable")
            continue
        for e in entries:
            try:
                st = e.stat()
            except OSError:
                st = e.stat(follow_symlinks=False)
            out.append(f"{rel}{e.name} {_stat(st)} {_digest(Path(e.path), st)}")
            with contextlib.suppress(OSError):
                if e.is_dir(follow_symlinks=False):
                    todo.append((e.path, f"{rel}{e.name}/"))
    return "\n".join(sorted(out))


def sha256(data: bytes = b"") -> hashlib._Hash:
    """hashlib's sha256, imported when first used: the daemon imports this module (through
    ``node.reconcile``) and never uses it, and hashlib loads OpenSSL's libcrypto (``test_idle``)."""
    import hashlib

    return hashlib.sha256(data)


def _stat(st: os.stat_result) -> str:
    return f"{st.st_ino} {st.st_size} {st.st_mode} {st.st_mtime_ns} {st.st_ctime_ns}"


def _digest(path: Path, st: os.stat_result) -> str:
    if not stat.S_ISREG(st.st_mode):
        return "-"
    try:
        with open(path, "rb") as f:
            return sha256(f.read()).hexdigest()
    except OSError as exc:
        return f"unreadable {exc.errno}"
