"""The sliding window of parallel starts, as a crash tester sees it: a failure stops every start
that comes after it, whichever way the failure arrives; what depends on a failed service never
starts; and a pass leaves no thread of its window behind.

Each service writes when its health check runs to one shared file, under its own name (its own
records, never a wall-clock bound).

The kill test reuses ``test_crash_points``'s machinery: the agent killed (SIGKILL) before each
numbered side effect of a pass in which two services restart together, one more run must finish.

History (one node)::

    C1 every service deployed at once (one of them cannot start)

History (the kill test: one node, ``web`` and ``api``, ``max_parallel: 2``)::

    C0 --- C1 (both restart: a new level each) --- C2 ... one commit per kill point
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from conftest import Deployment, SigningKey, free_port, small_deployment
from test_crash_points import APP, Node, count_points, inventory, one_pass, recovers_from_each
from test_crash_points import SERVICE as WEB
from test_faults import processes_of
from test_parallel_starts import holds, sleepers

from reconciler.agent import Agent
from reconciler.node.context import Memory
from reconciler.node.peers import WATCH_AT_MOST, watch
from reconciler.settings import AgentConfig, TrustConfig

SLEEPS = '[sh, -c, "exec sleep 1000"]'
MISSING = "[no-such-command-for-this-test]"  # found on no PATH: fails before any wait


def services(tmp_path: Path, key: SigningKey, held: dict[str, tuple[str, float]],
             depends: dict[str, list[str]] | None = None) -> tuple[Deployment, Path]:
    """One node running ``held``'s services: each its command and how long it is held healthy."""
    return sleepers(tmp_path, key, list(held), hold={n: h for n, (_, h) in held.items()}, depends=depends,
                    command={n: c for n, (c, _) in held.items()})


def window_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("apply-")]


def test_a_service_that_fails_before_it_waits_stops_the_starts_after_it_in_the_same_window(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]
) -> None:
    # Three slots, three independent services: b cannot even be spawned (no such command), so it
    # fails while a holds and before c would start.
    dep, checks = services(tmp_path, merge_key, {"a": (SLEEPS, 1.0), "b": (MISSING, 0.1), "c": (SLEEPS, 0.1)})
    node = agents("n1", dep.url, max_parallel=3)

    result = node.reconcile_once()

    assert result.exit_code == 1 and result.report is not None
    by = {r.service: r for r in result.report.services}
    assert str(by["b"].state) == "failed" and "not found" in by["b"].detail, by["b"]
    # a was under way and finished; c came after b's failure and never started.
    assert {n: str(by[n].state) for n in "ac"} == {"a": "ok", "c": "skipped"}, by
    assert by["c"].detail == "not applied: b failed first"
    assert sorted(processes_of(node.cfg.state_dir)) == ["a"]
    assert sorted(holds(checks)) == ["a"]
    assert window_threads() == []


def test_what_depends_on_a_failed_service_never_starts_in_a_diamond(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]
) -> None:
    # d needs b and c, which both need a; c cannot start; e needs nothing and holds meanwhile.
    dep, checks = services(
        tmp_path, merge_key,
        {"a": (SLEEPS, 0.1), "b": (SLEEPS, 0.8), "c": (MISSING, 0.1), "d": (SLEEPS, 0.1), "e": (SLEEPS, 0.1)},
        depends={"b": ["a"], "c": ["a"], "d": ["b", "c"]})
    node = agents("n1", dep.url, max_parallel=4)

    result = node.reconcile_once()

    assert result.exit_code == 1 and result.report is not None
    state = {r.service: str(r.state) for r in result.report.services}
    assert state == {"a": "ok", "b": "ok", "c": "failed", "d": "skipped", "e": "ok"}, state
    spans = holds(checks)
    assert "d" not in spans and spans["a"][1] < spans["b"][0], spans  # b only after a was healthy
    assert sorted(processes_of(node.cfg.state_dir)) == ["a", "b", "e"]
    assert window_threads() == []


