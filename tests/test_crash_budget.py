"""Kill the agent at every side effect of a disruption-budget claim and release, and check from
outside that the next plain runs finish the commit without ever exceeding the budget (see
test_crash_points.py for the method, test_budget.py for the budget).

Three controllers on one real remote, ``max_disrupted: 1``, each running a db process that
writes a line to its data dir as it starts; every commit changes db's config on all three
(a restart: disruptive). The agents run one pass at a time, interleaved, each in its own forked
child, so the order is the test's. Two pass kinds are killed at each numbered side effect:

- **take and release**: ctl1 alone announces it is choosing, queues its ticket, restarts db
  and frees its slot (every write pushed to its notes ref);
- **wait**: ctl2 while ctl1 holds the slot (killed just before it restarts): it announces,
  queues behind ctl1 and waits.

After each pass (killed or not), from outside, the budget holds: at most one node has
restarted db in this commit and not yet freed its claim on the remote (read with git). At the
end of each round: every node noted the commit applied, every claim on the remote ``free``,
every db started once (twice only on the node killed inside its own restart, which is done
again), one process per node, nothing else running.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest
from conftest import Deployment, SigningKey, small_deployment
from crash_fleet import CLAIM_OBJECT, git_bare, kill_at, signing
from test_crash_points import Node, count_points
from test_faults import processes_of

from reconciler.settings import AgentConfig, TrustConfig

NODES = ("ctl1", "ctl2", "ctl3")
DB = """\
runtime:
  command: [python3, -c, "import os, time; open(os.environ['RECONCILER_DATA_DIR'] + '/starts', 'a').write('start\\\\n'); time.sleep(86400)"]
files:
  - {path: db.conf, template: db.conf.j2}
health:
  command: "true"
  min_healthy: 0
"""


@dataclass
class Fleet:
    nodes: dict[str, Node]
    commits: int = 0
    starts: dict[str, int] = field(default_factory=dict)  # db starts per node when the commit was made

    @property
    def deployment(self) -> Deployment:
        return self.nodes["ctl1"].deployment

    def change(self) -> str:
        """A commit that restarts db on every controller."""
        self.commits += 1
        self.deployment.write("services/db/templates/db.conf.j2", f"generation = {self.commits}\n")
        self.starts = {n: self.started(n) for n in NODES}
        return str(self.deployment.commit(f"db: generation {self.commits}"))

    def started(self, node: str) -> int:
        path = self.nodes[node].cfg.state_dir / "services" / "db" / "data" / "starts"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def claim(self, node: str) -> str:
        """The state of ``node``'s claim on the remote ("" when it has none)."""
        try:
            text = git_bare(self.deployment, "notes", f"--ref=reconciler/{node}", "show", CLAIM_OBJECT)
        except Exception:  # no notes ref, or no claim yet
            return ""
        return str(json.loads(text)["claim"]["state"])

    def disrupted(self) -> list[str]:
        """Nodes that restarted db for this commit and whose claim on the remote is not free yet."""
        return [n for n in NODES if self.started(n) > self.starts[n] and self.claim(n) != "free"]

    def step(self, node: str, what: str, run: Callable[[], object] | None = None) -> None:
        """One pass of ``node`` (``run``: a killed one), the budget checked around it: a node
        that restarts db while another one is disrupted exceeds it, even if it frees its slot
        within the same pass."""
        holding = [n for n in self.disrupted() if n != node]
        before = self.started(node)
        (run or self.nodes[node].run)()
        if self.started(node) > before:
            assert not holding, f"budget exceeded: {node} restarted db in {what} while {holding} held the slot"
        assert len(self.disrupted()) <= 1, f"budget exceeded after {what}: {self.disrupted()}"

    def applied(self, node: str, head: str) -> bool:
        return (self.deployment.note(node, head) or {}).get("state") == "applied"

    def until_applied(self, head: str) -> None:
        """Plain passes, node after node, until every node noted ``head`` applied."""
        for _ in range(4):
            for n in NODES:
                if not self.applied(n, head):
                    self.step(n, f"a plain pass of {n}")
        assert all(self.applied(n, head) for n in NODES), {n: self.deployment.note(n, head) for n in NODES}

    def assert_done(self, head: str, killed_in_restart: str = "") -> None:
        assert {n: self.claim(n) for n in NODES} == dict.fromkeys(NODES, "free")
        for n in NODES:
            runs = self.started(n) - self.starts[n]
            assert runs == 1 or (runs == 2 and n == killed_in_restart), f"{n}: db started {runs} times"
            procs = processes_of(self.nodes[n].cfg.state_dir)
            assert list(procs) == ["db"] and len(procs["db"]) == 1, (n, procs)
            leftovers = [p for p in self.nodes[n].cfg.state_dir.rglob("*")
                         if p.name.startswith((".rc-tmp-", ".tmp-")) and "mirror.git" not in p.parts]
            assert not leftovers, leftovers
            again = self.nodes[n].run()
            assert getattr(again, "report", None) is None and getattr(again, "exit_code", 1) == 0, (n, again)


