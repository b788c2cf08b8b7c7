"""A node that lost its state dir, on the real Docker engine: the containers it finds by their
labels are adopted (records and files written again), none restarted, and managed again."""

from __future__ import annotations

from collections.abc import Callable

import docker
import pytest
from conftest import SigningKey, wait_for
from test_docker import DockerDeployment, containers, dock, fetch, started_at  # noqa: F401  (dock: a fixture)
from test_state_loss import cli, node_args, status

from reconciler.agent import Agent
from reconciler.daemon.supervisor import Supervisor

pytestmark = pytest.mark.usefixtures("docker_cleanup")


@pytest.mark.parametrize("note_key", ["kept", "lost"])
def test_a_node_that_lost_its_state_adopts_its_containers_and_restarts_none(
    dock: DockerDeployment,  # noqa: F811  (the fixture imported above)
    agents: Callable[..., Agent], docker_engine: docker.DockerClient, merge_key: SigningKey, note_key: str,
) -> None:
    """``lost``: the node's note key lived in the state dir (no note_key setting), so its notes on
    the remote prove nothing after the loss and it starts as a new node: it adopts all the same."""
    import shutil

    # its settings; every container it has is removed at the end
    node = agents(dock.node, dock.url, **({"note_key": None} if note_key == "lost" else {}))
    args = node_args(node, merge_key)
    first = cli("agent", "--once", *args)
    assert first.returncode == 0, first.stderr
    before = {n: (c.id, started_at(c)) for n, c in containers(docker_engine, dock.node).items()}
    assert sorted(before) == ["web", "worker"]

    shutil.rmtree(node.cfg.state_dir)  # records and live files gone; the containers run on
    proc = cli("agent", "--once", *args)

    assert proc.returncode == 0, proc.stderr
    assert {n: (c.id, started_at(c)) for n, c in containers(docker_engine, dock.node).items()} == before
    assert "adopted web" in proc.stderr and "adopted worker" in proc.stderr, proc.stderr
    seen = {s["name"]: s for s in status(node, merge_key)["services"]}
    assert {n: (s["driver"], s["running"]) for n, s in seen.items()} == {"web": ("docker", True),
                                                                        "worker": ("docker", True)}
    assert (node.cfg.state_dir / "docker" / "web" / "live" / "index.html").read_text() == \
        f"hello from {dock.node}\n"

    # Managed again: the supervisor restarts a container that died, and it serves its files.
    containers(docker_engine, dock.node)["web"].kill()
    wait_for(lambda: containers(docker_engine, dock.node)["web"].status != "running", what="web down")
    assert Supervisor(agents(dock.node, dock.url)).tick() == ["web"]
    wait_for(lambda: fetch(dock.port) == f"hello from {dock.node}\n", 15, "web serving its files again")
