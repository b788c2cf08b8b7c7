"""A container's networks on the Docker engine: the bridges a node's services share (made on
first use, labelled as this node's, removed when nothing uses them), joined and left live, and
put back as they were when the service fails its check on the new ones.

A connect the engine refuses (no free address on the network) still leaves the network in the
container's settings, with no address: the agent's record says it is not on it, and the next
start of the container (a plain ``docker restart``, the engine's restart policy) would join it,
or fail for want of an address. ``join`` takes it off again and looks (an inspect) before it
says the connect failed. The engine lets a running container leave only a network it has an
endpoint on, so when the plain disconnect is refused the container is stopped, taken off and
started again: a restart now, said in the error, not a join behind the agent's back later. It
is never started while the engine still lists the network (that start is the join): then it is
left stopped, a failure the agent reports, which a fresh start repairs. A container that
lists a network with no endpoint (a run killed before it took it off) leaves it first, before
anything is joined: a connect over the leftover may be refused though the address is free."""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container

from reconciler.core import faults
from reconciler.core.errors import ApplyError
from reconciler.core.model import DesiredService, Runtime
from reconciler.drivers.dockerengine import PREFIX, STOP_TIMEOUT


def aliases(rt: Runtime, network: str | None) -> tuple[str, ...]:
    return tuple(a for n, a in rt.aliases if n == network)


def attached(c: Container) -> dict[str, tuple[str, ...]]:
    """Network -> the aliases the container was given there (not the ids the engine adds)."""
    nets = c.attrs.get("NetworkSettings", {}).get("Networks", {}) or {}
    short = {c.id[:12], c.id, c.name}
    return {n: tuple(a for a in (e or {}).get("Aliases") or () if a not in short) for n, e in nets.items()}


def stale(c: Container) -> set[str]:
    """The networks a running container lists without being on them (no endpoint): what a
    refused connect left, which its next start would join."""
    nets = c.attrs.get("NetworkSettings", {}).get("Networks", {}) or {}
    running = (c.attrs.get("State") or {}).get("Running", False)
    return {n for n, e in nets.items() if running and not (e or {}).get("EndpointID")}


def join(client: docker.DockerClient, c: Container, net: str, names: tuple[str, ...]) -> None:
    """``c`` onto ``net`` with the aliases ``names``; refused, off it again (see the module's
    docstring), or an ``ApplyError`` that says it is not."""
    try:
        faults.point("connect", f"{c.name} {net}")
        client.networks.get(net).connect(c, aliases=list(names) or None)
    except docker.errors.APIError as exc:
        raise ApplyError(f"{exc.explanation or exc}{leave(client, c, {net}).said}") from exc


def listed(c: Container) -> set[str]:
    """The networks the engine lists for the container, inspected now."""
    c.reload()
    return set(c.attrs.get("NetworkSettings", {}).get("Networks") or {})


def running(c: Container) -> bool:
    """As last inspected."""
    return bool((c.attrs.get("State") or {}).get("Running", False))


@dataclass(frozen=True)
class Left:
    """What the engine says after ``leave``: whether it still lists the network for the
    container, whether ``leave`` stopped it and it does not run again; what was done, in words
    ("" when nothing worth saying)."""

    listed: bool
    stopped: bool
    said: str

    @property
    def ok(self) -> bool:
        return not self.listed and not self.stopped


def leave(client: docker.DockerClient, c: Container, nets: Collection[str]) -> Left:
    """``c`` off ``nets``, which refused connects left listed (see the module's docstring), all
    in one stop: never started onto one of them; what is true after, from an inspect."""
    if not nets:
        return Left(False, False, "")
    for net in sorted(set(nets) & listed(c)):
        with contextlib.suppress(docker.errors.APIError):  # refused: what the engine lists says
            faults.point("disconnect", f"{c.name} {net} (a failed connect)")
            client.networks.get(net).disconnect(c)
    kept = sorted(set(nets) & listed(c))
    if not kept:
        return Left(False, False, "")
    was = running(c)  # with no endpoint there, a running container leaves it only stopped
    on = listed(c) - stale(c) - set(nets)  # what it joined and keeps: what its start joins again
    why = ""
    try:
        faults.point("stop", c.name)
        c.stop(timeout=STOP_TIMEOUT)
    except docker.errors.APIError as exc:
        why = f" ({exc.explanation or exc})"
    for net in kept if not why else ():
        try:
            faults.point("disconnect", f"{c.name} {net} (a failed connect, stopped)")
            client.networks.get(net).disconnect(c, force=True)
        except docker.errors.APIError as exc:
            why = f" ({exc.explanation or exc})"
    names = ", ".join(kept)
    if still := ", ".join(sorted(set(nets) & listed(c))):
        if running(c):  # not even stopped
            return Left(True, False, f"; the engine still lists {still} for {c.name}, which its next start "
                                     f"would join{why}")
        return Left(True, was, f"; {c.name} left stopped: the engine still lists {still} for it, which its "
                               f"start would join{why}")
    if not was:
        return Left(False, False, "")
    why = start(c, on) or ("" if running(c) else f"started, and not running ({c.status})")
    if why:
        return Left(False, True, f"; {c.name} stopped to leave {names}, which the engine kept listed, and {why}")
    return Left(False, False, f"; {c.name} restarted to leave {names}, which the engine kept listed")


