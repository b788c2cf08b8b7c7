"""A node waiting for a disruption slot, or at an upgrade barrier, wait-polls the few nodes it
waits for (issue 40), as one waiting for the wave before does: the daemon's next wait-poll after
their note makes the pass due at once, not the next poll a minute later.

Real parts: two nodes' agents on one real git remote (no probe: a wait-poll fetches the few
notes refs it waits on), their services real processes. The daemon's wait-polls are driven by
hand (``WaitPolls.tick``), so the test counts them instead of timing them.

History (a budget: two nodes, n1 and n2, in a group with ``max_disrupted: 1``)::

    C1 app deployed --- C2 app changed (a restart on each node: one at a time)

History (a barrier: the demo fleet, ``test_upgrade``'s upgrade of identity)::

    C1 version 1 everywhere --- C2 identity to version 2 (steps, each after a barrier)

History (a post step: the same upgrade, of compute-agent too, then ``unpin-rpc`` on every node
once all five applied it)::

    C1 version 1 everywhere --- C2 both to version 2, post_upgrade unpin-rpc
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from conftest import Deployment, SigningKey, small_deployment, wait_for
from test_upgrade import COMPUTES, CONTROLLERS, fleet_at_version_1, steps_of, to_version_2, upgrade_steps

from reconciler.agent import Agent
from reconciler.daemon.supervisor import Every, WaitPolls
from reconciler.node.run import RunResult

# Healthy only while the test's file exists: a restart holds its node's slot until then.
APP = """\
runtime:
  command: [sh, -c, "exec sleep 1000"]
files:
  - {path: app.conf, template: app.conf.j2}
health:
  command: "test -e {{ ready_file }}"
  min_healthy: 0
  timeout: 60
