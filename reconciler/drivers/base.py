"""The interface every driver offers to observe and apply.

Changes take a ``check`` (the health check, raising ``ApplyError``): a driver that cannot make
the new version healthy puts the previous one back before it raises, so a failed change never
leaves a service down that was up.

Whatever a driver starts on the node (a service, a reload command, a drain hook) starts from
``clean_env``, never from the agent's own environment: the agent's venv first on PATH, its
credentials and settings are none of a service's business.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from reconciler.core.model import DesiredService, ObservedService

Check = Callable[[], None]


@dataclass(frozen=True)
class Unrecorded:
    """An instance of this node's found running with no record of it (the state dir was lost):
    the service, the hash of the version and the commit it was started for (from its marker
    or labels; "" when it does not say), and its pid."""

    service: str
    hash: str
    commit: str
    pid: int | None

SERVICE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def clean_env(home: str | None = None, user: str | None = None) -> dict[str, str]:
    """A fixed PATH and locale, and the HOME and name of the user it runs as (the agent's own
    unless given); what service.yaml declares goes on top."""
    if home is None or user is None:
        try:
            me = pwd.getpwuid(os.getuid())
            home, user = home or me.pw_dir, user or me.pw_name
        except KeyError:  # a uid with no name (a container's): still a usable environment
            home, user = home or "/", user or str(os.getuid())
    return {"PATH": SERVICE_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": home, "USER": user,
            "LOGNAME": user}


class Driver(Protocol):
    name: str

    def observe(self) -> list[ObservedService]:
        """Services this driver started on this node (and only those), read back from its records."""
        ...

    def liveness(self) -> list[ObservedService]:
        """What the supervisor reads every few seconds: each service's name, running state, hash,
        commit and drift policy (files and drift need not be read). ``observe`` where that is no
        dearer."""
        ...

    def start(self, svc: DesiredService, commit: str, check: Check) -> int | None:
        """Start a service that is not running; on a failed check, leave it stopped."""
        ...

    def restart(self, svc: DesiredService, commit: str, check: Check) -> int | None:
        """New files for the same instance; on a failed check, the old files and a restart."""
        ...

    def recreate(self, svc: DesiredService, commit: str, check: Check) -> int | None:
        """A new instance from a new spec; on a failed check, the old instance back."""
        ...

    def reload(self, svc: DesiredService, commit: str, check: Check) -> int | None:
        """New files in place, and the running program told to re-read them (signal or command);
        on a failed check, the old files and another reload."""
        ...

    def update(self, svc: DesiredService, commit: str) -> None:
        """New files and record only; the running program is not touched."""
        ...

    def connect(self, svc: DesiredService, commit: str, check: Check | None = None) -> None:
        """Bring the instance's networks to the spec, live; ``check`` after it, the networks it
        had put back when it fails."""
        ...

    def remove(self, name: str) -> None:
        """Stop the service and forget it: the node no longer has it. Data is kept."""
        ...

    def running(self, name: str) -> bool: ...

    def logs(self, name: str, lines: int, follow: bool) -> Iterator[bytes]:
        """The service's own output: its last ``lines`` lines, then (``follow``) what it writes
        next, until the caller stops reading."""
        ...

    def native_health(self, name: str) -> str | None:
        """The runtime's own verdict ("healthy", "unhealthy", "starting"), None if it has none."""
        ...

    def run_check(self, name: str, command: str) -> bool:
        """Run a shell command where the service runs; True if it exits 0."""
        ...

    def revive(self, name: str) -> int | None:
        """Start a service again exactly as last started (the supervisor's restart)."""
        ...

    def last_output(self, name: str, lines: int = 5) -> str:
        """The tail of the service's log, for error messages."""
        ...
