"""Disruption budgets: three controllers, each its own agent process started at the same
instant, all needing to restart db for one commit. With ``max_disrupted: 1`` their restarts
never overlap (each node's own ledger says when its restart began and when its check passed);
without a budget the same start overlaps them, which is what makes the first check mean
something. The claims are notes in each node's own ref: no lock server.

History::

    C0 initial --- C1 budget: controllers one at a time; db holds 2 s healthy
               --- C2 db: new member name (a restart on every controller)   [with the budget]
               --- C3 no budget
               --- C4 db: another name (a restart on every controller)      [without]
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from conftest import Deployment, SigningKey
from test_cli import cli, node_args

from reconciler.agent import Agent
from reconciler.fleet.budget import next_ticket, wait
from reconciler.fleet.notes import Claim
from reconciler.repo.budgets import Budget, parse_budgets

CONTROLLERS = ("ctl1", "ctl2", "ctl3")
BUDGET = """
disruption_budgets:
  - {group: controllers, max_disrupted: 1}
"""


def converge_together(agents: dict[str, Agent], key: SigningKey, head: str, out: Path) -> dict[str, list[str]]:
    """Every node's agent as its own process, polling (`agent --once`) until its note says
    ``head`` applied; all released at the same instant. Each pass's JSON, per node."""
    go = out / "go"
    worker = (
        "import json, os, subprocess, sys, time\n"
        "go, head, args = sys.argv[1], sys.argv[2], sys.argv[3:]\n"
        "while not os.path.exists(go): time.sleep(0.005)\n"
        "for _ in range(120):\n"
        "    p = subprocess.run([sys.executable, '-m', 'reconciler', 'agent', '--once', *args, '-o', 'json'],\n"
        "                       capture_output=True, text=True)\n"
        "    print(p.stdout.replace('\\n', ' '), flush=True)\n"
        "    r = json.loads(p.stdout or '{}').get('report') or {}\n"
        "    if r.get('commit') == head and r.get('state') == 'applied': break\n"
        "    time.sleep(0.2)\n"
    )
    procs = {n: subprocess.Popen([sys.executable, "-c", worker, str(go), head, *node_args(a, key)],
                                 stdout=subprocess.PIPE, text=True) for n, a in agents.items()}
    time.sleep(0.5)
    go.touch()
    outputs = {n: p.communicate(timeout=240)[0].splitlines() for n, p in procs.items()}
    go.unlink()
    return outputs


def disruptions(agent: Agent, commit: str) -> list[tuple[float, float, str]]:
    """(began, healthy again, node) of each restart of ``commit`` the node's own ledger records."""
    with sqlite3.connect(agent.cfg.state_dir / "state.db") as db:
        began = db.execute("SELECT time, service FROM journal WHERE commit_id=? AND action='restart'",
                           (commit,)).fetchall()
        ended = dict(db.execute("SELECT service, MAX(time) FROM history WHERE commit_id=? AND action='restart'",
                                (commit,)).fetchall())
    return [(t, float(ended[s]), agent.cfg.node) for t, s in began]


def most_at_once(spans: list[tuple[float, float, str]]) -> int:
    edges = sorted([(b, 1) for b, _, _ in spans] + [(e, -1) for _, e, _ in spans])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def test_three_controllers_restarting_at_once_take_turns_under_a_budget_of_one(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey, tmp_path: Path
) -> None:
    fleet = {n: agents(n, deployment.url) for n in CONTROLLERS}
    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml") + BUDGET)
    deployment.edit("services/db/service.yaml", "health:\n", "health:\n  min_healthy: 2\n")
    deployment.commit("budget: one controller at a time; db holds 2 s")
    for agent in fleet.values():
        assert agent.reconcile_once().exit_code == 0  # starts: nothing is disrupted
        agent.close()  # the processes below have the state dirs to themselves

    deployment.edit("services/db/templates/db.conf.j2", "name = db-{{ node }}", "name = db-{{ node }}-a")
    head = deployment.commit("db: new member name")
    outputs = converge_together(fleet, merge_key, head, tmp_path)
    spans = [s for n in CONTROLLERS for s in disruptions(fleet[n], head)]
    assert sorted(n for _, _, n in spans) == list(CONTROLLERS), spans
    assert most_at_once(spans) == 1, sorted(spans)
    waited = [line for n in CONTROLLERS for line in outputs[n] if "waiting (budget)" in line]
    assert any("waiting for ctl" in line for line in waited), outputs  # and says for whom
    for node in CONTROLLERS:
        assert (deployment.note(node, head) or {}).get("state") == "applied", node
        claim = json.loads(subprocess.run(["git", "notes", f"--ref=reconciler/{node}", "show",
                                           "4b825dc642cb6eb9a060e54bf8d69288fbee4904"], cwd=deployment.bare,
                                          capture_output=True, text=True, check=True).stdout)
        assert claim["claim"]["state"] == "free", (node, claim)  # every slot given back, on the remote

    # The same start without a budget: the restarts overlap (so the check above can fail).
    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml").replace(BUDGET, ""))
    no_budget = deployment.commit("no budget")
    converge_together(fleet, merge_key, no_budget, tmp_path)
    deployment.edit("services/db/templates/db.conf.j2", "name = db-{{ node }}-a", "name = db-{{ node }}-b")
    head = deployment.commit("db: another name")
    converge_together(fleet, merge_key, head, tmp_path)
    spans = [s for n in CONTROLLERS for s in disruptions(fleet[n], head)]
    assert len(spans) == 3 and most_at_once(spans) >= 2, sorted(spans)


