"""Drivers -> ``Observed``: what runs on this node, read back from each driver's own records."""

from __future__ import annotations

from collections.abc import Mapping

from reconciler.core.model import Observed
from reconciler.drivers import Driver


def observe(node: str, drivers: Mapping[str, Driver]) -> Observed:
    services = []
    for name in sorted(drivers):
        services.extend(drivers[name].observe())
    return Observed(node=node, services=tuple(sorted(services, key=lambda s: (s.name, s.driver))))
