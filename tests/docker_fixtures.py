"""Pytest plugin: a real Docker engine and the local test images (registered in conftest.py).

``docker_engine`` uses the engine the environment points at (``docker.from_env()``) when it
answers and already has the test images; otherwise it runs scripts/docker-engine.sh once per
session, which starts a private engine when needed and builds the images (nothing is pulled).
When no engine can be had the test fails on CI (``$CI`` set) and is skipped elsewhere.

Everything a test creates should carry ``reconciler.test-run=<docker_run_id>`` (see
``docker_cleanup``) or belong to a test node named ``t-...`` (label ``reconciler.node``), so
``docker_cleanup`` can remove it afterwards.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import docker
import docker.errors
import pytest
from needs import unavailable

ROOT = Path(__file__).resolve().parent.parent
ENGINE_SCRIPT = ROOT / "scripts" / "docker-engine.sh"
DEFAULT_HOST = "unix:///var/run/docker.sock"

BUSYBOX_IMAGE = "reconciler-test/busybox:1"
BUSYBOX_IMAGE_2 = "reconciler-test/busybox:2"  # same rootfs plus /etc/image-version: another image id
PYTHON_IMAGE = "reconciler-example/python:3.11"
TEST_IMAGES = (BUSYBOX_IMAGE, BUSYBOX_IMAGE_2, PYTHON_IMAGE)

RUN_LABEL = "reconciler.test-run"
NODE_LABEL = "reconciler.node"
TEST_NODE_PREFIX = "t-"


def _unavailable(reason: str) -> NoReturn:
    unavailable("Docker engine", reason)


def _env_engine() -> tuple[str, bool] | None:
    """(host, has all test images) of the engine the environment points at, None if it does not answer."""
    try:
        client = docker.from_env()
    except docker.errors.DockerException:
        return None
    try:
        client.ping()
        has_images = True
        for image in TEST_IMAGES:
            try:
                client.images.get(image)
            except docker.errors.ImageNotFound:
                has_images = False
        return os.environ.get("DOCKER_HOST") or DEFAULT_HOST, has_images
    except docker.errors.DockerException:
        return None
    finally:
        client.close()


def _run_engine_script() -> str:
    """Run scripts/docker-engine.sh and return the DOCKER_HOST it prints (its last stdout line)."""
    try:
        proc = subprocess.run(
            ["bash", str(ENGINE_SCRIPT)], cwd=ROOT, capture_output=True, text=True, timeout=1200, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        _unavailable(f"{ENGINE_SCRIPT.name}: {e}")
    lines = proc.stdout.strip().splitlines()
    prefix = "export DOCKER_HOST="
    if proc.returncode != 0 or not lines or not lines[-1].startswith(prefix):
        tail = "\n".join(proc.stderr.strip().splitlines()[-30:])
        _unavailable(f"{ENGINE_SCRIPT.name} exited {proc.returncode}:\n{tail}")
    return lines[-1].removeprefix(prefix).strip()


def remove_labelled(client: docker.DockerClient, run_id: str | None, test_nodes: bool = True) -> list[str]:
    """Remove the containers, then the networks, of this test run and (test_nodes) of nodes named t-...

    Returns what was removed ("container NAME" / "network NAME"); things that vanish meanwhile are ignored.
    """

    def wanted(labels: dict[str, str] | None) -> bool:
        labels = labels or {}
        if run_id is not None and labels.get(RUN_LABEL) == run_id:
            return True
        return test_nodes and labels.get(NODE_LABEL, "").startswith(TEST_NODE_PREFIX)

    filters = ([{"label": f"{RUN_LABEL}={run_id}"}] if run_id is not None else []) + (
        [{"label": NODE_LABEL}] if test_nodes else []
    )
    removed: list[str] = []
    for flt in filters:
        for container in client.containers.list(all=True, filters=flt):
            if not wanted(container.labels):
                continue
            try:
                container.remove(force=True, v=True)
                removed.append(f"container {container.name}")
            except docker.errors.NotFound:
                pass
    for flt in filters:
        for network in client.networks.list(filters=flt):
            if not wanted(network.attrs.get("Labels")):
                continue
            try:
                network.reload()
                for attached in network.containers:  # left over from outside this run: detach first
                    network.disconnect(attached, force=True)
                network.remove()
                removed.append(f"network {network.name}")
            except docker.errors.NotFound:
                pass
    return removed


@pytest.fixture(scope="session")
def docker_run_id() -> str:
    """A random id for this session: the value of the ``reconciler.test-run`` label."""
    return secrets.token_hex(4)


@pytest.fixture(scope="session")
def docker_engine(docker_run_id: str) -> Iterator[docker.DockerClient]:
    """A client for an engine that answers and has the test images; DOCKER_HOST is set to it."""
    found = _env_engine()
    host = found[0] if found is not None and found[1] else _run_engine_script()
    os.environ["DOCKER_HOST"] = host
    client = docker.DockerClient(base_url=host)
    try:
        client.ping()
    except docker.errors.DockerException as e:
        client.close()
        _unavailable(f"{host} does not answer: {e}")
    yield client
    try:
        remove_labelled(client, docker_run_id, test_nodes=False)
    finally:
        client.close()


def _image(client: docker.DockerClient, name: str) -> str:
    try:
        client.images.get(name)
    except docker.errors.ImageNotFound:
        pytest.fail(f"image {name} is missing: run scripts/docker-engine.sh", pytrace=False)
    return name


@pytest.fixture(scope="session")
def busybox_image(docker_engine: docker.DockerClient) -> str:
    return _image(docker_engine, BUSYBOX_IMAGE)


@pytest.fixture(scope="session")
def busybox_image_2(docker_engine: docker.DockerClient) -> str:
    return _image(docker_engine, BUSYBOX_IMAGE_2)


@pytest.fixture(scope="session")
def python_image(docker_engine: docker.DockerClient) -> str:
    return _image(docker_engine, PYTHON_IMAGE)


@pytest.fixture
def docker_cleanup(docker_engine: docker.DockerClient, docker_run_id: str) -> Iterator[dict[str, str]]:
    """After the test, remove its containers and networks (this run's label, or a t-... node's).

    Yields the labels to put on what the test creates itself: ``{"reconciler.test-run": run_id}``.
    """
    yield {RUN_LABEL: docker_run_id}
    remove_labelled(docker_engine, docker_run_id)
    # What the docker driver itself makes for a node: networks it owns, and data volumes.
    for network in docker_engine.networks.list(filters={"label": "reconciler.owner"}):
        if network.attrs.get("Labels", {}).get("reconciler.owner", "").startswith(TEST_NODE_PREFIX):
            with contextlib.suppress(docker.errors.APIError):
                network.remove()
    for volume in docker_engine.volumes.list(filters={"name": f"rc-{TEST_NODE_PREFIX}"}):
        with contextlib.suppress(docker.errors.APIError):
            volume.remove(force=True)
