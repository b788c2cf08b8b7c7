"""Five nodes against a real gitolite behind sshd: each node's key may push only its own notes
ref, only the merge identity may push the branch. A security patch to the identity service
rolls through the waves touching nothing else; a revert puts the previous version back."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from conftest import NODES, Deployment, git
from gitolite_fixtures import Gitolite

from reconciler.agent import Agent
from reconciler.drivers.observe import observe
from reconciler.node.context import drivers_for

ROLLOUT = """\
rollout:
  waves:
    - {name: canary, nodes: [ctl1]}
    - {name: controllers, group: controllers}
    - {name: computes, group: computes}
"""


def pids(agent: Agent) -> dict[str, int | None]:
    return {o.name: o.pid for o in observe(agent.cfg.node, drivers_for(agent.cfg, None)).services}


def push_as(gl: Gitolite, key: Path, work: Path, refspec: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "push", gl.url("cloud"), refspec], cwd=work, capture_output=True,
                          text=True, env={"GIT_SSH_COMMAND": gl.ssh_command(key), "PATH": "/usr/bin:/bin"})


def test_rollout_through_gitolite_with_per_node_note_refs(
    deployment: Deployment, agents: Callable[..., Agent], gitolite: Gitolite
) -> None:
    gl = gitolite
    keys = {n: gl.add_user(n) for n in [*NODES, "merge"]}
    gl.configure("cloud", list(NODES))
    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml") + ROLLOUT)
    deployment.commit("waves", push=False)
    assert push_as(gl, keys["merge"], deployment.work, "HEAD:refs/heads/main").returncode == 0
    url = gl.url("cloud")
    fleet = {n: agents(n, url, ssh_command=gl.ssh_command(keys[n])) for n in NODES}

    for node in ("ctl1", "ctl2", "ctl3", "cmp1", "cmp2"):
        result = fleet[node].reconcile_once()
        assert result.exit_code == 0 and result.pushed, (node, result.waiting)
    bare = gl.bare_path("cloud")
    refs = git("--git-dir", str(bare), "for-each-ref", "--format=%(refname)").split()
    assert sorted(r for r in refs if r.startswith("refs/notes/")) == [f"refs/notes/reconciler/{n}" for n in NODES]

    # A node's key can write its own notes ref and nothing else.
    head = git("rev-parse", "HEAD", cwd=deployment.work)
    denied_other = push_as(gl, keys["ctl1"], deployment.work, f"+{head}:refs/notes/reconciler/ctl2")
    denied_branch = push_as(gl, keys["ctl1"], deployment.work, f"+{head}~1:refs/heads/main")
    assert denied_other.returncode != 0 and "DENIED" in denied_other.stderr
    assert denied_branch.returncode != 0 and "DENIED" in denied_branch.stderr

    # A security patch to the identity service (its config) rolls through every instance.
    before = {n: pids(a) for n, a in fleet.items()}
    deployment.edit("services/identity/templates/identity.conf.j2", "provider = fernet", "provider = jws")
    deployment.edit("services/identity/service.yaml", '"token.*", ', "")  # token changes need a restart now
    patch = deployment.commit("identity: token provider fix (CVE)", push=False)
    assert push_as(gl, keys["merge"], deployment.work, "HEAD:refs/heads/main").returncode == 0
    for node in ("cmp1", "ctl1", "ctl2", "ctl3", "cmp2", "cmp1"):
        fleet[node].reconcile_once()
    after = {n: pids(a) for n, a in fleet.items()}
    for node in NODES:
        changed = {s for s in after[node] if after[node][s] != before[node][s]}
        assert changed == ({"identity"} if node.startswith("ctl") else set()), node
        note = git("--git-dir", str(bare), "notes", f"--ref=reconciler/{node}", "show", patch)
        assert '"state": "applied"' in note

    # The fleet's rollback: a signed revert, merged; every identity goes back.
    git("-c", "gpg.format=ssh", "-c", f"user.signingkey={deployment.key.key}", "revert", "-S", "--no-edit",  # type: ignore[union-attr]
        "HEAD", cwd=deployment.work)
    assert push_as(gl, keys["merge"], deployment.work, "HEAD:refs/heads/main").returncode == 0
    for node in ("ctl1", "ctl2", "ctl3", "cmp1", "cmp2"):
        assert fleet[node].reconcile_once().exit_code == 0
    live = fleet["ctl2"].cfg.state_dir / "services" / "identity" / "live" / "identity.conf"
    assert "provider = fernet" in live.read_text()

