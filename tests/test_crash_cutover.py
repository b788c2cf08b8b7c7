"""Kill the agent at every side effect of a cutover, on the real Docker engine, and check that
one more plain run finishes it (see test_crash_points.py for the method).

Two controllers, each running an lb container (one: the engine takes a third of a second to
move a container between networks, and a hundred passes run): ctl1 on release A, on the VIP network;
ctl2 added with ``pending_release: B``, isolated. The passes killed, at each numbered side
effect in turn (the docker driver's ``disconnect`` and ``connect`` among them):

- **detach**: a cutover commit; ctl1 leaves the VIP network (the same containers run on);
- **attach**: ctl2 joins it, once ctl1 noted the commit applied and detached;
- **watch**: ctl1 reads ctl2's applied note and notes the cutover done;
- **failed attach**: ctl2's lb fails its check on the VIP network: its networks are put back;
- **abort**: ctl1 reads ctl2's failure and goes back onto the VIP network.

After the plain run, from outside: the containers on the networks they should be on, the same
containers as before (nothing restarted, nothing run twice), no container or network left
over, the notes on the remote saying what happened, and a pass after that with nothing to do.

History, per kill point::

    ... --- cut #N (ctl2: mode cutover) --- revert #N          (cut and revert)
    ... --- cut again #N (ctl2's lb broken: aborted)           (abort)
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import pytest
from conftest import Deployment, SigningKey, git, small_deployment
from crash_fleet import kill_at, signing
from test_crash_points import Node, count_points

from reconciler.settings import AgentConfig, TrustConfig

pytestmark = pytest.mark.usefixtures("docker_cleanup")

SERVICES = ("lb",)


def service(name: str, net: str, health: str = "") -> str:
    return f"""\
driver: docker
runtime:
  image: "{{{{ image }}}}"
  command: [httpd, -f, -p, "8080", -h, /etc/{name}]
  networks: [{{name: {net}, aliases: [{name}]}}]
