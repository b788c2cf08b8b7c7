"""A reboot a driver started for a commit, finished once the node is back.

The host driver reboots the node for a change that needs it (``action: reboot``): it records the
boot id and the commit first. On the next pass, the same boot id means the reboot has not
happened yet (the pass waits); another one means the node is back: the undrain hook runs and the
reboot is done. The pass asks here, not the host driver by name.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconciler.drivers import kinds
from reconciler.drivers.hostaccess import HostAccess

UNDRAIN_TIMEOUT = 1800  # seconds an undrain hook may take


@dataclass(frozen=True)
class AfterBoot:
    """A reboot under way (``waiting``: the node has not gone down yet) or just finished."""

    commit: str
    waiting: bool
    service: str = ""
    hash: str = ""
    detail: str = ""  # what the note says of the finished reboot


def after_boot(state_root: Path, node: str, host: HostAccess) -> AfterBoot | None:
    """The reboot this node started, if any (see the module's docstring)."""
    from reconciler.drivers import drivers_in_use, make_driver

    for name in sorted(n for n in drivers_in_use(state_root) if kinds.kind_of(n).after_boot):  # (host)
        driver = kinds.finishes_reboot(name, make_driver(name, state_root, node, host))
        pending = driver.pending_reboot() if driver is not None else None
        if driver is not None and pending is not None:
            return _finish(driver, pending)
    return None


def _finish(driver: kinds.FinishesReboot, pending: dict[str, Any]) -> AfterBoot:
    boot = driver.boot_id()
    if boot == pending["boot_id"]:
        return AfterBoot(str(pending["commit"]), True)
    detail = f"rebooted for {pending['commit'][:12]} (boot id {pending['boot_id'][:8]} -> {boot[:8]})"
    if pending.get("undrain"):
        try:
            done = subprocess.run(["/bin/sh", "-c", pending["undrain"]], capture_output=True, text=True,
                                  timeout=UNDRAIN_TIMEOUT)
            failed = "" if done.returncode == 0 else done.stderr.strip()[-200:] or f"exit {done.returncode}"
        except subprocess.TimeoutExpired:  # noted as failed, never a traceback: the reboot is done either way
            failed = f"timed out after {UNDRAIN_TIMEOUT}s"
        except OSError as exc:
            failed = str(exc)
        detail += "; undrain hook " + (f"failed: {failed}" if failed else "ok")
    driver.finish_reboot(pending)
    return AfterBoot(str(pending["commit"]), False, str(pending["service"]), str(pending["hash"]), detail)