def test_killed_at_every_side_effect_of_two_services_restarting_together_the_next_run_finishes_it(
    tmp_path: Path, merge_key: SigningKey
) -> None:
    ports = {"web": free_port(), "api": free_port()}
    web = {"value": "a", "level": "info", "mode": "plain"}
    files = {"reconciler.yaml": "format: 1\nname: crash\n", "inventory.yaml": inventory(web, ports)}
    for name in ("web", "api"):
        files.update({f"services/{name}/service.yaml": WEB + "  min_healthy: 0\n", f"services/{name}/files/app.py": APP,
                      f"services/{name}/templates/app.conf.j2":
                          "[app]\nvalue = {{ values[service] }}\nlevel = {{ levels[service] }}\n"})
    dep = small_deployment(tmp_path, merge_key, files)
    node = Node(dep, AgentConfig(node="n1", remote=dep.url, state_dir=tmp_path / "state", max_parallel=2,
                                 trust=TrustConfig(allowed_signers=merge_key.allowed_signers)), ports)

    def both_restart(_: int = 0) -> tuple[Node, str]:
        """A commit giving web and api a new level each (a restart of each: levels are no reload key)."""
        node.commits += 1
        node.web["level"] = f"level{node.commits}"
        dep.write("inventory.yaml", inventory(node.web, ports).replace("api: info}", f"api: level{node.commits}}}"))
        return node, dep.commit(f"both restart #{node.commits}")

    def api_serves_the_head(node: Node) -> None:
        assert node.served("api")["level"] == f"level{node.commits}"

    try:
        node.run()
        both_restart()
        points = count_points(node, None, tmp_path / "points.log")
        # Both old processes are stopped and both new ones spawned before either is recorded.
        spawns = [i for i, p in enumerate(points) if p.split()[1] == "spawn"]
        recorded = [i for i, p in enumerate(points) if p.split()[1:3] == ["db", "history"]]
        assert len(spawns) == 2 and len(recorded) == 2 and spawns[1] < recorded[0], points
        recovers_from_each(points, both_restart, api_serves_the_head)
    finally:
        for pids in processes_of(node.cfg.state_dir).values():
            for pid in pids:
                os.killpg(pid, 9)


def test_ctrl_c_while_three_services_hold_stops_the_pass_and_the_next_run_finishes_it(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]
) -> None:
    dep, checks = services(tmp_path, merge_key, {n: (SLEEPS, 1.5) for n in "abc"})
    cfg = agents("n1", dep.url, max_parallel=3).cfg
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child: an `agent --once` the operator interrupts
        code = 3
        try:
            one_pass(cfg)
            code = 0
        except KeyboardInterrupt:
            code = 130
        finally:
            os._exit(code)
    try:
        while sorted(holds(checks) if checks.exists() else {}) != ["a", "b", "c"]:
            time.sleep(0.02)  # all three spawned and holding
    finally:
        os.kill(pid, signal.SIGINT)
    _, status = os.waitpid(pid, 0)
    # The pass stopped there: nothing recorded as applied, in the ledger or the note.
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 130, status
    assert dep.note("n1") is None
    assert one_pass(cfg, lambda a: [h for h in a.ledger.history() if h.result == "ok"]) == []

    # The next run finds what the interrupted one had started (its journal) and finishes it.
    result = one_pass(cfg)
    assert getattr(result, "exit_code", None) == 0 and (dep.note("n1") or {}).get("state") == "applied", result
    procs = processes_of(cfg.state_dir)
    assert sorted(procs) == ["a", "b", "c"] and all(len(p) == 1 for p in procs.values()), procs


def test_a_node_waiting_on_many_slot_holders_watches_a_few_of_them_never_itself() -> None:
    def watched(node: str, nodes: list[str]) -> tuple[str, ...]:
        memory = Memory()
        watch(cast(Any, SimpleNamespace(node=node, memory=memory)), nodes)
        return memory.watch

    others = [f"n{i:02d}" for i in range(1, 11)]
    mine = watched("n00", ["n00", *others, "n01"])
    assert WATCH_AT_MOST == 4 and len(mine) == 4 and len(set(mine)) == 4 and set(mine) <= set(others)
    assert watched("n00", list(reversed(others))) == mine  # the same few, whatever the order given
    # Each waiting node its own few: not one notes ref that every waiting node reads.
    assert len({watched(f"w{k}", others) for k in range(8)}) > 1
    assert watched("n01", ["n01"]) == ()
