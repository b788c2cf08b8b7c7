"""Drivers: the only modules that touch a runtime. Each observes and changes one kind."""

from __future__ import annotations

from pathlib import Path

from ..errors import BadInput
from .base import Driver
from .process import ProcessDriver


def make_driver(name: str, state_root: Path, node: str) -> Driver:
    if name == "process":
        return ProcessDriver(state_root / "services", node)
    raise BadInput(f"driver {name!r} is not available in this version (known: process)")


__all__ = ["Driver", "ProcessDriver", "make_driver"]
