"""Drivers: the only modules that touch a runtime. Each observes and changes one kind."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from reconciler.core.errors import BadInput
from reconciler.drivers.base import Driver
from reconciler.drivers.hostaccess import HostAccess
from reconciler.drivers.process import ProcessDriver
from reconciler.drivers.registry import RegistryLogin

KNOWN = ("process", "docker", "systemd", "host")


def make_driver(name: str, state_root: Path, node: str, host: HostAccess | None = None,
                logins: Iterable[RegistryLogin] = ()) -> Driver:
    """``logins``: the docker driver's registry logins (for pulls)."""
    host = host or HostAccess()
    if name == "process":
        return ProcessDriver(state_root / "services", node)
    if name == "docker":
        from reconciler.drivers.docker import DockerDriver  # the docker SDK is imported only where it is used

        return DockerDriver(state_root / "docker", node, logins=logins)
    if name == "systemd":
        from reconciler.drivers.systemd import SystemdDriver

        return SystemdDriver(state_root / "systemd", node, host)
    if name == "host":
        from reconciler.drivers.host import HostDriver

        return HostDriver(state_root / "host", node, host)
    raise BadInput(f"driver {name!r} is not known (known: {', '.join(KNOWN)})")


def drivers_in_use(state_root: Path) -> set[str]:
    """Drivers that hold records of services on this node (so their services can be seen and stopped)."""
    used = {"process"}
    for name, sub in (("docker", "docker"), ("systemd", "systemd"), ("host", "host")):
        d = state_root / sub
        if d.is_dir() and any(d.iterdir()):
            used.add(name)
    return used


__all__ = ["KNOWN", "Driver", "HostAccess", "ProcessDriver", "RegistryLogin", "drivers_in_use", "make_driver"]
