"""The parallel control plane as an operator runs it, with the VIP network named the way every
other runtime field is written: through a variable (``networks: [mgmt, "{{ vip_net }}"]``).

`validate` checks what each node's services render to, not the names as written: a repo whose
variable renders to the VIP network passes, `render --node` and `diff` show it, and the agent
puts the live plane's container on it; a variable that renders to no VIP network, or to one
network for two releases at once, is refused naming the nodes. And a `docker network connect`
the engine refuses (no free address on the network) leaves no entry behind that a plain
`docker restart` would join: off it again, never started onto it, and what is true said (a
container the engine will not start again is said to be stopped); the same in a restart or a
reload that moves networks, which puts back files and record too; a leftover of a run killed
before it took it off is left before anything is joined.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import docker
import pytest
from conftest import SigningKey, note_key, small_deployment
from test_crash_points import Node, in_child
from test_secrets import SOPS
from test_sops_real import age_key

from reconciler.agent import Agent
from reconciler.core import faults
from reconciler.settings import AgentConfig, TrustConfig

LB = """\
driver: docker
runtime:
  image: "{{ image }}"
  command: [httpd, -f, -p, "8080", -h, /etc/lb]
  networks: [MGMT, "{{ vip_net }}"]
files:
  - {path: index.html, template: index.html.j2}
