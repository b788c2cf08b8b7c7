"""What an operator is told when a node will not move: an `apply --service` that names no
service on a node whose head failed there, and a branch force-moved back to a commit a node
applied before (the node refuses the rewind; the fleet view must say so, not show it applied).
Real git remotes, real processes, the command line as an operator runs it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from conftest import Deployment, SigningKey
from test_cli import as_json, break_identity, cli, node_args, one_error_line

from reconciler.agent import Agent
from reconciler.fleet.notejson import check
from reconciler.fleet.notes import Note
from reconciler.fleet.rollout import FleetView, plan_rollout
from reconciler.fleet.status import fleet_status


def test_apply_of_an_unknown_service_on_a_failed_head_is_an_error_naming_it_and_the_node(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey
) -> None:
    ctl1 = agents("ctl1", deployment.url)
    args = node_args(ctl1, merge_key)
    assert cli("agent", "--once", *args).returncode == 0
    bad = break_identity(deployment)
    assert cli("agent", "--once", *args).returncode == 1
    assert (deployment.note("ctl1", bad) or {}).get("state") == "failed"

    proc = cli("apply", "--service", "nosuch", *args)

    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    one_error_line(proc, "UNKNOWN_SERVICE")
    assert "nosuch" in proc.stderr and "ctl1" in proc.stderr, proc.stderr
    assert "nothing to do" not in proc.stdout


def test_a_refused_rewind_shows_in_the_fleet_view_and_leaves_the_earlier_verdict_alone(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey, tmp_path: Path
) -> None:
    cmp2 = agents("cmp2", deployment.url)
    args = node_args(cmp2, merge_key)
    c1 = deployment.commit("c1", push=True)
    assert cli("agent", "--once", *args).returncode == 0
    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    c2 = deployment.commit("kvm")
    assert cli("agent", "--once", *args).returncode == 0
    applied = deployment.note("cmp2", c1)
    assert (applied or {}).get("state") == "applied"

    deployment.push(c1, force=True)  # main points back at C1, which cmp2 applied before C2
    proc = cli("agent", "--once", *args)

    assert proc.returncode == 2 and proc.stderr.strip().endswith("[NOT_DESCENDANT]"), proc.stderr
    assert deployment.note("cmp2", c1) == applied  # the earlier verdict, as it was
    mark = deployment.note("cmp2", c2) or {}
    assert mark.get("state") == "applied"
    refused = mark.get("refused")
    assert isinstance(refused, dict) and refused["head"] == c1 and refused["reason"] == "NOT_DESCENDANT", mark

    view = cli("status", "--fleet", "--node", "ctl1", "--remote", deployment.url, "--state-dir",
               str(tmp_path / "view"), "--allowed-signers", str(merge_key.allowed_signers), "-o", "json")
    assert view.returncode == 1, view.stderr  # the rollout of C1 is stopped at cmp2
    shown = {n["node"]: n for n in as_json(view)["nodes"]}["cmp2"]
    assert shown["state"] == "refused" and shown["commit"] == c2, shown
    assert f"runs {c2[:12]}, which the branch no longer holds" in shown["detail"], shown
    assert f"refused the rewind to {c1[:12]}: NOT_DESCENDANT" in shown["detail"], shown

    # The next poll refuses again and writes nothing new.
    assert cli("agent", "--once", *args).returncode == 2
    assert deployment.note("cmp2", c1) == applied and deployment.note("cmp2", c2) == mark


def test_the_refused_field_of_a_note_is_bounded_and_shown_as_text_only() -> None:
    base = {"format": 1, "node": "cmp2", "commit": "c" * 40, "state": "applied"}
    for bad in ({"head": 5}, "NOT_DESCENDANT", {"head": "a", "reason": "x" * 300}, {"time": ["now"]}):
        assert isinstance(check(json.dumps({**base, "refused": bad})), str), bad
    hostile = {**base, "refused": {"head": "a" * 40, "reason": "NOT_\x1b[31mDESCENDANT\u202e", "time": "t"}}
    body = check(json.dumps(hostile))
    assert isinstance(body, dict)
    note = Note.parse("cmp2", "c" * 40, body)
    view = FleetView({"cmp2": (note,)})
    rollout = plan_rollout({}, ["cmp2"], lambda g: ())
    [shown] = fleet_status(rollout, ["cmp2"], "a" * 40, view)
    assert shown.state == "refused" and "\x1b" not in shown.detail and "\u202e" not in shown.detail, shown
