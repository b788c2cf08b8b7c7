"""Images come from a registry: a new tag is pulled before the running container is stopped,
a pull that fails leaves the old container serving, registry logins come from the agent config
and never reach a note or a log, and `reconciler prepull` fetches the next commit's images
ahead of the node's turn.

Real parts: the Docker engine (docker_fixtures) and the distribution registry on loopback
(registry_fixtures), with and without a password. An image is published by pushing the local
reconciler-test/busybox:2 under the registry's name and removing that name from the engine,
so only a pull can bring it back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypedDict

import docker
import docker.errors
import pytest
import yaml
from conftest import Deployment, SigningKey, small_deployment
from registry_fixtures import Registry

from reconciler.agent import Agent
from reconciler.core.errors import ConfigError
from reconciler.drivers.registry import PullFailed, RegistryLogin, redact, registry_of, split_reference
from reconciler.node.operations import retry
from reconciler.settings import DockerConfig, load_config

WORKER = """\
description: a worker that only runs
driver: docker
runtime:
  image: "{{ worker_image }}"
  command: [sleep, "600"]
files:
  - {path: worker.conf, template: worker.conf.j2}
"""


def worker_deployment(tmp_path: Path, key: SigningKey, node: str, image: str, settings: str = "") -> Deployment:
    return small_deployment(tmp_path, key, {
        "reconciler.yaml": "format: 1\nname: pulltest\n" + settings,
        "inventory.yaml": (f"groups:\n  site:\n    services: [worker]\nnodes:\n  {node}:\n    groups: [site]\n"
                           f"    vars: {{worker_image: '{image}'}}\n"),
        "services/worker/service.yaml": WORKER,
        "services/worker/templates/worker.conf.j2": "threads = 4\n",
    })


def use_image(dep: Deployment, node: str, image: str, message: str) -> str:
    text = dep.read("inventory.yaml")
    start = text.index("worker_image: '") + len("worker_image: '")
    dep.write("inventory.yaml", text[:start] + image + text[text.index("'", start):])
    return dep.commit(message)


def worker(client: docker.DockerClient, node: str) -> docker.models.containers.Container:
    found = client.containers.list(all=True, filters={"label": [f"reconciler.node={node}",
                                                                "reconciler.service=worker"]})
    assert len(found) == 1, [c.name for c in found]
    return found[0]


def started_at(c: docker.models.containers.Container) -> str:
    c.reload()
    return str(c.attrs["State"]["StartedAt"])


def engine_has(client: docker.DockerClient, image: str) -> bool:
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        return False
    return True


@pytest.fixture
def publish(docker_engine: docker.DockerClient, busybox_image_2: str) -> Iterator[Callable[[Registry, str], str]]:
    """Push busybox:2 to a registry as PATH:2 and take that name off the engine again; returns
    the image name. Whatever the test pulled under such a name is removed afterwards."""
    made: list[str] = []

    def push(registry: Registry, path: str) -> str:
        name = registry.image(path)
        docker_engine.images.get(busybox_image_2).tag(name, "2")
        made.append(f"{name}:2")
        for message in docker_engine.images.push(name, tag="2", auth_config=registry.auth, stream=True, decode=True):
            assert "error" not in message, message
        docker_engine.images.remove(f"{name}:2")  # the tag only: busybox:2 keeps the layers
        assert not engine_has(docker_engine, f"{name}:2")
        return f"{name}:2"

    yield push
    for name in made:
        with contextlib.suppress(docker.errors.ImageNotFound):
            docker_engine.images.remove(name)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reconciler", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


class EventActor(TypedDict):
    ID: str


class EngineEvent(TypedDict):
    """One event of the engine's (the API's EventMessage, decoded): the fields these tests read."""

    Type: str
    Action: str
    Actor: EventActor
    timeNano: int


def engine_events(client: docker.DockerClient, since: float) -> list[EngineEvent]:
    """What the engine did since then, in its own order and clock (ns)."""
    # Bounds to the microsecond (the API takes "1700000000.123456"): a later bound would wait for it.
    return sorted(client.events(since=f"{since:.6f}", until=f"{time.time():.6f}", decode=True),
                  key=lambda e: int(e["timeNano"]))


# A node on busybox:1 moves to a registry tag --------------------------------------------------

@pytest.mark.usefixtures("docker_cleanup")
def test_a_new_tag_is_pulled_before_the_old_container_is_stopped(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent], docker_engine: docker.DockerClient,
    busybox_image: str, open_registry: Registry, publish: Callable[[Registry, str], str],
) -> None:
    node = f"t-{secrets.token_hex(3)}"
    image = publish(open_registry, f"{node}/busybox")
    dep = worker_deployment(tmp_path, merge_key, node, busybox_image)
    agent = agents(node, dep.url)
    assert agent.reconcile_once().exit_code == 0
    old = worker(docker_engine, node)

    use_image(dep, node, image, "worker on the registry's busybox:2")
    since = time.time()
    result = agent.reconcile_once()

    assert result.exit_code == 0, result.report
    assert [(r.service, str(r.action), str(r.state)) for r in result.report.services] == [  # type: ignore[union-attr]
        ("worker", "recreate", "ok")]
    new = worker(docker_engine, node)
    assert new.id != old.id and image in new.image.tags and new.status == "running"
    # The engine's own log: the pull finished before the old container got its stop signal.
    events = engine_events(docker_engine, since)
    pulled = [int(e["timeNano"]) for e in events if e["Type"] == "image" and e["Action"] == "pull"
              and e["Actor"]["ID"] == image]
    stopped = [int(e["timeNano"]) for e in events if e["Type"] == "container" and e["Actor"]["ID"] == old.id
               and e["Action"] in ("kill", "stop", "die")]
    assert len(pulled) == 1 and stopped, [(e["Type"], e["Action"]) for e in events]
    assert pulled[0] < min(stopped)


@pytest.mark.usefixtures("docker_cleanup")
def test_a_tag_the_registry_does_not_have_leaves_the_old_container_running(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent], docker_engine: docker.DockerClient,
    busybox_image: str, open_registry: Registry, publish: Callable[[Registry, str], str],
) -> None:
    node = f"t-{secrets.token_hex(3)}"
    image = publish(open_registry, f"{node}/busybox").replace(":2", ":3")  # the repository exists, tag 3 not
    dep = worker_deployment(tmp_path, merge_key, node, busybox_image)
    agent = agents(node, dep.url)
    assert agent.reconcile_once().exit_code == 0
    old = worker(docker_engine, node)
    before = started_at(old)

    c2 = use_image(dep, node, image, "worker on a tag nobody pushed")
    result = agent.reconcile_once()

    assert result.exit_code == 1
    note = dep.note(node, c2) or {}
    assert note["state"] == "failed"
    detail = note["services"]["worker"]["detail"]  # type: ignore[index]
    assert detail.startswith(f"node {node}, service worker: image {image}: pull from {open_registry.host} failed: ")
    assert "manifest unknown" in detail and "nothing was stopped for it" in detail
    same = worker(docker_engine, node)
    assert (same.id, started_at(same), same.status) == (old.id, before, "running")
    assert not engine_has(docker_engine, image)

    # prepull says the same, as a failed command (exit 1), one error line
    proc = cli("prepull", "--node", node, "--remote", dep.url, "--state-dir", str(agent.cfg.state_dir),
               "--allowed-signers", str(merge_key.allowed_signers))
    assert proc.returncode == 1 and image in proc.stdout and "failed" in proc.stdout
    assert proc.stderr.startswith(f"error: 1 of 1 image not pulled: image {image}: pull from ")
    assert proc.stderr.endswith("[IMAGE_PULL_FAILED]\n") and len(proc.stderr.splitlines()) == 1


@pytest.mark.usefixtures("docker_cleanup")
def test_a_registry_login_from_the_config_pulls_and_its_password_is_never_written(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent], docker_engine: docker.DockerClient,
    busybox_image: str, private_registry: Registry, publish: Callable[[Registry, str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, the docker SDK's and urllib3's included
    node = f"t-{secrets.token_hex(3)}"
    image = publish(private_registry, f"{node}/busybox")
    dep = worker_deployment(tmp_path, merge_key, node, busybox_image)
    password_file = tmp_path / "registry.password"
    wrong = f"wrong-{secrets.token_hex(8)}"
    password_file.write_text(wrong + "\n")
    login = RegistryLogin(private_registry.host, private_registry.username, password_file=password_file)
    agent = agents(node, dep.url, docker=DockerConfig((login,)))
    assert agent.reconcile_once().exit_code == 0
    old = worker(docker_engine, node)

    # A wrong password: the registry refuses, the old container keeps running.
    c2 = use_image(dep, node, image, "worker from the private registry")
    refused = agent.reconcile_once()
    assert refused.exit_code == 1
    detail = (dep.note(node, c2) or {})["services"]["worker"]["detail"]  # type: ignore[index]
    assert f"pull from {private_registry.host} failed" in detail and "unauthorized" in detail.lower()
    assert worker(docker_engine, node).id == old.id

    # The right one, written to the same file: read at the next pull, no restart of the agent.
    password_file.write_text(private_registry.password + "\n")
    assert retry(agent.ctx) == c2
    result = agent.reconcile_once()
    assert result.exit_code == 0, result.report
    assert image in worker(docker_engine, node).image.tags

    for secret in (wrong, private_registry.password):
        assert secret not in caplog.text
        assert secret not in json.dumps([refused.to_dict(), result.to_dict(), dep.note(node, c2)])
        assert secret not in json.dumps(agent.cfg.to_dict())
        for path in agent.cfg.state_dir.rglob("*"):  # the ledger, records, rendered files
            assert not path.is_file() or secret.encode() not in path.read_bytes(), path


@pytest.mark.usefixtures("docker_cleanup")
def test_an_upgrade_whose_image_cannot_be_pulled_fails_before_its_stop_step(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent], docker_engine: docker.DockerClient,
    busybox_image: str, open_registry: Registry,
) -> None:
    node = f"t-{secrets.token_hex(3)}"
    dep = worker_deployment(tmp_path, merge_key, node, busybox_image)
    dep.edit("services/worker/service.yaml", "runtime:", 'version: "1"\nruntime:')
    dep.commit("worker version 1")
    agent = agents(node, dep.url)
    assert agent.reconcile_once().exit_code == 0
    old = worker(docker_engine, node)

    dep.edit("services/worker/service.yaml", 'version: "1"\n', 'version: "2"\nupgrade:\n'
             "  - {name: stop, action: stop}\n  - {name: start, action: start}\n")
    image = open_registry.image(f"{node}/never-pushed:2")
    c2 = use_image(dep, node, image, "worker version 2, from an image nobody pushed")
    result = agent.reconcile_once()

    assert result.exit_code == 1
    note = dep.note(node, c2) or {}
    assert (note["state"], note["reason"]) == ("failed", "UPGRADE_FAILED")
    assert f"worker: upgrade on {node}: image {image}: pull from {open_registry.host} failed: " in str(note["error"])
    same = worker(docker_engine, node)
    assert (same.id, same.status) == (old.id, "running")  # its stop step never ran


# prepull ----------------------------------------------------------------------------------------

@pytest.mark.usefixtures("docker_cleanup")
def test_prepull_fetches_the_next_commits_image_with_the_configs_login_and_changes_nothing_else(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent], docker_engine: docker.DockerClient,
    busybox_image: str, private_registry: Registry, publish: Callable[[Registry, str], str],
) -> None:
    node = f"t-{secrets.token_hex(3)}"
    image = publish(private_registry, f"{node}/busybox")
    dep = worker_deployment(tmp_path, merge_key, node, busybox_image)
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({
        "node": node, "remote": dep.url, "state_dir": str(tmp_path / "nodes" / node),
        "trust": {"allowed_signers": str(merge_key.allowed_signers)},
        "docker": {"registries": {private_registry.host: {"username": private_registry.username,
                                                           "password_env": "PULL_PASSWORD"}}},
    }))
    agent = agents(node, dep.url)
    c1 = agent.reconcile_once().commit
    old = worker(docker_engine, node)
    before = started_at(old)
    c2 = use_image(dep, node, image, "worker from the private registry")

    proc = cli("prepull", "--config", str(config), "-o", "json", env={"PULL_PASSWORD": private_registry.password})

    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"node": node, "commit": c2, "images": [
        {"image": image, "services": ["worker"], "result": "pulled", "detail": ""}]}
    assert engine_has(docker_engine, image)
    same = worker(docker_engine, node)
    assert (same.id, started_at(same)) == (old.id, before)
    assert agent.ledger.record(c2) is None and agent.ledger.mark().commit == c1 and dep.note(node, c2) is None
    assert private_registry.password not in proc.stdout + proc.stderr

    # The change itself then waits on no registry: no pull while it runs.
    since = time.time()
    assert agent.reconcile_once().exit_code == 0
    assert image in worker(docker_engine, node).image.tags
    assert [e for e in engine_events(docker_engine, since) if e["Action"] == "pull" and e["Actor"]["ID"] == image] == []


@pytest.mark.usefixtures("docker_cleanup")
def test_a_node_waiting_for_an_earlier_wave_pulls_the_commits_images_meanwhile(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent], docker_engine: docker.DockerClient,
    open_registry: Registry, publish: Callable[[Registry, str], str],
) -> None:
    first, later = f"t-{secrets.token_hex(3)}", f"t-{secrets.token_hex(3)}"
    image = publish(open_registry, f"{later}/busybox")
    dep = worker_deployment(tmp_path, merge_key, first, image, settings=(
        f"rollout:\n  waves:\n    - {{name: canary, nodes: [{first}]}}\n    - {{name: rest, nodes: [{later}]}}\n"))
    dep.edit("inventory.yaml", "nodes:\n", f"nodes:\n  {later}:\n    groups: [site]\n    vars: {{worker_image: '{image}'}}\n")
    dep.commit("a second node, in a later wave")

    result = agents(later, dep.url).reconcile_once()

    assert result.waiting and first in result.waiting and result.report is None
    assert engine_has(docker_engine, image)
    assert docker_engine.containers.list(all=True, filters={"label": f"reconciler.node={later}"}) == []


def test_prepull_of_an_unsigned_head_is_refused_before_anything_is_pulled(
    tmp_path: Path, merge_key: SigningKey,
) -> None:
    dep = worker_deployment(tmp_path, merge_key, "n1", "127.0.0.1:9/never/pulled:1")
    dep.write("README.md", "pushed around review\n")
    dep.commit("unsigned", key=None)
    (tmp_path / "n1").mkdir()  # made ready: only the agent makes a state dir where none is
    proc = cli("prepull", "--node", "n1", "--remote", dep.url, "--state-dir", str(tmp_path / "n1"),
               "--allowed-signers", str(merge_key.allowed_signers))
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and "[UNSIGNED]" in proc.stderr and len(proc.stderr.splitlines()) == 1


# the parts without an engine -----------------------------------------------------------------

@pytest.mark.parametrize(("image", "registry", "repository", "tag"), [
    ("busybox", "docker.io", "busybox", "latest"),
    ("library/busybox:1.36", "docker.io", "library/busybox", "1.36"),
    ("registry.example.org/openstack/keystone:2026.2-3", "registry.example.org", "registry.example.org/openstack/keystone",
     "2026.2-3"),
    ("127.0.0.1:5000/x/y", "127.0.0.1:5000", "127.0.0.1:5000/x/y", "latest"),
    ("localhost/x:1", "localhost", "localhost/x", "1"),
    ("reg.example.org:443/x@sha256:" + "ab" * 32, "reg.example.org:443", "reg.example.org:443/x", "sha256:" + "ab" * 32),
])
def test_an_image_name_says_its_registry_and_what_to_pull(image: str, registry: str, repository: str,
                                                          tag: str) -> None:
    assert registry_of(image) == registry
    assert split_reference(image) == (repository, tag)


def test_credentials_are_stripped_from_urls_and_known_secrets_in_an_error() -> None:
    text = 'Get "https://puller:hunter2-long@reg.example.org/v2/": unauthorized; token hunter2-long'
    assert redact(text, ["hunter2-long"]) == 'Get "https://reg.example.org/v2/": unauthorized; token ***'


def test_a_password_is_read_from_its_file_or_variable_and_a_missing_one_is_named_not_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    pw = tmp_path / "pw"
    pw.write_text("s3cret-value\n")
    assert RegistryLogin("r.example.org", "u", password_file=pw).password() == "s3cret-value"
    monkeypatch.setenv("REG_PW", "from-env")
    assert RegistryLogin("r.example.org", "u", password_env="REG_PW").password() == "from-env"
    with pytest.raises(PullFailed, match=f"registry r.example.org: cannot read password_file {tmp_path}/absent: "):
        RegistryLogin("r.example.org", "u", password_file=tmp_path / "absent").password()
    monkeypatch.delenv("REG_PW")
    with pytest.raises(PullFailed, match="password_env REG_PW is empty or unset") as caught:
        RegistryLogin("r.example.org", "u", password_env="REG_PW").password()
    assert caught.value.reason == "REGISTRY_LOGIN"


def agent_yaml(tmp_path: Path, docker_settings: object) -> Path:
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({"node": "ctl1", "remote": "file:///nowhere.git", "docker": docker_settings}))
    return config


def test_registry_logins_in_the_agent_config(tmp_path: Path) -> None:
    cfg = load_config(agent_yaml(tmp_path, {"registries": {
        "registry.example.org": {"username": "node", "password_file": "/etc/reconciler/registry.password"},
        "127.0.0.1:5000": {"username": "ci", "password_env": "REGISTRY_PASSWORD"}}}), {})
    assert cfg.docker.registries == (
        RegistryLogin("127.0.0.1:5000", "ci", password_env="REGISTRY_PASSWORD"),
        RegistryLogin("registry.example.org", "node", password_file=Path("/etc/reconciler/registry.password")))


@pytest.mark.parametrize(("registries", "error"), [
    ({"r.example.org": {"username": "u", "password": "hunter2"}}, "the password itself never goes in the config"),
    ({"r.example.org": {"username": "u"}}, "give one of password_file"),
    ({"r.example.org": {"username": "u", "password_file": "/p", "password_env": "P"}}, "give one of password_file"),
    ({"r.example.org": {"username": "u", "password_env": "not a name"}}, "must be the name of an environment"),
    ({"r.example.org": {"password_env": "P"}}, "username must be a user name"),
    ({"https://r.example.org": {"username": "u", "password_env": "P"}}, "the key is a registry host"),
    ({"r.example.org": {"username": "u", "password_env": "P", "token": "hunter2"}}, "unknown setting"),
    (["r.example.org"], "docker.registries must map a registry host"),
])
def test_bad_registry_logins_are_one_line_errors_that_never_repeat_a_secret(
    tmp_path: Path, registries: object, error: str,
) -> None:
    with pytest.raises(ConfigError, match=error) as caught:
        load_config(agent_yaml(tmp_path, {"registries": registries}), {})
    assert "\n" not in str(caught.value) and "hunter2" not in str(caught.value)
    assert str(caught.value).startswith(f"{tmp_path / 'agent.yaml'}:")  # and the line, where the file has one
