"""A commit rolls out in waves through the nodes' notes; a failure stops everyone after it.

Waves used here: canary [ctl1] -> controllers [ctl2, ctl3] one at a time -> computes [cmp*].
Every node is its own agent with its own state dir; they share only the git remote.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

from clock import Clock
from conftest import NODES, Deployment, SigningKey, age_args, git

from reconciler.agent import Agent
from reconciler.fleet.rollout import WHOLE_READ_EVERY
from reconciler.node.operations import retry, rollback, unpin

ROLLOUT = """\
rollout:
  waves:
    - {name: canary, nodes: [ctl1]}
    - {name: controllers, group: controllers, batch: 1}
    - {name: computes, nodes: ["cmp*"], batch: "100%"}
"""


def forget_notes(agent: Agent) -> None:
    """Drop the other nodes' notes ``agent`` has fetched, to see what its next poll reads."""
    from reconciler.fleet.view import FLEET_PREFIX

    for ref in read_notes_of(agent):
        git("update-ref", "-d", f"{FLEET_PREFIX}{ref}", cwd=agent.source.path)


def roll_out_with_two_controllers_side_by_side(deployment: Deployment) -> None:
    """Commit a plan of three waves: canary ctl1, then ctl2 and ctl3 in one batch, then the computes."""
    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml") + """\
rollout:
  waves:
    - {name: canary, nodes: [ctl1]}
    - {name: controllers, nodes: [ctl2, ctl3]}
    - {name: computes, nodes: ["cmp*"]}
