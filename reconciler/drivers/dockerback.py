"""The put back of a change made in place to a running container: the docker driver's
``restart`` (new files, a restart), ``reload`` (new files, a signal) and ``connect`` (networks
joined and left), each of which may also move the container between networks.

Whatever fails on the way (a connect the engine refuses, the check) ends in the same put back:
the live files, the networks and the record as they were, then the container brought back
onto them (restarted or reloaded onto the old files; started, when a refused connect's leave
left it stopped), never started onto a network it must not join (see ``dockernet``). The error
says what is true after, from an inspect: running or not, on which networks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container

from reconciler.core.errors import ReconcilerError
from reconciler.core.model import FileSpec
from reconciler.drivers import dockernet
from reconciler.drivers.files import read_dir, read_record, sync_dir, write_record


@dataclass(frozen=True)
class Before:
    """What a change in place may have to put back: the service's record and live files (in
    ``dir``), the networks of the version applied."""

    dir: Path
    record: dict[str, Any] | None
    files: tuple[FileSpec, ...]
    networks: dict[str, tuple[str, ...]]


def before(c: Container, dir: Path) -> Before:
    record = read_record(dir)
    c.reload()
    # the networks of the version the record says was applied: not wherever a run killed half
    # way through a move left it (on none, or already on the new ones)
    return Before(dir, record, read_dir(dir / "live"), dockernet.recorded(record, dockernet.attached(c)))


def put_back(client: docker.DockerClient, c: Container, was: Before,
             again: Callable[[Container], object] | None = None, done: str = "") -> str:
    """``was`` back, the running container brought onto it by ``again`` (a restart, a reload:
    ``done``; None: nothing to do), a stopped one started; what was done and what is true, for
    the error."""
    sync_dir(was.dir / "live", was.files)
    missed = dockernet.restore(client, c, was.networks)
    if was.record is not None:
        write_record(was.dir, was.record)
    said = ["previous config restored", f"previous networks NOT restored: {missed}" if missed else
            f"previous networks restored ({', '.join(sorted(was.networks)) or 'none'})"]
    c.reload()
    why = ""
    if not dockernet.running(c):  # a refused connect's leave left it stopped
        why = dockernet.start(c, was.networks)
        said.append(f"container {c.name} {why or 'started again'}")
    elif again is not None:
        try:
            again(c)
            said.append(done)
        except (ReconcilerError, docker.errors.APIError) as exc:
            said.append(f"not brought back onto the old files: {getattr(exc, 'explanation', None) or exc}")
    c.reload()
    if not dockernet.running(c):
        on = ", ".join(sorted(dockernet.listed(c))) or "none"
        said.append(f"{'it' if why else f'container {c.name}'} is NOT running ({c.status}; networks listed: {on})")
    return "; ".join(s for s in said if s)
