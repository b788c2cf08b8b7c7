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
live process) or stops: never a second copy, never an orphan. A node that lost its whole state
dir finds its services the same way (``unrecorded``) and takes them back (``adopt``).

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
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from reconciler.core import faults
from reconciler.core.errors import ApplyError, ReconcilerError
from reconciler.core.model import DesiredService, FileSpec, ObservedService
from reconciler.drivers.base import Check, Unrecorded, clean_env
from reconciler.drivers.files import read_dir, read_record, signal_number, write_record
from reconciler.drivers.proctable import (
    MARKER,
    Proc,
    descends,
    find_marked,
    marker,
    newest,
    start_time_of,
    started_at,
    stop_targets,
    terminate,
    unrecorded_of,
)
from reconciler.drivers.revisions import file_drift, materialise, new_record, prune, sync_live
from reconciler.drivers.runas import Account, account, account_of, as_kwargs, own, scope_words, systemd_scopes
from reconciler.drivers.servicelog import last_output, rotate_logs, tail_file


def check_account(kind: str, name: str) -> str | None:
    """For rendering on the node: why it cannot run a process as this ``user`` or ``group``."""
    try:
        account(name if kind == "user" else "", name if kind == "group" else "")
    except LookupError as exc:
        return str(exc)
    return None


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

    def housekeep(self) -> None:
        rotate_logs(self.root)  # the services' own logs must not fill the disk

    def _alive(self, rec: dict[str, Any] | None) -> bool:
        # No recorded start time means it died before it could be seen: never "alive".
        return bool(rec and rec.get("pid") and rec.get("start_time") is not None
                    and start_time_of(rec["pid"]) == rec["start_time"])

    # finding processes -----------------------------------------------------------------
    def _marker(self, name: str, hash_: str) -> str:
        return marker(self.root, self.node, name, hash_)

    def _marked(self) -> dict[str, list[tuple[Proc, str]]]:
        return find_marked(self.root, self.node)

    def _sweep(self, name: str, marked: list[tuple[Proc, str]] | None = None) -> dict[str, Any] | None:
        """The service's processes that its record does not name: a run was killed between the
        spawn and the record. One started for the record's hash, when the record names no live
        process, is adopted (its pid goes into the record); every other one is stopped. Returns
        the record as it is now."""
        rec = self._record(name)
        procs = self._marked().get(name, []) if marked is None else marked
        owner = int(rec["pid"]) if rec is not None and self._alive(rec) else None
        strays = [(p, h) for p, h in procs if owner is None or not descends(p, owner)]
        if not strays:
            return rec
        if rec is not None and owner is None:
            same = sorted((p for p, h in strays if p.leader and h == rec.get("hash")),
                          key=lambda p: int(p.start_time))
            if same:
                adopted = same[-1]  # the newest: the spawn the record was written for
                rec = {**rec, "state": "running", "pid": adopted.pid, "start_time": adopted.start_time,
                       "started": started_at(adopted.start_time)}
                write_record(self._dir(name), rec)
                strays = [(p, h) for p, h in strays if not descends(p, adopted.pid)]
        terminate(name, stop_targets(p for p, _ in strays))
        return rec

    # adoption: the state dir was lost, the processes run on ------------------------------
    def unrecorded(self) -> list[Unrecorded]:
        return unrecorded_of(self._marked(), lambda name: self._record(name) is not None)

    def adopt(self, svc: DesiredService, commit: str) -> int | None:
        """The process found running ``svc``'s version recorded as the service's: its files and
        record written, any other copy stopped (the sweep); the process itself untouched."""
        if (found := newest(self._marked().get(svc.name, []), svc.hash)) is None:
            raise ApplyError(f"service {svc.name}: no process of version {svc.hash[:12]} runs to adopt")
        p = found[0]
        rec = {**new_record(svc, commit, self.materialise(svc), self._live(svc.name)), "state": "running",
               "pid": p.pid, "start_time": p.start_time, "started": started_at(p.start_time)}
        self._sync(svc.name, svc.files, rec)
        write_record(self._dir(svc.name), rec)
        self._sweep(svc.name)
        return p.pid

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
        return materialise(self._dir(svc.name) / "rev", svc)

    def _live(self, name: str) -> Path:
        return self._dir(name) / "live"

    def _sync(self, name: str, files: Iterable[FileSpec], rec: dict[str, Any]) -> None:
        sync_live(self._live(name), files, rec)

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
        new = new_record(svc, commit, rev, self._live(svc.name))
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
        prune(self._dir(svc.name) / "rev", keep=svc.hash)
        return pid

    def update(self, svc: DesiredService, commit: str) -> None:
        """New files and record; the process is not touched."""
        rec = self._record(svc.name) or {}
        rev = self.materialise(svc)
        new = new_record(svc, commit, rev, self._live(svc.name))
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
        acct = account_of(rec)
        env = {k: v for k, v in self._env(rec, acct).items() if k != MARKER}
        try:
            return subprocess.run(["/bin/sh", "-c", command], cwd=rec["cwd"], env={**env, **(extra or {})},
                                  capture_output=True, timeout=timeout, **as_kwargs(acct))
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
            acct = account_of(rec)
        except LookupError as exc:  # it existed at render time; gone since
            raise ApplyError(f"service {name}: {exc}") from exc
        data = d / "data"
        data.mkdir(mode=0o700, parents=True, exist_ok=True)
        if acct.switched:
            own(data, acct)
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
                scoped = scope_words(name, self.node, acct) if self.scopes else None
                wrapped, as_ = (scoped + argv, {}) if scoped is not None else (argv, as_kwargs(acct))
                proc = subprocess.Popen(
                    wrapped, cwd=rec["cwd"], env=env, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True, **as_,
                )
            except OSError as exc:
                raise ApplyError(f"service {name}: cannot start {argv[0]}: {exc.strerror}") from exc
        start_time = None
        for _ in range(100):  # /proc entry appears with the fork; the loop is for safety
            start_time = start_time_of(proc.pid)
            if start_time is not None or proc.poll() is not None:
                break
            time.sleep(0.01)
        rec = {**rec, "state": "running", "pid": proc.pid, "start_time": start_time, "started": time.time()}
        write_record(d, rec)
        return proc.pid

    def stop(self, name: str) -> None:
        """Stop the service's process group, and every other process carrying its marker."""
        rec = self._record(name)
        recorded = (int(rec["pid"]), str(rec["start_time"])) if rec is not None and self._alive(rec) else None
        procs = [p for p, _ in self._marked().get(name, [])]
        terminate(name, stop_targets(procs, recorded))

    def remove(self, name: str) -> None:
        self.stop(name)
        d = self._dir(name)
        with contextlib.suppress(FileNotFoundError):
            (d / "record.json").unlink()
        shutil.rmtree(d / "rev", ignore_errors=True)
        shutil.rmtree(d / "live", ignore_errors=True)

    def logs(self, name: str, lines: int, follow: bool) -> Iterator[bytes]:
        return tail_file(self._dir(name) / "service.log", lines, follow)

    def last_output(self, name: str, lines: int = 5) -> str:
        return last_output(self._dir(name) / "service.log", lines)
