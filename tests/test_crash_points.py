"""Kill the agent at every side effect of a run, in turn, and check that one more run finishes.

A side effect is whatever ``reconciler.core.faults.point`` numbers: file renames, spawns, signals,
ledger writes, notes written and pushed. For each kind of change (a restart, a reload, a
recreate, an operator's rollback and unpin) the run is first counted, then, for every point N,
a new commit of that kind is made and the agent is killed (SIGKILL, in a forked child) just
before its Nth side effect; one more ordinary run must leave:

- the head applied and noted (the note on the remote says ``applied``; nothing says applied
  for a commit that was not),
- exactly one process per service, and it serves the values of the commit it should run,
- no temp file or half-written revision anywhere in the state dir,
- a run after that with nothing to do.

History (one node, two services, ``web`` changes, ``api`` never does)::

    C0 --- C1 (web: kind of change) --- C2 (web: back) --- C3 ... one commit per kill point
"""

from __future__ import annotations

import json
import os
import signal
import traceback
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import Deployment, SigningKey, free_port, small_deployment
from test_faults import processes_of

from reconciler.agent import Agent
from reconciler.core import faults
from reconciler.node import operations
from reconciler.settings import AgentConfig, TrustConfig

APP = '''\
import http.server, json, os, signal, sys

def load():
    global CONF
    CONF = dict(line.split(" = ", 1) for line in open("app.conf").read().splitlines() if " = " in line)

load()
signal.signal(signal.SIGHUP, lambda *_: load())

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({**CONF, "mode": os.environ.get("MODE", "")}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
server.serve_forever()
'''

SERVICE = '''\
runtime:
  command: [python3, app.py, "{{ ports[service] }}"]
  env: {MODE: "{{ modes[service] }}"}
files:
  - {path: app.conf, template: app.conf.j2}
  - {path: app.py, source: app.py}
reload: {signal: SIGHUP}
on_change:
  - {file: app.conf, keys: [app.value], action: reload}
health:
  http: "http://127.0.0.1:{{ ports[service] }}/"
  timeout: 10
'''


def inventory(web: dict[str, str], ports: dict[str, int]) -> str:
    return (f"vars:\n  ports: {json.dumps(ports)}\n"
            f"  values: {{web: {web['value']}, api: one}}\n"
            f"  levels: {{web: {web['level']}, api: info}}\n"
            f"  modes: {{web: {web['mode']}, api: plain}}\n"
            "groups:\n  g: {services: [web, api]}\nnodes:\n  n1: {groups: [g]}\n")


@dataclass
class Node:
    deployment: Deployment
    cfg: AgentConfig
    ports: dict[str, int]
    web: dict[str, str] = field(default_factory=lambda: {"value": "a", "level": "info", "mode": "plain"})
    commits: int = 0

    def change(self, kind: str) -> str:
        """A new commit that changes web in a way that needs ``kind``."""
        self.commits += 1
        key = {"restart": "level", "reload": "value", "recreate": "mode"}[kind]
        self.web[key] = f"{key}{self.commits}"
        self.deployment.write("inventory.yaml", inventory(self.web, self.ports))
        return self.deployment.commit(f"web: {kind} #{self.commits}")

    def served(self, service: str) -> dict[str, str]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[service]}/", timeout=5) as resp:
            return dict(json.loads(resp.read()))

    def run(self, operation: Callable[[Agent], object] | None = None) -> object:
        return one_pass(self.cfg, operation)


