"""Day-2 commands killed at every side effect (docs/day2.md): `reconciler stop`, `reconciler
start` and a decommission pass, each killed (SIGKILL, in a forked child) just before its Nth
numbered side effect in turn; one more ordinary pass must finish what was asked, and its note
must say so. A cheap node: two sleeping processes, ``web`` depending on ``db`` (so a stop has
two stops, dependents first), run by a fresh agent each time (``test_crash_points``' helpers).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import Deployment, SigningKey, git, note_key, small_deployment
from test_crash_points import count_points, killed_at, one_pass
from test_faults import processes_of

from reconciler.agent import Agent
from reconciler.drivers.observe import observe
from reconciler.node import stopping
from reconciler.node.context import drivers_for
from reconciler.settings import AgentConfig, TrustConfig

SLEEPER = ("runtime:\n  command: [python3, sleeper.py]\n"
           "files:\n  - {path: sleeper.py, source: sleeper.py}\n")
ACTIVE: dict[str, object] = {"groups": {"g": {"services": ["db", "web"]}}, "nodes": {"n1": {"groups": ["g"]}, "n2": {"groups": ["g"]}}}
LEAVING: dict[str, object] = {"groups": {"g": {"services": ["db", "web"]}}, "nodes": {"n2": {"groups": ["g"]}}, "decommission": ["n1"]}


@dataclass
class DayTwoNode:
    deployment: Deployment
    cfg: AgentConfig

    def run(self, operation: Callable[[Agent], object] | None = None) -> object:
        return one_pass(self.cfg, operation)

    def running(self) -> set[str]:
        return {o.name for o in observe("n1", drivers_for(self.cfg, None)).services if o.running}

    def inventory(self, doc: Mapping[str, object], message: str) -> str:
        self.deployment.write("inventory.yaml", yaml.safe_dump(doc))
        return self.deployment.commit(message)

    def note(self, commit: str) -> dict[str, object]:
        return self.deployment.note("n1", commit) or {}


def events(note: dict[str, object]) -> str:
    said = note.get("events")
    return "\n".join(str(e) for e in (said if isinstance(said, list) else []))


@pytest.fixture
def node(tmp_path: Path, merge_key: SigningKey) -> Iterator[DayTwoNode]:
    files = {
        "reconciler.yaml": "format: 1\nname: daytwo\n",
        "inventory.yaml": yaml.safe_dump(ACTIVE),
        "services/db/service.yaml": SLEEPER,
        "services/db/files/sleeper.py": "import time\nwhile True:\n    time.sleep(60)\n",
        "services/web/service.yaml": SLEEPER + "depends_on: [db]\n",
        "services/web/files/sleeper.py": "import time\nwhile True:\n    time.sleep(60)\n",
    }
    dep = small_deployment(tmp_path, merge_key, files)
    cfg = AgentConfig(node="n1", remote=dep.url, state_dir=tmp_path / "state", note_key=note_key("n1"),
                      trust=TrustConfig(allowed_signers=merge_key.allowed_signers))
    n = DayTwoNode(dep, cfg)
    n.run()
    assert n.running() == {"db", "web"}
    yield n
    for pids in processes_of(cfg.state_dir).values():
        for pid in pids:
            os.killpg(pid, 9)


def stop_db(agent: Agent) -> object:
    return stopping.stop(agent.ctx, ["db"], "alice")


def start_all(agent: Agent) -> object:
    return stopping.start(agent.ctx, [], "alice")


def test_a_stop_killed_at_every_side_effect_is_finished_by_the_next_pass_and_noted(
    node: DayTwoNode, tmp_path: Path
) -> None:
    points = count_points(node, stop_db, tmp_path / "points.log")  # type: ignore[arg-type]
    kinds = [p.split()[1] for p in points]
    assert kinds[0] == "db" and kinds.count("db") >= 2, points  # the hold, then each stop's journal
    for n in range(2, len(points) + 1):  # before the first (the hold): nothing was asked yet
        node.run(start_all)
        node.run()
        assert node.running() == {"db", "web"}, n
        killed_at(node, stop_db, n, points)  # type: ignore[arg-type]
        node.run()
        what = f"killed before side effect {n} of {len(points)} ({points[n - 1]})"
        assert node.running() == set(), what
        head = node.deployment.note("n1", _head(node)) or {}
        assert "held stopped by alice (reconciler stop): db, web" in events(head), (what, head)
        assert head.get("held") == ["db", "web"], (what, head)
        services = head.get("services")
        for name, entry in (services.items() if isinstance(services, dict) else ()):
            if isinstance(entry, dict) and entry.get("action") == "stop":  # the pass stopped what the kill left
                assert "held stopped by alice" in str(entry.get("reason", "")), (what, name, entry)


def test_a_start_killed_at_every_side_effect_is_finished_by_the_next_pass_and_noted(
    node: DayTwoNode, tmp_path: Path
) -> None:
    node.run(stop_db)
    points = count_points(node, start_all, tmp_path / "points.log")  # type: ignore[arg-type]
    node.run()  # they run again
    for n in range(2, len(points) + 1):  # before the first (the release): nothing was asked yet
        node.run(stop_db)
        node.run()
        assert node.running() == set(), n
        killed_at(node, start_all, n, points)  # type: ignore[arg-type]
        node.run()
        what = f"killed before side effect {n} of {len(points)} ({points[n - 1]})"
        assert node.running() == {"db", "web"}, what
        note = node.deployment.note("n1", _head(node)) or {}
        assert "hold lifted by alice (reconciler start): db, web" in events(note), (what, note)
        assert "held" not in note, (what, note)


def test_a_decommission_pass_killed_at_every_side_effect_ends_retired_and_noted_by_the_next(
    node: DayTwoNode, tmp_path: Path
) -> None:
    """Each round: the node named again (it converges), then listed under `decommission`, the
    pass killed before its Nth side effect; the next pass must end it retired, its services
    stopped, and the note on the remote saying `decommissioned`."""
    node.inventory(LEAVING, "n1 leaves")
    node.run()
    node.inventory(ACTIVE, "n1 back")
    node.run()
    node.inventory(LEAVING, "n1 leaves again")
    points = count_points(node, None, tmp_path / "points.log")  # type: ignore[arg-type]
    assert [p for p in points if p.split()[1] == "db"], points
    for n in range(1, len(points) + 1):
        node.inventory(ACTIVE, f"n1 back #{n}")
        node.run()
        assert node.running() == {"db", "web"}, n
        head = node.inventory(LEAVING, f"n1 leaves #{n}")
        killed_at(node, None, n, points)  # type: ignore[arg-type]
        node.run()
        what = f"killed before side effect {n} of {len(points)} ({points[n - 1]})"
        assert node.running() == set(), what
        note = node.note(head)
        assert note.get("state") == "applied" and f"decommissioned at {head[:12]}" in events(note), (what, note)
        retired = node.run(lambda a: a.ctx.ledger.retired())
        assert isinstance(retired, dict) and retired["commit"] == head, (what, retired)


def _head(node: DayTwoNode) -> str:
    return git("rev-parse", "HEAD", cwd=node.deployment.work)
