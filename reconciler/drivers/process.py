"""The embedded default driver: plain processes supervised from the state directory.

Per service, under ``<state>/services/<name>/``::

    live/           the files the program reads (its cwd), changed in place file by file
    rev/<hash>/     the rendered files of each recent slice, written once: restores, rollback
    record.json     what runs: pid, process start time, hash, commit, command, env
    data/           persistent, writable ($RECONCILER_DATA_DIR); kept when the service goes
    service.log     stdout and stderr, appended

Processes run in their own session (process group), so they outlive the run that started them
and a stop reaches their children. A pid alone is not proof: the record also holds the
process's start time from /proc, so a recycled pid is never mistaken for the service.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import ApplyError, ReconcilerError
from ..model import DesiredService, FileSpec, ObservedService
from ..state import atomic_write, fsync_dir
from .base import Check
from .files import read_dir, read_record, signal_number, sync_dir, write_record

STOP_TIMEOUT = 10.0
KEEP_REVISIONS = 5


def _proc_start_time(pid: int) -> str | None:
    """Start time of a live (non-zombie) process, in clock ticks since boot; None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)  # reap our own child so the pid can go
        return None
    return fields[19]


def file_drift(rec: dict[str, Any], live: tuple[FileSpec, ...]) -> str:
    """What differs between the live files and the content hashes the record says were applied:
    "files: identity.conf changed, notes.txt added"; empty when they match."""
    applied = {k.removeprefix("file:"): v for k, v in rec.get("fingerprint", {}).items() if k.startswith("file:")}
    now = {f.path: f"{f.mode:o}:{f.sha256}" for f in live}
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


