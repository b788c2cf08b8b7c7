"""Kill the agent at every side effect of a node-wide put-back (``on_failure: node``), and check
that one more plain run finishes it (see test_crash_points.py for the method).

One node, two services of the process driver (test_crash_points' little HTTP app): a commit
reloads api with a new value, then restarts web onto api's port, where it cannot listen. web
fails its check and its driver puts it back; under ``on_failure: node`` the pass then puts api
back to the version it ran before. Killed before each numbered side effect in turn, one more
plain run must leave, seen from outside:

- the commit's note on the remote ``failed``, saying api was put back;
- api serving its old value, web serving from its own port: one process each, nothing else
  running from the state dir (api may have been restarted: a run killed after it wrote api's
  files and before its signal leaves the planner unsure the reload was delivered);
- no temp file in the state dir, and a run after that with nothing to do.

History: ``C0 --- C1 (api: value 1; web: api's port) --- C2 (value 2; the same) ...``, one commit
per kill point (a failed commit is not tried again).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SigningKey, free_port, small_deployment
from crash_fleet import kill_at
from test_crash_points import APP, SERVICE, Node, count_points
from test_faults import processes_of

from reconciler.settings import AgentConfig, TrustConfig


def inventory(value: str, ports: dict[str, int], web_port: int) -> str:
    return (f"vars:\n  ports: {json.dumps({**ports, 'web': web_port})}\n"
            f"  values: {{api: {value}, web: w}}\n  levels: {{api: info, web: info}}\n"
            "  modes: {api: plain, web: plain}\ngroups:\n  g: {services: [api, web]}\nnodes:\n  n1: {groups: [g]}\n")


@pytest.fixture
def node(tmp_path: Path, merge_key: SigningKey) -> Iterator[Node]:
    ports = {"api": free_port(), "web": free_port()}
    files = {"reconciler.yaml": "format: 1\nname: crash-putback\non_failure: node\n",
             "inventory.yaml": inventory("a", ports, ports["web"])}
    # Short holds (dozens of passes run): api is checked once; web's broken version dies within
    # a tenth of a second of its start, inside its hold, while api answers on that port.
    # web depends on api, so api is restarted, healthy and holding its port before web starts:
    # a run that finds api's reload interrupted restarts it, and were both started together,
    # web could take the port first and both checks pass (api's hold is 0, on one answer).
    for name, hold, extra in (("api", "0", ""), ("web", "0.3", "depends_on: [api]\n")):
        files[f"services/{name}/service.yaml"] = SERVICE.replace("timeout: 10", f"timeout: 2\n  min_healthy: {hold}") \
            + extra
        files[f"services/{name}/templates/app.conf.j2"] = "[app]\nvalue = {{ values[service] }}\n" \
                                                          "level = {{ levels[service] }}\n"
        files[f"services/{name}/files/app.py"] = APP
    dep = small_deployment(tmp_path, merge_key, files)
    cfg = AgentConfig(node="n1", remote=dep.url, state_dir=tmp_path / "state",
                      trust=TrustConfig(allowed_signers=merge_key.allowed_signers))
    n = Node(dep, cfg, ports)
    yield n
    for pids in processes_of(cfg.state_dir).values():
        for pid in pids:
            os.killpg(pid, 9)


def break_web(node: Node) -> str:
    """A commit that reloads api with a new value and moves web onto api's port."""
    node.commits += 1
    node.deployment.write("inventory.yaml", inventory(f"v{node.commits}", node.ports, node.ports["api"]))
    return node.deployment.commit(f"api: value {node.commits}; web: api's port")


def assert_put_back(node: Node, commit: str) -> None:
    note = node.deployment.note("n1", commit) or {}
    assert note.get("state") == "failed", note
    events = [str(e) for e in note.get("events", [])]  # type: ignore[attr-defined]
    assert any(e.startswith("on_failure node: api put back to") for e in events), note
    procs = processes_of(node.cfg.state_dir)
    assert sorted(procs) == ["api", "web"] and all(len(p) == 1 for p in procs.values()), procs
    assert node.served("api")["value"] == "a", node.served("api")
    assert node.served("web")["value"] == "w", node.served("web")
    leftovers = [p for p in node.cfg.state_dir.rglob("*") if p.name.startswith((".rc-tmp-", ".tmp-"))
                 and "mirror.git" not in p.parts]
    assert not leftovers, leftovers
    again = node.run()
    assert getattr(again, "report", None) is None and getattr(again, "exit_code", 1) == 0, again


def test_killed_at_every_side_effect_of_a_node_wide_put_back_the_next_run_finishes_it(
    node: Node, tmp_path: Path
) -> None:
    node.run()
    first = break_web(node)
    node.run()
    assert_put_back(node, first)  # web's broken revision is written once: later passes reuse it
    head = break_web(node)
    points = count_points(node, None, tmp_path / "putback.log")
    kinds = [p.split()[1] for p in points]
    assert kinds.count("signal") >= 3 and kinds.count("spawn") >= 2, points  # reloads, web's two starts
    assert_put_back(node, head)
    for n in range(1, len(points) + 1):
        head = break_web(node)
        kill_at(node, None, n, points, tmp_path / "killed.log")
        node.run()
        try:
            assert_put_back(node, head)
        except AssertionError as exc:
            raise AssertionError(f"killed before side effect {n} of {len(points)} ({points[n - 1]}): {exc}") from exc
