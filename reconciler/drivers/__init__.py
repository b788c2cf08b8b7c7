"""Drivers: the only modules that touch a runtime. Each observes and changes one kind."""

from __future__ import annotations

from pathlib import Path

from ..errors import BadInput
from .base import Driver
from .process import ProcessDriver


def make_driver(name: str, state_root: Path, node: str) -> Driver:
    if name == "process":
        return ProcessDriver(state_root / "services", node)
    if name == "docker":
        from .docker import DockerDriver  # the docker SDK is imported only where it is used

        return DockerDriver(state_root / "docker", node)
    raise BadInput(f"driver {name!r} is not available in this version (known: process, docker)")


def drivers_in_use(state_root: Path) -> set[str]:
    """Drivers that hold records of services on this node (so their services can be seen and stopped)."""
    used = {"process"}
    docker_dir = state_root / "docker"
    if docker_dir.is_dir() and any(docker_dir.iterdir()):
        used.add("docker")
    return used


__all__ = ["Driver", "ProcessDriver", "drivers_in_use", "make_driver"]
