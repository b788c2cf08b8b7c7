"""Services that do not depend on each other start, restart and hold their health together, up
to the node's ``max_parallel``; what depends on another waits for it to be healthy.

Each service's health check writes the time it ran to one shared file: a service's hold is the
span from its first check to its last, so the tests read overlapping holds off the services'
own records, never off a wall-clock bound. A side effect (spawn, rename, ledger write) still
happens one at a time, in plan order: the kill test below kills the agent before each one.

History (one node)::

    C1 every service deployed --- C2 every service changed (one of them breaks)
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
from conftest import Deployment, SigningKey, free_port, small_deployment
from test_crash_points import (
    APP,
    SERVICE,
    Node,
    count_points,
    inventory,
    recovers_from_each,
)
from test_faults import processes_of

from reconciler.agent import Agent
from reconciler.core.aside import pause
from reconciler.core.errors import ConfigError
from reconciler.core.model import Action, ActionKind
from reconciler.node.batches import Wait, alone, startable, together
from reconciler.settings import AgentConfig, TrustConfig
from reconciler.settings.load import load_config

# Starts only when its config says ok (a version that is not exits at once); its check writes
# when it ran, under its own name.
SLEEPER = """\
runtime:
  command: {command}
files:
  - {{path: app.conf, template: app.conf.j2}}
health:
  command: 'echo "$RECONCILER_SERVICE $(date +%s.%N)" >> {{{{ checks }}}}'
  min_healthy: {hold}
  timeout: 10
{extra}"""


def sleepers(tmp_path: Path, key: SigningKey, names: list[str], hold: float | Mapping[str, float] = 0.5,
             depends: dict[str, list[str]] | None = None,
             command: str | Mapping[str, str] = "grep -q 'ok = yes' app.conf && exec sleep 1000"
             ) -> tuple[Deployment, Path]:
    """One node running ``names``, each held healthy for ``hold`` (or its own), its process a
    shell ``command`` (or its own; one in brackets is the argv itself)."""
    checks = tmp_path / "checks.log"
    files = {
        "reconciler.yaml": "format: 1\nname: parallel\n",
        "inventory.yaml": f"vars: {{checks: {checks}, version: 1, bad: none}}\n"
                          f"groups:\n  g: {{services: [{', '.join(names)}]}}\nnodes:\n  n1: {{groups: [g]}}\n",
    }
    for name in names:
        after = (depends or {}).get(name)
        run = command if isinstance(command, str) else command[name]
        files[f"services/{name}/service.yaml"] = SLEEPER.format(
            command=run if run.startswith("[") else f'[sh, -c, "{run}"]',
            hold=hold if isinstance(hold, float | int) else hold[name],
            extra=f"depends_on: [{', '.join(after)}]\n" if after else "")
        files[f"services/{name}/templates/app.conf.j2"] = \
            "ok = {{ 'no' if bad == service else 'yes' }}\nversion = {{ version }}\n"
    return small_deployment(tmp_path, key, files), checks


def holds(checks: Path) -> dict[str, tuple[float, float]]:
    """Each service's hold, as its own checks recorded it: (first check, last check)."""
    spans: dict[str, tuple[float, float]] = {}
    for line in checks.read_text().splitlines():
        name, at = line.split()
        t = float(at)
        first, last = spans.get(name, (t, t))
        spans[name] = (min(first, t), max(last, t))
    return spans


def most_at_once(spans: dict[str, tuple[float, float]]) -> int:
    """The most holds under way at one moment."""
    return max(sum(1 for a, b in spans.values() if a <= start <= b) for start, _ in spans.values())


