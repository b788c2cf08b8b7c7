"""Drivers: the only modules that touch a runtime. Each observes and changes one kind.

This module is the package's face: it makes a node's drivers through the registry of kinds
(``reconciler.drivers.kinds``: no driver is named here) and re-exports the names the rest of
the agent uses (``Driver``, ``HostAccess``, ``RegistryLogin``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from reconciler.drivers.base import Driver
from reconciler.drivers.hostaccess import HostAccess
from reconciler.drivers.kinds import DriverContext, kind_of, names
from reconciler.drivers.registry import RegistryLogin


def make_driver(name: str, state_root: Path, node: str, host: HostAccess | None = None,
                logins: Iterable[RegistryLogin] = ()) -> Driver:
    """``logins``: the registry logins of the kinds that pull images."""
    kind = kind_of(name)  # BadInput naming the known kinds
    return kind.make(DriverContext(state_root, node, host or HostAccess(), tuple(logins)), state_root / kind.state_dir)


def drivers_in_use(state_root: Path) -> set[str]:
    """Drivers that hold records of services on this node (so their services can be seen and stopped)."""
    used = set()
    for name in names():
        kind = kind_of(name)
        d = state_root / kind.state_dir
        if kind.always_in_use or (d.is_dir() and any(d.iterdir())):
            used.add(name)
    return used


__all__ = ["Driver", "HostAccess", "RegistryLogin", "drivers_in_use", "make_driver"]