files:
  - {{path: index.html, template: index.html.j2}}
{health}"""


def inventory(prefix: str, image: str, mode: str = "") -> str:
    return (f"release: A\nvars:\n  image: {image}\n"
            "groups:\n  controllers:\n    services: [lb]\n"
            f"nodes:\n  {prefix}-ctl1:\n    groups: [controllers]\n"
            f"  {prefix}-ctl2:\n    groups: [controllers]\n    pending_release: B\n"
            + (f"    mode: {mode}\n" if mode else ""))


@dataclass
class Cloud:
    deployment: Deployment
    engine: docker.DockerClient
    image: str
    prefix: str
    net: str
    old: Node
    new: Node
    cuts: int = 0
    baseline: dict[str, tuple[str, str]] = field(default_factory=dict)

    def commit(self, mode: str, message: str) -> str:
        self.cuts += 1
        self.deployment.write("inventory.yaml", inventory(self.prefix, self.image, mode))
        return self.deployment.commit(f"{message} #{self.cuts}")

    def name(self, node: Node) -> str:
        return node.cfg.node

    def containers(self) -> dict[str, tuple[str, str]]:
        """Every container of the two nodes, by name: (id, started at). The same pair: not restarted."""
        out = {}
        for c in self.engine.containers.list(all=True, filters={"label": "reconciler.node"}):
            if c.labels["reconciler.node"].startswith(self.prefix):
                out[c.name] = (c.id, c.attrs["State"]["StartedAt"])
                assert c.status == "running", (c.name, c.status)
        return out

    def attached(self, node: Node) -> dict[str, list[str]]:
        """Service -> every network its container is on (the engine's default bridge when off the VIPs)."""
        out = {}
        for c in self.engine.containers.list(all=True, filters={"label": f"reconciler.node={node.cfg.node}"}):
            out[c.labels["reconciler.service"]] = sorted(c.attrs["NetworkSettings"]["Networks"] or {})
        return out

    def networks(self) -> list[str]:
        return sorted(n.name for n in self.engine.networks.list() if n.name.startswith(self.prefix))

    def note(self, node: Node, commit: str) -> dict[str, Any]:
        return self.deployment.note(node.cfg.node, commit) or {}

    def assert_placed(self, attached: Node | None) -> None:
        """``attached`` (None: neither) has its services on the VIP network, the other on the
        engine's default bridge alone;
        the same two containers as at the start, running, never restarted; nothing else of
        the two nodes on the engine, and no network but the VIP one."""
        for node in (self.old, self.new):
            want = [self.net] if node is attached else ["bridge"]
            assert self.attached(node) == dict.fromkeys(SERVICES, want), (node.cfg.node, self.attached(node))
        assert self.containers() == self.baseline, "a container was restarted, replaced or left over"
        assert self.networks() == [self.net], self.networks()
        for node in (self.old, self.new):
            leftovers = [p for p in node.cfg.state_dir.rglob("*") if p.name.startswith((".rc-tmp-", ".tmp-"))
                         and "mirror.git" not in p.parts]
            assert not leftovers, leftovers


def agent_of(dep: Deployment, node: str, tmp_path: Path, key: SigningKey, settings: dict[str, Any]) -> Node:
    cfg = AgentConfig(node=node, remote=dep.url, state_dir=tmp_path / "nodes" / node,
                      trust=TrustConfig(allowed_signers=key.allowed_signers), **settings)
    return Node(dep, cfg, {})


@pytest.fixture
def cloud(tmp_path: Path, merge_key: SigningKey, busybox_image: str, docker_engine: docker.DockerClient) -> Iterator[Cloud]:
    prefix = f"t-{secrets.token_hex(3)}"
    net = f"{prefix}-vip"
    files = {
        "reconciler.yaml": f"format: 1\nname: crash-cutover\nvip:\n  networks: [{net}]\n",
        "inventory.yaml": inventory(prefix, busybox_image),
        # Checked once, not held for the default half second: a kill test runs a hundred passes.
        "services/lb/service.yaml": service("lb", net, "health:\n  command: test ! -e /var/lib/lb/broken\n"
                                                      "  timeout: 0.5\n  min_healthy: 0\n"),
    }
    for name in SERVICES:
        files[f"services/{name}/templates/index.html.j2"] = f"{name} of {{{{ pending_release or release }}}}\n"
    old, new = f"{prefix}-ctl1", f"{prefix}-ctl2"
    trust_nodes, settings = signing([old, new])
    dep = small_deployment(tmp_path, merge_key, {**files, **trust_nodes}, "release A and an isolated B")
    c = Cloud(dep, docker_engine, busybox_image, prefix, net, agent_of(dep, old, tmp_path, merge_key, settings[old]),
              agent_of(dep, new, tmp_path, merge_key, settings[new]))
    for node in (c.new, c.old):  # the old plane waits for the new one to note it stays off
        result = node.run()
        assert getattr(result, "exit_code", None) == 0, result
    c.baseline = c.containers()
    c.assert_placed(attached=c.old)
    yield c




def quiet(node: Node) -> None:
    """A pass after recovery finds nothing to do: no action, no note."""
    again = node.run()
    assert getattr(again, "report", None) is None and getattr(again, "exit_code", 1) == 0, again


def killed_then_run(node: Node, n: int, points: list[str]) -> None:
    """The pass killed before its ``n``th side effect (when it has that many), then one plain pass."""
    if n <= len(points):
        kill_at(node, None, n, points, node.cfg.state_dir.parent / f"{node.cfg.node}-killed.log")
    node.run()


def point(n: int, points: list[str]) -> str:
    return f"killed before side effect {n} of {len(points)} ({points[n - 1]})" if n <= len(points) else "not killed"


def test_killed_at_every_side_effect_of_a_cutover_and_its_watch_the_next_run_finishes_it(
    cloud: Cloud, tmp_path: Path
) -> None:
    old, new = cloud.old, cloud.new
    cut = cloud.commit("cutover", "cut over to B")
    detach = count_points(old, None, tmp_path / "detach.log")
    attach = count_points(new, None, tmp_path / "attach.log")
    watch = count_points(old, None, tmp_path / "watch.log")
    assert [p.split()[1] for p in detach].count("disconnect") == 1, detach
    assert [p.split()[1] for p in attach].count("connect") == 1, attach
    assert any(p.split()[1] == "note" for p in watch), watch
    cloud.assert_placed(attached=new)
    revert(cloud, cut)
    for n in range(1, max(len(detach), len(attach), len(watch)) + 1):
        cut = cloud.commit("cutover", "cut over to B")
        try:
            killed_then_run(old, n, detach)
            cloud.assert_placed(attached=None)
            note = cloud.note(old, cut)
            assert note.get("state") == "applied" and note["plane"]["vip"] == "detached", note
            quiet(old)
        except AssertionError as exc:
            raise AssertionError(f"detach {point(n, detach)}: {exc}") from exc
        try:
            killed_then_run(new, n, attach)
            cloud.assert_placed(attached=new)
            note = cloud.note(new, cut)
            assert note.get("state") == "applied" and note["plane"]["vip"] == "attached", note
            quiet(new)
        except AssertionError as exc:
            raise AssertionError(f"attach {point(n, attach)}: {exc}") from exc
        try:
            killed_then_run(old, n, watch)
            note = cloud.note(old, cut)
            assert note.get("state") == "applied" and note["plane"] == {
                "release": "A", "mode": "normal", "vip": "detached"}, note  # watched to the end
            quiet(old)
            cloud.assert_placed(attached=new)
        except AssertionError as exc:
            raise AssertionError(f"watch {point(n, watch)}: {exc}") from exc
        revert(cloud, cut)


def revert(cloud: Cloud, cut: str) -> None:
    """git revert of the cutover: the new plane leaves, then the old one comes back (plain passes)."""
    git("revert", "--no-commit", cut, cwd=cloud.deployment.work)
    back = cloud.deployment.commit("revert the cutover")
    for node in (cloud.new, cloud.old):
        node.run()
        assert cloud.note(node, back).get("state") == "applied", cloud.note(node, back)
    cloud.assert_placed(attached=cloud.old)


def test_killed_at_every_side_effect_of_a_failed_attach_and_its_abort_the_next_run_finishes_it(
    cloud: Cloud, tmp_path: Path
) -> None:
    old, new = cloud.old, cloud.new
    broke = cloud.engine.containers.get(f"rc-{new.cfg.node}-lb").exec_run(["/bin/sh", "-c", "touch /var/lib/lb/broken"])
    assert broke.exit_code == 0, broke
    cut = cloud.commit("cutover", "cut over to B, whose lb is broken")
    old.run()
    cloud.assert_placed(attached=None)
    failing = count_points(new, None, tmp_path / "failing.log")
    abort = count_points(old, None, tmp_path / "abort.log")
    assert any(p.split()[1] == "connect" for p in failing) and any(p.split()[1] == "connect" for p in abort)
    assert aborted(cloud, cut), cloud.note(old, cut)
    unsaid = []  # kill points after which the note no longer says why the cutover was aborted
    for n in range(1, max(len(failing), len(abort)) + 1):
        cut = cloud.commit("cutover", "cut over to B again")
        old.run()
        cloud.assert_placed(attached=None)
        try:
            killed_then_run(new, n, failing)
            cloud.assert_placed(attached=None)
            note = cloud.note(new, cut)
            assert note.get("state") == "failed" and note["plane"]["vip"] == "detached", note
        except AssertionError as exc:
            raise AssertionError(f"failed attach {point(n, failing)}: {exc}") from exc
        try:
            killed_then_run(old, n, abort)
            if not aborted(cloud, cut):
                unsaid.append(point(n, abort))
        except AssertionError as exc:
            raise AssertionError(f"abort {point(n, abort)}: {exc}") from exc
    # the why is kept with the commit's record before the plane moves (node/peers.py cutover_watch)
    assert not unsaid, f"the note of an aborted cutover does not say why after a kill at: {'; '.join(unsaid)}"


def aborted(cloud: Cloud, cut: str) -> bool:
    """The old plane back on the VIP network, its note saying so; the new one stays off.
    Whether the note also says why (the event naming the node that failed)."""
    cloud.assert_placed(attached=cloud.old)
    note = cloud.note(cloud.old, cut)
    assert note.get("state") == "applied" and note["plane"] == {
        "release": "A", "mode": "normal", "vip": "attached", "aborted": True}, note
    assert cloud.note(cloud.new, cut).get("state") == "failed"
    quiet(cloud.old)
    again = cloud.new.run()  # a failed commit is not tried again
    report = getattr(again, "report", None)
    assert report is None or report.state == "failed", again
    cloud.assert_placed(attached=cloud.old)
    why = f"cutover aborted: {cloud.new.cfg.node} failed {cut[:12]}"
    return any(str(e).startswith(why) for e in note.get("events", []))
