"""The interface every driver offers to observe and apply."""

from __future__ import annotations

from typing import Protocol

from ..model import DesiredService, ObservedService


class Driver(Protocol):
    name: str

    def observe(self) -> list[ObservedService]:
        """Services this driver started on this node (and only those), read back from its records."""
        ...

    def start(self, svc: DesiredService, commit: str) -> int | None:
        """Materialise the service's files and start it; return its pid if it has one."""
        ...

    def stop(self, name: str) -> None:
        """Stop the service; keep what it needs to come back (files, data)."""
        ...

    def remove(self, name: str) -> None:
        """Stop the service and forget it: the node no longer has it. Data is kept."""
        ...

    def running(self, name: str) -> bool: ...

    def revive(self, name: str) -> int | None:
        """Start a service again exactly as last started (the supervisor's restart)."""
        ...

    def last_output(self, name: str, lines: int = 5) -> str:
        """The tail of the service's log, for error messages."""
        ...