def test_a_first_deploy_of_30_independent_services_holds_them_together_up_to_max_parallel(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]
) -> None:
    names = [f"s{i:02d}" for i in range(30)]
    # Held long enough that a loaded machine's spawns of one batch all come within the hold of
    # its first service (each spawn's writes are fsynced, one after another).
    dep, checks = sleepers(tmp_path, merge_key, names, hold=1.5)
    node = agents("n1", dep.url)
    width = node.cfg.max_parallel
    assert 1 < width < 30  # the default: in parallel, and bounded

    result = node.reconcile_once()

    assert result.exit_code == 0 and result.report is not None and str(result.report.state) == "applied"
    assert sorted(processes_of(node.cfg.state_dir)) == names
    spans = holds(checks)
    # each held its 1.5 s (the checks note their time as they run, a little before the agent's clock)
    assert sorted(spans) == names and all(b - a >= 1.4 for a, b in spans.values()), spans
    # Never more than the window at once, and the first window holds together: each of its
    # services is spawned while the one before it still holds (one after another, no two would
    # overlap).
    assert 2 <= most_at_once(spans) <= width
    first = names[:width]
    assert all(spans[y][0] <= spans[x][1] for x, y in zip(first, first[1:], strict=False)), (first, spans)
    # Started in plan order (by name), each once a slot freed: after one of the services before
    # it ended. (That it starts before the last of them ends, as a batch would not, is
    # test_sliding_window.py's, with holds far apart: here all hold alike, and under load the
    # last few of a window end within milliseconds of each other.)
    for k in range(width, 30):
        before = [spans[n][1] for n in names[k - width:k]]
        assert min(before) < spans[names[k]][0], (names[k], spans)


def test_a_dependency_chain_still_starts_in_order_while_the_rest_hold_beside_it(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]
) -> None:
    # db <- api <- web, and two services that depend on nothing
    depends = {"api": ["db"], "web": ["api"]}
    dep, checks = sleepers(tmp_path, merge_key, ["api", "db", "other", "spare", "web"], hold=1, depends=depends)
    node = agents("n1", dep.url, max_parallel=4)

    result = node.reconcile_once()

    assert result.exit_code == 0
    spans = holds(checks)
    # each starts only once what it depends on was healthy for its whole hold
    assert spans["db"][1] < spans["api"][0] and spans["api"][1] < spans["web"][0]
    # db, other and spare have no dependency among them: one batch, holding together
    assert spans["db"][0] <= spans["other"][0] <= spans["db"][1] and spans["other"][0] <= spans["spare"][0] <= spans["db"][1]


def test_a_failing_service_in_a_batch_is_put_back_alone_and_the_healthy_ones_change(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]
) -> None:
    names = ["a", "b", "c", "d"]
    dep, _ = sleepers(tmp_path, merge_key, names, hold=0.3)
    node = agents("n1", dep.url, max_parallel=4)
    assert node.reconcile_once().exit_code == 0
    before = processes_of(node.cfg.state_dir)

    # Every service changes; b's new version exits at once.
    dep.edit("inventory.yaml", "version: 1, bad: none", "version: 2, bad: b")
    head = dep.commit("all change, b breaks")
    result = node.reconcile_once()

    assert result.exit_code == 1 and result.report is not None and str(result.report.state) == "failed"
    by = {r.service: r for r in result.report.services}
    assert str(by["b"].state) == "failed" and "previous version restored" in by["b"].detail, by["b"]
    # The others in its batch were not skipped: changed and healthy.
    assert {n: (str(by[n].action), str(by[n].state)) for n in "acd"} == {n: ("restart", "ok") for n in "acd"}
    assert (dep.note("n1", head) or {}).get("state") == "failed"
    live = {n: (node.cfg.state_dir / "services" / n / "live" / "app.conf").read_text() for n in names}
    assert all("version = 2" in live[n] for n in "acd") and "ok = yes\nversion = 1" in live["b"]
    after = processes_of(node.cfg.state_dir)
    assert sorted(after) == names and all(len(p) == 1 for p in after.values())
    assert all(after[n] != before[n] for n in names)  # b: its old version started again


