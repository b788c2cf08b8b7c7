"""Host domains: files on the node itself (authorized keys, registries config, sysctl, kernel
arguments) as a ``host`` service. Their actions act on the host: reload or restart a named
systemd unit, run a command (``sysctl --system``), or drain and reboot.

Which unit a change reloads is in the rule that matched it (``unit:``); a change no rule
explains needs a reboot. A reboot is recorded as pending for its commit before the reboot
command runs; the agent that starts after it sees a new boot id, runs the undrain hook and
reports the commit (``Agent.resume_after_reboot``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from reconciler.core.atomic import atomic_write
from reconciler.core.compare import action_for, domains
from reconciler.core.errors import ApplyError, BadInput, ReconcilerError
from reconciler.core.model import ActionKind, DesiredService, FileSpec, ObservedService, Rule
from reconciler.drivers.base import Check
from reconciler.drivers.files import read_record, write_record
from reconciler.drivers.hostaccess import HostAccess
from reconciler.drivers.revisions import file_drift

PENDING = "reboot-pending.json"


class HostDriver:
    name = "host"

    def __init__(self, root: Path, node: str, host: HostAccess) -> None:
        self.root = root
        self.node = node
        self.host = host

    def _dir(self, service: str) -> Path:
        return self.root / service

    def _record(self, service: str) -> dict[str, Any] | None:
        return read_record(self._dir(service))

    def _write_record(self, svc: DesiredService, commit: str) -> None:
        write_record(self._dir(svc.name), {**_applied(svc), "commit": commit})

    def current(self, paths: list[str]) -> tuple[FileSpec, ...]:
        """The host files as they are now."""
        out = []
        for p in sorted(paths):
            target = self.host.path(p)
            if target.is_file():
                out.append(FileSpec(p, target.stat().st_mode & 0o7777, target.read_bytes()))
        return tuple(out)

    def liveness(self) -> list[ObservedService]:
        return self.observe(files=False)  # the host is up: its records say the rest

    def observe(self, *, files: bool = True) -> list[ObservedService]:
        out: list[ObservedService] = []
        if not self.root.is_dir():
            return out
        for d in sorted(self.root.iterdir()):
            if not d.is_dir():
                continue  # reboot-pending.json lives beside the services
            rec = self._record(d.name)
            if rec is None:
                continue
            now = self.current(rec["paths"]) if files else ()
            out.append(ObservedService(
                name=d.name, driver=self.name, running=True, hash=rec["hash"], commit=rec["commit"],
                fingerprint=tuple(sorted(rec["fingerprint"].items())), files=now,
                # A hand edit of a host file is drift like one of a service's live files. A record
                # written before drift was checked (no ``file_keys``) cannot tell a secret file's
                # keyed hash from a hand edit: no verdict from it (its put-back would rewrite and
                # restart for nothing); the service's next change writes a record that can.
                drifted=file_drift(rec, now) if files and "file_keys" in rec else "",
                drift=str(rec.get("drift", "correct")),
            ))
        return out

    def running(self, name: str) -> bool:
        return True  # the host is up: we are running on it

    def native_health(self, name: str) -> str | None:
        return None

    def run_check(self, name: str, command: str) -> bool:
        return self.host.sh(command, timeout=30).returncode == 0

    def logs(self, name: str, lines: int, follow: bool) -> Iterator[bytes]:
        raise BadInput(f"{name} is a host domain (files and the units they configure): it has no output of its "
                       "own; read the units' journal")

    def last_output(self, name: str, lines: int = 5) -> str:
        return ""

    # apply -------------------------------------------------------------------------------
    def _write(self, files: tuple[FileSpec, ...], remove: Sequence[str] = ()) -> None:
        for f in files:
            atomic_write(self.host.path(f.path), f.content, f.mode)
        for p in remove:
            self.host.path(p).unlink(missing_ok=True)

    def _operations(self, rules: tuple[Rule, ...], old: tuple[FileSpec, ...], new: tuple[FileSpec, ...],
                    upto: ActionKind) -> list[tuple[str, str]]:
        """The unit reloads/restarts and commands the changed domains' rules ask for, in order,
        each once: ("reload", "ssh"), ("command", "sysctl --system")."""
        ops: list[tuple[str, str]] = []
        for d in domains(old, new):
            for rule in rules:
                kind, by_rule = action_for(d, (rule,), ActionKind.REBOOT)
                if not by_rule:
                    continue
                if rule.unit and kind in (ActionKind.RELOAD, ActionKind.RESTART):
                    verb = "restart" if upto is ActionKind.RESTART and kind is ActionKind.RELOAD else str(kind)
                    ops.append((verb, rule.unit))
                if rule.command:
                    ops.append(("command", rule.command))
                break
        return list(dict.fromkeys(ops))

    def _run(self, ops: list[tuple[str, str]]) -> None:
        for verb, what in ops:
            if verb == "command":
                done = self.host.sh(what)
                if done.returncode != 0:
                    raise ApplyError(f"host: {what!r} failed: {(done.stderr or done.stdout).strip()[-200:]}")
            else:
                self.host.ctl(verb, what)

    def _change(self, svc: DesiredService, commit: str, check: Check, upto: ActionKind) -> int | None:
        rec = self._record(svc.name)
        paths = sorted({f.path for f in svc.files} | set(rec["paths"] if rec else []))
        before = self.current(paths)
        gone = [p for p in (rec["paths"] if rec else []) if p not in {f.path for f in svc.files}]
        ops = self._operations(svc.rules, before, svc.files, upto)
        self._write(svc.files, gone)
        try:
            self._run(ops)
            check()
        except ReconcilerError as exc:
            self._write(before, [f.path for f in svc.files if f.path not in {b.path for b in before}])
            try:
                self._run(ops)
                state = "restored"
            except ReconcilerError:
                state = "restored, but applying it again failed"
            raise ApplyError(f"{exc}; previous host files {state}") from exc
        self._write_record(svc, commit)
        return None

    def start(self, svc: DesiredService, commit: str, check: Check) -> int | None:
        return self._change(svc, commit, check, ActionKind.RELOAD)

    def reload(self, svc: DesiredService, commit: str, check: Check) -> int | None:
        return self._change(svc, commit, check, ActionKind.RELOAD)

    def restart(self, svc: DesiredService, commit: str, check: Check) -> int | None:
        return self._change(svc, commit, check, ActionKind.RESTART)

    def recreate(self, svc: DesiredService, commit: str, check: Check) -> int | None:
        return self._change(svc, commit, check, ActionKind.RESTART)

    def update(self, svc: DesiredService, commit: str) -> None:
        self._write(svc.files)
        self._write_record(svc, commit)

    def connect(self, svc: DesiredService, commit: str, check: Check | None = None) -> None:
        self.update(svc, commit)

    def reboot(self, svc: DesiredService, commit: str) -> None:
        """Write the files, note the reboot as pending for this commit, then reboot."""
        self._write(svc.files)
        pending = {**_applied(svc), "commit": commit, "boot_id": self.host.boot_id(), "undrain": svc.undrain,
                   "time": time.time()}
        # Private like the record: it holds the keys of the secret files' hashes.
        atomic_write(self.root / PENDING, json.dumps(pending, indent=2, sort_keys=True).encode(), 0o600)
        done = self.host.sh(self.host.reboot_command, timeout=120)
        if done.returncode != 0:
            (self.root / PENDING).unlink(missing_ok=True)
            raise ApplyError(f"host: reboot command failed: {(done.stderr or done.stdout).strip()[-200:]}")

    def pending_reboot(self) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads((self.root / PENDING).read_text())
            return data
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def boot_id(self) -> str:
        """This boot's id: another than the pending reboot's once the node rebooted."""
        return self.host.boot_id()

    def finish_reboot(self, pending: dict[str, Any]) -> None:
        kept = ("service", "hash", "fingerprint", "commit", "paths", "drift", "file_keys")
        # A pending reboot written before drift was recorded has neither drift nor file_keys.
        rec: dict[str, Any] = {k: pending[k] for k in kept if k in pending}
        write_record(self._dir(pending["service"]), rec)
        (self.root / PENDING).unlink(missing_ok=True)

    def remove(self, name: str) -> None:
        """Only the files this service wrote; the units they configure stay as they are."""
        rec = self._record(name)
        if rec is not None:
            self._write((), rec["paths"])
        (self._dir(name) / "record.json").unlink(missing_ok=True)

    def revive(self, name: str) -> int | None:
        return None


def _applied(svc: DesiredService) -> dict[str, Any]:
    """What a record says of the version written: its files' hashes (and the keys of the secret
    ones', to check the files against them: drift), the policy for a hand edit."""
    return {"service": svc.name, "hash": svc.hash, "fingerprint": svc.fingerprint(),
            "paths": sorted(f.path for f in svc.files), "drift": svc.drift,
            "file_keys": {f.path: f.key.hex() for f in svc.files if f.key}}
