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
    # The summary, most disruptive first; then per service the nodes that change alike, once.
    assert md.index("| restart | 2 | 2 |") < md.index("| reload | 3 | 3 |")
    assert "- **identity** on group controllers (3): **reload**, `identity.conf` (+1 -1): " \
           "only \\[token\\] ttl changed in identity.conf" in md  # escaped: the key is the repo's text
    assert "- **compute-agent** on group computes (2): **restart**" in md
    assert md.index("#### Per service") < md.index("#### Details") < md.index("<details><summary>identity")
    assert md.count("<details>") == 2 and "The diff shown is ctl1's; the others change the same lines." in md
    human = cli("diff", "--repo", str(deployment.work), c1, c2, "--node", "ctl2")
    assert "only [token] ttl changed in identity.conf" in human.stdout
    assert "summary: 1 node reload (1 service); 0 of 1 nodes unchanged" in human.stdout


def test_diff_exit_code_says_whether_anything_changes(deployment: Deployment) -> None:
    c1 = git("rev-parse", "HEAD", cwd=deployment.work)
    deployment.write("NOTES.txt", "not read by any node\n")
    c2 = deployment.commit("a file no node renders")
    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    c3 = deployment.commit("kvm")

    same = cli("diff", "--repo", str(deployment.work), c1, c2, "--exit-code")
    assert same.returncode == 0, same.stderr
    assert "no node changes" in same.stdout
    changed = cli("diff", "--repo", str(deployment.work), c2, c3, "--exit-code", "-o", "json")
    assert changed.returncode == 1, changed.stderr
    assert json.loads(changed.stdout)["summary"] == {"restart": {"nodes": 2, "services": 2}}
    assert cli("diff", "--repo", str(deployment.work), c2, c3).returncode == 0  # without the flag: 0
    bad = cli("diff", "--repo", str(deployment.work), c2, c3, "--max-bytes", "20000")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --max-bytes, --artifact-url and --report-file go"), \
        bad.stderr


def long_files(deployment: Deployment) -> str:
    """A commit that gives each controller 600 new lines of its own: no two nodes change alike."""
    deployment.write("services/identity/templates/identity.conf.j2",
                     deployment.read("services/identity/templates/identity.conf.j2")
                     + "[extra]\n{% for i in range(600) %}line{{ i }} = {{ port_base + i }}\n{% endfor %}")
    return deployment.commit("long files")


def test_a_huge_diff_is_cut_to_the_limit_with_a_link_and_the_full_report_is_written(
    deployment: Deployment, tmp_path: Path
) -> None:
    c1 = git("rev-parse", "HEAD", cwd=deployment.work)
    c2 = long_files(deployment)
    full_file = tmp_path / "full.md"
    proc = cli("diff", "--repo", str(deployment.work), c1, c2, "-o", "markdown", "--max-bytes", "20000",
               "--artifact-url", "https://ci.example.org/run/7/diff.md", "--report-file", str(full_file))
    assert proc.returncode == 0, proc.stderr
    comment, full = proc.stdout, full_file.read_text()
    assert len(full.encode()) > 30000 and "Cut to fit" not in full
    assert len(comment.encode()) <= 20000
    assert comment.rstrip().endswith("sections left out; the full report is at https://ci.example.org/run/7/diff.md")
    assert "| 3 | 3 |" in comment and "- **identity** on ctl1: " in comment  # the summary survives
    assert "<details><summary>identity on ctl1" in comment  # a first folded diff fits, the others do not
    assert "<details><summary>identity on ctl3" not in comment and "<details><summary>identity on ctl3" in full
    assert comment.count("<details>") == comment.count("</details>")  # cut between sections, never inside one
    assert full.startswith(comment.split("\n\n**Cut to fit")[0])


def test_an_unknown_action_in_a_rule_is_a_located_error(deployment: Deployment) -> None:
    deployment.edit("services/db/service.yaml", "action: reload", "action: bounce")
    proc = cli("validate", "--repo", str(deployment.work))
    assert proc.returncode == 2
    line = proc.stderr.strip().splitlines()[0]
    assert line.startswith("services/db/service.yaml:") and "'bounce' is not one of" in line, line


def test_diff_names_the_commit_that_is_broken(deployment: Deployment) -> None:
    good = git("rev-parse", "HEAD", cwd=deployment.work)
    deployment.edit("inventory.yaml", "token_ttl: 3600", "token_ttl: [3600")
    unparsable = deployment.commit("a typo in the inventory")
    deployment.edit("inventory.yaml", "token_ttl: [3600", "token_ttl: 3600")
    deployment.edit("services/identity/templates/identity.conf.j2", "{{ token_ttl }}", "{{ token_ttl | nofilter }}")
    unrenderable = deployment.commit("the typo mended, another made in a template")
    deployment.edit("services/identity/templates/identity.conf.j2", "{{ token_ttl | nofilter }}", "{{ token_ttl }}")
    mended = deployment.commit("the template mended")

    # Either side may be the broken one; the error says which, as git names a file in a commit.
    for a, b, broken, where in ((good, unparsable, unparsable, "inventory.yaml:"),
                                (unparsable, mended, unparsable, "inventory.yaml:"),
                                (good, unrenderable, unrenderable, "services/identity/templates/identity.conf.j2:"),
                                (unrenderable, mended, unrenderable, "services/identity/templates/identity.conf.j2:")):
        proc = cli("diff", "--repo", str(deployment.work), a, b, "--jobs", "1")
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        assert proc.stderr.startswith(f"error: {broken[:12]}:{where}"), proc.stderr
        assert proc.stderr.count("\n") == 1


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