def test_on_failure_node_puts_every_service_of_the_batches_back_when_one_breaks(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]
) -> None:
    names = ["a", "b", "c", "d", "e"]
    dep, checks = sleepers(tmp_path, merge_key, names, hold=0.3, depends={"e": ["b"]})
    dep.write("reconciler.yaml", "format: 1\nname: parallel\non_failure: node\n")
    dep.commit("on_failure: node")
    node = agents("n1", dep.url, max_parallel=4)
    assert node.reconcile_once().exit_code == 0
    checks.write_text("")

    # Every service changes; b's new version exits at once (a b c d under way, e waits for b).
    dep.edit("inventory.yaml", "version: 1, bad: none", "version: 2, bad: b")
    head = dep.commit("all change, b breaks")
    result = node.reconcile_once()

    assert result.exit_code == 1 and result.report is not None and str(result.report.state) == "failed"
    by = {r.service: str(r.state) for r in result.report.services}
    assert by == {"a": "ok", "b": "failed", "c": "ok", "d": "ok", "e": "skipped"}, by
    events = [str(e) for e in (dep.note("n1", head) or {}).get("events", [])]  # type: ignore[attr-defined]
    assert {n for n in "acd" if any(e.startswith(f"on_failure node: {n} put back to") for e in events)} == set("acd")
    # All back on version 1, one process each; those put back held their checks together again.
    live = {n: (node.cfg.state_dir / "services" / n / "live" / "app.conf").read_text() for n in names}
    assert all("version = 1" in text for text in live.values()), live
    after = processes_of(node.cfg.state_dir)
    assert sorted(after) == names and all(len(p) == 1 for p in after.values())
    assert most_at_once(holds(checks)) >= 2


def test_the_old_processes_of_a_batch_stop_gracefully_together(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]
) -> None:
    names = ["a", "b", "c", "d"]
    # On SIGTERM each takes 0.5 s to finish its work, and notes when it began and ended.
    note = "echo {{ service }} $(date +%s.%N) >> {{ checks }}.stops"
    slow_stop = f"trap '{note}; sleep 0.5; {note}; exit 0' TERM; sleep 1000 & wait"
    dep, checks = sleepers(tmp_path, merge_key, names, hold=0.2, command=slow_stop)
    node = agents("n1", dep.url, max_parallel=4)
    assert node.reconcile_once().exit_code == 0

    dep.edit("inventory.yaml", "version: 1", "version: 2")
    dep.commit("all change")
    assert node.reconcile_once().exit_code == 0

    stops = holds(Path(f"{checks}.stops"))
    assert sorted(stops) == names and all(b - a >= 0.45 for a, b in stops.values()), stops
    # Their graceful stops overlap (one after another, the batch would wait 4 x 0.5 s for them).
    assert most_at_once(stops) >= 2, stops


def test_max_parallel_1_applies_one_service_after_another(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]
) -> None:
    names = ["a", "b", "c", "d"]
    dep, checks = sleepers(tmp_path, merge_key, names, hold=0.3)
    node = agents("n1", dep.url, max_parallel=1)

    assert node.reconcile_once().exit_code == 0

    spans = holds(checks)
    assert most_at_once(spans) == 1
    assert all(spans[x][1] < spans[y][0] for x, y in zip(names, names[1:], strict=False))


