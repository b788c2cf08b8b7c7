"""A commit the canary cannot even use (it does not render there: an `error` note, nothing
applied) stops the rollout as a failed one does: the nodes after it are halted, saying why,
instead of waiting for the canary forever, and `status --fleet --watch` returns, exit 1.
A node the commit no longer lists (its error: UNKNOWN_NODE) stops nobody.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from conftest import NODES, Deployment, SigningKey
from test_rollout import ROLLOUT

from reconciler.agent import Agent
from reconciler.fleet.notes import Note
from reconciler.fleet.rollout import FleetView, decide, plan_rollout


def status_fleet(deployment: Deployment, agent: Agent, merge_key: SigningKey, tmp_path: Path,
                 *extra: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "status.yaml"
    config.write_text(f"node: {agent.cfg.node}\nremote: {deployment.url}\nstate_dir: {agent.cfg.state_dir}\n"
                      f"trust: {{allowed_signers: {merge_key.allowed_signers}}}\n")
    return subprocess.run([sys.executable, "-m", "reconciler", "status", "--fleet", "--config", str(config),
                           "-o", "json", *extra], capture_output=True, text=True, timeout=60)


def test_a_commit_the_canary_cannot_render_halts_the_waves_after_it_and_the_watch_returns(
        deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey, tmp_path: Path) -> None:
    fleet = {n: agents(n, deployment.url) for n in NODES}
    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml") + ROLLOUT)
    deployment.commit("roll out in waves")
    for node in ("ctl1", "ctl2", "ctl3", "cmp1", "cmp2"):
        assert fleet[node].reconcile_once().exit_code == 0, node

    deployment.edit("services/identity/templates/identity.conf.j2", "port = {{ port_base + ports.identity }}",
                    "port = {{ port_base + ports.identity_typo }}")
    bad = deployment.commit("identity: a typo that renders nowhere")
    canary = fleet["ctl1"].reconcile_once()
    assert canary.report is not None and canary.report.state == "error" and canary.report.reason == "RENDER_FAILED"
    for node in ("ctl2", "ctl3", "cmp1", "cmp2"):
        result = fleet[node].reconcile_once()
        assert result.report is not None and result.report.state == "halted", (node, result.waiting)
        assert result.report.error.startswith(f"halted: ctl1 could not use {bad[:12]} (RENDER_FAILED): "), \
            result.report.error
        assert "identity_typo" in result.report.error
    watched = status_fleet(deployment, fleet["ctl2"], merge_key, tmp_path, "--watch", "--interval", "0.2")
    assert watched.returncode == 1, watched.stderr
    assert json.loads(watched.stdout)["counts"] == {"error": 1, "halted": 4}



def test_which_notes_stop_the_rollout_of_their_commit() -> None:
    """The rule, on the notes as a node reads them: a failure or an error stops the nodes after
    it; an error that says the commit no longer lists the node (UNKNOWN_NODE) stops nobody."""
    rollout = plan_rollout({"rollout": {"waves": [{"name": "canary", "nodes": ["ctl1"]},
                                                  {"name": "rest", "nodes": ["cmp*"]}]}},
                           ["ctl1", "cmp1", "cmp2"], lambda group: ())

    def verdict(state: str, reason: str) -> str:
        notes = {"ctl1": (Note.parse("ctl1", "C", {"state": "applied"}),),
                 "cmp2": (Note.parse("cmp2", "C", {"state": state, "reason": reason, "error": "why"}),)}
        v = decide(rollout, "cmp1", "C", FleetView(notes), now=0.0)
        return "go" if v.go else v.reason

    assert verdict("applied", "") == "go"
    assert verdict("failed", "") == "halted: cmp2 failed C: why"
    assert verdict("error", "RENDER_FAILED") == "halted: cmp2 could not use C (RENDER_FAILED): why"
    assert verdict("error", "SECRET_UNREADABLE") == "halted: cmp2 could not use C (SECRET_UNREADABLE): why"
    assert verdict("error", "UNKNOWN_NODE") == "go"