class ProcessDriver:
    name = "process"

    def __init__(self, root: Path, node: str) -> None:
        self.root = root
        self.node = node

    def _dir(self, name: str) -> Path:
        return self.root / name

    def _record(self, name: str) -> dict[str, Any] | None:
        return read_record(self._dir(name))

    def _alive(self, rec: dict[str, Any] | None) -> bool:
        # No recorded start time means it died before it could be seen: never "alive".
        return bool(rec and rec.get("pid") and rec.get("start_time") is not None
                    and _proc_start_time(rec["pid"]) == rec["start_time"])

    # observe ---------------------------------------------------------------------------
    def observe(self) -> list[ObservedService]:
        out: list[ObservedService] = []
        if not self.root.is_dir():
            return out
        for d in sorted(self.root.iterdir()):
            rec = self._record(d.name)
            if rec is None:
                continue
            alive = self._alive(rec)
            files = read_dir(Path(rec["cwd"]))
            out.append(ObservedService(
                name=d.name, driver=self.name, running=alive, hash=rec.get("hash"),
                commit=rec.get("commit"), pid=rec["pid"] if alive else None,
                detail="" if alive else "not running",
                fingerprint=tuple(sorted(rec.get("fingerprint", {}).items())),
                files=files, drift=str(rec.get("drift", "correct")), drifted=file_drift(rec, files),
            ))
        return out

    def running(self, name: str) -> bool:
        return self._alive(self._record(name))

    # apply -----------------------------------------------------------------------------
    def materialise(self, svc: DesiredService) -> Path:
        """Write the slice's files into rev/<hash>/ once; an existing revision is reused."""
        rev = self._dir(svc.name) / "rev" / svc.hash
        if rev.is_dir():
            return rev
        tmp = rev.with_name(f".tmp-{svc.hash}-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        for f in svc.files:
            atomic_write(tmp / f.path, f.content, f.mode)
        tmp.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, rev)
        fsync_dir(rev.parent)
        return rev

    def _live(self, name: str) -> Path:
        return self._dir(name) / "live"

    def _new_record(self, svc: DesiredService, commit: str, rev: Path) -> dict[str, Any]:
        return {
            "service": svc.name,
            "hash": svc.hash,
            "fingerprint": svc.fingerprint(),
            "commit": commit,
            "cwd": str(self._live(svc.name)),
            "rev": str(rev),
            "command": list(svc.runtime.command),
            "env": dict(svc.runtime.env),
            "reload": {"signal": svc.reload.signal, "command": svc.reload.command},
            "drift": svc.drift,
        }

    def start(self, svc: DesiredService, commit: str, check: Check) -> int | None:
        return self._replace(svc, commit, check, restore=False)

    def restart(self, svc: DesiredService, commit: str, check: Check) -> int | None:
        return self._replace(svc, commit, check, restore=True)

    def recreate(self, svc: DesiredService, commit: str, check: Check) -> int | None:
        return self._replace(svc, commit, check, restore=True)

    def connect(self, svc: DesiredService, commit: str) -> None:
        self.update(svc, commit)  # plain processes have no networks of their own

    def _replace(self, svc: DesiredService, commit: str, check: Check, restore: bool) -> int | None:
        """Stop the old process, start the new one, check it; on failure start the old one again."""
        previous = self._record(svc.name) if restore else None
        rev = self.materialise(svc)  # before the stop: a full disk fails here, with the old one still up
        self.stop(svc.name)
        sync_dir(self._live(svc.name), svc.files)
        try:
            pid = self._spawn(self._new_record(svc, commit, rev))
            check()
        except ReconcilerError as exc:
            self.stop(svc.name)
            if previous is None or not Path(previous.get("rev", "")).is_dir():
                # Nothing to go back to: forget the failed version, so the supervisor does not
                # revive it and the next run starts it afresh.
                (self._dir(svc.name) / "record.json").unlink(missing_ok=True)
                raise
            sync_dir(self._live(svc.name), read_dir(Path(previous["rev"])))
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
        sync_dir(self._live(svc.name), svc.files)
        keep: dict[str, Any] = {k: rec[k] for k in ("pid", "start_time", "started") if k in rec}
        write_record(self._dir(svc.name), {**self._new_record(svc, commit, rev), **keep})

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
            sync_dir(self._live(svc.name), before)
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
            env = {**os.environ, "RECONCILER_PID": str(rec["pid"])}
            try:
                done = subprocess.run(["/bin/sh", "-c", how["command"]], cwd=rec["cwd"], env=env,
                                      capture_output=True, timeout=30)
            except subprocess.TimeoutExpired as exc:
                raise ApplyError(f"service {name}: reload command timed out") from exc
            if done.returncode != 0:
                err = done.stderr.decode(errors="replace")[-200:]
                raise ApplyError(f"service {name}: reload command failed: {err}")
            return
        try:
            os.kill(int(rec["pid"]), signal_number(how.get("signal") or "SIGHUP"))
        except ProcessLookupError as exc:
            raise ApplyError(f"service {name}: exited before its reload") from exc

    def native_health(self, name: str) -> str | None:
        del name
        return None

    def run_check(self, name: str, command: str) -> bool:
        rec = self._record(name)
        if rec is None:
            return False
        try:
            done = subprocess.run(["/bin/sh", "-c", command], cwd=rec["cwd"], capture_output=True, timeout=10)
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0

    def revive(self, name: str) -> int | None:
        rec = self._record(name)
        if rec is None:
            raise ApplyError(f"service {name}: no record to restart from")
        if self._alive(rec):
            return int(rec["pid"])
        return self._spawn(rec)

    def _spawn(self, rec: dict[str, Any]) -> int:
        name = rec["service"]
        d = self._dir(name)
        data = d / "data"
        data.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        # Services written in Python find the agent's interpreter first (a venv, say).
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
        env.update(rec["env"])
        env.update(
            RECONCILER_NODE=self.node, RECONCILER_SERVICE=name,
            RECONCILER_COMMIT=rec["commit"], RECONCILER_DATA_DIR=str(data),
        )
        argv = list(rec["command"])
        if "/" not in argv[0]:
            found = shutil.which(argv[0], path=env["PATH"])
            if found is None:
                raise ApplyError(f"service {name}: command {argv[0]!r} not found on PATH")
            argv[0] = found
        with open(d / "service.log", "ab") as log:
            log.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} start {' '.join(argv)}\n".encode())
            log.flush()
            try:
                proc = subprocess.Popen(
                    argv, cwd=rec["cwd"], env=env, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                )
            except OSError as exc:
                raise ApplyError(f"service {name}: cannot start {argv[0]}: {exc.strerror}") from exc
        start_time = None
        for _ in range(100):  # /proc entry appears with the fork; the loop is for safety
            start_time = _proc_start_time(proc.pid)
            if start_time is not None or proc.poll() is not None:
                break
            time.sleep(0.01)
        rec = {**rec, "pid": proc.pid, "start_time": start_time, "started": time.time()}
        write_record(d, rec)
        return proc.pid

    def stop(self, name: str) -> None:
        rec = self._record(name)
        if not self._alive(rec):
            return
        assert rec is not None
        pid = int(rec["pid"])
        for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if _proc_start_time(pid) != rec["start_time"]:
                    return
                time.sleep(0.05)
        raise ApplyError(f"service {name}: pid {pid} did not stop")

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

    def last_output(self, name: str, lines: int = 5) -> str:
        try:
            text = (self._dir(name) / "service.log").read_bytes()[-4000:].decode(errors="replace")
        except FileNotFoundError:
            return ""
        since_start = text.rsplit("\n--- ", 1)[-1].split("\n", 1)[-1]  # this start's output only
        return " | ".join(t.strip() for t in since_start.splitlines()[-lines:] if t.strip())