def test_killed_at_every_side_effect_of_a_parallel_first_deploy_the_next_run_finishes_it(
    tmp_path: Path, merge_key: SigningKey
) -> None:
    ports = {"web": free_port(), "api": free_port()}
    web = {"value": "a", "level": "info", "mode": "plain"}
    quick = SERVICE + "  min_healthy: 0\n"  # the hold is not what this test is about
    files = {"reconciler.yaml": "format: 1\nname: crash\n", "inventory.yaml": inventory(web, ports)}
    for name in ("web", "api"):
        files.update({f"services/{name}/service.yaml": quick, f"services/{name}/files/app.py": APP,
                      f"services/{name}/templates/app.conf.j2":
                          "[app]\nvalue = {{ values[service] }}\nlevel = {{ levels[service] }}\n"})
    dep = small_deployment(tmp_path, merge_key, files)
    head = subprocess.run(["git", "-C", str(dep.work), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    base = AgentConfig(node="n1", remote=dep.url, state_dir=tmp_path / "unused", max_parallel=2,
                       trust=TrustConfig(allowed_signers=merge_key.allowed_signers))

    def fresh(state: Path) -> Node:
        """A node that has run nothing yet, and a remote with no note of it."""
        subprocess.run(["git", "--git-dir", str(dep.bare), "update-ref", "-d", "refs/notes/reconciler/n1"],
                       check=False)
        return Node(dep, dataclasses.replace(base, state_dir=state), ports)

    def clean(node: Node) -> None:
        for pids in processes_of(node.cfg.state_dir).values():
            for pid in pids:
                os.killpg(pid, 9)

    def numbered(state: Path, log: Path) -> list[str]:
        counted = fresh(state)
        try:
            return [re.sub(r"-\d+/", "/", p.replace(str(state), "STATE")) for p in count_points(counted, None, log)]
        finally:
            clean(counted)

    points = numbered(tmp_path / "count", tmp_path / "points.log")
    # The same side effects on every run (their order follows which service is healthy first).
    again = numbered(tmp_path / "again", tmp_path / "again.log")
    assert sorted(p.split(" ", 1)[1] for p in again) == sorted(p.split(" ", 1)[1] for p in points)
    # Both services' spawns come before either one's record of success: they held together.
    spawns = [i for i, p in enumerate(points) if p.split()[1] == "spawn"]
    recorded = [i for i, p in enumerate(points) if p.split()[1:3] == ["db", "history"]]
    assert len(spawns) == 2 and len(recorded) == 2 and spawns[1] < recorded[0], points
    recovers_from_each(points, lambda n: (fresh(tmp_path / f"s{n}"), head), clean)


@pytest.mark.parametrize("value", ["0", "many", "true", "2.5", "1000"])
def test_a_max_parallel_that_is_not_a_count_names_its_line(tmp_path: Path, value: str) -> None:
    cfg_file = tmp_path / "agent.yaml"
    cfg_file.write_text(f"node: n1\nremote: /srv/cloud.git\nmax_parallel: {value}\n")
    with pytest.raises(ConfigError) as raised:
        load_config(cfg_file, {})
    shown = {"many": "'many'", "true": "True"}.get(value, value)
    assert str(raised.value) == f"{cfg_file}:3: max_parallel: {shown} must be a whole number from 1 to 256"
    assert load_config(None, {"node": "n1", "remote": "/srv/cloud.git"}).max_parallel == 8  # unset: the default


def _action(kind: ActionKind, name: str, after: tuple[str, ...] = (), ceiling: ActionKind = ActionKind.RECREATE) -> Action:
    """A plan step with just what ``batches`` reads (a whole rendered service says no more here)."""
    desired = None if kind is ActionKind.STOP else SimpleNamespace(depends_on=after, ceiling=ceiling)
    return cast(Action, SimpleNamespace(kind=kind, service=name, sync=False, desired=desired))


def test_batches_put_stops_reboots_and_drains_alone_and_a_dependent_after_what_it_needs() -> None:
    K = ActionKind
    plan = [_action(K.STOP, "x"), _action(K.STOP, "y"), _action(K.START, "a"), _action(K.START, "c"),
            _action(K.START, "b", ("a",)), _action(K.START, "e"), _action(K.START, "w", ("b",)),
            _action(K.RESTART, "r", ceiling=K.REBOOT), _action(K.START, "d"),
            _action(K.DRAIN_RESTART, "m"), _action(K.DRAIN_RESTART, "n"),
            _action(K.RESTART, "o", ceiling=K.DRAIN_RESTART), _action(K.START, "p"), _action(K.NONE, "q")]

    def named(width: int) -> list[list[str]]:
        """What starts at each step when whatever is under way completes at once."""
        pending, steps = list(range(len(plan))), []
        while pending:
            ready = startable(plan, pending, [], width, lambda a: a.kind is not K.NONE)
            assert ready and (len(ready) == 1 or not any(alone(plan[i], width) for i in ready))
            pending = [i for i in pending if i not in ready]
            steps.append([plan[i].service for i in ready])
        return steps

    # Two services of a node are never taken out of service at once, nor beside a start; e,
    # which needs nothing, passes b, which waits for a.
    assert named(8) == [["x"], ["y"], ["a", "c", "e"], ["b"], ["w"], ["r"], ["d"], ["m"], ["n"], ["o"], ["p", "q"]]
    # w needs b, which needs a: each after what it needs, however wide.
    assert named(2) == [["x"], ["y"], ["a", "c"], ["b", "e"], ["w"], ["r"], ["d"], ["m"], ["n"], ["o"], ["p", "q"]]
    assert named(1) == [[s] for s in "xyacbewrdmnopq"]


def _events_after(events: list[tuple[float, str]], at: float) -> list[str]:
    return [e for t, e in events if t > at]


def test_ctrl_c_in_the_middle_of_a_batch_stops_its_actions_before_the_agent_unwinds() -> None:
    events: list[tuple[float, str]] = []

    def task(name: str) -> Callable[[Wait], str]:
        def run(wait: Wait) -> str:
            events.append((time.monotonic(), f"{name} spawn"))
            wait(lambda: time.sleep(0.6))
            events.append((time.monotonic(), f"{name} record"))  # a side effect, in its turn
            return name
        return run

    threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        together([task("a"), task("b")])
    unwound = time.monotonic()
    # Nothing of the batch is left running when the main thread unwinds (locks, ledger) ...
    assert not [t.name for t in threading.enumerate() if t.name.startswith("apply-")]
    time.sleep(0.8)
    # ... and no side effect came after the interrupt: each stopped at its next turn.
    assert [e for _, e in events] == ["a spawn", "b spawn"] and not _events_after(events, unwound)


def test_a_thread_that_cannot_start_stops_the_ones_already_started(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    started = threading.Thread.start
    count = [0]

    def start(self: threading.Thread) -> None:
        count[0] += 1
        if count[0] == 2:
            raise RuntimeError("can't start new thread")  # what the interpreter says at its limit
        started(self)

    def task(name: str) -> Callable[[Wait], str]:
        def run(wait: Wait) -> str:
            events.append(f"{name} spawn")
            wait(lambda: time.sleep(0.3))
            events.append(f"{name} record")
            return name
        return run

    monkeypatch.setattr(threading.Thread, "start", start)
    with pytest.raises(RuntimeError):
        together([task("a"), task("b"), task("c")])
    monkeypatch.undo()
    assert not [t.name for t in threading.enumerate() if t.name.startswith("apply-")]
    time.sleep(0.5)
    assert "a record" not in events


def test_an_action_that_raises_in_a_batch_leaves_the_others_to_finish_and_nothing_running() -> None:
    def fine(name: str) -> Callable[[Wait], str]:
        def run(wait: Wait) -> str:
            wait(lambda: time.sleep(0.2))
            return name
        return run

    def broken(wait: Wait) -> str:
        wait(lambda: time.sleep(0.05))
        raise OSError("disk gone")  # a runtime's own error, mid-action

    out = together([fine("a"), broken, fine("c")])

    assert [o.value for o in out] == ["a", None, "c"]
    assert isinstance(out[1].error, OSError) and str(out[1].error) == "disk gone"
    assert not [t.name for t in threading.enumerate() if t.name.startswith("apply-")]


def test_ctrl_c_cuts_the_health_waits_of_a_batch_short() -> None:
    waited: list[str] = []

    def task(name: str) -> Callable[[Wait], str]:
        def run(wait: Wait) -> str:
            def hold() -> None:
                for _ in range(100):  # a 10 s health wait, in its 0.1 s steps
                    pause(0.1)
                waited.append(name)
            wait(hold)
            return name
        return run

    threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        together([task("a"), task("b")])
    # Gone before the main thread unwound, and neither waited its wait out.
    assert not [t.name for t in threading.enumerate() if t.name.startswith("apply-")] and waited == []
