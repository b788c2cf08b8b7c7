"""The embedded default driver: plain processes supervised from the state directory.

Per service, under ``<state>/services/<name>/``::

    live/           the files the program reads (its cwd), changed in place file by file
    rev/<hash>/     the rendered files of each recent slice, written once: restores, rollback
    record.json     what runs: state, pid, process start time, hash, commit, command, env, user
    data/           persistent, writable ($RECONCILER_DATA_DIR), owned by the service's user
    service.log     stdout and stderr, appended; private (a program may print its secrets)

Processes run in their own session (process group), so they outlive the run that started them
and a stop reaches their children. A pid alone is not proof: the record also holds the
process's start time from /proc, so a recycled pid is never mistaken for the service.

A process is findable before its record names it. The record is written first (state
"starting", no pid), and every process carries ``RECONCILER_INSTANCE=<root>|<node>|<service>|
<hash>`` in its environment. A run killed between the spawn and the record leaves a process
that the next observe finds in /proc and adopts (the record is for the same hash and names no
live process) or stops: never a second copy, never an orphan.

A service starts from a clean environment (``clean_env``: fixed PATH, C.UTF-8, its user's
HOME) plus what service.yaml declares and the RECONCILER_* variables, as the ``user`` and
``group`` it names; its reload and check commands too.

Where systemd runs (and the agent is root), each service starts in a transient scope of its own
(``systemd-run --scope``, in ``reconciler.slice``), so it is not in the cgroup of the agent's
unit: restarting or stopping the agent leaves it alone, and systemd sees no left-over process.
``systemd-run --scope`` execs the command itself (through ``setpriv`` and ``env``), so the pid,
the process group, the environment and the marker stay what they are without it. ``setpriv``
switches to the service's user once the scope is made (which takes root), with no supplementary
groups. Elsewhere the process group alone.
"""

from __future__ import annotations

import contextlib
import functools
import grp
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from reconciler.core import faults
from reconciler.core.atomic import TEMP_PREFIX, atomic_write, fsync_dir
from reconciler.core.errors import ApplyError, ReconcilerError
from reconciler.core.model import DesiredService, FileSpec, ObservedService
from reconciler.drivers.base import Check, clean_env
from reconciler.drivers.files import read_dir, read_record, signal_number, sync_dir, write_record

STOP_TIMEOUT = 10.0
KEEP_REVISIONS = 5


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


def _proc(pid: int) -> Proc | None:
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


def _proc_start_time(pid: int) -> str | None:
    """Start time of a live (non-zombie) process, in clock ticks since boot; None if gone."""
    p = _proc(pid)
    return p.start_time if p else None


def _descends(p: Proc, ancestor: int) -> bool:
    """Whether ``p`` is ``ancestor``, in its group or session, or below it in the process tree."""
    seen: Proc | None = p
    for _ in range(64):
        if seen is None or seen.pid <= 1:
            return False
        if ancestor in (seen.pid, seen.pgrp, seen.session):
            return True
        seen = _proc(seen.ppid)
    return False


def _started_at(start_time: str) -> float:
    """A /proc start time as a Unix time."""
    with open("/proc/stat") as f:
        boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    return boot + int(start_time) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Account:
    """Who a service runs as; None keeps the agent's own uid or gid."""

    uid: int | None
    gid: int | None
    name: str
    home: str

    @property
    def switched(self) -> bool:
        return self.uid is not None or self.gid is not None


def account(user: str, group: str) -> Account:
    """Resolve ``user`` and ``group`` (names, or numeric ids) on this node. No group: the user's
    own. ``LookupError`` says which name the node does not know."""
    pw: pwd.struct_passwd | None = None
    uid: int | None = None
    if user:
        try:
            pw = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
        except KeyError:
            if not user.isdigit():  # a bare uid with no name is usable, as in a container
                raise LookupError(f"no user {user!r} on this node") from None
        uid = pw.pw_uid if pw else int(user)
    gid = pw.pw_gid if pw else None
    if group:
        try:
            gid = grp.getgrgid(int(group)).gr_gid if group.isdigit() else grp.getgrnam(group).gr_gid
        except KeyError:
            if not group.isdigit():
                raise LookupError(f"no group {group!r} on this node") from None
            gid = int(group)
    if not user:
        env = clean_env()
        return Account(uid, gid, env["USER"], env["HOME"])
    return Account(uid, gid, pw.pw_name if pw else user, pw.pw_dir if pw else "/")


