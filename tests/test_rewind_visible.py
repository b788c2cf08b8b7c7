"""What an operator is told when a node will not move: an `apply --service` that names no
service on a node whose head failed there, and a branch force-moved back to a commit a node
applied before (the node refuses the rewind; the fleet view must say so, not show it applied).
Real git remotes, real processes, the command line as an operator runs it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import Deployment, SigningKey, git, note_key, small_deployment
from test_cli import as_json, break_identity, cli, node_args, one_error_line
from test_crash_points import count_points, killed_at, one_pass
from test_faults import processes_of

from reconciler.agent import Agent
from reconciler.fleet.notejson import check
from reconciler.fleet.notes import Note
from reconciler.fleet.rollout import FleetView, plan_rollout
from reconciler.fleet.status import fleet_status
from reconciler.settings import AgentConfig, TrustConfig


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


def test_apply_of_an_unknown_service_is_an_error_before_the_rollout_or_a_suspension_answers(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey
) -> None:
    # cmp1 waits for the canary (ctl1), which has applied nothing: a pass of cmp1 waits.
    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml")
                     + "rollout:\n  waves:\n    - {name: canary, nodes: [ctl1]}\n")
    deployment.commit("a canary wave")
    cmp1 = agents("cmp1", deployment.url)
    args = node_args(cmp1, merge_key)
    assert "waiting" in as_json(cli("agent", "--once", *args, "-o", "json"))["waiting"]

    waiting = cli("apply", "--service", "nosuch", *args)
    assert waiting.returncode == 2, (waiting.stdout, waiting.stderr)
    one_error_line(waiting, "UNKNOWN_SERVICE")
    assert "nosuch" in waiting.stderr and "cmp1" in waiting.stderr, waiting.stderr

    assert cli("suspend", "--reason", "maintenance", *args).returncode == 0
    suspended = cli("apply", "--service", "nosuch", *args)
    assert suspended.returncode == 2, (suspended.stdout, suspended.stderr)
    one_error_line(suspended, "UNKNOWN_SERVICE")
    # a service it does run is still held by the suspension, as before
    held = cli("apply", "--service", "compute-agent", *args)
    assert held.returncode == 0 and "suspended" in held.stdout + held.stderr, (held.stdout, held.stderr)


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

    view = cli("status", "--fleet", *args, "-o", "json")  # read from cmp2's own state dir
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


@dataclass
class SmallNode:
    """Node n1 of a deployment of one sleeping process, run by a fresh agent each pass (as
    ``test_crash_points``' helpers fork and kill one)."""

    deployment: Deployment
    cfg: AgentConfig
    commits: int = 0

    def run(self, operation: Callable[[Agent], object] | None = None) -> object:
        return one_pass(self.cfg, operation)

    def forward(self) -> str:
        """A new commit the node applies (nothing of its service changes), pushed."""
        self.commits += 1
        self.deployment.write("NOTES.md", f"change {self.commits}\n")
        return self.deployment.commit(f"change {self.commits}")


@pytest.fixture
def small_node(tmp_path: Path, merge_key: SigningKey) -> Iterator[SmallNode]:
    files = {
        "reconciler.yaml": "format: 1\nname: rewind\n",
        "inventory.yaml": "groups:\n  g: {services: [sleeper]}\nnodes:\n  n1: {groups: [g]}\n",
        "services/sleeper/service.yaml": ("runtime:\n  command: [python3, sleeper.py]\n"
                                          "files:\n  - {path: sleeper.py, source: sleeper.py}\n"),
        "services/sleeper/files/sleeper.py": "import time\nwhile True:\n    time.sleep(60)\n",
    }
    dep = small_deployment(tmp_path, merge_key, files)
    cfg = AgentConfig(node="n1", remote=dep.url, state_dir=tmp_path / "state", note_key=note_key("n1"),
                      trust=TrustConfig(allowed_signers=merge_key.allowed_signers))
    yield SmallNode(dep, cfg)
    for pids in processes_of(cfg.state_dir).values():
        for pid in pids:
            os.killpg(pid, 9)


def test_killed_at_every_side_effect_of_a_refused_rewind_the_next_run_still_notes_the_refusal(
    small_node: SmallNode, tmp_path: Path
) -> None:
    """The pass that refuses a rewind, killed before each of its numbered side effects in turn
    (each time a new commit applied, then the branch moved back one): the next pass notes the
    refusal all the same, the event once and the ``refused`` field on the node's head."""
    node = small_node
    node.run()
    node.forward()
    node.run()
    back = node.forward()
    node.run()
    node.deployment.push(back + "~1", force=True)
    points = count_points(node, None, tmp_path / "points.log")  # type: ignore[arg-type]
    assert any(p.split()[1] == "db" for p in points), points
    for n in range(1, len(points) + 1):
        back = node.forward()  # the branch forward again, past where it was moved back to
        node.run()
        before = git("rev-parse", back + "~1", cwd=node.deployment.work)
        node.deployment.push(before, force=True)
        killed_at(node, None, n, points)  # type: ignore[arg-type]
        node.run()
        note = node.deployment.note("n1", back) or {}
        what = f"killed before side effect {n} of {len(points)} ({points[n - 1]})"
        assert note.get("state") == "applied", (what, note)
        refused = note.get("refused")
        assert isinstance(refused, dict) and refused.get("reason") == "NOT_DESCENDANT", (what, note)
        assert refused.get("head") == before, (what, note)
        events = note.get("events")
        said = [e for e in (events if isinstance(events, list) else []) if "refused head" in str(e)]
        assert len(said) == 1, (what, note)


def test_a_refusal_older_than_the_nodes_note_on_that_head_is_not_shown() -> None:
    """cmp2 refused the rewind to C1 while it ran C2; later (its state dir rebuilt, say) it
    applied C1 and noted so: the fleet view says what the newer note says, not the old refusal."""
    c1, c2 = "1" * 40, "2" * 40
    base = {"format": 1, "node": "cmp2"}
    ran = {**base, "commit": c2, "state": "applied", "time": "2026-03-01T10:00:00Z",
           "refused": {"head": c1, "reason": "NOT_DESCENDANT", "time": "2026-03-01T11:00:00Z"}}
    rollout = plan_rollout({}, ["cmp2"], lambda g: ())

    def shown(c1_time: str) -> tuple[str, str]:
        applied_again = {**base, "commit": c1, "state": "applied", "time": c1_time}
        notes = (Note.parse("cmp2", c2, ran), Note.parse("cmp2", c1, applied_again))
        [row] = fleet_status(rollout, ["cmp2"], c1, FleetView({"cmp2": notes}))
        return row.state, row.commit

    assert shown("2026-03-01T09:00:00Z") == ("refused", c2)  # applied before, then refused: refused
    assert shown("2026-03-01T12:00:00Z") == ("applied", c1)  # applied again after the refusal


def refused_head(note: dict[str, object] | None) -> object:
    refused = (note or {}).get("refused")
    return refused.get("head") if isinstance(refused, dict) else None


def test_a_refused_rewind_stays_on_the_note_it_was_said_on_and_goes_no_further(small_node: SmallNode) -> None:
    """The refusal is history of the commit the node ran then: once the branch moves on past it,
    the new head's note says nothing of it (a ledger cannot apply the refused head itself later:
    it is an ancestor of what it ran; only a rebuilt one can, which starts without the flag)."""
    node = small_node
    node.run()
    c1 = node.forward()
    node.run()
    c2 = node.forward()
    node.run()
    node.deployment.push(c1, force=True)
    node.run()
    assert refused_head(node.deployment.note("n1", c2)) == c1
    assert node.run(lambda a: a.ledger.refused_rewind_to(c2, c1, "NOT_DESCENDANT")) is True

    c3 = node.forward()  # on top of C2: the branch moves on
    node.run()
    moved = node.deployment.note("n1", c3) or {}
    assert moved.get("state") == "applied" and "refused" not in moved, moved
    assert refused_head(node.deployment.note("n1", c2)) == c1
