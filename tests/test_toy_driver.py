"""A driver kind defined here, registered through the registry of kinds alone, runs a service
end to end through the real agent: applied, restarted on a change, stopped on removal.

The toy driver "runs" a service by writing its files and a record in its own state directory,
and observes from them: nothing in the agent names it, so it works only if every place that
needs a driver asks the registry (the repo's checks, the planner, the pass, the observation).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import SigningKey, small_deployment

from reconciler.agent import Agent
from reconciler.core.model import DesiredService, ObservedService
from reconciler.drivers import Driver, kinds
from reconciler.drivers.base import Check
from reconciler.drivers.files import read_dir, read_record, sync_dir, write_record


class ToyDriver:
    """A service is "running" while its record says so; its files are written to ``live``."""

    name = "toy"

    def __init__(self, root: Path, node: str) -> None:
        self.root = root
        self.node = node
        self.starts: dict[str, int] = {}

    def _write(self, svc: DesiredService, commit: str, running: bool = True) -> int:
        d = self.root / svc.name
        sync_dir(d / "live", svc.files)
        before = read_record(d) or {}
        starts = int(before.get("starts", 0)) + 1
        write_record(d, {"service": svc.name, "hash": svc.hash, "commit": commit, "running": running,
                         "fingerprint": svc.fingerprint(), "drift": svc.drift, "starts": starts})
        return starts

    def observe(self) -> list[ObservedService]:
        out = []
        for d in sorted(self.root.iterdir()) if self.root.is_dir() else ():
            rec = read_record(d)
            if rec is None:
                continue
            out.append(ObservedService(
                name=d.name, driver=self.name, running=bool(rec["running"]), hash=rec["hash"],
                commit=rec["commit"], pid=None, fingerprint=tuple(sorted(rec["fingerprint"].items())),
                files=read_dir(d / "live"), drift=str(rec["drift"])))
        return out

    def liveness(self) -> list[ObservedService]:
        return self.observe()

    def start(self, svc: DesiredService, commit: str, check: Check) -> int | None:
        self._write(svc, commit)
        check()
        return None

    restart = recreate = reload = start

    def update(self, svc: DesiredService, commit: str) -> None:
        self._write(svc, commit)

    def connect(self, svc: DesiredService, commit: str, check: Check | None = None) -> None:
        self._write(svc, commit)

    def remove(self, name: str) -> None:
        d = self.root / name
        (d / "record.json").unlink(missing_ok=True)
        for f in sorted((d / "live").rglob("*"), reverse=True) if (d / "live").is_dir() else ():
            f.unlink() if f.is_file() else f.rmdir()
        with contextlib.suppress(OSError):
            (d / "live").rmdir()
            d.rmdir()

    def running(self, name: str) -> bool:
        rec = read_record(self.root / name)
        return bool(rec and rec["running"])

    def logs(self, name: str, lines: int, follow: bool) -> Iterator[bytes]:
        return iter(())

    def native_health(self, name: str) -> str | None:
        return None

    def run_check(self, name: str, command: str) -> bool:
        return self.running(name)

    def revive(self, name: str) -> int | None:
        return None

    def last_output(self, name: str, lines: int = 5) -> str:
        return ""


def _make(ctx: kinds.DriverContext, root: Path) -> Driver:
    return ToyDriver(root, ctx.node)


@pytest.fixture
def toy() -> Iterator[kinds.Kind]:
    kind = kinds.Kind("toy", "toy", _make, needs_command=False)
    kinds.register(kind)
    try:
        yield kind
    finally:
        kinds.unregister("toy")
    assert "toy" not in kinds.names()


SERVICE = """\
driver: toy
files:
  - {path: greeting.txt, template: greeting.txt.j2}
"""


def test_a_registered_kind_runs_a_service_through_the_agent(
    toy: kinds.Kind, tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]
) -> None:
    dep = small_deployment(tmp_path, merge_key, {
        "reconciler.yaml": "format: 1\nname: toy\n",
        "inventory.yaml": "vars: {word: hello}\ngroups:\n  g: {services: [greeter]}\nnodes:\n  n1: {groups: [g]}\n",
        "services/greeter/service.yaml": SERVICE,
        "services/greeter/templates/greeting.txt.j2": "{{ word }} from {{ node }}\n",
    }, "toy")
    node = agents("n1", dep.url)
    record = node.cfg.state_dir / toy.state_dir / "greeter" / "record.json"

    first = node.reconcile_once()

    assert first.exit_code == 0, first
    note = dep.note("n1")
    assert note is not None and note["state"] == "applied"
    assert note["services"]["greeter"]["action"] == "start"  # type: ignore[index]
    live = node.cfg.state_dir / "toy" / "greeter" / "live" / "greeting.txt"
    assert live.read_text() == "hello from n1\n"
    assert json.loads(record.read_text())["starts"] == 1

    dep.edit("inventory.yaml", "word: hello", "word: howdy")
    dep.commit("a new word")
    assert actions(node) == {"greeter": "restart"}
    assert live.read_text() == "howdy from n1\n"
    assert json.loads(record.read_text())["starts"] == 2

    dep.edit("inventory.yaml", "services: [greeter]", "services: []")
    dep.commit("greeter goes")
    assert actions(node) == {"greeter": "stop"}
    assert not record.exists()


def actions(node: Agent) -> dict[str, str]:
    """One pass, which must succeed: the action taken on each service."""
    result = node.reconcile_once()
    assert result.exit_code == 0 and result.report is not None, result
    return {r.service: str(r.action) for r in result.report.services}