def in_child(node: Node, operation: Callable[[Agent], object] | None, env: dict[str, str]) -> int:
    """Run one operation in a forked child with the fault settings; its exit status."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.environ.update(env)
            faults.reset()
            node.run(operation)
        except BaseException:
            traceback.print_exc()
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


def one_pass(cfg: AgentConfig, operation: Callable[[Agent], object] | None = None) -> object:
    """A plain pass (or ``operation``) by a fresh agent over ``cfg``, closed after: what every
    node of a kill test runs, before and after each kill."""
    agent = Agent(cfg, progress=False)
    try:
        return (operation or (lambda a: a.reconcile_once()))(agent)
    finally:
        agent.close()


def killed_at(node: Node, operation: Callable[[Agent], object] | None, n: int, points: list[str]) -> None:
    """Run the operation with a fault at side effect ``n``: the child must die there, by SIGKILL.
    A run that ends by itself (fewer side effects than were counted) tested no crash."""
    status = in_child(node, operation, {"RECONCILER_FAULT_AT": str(n)})
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
        f"not killed before side effect {n} of {len(points)} ({points[n - 1]}): wait status {status}")


def count_points(node: Node, operation: Callable[[Agent], object] | None, log: Path) -> list[str]:
    log.unlink(missing_ok=True)
    assert in_child(node, operation, {"RECONCILER_FAULT_LOG": str(log)}) == 0
    return log.read_text().splitlines()


@pytest.fixture
def node(tmp_path: Path, merge_key: SigningKey) -> Iterator[Node]:
    ports = {"web": free_port(), "api": free_port()}
    web = {"value": "a", "level": "info", "mode": "plain"}
    files = {
        "reconciler.yaml": "format: 1\nname: crash\n",
        "inventory.yaml": inventory(web, ports),
        "services/web/service.yaml": SERVICE,
        "services/web/templates/app.conf.j2": "[app]\nvalue = {{ values[service] }}\nlevel = {{ levels[service] }}\n",
        "services/web/files/app.py": APP,
        "services/api/service.yaml": SERVICE,
        "services/api/templates/app.conf.j2": "[app]\nvalue = {{ values[service] }}\nlevel = {{ levels[service] }}\n",
        "services/api/files/app.py": APP,
    }
    dep = small_deployment(tmp_path, merge_key, files)
    cfg = AgentConfig(node="n1", remote=dep.url, state_dir=tmp_path / "state",
                      trust=TrustConfig(allowed_signers=merge_key.allowed_signers))
    n = Node(dep, cfg, ports)
    yield n
    from reconciler.drivers.process import ProcessDriver

    driver = ProcessDriver(cfg.state_dir / "services", "n1")
    for o in driver.observe():
        driver.remove(o.name)
    for pids in processes_of(cfg.state_dir).values():
        for pid in pids:
            os.killpg(pid, 9)


def assert_recovered(node: Node, head: str, web_pinned: dict[str, str] | None = None) -> None:
    state = node.cfg.state_dir
    note = node.deployment.note("n1", head) or {}
    assert note.get("state") == "applied", note
    procs = processes_of(state)
    assert sorted(procs) == ["api", "web"] and all(len(p) == 1 for p in procs.values()), procs
    want = web_pinned or node.web
    served = node.served("web")
    assert (served["value"], served["level"], served["mode"]) == (want["value"], want["level"], want["mode"]), served
    assert node.served("api")["value"] == "one"
    leftovers = [p for p in state.rglob("*") if p.name.startswith((".rc-tmp-", ".tmp-")) and "mirror.git" not in p.parts]
    assert not leftovers, leftovers
    again = node.run()
    assert getattr(again, "report", None) is None and getattr(again, "exit_code", 1) == 0, again


@pytest.mark.parametrize("kind", ["restart", "reload", "recreate"])
def test_killed_at_every_side_effect_of_a_change_the_next_run_finishes_it(
    kind: str, node: Node, tmp_path: Path
) -> None:
    node.run()  # C0 converged: both services up
    node.change(kind)
    points = count_points(node, None, tmp_path / "points.log")
    assert any(p.split()[1] == "note" for p in points) and any(p.split()[1] == "db" for p in points), points
    recovers_from_each(points, lambda n: (node, node.change(kind)))


def recovers_from_each(points: list[str], ready: Callable[[int], tuple[Node, str]],
                       done: Callable[[Node], None] = lambda node: None) -> None:
    """For each numbered side effect n: the node ``ready(n)`` gives (and the head it must end
    at) is killed before n, run again, and must have recovered; ``done`` then cleans it."""
    for n in range(1, len(points) + 1):
        node, head = ready(n)
        killed_at(node, None, n, points)
        node.run()
        try:
            assert_recovered(node, head)
        except AssertionError as exc:
            raise AssertionError(f"killed before side effect {n} of {len(points)} ({points[n - 1]}): {exc}") from exc
        finally:
            done(node)


def test_killed_at_every_side_effect_of_a_rollback_and_an_unpin(node: Node, tmp_path: Path) -> None:
    node.run()
    before = dict(node.web)
    head = node.change("reload")
    node.run()

    def rollback(agent: Agent) -> object:
        return operations.rollback(agent.ctx, "web")

    def unpin(agent: Agent) -> object:
        return operations.unpin(agent.ctx, "web")

    points = count_points(node, rollback, tmp_path / "rollback.log")
    node.run()
    assert_recovered(node, head, web_pinned=before)
    node.run(unpin)
    node.run()
    assert_recovered(node, head)
    for n in range(1, len(points) + 1):
        killed_at(node, rollback, n, points)
        node.run()
        pinned = node.run(lambda a: [p.service for p in a.ledger.pins()])
        try:  # the rollback happened whole, or not at all: either way a consistent node
            assert_recovered(node, head, web_pinned=before if pinned == ["web"] else None)
        except AssertionError as exc:
            raise AssertionError(f"rollback killed before side effect {n} ({points[n - 1]}): {exc}") from exc
        node.run(unpin)
        node.run()
        assert_recovered(node, head)

    node.run(rollback)
    unpin_points = count_points(node, unpin, tmp_path / "unpin.log")
    node.run()
    assert_recovered(node, head)
    for n in range(1, len(unpin_points) + 1):
        node.run(rollback)
        node.run()
        killed_at(node, unpin, n, unpin_points)
        node.run()
        pinned = node.run(lambda a: [p.service for p in a.ledger.pins()])
        try:
            assert_recovered(node, head, web_pinned=before if pinned == ["web"] else None)
        except AssertionError as exc:
            raise AssertionError(f"unpin killed before side effect {n} ({unpin_points[n - 1]}): {exc}") from exc
        node.run(unpin)
        node.run()
