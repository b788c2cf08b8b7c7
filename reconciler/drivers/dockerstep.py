"""An upgrade step's command in a one-off container of the service's new image (kolla's
bootstrap containers): a migration lives in the image, not on the host.

The container gets what the service's own container gets: the new version's rendered files
read-only at its config dir, its data volume (``/var/lib/<service>``), its env, user and network
mode. It is run by the upgrade step's wrapper as ``python -m reconciler.drivers.dockerstep``
(the spec in ``RECONCILER_STEP_SPEC``), so the wrapper's pid and exit-status files keep a killed
agent from running the step twice; this prints the container's output and exits with its status.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.types import Mount

from reconciler.core.model import DesiredService
from reconciler.drivers.dockerengine import PREFIX

ENGINE_ENV = ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH")  # how this node reaches its engine


def step_name(node: str, service: str, step: str) -> str:
    return f"rc-{node}-{service}-step-{step}"


def spec(svc: DesiredService, node: str, step: str, files: Path, command: str, env: dict[str, str]) -> dict[str, Any]:
    """What ``main`` runs: JSON-able, passed through the wrapper's environment."""
    rt = svc.runtime
    return {"name": step_name(node, svc.name, step), "image": rt.image, "command": command,
            "files": str(files), "config_dir": rt.config_dir, "user": rt.user, "network_mode": rt.network_mode,
            "network": rt.networks[0] if rt.networks else "", "env": {**dict(rt.env), **env},
            "labels": {PREFIX + "node": node, PREFIX + "step-of": svc.name, PREFIX + "step": step},
            "volume": f"rc-{node}-{svc.name}-data", "data_dir": f"/var/lib/{svc.name}"}


def engine_env() -> dict[str, str]:
    return {k: os.environ[k] for k in ENGINE_ENV if k in os.environ}


def remove(name: str) -> None:
    """A step container a timed-out or killed run left: gone (never left running beside a new run)."""
    with contextlib.suppress(docker.errors.DockerException):
        client = docker.from_env(timeout=30)
        with contextlib.suppress(docker.errors.NotFound):
            client.containers.get(name).remove(force=True)


def main() -> int:
    s = json.loads(os.environ["RECONCILER_STEP_SPEC"])
    try:
        client = docker.from_env(timeout=60)
        with contextlib.suppress(docker.errors.NotFound):  # an earlier, interrupted run's: not run beside it
            client.containers.get(s["name"]).remove(force=True)
        container = client.containers.create(
            s["image"], command=["/bin/sh", "-c", s["command"]], name=s["name"], labels=s["labels"],
            environment={**s["env"], "RECONCILER_DATA_DIR": s["data_dir"]},
            volumes={s["files"]: {"bind": s["config_dir"], "mode": "ro"}}, user=s["user"] or None,
            network=s["network"] or None, network_mode=s["network_mode"] or None, working_dir=s["config_dir"],
            init=True, mounts=[Mount(s["data_dir"], s["volume"], type="volume")])
    except docker.errors.ImageNotFound:
        print(f"image {s['image']} not found on the engine (pull it first)", file=sys.stderr)
        return 125
    except docker.errors.DockerException as exc:
        print(f"docker: {exc}", file=sys.stderr)
        return 125
    try:
        container.start()
        status = int(container.wait().get("StatusCode", 1))
        sys.stdout.buffer.write(container.logs(stdout=True, stderr=True))
        sys.stdout.flush()
        return status
    finally:
        with contextlib.suppress(docker.errors.DockerException):
            container.remove(force=True)


if __name__ == "__main__":
    sys.exit(main())
