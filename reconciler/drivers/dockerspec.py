"""What a docker service's runtime means to the engine: the arguments a container is created
with (image, command, ports, volumes, restart policy, healthcheck, networks) and the labels that
mark it as this node's and say which version of the service it runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import docker
from docker.types import Mount

from reconciler.core.model import DesiredService
from reconciler.drivers import dockernet
from reconciler.drivers.dockerengine import PREFIX


def ports(specs: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for spec in specs:
        spec, _, proto = spec.partition("/")
        parts = spec.split(":")
        target = f"{parts[-1]}/{proto or 'tcp'}"
        out[target] = (parts[0], int(parts[1])) if len(parts) == 3 else int(parts[0])
    return out


def volumes(specs: tuple[str, ...]) -> dict[str, dict[str, str]]:
    out = {}
    for spec in specs:
        source, target, *mode = spec.split(":")
        out[source] = {"bind": target, "mode": mode[0] if mode else "rw"}
    return out


def restart_policy(policy: str) -> dict[str, Any] | None:
    if not policy:
        return None
    name, _, count = policy.partition(":")
    return {"Name": name, "MaximumRetryCount": int(count or 0)} if name == "on-failure" else {"Name": name}


def healthcheck(items: tuple[tuple[str, str], ...]) -> dict[str, Any] | None:
    hc = dict(items)
    if not hc:
        return None
    out: dict[str, Any] = {"test": ["CMD-SHELL", hc["test"]]}
    for key in ("interval", "timeout", "start_period"):
        if key in hc:
            out[key] = int(float(hc[key]) * 1e9)
    if "retries" in hc:
        out["retries"] = int(hc["retries"])
    return out


def create_args(client: docker.DockerClient, svc: DesiredService, node: str, commit: str, live: Path,
                name: str) -> dict[str, Any]:
    """``containers.create``'s arguments for ``svc``: on its first network only (the engine
    creates on one; the others are joined after), its live files read-only at its config dir."""
    rt = svc.runtime
    mounts = volumes(rt.volumes)
    mounts[str(live)] = {"bind": rt.config_dir, "mode": "ro"}
    labels = {
        PREFIX + "node": node, PREFIX + "service": svc.name, PREFIX + "commit": commit,
        PREFIX + "hash": svc.hash, PREFIX + "spec-hash": svc.spec_hash,
        PREFIX + "config-hash": svc.config_hash, PREFIX + "fingerprint": json.dumps(svc.fingerprint()),
    }
    first = rt.networks[0] if rt.networks else None
    endpoints = {first: client.api.create_endpoint_config(aliases=list(dockernet.aliases(rt, first)))} \
        if first and dockernet.aliases(rt, first) else None
    env = dict(rt.env)
    data = f"/var/lib/{svc.name}"
    # The service's own volume there (kolla's ``rabbitmq:/var/lib/rabbitmq/``) is its data dir:
    # a second mount at the same point is refused by the engine.
    targets = {m["bind"].rstrip("/") or "/" for m in mounts.values()}
    env.update(RECONCILER_NODE=node, RECONCILER_SERVICE=svc.name, RECONCILER_COMMIT=commit,
               RECONCILER_DATA_DIR=data)  # a named volume: data outlives containers
    return dict(
        image=rt.image, command=list(rt.command) or None, name=name, labels=labels,
        environment=env, ports=ports(rt.ports), volumes=mounts, user=rt.user or None,
        restart_policy=restart_policy(rt.restart), healthcheck=healthcheck(rt.healthcheck),
        network=first, networking_config=endpoints, network_mode=rt.network_mode or None,
        working_dir=rt.config_dir, detach=True, init=True,  # an init as PID 1: signals and reaping
        mounts=[] if data in targets else [Mount(data, f"rc-{node}-{svc.name}-data", type="volume")],
    )