@pytest.fixture
def fleet(tmp_path: Path, merge_key: SigningKey) -> Iterator[Fleet]:
    trust_nodes, settings = signing(list(NODES))
    nodes = "".join(f"  {n}: {{groups: [controllers]}}\n" for n in NODES)
    files = {
        "reconciler.yaml": ("format: 1\nname: crash-budget\n"
                            "disruption_budgets:\n  - {group: controllers, max_disrupted: 1}\n"),
        "inventory.yaml": f"groups:\n  controllers: {{services: [db]}}\nnodes:\n{nodes}",
        "services/db/service.yaml": DB,
        "services/db/templates/db.conf.j2": "generation = 0\n",
        **trust_nodes,
    }
    dep = small_deployment(tmp_path, merge_key, files)
    f = Fleet({n: Node(dep, AgentConfig(node=n, remote=dep.url, state_dir=tmp_path / "nodes" / n,
                                        trust=TrustConfig(allowed_signers=merge_key.allowed_signers), **settings[n]),
                       {}) for n in NODES})
    for n in NODES:
        f.nodes[n].run()
    yield f
    for n in NODES:
        for pids in processes_of(f.nodes[n].cfg.state_dir).values():
            for pid in pids:
                os.killpg(pid, 9)


def restart_window(points: list[str]) -> range:
    """The kill points inside the pass's restart of db: from its journal entry to its settle."""
    first = next(i for i, p in enumerate(points, 1) if p.split()[1:3] == ["db", "intent"])
    last = next(i for i, p in enumerate(points, 1) if i > first and p.split()[1:3] == ["db", "settle"])
    return range(first + 1, last + 1)


def test_killed_at_every_side_effect_of_a_claim_and_its_release_the_budget_holds(
    fleet: Fleet, tmp_path: Path
) -> None:
    ctl1 = fleet.nodes["ctl1"]
    fleet.until_applied(fleet.change())  # every node has a claim: what ctl1 reads from now on
    head = fleet.change()
    take = count_points(ctl1, None, tmp_path / "take.log")
    kinds = [p.split()[1] for p in take]
    assert [p.split()[2] for p in take if p.split()[1] == "claim"] == ["choosing", "queued", "free"], take
    assert kinds.count("push") >= 3, take
    fleet.until_applied(head)
    fleet.assert_done(head)
    inside = restart_window(take)
    for n in range(1, len(take) + 1):
        head = fleet.change()
        try:
            fleet.step("ctl1", "the killed pass", partial(kill_at, ctl1, None, n, take, tmp_path / "killed.log"))
            fleet.step("ctl2", "ctl2's pass")  # while ctl1 may still hold its slot
            fleet.until_applied(head)
            fleet.assert_done(head, "ctl1" if n in inside else "")
        except AssertionError as exc:
            raise AssertionError(f"take and release killed before side effect {n} of {len(take)} "
                                 f"({take[n - 1]}): {exc}") from exc


def test_killed_at_every_side_effect_of_a_wait_for_the_slot_the_budget_holds(
    fleet: Fleet, tmp_path: Path
) -> None:
    ctl1, ctl2 = fleet.nodes["ctl1"], fleet.nodes["ctl2"]
    fleet.until_applied(fleet.change())  # every node has a claim: what each reads from now on
    head = fleet.change()
    take = count_points(ctl1, None, tmp_path / "take.log")
    fleet.until_applied(head)
    hold = next(i for i, p in enumerate(take, 1) if p.split()[1:3] == ["db", "intent"])  # queued, not restarted

    head = fleet.change()
    kill_at(ctl1, None, hold, take, tmp_path / "holder.log")
    waiting = count_points(ctl2, None, tmp_path / "wait.log")
    assert [p.split()[2] for p in waiting if p.split()[1] == "claim"] == ["choosing", "queued"], waiting
    assert fleet.started("ctl2") == fleet.starts["ctl2"] and fleet.claim("ctl1") == "queued"
    fleet.until_applied(head)
    fleet.assert_done(head)
    for n in range(1, len(waiting) + 1):
        head = fleet.change()
        try:
            kill_at(ctl1, None, hold, take, tmp_path / "holder.log")
            fleet.step("ctl2", "the killed pass", partial(kill_at, ctl2, None, n, waiting, tmp_path / "killed.log"))
            fleet.step("ctl2", "ctl2's pass")  # ctl1 still holds: ctl2 waits again
            assert fleet.started("ctl2") == fleet.starts["ctl2"], "ctl2 restarted while ctl1 held the slot"
            fleet.until_applied(head)
            fleet.assert_done(head)
        except AssertionError as exc:
            raise AssertionError(f"wait killed before side effect {n} of {len(waiting)} "
                                 f"({waiting[n - 1]}): {exc}") from exc
