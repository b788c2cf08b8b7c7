"""Kill the agent at every side effect of a refused attach, on the real Docker engine, and check
that one more plain run leaves the container off the network it could not join (see
test_crash_points.py for the method).

An lb container on the management network; a commit puts it onto a network with no free
address (a /30 whose one address another host's container holds). The engine refuses the
connect and still lists the network for the container, with no endpoint; a running container
leaves such an entry only stopped, so the agent stops it, takes it off and starts it again
(``dockernet.leave``), then puts back what it had. The passes killed, at each of those side
effects in turn (the connect, the disconnects, the stop, the start, the record put back):

- where a kill leaves the container stopped, the supervisor's revive, with the address free by
  then, starts it on the networks of its record, not on the one it failed to join;
- the next plain run ends as the refused attach does unkilled: the commit failed, the container
  running on the management network alone, the record saying so.

Once the address is freed, a new commit joins the network.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest
from conftest import Deployment, SigningKey, note_key, small_deployment
from crash_fleet import kill_at
from test_crash_points import Node, count_points

from reconciler.drivers.docker import DockerDriver
from reconciler.settings import AgentConfig, TrustConfig

pytestmark = pytest.mark.usefixtures("docker_cleanup")

LB = """\
driver: docker
runtime:
  image: "{{ image }}"
  command: [httpd, -f, -p, "8080", -h, /etc/lb]
  networks: [NETS]
files:
  - {path: index.html, template: index.html.j2}
health:
  command: "true"
  timeout: 0.5
  min_healthy: 0
"""


@dataclass
class Site:
    deployment: Deployment
    engine: docker.DockerClient
    node: Node
    mgmt: str
    vip: str
    image: str
    labels: dict[str, str]
    commits: int = 0

    @property
    def container(self) -> str:
        return f"rc-{self.node.cfg.node}-lb"

    def commit(self, on_vip: bool) -> str:
        self.commits += 1
        nets = f"{self.mgmt}, {self.vip}" if on_vip else self.mgmt
        self.deployment.write("services/lb/service.yaml", LB.replace("NETS", nets))
        return self.deployment.commit(f"lb {'onto' if on_vip else 'off'} {self.vip} #{self.commits}")

    def hold(self) -> None:
        """The VIP network's one free address taken by another host's container."""
        self.engine.containers.run(self.image, ["sleep", "600"], network=self.vip, detach=True,
                                   labels=self.labels, name=f"{self.vip}-holder")

    def free(self) -> None:
        self.engine.containers.get(f"{self.vip}-holder").remove(force=True)

    def listed(self) -> tuple[str, set[str]]:
        c = self.engine.containers.get(self.container)
        return c.status, set(c.attrs["NetworkSettings"]["Networks"] or {})

    def revive(self) -> None:
        """What the daemon's supervisor does to a container it finds stopped."""
        DockerDriver(self.node.cfg.state_dir / "docker", self.node.cfg.node, client=self.engine).revive("lb")

    def assert_off(self, commit: str) -> None:
        """The commit failed for want of an address; the container runs on the management
        network alone, as its record says."""
        note = self.deployment.note(self.node.cfg.node, commit) or {}
        assert note.get("state") == "failed", note
        assert self.listed() == ("running", {self.mgmt}), self.listed()
        observed = DockerDriver(self.node.cfg.state_dir / "docker", self.node.cfg.node, client=self.engine).observe()
        assert [(o.name, o.running, o.drifted) for o in observed] == [("lb", True, "")], observed


@pytest.fixture
def site(tmp_path: Path, merge_key: SigningKey, busybox_image: str, docker_engine: docker.DockerClient,
         docker_cleanup: dict[str, str]) -> Iterator[Site]:
    prefix = f"t-{secrets.token_hex(3)}"
    vip = f"{prefix}-vip"
    docker_engine.networks.create(vip, driver="bridge", labels=docker_cleanup, ipam=docker.types.IPAMConfig(
        pool_configs=[docker.types.IPAMPool(subnet="198.18.251.0/30")]))
    files = {
        "reconciler.yaml": "format: 1\nname: crash-attach\n",
        "inventory.yaml": (f"vars:\n  image: {busybox_image}\ngroups:\n  controllers:\n    services: [lb]\n"
                           f"nodes:\n  {prefix}-ctl1:\n    groups: [controllers]\n"),
        "services/lb/service.yaml": LB.replace("NETS", f"{prefix}-mgmt"),
        "services/lb/templates/index.html.j2": "lb on {{ node }}\n",
    }
    dep = small_deployment(tmp_path, merge_key, files, "lb on the management network")
    cfg = AgentConfig(node=f"{prefix}-ctl1", remote=dep.url, state_dir=tmp_path / "nodes" / f"{prefix}-ctl1",
                      trust=TrustConfig(allowed_signers=merge_key.allowed_signers), note_key=note_key(f"{prefix}-ctl1"))
    s = Site(dep, docker_engine, Node(dep, cfg, {}), f"{prefix}-mgmt", vip, busybox_image, docker_cleanup)
    s.hold()
    assert getattr(s.node.run(), "exit_code", None) == 0
    assert s.listed() == ("running", {s.mgmt})
    yield s
    DockerDriver(cfg.state_dir / "docker", cfg.node, client=docker_engine).remove("lb")


def test_killed_at_every_side_effect_of_a_refused_attach_the_next_run_leaves_it_off(site: Site,
                                                                                    tmp_path: Path) -> None:
    node = site.node
    refused = site.commit(on_vip=True)
    points = count_points(node, None, tmp_path / "refused.log")
    kinds = [p.split()[1] for p in points]
    first = kinds.index("connect") + 1
    path = list(range(first, kinds.index("rename", first) + 2))  # to the record put back
    # the engine kept the refused network listed, with no endpoint: off it only stopped
    assert [kinds[n - 1] for n in path] == ["connect", "disconnect", "stop", "disconnect", "start", "rename"], points
    site.assert_off(refused)
    stopped = []  # the kill points that left the container stopped (the supervisor's case)
    for n in path:
        what = f"killed before side effect {n} of {len(points)} ({points[n - 1]})"
        try:
            site.commit(on_vip=False)
            node.run()
            assert site.listed() == ("running", {site.mgmt})
            commit = site.commit(on_vip=True)
            kill_at(node, None, n, points, tmp_path / "killed.log")
            status, nets = site.listed()
            if status != "running":  # between the stop and the start
                stopped.append(points[n - 1])
                site.free()
                site.revive()
                assert site.listed() == ("running", {site.mgmt}), "revived onto the network it failed to join"
                site.hold()
            node.run()
            site.assert_off(commit)
        except AssertionError as exc:
            raise AssertionError(f"{what}: {exc}") from exc
    assert [p.split()[1] for p in stopped] == ["disconnect", "start"], stopped
    # The address freed, the next commit joins the network.
    site.free()
    joined = site.commit(on_vip=True)
    node.run()
    assert (site.deployment.note(node.cfg.node, joined) or {}).get("state") == "applied"
    assert site.listed() == ("running", {site.mgmt, site.vip})
