"""A container's networks on the Docker engine: the bridges a node's services share (made on
first use, labelled as this node's, removed when nothing uses them), joined and left live, and
put back as they were when the service fails its check on the new ones."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container

from reconciler.core import faults
from reconciler.core.errors import ApplyError
from reconciler.core.model import DesiredService, Runtime
from reconciler.drivers.dockerengine import PREFIX


def aliases(rt: Runtime, network: str | None) -> tuple[str, ...]:
    return tuple(a for n, a in rt.aliases if n == network)


def attached(c: Container) -> dict[str, tuple[str, ...]]:
    """Network -> the aliases the container was given there (not the ids the engine adds)."""
    nets = c.attrs.get("NetworkSettings", {}).get("Networks", {}) or {}
    short = {c.id[:12], c.id, c.name}
    return {n: tuple(a for a in (e or {}).get("Aliases") or () if a not in short) for n, e in nets.items()}


def ensure(client: docker.DockerClient, node: str, names: tuple[str, ...]) -> None:
    """Each of ``names`` on the engine: made, as this node's, when it is not."""
    for net in names:
        if not client.networks.list(names=[net]):
            client.networks.create(net, driver="bridge", labels={PREFIX + "owner": node})


def sync(client: docker.DockerClient, node: str, c: Container, svc: DesiredService) -> None:
    """Leave first, then join: a container moving its VIP name from one network to another
    is never on both."""
    if svc.runtime.network_mode == "host":
        return
    ensure(client, node, svc.runtime.networks)
    c.reload()
    have = attached(c)
    rt = svc.runtime
    want = {n: aliases(rt, n) for n in rt.networks} or {rt.network_mode or "bridge": ()}
    try:
        for net in sorted(have):
            if net not in want or not set(want[net]) <= set(have[net]):
                faults.point("disconnect", f"{c.name} {net}")
                client.networks.get(net).disconnect(c)
        for net in sorted(want):
            if net not in have or not set(want[net]) <= set(have[net]):
                faults.point("connect", f"{c.name} {net}")
                client.networks.get(net).connect(c, aliases=list(want[net]) or None)
    except docker.errors.APIError as exc:
        raise ApplyError(f"node {node}, service {svc.name}: {exc.explanation or exc}") from exc


def recorded(rec: Mapping[str, Any] | None, now: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """The networks (and aliases) of the version ``rec`` says was applied: where a failed move
    puts the container back, not wherever a run killed half way through a move left it (on
    none, or already on the new ones). ``now`` when there is no record, or it uses the host's."""
    if rec is None or rec.get("network_mode") == "host":
        return now
    names = list(rec.get("networks") or ()) or [rec.get("network_mode") or "bridge"]
    aliases = rec.get("aliases") or {}
    return {n: tuple(aliases.get(n, now.get(n, ()))) for n in names}


def restore(client: docker.DockerClient, c: Container, before: dict[str, tuple[str, ...]]) -> str:
    """The networks (and aliases) it had; returns what could not be put back ("": all was)."""
    c.reload()
    now = attached(c)
    missed = []
    for net in sorted(set(now) - set(before)):
        try:
            faults.point("disconnect", f"{c.name} {net}")
            client.networks.get(net).disconnect(c)
        except docker.errors.APIError as exc:
            missed.append(f"still on {net}: {exc.explanation or exc}")
    for net in sorted(set(before) - set(now)):
        try:
            faults.point("connect", f"{c.name} {net}")
            client.networks.get(net).connect(c, aliases=list(before[net]) or None)
        except docker.errors.APIError as exc:
            missed.append(f"not back on {net}: {exc.explanation or exc}")
    return "; ".join(missed)


def prune(client: docker.DockerClient, node: str) -> None:
    """Networks this node created and nothing uses any more."""
    for net in client.networks.list(filters={"label": f"{PREFIX}owner={node}"}):
        net.reload()
        if not net.attrs.get("Containers"):
            with contextlib.suppress(docker.errors.APIError):
                net.remove()
