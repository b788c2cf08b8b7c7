"""Kill the agent at every side effect of a change that fails under the default
``on_failure: service`` (the failed service alone goes back to its last good version), and check
that one more plain run finishes it (see test_crash_points.py for the method).

One node, two services of the process driver (test_crash_points' little HTTP app, which exits
at once when its ``level`` or its ``MODE`` says ``broken``). A commit breaks web, by a restart
(a config file change) or by a recreate (a runtime change: its env); web fails its check and
its driver starts the previous version again. Killed before each numbered side effect in turn,
one more plain run must leave, seen from outside:

- the commit's note on the remote ``failed``, naming web;
- web running its previous version and serving its old content, api untouched (the same
  process): one process per service, nothing else running from the state dir;
- no temp file in the state dir, no revision dir beyond web's good and broken versions, and a
  run after that with nothing to do.

History: ``C0 --- C1 (web broken) --- C2 (web broken: the same version) ...``, one commit per
kill point (a failed commit is not tried again; its broken version is written once).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SigningKey, free_port, small_deployment
from crash_fleet import kill_at
from test_crash_points import APP, SERVICE, Node, count_points, inventory
from test_faults import processes_of

from reconciler.settings import AgentConfig, TrustConfig

BREAKS = APP.replace("load()\nsignal", "load()\nif 'broken' in (CONF.get('level'), os.environ.get('MODE')):\n"
                                       "    sys.exit(3)\nsignal", 1)
GOOD = {"value": "a", "level": "info", "mode": "plain"}
BROKEN = {"restart": {**GOOD, "level": "broken"}, "recreate": {**GOOD, "mode": "broken"}}


@pytest.fixture
def node(tmp_path: Path, merge_key: SigningKey) -> Iterator[Node]:
    assert BREAKS != APP
    ports = {"web": free_port(), "api": free_port()}
    files = {"reconciler.yaml": "format: 1\nname: crash-putback-service\n", "inventory.yaml": inventory(GOOD, ports)}
    for name in ("web", "api"):  # checked once: dozens of passes run
        files[f"services/{name}/service.yaml"] = SERVICE.replace("timeout: 10", "timeout: 2\n  min_healthy: 0")
        files[f"services/{name}/templates/app.conf.j2"] = "[app]\nvalue = {{ values[service] }}\n" \
                                                          "level = {{ levels[service] }}\n"
        files[f"services/{name}/files/app.py"] = BREAKS
    dep = small_deployment(tmp_path, merge_key, files)
    cfg = AgentConfig(node="n1", remote=dep.url, state_dir=tmp_path / "state",
                      trust=TrustConfig(allowed_signers=merge_key.allowed_signers))
    n = Node(dep, cfg, ports)
    yield n
    for pids in processes_of(cfg.state_dir).values():
        for pid in pids:
            os.killpg(pid, 9)


def break_web(node: Node, kind: str) -> str:
    """A commit whose web fails its check: the same broken version every time."""
    node.commits += 1
    node.deployment.write("inventory.yaml", inventory(BROKEN[kind], node.ports))
    return node.deployment.commit(f"web: broken by a {kind} #{node.commits}")


def revisions(node: Node) -> dict[str, list[str]]:
    services = node.cfg.state_dir / "services"
    return {d.name: sorted(p.name for p in (d / "rev").iterdir()) for d in sorted(services.iterdir())}


def assert_kept(node: Node, commit: str, api: list[int], revs: dict[str, list[str]]) -> None:
    state = node.cfg.state_dir
    note = node.deployment.note("n1", commit) or {}
    assert note.get("state") == "failed", note
    services: dict[str, dict[str, str]] = note.get("services", {})  # type: ignore[assignment]
    assert [name for name, s in services.items() if s.get("result") == "failed"] == ["web"], note
    procs = processes_of(state)
    assert sorted(procs) == ["api", "web"] and all(len(p) == 1 for p in procs.values()), procs
    assert procs["api"] == api, (procs, api)  # api never restarted
    served = node.served("web")
    assert (served["value"], served["level"], served["mode"]) == (GOOD["value"], GOOD["level"], GOOD["mode"]), served
    assert node.served("api")["value"] == "one"
    leftovers = [p for p in state.rglob("*") if p.name.startswith((".rc-tmp-", ".tmp-")) and "mirror.git" not in p.parts]
    assert not leftovers, leftovers
    assert revisions(node) == revs
    again = node.run()
    assert getattr(again, "report", None) is None and getattr(again, "exit_code", 1) == 0, again


@pytest.mark.parametrize("kind", ["restart", "recreate"])
def test_killed_at_every_side_effect_of_a_failed_change_the_next_run_keeps_the_old_version(
    kind: str, node: Node, tmp_path: Path
) -> None:
    node.run()  # C0: both up
    api = processes_of(node.cfg.state_dir)["api"]
    first = break_web(node, kind)
    node.run()
    revs = revisions(node)  # web: its good and its broken version; later passes reuse them
    assert len(revs["web"]) == 2 and len(revs["api"]) == 1, revs
    assert_kept(node, first, api, revs)
    head = break_web(node, kind)
    points = count_points(node, None, tmp_path / "points.log")
    assert [p.split()[1] for p in points].count("spawn") >= 2, points  # the broken one, the good one again
    assert_kept(node, head, api, revs)
    for n in range(1, len(points) + 1):
        head = break_web(node, kind)
        kill_at(node, None, n, points, tmp_path / "killed.log")
        node.run()
        try:
            assert_kept(node, head, api, revs)
        except AssertionError as exc:
            raise AssertionError(f"killed before side effect {n} of {len(points)} ({points[n - 1]}): {exc}") from exc
