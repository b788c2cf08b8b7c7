"""The docker driver on a real Docker engine: containers labelled, observed, changed with the
least disruption, and put back when a change fails.

Each test has its own node name (t-...), so its containers and networks are its own.
"""

from __future__ import annotations

import secrets
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import cast

import docker
import pytest
from conftest import Deployment, SigningKey, free_port, git, wait_for

from reconciler.agent import Agent
from reconciler.core.model import ObservedService

pytestmark = pytest.mark.usefixtures("docker_cleanup")

WEB = """\
description: static site served by busybox httpd
driver: docker
runtime:
  image: "{{ web_image }}"
  command: [httpd, -f, -p, "80", -h, /etc/web]
  ports: ["127.0.0.1:{{ web_port }}:80"]
  networks: []
files:
  - {path: index.html, template: index.html.j2}
health:
  http: "http://127.0.0.1:{{ web_port }}/index.html"
  timeout: 10
"""

WORKER = """\
description: a long-running worker with no port
driver: docker
runtime:
  image: "{{ worker_image }}"
  command: [sh, -c, "while true; do cat /etc/worker/worker.conf >/dev/null; sleep 1; done"]
files:
  - {path: worker.conf, template: worker.conf.j2}
"""


class DockerDeployment(Deployment):
    node: str
    port: int


@pytest.fixture
def dock(tmp_path: Path, merge_key: SigningKey, busybox_image: str, busybox_image_2: str) -> DockerDeployment:
    node = f"t-{secrets.token_hex(3)}"
    port = free_port()
    work = tmp_path / "work"
    files = {
        "reconciler.yaml": "format: 1\nname: dockertest\n",
        "inventory.yaml": (
            "groups:\n  site:\n    services: [web, worker]\n"
            f"nodes:\n  {node}:\n    groups: [site]\n    vars:\n"
            f"    web_image: {busybox_image}\n    worker_image: {busybox_image}\n"
            f"    web_port: {port}\n    greeting: hello\n"
        ),
        "services/web/service.yaml": WEB,
        "services/web/templates/index.html.j2": "{{ greeting }} from {{ node }}\n",
        "services/worker/service.yaml": WORKER,
        "services/worker/templates/worker.conf.j2": "threads = 4\n",
    }
    for rel, text in files.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    # The inventory writes vars at node level; fix the indentation of the generated block.
    inv = (work / "inventory.yaml").read_text().replace("\n    web_image", "\n      web_image").replace(
        "\n    worker_image", "\n      worker_image").replace("\n    web_port", "\n      web_port").replace("\n    greeting", "\n      greeting")
    (work / "inventory.yaml").write_text(inv)
    bare = tmp_path / "cloud.git"
    git("init", "-q", "--bare", "-b", "main", str(bare))
    git("init", "-q", "-b", "main", cwd=work)
    dep = DockerDeployment(work, bare, merge_key)
    dep.node, dep.port = node, port
    dep.commit("docker site")
    return dep


def set_var(dep: DockerDeployment, name: str, value: str) -> None:
    text = dep.read("inventory.yaml")
    out = [f"      {name}: {value}" if line.startswith(f"      {name}:") else line for line in text.splitlines()]
    dep.write("inventory.yaml", "\n".join(out) + "\n")


def containers(client: docker.DockerClient, node: str) -> dict[str, docker.models.containers.Container]:
    found = client.containers.list(all=True, filters={"label": f"reconciler.node={node}"})
    return {c.labels["reconciler.service"]: c for c in found}


def started_at(c: docker.models.containers.Container) -> str:
    c.reload()
    return str(c.attrs["State"]["StartedAt"])


