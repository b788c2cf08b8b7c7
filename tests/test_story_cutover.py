"""The parallel control plane as an operator runs it, with the VIP network named the way every
other runtime field is written: through a variable (``networks: [mgmt, "{{ vip_net }}"]``).

`validate` checks what each node's services render to, not the names as written: a repo whose
variable renders to the VIP network passes, `render --node` and `diff` show it, and the agent
puts the live plane's container on it; a variable that renders to no VIP network, or to one
network for two releases at once, is refused naming the nodes. And a `docker network connect`
the engine refuses (no free address on the network) leaves no entry behind that a plain
`docker restart` would join.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import docker
import pytest
from conftest import SigningKey, small_deployment

from reconciler.agent import Agent

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