"""


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reconciler", *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ))


def inventory(prefix: str, vip_net: str, new: str = "", image: str = "busybox") -> str:
    return (f"release: A\nvars:\n  image: {image}\n  vip_net: {vip_net}\n"
            "groups:\n  controllers:\n    services: [lb]\n"
            f"nodes:\n  {prefix}-ctl1:\n    groups: [controllers]\n{new}")


def new_controller(prefix: str, mode: str = "", vip_net: str = "") -> str:
    return (f"  {prefix}-ctl2:\n    groups: [controllers]\n    pending_release: B\n"
            + (f"    mode: {mode}\n" if mode else "") + (f"    vars: {{vip_net: {vip_net}}}\n" if vip_net else ""))


def repo_files(prefix: str, vip_nets: str, inv: str) -> dict[str, str]:
    return {
        "reconciler.yaml": f"format: 1\nname: story\nvip:\n  networks: [{vip_nets}]\n",
        "inventory.yaml": inv,
        "services/lb/service.yaml": LB.replace("MGMT", f"{prefix}-mgmt"),
        "services/lb/templates/index.html.j2": "lb of release {{ pending_release or release }} on {{ node }}\n",
    }


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def on(client: docker.DockerClient, container: str) -> set[str]:
    """The networks the engine lists for the container (what a restart would join)."""
    c = client.containers.get(container)
    return set(c.attrs["NetworkSettings"]["Networks"] or {})


@pytest.mark.usefixtures("docker_cleanup")
def test_cutover_with_a_templated_vip_network(tmp_path: Path, merge_key: SigningKey,
                                              agents: Callable[..., Agent], docker_engine: docker.DockerClient,
                                              busybox_image: str) -> None:
    prefix = f"t-{secrets.token_hex(3)}"
    vip, mgmt = f"{prefix}-vip", f"{prefix}-mgmt"
    old, new = f"{prefix}-ctl1", f"{prefix}-ctl2"
    dep = small_deployment(tmp_path, merge_key, repo_files(prefix, vip, inventory(
        prefix, vip, new_controller(prefix), busybox_image)), "ctl2 built beside, isolated")
    before = dep.commit("nothing", push=False)

    checked = cli("validate", "--repo", str(dep.work))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    shown = cli("render", "--repo", str(dep.work), "--node", old, "--node", new, "-o", "json")
    assert shown.returncode == 0, shown.stderr
    nets = {d["node"]: d["services"][0]["runtime"]["networks"] for d in json.loads(shown.stdout)}
    assert nets == {old: [mgmt, vip], new: [mgmt]}  # the isolated plane renders no VIP network

    node = {n: agents(n, dep.url) for n in (old, new)}
    for n in (new, old):  # the old plane attaches once the isolated one noted it is off the network
        result = node[n].reconcile_once()
        assert result.exit_code == 0 and result.report is not None and result.report.state == "applied", result
    assert on(docker_engine, f"rc-{old}-lb") == {mgmt, vip}
    assert on(docker_engine, f"rc-{new}-lb") == {mgmt}

    # The cutover: reviewed with `diff`, the old plane leaves the VIP network, then the new joins.
    dep.write("inventory.yaml", inventory(prefix, vip, new_controller(prefix, "cutover"), busybox_image))
    cut = dep.commit("cut over to release B")
    review = cli("diff", "--repo", str(dep.work), before, cut)
    assert review.returncode == 0, review.stderr
    assert f"1. detach {old} (lb): release A" in review.stdout
    assert f"2. attach {new} (lb): release B, once {old} noted" in review.stdout
    assert node[new].reconcile_once().waiting.startswith(f"cutover: waiting for {old}")
    assert node[old].reconcile_once().exit_code == 0
    assert on(docker_engine, f"rc-{old}-lb") == {mgmt}
    assert node[new].reconcile_once().exit_code == 0
    assert on(docker_engine, f"rc-{new}-lb") == {mgmt, vip}


def test_a_templated_name_that_renders_to_no_vip_network_is_refused_naming_the_node(tmp_path: Path) -> None:
    root = write(tmp_path / "repo", repo_files("p", "vipnet", inventory("p", "vipnte")))
    proc = cli("validate", "--repo", str(root))
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2, said
    assert "reconciler.yaml: vip.networks: no service names network 'vipnet' " \
           "(on node p-ctl1, lb's networks render to 'p-mgmt', 'vipnte')" in said, said
    assert "Traceback" not in said


def test_a_name_that_renders_per_node_is_checked_per_node(tmp_path: Path) -> None:
    # Each plane on its own VIP network, the name a node's variable: two releases attached at
    # once, each to its own network, is no conflict.
    apart = inventory("p", "vip-a", new_controller("p", "normal", vip_net="vip-b"))
    root = write(tmp_path / "apart", repo_files("p", "vip-a, vip-b", apart))
    proc = cli("validate", "--repo", str(root))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The same variable rendering one network for both releases is refused, as a name written
    # out would be.
    both = inventory("p", "vip-a", new_controller("p", "normal", vip_net="vip-a"))
    root = write(tmp_path / "both", repo_files("p", "vip-a, vip-b", both))
    proc = cli("validate", "--repo", str(root))
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2, said
    assert "inventory.yaml:" in said and "VIP network 'vip-a' would be attached to two releases at once " \
        "(release A: p-ctl1; release B: p-ctl2)" in said, said
    assert "Traceback" not in said


def sealed(scratch: Path, plain: str, recipient: str) -> str:
    """``plain`` as the real ``sops`` encrypts it to ``recipient``."""
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "file.yaml").write_text(plain)
    done = subprocess.run([SOPS or "sops", "--encrypt", "--in-place", "--age", recipient, "file.yaml"], cwd=scratch,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return (scratch / "file.yaml").read_text()


def test_a_nodes_secret_clash_is_one_problem_of_the_list_and_refuses_no_other_node(tmp_path: Path) -> None:
    # p-ctl1 can read two files that both define secrets.token: its own render fails. The VIP
    # check renders every node's network names, p-ctl1's first: that clash must not stop
    # `validate` at one error, nor p-ctl2 (whose files are fine) from rendering.
    _, mine = age_key(tmp_path, "ctl1")
    _, other = age_key(tmp_path, "ctl2")
    inv = (f"release: A\nvars:\n  image: busybox\n  vip_net: vipnet\ngroups:\n  controllers:\n    services: [lb]\n"
           f"nodes:\n  p-ctl1:\n    groups: [controllers]\n    vars: {{age_recipient: {mine}}}\n"
           f"  p-ctl2:\n    groups: [controllers]\n    vars: {{age_recipient: {other}}}\n")
    files = {**repo_files("p", "vipnet", inv),
             "secrets/one.yaml": sealed(tmp_path / "one", "token: t-one\n", mine),
             "secrets/two.yaml": sealed(tmp_path / "two", "token: t-two\n", f"{mine},{other}")}
    root = write(tmp_path / "repo", files)
    clash = "secrets.token is defined in secrets/one.yaml and secrets/two.yaml, both readable by this node"

    shown = cli("render", "--repo", str(root), "--node", "p-ctl2", "-o", "json")
    assert shown.returncode == 0, shown.stderr
    assert "p-ctl2" in shown.stdout

    # A second mistake, in p-ctl2's render: both said, each once.
    (root / "services/lb/templates/index.html.j2").write_text("{{ nosuch }}\n")
    proc = cli("validate", "--repo", str(root))
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2, said
    assert clash in said and "p-ctl1" in said, said
    assert "nosuch" in said, said
    assert "no service names network" not in said, said
    assert "Traceback" not in said, said


@pytest.mark.usefixtures("docker_cleanup")
def test_a_failed_attach_leaves_no_network_entry_a_restart_would_join(
        tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent], docker_engine: docker.DockerClient,
        busybox_image: str, docker_cleanup: dict[str, str]) -> None:
    prefix = f"t-{secrets.token_hex(3)}"
    vip, mgmt = f"{prefix}-vip", f"{prefix}-mgmt"
    ctl = f"{prefix}-ctl1"
    # The VIP network as the site made it: one free address, which another host's container holds.
    tiny = docker_engine.networks.create(vip, driver="bridge", labels=docker_cleanup, ipam=docker.types.IPAMConfig(
        pool_configs=[docker.types.IPAMPool(subnet="198.18.250.0/30")]))
    holder = docker_engine.containers.run(busybox_image, ["sleep", "600"], network=vip, detach=True,
                                          labels=docker_cleanup)
    files = repo_files(prefix, vip, inventory(prefix, vip, image=busybox_image))
    templated = files["services/lb/service.yaml"]
    files["services/lb/service.yaml"] = templated.replace(', "{{ vip_net }}"', "")
    vip_settings, files["reconciler.yaml"] = files["reconciler.yaml"], "format: 1\nname: story\n"
    dep = small_deployment(tmp_path, merge_key, files, "lb on the management network")
    agent = agents(ctl, dep.url)
    assert agent.reconcile_once().exit_code == 0
    assert on(docker_engine, f"rc-{ctl}-lb") == {mgmt}

    dep.write("services/lb/service.yaml", templated)
    dep.write("reconciler.yaml", vip_settings)
    dep.commit("lb onto the VIP network")
    failed = agent.reconcile_once()
    assert failed.exit_code == 1 and failed.report is not None and failed.report.state == "failed"
    assert "no available IPv4 addresses" in failed.report.error, failed.report.error
    record = json.loads((tmp_path / "nodes" / ctl / "docker" / "lb" / "record.json").read_text())
    assert record["networks"] == [mgmt]
    assert on(docker_engine, f"rc-{ctl}-lb") == {mgmt}, "the engine still lists the network it failed to join"

    # The address freed, a plain restart of the container joins nothing the agent did not.
    holder.remove(force=True)
    docker_engine.containers.get(f"rc-{ctl}-lb").restart(timeout=1)
    assert on(docker_engine, f"rc-{ctl}-lb") == {mgmt}
    tiny.reload()
    assert not tiny.attrs.get("Containers")


# A refused attach and what it leaves: the agent run as the crash tests run it (a forked child,
# killed at a numbered side effect, or held at one while the test changes the engine under it).

def tiny(client: docker.DockerClient, name: str, subnet: str, labels: dict[str, str]) -> None:
    """A network with one address for containers (a /30: the other is the gateway's)."""
    client.networks.create(name, driver="bridge", labels=labels, ipam=docker.types.IPAMConfig(
        pool_configs=[docker.types.IPAMPool(subnet=subnet)]))


def squat(client: docker.DockerClient, image: str, net: str, labels: dict[str, str]) -> None:
    """Another host's container on ``net``, holding its one address."""
    client.containers.run(image, ["sleep", "600"], network=net, detach=True, labels=labels, name=f"{net}-squatter")


def lb_node(tmp_path: Path, merge_key: SigningKey, prefix: str, image: str, extra: str = "") -> Node:
    """``{prefix}-ctl1`` running lb on the management network, applied."""
    files = repo_files(prefix, "", inventory(prefix, "", image=image))
    files["services/lb/service.yaml"] = files["services/lb/service.yaml"].replace(', "{{ vip_net }}"', "") + extra
    files["reconciler.yaml"] = "format: 1\nname: story\n"
    dep = small_deployment(tmp_path, merge_key, files, "lb on the management network")
    name = f"{prefix}-ctl1"
    node = Node(dep, AgentConfig(node=name, remote=dep.url, state_dir=tmp_path / "nodes" / name, note_key=note_key(name),
                                 trust=TrustConfig(allowed_signers=merge_key.allowed_signers)), {})
    assert getattr(node.run(), "exit_code", None) == 0
    return node


def onto(node: Node, vip: str, template: str = "") -> str:
    """A commit that puts lb onto ``vip`` too (and changes its page: ``template``)."""
    dep = node.deployment
    dep.write("services/lb/service.yaml", dep.read("services/lb/service.yaml").replace(
        f"networks: [{node.cfg.node.removesuffix('-ctl1')}-mgmt]",
        f"networks: [{node.cfg.node.removesuffix('-ctl1')}-mgmt, {vip}]"))
    if template:
        dep.write("services/lb/templates/index.html.j2", template)
    return dep.commit(f"lb onto {vip}")


def endpoints(client: docker.DockerClient, container: str) -> dict[str, str]:
    """Network -> the container's endpoint there ("" for one the engine lists with none)."""
    nets = client.containers.get(container).attrs["NetworkSettings"]["Networks"] or {}
    return {n: (e or {}).get("EndpointID") or "" for n, e in nets.items()}


@pytest.mark.usefixtures("docker_cleanup")
def test_networks_a_killed_run_left_listed_are_left_before_any_is_joined(
        tmp_path: Path, merge_key: SigningKey, docker_engine: docker.DockerClient, busybox_image: str,
        docker_cleanup: dict[str, str]) -> None:
    prefix = f"t-{secrets.token_hex(3)}"
    vip, old_vip, mgmt, lb = f"{prefix}-vip", f"{prefix}-oldvip", f"{prefix}-mgmt", f"rc-{prefix}-ctl1-lb"
    for net, subnet in ((vip, "198.18.252.0/30"), (old_vip, "198.18.252.4/30")):
        tiny(docker_engine, net, subnet, docker_cleanup)
        squat(docker_engine, busybox_image, net, docker_cleanup)
    node = lb_node(tmp_path, merge_key, prefix, busybox_image)
    commit = onto(node, vip)
    # Killed after the refused connect, before it took the leftover off: listed, no endpoint.
    status = in_child(node, None, {"RECONCILER_FAULT_AT": "disconnect"})
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    # and another refused connect's leftover, on a network lb is not to be on (the same entry)
    with pytest.raises(docker.errors.APIError, match="no available IPv4 addresses"):
        docker_engine.networks.get(old_vip).connect(lb)
    assert endpoints(docker_engine, lb) == {mgmt: endpoints(docker_engine, lb)[mgmt], vip: "", old_vip: ""}

    # The VIP's address freed, the next run joins it: the leftovers are no reason to fail, and
    # taking one off (a stop and a start) joins neither the other nor the VIP behind its back.
    docker_engine.containers.get(f"{vip}-squatter").remove(force=True)
    node.run()
    note = node.deployment.note(node.cfg.node, commit) or {}
    assert note.get("state") == "applied", note
    now = endpoints(docker_engine, lb)
    assert set(now) == {mgmt, vip} and all(now.values()), now
    assert docker_engine.containers.get(lb).status == "running"


@pytest.mark.usefixtures("docker_cleanup")
@pytest.mark.parametrize("action", ["restart", "reload"])
def test_a_refused_attach_in_a_restart_or_reload_puts_back_the_files_too(
        tmp_path: Path, merge_key: SigningKey, docker_engine: docker.DockerClient, busybox_image: str,
        docker_cleanup: dict[str, str], action: str) -> None:
    prefix = f"t-{secrets.token_hex(3)}"
    vip, mgmt, lb = f"{prefix}-vip", f"{prefix}-mgmt", f"rc-{prefix}-ctl1-lb"
    tiny(docker_engine, vip, "198.18.253.0/30", docker_cleanup)
    squat(docker_engine, busybox_image, vip, docker_cleanup)
    reload = "reload: {signal: SIGHUP}\non_change:\n  - {file: index.html, action: reload}\n"
    node = lb_node(tmp_path, merge_key, prefix, busybox_image, reload if action == "reload" else "")
    page = docker_engine.containers.get(lb).exec_run(["cat", "/etc/lb/index.html"]).output
    commit = onto(node, vip, "lb v2 on {{ node }}\n")

    result = node.run()
    report = getattr(result, "report", None)
    assert report is not None and report.state == "failed", result
    assert str(report.services[0].action) == action, report.services
    assert "no available IPv4 addresses" in report.error, report.error
    assert docker_engine.containers.get(lb).exec_run(["cat", "/etc/lb/index.html"]).output == page
    record = json.loads((node.cfg.state_dir / "docker" / "lb" / "record.json").read_text())
    assert record["networks"] == [mgmt] and record["commit"] != commit
    assert on(docker_engine, lb) == {mgmt} and docker_engine.containers.get(lb).status == "running"


@pytest.mark.usefixtures("docker_cleanup")
def test_a_container_the_engine_will_not_start_again_after_leaving_is_said_to_be_stopped(
        tmp_path: Path, merge_key: SigningKey, docker_engine: docker.DockerClient, busybox_image: str,
        docker_cleanup: dict[str, str]) -> None:
    prefix = f"t-{secrets.token_hex(3)}"
    vip, mgmt, lb = f"{prefix}-vip", f"{prefix}-mgmt", f"rc-{prefix}-ctl1-lb"
    tiny(docker_engine, vip, "198.18.254.0/30", docker_cleanup)
    squat(docker_engine, busybox_image, vip, docker_cleanup)
    tiny(docker_engine, mgmt, "198.18.255.0/30", docker_cleanup)  # lb holds its one address
    node = lb_node(tmp_path, merge_key, prefix, busybox_image)
    commit = onto(node, vip)
    # The run held at its side effects; while it has lb stopped to leave the refused network,
    # another container takes lb's address on the management network: lb cannot start again.
    fifo = tmp_path / "points"
    os.mkfifo(fifo)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.environ["RECONCILER_FAULT_LOG"] = str(fifo)
        faults.reset()
        code = 0
        try:
            node.run()
        except BaseException:
            code = 3
        os._exit(code)
    signal.signal(signal.SIGALRM, timed_out)
    signal.alarm(120)  # a child that never reaches the stop must not hang the test
    try:
        while True:
            with open(fifo) as points:  # the child's next side effect waits for this open
                if points.read().split()[1] == "stop":
                    break
        while docker_engine.containers.get(lb).status == "running":
            time.sleep(0.1)
        squat(docker_engine, busybox_image, mgmt, docker_cleanup)
        keep = os.open(fifo, os.O_RDWR)  # the rest of the run's side effects, unread
        _, status = os.waitpid(pid, 0)
        os.close(keep)
    finally:
        signal.alarm(0)
    assert status == 0, status
    note = node.deployment.note(node.cfg.node, commit) or {}
    said = json.dumps(note)
    assert note.get("state") == "failed", note
    assert "restarted to leave" not in said and f"{lb} stopped to leave {vip}" in said, said
    assert "not started" in said, said
    for c in docker_engine.containers.list(all=True, filters={"name": lb}):  # put back, or removed
        assert vip not in on(docker_engine, c.name), c.status


def timed_out(*_: object) -> None:
    raise TimeoutError("the agent's run did not reach the side effect waited for")