def start(c: Container, allowed: Collection[str]) -> str:
    """``c`` started (and inspected), unless the engine lists a network for it beyond
    ``allowed``, which that start would join; "" when started, else why it was not."""
    beyond = sorted(listed(c) - set(allowed))
    if beyond:
        return f"not started: the engine lists {', '.join(beyond)} for it, which its start would join"
    try:
        faults.point("start", c.name)
        c.start()
    except docker.errors.APIError as exc:
        return f"not started: {exc.explanation or exc}"
    c.reload()
    return ""


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
    rt = svc.runtime
    want = {n: aliases(rt, n) for n in rt.networks} or {rt.network_mode or "bridge": ()}
    gone = stale(c)  # a refused connect's leftover, from a run killed before it took it off
    have = {n: a for n, a in attached(c).items() if n not in gone}
    try:
        left = leave(client, c, gone)  # wanted or not: a connect over the leftover may be refused
        if not left.ok:
            raise ApplyError(f"the engine lists {', '.join(sorted(gone))} for {c.name} with no address "
                             f"there (a refused connect's leftover){left.said}")
        for net in sorted(have):
            if net not in want or not set(want[net]) <= set(have[net]):
                faults.point("disconnect", f"{c.name} {net}")
                client.networks.get(net).disconnect(c)
        for net in sorted(want):
            if net not in have or not set(want[net]) <= set(have[net]):
                join(client, c, net, want[net])
    except docker.errors.APIError as exc:
        raise ApplyError(f"node {node}, service {svc.name}: {exc.explanation or exc}") from exc
    except ApplyError as exc:
        raise ApplyError(f"node {node}, service {svc.name}: {exc}") from exc


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
    missed = []
    left = leave(client, c, stale(c))  # wanted back or not: first off (see ``sync``)
    if not left.ok:
        missed.append(left.said.removeprefix("; "))
    gone = stale(c)  # none, unless a leave did not take
    now = {n: a for n, a in attached(c).items() if n not in gone}
    for net in sorted(set(now) - set(before)):
        try:
            faults.point("disconnect", f"{c.name} {net}")
            client.networks.get(net).disconnect(c)
        except docker.errors.APIError as exc:
            missed.append(f"still on {net}: {exc.explanation or exc}")
    for net in sorted(set(before) - set(now)):
        try:
            join(client, c, net, before[net])
        except ApplyError as exc:
            missed.append(f"not back on {net}: {exc}")
    return "; ".join(missed)


def prune(client: docker.DockerClient, node: str) -> None:
    """Networks this node created and nothing uses any more."""
    for net in client.networks.list(filters={"label": f"{PREFIX}owner={node}"}):
        net.reload()
        if not net.attrs.get("Containers"):
            with contextlib.suppress(docker.errors.APIError):
                net.remove()


def revive(client: docker.DockerClient, c: Container, allowed: Collection[str]) -> str:
    """A container that is not running, started again (the supervisor's), first taken off any
    network the engine lists for it beyond ``allowed`` (its record's: a refused connect's
    leftover, from a run killed while it took it off); "" when started, else why it was not."""
    for net in sorted(listed(c) - set(allowed)):
        with contextlib.suppress(docker.errors.APIError):  # ``start`` says what is still listed
            faults.point("disconnect", f"{c.name} {net} (not in its record)")
            client.networks.get(net).disconnect(c, force=True)
    return start(c, allowed)
