"""The operator's story of a failed upgrade reverted: identity 2 -> 3 fails its migration on
ctl1 (halted everywhere else, every node put back on 2), the operator `git revert`s the commit,
and the nodes converge on the revert. That commit changes identity's version (3 -> 2 against its
parent) but no node runs a step of it: each runs 2 already. A deployment-wide post step (here a
command that writes a marker, standing in for an unpin or a reboot) must not run for it; a
genuine upgrade to 3 afterwards still runs it. Real processes, a real remote, one agent per node.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import Deployment, git
from test_cli import as_json, cli

from reconciler.agent import Agent

CONTROLLERS = ("ctl1", "ctl2", "ctl3")

IDENTITY = """version: "{version}"
upgrade:
  - {{name: stop, action: stop}}
  - name: db-sync
    action: command
    scope: once
    command: '{sync}'
  - {{name: start, action: start}}
"""

POST = """
post_upgrade:
  - {{name: mark, after: [identity], action: command, command: 'echo "$RECONCILER_NODE" >> {marker}'}}
"""


def identity_at(deployment: Deployment, version: str, sync: str = "true") -> None:
    text = deployment.read("services/identity/service.yaml")
    text = text[text.index("runtime:"):] if "upgrade:" in text else text
    deployment.write("services/identity/service.yaml", IDENTITY.format(version=version, sync=sync) + text)


def settle(fleet: dict[str, Agent], deployment: Deployment, commit: str, states: tuple[str, ...],
           rounds: int = 12) -> None:
    """Poll the controllers until each one's note on ``commit`` is in ``states`` and no pass waits."""
    said: list[tuple[str, str]] = []
    for _ in range(rounds):
        waiting = False
        for node in reversed(CONTROLLERS):
            result = fleet[node].reconcile_once()
            waiting = waiting or bool(result.waiting)
            said.append((node, result.waiting or (str(result.report.state) if result.report else "no-op")))
        if not waiting and all((deployment.note(n, commit) or {}).get("state") in states for n in CONTROLLERS):
            return
    raise AssertionError(f"{commit[:12]} not settled: {said[-9:]}")


def post_steps(deployment: Deployment, node: str, commit: str) -> dict[str, dict[str, Any]]:
    note = deployment.note(node, commit) or {}
    return {s["step"]: s for s in note.get("upgrade", []) if s["service"] == ""}  # type: ignore[attr-defined]


def test_reverting_a_failed_upgrade_runs_no_post_step_and_a_genuine_upgrade_still_does(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path
) -> None:
    marker = tmp_path / "post-step.ran"
    fleet = {n: agents(n, deployment.url) for n in CONTROLLERS}
    identity_at(deployment, "2")
    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml") + POST.format(marker=marker))
    c2 = deployment.commit("identity at version 2, with its steps and a post step")
    settle(fleet, deployment, c2, ("applied",))
    assert not marker.exists()  # naming a version for the first time upgrades nothing

    identity_at(deployment, "3", sync="echo schema conflict >&2; exit 3")
    c3 = deployment.commit("identity: version 3")
    settle(fleet, deployment, c3, ("failed", "halted"))
    assert (deployment.note("ctl1", c3) or {}).get("reason") == "UPGRADE_FAILED"

    git("revert", "--no-commit", c3, cwd=deployment.work)
    reverted = deployment.commit(f'Revert "identity: version 3"\n\nThis reverts commit {c3}.')
    settle(fleet, deployment, reverted, ("applied",))
    for node in CONTROLLERS:
        steps = {s["step"]: s["status"] for s in (deployment.note(node, reverted) or {}).get("upgrade", [])  # type: ignore[attr-defined]
                 if s["service"] == "identity"}
        assert steps and set(steps.values()) == {"skipped"}, (node, steps)  # each ran 2 already
        mark = post_steps(deployment, node, reverted).get("mark")
        assert mark is not None and mark["status"] == "skipped", (node, mark)
        assert "no node ran the steps of identity" in mark["detail"], mark
    assert not marker.exists(), marker.read_text()
    # The reviewer's diff said so beforehand: the post step runs only if some node runs the steps.
    proc = cli("diff", "--repo", str(deployment.work), c3, reverted, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    lines = {n["node"]: n["upgrade"] for n in as_json(proc)["nodes"]}
    post_line = [x for x in lines["ctl1"] if x.startswith("post_upgrade mark")]
    assert post_line and "only if some node runs identity's steps" in post_line[0], lines["ctl1"]

    identity_at(deployment, "3")
    c4 = deployment.commit("identity: version 3, with a migration that works")
    settle(fleet, deployment, c4, ("applied",))
    for node in CONTROLLERS:
        assert post_steps(deployment, node, c4)["mark"]["status"] == "done", node
    assert sorted(marker.read_text().split()) == list(CONTROLLERS)