def fetch(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/index.html", timeout=5) as resp:
        body: bytes = resp.read()
        return body.decode()


def actions(result) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {r.service: str(r.action) for r in result.report.services}


def test_create_label_and_leave_unchanged_alone(dock: DockerDeployment, agents: Callable[..., Agent],
                                               docker_engine: docker.DockerClient) -> None:
    node = agents(dock.node, dock.url)
    first = node.reconcile_once()
    assert first.exit_code == 0, first.report
    assert actions(first) == {"web": "start", "worker": "start"}
    web = containers(docker_engine, dock.node)["web"]
    labels = web.labels
    assert labels["reconciler.node"] == dock.node and labels["reconciler.service"] == "web"
    assert labels["reconciler.commit"] == first.commit
    assert {"reconciler.spec-hash", "reconciler.config-hash", "reconciler.hash"} <= set(labels)
    assert fetch(dock.port) == f"hello from {dock.node}\n"
    mounts = {m["Destination"]: m for m in web.attrs["Mounts"]}
    assert mounts["/etc/web"]["RW"] is False

    before = {n: (c.id, started_at(c)) for n, c in containers(docker_engine, dock.node).items()}
    dock.write("README.md", "docs only\n")
    dock.commit("docs")
    second = node.reconcile_once()
    assert actions(second) == {"web": "none", "worker": "none"}
    assert {n: (c.id, started_at(c)) for n, c in containers(docker_engine, dock.node).items()} == before


def test_config_change_restarts_only_that_container(dock: DockerDeployment, agents: Callable[..., Agent],
                                                    docker_engine: docker.DockerClient) -> None:
    node = agents(dock.node, dock.url)
    node.reconcile_once()
    before = {n: (c.id, started_at(c)) for n, c in containers(docker_engine, dock.node).items()}
    set_var(dock, "greeting", "bonjour")
    dock.commit("say bonjour")

    result = node.reconcile_once()

    assert result.exit_code == 0 and actions(result) == {"web": "restart", "worker": "none"}
    after = {n: (c.id, started_at(c)) for n, c in containers(docker_engine, dock.node).items()}
    assert after["web"][0] == before["web"][0] and after["web"][1] != before["web"][1]
    assert after["worker"] == before["worker"]
    assert fetch(dock.port) == f"bonjour from {dock.node}\n"


def test_image_change_recreates_and_removal_removes(dock: DockerDeployment, agents: Callable[..., Agent],
                                                    docker_engine: docker.DockerClient, busybox_image_2: str) -> None:
    node = agents(dock.node, dock.url)
    node.reconcile_once()
    old = containers(docker_engine, dock.node)
    set_var(dock, "worker_image", busybox_image_2)
    dock.commit("worker on the new image")
    result = node.reconcile_once()
    assert actions(result) == {"web": "none", "worker": "recreate"}
    now = containers(docker_engine, dock.node)
    assert now["worker"].id != old["worker"].id and now["web"].id == old["web"].id
    assert now["worker"].image.tags == [busybox_image_2]
    with pytest.raises(docker.errors.NotFound):
        docker_engine.containers.get(old["worker"].id)

    dock.edit("inventory.yaml", "services: [web, worker]", "services: [web]")
    dock.commit("worker retired")
    result = node.reconcile_once()
    assert actions(result) == {"web": "none", "worker": "stop"}
    assert set(containers(docker_engine, dock.node)) == {"web"}


def test_networks_connect_and_disconnect_without_a_restart(dock: DockerDeployment, agents: Callable[..., Agent],
                                                          docker_engine: docker.DockerClient) -> None:
    node = agents(dock.node, dock.url)
    node.reconcile_once()
    web = containers(docker_engine, dock.node)["web"]
    before = (web.id, started_at(web))
    nets = [f"{dock.node}-front", f"{dock.node}-back"]
    dock.edit("services/web/service.yaml", "networks: []", f"networks: [{', '.join(nets)}]")
    dock.commit("web joins two networks")

    result = node.reconcile_once()

    assert actions(result) == {"web": "connect", "worker": "none"}
    web.reload()
    assert set(web.attrs["NetworkSettings"]["Networks"]) == set(nets)
    assert (web.id, started_at(web)) == before
    assert fetch(dock.port).startswith("hello")
    owned = docker_engine.networks.list(filters={"label": f"reconciler.owner={dock.node}"})
    assert sorted(n.name for n in owned) == sorted(nets)

    dock.edit("services/web/service.yaml", f"networks: [{', '.join(nets)}]", f"networks: [{nets[0]}]")
    dock.commit("web leaves the back network")
    assert actions(node.reconcile_once())["web"] == "connect"
    web.reload()
    assert set(web.attrs["NetworkSettings"]["Networks"]) == {nets[0]}
    assert (web.id, started_at(web)) == before


def test_drift_by_stop_and_by_remove_is_put_back_or_reported(dock: DockerDeployment, agents: Callable[..., Agent],
                                                            docker_engine: docker.DockerClient) -> None:
    node = agents(dock.node, dock.url)
    node.reconcile_once()
    containers(docker_engine, dock.node)["web"].stop(timeout=1)
    result = node.reconcile_once()
    assert actions(result)["web"] == "start" and "not running" in result.report.services[0].reason  # type: ignore[union-attr]
    assert fetch(dock.port).startswith("hello")

    containers(docker_engine, dock.node)["worker"].remove(force=True)
    result = node.reconcile_once()
    assert actions(result)["worker"] == "start"
    assert "removed by hand" in next(r.reason for r in result.report.services if r.service == "worker")  # type: ignore[union-attr]
    assert containers(docker_engine, dock.node)["worker"].status in ("running", "created")

    dock.edit("services/worker/service.yaml", "driver: docker\n", "driver: docker\ndrift: report\n")
    dock.commit("worker drift is only reported")
    node.reconcile_once()
    containers(docker_engine, dock.node)["worker"].stop(timeout=1)
    result = node.reconcile_once()
    worker = next(r for r in result.report.services if r.service == "worker")  # type: ignore[union-attr]
    assert str(worker.action) == "none" and worker.reason.startswith("drift not corrected (policy report)")
    assert (dock.note(dock.node) or {})["services"]["worker"]["reason"].startswith("drift not corrected")  # type: ignore[index]
    assert containers(docker_engine, dock.node)["worker"].status == "exited"


def test_the_supervisor_restarts_a_container_that_died_from_what_it_reads_each_tick(
        dock: DockerDeployment, agents: Callable[..., Agent], docker_engine: docker.DockerClient) -> None:
    from reconciler.daemon.supervisor import Supervisor
    from reconciler.drivers.docker import DockerDriver

    node = agents(dock.node, dock.url)
    assert node.reconcile_once().exit_code == 0
    [driver] = [d for d in node.drivers(None).values() if isinstance(d, DockerDriver)]

    def seen(observed: list[ObservedService]) -> list[tuple[object, ...]]:
        return [(o.name, o.running, o.hash, o.commit, o.pid, o.drift) for o in observed]

    # Each tick reads what a full observation says of each container, without its files.
    assert seen(driver.liveness()) == seen(driver.observe()) and not any(o.files for o in driver.liveness())
    assert all(o.files for o in driver.observe())
    containers(docker_engine, dock.node)["web"].kill()
    wait_for(lambda: [o.name for o in driver.liveness() if not o.running] == ["web"], what="web seen down")
    assert Supervisor(node).tick() == ["web"]
    assert containers(docker_engine, dock.node)["web"].status == "running"


def test_failing_changes_put_the_previous_container_back(dock: DockerDeployment, agents: Callable[..., Agent],
                                                         docker_engine: docker.DockerClient) -> None:
    node = agents(dock.node, dock.url)
    node.reconcile_once()
    web = containers(docker_engine, dock.node)["web"]

    # A spec change whose container exits at once: the old container comes back.
    dock.edit("services/web/service.yaml", "command: [httpd, -f, -p, \"80\", -h, /etc/web]",
              "command: [sh, -c, \"echo cannot bind; exit 3\"]")
    dock.commit("a broken command")
    result = node.reconcile_once()
    assert result.exit_code == 1
    failed = next(r for r in result.report.services if r.service == "web")  # type: ignore[union-attr]
    assert str(failed.action) == "recreate" and "previous container restored" in failed.detail
    assert "exited at once" in failed.detail and "cannot bind" not in failed.detail  # its output stays local
    assert "cannot bind" in node.ledger.history("web", limit=1)[0].detail
    now = containers(docker_engine, dock.node)["web"]
    assert now.id == web.id and now.status == "running"
    assert fetch(dock.port).startswith("hello")
    assert len(docker_engine.containers.list(all=True, filters={"label": f"reconciler.node={dock.node}"})) == 2


def test_missing_image_and_taken_port_are_clear_errors(dock: DockerDeployment, agents: Callable[..., Agent],
                                                       docker_engine: docker.DockerClient) -> None:
    set_var(dock, "worker_image", "registry.invalid/nothing:1")
    dock.commit("an image nobody has")
    node = agents(dock.node, dock.url)
    result = node.reconcile_once()
    worker = next(r for r in result.report.services if r.service == "worker")  # type: ignore[union-attr]
    # Pulled first, and the registry cannot be reached: the error names the image and the registry.
    assert worker.detail.startswith(f"node {dock.node}, service worker: image registry.invalid/nothing:1: pull from "
                                    "registry.invalid failed: ")
    assert worker.detail.endswith("; nothing was stopped for it")
    assert (dock.note(dock.node) or {}).get("state") == "failed"

    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        set_var(dock, "worker_image", "reconciler-test/busybox:1")
        set_var(dock, "web_port", str(taken))
        dock.commit("a port already taken")
        result = node.reconcile_once()
    web = next(r for r in result.report.services if r.service == "web")  # type: ignore[union-attr]
    assert web.state == "failed" and "service web" in web.detail and "address already in use" in web.detail.lower()


def test_engine_down_is_a_failed_run_not_a_traceback(dock: DockerDeployment, agents: Callable[..., Agent],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    node = agents(dock.node, dock.url)
    result = node.reconcile_once()
    assert result.exit_code == 1 and result.report is not None and result.report.reason == "ENGINE_DOWN"
    assert f"node {dock.node}: docker engine not reachable" in result.report.error


def test_own_healthcheck_command_probe_and_hand_made_restart_policy(
    dock: DockerDeployment, agents: Callable[..., Agent], docker_engine: docker.DockerClient
) -> None:
    # The worker is judged by a command run inside its container, and by its own healthcheck.
    dock.edit("services/worker/service.yaml", "files:", (
        "  healthcheck: {test: \"test -f /etc/worker/worker.conf\", interval: 1, retries: 1}\n"
        "  restart: unless-stopped\nfiles:"))
    dock.write("services/worker/service.yaml", dock.read("services/worker/service.yaml") +
               "health:\n  command: \"grep -q threads /etc/worker/worker.conf\"\n  timeout: 5\n")
    dock.commit("worker health checks")
    node = agents(dock.node, dock.url)
    assert node.reconcile_once().exit_code == 0
    worker = containers(docker_engine, dock.node)["worker"]
    assert worker.attrs["State"]["Health"]["Status"] == "healthy"

    # A config whose command probe fails: the previous config is put back, same container.
    dock.edit("services/worker/templates/worker.conf.j2", "threads = 4", "workers = 4")
    dock.commit("a config the probe rejects")
    result = node.reconcile_once()
    failed = next(r for r in result.report.services if r.service == "worker")  # type: ignore[union-attr]
    assert str(failed.action) == "restart" and failed.state == "failed"
    # It escalated one step (restart, then recreate); each put the previous version back.
    assert failed.steps[0].startswith("restart: failed") and "previous config restored" in failed.steps[0]
    assert failed.steps[1].startswith("recreate: failed") and "previous container restored" in failed.steps[1]
    again = containers(docker_engine, dock.node)["worker"]
    assert again.id == worker.id
    assert again.exec_run(["cat", "/etc/worker/worker.conf"]).output == b"threads = 4\n"

    # Someone changes the restart policy by hand: the next run recreates it from the spec.
    dock.edit("services/worker/templates/worker.conf.j2", "workers = 4", "threads = 4")
    dock.commit("back to a good config")
    node.reconcile_once()
    containers(docker_engine, dock.node)["worker"].update(restart_policy={"Name": "no"})
    result = node.reconcile_once()
    worker_result = next(r for r in result.report.services if r.service == "worker")  # type: ignore[union-attr]
    assert (str(worker_result.action), worker_result.reason) == ("recreate", "restart policy changed by hand")
    policy = containers(docker_engine, dock.node)["worker"].attrs["HostConfig"]["RestartPolicy"]["Name"]
    assert policy == "unless-stopped"


def test_a_reload_only_change_keeps_the_container_and_serves_the_new_value(
    dock: DockerDeployment, agents: Callable[..., Agent], docker_engine: docker.DockerClient
) -> None:
    dock.write("services/web/service.yaml", dock.read("services/web/service.yaml") +
               "reload: {signal: SIGHUP}\non_change:\n  - {file: index.html, action: reload}\n")
    dock.commit("web content reloads")
    node = agents(dock.node, dock.url)
    node.reconcile_once()
    web = containers(docker_engine, dock.node)["web"]
    before = (web.id, started_at(web))
    set_var(dock, "greeting", "hej")
    dock.commit("say hej")

    result = node.reconcile_once()

    assert actions(result) == {"web": "reload", "worker": "none"}
    web = containers(docker_engine, dock.node)["web"]
    assert (web.id, started_at(web)) == before and web.status == "running"
    assert fetch(dock.port) == f"hej from {dock.node}\n"


def test_an_upgrade_step_of_a_docker_service_runs_in_a_one_off_container_of_the_new_image(
    dock: DockerDeployment, agents: Callable[..., Agent], docker_engine: docker.DockerClient, busybox_image_2: str
) -> None:
    """A migration lives in the image: the step runs in a container of the new version's image,
    with its rendered files and the service's data volume, and leaves no container behind."""
    dock.edit("services/worker/service.yaml", "runtime:", 'version: "1"\nruntime:')
    dock.commit("worker version 1")
    node = agents(dock.node, dock.url)
    assert node.reconcile_once().exit_code == 0
    old = containers(docker_engine, dock.node)["worker"]

    dock.edit("services/worker/service.yaml", 'version: "1"\n', """version: "2"
upgrade:
  - {name: stop, action: stop}
  - name: migrate
    action: command
    scope: once
    command: 'test -f /.dockerenv && echo "image $(cat /etc/image-version)"; cat worker.conf; echo 2 > "$RECONCILER_DATA_DIR/schema"'
  - {name: start, action: start}
""")
    dock.edit("services/worker/templates/worker.conf.j2", "threads = 4", "threads = 8")
    set_var(dock, "worker_image", busybox_image_2)
    c2 = dock.commit("worker version 2, its schema migrated in the new image")
    result = node.reconcile_once()

    assert result.exit_code == 0, result.report
    steps = {s["step"]: s for s in cast(list[dict[str, str]], (dock.note(dock.node, c2) or {})["upgrade"])}
    assert [steps[s]["status"] for s in ("stop", "migrate", "start")] == ["done", "done", "done"]
    output = steps["migrate"]["detail"]
    assert output.startswith("image 2\n") and "threads = 8" in output  # in the new image, with the new files
    new = containers(docker_engine, dock.node)["worker"]
    assert new.id != old.id and new.image.tags == [busybox_image_2]
    assert new.exec_run(["cat", "/var/lib/worker/schema"]).output == b"2\n"  # the same data volume
    left = docker_engine.containers.list(all=True, filters={"label": "reconciler.step-of=worker"})
    assert [c for c in left if c.labels.get("reconciler.node") == dock.node] == []


def test_logs_prints_a_containers_output(dock: DockerDeployment, agents: Callable[..., Agent],
                                         merge_key: SigningKey) -> None:
    import subprocess
    import sys

    dock.edit("services/worker/service.yaml", 'command: [sh, -c, "while true;',
              'command: [sh, -c, "echo worker up on $RECONCILER_NODE; while true;')
    dock.commit("the worker says when it is up")
    node = agents(dock.node, dock.url)
    assert node.reconcile_once().exit_code == 0
    proc = subprocess.run([sys.executable, "-m", "reconciler", "logs", "worker", "--node", dock.node, "--remote",
                           dock.url, "--state-dir", str(node.cfg.state_dir), "--allowed-signers",
                           str(merge_key.allowed_signers), "-n", "5"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"worker up on {dock.node}\n"
