"""`status --fleet` and `history --fleet` from any clone of the deployment repo (a laptop, a CI
job): no node settings, state dir or trust root, only `git clone` and the notes on the remote.
`--watch` waits on the rollout of one commit and says by its exit code how it ended.

Waves: canary [ctl1] -> controllers [ctl2, ctl3] one at a time -> computes [cmp*]; every node
is its own in-process agent with its own state dir, sharing only the bare repo (file://).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from conftest import Deployment, git
from test_rollout import ROLLOUT

from reconciler.agent import Agent

ORDER = ("ctl1", "ctl2", "ctl3", "cmp1", "cmp2")


def reconciler(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reconciler", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def watch(clone: Path) -> subprocess.Popen[str]:
    """`status --fleet --watch` from the clone, started before any node has moved."""
    return subprocess.Popen([sys.executable, "-m", "reconciler", "status", "--fleet", "--watch", "--interval", "0.2",
                             "-o", "json"], cwd=clone, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_plain_clone_watches_a_five_node_rollout_then_shows_status_and_history(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path
) -> None:
    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml") + ROLLOUT)
    c1 = deployment.commit("roll out in waves")
    clone = tmp_path / "laptop"
    git("clone", "-q", deployment.url, str(clone))  # no notes in a plain clone: status fetches them

    waiting = watch(clone)
    fleet = {n: agents(n, deployment.url) for n in ORDER}
    for node in ORDER:
        assert fleet[node].reconcile_once().exit_code == 0, node
        assert waiting.poll() is None or node == ORDER[-1]  # still waiting while a node has not applied
    stdout, stderr = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, stderr
    watched = json.loads(stdout)
    assert watched["commit"] == c1 and watched["counts"] == {"applied": 5}

    proc = reconciler("status", "--fleet", "--repo", str(clone), "-o", "json")
    assert proc.returncode == 0, proc.stderr
    status = json.loads(proc.stdout)
    assert [(s["node"], s["wave"], s["state"]) for s in status["nodes"]] == [
        ("ctl1", "canary", "applied"), ("ctl2", "controllers", "applied"), ("ctl3", "controllers", "applied"),
        ("cmp1", "computes", "applied"), ("cmp2", "computes", "applied")]

    # The operator's own notes and refs are untouched: the fleet's notes live under refs/reconciler/.
    assert git("for-each-ref", "refs/notes", cwd=clone) == ""
    history = reconciler("history", "--fleet", "--repo", str(clone), "--limit", "2", "-o", "json")
    assert history.returncode == 0, history.stderr
    rows = json.loads(history.stdout)
    assert [(r["commit"], r["subject"], r["counts"]) for r in rows] == [
        (c1, "roll out in waves", {"applied": 5}), (rows[1]["commit"], "initial deployment", {})]


def test_watch_ends_with_1_when_the_canary_fails_and_the_fleet_halts(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path
) -> None:
    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml") + ROLLOUT)
    deployment.edit("services/identity/templates/identity.conf.j2", "port = {{ port_base + ports.identity }}",
                    "port = five-thousand")
    bad = deployment.commit("identity: broken port")
    clone = tmp_path / "ci"
    git("clone", "-q", deployment.url, str(clone))

    waiting = watch(clone)
    fleet = {n: agents(n, deployment.url) for n in ORDER}
    assert fleet["ctl1"].reconcile_once().exit_code == 1
    for node in ORDER[1:]:
        assert waiting.poll() is None  # a failure is not the end until every node has said so
        result = fleet[node].reconcile_once()
        assert result.report is not None and result.report.state == "halted", node
    stdout, stderr = waiting.communicate(timeout=60)
    assert waiting.returncode == 1, stderr
    watched = json.loads(stdout)
    assert watched["commit"] == bad and watched["counts"] == {"failed": 1, "halted": 4}
    assert watched["error"]["reason"] == "ROLLOUT_STOPPED"
    assert stderr.strip().splitlines()[-1] == (
        f"error: the rollout of {bad[:12]} is stopped: 1 failed, 4 halted [ROLLOUT_STOPPED]")


def test_status_fleet_outside_a_clone_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = reconciler("status", "--fleet", "--repo", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr == f"error: {tmp_path}: not a git repository (give --repo, a clone of the deployment repo)" \
                          " [BAD_INPUT]\n"