"""
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"  # the object the claims are noted on


class HandPolls:
    """The daemon's wait-polls, by hand: its poll every minute, first due in an hour; ``tick``
    is one wait-poll, ``later`` moves the wait-poll's clock an hour on (each tick a fetch of the
    refs it waits on: no probe)."""

    def __init__(self, node: Agent) -> None:
        self.stop, self.now = threading.Event(), [1000.0]
        self.polls = Every("poll", 60.0, lambda: None, self.stop, first=3600.0)
        self.waits = WaitPolls(node, self.polls, threading.Lock(), self.stop, 3600.0, clock=lambda: self.now[0])

    def tick(self, later: bool = False) -> float:
        """One wait-poll; how many seconds the poll is away after it."""
        if later:
            self.now[0] += 3600.0
        self.waits.tick()
        return self.polls.next_due() - time.monotonic()

    def __enter__(self) -> HandPolls:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        if self.waits.timer is not None:
            self.waits.timer.wake()


def budgeted(tmp_path: Path, key: SigningKey, release: Path) -> Deployment:
    return small_deployment(tmp_path, key, {
        "reconciler.yaml": "format: 1\nname: slots\ndisruption_budgets:\n  - {group: g, max_disrupted: 1}\n",
        "inventory.yaml": f"vars: {{ready_file: {release}, version: 1}}\n"
                          "groups:\n  g: {services: [app]}\nnodes:\n  n1: {groups: [g]}\n  n2: {groups: [g]}\n",
        "services/app/service.yaml": APP,
        "services/app/templates/app.conf.j2": "version = {{ version }}\n",
    })


def claim_state(dep: Deployment, node: str) -> str:
    shown = subprocess.run(["git", "notes", f"--ref=reconciler/{node}", "show", EMPTY_TREE], cwd=dep.bare,
                           capture_output=True, text=True)
    return shown.stdout if shown.returncode == 0 else ""


def test_a_node_waiting_for_a_disruption_slot_polls_on_the_next_wait_poll_after_the_holder_frees_it(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]
) -> None:
    release = tmp_path / "release"
    release.touch()
    dep = budgeted(tmp_path, merge_key, release)
    n1, n2 = (agents(n, dep.url, interval=60.0) for n in ("n1", "n2"))
    for node in (n1, n2):
        assert node.reconcile_once().exit_code == 0  # a first start disrupts nothing: no slot

    release.unlink()
    dep.edit("inventory.yaml", "version: 1", "version: 2")
    head = dep.commit("app: version 2")
    # n1 takes the slot and holds it through its restart (its check waits for the file) ...
    first: list[RunResult] = []
    holder = threading.Thread(target=lambda: first.append(n1.reconcile_once()))
    holder.start()
    hand = HandPolls(n2)
    try:
        wait_for(lambda: '"queued"' in claim_state(dep, "n1"), 30, "n1 to take its slot")
        # ... so n2's pass waits for it, and keeps watching n1 alone.
        waited = n2.reconcile_once()
        assert "waiting (budget)" in waited.waiting and "waiting for n1" in waited.waiting, waited.waiting
        assert n2.waiting_on() == ("n1",)
        hand.waits.after(waited.waiting)
        assert hand.tick() > 30  # n1 still restarting: nothing moved, the poll stays a minute away
        release.touch()
        holder.join()
        assert first[0].report is not None and str(first[0].report.state) == "applied", first[0]
        assert '"free"' in claim_state(dep, "n1")
        assert hand.tick(later=True) < 1  # the first wait-poll after n1 freed its slot: poll now
    finally:
        release.touch()
        holder.join()
        hand.__exit__()
    went = n2.reconcile_once()
    assert went.report is not None and str(went.report.state) == "applied", went.waiting
    assert went.commit == head and n2.waiting_on() == ()


def test_a_node_waiting_at_an_upgrade_barrier_polls_on_the_next_wait_poll_after_the_others_passed(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path
) -> None:
    fleet = fleet_at_version_1(deployment, agents)
    to_version_2(deployment, upgrade_steps(tmp_path / "db-sync.count"), post=False)
    deployment.commit("upgrade identity to version 2")
    ctl1 = fleet["ctl1"]
    waited = ctl1.reconcile_once()  # its first step done, its second waits for the other controllers
    assert waited.waiting == "waiting at barrier identity/stop (after pin-rpc): for ctl2, ctl3", waited.waiting
    assert sorted(ctl1.waiting_on()) == ["ctl2", "ctl3"]

    with HandPolls(ctl1) as hand:
        hand.waits.after(waited.waiting)
        assert hand.tick() > 30  # nothing moved: the poll stays a minute away
        for node in ("ctl2", "ctl3"):  # each takes its first step and notes it
            assert fleet[node].reconcile_once().waiting.startswith("waiting at barrier identity/"), node
        assert hand.tick(later=True) < 1  # the first wait-poll after their notes: poll now
    went = ctl1.reconcile_once()  # past the barrier (its stop done), to the next one
    assert went.waiting.startswith("waiting at barrier identity/db-sync (after stop): for ctl2"), went.waiting
    assert ctl1.waiting_on() == ("ctl2",)  # ctl3, the last to note, has stopped too


def test_a_node_whose_post_upgrade_step_waits_on_the_fleet_polls_on_the_next_wait_poll_after_their_notes(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path
) -> None:
    fleet = fleet_at_version_1(deployment, agents)
    to_version_2(deployment, upgrade_steps(tmp_path / "db-sync.count"))
    c2 = deployment.commit("upgrade identity and compute-agent to version 2, unpin after")
    for _ in range(6):  # the controllers take their steps in turn; the computes wait for them
        said = {n: fleet[n].reconcile_once().waiting for n in reversed(CONTROLLERS)}
        if all(w.startswith("post_upgrade unpin-rpc waits for") for w in said.values()):
            break
    ctl1 = fleet["ctl1"]
    waited = ctl1.reconcile_once()  # nothing new: the pass looks at its post step again, and waits
    assert waited.waiting == f"post_upgrade unpin-rpc waits for cmp1, cmp2 to apply {c2[:12]}", waited.waiting
    assert sorted(ctl1.waiting_on()) == ["cmp1", "cmp2"]

    with HandPolls(ctl1) as hand:
        hand.waits.after(waited.waiting)
        assert hand.tick() > 30  # nothing moved: the poll stays a minute away
        assert fleet["cmp1"].reconcile_once().report is not None  # its steps begin, noted
        assert hand.tick(later=True) < 1  # the first wait-poll after cmp1's note: poll now
    for _ in range(6):  # the computes finish; the post step runs, and nothing is watched any more
        for node in COMPUTES:
            fleet[node].reconcile_once()
        went = ctl1.reconcile_once()
        if not went.waiting:
            break
    assert steps_of(deployment, c2)["ctl1"][("", "unpin-rpc")]["status"] == "done", went
    assert ctl1.waiting_on() == ()