def check_account(kind: str, name: str) -> str | None:
    """For rendering on the node: why it cannot run a process as this ``user`` or ``group``."""
    try:
        account(name if kind == "user" else "", name if kind == "group" else "")
    except LookupError as exc:
        return str(exc)
    return None


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


LOG_LIMIT = 16 * 1024 * 1024  # service.log is rotated past this many bytes (one older file kept)


@functools.cache  # asked by every driver made (each pass, each supervisor tick): the answer stays
def systemd_scopes() -> bool:
    """Whether services can get scopes of their own: systemd is the init system (sd_booted's
    test), the agent is root, and systemd-run and setpriv are there."""
    return (os.geteuid() == 0 and os.path.isdir("/run/systemd/system")
            and shutil.which("systemd-run") is not None and shutil.which("setpriv") is not None)


class ProcessDriver:
    name = "process"

    def __init__(self, root: Path, node: str, scopes: bool | None = None) -> None:
        # Absolute: the marker and $RECONCILER_DATA_DIR must mean the same from any directory.
        self.root = root.absolute()
        self.node = node
        self.scopes = systemd_scopes() if scopes is None else scopes  # None: wherever systemd runs

    def _dir(self, name: str) -> Path:
        return self.root / name

    def _record(self, name: str) -> dict[str, Any] | None:
        return read_record(self._dir(name))

    def rotate_logs(self, limit: int = LOG_LIMIT) -> list[str]:
        """Each service.log past ``limit`` bytes copied to service.log.1 (the one before it
        dropped) and cut to nothing. The service keeps writing through its O_APPEND descriptor,
        so its next line lands at the start of the cut file: nothing restarts. What it writes
        between the copy and the cut is lost (logrotate's copytruncate has the same gap)."""
        rotated = []
        for log in sorted(self.root.glob("*/service.log")):
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

    def _alive(self, rec: dict[str, Any] | None) -> bool:
        # No recorded start time means it died before it could be seen: never "alive".
        return bool(rec and rec.get("pid") and rec.get("start_time") is not None
                    and _proc_start_time(rec["pid"]) == rec["start_time"])

    # finding processes -----------------------------------------------------------------
    def _marker(self, name: str, hash_: str) -> str:
        return f"{self.root}|{self.node}|{name}|{hash_}"

    def _marked(self) -> dict[str, list[tuple[Proc, str]]]:
        """Every live process of this driver's services, by service, with the hash it was started
        for: the marker in its environment, which its children inherit too."""
        prefix = f"{MARKER}={self.root}|{self.node}|".encode()
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
            p = _proc(int(entry.name)) if value else None
            if value is None or p is None:
                continue
            service, _, hash_ = value[len(prefix):].decode(errors="replace").rpartition("|")
            found.setdefault(service, []).append((p, hash_))
        return found

    def _sweep(self, name: str, marked: list[tuple[Proc, str]] | None = None) -> dict[str, Any] | None:
        """The service's processes that its record does not name: a run was killed between the
        spawn and the record. One started for the record's hash, when the record names no live
        process, is adopted (its pid goes into the record); every other one is stopped. Returns
        the record as it is now."""
        rec = self._record(name)
        procs = self._marked().get(name, []) if marked is None else marked
        owner = int(rec["pid"]) if rec is not None and self._alive(rec) else None
        strays = [(p, h) for p, h in procs if owner is None or not _descends(p, owner)]
        if not strays:
            return rec
        if rec is not None and owner is None:
            same = sorted((p for p, h in strays if p.leader and h == rec.get("hash")),
                          key=lambda p: int(p.start_time))
            if same:
                adopted = same[-1]  # the newest: the spawn the record was written for
                rec = {**rec, "state": "running", "pid": adopted.pid, "start_time": adopted.start_time,
                       "started": _started_at(adopted.start_time)}
                write_record(self._dir(name), rec)
                strays = [(p, h) for p, h in strays if not _descends(p, adopted.pid)]
        self._terminate(name, _targets(p for p, _ in strays))
        return rec

    # observe ---------------------------------------------------------------------------
    def observe(self) -> list[ObservedService]:
        out: list[ObservedService] = []
        if not self.root.is_dir():
            return out
        marked = self._marked()
        for d in sorted(self.root.iterdir()):
            rec = self._sweep(d.name, marked.get(d.name, []))
            if rec is None:
                continue
            alive = self._alive(rec)
            files = read_dir(Path(rec["cwd"]))
            detail = "" if alive else "not running"
            if not alive and rec.get("state") == "starting":
                detail = "never seen running: a run stopped while starting it"
            out.append(ObservedService(
                name=d.name, driver=self.name, running=alive, hash=rec.get("hash"),
                commit=rec.get("commit"), pid=rec["pid"] if alive else None, detail=detail,
                fingerprint=tuple(sorted(rec.get("fingerprint", {}).items())),
                files=files, drift=str(rec.get("drift", "correct")), drifted=file_drift(rec, files),
            ))
        return out

    def liveness(self) -> list[ObservedService]:
        """What the supervisor needs every few seconds: each service, running or not, read from
        its record and its process's /proc stat alone while every one is up (or down on purpose,
        under ``drift: report``). Not every process's environment on the node (a few ms a tick
        among a thousand processes: more than the rest of an idle agent), nor the files. Once one
        is down, ``observe``: its strays are swept (a run killed after the spawn is adopted)
        before the supervisor revives it."""
        if not self.root.is_dir():
            return []
        records = [(d.name, rec, self._alive(rec)) for d in sorted(self.root.iterdir())
                   if (rec := self._record(d.name)) is not None]
        # One stopped by hand under drift: report is left down: no reason to look further.
        if any(not alive and rec.get("drift") != "report" for _, rec, alive in records):
            return self.observe()
        return [ObservedService(name=name, driver=self.name, running=alive, hash=rec.get("hash"),
                                commit=rec.get("commit"), pid=rec["pid"] if alive else None,
                                drift=str(rec.get("drift", "correct")))
                for name, rec, alive in records]

    def running(self, name: str) -> bool:
        return self._alive(self._record(name))

    # apply -----------------------------------------------------------------------------
    def materialise(self, svc: DesiredService) -> Path:
        """Write the slice's files into rev/<hash>/ once; an existing revision is reused."""
        rev = self._dir(svc.name) / "rev" / svc.hash
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

    def _live(self, name: str) -> Path:
        return self._dir(name) / "live"

    def _sync(self, name: str, files: Iterable[FileSpec], rec: dict[str, Any]) -> None:
        """The live files as given, owned by the service's user when it has one (a 0600 file
        holds a secret only it may read); the directory stays the agent's."""
        live = self._live(name)
        sync_dir(live, files)
        acct = _account_of(rec)
        if acct.switched:
            for path in live.rglob("*"):
                if path.is_file() and not path.name.startswith("."):
                    os.chown(path, -1 if acct.uid is None else acct.uid, -1 if acct.gid is None else acct.gid)

    def _new_record(self, svc: DesiredService, commit: str, rev: Path) -> dict[str, Any]:
        return {
            "service": svc.name,
            "hash": svc.hash,
            "fingerprint": svc.fingerprint(),
            # The keys of the secret files' hashes, to check the live files against the fingerprint
            # (drift). Private like the record, beside files that hold the values themselves.
            "file_keys": {f.path: f.key.hex() for f in svc.files if f.key},
            "commit": commit,
            "cwd": str(self._live(svc.name)),
            "rev": str(rev),
            "command": list(svc.runtime.command),
            "env": dict(svc.runtime.env),
            "user": svc.runtime.user,
            "group": svc.runtime.group,
            "reload": {"signal": svc.reload.signal, "command": svc.reload.command},
            "drift": svc.drift,
        }

    def start(self, svc: DesiredService, commit: str, check: Check) -> int | None:
        return self._replace(svc, commit, check, restore=False)

    def restart(self, svc: DesiredService, commit: str, check: Check) -> int | None:
        return self._replace(svc, commit, check, restore=True)

    def recreate(self, svc: DesiredService, commit: str, check: Check) -> int | None:
        return self._replace(svc, commit, check, restore=True)

    def connect(self, svc: DesiredService, commit: str, check: Check | None = None) -> None:
        self.update(svc, commit)  # plain processes have no networks of their own

    def _replace(self, svc: DesiredService, commit: str, check: Check, restore: bool) -> int | None:
        """Stop the old process, start the new one, check it; on failure start the old one again."""
        previous = self._record(svc.name) if restore else None
        rev = self.materialise(svc)  # before the stop: a full disk fails here, with the old one still up
        self.stop(svc.name)  # and any copy a killed run left behind
        new = self._new_record(svc, commit, rev)
        self._sync(svc.name, svc.files, new)
        try:
            pid = self._spawn(new)
            check()
        except ReconcilerError as exc:
            self.stop(svc.name)
            if previous is None or not Path(previous.get("rev", "")).is_dir():
                # Nothing to go back to: forget the failed version, so the supervisor does not
                # revive it and the next run starts it afresh.
                (self._dir(svc.name) / "record.json").unlink(missing_ok=True)
                raise
            self._sync(svc.name, read_dir(Path(previous["rev"])), previous)
            old = self._spawn(previous)
            try:
                check()  # the same probe; a version whose probe moved is judged by the new one
                state = "restored"
            except ReconcilerError:
                state = "restored but not healthy"
            raise ApplyError(f"{exc}; previous version {state} (pid {old})") from exc
        self._gc(svc.name, keep=svc.hash)
        return pid

    def update(self, svc: DesiredService, commit: str) -> None:
        """New files and record; the process is not touched."""
        rec = self._record(svc.name) or {}
        rev = self.materialise(svc)
        new = self._new_record(svc, commit, rev)
        self._sync(svc.name, svc.files, new)
        keep: dict[str, Any] = {k: rec[k] for k in ("state", "pid", "start_time", "started") if k in rec}
        write_record(self._dir(svc.name), {**new, **keep})

    def reload(self, svc: DesiredService, commit: str, check: Check) -> int | None:
        rec = self._record(svc.name)
        if rec is None or not self._alive(rec):
            raise ApplyError(f"service {svc.name}: not running, nothing to reload")
        before = read_dir(self._live(svc.name))
        self.update(svc, commit)
        try:
            self._signal_reload(svc.name)
            check()
        except ReconcilerError as exc:
            self._sync(svc.name, before, rec)
            write_record(self._dir(svc.name), rec)
            with contextlib.suppress(ReconcilerError):
                self._signal_reload(svc.name)
            raise ApplyError(f"{exc}; previous config restored and reloaded") from exc
        return int(rec["pid"])

    def _signal_reload(self, name: str) -> None:
        rec = self._record(name)
        assert rec is not None
        how = rec.get("reload") or {}
        if how.get("command"):
            done = self._run(rec, how["command"], 30, {"RECONCILER_PID": str(rec["pid"])})
            if done is None:
                raise ApplyError(f"service {name}: reload command timed out")
            if done.returncode != 0:
                err = done.stderr.decode(errors="replace")[-200:]
                raise ApplyError(f"service {name}: reload command failed: {err}")
            return
        sig = signal_number(how.get("signal") or "SIGHUP")
        faults.point("signal", f"{name} {signal.Signals(sig).name}")
        try:
            os.kill(int(rec["pid"]), sig)
        except ProcessLookupError as exc:
            raise ApplyError(f"service {name}: exited before its reload") from exc

    def native_health(self, name: str) -> str | None:
        del name
        return None

    def run_check(self, name: str, command: str) -> bool:
        rec = self._record(name)
        if rec is None:
            return False
        done = self._run(rec, command, 10)
        return done is not None and done.returncode == 0

    def _run(self, rec: dict[str, Any], command: str, timeout: float,
             extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes] | None:
        """A shell command where the service runs: its directory, its user, its environment
        (without the marker: it is the agent's, not one of the service's processes). None when
        it timed out."""
        acct = _account_of(rec)
        env = {k: v for k, v in self._env(rec, acct).items() if k != MARKER}
        try:
            return subprocess.run(["/bin/sh", "-c", command], cwd=rec["cwd"], env={**env, **(extra or {})},
                                  capture_output=True, timeout=timeout, **_as(acct))
        except subprocess.TimeoutExpired:
            return None
        except OSError as exc:
            raise ApplyError(f"service {rec['service']}: cannot run {command!r}: {exc.strerror}") from exc

    def revive(self, name: str) -> int | None:
        rec = self._sweep(name)  # a copy a killed run started is the one to keep
        if rec is None:
            raise ApplyError(f"service {name}: no record to restart from")
        if self._alive(rec):
            return int(rec["pid"])
        return self._spawn(rec)

    def _env(self, rec: dict[str, Any], acct: Account) -> dict[str, str]:
        env = clean_env(acct.home, acct.name)
        env.update(rec["env"])
        env.update({
            "RECONCILER_NODE": self.node, "RECONCILER_SERVICE": rec["service"],
            "RECONCILER_COMMIT": rec["commit"], "RECONCILER_DATA_DIR": str(self._dir(rec["service"]) / "data"),
            MARKER: self._marker(rec["service"], rec["hash"]),
        })
        return env

    def _spawn(self, rec: dict[str, Any]) -> int:
        name = rec["service"]
        d = self._dir(name)
        try:
            acct = _account_of(rec)
        except LookupError as exc:  # it existed at render time; gone since
            raise ApplyError(f"service {name}: {exc}") from exc
        data = d / "data"
        data.mkdir(mode=0o700, parents=True, exist_ok=True)
        if acct.switched:
            _own(data, acct)
        env = self._env(rec, acct)
        argv = list(rec["command"])
        if "/" not in argv[0]:
            found = shutil.which(argv[0], path=env["PATH"])
            if found is None:
                raise ApplyError(f"service {name}: command {argv[0]!r} not found on PATH ({env['PATH']})")
            argv[0] = found
        # A trace before the process exists: a run killed right after the spawn leaves a record
        # that says what was being started, and the next run adopts the process it finds.
        rec = {k: v for k, v in rec.items() if k not in ("pid", "start_time", "started")}
        rec["state"] = "starting"
        write_record(d, rec)
        fd = os.open(d / "service.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.fchmod(fd, 0o600)  # a log written before logs were private
        with open(fd, "ab") as log:
            log.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} start {' '.join(argv)}\n".encode())
            log.flush()
            faults.point("spawn", name)
            try:
                wrapped, as_ = (self._scoped(name, acct) + argv, {}) if self.scopes else (argv, _as(acct))
                proc = subprocess.Popen(
                    wrapped, cwd=rec["cwd"], env=env, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True, **as_,
                )
            except OSError as exc:
                raise ApplyError(f"service {name}: cannot start {argv[0]}: {exc.strerror}") from exc
        start_time = None
        for _ in range(100):  # /proc entry appears with the fork; the loop is for safety
            start_time = _proc_start_time(proc.pid)
            if start_time is not None or proc.poll() is not None:
                break
            time.sleep(0.01)
        rec = {**rec, "state": "running", "pid": proc.pid, "start_time": start_time, "started": time.time()}
        write_record(d, rec)
        return proc.pid

    def _scoped(self, name: str, acct: Account) -> list[str]:
        """The words before a service's command that start it in a scope of its own, as its user.
        A fresh scope name each time: the one of a stopped process may not be gone yet."""
        unit = f"reconciler-{name}-{secrets.token_hex(4)}.scope"
        words = [shutil.which("systemd-run") or "systemd-run", "--scope", "--quiet", "--collect",
                 f"--unit={unit}", "--slice=reconciler.slice", f"--description=reconciler {self.node}: {name}", "--"]
        if acct.switched:
            words += [shutil.which("setpriv") or "setpriv",
                      *([f"--reuid={acct.uid}"] if acct.uid is not None else []),
                      *([f"--regid={acct.gid}"] if acct.gid is not None else []), "--clear-groups", "--"]
        # systemd-run adds the scope's INVOCATION_ID; the service's environment stays the clean one.
        return [*words, shutil.which("env") or "env", "-u", "INVOCATION_ID", "--"]

    def stop(self, name: str) -> None:
        """Stop the service's process group, and every other process carrying its marker."""
        rec = self._record(name)
        recorded = (int(rec["pid"]), str(rec["start_time"])) if rec is not None and self._alive(rec) else None
        procs = [p for p, _ in self._marked().get(name, [])]
        self._terminate(name, _targets(procs, recorded))

    def _terminate(self, name: str, targets: list[tuple[int, str, bool]]) -> None:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT, to each (pid, start time, whole group?) until
        every one is gone."""
        for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT), (signal.SIGKILL, 5.0)):
            for pid, start_time, group in targets:
                if _proc_start_time(pid) != start_time:
                    continue
                faults.point("signal", f"{name} {sig.name}")
                with contextlib.suppress(ProcessLookupError):
                    (os.killpg if group else os.kill)(pid, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if all(_proc_start_time(pid) != start_time for pid, start_time, _ in targets):
                    return
                time.sleep(0.05)
        left = [pid for pid, start_time, _ in targets if _proc_start_time(pid) == start_time]
        raise ApplyError(f"service {name}: pid {', '.join(map(str, left))} did not stop")

    def remove(self, name: str) -> None:
        self.stop(name)
        d = self._dir(name)
        with contextlib.suppress(FileNotFoundError):
            (d / "record.json").unlink()
        shutil.rmtree(d / "rev", ignore_errors=True)
        shutil.rmtree(d / "live", ignore_errors=True)

    def _gc(self, name: str, keep: str) -> None:
        """Keep the newest revisions (for rollback), drop older ones."""
        revs = self._dir(name) / "rev"
        entries = sorted(
            (p for p in revs.iterdir() if p.name != keep), key=lambda p: p.stat().st_mtime, reverse=True
        )
        for old in entries[KEEP_REVISIONS - 1 :]:
            shutil.rmtree(old, ignore_errors=True)

    def logs(self, name: str, lines: int, follow: bool) -> Iterator[bytes]:
        return tail_file(self._dir(name) / "service.log", lines, follow)

    def last_output(self, name: str, lines: int = 5) -> str:
        try:
            text = (self._dir(name) / "service.log").read_bytes()[-4000:].decode(errors="replace")
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


def _targets(procs: Iterable[Proc], recorded: tuple[int, str] | None = None) -> list[tuple[int, str, bool]]:
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


def _account_of(rec: dict[str, Any]) -> Account:
    return account(str(rec.get("user", "")), str(rec.get("group", "")))


def _as(acct: Account) -> dict[str, Any]:
    """subprocess arguments that start a process as the account, with no supplementary groups."""
    if not acct.switched:
        return {}
    return {"user": acct.uid, "group": acct.gid, "extra_groups": []}


def _own(path: Path, acct: Account) -> None:
    """Give a data dir to the service's user; all of it when it belonged to another one before."""
    uid = -1 if acct.uid is None else acct.uid
    gid = -1 if acct.gid is None else acct.gid
    st = path.stat()
    if (uid in (-1, st.st_uid)) and (gid in (-1, st.st_gid)):
        return
    for sub in [path, *path.rglob("*")]:
        os.lchown(sub, uid, gid)