def test_a_bad_budget_is_a_located_error(deployment: Deployment) -> None:
    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml")
                     + BUDGET.replace("max_disrupted: 1", "max_disrupted: 0"))
    proc = cli("validate", "--repo", str(deployment.work))
    line = next(i for i, t in enumerate(deployment.read("reconciler.yaml").splitlines(), 1) if "max_disrupted" in t)
    assert proc.returncode == 2
    assert f"reconciler.yaml:{line}: disruption budget of group 'controllers': max_disrupted '0'" in proc.stderr, \
        proc.stderr


GROUP = Budget("computes", frozenset({"cmp1", "cmp2", "cmp3", "cmp4"}), 2, "50%", timedelta(minutes=15))
NOW = 1_000_000.0


def claims(*entries: tuple[str, str, int, float]) -> dict[str, Claim]:
    return {n: Claim(n, state, ticket, t) for n, state, ticket, t in entries}


def test_the_bakery_lets_k_lowest_tickets_go_and_waits_for_choosers_and_forgets_the_dead() -> None:
    seen = claims(("cmp1", "queued", 3, NOW), ("cmp2", "queued", 4, NOW), ("cmp3", "queued", 5, NOW))
    assert next_ticket(seen, [GROUP], NOW) == 6
    me = Claim("cmp4", "queued", 6, NOW)
    assert str(wait(me, seen, [GROUP], NOW)).endswith("waiting for cmp1, cmp2, cmp3")
    assert wait(Claim("cmp2", "queued", 4, NOW), seen, [GROUP], NOW) is None  # only cmp1 ahead: 1 < 2
    # the same ticket: the node name breaks the tie, the same way on every node
    tied = claims(("cmp1", "queued", 3, NOW), ("cmp3", "queued", 3, NOW))
    assert wait(Claim("cmp3", "queued", 3, NOW), tied, [GROUP], NOW) is None
    assert wait(Claim("cmp3", "queued", 3, NOW), {**tied, "cmp2": Claim("cmp2", "queued", 1, NOW)},
                [GROUP], NOW) is not None
    # a node still choosing its ticket may come out lower: read again first
    choosing = {**seen, "cmp4": Claim("cmp4", "choosing", 0, NOW)}
    assert "cmp4 choosing a ticket" in str(wait(Claim("cmp1", "queued", 3, NOW), choosing, [GROUP], NOW))
    # claims not rewritten for expire_after (nodes that stopped answering) no longer count, nor do freed ones
    later = NOW + 16 * 60
    assert wait(Claim("cmp4", "queued", 6, later), seen, [GROUP], later) is None
    assert next_ticket(seen, [GROUP], later) == 1
    assert wait(me, {**seen, "cmp1": Claim("cmp1", "free", 0, NOW)}, [GROUP], NOW) is not None  # 2 still ahead
    assert wait(me, {**seen, "cmp1": Claim("cmp1", "free", 0, NOW), "cmp2": Claim("cmp2", "free", 0, NOW)},
                [GROUP], NOW) is None


@pytest.mark.parametrize(("spec", "count"), [("1", 1), ("25%", 1), ("50%", 2), ("100%", 4), ("3", 3)])
def test_max_disrupted_as_a_count_or_a_share_of_the_group(spec: str, count: int) -> None:
    [(_, budget)] = parse_budgets([{"group": "computes", "max_disrupted": spec}], {"computes": GROUP.members})
    assert isinstance(budget, Budget) and budget.max_disrupted == count
