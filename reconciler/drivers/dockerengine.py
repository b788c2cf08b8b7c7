"""The Docker engine as the docker driver reaches it: the client, the labels' prefix that marks
what the agent made, the engine's failures (``EngineDown``), and images: whether the engine has
one, and a pull from its registry with this node's login (``registry.py`` says how a login and a
pull's error are told; nothing there talks to an engine)."""

from __future__ import annotations

from collections.abc import Mapping

import docker
import docker.errors
import requests

from reconciler.core import faults
from reconciler.core.errors import ApplyError
from reconciler.drivers.registry import PullFailed, RegistryLogin, redact, registry_of, split_reference

PREFIX = "reconciler."
STOP_TIMEOUT = 10  # seconds a container is given to stop before it is killed


class EngineDown(ApplyError):
    reason = "ENGINE_DOWN"


def connect(node: str) -> docker.DockerClient:
    """A client of the engine this node's environment names (``DOCKER_HOST``), answering."""
    try:
        client = docker.from_env(timeout=60)
        client.ping()
    except docker.errors.DockerException as exc:
        raise EngineDown(f"node {node}: docker engine not reachable: {exc}") from exc
    return client


def has_image(client: docker.DockerClient, node: str, image: str) -> bool:
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        return False
    except docker.errors.APIError as exc:
        raise EngineDown(f"node {node}: docker engine error: {exc.explanation}") from exc
    except (docker.errors.DockerException, requests.RequestException) as exc:  # the engine went away
        raise EngineDown(f"node {node}: docker engine not reachable: {exc}") from exc
    return True


def pull(client: docker.DockerClient, node: str, logins: Mapping[str, RegistryLogin], image: str) -> bool:
    """Pull ``image`` unless the engine has it already (a tag is taken as immutable: a new
    version is a new tag or a digest); True when it was pulled. ``PullFailed`` with the
    registry's own reason, credentials stripped, when it cannot be had."""
    if has_image(client, node, image):
        return False
    registry = registry_of(image)
    login = logins.get(registry)
    auth: dict[str, str] | None = None
    secrets: list[str] = []
    if login is not None:
        secrets = [login.password()]
        auth = {"username": login.username, "password": secrets[0]}
    repository, tag = split_reference(image)
    faults.point("pull", image)
    try:
        # The low-level stream: the engine reports a failure half way through as a message in
        # it (the high-level pull drops those and says only "not found" afterwards).
        for message in client.api.pull(repository, tag=tag, stream=True, decode=True, auth_config=auth):
            if isinstance(message, dict) and message.get("error"):
                raise PullFailed(f"image {image}: pull from {registry} failed: "
                                 f"{redact(str(message['error']), secrets)}")
    except docker.errors.APIError as exc:
        why = redact(str(exc.explanation or exc), secrets)
        raise PullFailed(f"image {image}: pull from {registry} failed: {why}") from None
    except (docker.errors.DockerException, requests.RequestException) as exc:  # the engine went away mid-pull
        raise EngineDown(f"node {node}: docker engine error while pulling {image}: "
                         f"{redact(str(exc), secrets)}") from None
    if not has_image(client, node, image):
        raise PullFailed(f"image {image}: pulled from {registry}, yet the engine does not have it")
    return True
