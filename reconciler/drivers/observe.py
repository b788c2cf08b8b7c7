"""Drivers -> ``Observed``: what runs on this node, read back from each driver's own records."""

from __future__ import annotations

from collections.abc import Mapping

from reconciler.core.model import Observed
from reconciler.drivers import Driver
from reconciler.drivers.glance import GLANCE
from reconciler.drivers.process import ProcessDriver


def observe(node: str, drivers: Mapping[str, Driver]) -> Observed:
    services = []
    for name in sorted(drivers):
        services.extend(drivers[name].observe())
    return Observed(node=node, services=tuple(sorted(services, key=lambda s: (s.name, s.driver))))


def glance(node: str, drivers: Mapping[str, Driver]) -> Observed:
    """``observe`` for the no-op poll: the process driver's services looked at for what can have
    changed since the last poll (``drivers.glance``), the other drivers' in full."""
    services = []
    for name in sorted(drivers):
        d = drivers[name]
        services.extend(GLANCE.look(d) if isinstance(d, ProcessDriver) else d.observe())
    return Observed(node=node, services=tuple(sorted(services, key=lambda s: (s.name, s.driver))))
