"""A service's runtime as one node runs it: its runtime strings (command, env, health target,
container settings, networks, drain hooks) rendered and checked, with its health check, reload
and escalation ceiling. Runtime strings may not use secrets (``render_service`` refuses them):
they reach process tables, notes and logs.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from reconciler.core.errors import RenderError
from reconciler.core.model import MIN_HEALTHY, ActionKind, Health, Reload, Runtime
from reconciler.drivers.kinds import find
from reconciler.repo.definitions import DeploymentRepo, ServiceDef

PORT = re.compile(r"((\d{1,3}\.){3}\d{1,3}:)?\d{1,5}:\d{1,5}(/(tcp|udp))?")
HOSTPORT = re.compile(r"[^:\s]+:\d{1,5}")
VOLUME = re.compile(r"[^:]+:/[^:]*(:(ro|rw))?")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class Run:
    """How a service runs on a node: its runtime strings rendered and checked. ``said``: each
    string as rendered; ``templated``: whether any of them was a template (else the same for
    every node with the same driver and plane, see ``node._Compiled``)."""

    runtime: Runtime
    health: Health
    reload: Reload
    ceiling: ActionKind
    drain: str
    undrain: str
    said: tuple[str, ...]
    templated: bool


def _http_url(text: str) -> bool:
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 (raises for a port that is not a number or out of range)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and not any(c.isspace() for c in text)


def render_runtime(repo: DeploymentRepo, node: str, svc: ServiceDef, driver: str, attached: bool,
                   timeout_default: Any, inline: Callable[[str, str], str]) -> Run:
    """The service's ``Run`` on ``node``; ``inline`` renders one runtime string (and refuses a
    secret in it), naming the service.yaml key it is under."""
    said: list[str] = []
    templated = False

    def say(text: str, key: str) -> str:
        nonlocal templated
        templated = templated or "{" in text
        out = inline(text, key)
        said.append(out)
        return out

    command = tuple(say(arg, "command") for arg in svc.command)
    env_vars = tuple(sorted((k, say(v, "env")) for k, v in svc.env.items()))
    health = Health()
    timeout = float(svc.health.get("timeout", timeout_default))
    min_healthy = float(svc.health.get("min_healthy", MIN_HEALTHY))
    for kind in ("http", "tcp", "command"):
        if kind in svc.health:
            health = Health(kind, say(str(svc.health[kind]), "health"), timeout, min_healthy)
    if health.kind == "tcp" and not HOSTPORT.fullmatch(health.target):
        raise RenderError(f"node {node}: health: tcp {health.target!r} is not host:port", file=svc.file,
                          line=svc.lines.get("health"))
    if health.kind == "http" and not _http_url(health.target.strip()):  # urlopen strips it too
        # Else every check fails as "unhealthy" and each apply rolls back, never saying why.
        raise RenderError(f"node {node}: health: http {health.target!r} is not an http:// or https:// URL "
                          "with a host", file=svc.file, line=svc.lines.get("health"))
    if health.kind == "running":
        health = Health("running", "", timeout, min_healthy)
    c = svc.container

    def strings(key: str, pattern: re.Pattern[str] | None = None, form: str = "") -> tuple[str, ...]:
        out = tuple(say(str(v), "runtime") for v in c.get(key, ()))
        for value in out:
            if pattern is not None and not pattern.fullmatch(value):
                raise RenderError(f"node {node}: {key}: {value!r} is not {form}", file=svc.file,
                                  line=svc.lines.get("runtime"))
        return out

    signal_name = svc.reload.get("signal", "SIGHUP")
    if not hasattr(signal, signal_name if signal_name.startswith("SIG") else f"SIG{signal_name}"):
        raise RenderError(f"node {node}: reload: unknown signal {signal_name!r}", file=svc.file,
                          line=svc.lines.get("runtime"))
    networks, aliases = _networks(repo, node, svc, say, attached)
    runtime = Runtime(
        driver, command, env_vars,
        image=say(str(c.get("image", "")), "runtime"),
        ports=strings("ports", PORT, "[host_ip:]host_port:container_port[/tcp|udp]"),
        volumes=strings("volumes", VOLUME, "source:/target[:ro|rw]"),
        networks=networks, aliases=aliases,
        network_mode=str(c.get("network_mode", "")),
        restart=str(c.get("restart", "")), user=say(str(c.get("user", "")), "runtime"),
        group=say(str(c.get("group", "")), "runtime"),
        healthcheck=tuple(sorted((k, say(str(v), "runtime")) for k, v in c.get("healthcheck", {}).items())),
        config_dir=str(c.get("config_dir", dk.default_config_dir(svc.name) if (dk := find(driver)) else "")),
    )
    return Run(
        runtime, health,
        reload=Reload(signal=svc.reload.get("signal", "SIGHUP"), command=svc.reload.get("command", "")),
        ceiling=ActionKind(svc.escalate_to),
        drain=say(svc.drain, "runtime") if svc.drain else "",
        undrain=say(svc.undrain, "runtime") if svc.undrain else "",
        said=tuple(said), templated=templated,
    )


def _networks(repo: DeploymentRepo, node: str, svc: ServiceDef,
              inline: Callable[[str, str], str], attached: bool) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """The networks (and the names it answers to on each) the service's container joins on this
    node: a VIP network only on a node of the live plane (see ``repo.planes``)."""
    names: list[str] = []
    aliases: list[tuple[str, str]] = []
    for entry in svc.container.get("networks", ()):
        spec = entry if isinstance(entry, Mapping) else {"name": entry}
        name = inline(str(spec["name"]), "runtime")
        for value, form in ((name, "a network name"), *((inline(str(a), "runtime"), "an alias")
                                                          for a in spec.get("aliases", ()))):
            if not NAME.fullmatch(value):
                raise RenderError(f"node {node}: networks: {value!r} is not {form}", file=svc.file,
                                  line=svc.lines.get("runtime"))
        if name in repo.vip_networks and not attached:
            continue  # the same VIP addresses in its config, not the network that carries them
        if name in names:
            raise RenderError(f"node {node}: networks: {name!r} named twice", file=svc.file,
                              line=svc.lines.get("runtime"))
        names.append(name)
        aliases += [(name, inline(str(a), "runtime")) for a in spec.get("aliases", ())]
    return tuple(sorted(names)), tuple(sorted(aliases))
