"""Reviewers see, per node, what a commit will do; the node's note carries the same plan hash.
Escalation: an action that fails or times out climbs the ladder, each step in the note."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from conftest import Deployment, SigningKey, git, small_deployment

from reconciler.agent import Agent


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reconciler", *args], capture_output=True, text=True)


def test_diff_predicts_each_nodes_plan_and_the_note_carries_the_same_hash(
    deployment: Deployment, agents: Callable[..., Agent]
) -> None:
    ctl1, cmp1 = agents("ctl1", deployment.url), agents("cmp1", deployment.url)
    for node in (ctl1, cmp1):
        assert node.reconcile_once().exit_code == 0
    c1 = git("rev-parse", "HEAD", cwd=deployment.work)
    deployment.edit("inventory.yaml", "token_ttl: 3600", "token_ttl: 600")
    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    c2 = deployment.commit("shorter tokens, kvm")

    proc = cli("diff", "--repo", str(deployment.work), c1, c2, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    review = json.loads(proc.stdout)
    by_node = {n["node"]: n for n in review["nodes"]}
    assert review["summary"] == {"reload": {"nodes": 3, "services": 3}, "restart": {"nodes": 2, "services": 2}}
    assert [(a["service"], a["action"], a["reason"]) for a in by_node["ctl1"]["actions"]] == [
        ("identity", "reload", "only [token] ttl changed in identity.conf")]
    assert [(a["service"], a["action"]) for a in by_node["cmp2"]["actions"]] == [("compute-agent", "restart")]
    assert "-ttl = 3600\n+ttl = 600\n" in by_node["ctl1"]["files"][0]["diff"]

    for node in (ctl1, cmp1):
        result = node.reconcile_once()
        assert result.exit_code == 0
        note = deployment.note(node.cfg.node, c2)
        assert note is not None and note["plan_hash"] == by_node[node.cfg.node]["plan_hash"]

    md = cli("diff", "--repo", str(deployment.work), c1, c2, "-o", "markdown").stdout
    assert "| reload | 3 | 3 |" in md and "<summary><b>cmp1</b>: restart compute-agent" in md
    human = cli("diff", "--repo", str(deployment.work), c1, c2, "--node", "ctl2")
    assert "only [token] ttl changed in identity.conf" in human.stdout
    assert "summary: 1 node reload (1 service); 0 of 1 nodes unchanged" in human.stdout


def test_an_unknown_action_in_a_rule_is_a_located_error(deployment: Deployment) -> None:
    deployment.edit("services/db/service.yaml", "action: reload", "action: bounce")
    proc = cli("validate", "--repo", str(deployment.work))
    assert proc.returncode == 2
    line = proc.stderr.strip().splitlines()[0]
    assert line.startswith("services/db/service.yaml:") and "'bounce' is not one of" in line, line


SLOW = """\
import os, pathlib, signal, time
def load(*_):
    pathlib.Path(".state").write_text(pathlib.Path("value.txt").read_text())
def slow_reload(*_):
    time.sleep(float(os.environ.get("RELOAD_DELAY", "0")))
    load()
signal.signal(signal.SIGHUP, slow_reload)
load()
while True:
    time.sleep(1)
"""


def one_service_repo(tmp_path: Path, key: SigningKey, service_yaml: str) -> Deployment:
    files = {
        "reconciler.yaml": "format: 1\nname: esc\n",
        "inventory.yaml": "vars: {value: one}\ngroups:\n  g: {services: [svc]}\nnodes:\n  n1: {groups: [g]}\n",
        "services/svc/service.yaml": service_yaml,
        "services/svc/files/svc.py": SLOW,
        "services/svc/templates/value.txt.j2": "{{ value }}\n",
    }
    return small_deployment(tmp_path, key, files, "one service")


SERVICE = """\
runtime:
  command: [python3, svc.py]
  env: {{RELOAD_DELAY: "{delay}"}}
files:
  - {{path: svc.py, source: svc.py}}
  - {{path: value.txt, template: value.txt.j2}}
reload: {reload}
on_change:
  - {{file: value.txt, action: reload}}
health:
  command: "cmp -s value.txt .state"
  timeout: 2
"""


def test_a_failing_reload_escalates_to_a_restart(tmp_path: Path, merge_key: SigningKey,
                                                 agents: Callable[..., Agent]) -> None:
    dep = one_service_repo(tmp_path, merge_key, SERVICE.format(delay=0, reload='{command: "exit 3"}'))
    node = agents("n1", dep.url)
    assert node.reconcile_once().exit_code == 0
    dep.edit("inventory.yaml", "value: one", "value: two")
    dep.commit("two")
    result = node.reconcile_once()
    assert result.exit_code == 0
    [svc] = result.report.services  # type: ignore[union-attr]
    assert str(svc.action) == "restart" and svc.steps[-1] == "restart: ok"
    assert svc.steps[0].startswith("reload: failed: service svc: reload command failed")
    note = dep.note("n1") or {}
    assert note["services"]["svc"]["steps"] == list(svc.steps)  # type: ignore[index]


def test_a_reload_that_times_out_escalates_to_a_restart(tmp_path: Path, merge_key: SigningKey,
                                                        agents: Callable[..., Agent]) -> None:
    dep = one_service_repo(tmp_path, merge_key, SERVICE.format(delay=30, reload="{signal: SIGHUP}"))
    node = agents("n1", dep.url)
    assert node.reconcile_once().exit_code == 0
    dep.edit("inventory.yaml", "value: one", "value: two")
    dep.commit("two")
    result = node.reconcile_once()
    assert result.exit_code == 0
    [svc] = result.report.services  # type: ignore[union-attr]
    assert [s.split(":")[0] for s in svc.steps] == ["reload", "restart"]
    assert "not healthy after 2s" in svc.steps[0] and svc.steps[1] == "restart: ok"
    assert str(svc.action) == "restart"