""")
    deployment.commit("roll out in waves")


def read_notes_of(agent: Agent) -> set[str]:
    """The nodes whose notes ``agent`` has fetched into its mirror."""
    from reconciler.fleet.view import FLEET_PREFIX

    return {ref.removeprefix(FLEET_PREFIX) for ref in agent.source.repo.references if ref.startswith(FLEET_PREFIX)}


def test_waves_in_order_then_a_failing_canary_halts_the_fleet_and_a_revert_rolls_out(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey, gitolite: Any, tmp_path: Path
) -> None:
    # The remote is gitolite behind sshd: every node pushes with its own key, only its own ref.
    keys = {n: gitolite.add_user(n) for n in [*NODES, "merge"]}
    gitolite.configure("cloud", list(NODES))
    url = gitolite.url("cloud")

    def merge(message: str) -> str:
        commit = deployment.commit(message, push=False)
        subprocess.run(["git", "push", "-q", "--force", url, "HEAD:refs/heads/main"], cwd=deployment.work, check=True,
                       env={"PATH": "/usr/bin:/bin", "GIT_SSH_COMMAND": gitolite.ssh_command(keys["merge"])})
        return commit

    def note(node: str, commit: str) -> str | None:
        try:
            text = git("--git-dir", str(gitolite.bare_path("cloud")), "notes", f"--ref=reconciler/{node}", "show",
                       commit)
        except subprocess.CalledProcessError:
            return None
        return str(json.loads(text)["state"])

    fleet = {n: agents(n, url, ssh_command=gitolite.ssh_command(keys[n])) for n in NODES}
    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml") + ROLLOUT)
    c1 = merge("roll out in waves")

    # Out of order on purpose: each node waits for the batch before it, and reads only that
    # batch's notes while it waits (and its own batch's peers'), not every node's before it.
    assert fleet["cmp1"].reconcile_once().waiting == "waiting for ctl3"
    assert fleet["ctl3"].reconcile_once().waiting == "waiting for ctl2"
    assert fleet["ctl1"].reconcile_once().exit_code == 0
    assert fleet["ctl3"].reconcile_once().waiting == "waiting for ctl2"
    assert fleet["cmp1"].reconcile_once().waiting == "waiting for ctl3"
    assert read_notes_of(fleet["cmp1"]) == read_notes_of(fleet["ctl3"]) == set()  # ctl1's note: not read
    for node in ("ctl2", "ctl3", "cmp1", "cmp2"):
        result = fleet[node].reconcile_once()
        assert result.exit_code == 0 and result.report is not None, (node, result.waiting)
    assert all(note(n, c1) == "applied" for n in NODES)
    assert read_notes_of(fleet["cmp1"]) >= {"ctl1", "ctl2", "ctl3"}  # all of them, once ctl3 was done

    # A change that fails health on the canary: it is put back there, and nobody else starts.
    deployment.edit("services/identity/templates/identity.conf.j2", "port = {{ port_base + ports.identity }}",
                    "port = five-thousand")
    bad = merge("identity: broken port")
    canary = fleet["ctl1"].reconcile_once()
    assert canary.exit_code == 1 and canary.report is not None and canary.report.state == "failed"
    for node in ("ctl2", "ctl3", "cmp1", "cmp2"):
        result = fleet[node].reconcile_once()
        assert result.report is not None and result.report.state == "halted", node
        assert result.report.error.startswith(f"halted: ctl1 failed {bad[:12]} (identity)")
    # The canary does not loop on the failed commit, until an operator asks for one more try.
    again = fleet["ctl1"].reconcile_once()
    assert again.report is None and again.exit_code == 0
    assert retry(fleet["ctl1"].ctx) == bad
    assert fleet["ctl1"].reconcile_once().report.state == "failed"  # type: ignore[union-attr]

    config = tmp_path / "ctl2.yaml"
    config.write_text(f"node: ctl2\nremote: {url}\nstate_dir: {fleet['ctl2'].cfg.state_dir}\n"
                      f"ssh_command: {gitolite.ssh_command(keys['ctl2'])}\n"
                      f"trust: {{allowed_signers: {merge_key.allowed_signers}}}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "reconciler", "status", "--fleet", "--config", str(config),
         "-o", "json", "--html", str(deployment.work.parent / "rollout.html")], capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr  # the rollout stopped: a failed and four halted nodes
    status = json.loads(proc.stdout)
    by_node = {s["node"]: s for s in status["nodes"]}
    assert status["counts"] == {"failed": 1, "halted": 4}
    assert by_node["ctl1"]["detail"].startswith("identity: ")
    assert [s["wave"] for s in status["nodes"]] == ["canary", "controllers", "controllers", "computes", "computes"]
    page = (deployment.work.parent / "rollout.html").read_text()
    assert '<td class="state-failed" title="identity: ' in page and "ctl1" in page

    # The fleet's rollback is a reviewed `git revert`: a new commit that rolls out cleanly.
    git("-c", "gpg.format=ssh", "-c", f"user.signingkey={merge_key.key}", "revert", "-S", "--no-edit", "HEAD",
        cwd=deployment.work)
    fix = git("rev-parse", "HEAD", cwd=deployment.work)
    subprocess.run(["git", "push", "-q", url, "HEAD:refs/heads/main"], cwd=deployment.work, check=True,
                   env={"PATH": "/usr/bin:/bin", "GIT_SSH_COMMAND": gitolite.ssh_command(keys["merge"])})
    for node in ("ctl1", "ctl2", "ctl3", "cmp1", "cmp2"):
        result = fleet[node].reconcile_once()
        assert result.exit_code == 0, (node, result.report, result.waiting)
    assert all(note(n, fix) == "applied" for n in NODES)


def test_a_node_waiting_on_a_batch_that_has_not_begun_reads_one_node_of_it(
    deployment: Deployment, agents: Callable[..., Agent]
) -> None:
    clock = Clock()
    fleet = {n: agents(n, deployment.url, clock=clock) for n in ("ctl1", "ctl2", "ctl3", "cmp1")}
    roll_out_with_two_controllers_side_by_side(deployment)
    for node in ("ctl1", "ctl2", "ctl3", "cmp1"):
        assert fleet[node].reconcile_once().exit_code == 0, node
    cmp1 = fleet["cmp1"]

    deployment.edit("inventory.yaml", "token_ttl: 3600", "token_ttl: 1200")
    deployment.commit("shorter tokens")
    # A whole read of the batch before: neither controller has begun. Then only cmp1's
    # sentinel (ctl2, by a hash of its name) on each poll, however long the canary takes.
    assert cmp1.reconcile_once().waiting == "waiting for ctl2, ctl3"
    forget_notes(cmp1)
    assert cmp1.reconcile_once().waiting == "waiting for ctl2, ctl3"
    assert read_notes_of(cmp1) == {"ctl2"}
    assert fleet["ctl1"].reconcile_once().exit_code == 0
    assert fleet["ctl3"].reconcile_once().exit_code == 0
    forget_notes(cmp1)
    # ctl3 applied, but the sentinel has not moved: the last whole read's words, one ref read.
    assert cmp1.reconcile_once().waiting == "waiting for ctl2, ctl3"
    assert read_notes_of(cmp1) == {"ctl2"}
    # The sentinel moves: the whole batch is read, then every node before, and cmp1 goes, in one poll.
    assert fleet["ctl2"].reconcile_once().exit_code == 0
    went = cmp1.reconcile_once()
    assert went.exit_code == 0 and went.report is not None and went.report.state == "applied", went.waiting
    assert read_notes_of(cmp1) == {"ctl1", "ctl2", "ctl3"}

    # A commit that fails on ctl3 alone, while ctl2 (cmp1's sentinel) has not begun it: cmp1
    # does not go (it needs ctl2's note too), and says ctl3 failed at its next whole read.
    deployment.edit("services/identity/templates/identity.conf.j2", "port = {{ port_base + ports.identity }}",
                    "port = {{ 'five-thousand' if node == 'ctl3' else port_base + ports.identity }}")
    bad = deployment.commit("identity: a broken port on ctl3")
    assert cmp1.reconcile_once().waiting == "waiting for ctl2, ctl3"
    assert fleet["ctl1"].reconcile_once().exit_code == 0
    failed = fleet["ctl3"].reconcile_once()
    assert failed.report is not None and failed.report.state == "failed"
    assert cmp1.reconcile_once().waiting == "waiting for ctl2, ctl3"
    clock.now += timedelta(seconds=WHOLE_READ_EVERY)
    halted = cmp1.reconcile_once()
    assert halted.report is not None and halted.report.state == "halted"
    assert halted.report.error.startswith(f"halted: ctl3 failed {bad[:12]} (identity)")


def test_manual_rollback_with_the_remote_down_pins_until_the_branch_moves(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey
) -> None:
    ctl1 = agents("ctl1", deployment.url)
    c1 = git("rev-parse", "HEAD", cwd=deployment.work)
    ctl1.reconcile_once()
    deployment.edit("services/identity/templates/identity.conf.j2", "port = {{ port_base + ports.identity }}",
                    "port = {{ port_base + ports.identity }}\nworkers = 4")
    c2 = deployment.commit("identity: four workers")
    ctl1.reconcile_once()
    live = ctl1.cfg.state_dir / "services" / "identity" / "live" / "identity.conf"
    assert "workers = 4" in live.read_text()

    # The git server is gone: the operator rolls identity back on this node from the CLI.
    offline = ["--node", "ctl1", "--remote", "git://127.0.0.1:9/gone.git", "--state-dir", str(ctl1.cfg.state_dir),
               "--allowed-signers", str(merge_key.allowed_signers), *age_args(ctl1)]
    ctl1.close()
    proc = subprocess.run([sys.executable, "-m", "reconciler", "rollback", "identity", *offline, "-o", "json"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["report"]["pins"] == {"identity": c1} and out["report"]["services"]["identity"]["result"] == "ok"
    assert "workers" not in live.read_text()

    # The remote is back, the branch has not moved: the pin holds, and the note shows it.
    node = agents("ctl1", deployment.url)
    result = node.reconcile_once()
    assert result.exit_code == 0 and "workers" not in live.read_text()
    assert (deployment.note("ctl1", c2) or {}).get("pins") == {"identity": c1}

    # A new commit moves the branch past the pin: identity follows the branch again.
    deployment.edit("inventory.yaml", "token_ttl: 3600", "token_ttl: 1200")
    c3 = deployment.commit("shorter tokens")
    result = node.reconcile_once()
    assert result.exit_code == 0 and "workers = 4" in live.read_text()
    note = deployment.note("ctl1", c3) or {}
    assert "pins" not in note and any("pin of identity" in e for e in cast(list[str], note.get("events", [])))

    # unpin: the next run brings the service back to the head without waiting for a new commit.
    rollback(node.ctx, "identity", to=c1)
    assert "workers" not in live.read_text()
    assert unpin(node.ctx, "identity")
    node.reconcile_once()
    assert "workers = 4" in live.read_text()


def test_manual_instantiate_mode_stages_until_an_operator_applies(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey
) -> None:
    deployment.edit("services/identity/service.yaml", "depends_on: [db]\n", "depends_on: [db]\napply: manual\n")
    deployment.commit("identity changes wait for an operator")
    ctl2 = agents("ctl2", deployment.url)
    first = ctl2.reconcile_once()
    assert first.report is not None and first.report.state == "staged"
    staged = {r.service: r.reason for r in first.report.services}
    assert staged["identity"].startswith("staged (apply: manual): start")
    assert "identity" not in {o for o, p in _pids(ctl2).items() if p}

    proc = subprocess.run(
        [sys.executable, "-m", "reconciler", "apply", "--service", "identity", "--node", "ctl2", "--remote",
         deployment.url, "--state-dir", str(ctl2.cfg.state_dir), "--allowed-signers",
         str(merge_key.allowed_signers), *age_args(ctl2), "-o", "json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    applied = json.loads(proc.stdout)["report"]
    assert applied["services"]["identity"]["action"] == "start"
    assert _pids(ctl2)["identity"]
    # Every service of the slice now runs the commit: it is applied, and the note says so.
    assert applied["state"] == "applied" and (deployment.note("ctl2") or {}).get("state") == "applied"
    again = ctl2.reconcile_once()
    assert again.exit_code == 0 and again.report is None


def _pids(agent: Agent) -> dict[str, int | None]:
    from reconciler.drivers.observe import observe
    from reconciler.node.context import drivers_for

    return {o.name: o.pid for o in observe(agent.cfg.node, drivers_for(agent.cfg, None)).services}
