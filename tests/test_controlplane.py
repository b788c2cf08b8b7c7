"""Releases, isolation and cutover as data: who sees whom, who is on the VIP network, in which
order a commit moves it, and what `validate`, `diff` and `status --fleet` say about it. No
engine here (tests/test_cutover.py runs it on Docker)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import SigningKey, git, small_deployment

from reconciler.fleet.notes import Note
from reconciler.fleet.rollout import FleetView, Rollout, Verdict, decide
from reconciler.render.node import render_node
from reconciler.repo.definitions import DeploymentRepo
from reconciler.repo.load import load_repo
from reconciler.repo.planes import Mode
from reconciler.repo.tree import DirTree

LB = """\
driver: docker
runtime:
  image: lb:1
  networks: [internal, {name: vip, aliases: [api]}]
files:
  - {path: lb.conf, template: lb.conf.j2}
"""
KEEPALIVED = "driver: docker\nruntime:\n  image: keepalived:1\n  networks: [vip]\n"
CONF = "vip = {{ vip_address }}\nrelease = {{ pending_release or release }}\n" \
       "peers = {{ groups.controllers | join(',') }}\nmine = {{ hostvars | list | join(',') }}\n"


def files(ctl4: str = "", extra: str = "") -> dict[str, str]:
    return {
        "reconciler.yaml": "format: 1\nname: cp\nvip:\n  networks: [vip]\n  services: [keepalived]\n",
        "inventory.yaml": ("release: A\nvars: {vip_address: 192.0.2.10}\n"
                           "groups:\n  controllers:\n    services: [lb, keepalived]\n  computes:\n    services: [nova]\n"
                           "nodes:\n" + "".join(f"  ctl{i}: {{groups: [controllers]}}\n" for i in (1, 2, 3))
                           + "  cmp1: {groups: [computes]}\n" + (f"  ctl4: {{groups: [controllers], {ctl4}}}\n"
                                                                 if ctl4 else "") + extra),
        "services/lb/service.yaml": LB,
        "services/lb/templates/lb.conf.j2": CONF,
        "services/keepalived/service.yaml": KEEPALIVED,
        "services/nova/service.yaml": "driver: docker\nruntime:\n  image: nova:1\n",
    }


def repo(tmp_path: Path, ctl4: str = "", extra: str = "") -> DeploymentRepo:
    root = tmp_path / f"r{len(list(tmp_path.iterdir()))}"
    for rel, text in files(ctl4, extra).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return load_repo(DirTree(root))


def lb(r: DeploymentRepo, node: str) -> tuple[tuple[str, ...], str]:
    svc = render_node(r, node, "x").by_name()["lb"]
    return svc.runtime.networks, svc.files[0].content.decode()


def test_one_release_everyone_sees_everyone_and_is_attached(tmp_path: Path) -> None:
    r = repo(tmp_path)
    assert not r.planes.active
    assert all(r.planes[n].attached for n in r.nodes)
    assert r.services_of("ctl1") == ("keepalived", "lb")
    networks, conf = lb(r, "ctl1")
    assert networks == ("internal", "vip") and "peers = ctl1,ctl2,ctl3\n" in conf


def test_a_pending_release_isolates_the_new_node_both_ways(tmp_path: Path) -> None:
    before = repo(tmp_path)
    r = repo(tmp_path, "pending_release: B")
    p = r.planes["ctl4"]
    assert (p.mode, p.derived, p.attached, p.plane) == (Mode.ISOLATED, True, False, "B")
    networks, conf = lb(r, "ctl4")
    assert networks == ("internal",)  # off the VIP network...
    assert "vip = 192.0.2.10\n" in conf and "release = B\n" in conf  # ...with the same VIP in its config
    assert "peers = ctl4\n" in conf and "mine = ctl4\n" in conf  # its own release only
    assert r.services_of("ctl4") == ("lb",)  # the VIP holder is not run there
    # The old plane's render does not change because a new node was added beside it.
    assert render_node(r, "ctl1", "x").by_name()["lb"].hash == render_node(before, "ctl1", "x").by_name()["lb"].hash
    # Isolated by hand: the same, without a pending release.
    by_hand = repo(tmp_path, "release: B, mode: isolated").planes["ctl4"]
    assert (by_hand.mode, by_hand.derived, by_hand.attached) == (Mode.ISOLATED, False, False)


def test_cutover_moves_the_vip_and_the_order_is_detach_then_attach(tmp_path: Path) -> None:
    isolated = repo(tmp_path, "pending_release: B")
    cut = repo(tmp_path, "pending_release: B, mode: cutover")
    assert cut.planes["ctl4"].attached and not cut.planes["ctl1"].attached
    assert cut.planes["cmp1"].attached and not cut.planes["cmp1"].split  # another group, no cutover there
    assert lb(cut, "ctl1")[0] == ("internal",) and cut.services_of("ctl1") == ("lb",)
    assert "peers = ctl1,ctl2,ctl3\n" in lb(cut, "ctl1")[1]  # the old plane still sees only itself
    assert "peers = ctl4\n" in lb(cut, "ctl4")[1]
    from reconciler.repo.cutover import order

    assert order(isolated, cut, cut.nodes) == (("ctl1", "ctl2", "ctl3"), ("ctl4",))
    assert order(cut, isolated, cut.nodes) == (("ctl4",), ("ctl1", "ctl2", "ctl3"))  # the revert
    # An aborted cutover places its nodes as isolated again: the old plane back on.
    from dataclasses import replace

    aborted = replace(cut, cutover_aborted=True)
    assert aborted.planes["ctl1"].attached and not aborted.planes["ctl4"].attached


def test_the_attaching_node_waits_for_every_node_off_the_vip_to_note_it(tmp_path: Path) -> None:
    cut = repo(tmp_path, "pending_release: B, mode: cutover")
    p = cut.planes

    def view(**states: tuple[str, str]) -> FleetView:
        return FleetView({n: (Note(n, "C", s, vip=v),) for n, (s, v) in states.items()})

    def gate(node: str, before: bool | None, fleet: FleetView) -> Verdict:
        """What the agent asks: the nodes to wait for when it joins the VIP networks here."""
        off = p.off(node) if p.attaches(node, before) else ()
        return decide(Rollout(), node, "C", fleet, 0.0, off_first=off)

    assert gate("ctl1", True, view()).go  # it detaches: no wait
    assert gate("ctl4", True, view()).go  # attached already (not coming from isolation)
    waiting = gate("ctl4", False, view(ctl1=("applied", "detached")))
    assert not waiting.go and waiting.waiting_for == ("ctl2", "ctl3")
    assert waiting.reason == "cutover: waiting for ctl2, ctl3 to leave the VIP networks"
    # A note that says applied but still attached (an aborted cutover) is no go either.
    still = view(ctl1=("applied", "detached"), ctl2=("applied", "detached"), ctl3=("applied", "attached"))
    assert gate("ctl4", False, still).waiting_for == ("ctl3",)
    done = view(ctl1=("applied", "detached"), ctl2=("applied", "detached"), ctl3=("applied", "detached"))
    assert gate("ctl4", False, done).go
    assert gate("ctl4", False, view(ctl1=("failed", "attached"))).halted


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reconciler", *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ))


def test_validate_refuses_two_releases_on_one_vip_network(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    for rel, text in files("pending_release: B, mode: normal").items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    proc = cli("validate", "--repo", str(root))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    said = proc.stdout + proc.stderr
    assert "inventory.yaml:" in said and "VIP network 'vip' would be attached to two releases at once " \
        "(release A: ctl1, ctl2, ctl3; release B: ctl4)" in said
    assert "Traceback" not in said


def test_diff_and_status_show_the_cutover(tmp_path: Path, merge_key: SigningKey) -> None:
    dep = small_deployment(tmp_path, merge_key, files("pending_release: B"), "ctl4 isolated")
    before = git("rev-parse", "HEAD", cwd=dep.work)
    dep.write("inventory.yaml", files("pending_release: B, mode: cutover")["inventory.yaml"])
    after = dep.commit("cut over")
    proc = cli("diff", "--repo", str(dep.work), before, after, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    assert data["cutover"] == [
        {"step": "detach", "nodes": {n: ["keepalived", "lb"] for n in ("ctl1", "ctl2", "ctl3")}, "releases": ["A"], "after": []},
        {"step": "attach", "nodes": {"ctl4": ["keepalived", "lb"]}, "releases": ["B"], "after": ["ctl1", "ctl2", "ctl3"]},
    ]
    actions = {n["node"]: {a["service"]: a["action"] for a in n["actions"]} for n in data["nodes"]}
    assert actions["ctl1"] == {"keepalived": "stop", "lb": "connect"} and actions["ctl4"] == {
        "keepalived": "start", "lb": "connect"}
    assert actions["cmp1"] == {}
    text = cli("diff", "--repo", str(dep.work), before, after)
    assert "1. detach ctl1 (keepalived, lb); ctl2 (keepalived, lb); ctl3 (keepalived, lb): release A" in text.stdout
    assert "2. attach ctl4 (keepalived, lb): release B, once ctl1, ctl2, ctl3 noted the commit applied and detached" in text.stdout
    md = cli("diff", "--repo", str(dep.work), before, after, "-o", "markdown")
    assert "#### Cutover of the VIP networks" in md.stdout

    status = cli("status", "--fleet", "--repo", str(dep.work), "--remote", dep.url, "-o", "json")
    assert status.returncode in (0, 1), status.stderr
    nodes = {n["node"]: n for n in json.loads(status.stdout)["nodes"]}
    assert (nodes["ctl4"]["release"], nodes["ctl4"]["pending_release"], nodes["ctl4"]["plane"]) == ("A", "B", "cutover")
    assert (nodes["ctl1"]["release"], nodes["ctl1"]["pending_release"], nodes["ctl1"]["plane"]) == ("A", "", "detached")
    assert "plane" not in nodes["cmp1"]


def test_an_unknown_node_of_a_repo_with_vip_services_is_named_not_a_key_error(tmp_path: Path) -> None:
    import pytest

    from reconciler.core.errors import UnknownNode

    with pytest.raises(UnknownNode, match="node 'nope' is not in the inventory"):
        repo(tmp_path).services_of("nope")
