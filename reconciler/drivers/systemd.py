"""Services as systemd units (``rc-<service>.service``) for host services that should not be
containers: a unit file written by the agent, ``daemon-reload``, and start / restart / reload
/ stop through ``systemctl``. The unit runs in the service's live config dir, like the process
driver's programs; its state is read back from systemd (ActiveState, MainPID).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from reconciler.core.atomic import atomic_write
from reconciler.core.errors import ApplyError, ReconcilerError
from reconciler.core.model import DesiredService, ObservedService
from reconciler.drivers.base import Check
from reconciler.drivers.files import read_dir, read_record, sync_dir, write_record
from reconciler.drivers.hostaccess import HostAccess


def _unit_quote(arg: str) -> str:
    """systemd's own quoting: % and $ are specifiers and variables unless doubled."""
    return shlex.quote(arg.replace("%", "%%").replace("$", "$$"))


class SystemdDriver:
    name = "systemd"

    def __init__(self, root: Path, node: str, host: HostAccess) -> None:
        self.root = root
        self.node = node
        self.host = host

    def unit(self, service: str) -> str:
        return f"rc-{service}.service"

    def _unit_path(self, service: str) -> Path:
        return self.host.path(f"/etc/systemd/system/{self.unit(service)}")

    def _dir(self, service: str) -> Path:
        return self.root / service

    def _live(self, service: str) -> Path:
        return self._dir(service) / "live"

    def _record(self, service: str) -> dict[str, Any] | None:
        return read_record(self._dir(service))

    def _write_record(self, svc: DesiredService, commit: str) -> None:
        rec = {"service": svc.name, "hash": svc.hash, "fingerprint": svc.fingerprint(), "commit": commit,
               "unit": self.unit(svc.name)}
        write_record(self._dir(svc.name), rec)

    def unit_text(self, svc: DesiredService) -> str:
        rt = svc.runtime
        for text in (*rt.command, *(v for _, v in rt.env), svc.reload.command):
            if any(ord(c) < 32 for c in text):
                raise ApplyError(f"service {svc.name}: control characters cannot go into a unit file")
        env = "".join(f"Environment={shlex.quote(f'{k}={v}')}\n" for k, v in rt.env)
        reload = (f"ExecReload=/bin/sh -c {shlex.quote(svc.reload.command)}\n" if svc.reload.command
                  else f"ExecReload=/bin/kill -{svc.reload.signal.removeprefix('SIG')} $MAINPID\n")
        return (
            f"# Written by reconciler for node {self.node}; edits are undone on the next run.\n"
            f"[Unit]\nDescription=reconciler: {svc.name}\n\n"
            f"[Service]\nType=simple\nWorkingDirectory={self._live(svc.name)}\n"
            f"ExecStart={' '.join(_unit_quote(a) for a in rt.command)}\n{reload}{env}"
            f"Environment=RECONCILER_NODE={self.node} RECONCILER_SERVICE={svc.name}\n"
            f"Restart={rt.restart or 'on-failure'}\n"
            + (f"User={rt.user}\n" if rt.user else "")
            + "\n[Install]\nWantedBy=multi-user.target\n"
        )

    def _show(self, service: str) -> dict[str, str]:
        out = self.host.ctl("show", "-p", "ActiveState", "-p", "MainPID", "-p", "SubState", self.unit(service),
                            check=False)
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    # observe -----------------------------------------------------------------------------
    def liveness(self) -> list[ObservedService]:
        return self.observe(files=False)  # each unit's state asked of systemd, as observe's

    def observe(self, *, files: bool = True) -> list[ObservedService]:
        out: list[ObservedService] = []
        if not self.root.is_dir():
            return out
        for d in sorted(self.root.iterdir()):
            rec = self._record(d.name)
            if rec is None:
                continue
            show = self._show(d.name)
            running = show.get("ActiveState") == "active"
            pid = int(show.get("MainPID", "0") or 0) or None
            out.append(ObservedService(
                name=d.name, driver=self.name, running=running, hash=rec["hash"], commit=rec["commit"], pid=pid,
                detail="" if running else f"unit {show.get('ActiveState', 'unknown')} ({show.get('SubState', '')})",
                fingerprint=tuple(sorted(rec["fingerprint"].items())),
                files=read_dir(self._live(d.name)) if files else (),
            ))
        return out

    def running(self, name: str) -> bool:
        return self._show(name).get("ActiveState") in ("active", "reloading")

    def native_health(self, name: str) -> str | None:
        return "unhealthy" if self._show(name).get("ActiveState") == "failed" else None

    def run_check(self, name: str, command: str) -> bool:
        return self.host.sh(command, cwd=str(self._live(name)), timeout=10).returncode == 0

    def logs(self, name: str, lines: int, follow: bool) -> Iterator[bytes]:
        """journalctl for the unit, where the units run (``exec``: the systemd container's)."""
        argv = [*self.host.exec, "journalctl", "-u", self.unit(name), "-n", str(lines), "--no-pager", "-o",
                "short-iso", *(["-f"] if follow else [])]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert proc.stdout is not None
        try:
            yield from iter(lambda: proc.stdout.readline() if proc.stdout else b"", b"")
        finally:
            proc.kill()
            proc.wait()

    def last_output(self, name: str, lines: int = 5) -> str:
        done = self.host.sh(f"journalctl -u {self.unit(name)} -n {lines} --no-pager -o cat", timeout=10)
        return " | ".join(t.strip() for t in done.stdout.splitlines() if t.strip())

    # apply -------------------------------------------------------------------------------
    def _install(self, svc: DesiredService) -> None:
        atomic_write(self._unit_path(svc.name), self.unit_text(svc).encode())
        self.host.ctl("daemon-reload")

    def _change(self, svc: DesiredService, commit: str, check: Check, verb: str) -> int | None:
        """Write files and unit, then ``verb`` (start, restart, reload); on a failed check put the
        previous files and unit back and ``verb`` again."""
        previous = self._record(svc.name)
        before = read_dir(self._live(svc.name))
        unit_before = self._unit_path(svc.name).read_bytes() if self._unit_path(svc.name).exists() else None
        sync_dir(self._live(svc.name), svc.files)
        self._install(svc)
        try:
            self.host.ctl("enable", self.unit(svc.name))
            self.host.ctl(verb, self.unit(svc.name))
            check()
        except ReconcilerError as exc:
            if previous is None or unit_before is None:
                self.host.ctl("stop", self.unit(svc.name), check=False)
                raise
            sync_dir(self._live(svc.name), before)
            atomic_write(self._unit_path(svc.name), unit_before)
            self.host.ctl("daemon-reload", check=False)
            self.host.ctl("restart" if verb == "start" else verb, self.unit(svc.name), check=False)
            raise ApplyError(f"{exc}; previous version restored") from exc
        self._write_record(svc, commit)
        pid = self._show(svc.name).get("MainPID", "0")
        return int(pid) or None

    def start(self, svc: DesiredService, commit: str, check: Check) -> int | None:
        return self._change(svc, commit, check, "restart")

    def restart(self, svc: DesiredService, commit: str, check: Check) -> int | None:
        return self._change(svc, commit, check, "restart")

    def recreate(self, svc: DesiredService, commit: str, check: Check) -> int | None:
        return self._change(svc, commit, check, "restart")

    def reload(self, svc: DesiredService, commit: str, check: Check) -> int | None:
        if not self.running(svc.name):
            raise ApplyError(f"service {svc.name}: unit not active, nothing to reload")
        return self._change(svc, commit, check, "reload")

    def update(self, svc: DesiredService, commit: str) -> None:
        sync_dir(self._live(svc.name), svc.files)
        self._write_record(svc, commit)

    def connect(self, svc: DesiredService, commit: str, check: Check | None = None) -> None:
        self.update(svc, commit)

    def remove(self, name: str) -> None:
        self.host.ctl("disable", "--now", self.unit(name), check=False)
        self._unit_path(name).unlink(missing_ok=True)
        self.host.ctl("daemon-reload", check=False)
        (self._dir(name) / "record.json").unlink(missing_ok=True)
        shutil.rmtree(self._live(name), ignore_errors=True)

    def revive(self, name: str) -> int | None:
        self.host.ctl("start", self.unit(name))
        return int(self._show(name).get("MainPID", "0")) or None
