"""A cloud upgrade: per-service steps across the fleet, barriers through the notes, a migration
that runs once, a post step when everyone is done, and a failed migration taken back everywhere.

Three controllers run identity (version 1 -> 2) and two computes run compute-agent, which
upgrades only after identity is done on every controller. Every node is its own agent with its
own state dir; they share only the git remote. Nodes are polled round-robin, out of order on
purpose, until the rollout ends: the order comes from the barriers alone.
"""

from __future__ import annotations

import json
import os
import signal
import traceback
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import browser
from browser import hex_colour
from conftest import NODES, Deployment, SigningKey
from test_cli import as_json, cli
from test_faults import processes_of

from reconciler.agent import Agent
from reconciler.core import faults
from reconciler.fleet.status import STEP_COLOURS

CONTROLLERS = ("ctl1", "ctl2", "ctl3")
COMPUTES = ("cmp1", "cmp2")


def upgrade_steps(counter: Path, db_sync: str = "", rollback: str = "") -> str:
    sync = db_sync or f'echo "$RECONCILER_NODE $RECONCILER_STEP" >> {counter}'
    back = f"\n    rollback: echo \"$RECONCILER_NODE rolled back\" >> {rollback}" if rollback else ""
    return f"""
version: "2"
upgrade:
  - {{name: pin-rpc, action: pin, set: {{rpc_version: "1"}}}}
  - {{name: stop, action: stop}}
  - name: db-sync
    action: command
    scope: once
    command: '{sync}'{back}
  - {{name: start, action: start}}
"""


COMPUTE_STEPS = """
version: "2"
upgrade_after: [identity]
upgrade:
  - {name: pin-rpc, action: pin, set: {rpc_version: "1"}}
  - {name: stop, action: stop}
  - {name: start, action: start}
"""

POST = """
post_upgrade:
  - {name: unpin-rpc, after: [identity, compute-agent], action: unpin, vars: [rpc_version]}
"""


def versioned(deployment: Deployment) -> None:
    """Version 1 of both services, with the RPC level their config shows: a plain change."""
    deployment.edit("inventory.yaml", "  token_ttl: 3600", "  token_ttl: 3600\n  rpc_version: auto")
    for svc in ("identity", "compute-agent"):
        deployment.edit(f"services/{svc}/service.yaml", "runtime:", 'version: "1"\nruntime:')
    deployment.write("services/identity/templates/identity.conf.j2",
                     deployment.read("services/identity/templates/identity.conf.j2")
                     + "\n[upgrade_levels]\ncompute = {{ rpc_version }}\nrelease = {{ service_version }}\n")
    deployment.edit("services/compute-agent/templates/compute.json.j2", '  "vcpus": {{ vcpus }}',
                    '  "vcpus": {{ vcpus }},\n  "rpc": "{{ rpc_version }}",\n  "release": "{{ service_version }}"')


def to_version_2(deployment: Deployment, identity_steps: str, post: bool = True) -> None:
    for svc, steps in (("identity", identity_steps), ("compute-agent", COMPUTE_STEPS)):
        text = deployment.read(f"services/{svc}/service.yaml").replace('version: "1"\n', "")
        deployment.write(f"services/{svc}/service.yaml", steps.lstrip() + text)
    if post:
        deployment.write("reconciler.yaml", deployment.read("reconciler.yaml") + POST)


def fleet_at_version_1(deployment: Deployment, agents: Callable[..., Agent]) -> dict[str, Agent]:
    """Every node's agent, each converged on version 1 of both services."""
    fleet = {n: agents(n, deployment.url) for n in NODES}
    versioned(deployment)
    deployment.commit("identity and compute-agent: version 1")
    for node in NODES:
        assert fleet[node].reconcile_once().exit_code == 0
    return fleet


def pass_in_child(agent: Agent, env: dict[str, str], again: Callable[[], Agent]) -> Agent:
    """One pass of ``agent``'s node in a forked child with ``env`` (RECONCILER_FAULT_AT kills it
    at that side effect; RECONCILER_FAULT_LOG numbers them); the node's agent afresh after it.
    A child told to die must die by SIGKILL (a pass that ended first tested no crash); one that
    only counts must finish."""
    agent.close()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.environ.update(env)
            faults.reset()
            Agent(agent.cfg, progress=False).reconcile_once()
        except BaseException:
            traceback.print_exc()
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if "RECONCILER_FAULT_AT" in env:
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
            f"not killed at side effect {env['RECONCILER_FAULT_AT']}: wait status {status}")
    else:
        assert status == 0, f"the counting pass failed: wait status {status}"
    return again()


def leftovers(agent: Agent) -> list[Path]:
    """Temp files a killed run left, and scratch directories of upgrades that are over."""
    state = agent.cfg.state_dir
    temp = [p for p in state.rglob("*") if p.name.startswith(".rc-tmp-") and "mirror.git" not in p.parts]
    return temp + [p for p in (state / "upgrade").glob("*/*") if p.is_dir()]


def live(agent: Agent, service: str) -> str:
    name = "identity.conf" if service == "identity" else "compute.json"
    return (agent.cfg.state_dir / "services" / service / "live" / name).read_text()


def serving(agent: Agent, service: str) -> bool:
    seen = {o.name: o for d in agent.drivers(None).values() for o in d.observe()}
    return service in seen and seen[service].running


def poll_until_settled(fleet: dict[str, Agent], deployment: Deployment, commit: str, done: Callable[[], bool],
                       rounds: int = 30) -> list[tuple[str, str]]:
    """Poll every node, computes first (they wait longest), until ``done``; what each pass said."""
    said = []
    for _ in range(rounds):
        for node in (*reversed(COMPUTES), *reversed(CONTROLLERS)):
            result = fleet[node].reconcile_once()
            said.append((node, result.waiting or (str(result.report.state) if result.report else "no-op")))
        if done():
            return said
    raise AssertionError(f"not settled after {rounds} rounds: {said[-10:]}")


def when(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


def steps_of(deployment: Deployment, commit: str) -> dict[str, dict[tuple[str, str], dict[str, Any]]]:
    out = {}
    for node in NODES:
        note = deployment.note(node, commit) or {}
        out[node] = {(s["service"], s["step"]): s for s in note.get("upgrade", [])}  # type: ignore[attr-defined]
    return out


def test_an_upgrade_moves_step_by_step_with_one_db_sync_and_unpins_when_everyone_runs_version_2(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path
) -> None:
    counter = tmp_path / "db-sync.count"
    fleet = fleet_at_version_1(deployment, agents)

    to_version_2(deployment, upgrade_steps(counter))
    c2 = deployment.commit("upgrade identity and compute-agent to version 2")
    said = poll_until_settled(fleet, deployment, c2, lambda: all(
        (deployment.note(n, c2) or {}).get("state") == "applied"
        and ("", "unpin-rpc") in steps_of(deployment, c2)[n] for n in NODES))

    # Nodes waited at barriers, and said for what.
    assert ("cmp2", "waiting at barrier compute-agent/pin-rpc (after identity): for ctl1, ctl2, ctl3") in said
    assert ("ctl1", "waiting at barrier identity/db-sync (after stop): for ctl2, ctl3") in said
    assert ("ctl2", "waiting at barrier identity/start (after db-sync): for ctl1") in said
    assert any(node == "ctl1" and text.startswith("post_upgrade unpin-rpc waits for cmp1, cmp2") for node, text in said)
    # The migration ran once, on the first controller; the others noted where it ran.
    assert counter.read_text() == "ctl1 db-sync\n"
    steps = steps_of(deployment, c2)
    assert steps["ctl2"][("identity", "db-sync")]["status"] == "skipped"
    assert steps["ctl2"][("identity", "db-sync")]["detail"] == "runs once, on ctl1"

    # Step k+1 never started on any node before step k was noted done on every node.
    for service, nodes, names in (("identity", CONTROLLERS, ["pin-rpc", "stop", "db-sync", "start"]),
                                  ("compute-agent", COMPUTES, ["pin-rpc", "stop", "start"])):
        for before, after in zip(names, names[1:], strict=False):
            # a once step's barrier is the one node that ran it (the others only noted where it ran)
            ran = [n for n in nodes if steps[n][(service, before)]["status"] == "done"]
            assert ran == (["ctl1"] if before == "db-sync" else list(nodes)), (service, before, ran)
            ended = max(when(steps[n][(service, before)]["ended"]) for n in ran)
            begun = min(when(steps[n][(service, after)]["started"]) for n in nodes)
            assert begun >= ended, (service, before, after)
    # compute-agent's upgrade began only after identity's was done on every controller.
    identity_done = max(when(steps[n][("identity", "start")]["ended"]) for n in CONTROLLERS)
    assert min(when(steps[n][("compute-agent", "pin-rpc")]["started"]) for n in COMPUTES) >= identity_done
    # The RPC pin was lifted only after every node ran version 2.
    all_started = max(when(s[(svc, "start")]["ended"]) for n, s in steps.items()
                      for svc in ("identity", "compute-agent") if (svc, "start") in s)
    assert min(when(steps[n][("", "unpin-rpc")]["started"]) for n in NODES if n != "none") >= all_started

    for node in CONTROLLERS:
        conf = live(fleet[node], "identity")
        assert "release = 2" in conf and "compute = auto" in conf, (node, conf)
        assert serving(fleet[node], "identity")
    for node in COMPUTES:
        conf = live(fleet[node], "compute-agent")
        assert '"release": "2"' in conf and '"rpc": "auto"' in conf, (node, conf)
    assert not any(leftovers(fleet[n]) for n in NODES)
    # Settled: nothing more to do anywhere.
    for node in NODES:
        again = fleet[node].reconcile_once()
        assert again.exit_code == 0 and not again.waiting, (node, again)


def test_a_failing_db_sync_halts_every_node_runs_its_rollback_and_leaves_version_1_serving(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path
) -> None:
    rolled = tmp_path / "rollback.log"
    fleet = fleet_at_version_1(deployment, agents)

    to_version_2(deployment, upgrade_steps(tmp_path / "unused", db_sync="echo schema conflict >&2; exit 3",
                                           rollback=str(rolled)))
    c2 = deployment.commit("upgrade to version 2, with a migration that fails")
    poll_until_settled(fleet, deployment, c2, lambda: all(
        (deployment.note(n, c2) or {}).get("state") in ("failed", "halted") for n in NODES))

    failed = deployment.note("ctl1", c2) or {}
    assert failed["state"] == "failed" and failed["reason"] == "UPGRADE_FAILED"
    assert failed["error"] == "identity: upgrade step db-sync failed on ctl1: exit 3: schema conflict"
    assert rolled.read_text() == "ctl1 rolled back\n"  # the failed step's rollback, where it ran
    for node in (n for n in NODES if n != "ctl1"):
        note = deployment.note(node, c2) or {}
        assert note["state"] == "halted", (node, note)
        assert str(note["error"]).startswith(f"halted: ctl1 failed {c2[:12]} (identity)")
    for node in CONTROLLERS:
        conf = live(fleet[node], "identity")
        assert "release = 1" in conf and "compute = auto" in conf, (node, conf)  # version 1, unpinned
        assert serving(fleet[node], "identity"), node
    for node in COMPUTES:
        assert '"release": "1"' in live(fleet[node], "compute-agent") and serving(fleet[node], "compute-agent")


def test_a_plain_config_change_never_runs_upgrade_steps(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path
) -> None:
    counter = tmp_path / "db-sync.count"
    fleet = {n: agents(n, deployment.url) for n in CONTROLLERS}
    versioned(deployment)
    to_version_2(deployment, upgrade_steps(counter), post=False)  # steps present from the start
    deployment.commit("identity at version 2, with its steps")
    for node in CONTROLLERS:
        assert fleet[node].reconcile_once().exit_code == 0
    deployment.edit("inventory.yaml", "token_ttl: 3600", "token_ttl: 7200")
    c = deployment.commit("identity: longer tokens")
    for node in CONTROLLERS:
        result = fleet[node].reconcile_once()
        assert result.exit_code == 0 and result.report is not None and result.report.state == "applied"
        assert "upgrade" not in (deployment.note(node, c) or {})
    assert not counter.exists()


def test_killed_at_every_side_effect_of_the_once_step_the_migration_still_runs_once(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path
) -> None:
    """ctl1 runs the migration. It is killed at each numbered side effect of the pass that
    runs db-sync and start, in turn (each time on a fresh upgrade commit), and polled again."""
    fleet = {n: agents(n, deployment.url) for n in CONTROLLERS}
    versioned(deployment)
    # Some 30 kill points, each a few restarts: a short health hold keeps it quick (the hold's
    # own rules are proven in test_health).
    for svc in ("db", "identity"):
        deployment.edit(f"services/{svc}/service.yaml", "health:\n", "health:\n  min_healthy: 0.05\n")
    deployment.commit("identity: version 1")
    for node in CONTROLLERS:
        fleet[node].reconcile_once()

    def upgrade_to(version: int, counter: Path) -> str:
        steps = upgrade_steps(counter).replace('version: "2"', f'version: "{version}"')
        text = deployment.read("services/identity/service.yaml")
        text = text[text.index("runtime:"):] if "upgrade:" in text else text.replace(f'version: "{version - 1}"\n', "")
        deployment.write("services/identity/service.yaml", steps.lstrip() + text)
        return deployment.commit(f"identity: version {version}")

    def until_ctl1_runs_db_sync(commit: str) -> None:
        for node in ("ctl2", "ctl3", "ctl1", "ctl2", "ctl3"):
            fleet[node].reconcile_once()  # ctl1 stops, then the others reach the db-sync barrier

    def ctl1_in_child(env: dict[str, str]) -> None:
        fleet["ctl1"] = pass_in_child(fleet["ctl1"], env, lambda: agents("ctl1", deployment.url))

    version = 2
    head = upgrade_to(version, tmp_path / "count-2")
    until_ctl1_runs_db_sync(head)
    log = tmp_path / "points.log"
    ctl1_in_child({"RECONCILER_FAULT_LOG": str(log)})
    points = log.read_text().splitlines()
    assert any("spawn upgrade step identity/db-sync" in p for p in points), points
    for _ in range(3):
        for node in CONTROLLERS:
            fleet[node].reconcile_once()
    assert (deployment.note("ctl3", head) or {}).get("state") == "applied"

    for n in range(1, len(points) + 1):
        version += 1
        counter = tmp_path / f"count-{version}"
        head = upgrade_to(version, counter)
        until_ctl1_runs_db_sync(head)
        ctl1_in_child({"RECONCILER_FAULT_AT": str(n)})
        for _ in range(4):
            for node in ("ctl1", "ctl2", "ctl3"):
                fleet[node].reconcile_once()
            if all((deployment.note(node, head) or {}).get("state") == "applied" for node in CONTROLLERS):
                break
        what = f"killed before side effect {n} of {len(points)} ({points[n - 1]})"
        assert counter.read_text() == "ctl1 db-sync\n", what
        for node in CONTROLLERS:
            assert (deployment.note(node, head) or {}).get("state") == "applied", (what, node)
            assert f"release = {version}" in live(fleet[node], "identity"), (what, node)
            assert len(processes_of(fleet[node].cfg.state_dir).get("identity", [])) == 1, (what, node)
            assert not leftovers(fleet[node]), (what, node, leftovers(fleet[node]))


def test_bad_upgrade_steps_are_located_errors_and_diff_shows_steps_and_barriers(
    deployment: Deployment, tmp_path: Path
) -> None:
    import subprocess
    import sys

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "reconciler", *args], capture_output=True, text=True,
                              cwd=deployment.work)

    versioned(deployment)
    before = deployment.commit("version 1")
    to_version_2(deployment, upgrade_steps(tmp_path / "count"))
    after = deployment.commit("version 2")
    proc = cli("diff", "--repo", ".", before, after, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    nodes = {n["node"]: n for n in __import__("json").loads(proc.stdout)["nodes"]}
    assert nodes["ctl2"]["upgrade"][:4] == [  # then the post step it runs (test_story_upgrade_revert)
        "identity: pin-rpc (pin)",
        "identity: stop (stop), after pin-rpc on all 3 nodes",
        "identity: db-sync (command, once: on ctl1, not here), after stop on all 3 nodes",
        "identity: start (start), after db-sync on ctl1",
    ]
    assert nodes["cmp1"]["upgrade"][0] == "compute-agent: pin-rpc (pin), after identity upgraded everywhere"
    markdown = cli("diff", "--repo", ".", before, after, "-o", "markdown").stdout
    assert "1. identity: db-sync (command, once: here), after stop on all 3 nodes" in markdown

    deployment.edit("services/identity/service.yaml", "  - {name: stop, action: stop}",
                    "  - {name: stop, action: stop, scope: once}")
    deployment.edit("services/compute-agent/service.yaml", "upgrade_after: [identity]", "upgrade_after: [keystone]")
    proc = cli("validate", "--repo", ".")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines()
    assert any("services/identity/service.yaml:4: upgrade/1: step 'stop'" in x and "only a command can run once" in x for x in lines), lines
    assert any("services/compute-agent/service.yaml" in x and "upgrade_after: unknown service 'keystone'" in x
               for x in lines), lines

    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml")
                     + "stages:\n  computes: {group: hypervisors}\n  edge: {nodes: [\"edge*\"]}\n"
                     + "rollout:\n  stage: controlplane\n")
    proc = cli("validate", "--repo", ".")
    lines = proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines()
    assert proc.returncode == 2
    for wanted in ("stage 'computes': unknown group 'hypervisors'", "stage 'edge': 'edge*' names no node",
                   "rollout.stage 'controlplane' is not a stage (stages: computes, edge)"):
        assert any(x.startswith("reconciler.yaml:") and wanted in x for x in lines), (wanted, lines)


EXPORTER_STEPS = """
version: "{version}"
upgrade:
  - {{name: stop, action: stop}}
  - name: migrate
    action: command
    scope: once
    command: 'echo "$RECONCILER_NODE" >> {counter}'
  - {{name: start, action: start}}
"""

STAGES = """
stages:
  controlplane: {group: controllers}
  computes: {nodes: ["cmp*"]}
"""


def exporter_at(deployment: Deployment, version: str, counter: Path) -> None:
    text = deployment.read("services/node-exporter/service.yaml").split("runtime:", 1)[1]
    deployment.write("services/node-exporter/service.yaml",
                     EXPORTER_STEPS.format(version=version, counter=counter).lstrip() + "runtime:" + text)


def staged(deployment: Deployment, stage: str) -> None:
    text = deployment.read("reconciler.yaml").split("\nrollout:", 1)[0]
    deployment.write("reconciler.yaml", text + f"\nrollout:\n  stage: {stage}\n")


def pid_of(agent: Agent, service: str) -> int | None:
    seen = {o.name: o for d in agent.drivers(None).values() for o in d.observe()}
    return seen[service].pid if service in seen else None


def fleet_status(deployment: Deployment, key: SigningKey, view: Path, *extra: str) -> dict[str, Any]:
    """`status --fleet -o json` as an operator runs it, from a state dir that applies nothing."""
    view.mkdir(exist_ok=True)  # made for it: only the agent makes a state dir where none is
    proc = cli("status", "--fleet", "--node", "ctl1", "--remote", deployment.url, "--state-dir", str(view),
               "--allowed-signers", str(key.allowed_signers), "-o", "json", *extra)
    assert proc.returncode == 0, proc.stderr
    return as_json(proc)


def test_a_staged_upgrade_takes_the_control_plane_in_one_commit_and_the_computes_in_the_next(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey, tmp_path: Path
) -> None:
    """node-exporter runs on every node. The first commit upgrades it on the controllers only
    (stage controlplane) while the computes keep version 1 and still take the commit's other
    change; the second commit (stage computes) upgrades the computes, with its own barriers and
    its own once-only migration; the post step waits for the commit in which nobody keeps 1."""
    counter = tmp_path / "migrate.count"
    fleet = {n: agents(n, deployment.url) for n in NODES}
    exporter_at(deployment, "1", counter)
    deployment.edit("services/node-exporter/templates/exporter.toml.j2", "[labels]",
                    'release = "{{ service_version }}"\n\n[labels]')
    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml") + STAGES + """
post_upgrade:
  - {name: announce, after: [node-exporter], node: ctl1, action: command, command: 'echo done >> %s'}
""" % (tmp_path / "post.log"))
    deployment.commit("node-exporter version 1, and the stages an upgrade can be limited to")
    for node in NODES:
        assert fleet[node].reconcile_once().exit_code == 0, node

    # Commit 1: version 2 for the control plane only, and a compute setting for everyone.
    exporter_at(deployment, "2", counter)
    staged(deployment, "controlplane")
    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    c1 = deployment.commit("node-exporter 2 on the control plane; computes use kvm")
    before = {n: pid_of(fleet[n], "node-exporter") for n in COMPUTES}
    poll_until_settled(fleet, deployment, c1, lambda: all(
        (deployment.note(n, c1) or {}).get("state") == "applied" for n in NODES))

    exporter = {n: (fleet[n].cfg.state_dir / "services/node-exporter/live/exporter.toml").read_text() for n in NODES}
    for node in CONTROLLERS:
        assert 'release = "2"' in exporter[node], node
    for node in COMPUTES:
        assert 'release = "1"' in exporter[node], node
        assert pid_of(fleet[node], "node-exporter") == before[node], f"{node}: node-exporter was restarted"
        assert '"hypervisor": "kvm"' in live(fleet[node], "compute-agent")  # the rest of the commit: taken
        note = deployment.note(node, c1) or {}
        assert note.get("upgrade") is None  # no step ran or was even noted here
        assert any(e.startswith("not in stage controlplane: node-exporter kept as at ")
                   for e in cast(list[str], note["events"]))
    assert counter.read_text() == "ctl1\n"  # once, among the controllers
    assert not (tmp_path / "post.log").exists(), "the post step ran while the computes still run version 1"
    c1_steps = steps_of(deployment, c1)
    assert sorted(n for n in NODES if c1_steps[n]) == sorted(CONTROLLERS)
    # The fleet status says which stage each node is at, and the upgrade as nodes x steps.
    status = fleet_status(deployment, merge_key, tmp_path / "view")
    stages = {s["node"]: s["stage"] for s in status["nodes"]}
    assert stages == {"ctl1": "controlplane", "ctl2": "controlplane", "ctl3": "controlplane",
                      "cmp1": "not in controlplane: keeps node-exporter 1", "cmp2": "not in controlplane: keeps "
                      "node-exporter 1"}
    assert status["upgrade"]["steps"] == ["node-exporter/stop", "node-exporter/migrate", "node-exporter/start"]
    assert status["upgrade"]["nodes"] == {
        "ctl1": {"node-exporter/stop": "done", "node-exporter/migrate": "done", "node-exporter/start": "done"},
        "ctl2": {"node-exporter/stop": "done", "node-exporter/migrate": "skipped", "node-exporter/start": "done"},
        "ctl3": {"node-exporter/stop": "done", "node-exporter/migrate": "skipped", "node-exporter/start": "done"}}

    # Commit 2: the computes' stage. They upgrade from the version they kept, among themselves.
    staged(deployment, "computes")
    c2 = deployment.commit("node-exporter 2 on the computes")
    ctl_pids = {n: pid_of(fleet[n], "node-exporter") for n in CONTROLLERS}
    said = poll_until_settled(fleet, deployment, c2, lambda: all(
        (deployment.note(n, c2) or {}).get("state") == "applied" for n in NODES)
        and (tmp_path / "post.log").exists())

    # cmp2 is polled first: it waits for cmp1 alone (the controllers are not in this stage's barrier).
    assert said[0] == ("cmp2", "waiting at barrier node-exporter/migrate (after stop): for cmp1"), said
    for node in COMPUTES:
        text = (fleet[node].cfg.state_dir / "services/node-exporter/live/exporter.toml").read_text()
        assert 'release = "2"' in text, node
        assert serving(fleet[node], "node-exporter")
    for node in CONTROLLERS:
        assert pid_of(fleet[node], "node-exporter") == ctl_pids[node], f"{node}: restarted by the computes' stage"
    assert counter.read_text() == "ctl1\ncmp1\n"  # once per stage: each stage is its own migration
    c2_steps = steps_of(deployment, c2)
    assert sorted(n for n in NODES if any(s != "" for s, _ in c2_steps[n])) == sorted(COMPUTES)
    assert (tmp_path / "post.log").read_text() == "done\n"
    page = tmp_path / "rollout.html"
    status = fleet_status(deployment, merge_key, tmp_path / "view", "--html", str(page))
    assert status["upgrade"]["steps"] == ["node-exporter/stop", "node-exporter/migrate", "node-exporter/start",
                                          "post/announce"]
    assert sorted(status["upgrade"]["nodes"]) == ["cmp1", "cmp2", "ctl1"]  # ctl1 ran the post step
    assert status["upgrade"]["nodes"]["cmp2"]["node-exporter/migrate"] == "skipped"
    assert status["upgrade"]["nodes"]["ctl1"] == {"node-exporter/stop": "", "node-exporter/migrate": "",
                                                  "node-exporter/start": "", "post/announce": "done"}
    assert {s["node"]: s["stage"] for s in status["nodes"]}["ctl2"] == "not in computes"
    assert "<h2>Upgrade steps</h2>" in page.read_text() and "post/announce" in page.read_text()
    # In a real browser: every step cell in its status's own colour, every node's stage in its cell.
    drawn = json.loads(browser.evaluate(page, "JSON.stringify({body: document.body.innerText, steps: [...document"
                                              ".querySelectorAll('table.steps td')].map(td => [td.textContent, "
                                              "getComputedStyle(td).backgroundColor])})"))
    assert {(s, hex_colour(c)) for s, c in drawn["steps"] if s} == {
        ("done", STEP_COLOURS["done"]), ("skipped", STEP_COLOURS["skipped"])}
    assert "not in computes" in drawn["body"] and "by Operator <op@example.org>" in drawn["body"]
    human = cli("status", "--fleet", "--node", "ctl1", "--remote", deployment.url, "--state-dir",
                str(tmp_path / "view"), "--allowed-signers", str(merge_key.allowed_signers))
    assert human.returncode == 0 and "upgrade steps" in human.stdout and "not in computes" in human.stdout, human
    for node in NODES:
        again = fleet[node].reconcile_once()
        assert again.exit_code == 0 and not again.waiting, (node, again)


def test_a_reboot_post_step_reboots_the_computes_one_at_a_time_once_everyone_is_upgraded(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path
) -> None:
    """A kernel that comes with the upgrade: once every node runs version 2, each compute is
    drained, rebooted and undrained, the second only after the first is back."""
    from reconciler.settings import HostConfig

    log = tmp_path / "host.log"
    fleet = {}
    for node in NODES:
        boot = tmp_path / f"{node}.boot_id"
        boot.write_text(f"{node}-boot-1\n")
        # The "reboot" logs itself and gives the node a new boot id, as a real boot would.
        host = HostConfig(root=tmp_path, boot_id_file=boot,
                          reboot_command=f"echo {node} reboot >> {log} && echo {node}-boot-2 > {boot}")
        fleet[node] = agents(node, deployment.url, host=host)
    versioned(deployment)
    deployment.commit("version 1")
    for node in NODES:
        assert fleet[node].reconcile_once().exit_code == 0

    to_version_2(deployment, upgrade_steps(tmp_path / "count"), post=False)
    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml") + f"""
post_upgrade:
  - name: reboot-computes
    after: [identity, compute-agent]
    group: computes
    action: reboot
    drain: 'echo drain >> {log}'
    undrain: 'echo undrain >> {log}'
""")
    c2 = deployment.commit("version 2, and a reboot of the computes after it")
    said = poll_until_settled(fleet, deployment, c2, lambda: all(
        ("", "reboot-computes") in steps_of(deployment, c2)[n]
        and steps_of(deployment, c2)[n][("", "reboot-computes")]["status"] == "done" for n in COMPUTES))

    # Nobody rebooted before every node ran version 2; then cmp1, and cmp2 only once cmp1 was back.
    assert log.read_text() == "drain\ncmp1 reboot\nundrain\ndrain\ncmp2 reboot\nundrain\n"
    assert ("cmp2", "post_upgrade reboot-computes waits for cmp1 to reboot") in said
    steps = steps_of(deployment, c2)
    upgraded_everywhere = max(when(s[(svc, "start")]["ended"]) for s in steps.values()
                              for svc in ("identity", "compute-agent") if (svc, "start") in s)
    first, second = (steps[n][("", "reboot-computes")] for n in COMPUTES)
    assert when(first["started"]) >= upgraded_everywhere
    assert when(second["started"]) >= when(first["ended"])
    assert first["detail"] == "rebooted (boot id cmp1-boot-1 -> cmp1-boot-2); undrain ok"
    assert not any(("", "reboot-computes") in steps[n] for n in CONTROLLERS)
    for node in NODES:
        again = fleet[node].reconcile_once()
        assert again.exit_code == 0 and not again.waiting, (node, again)
    assert log.read_text().count("reboot") == 2


def test_the_branch_moving_mid_upgrade_finishes_the_upgrade_first_and_skips_no_migration(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path
) -> None:
    """Two controllers start the upgrade; then a config change lands on top of it before the
    third controller and the computes ever saw the upgrade commit. Every node still runs the
    upgrade's steps (each at the upgrade commit, the migration once), then takes the head; the
    upgrade's post step runs although every node has moved past its commit."""
    counter = tmp_path / "db-sync.count"
    fleet = fleet_at_version_1(deployment, agents)
    to_version_2(deployment, upgrade_steps(counter))
    c2 = deployment.commit("upgrade identity and compute-agent to version 2")
    for node in ("ctl1", "ctl2"):
        assert fleet[node].reconcile_once().waiting.startswith("waiting at barrier identity/stop")
    deployment.edit("inventory.yaml", "token_ttl: 3600", "token_ttl: 7200")
    c3 = deployment.commit("longer tokens, merged while the upgrade runs")

    said = poll_until_settled(fleet, deployment, c3, lambda: all(
        (deployment.note(n, c3) or {}).get("state") == "applied" for n in NODES)
        and all(("", "unpin-rpc") in steps_of(deployment, c2)[n] for n in NODES))

    assert counter.read_text() == "ctl1 db-sync\n"  # the migration ran, once, nobody skipped it
    steps = steps_of(deployment, c2)
    for node in CONTROLLERS:
        assert [steps[node][("identity", s)]["status"] for s in ("pin-rpc", "stop", "db-sync", "start")] == \
            ["done", "done", "done" if node == "ctl1" else "skipped", "done"], node
    for node in COMPUTES:
        assert [steps[node][("compute-agent", s)]["status"] for s in ("pin-rpc", "stop", "start")] == \
            ["done", "done", "done"], node
        # it never saw c2 before c3 landed: it ran c2 first, and said so
        events = cast(list[str], (deployment.note(node, c2) or {}).get("events", []))
        assert f"head {c3[:12]} is past this upgrade, which this node owed: run first" in events, events
    assert steps_of(deployment, c3) == {n: {} for n in NODES}  # the head itself upgrades nothing
    for node in CONTROLLERS:
        conf = live(fleet[node], "identity")
        assert "release = 2" in conf and "compute = auto" in conf and "7200" in conf, (node, conf)
    for node in COMPUTES:
        conf = live(fleet[node], "compute-agent")
        assert '"release": "2"' in conf and '"rpc": "auto"' in conf, (node, conf)
    assert not any("failed" in text or "halted" in text for _, text in said), said
    for node in NODES:
        again = fleet[node].reconcile_once()
        assert again.exit_code == 0 and not again.waiting, (node, again)


def test_killed_at_every_side_effect_of_the_pass_that_reboots_the_node_reboots_once(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path
) -> None:
    """cmp1 upgrades compute-agent and then reboots for the upgrade's post step, in one pass.
    It is killed at each numbered side effect of that pass in turn (each time on a fresh
    upgrade commit) and polled again: every time the upgrade finishes, the node rebooted
    exactly once for that commit, and its note says so."""
    from reconciler.settings import HostConfig

    reboots = tmp_path / "reboots.log"
    boot = tmp_path / "cmp1.boot_id"
    boot.write_text("boot-0\n")
    host = HostConfig(root=tmp_path, boot_id_file=boot,
                      reboot_command=f'echo "$(cat {boot})" >> {reboots} && echo "boot-$(wc -l < {reboots})" > {boot}')
    fleet = {"cmp1": agents("cmp1", deployment.url, host=host), "cmp2": agents("cmp2", deployment.url)}
    versioned(deployment)
    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml") + """
post_upgrade:
  - {name: new-kernel, after: [compute-agent], node: cmp1, action: reboot}
""")
    deployment.edit("services/compute-agent/service.yaml", "health:\n", "health:\n  min_healthy: 0.05\n")
    deployment.commit("compute-agent version 1")
    for node in fleet:
        assert fleet[node].reconcile_once().exit_code == 0

    def upgrade_to(version: int) -> str:
        text = deployment.read("services/compute-agent/service.yaml")
        text = text[text.index("runtime:"):] if "upgrade:" in text else text.replace('version: "1"\n', "")
        steps = COMPUTE_STEPS.replace('version: "2"', f'version: "{version}"').replace("upgrade_after: [identity]\n", "")
        deployment.write("services/compute-agent/service.yaml", steps.lstrip() + text)
        return deployment.commit(f"compute-agent version {version}")

    def cmp1_in_child(env: dict[str, str]) -> None:
        fleet["cmp1"] = pass_in_child(fleet["cmp1"], env, lambda: agents("cmp1", deployment.url, host=host))

    def settled(commit: str) -> bool:
        steps = steps_of_nodes(deployment, commit, ("cmp1",))
        return all((deployment.note(n, commit) or {}).get("state") == "applied" for n in fleet) \
            and steps["cmp1"].get(("", "new-kernel"), {}).get("status") == "done"

    def until_cmp1_reboots() -> None:
        for node in ("cmp2", "cmp1", "cmp2"):  # then cmp1's next pass starts, applies and reboots
            fleet[node].reconcile_once()

    version = 2
    head = upgrade_to(version)
    until_cmp1_reboots()
    log = tmp_path / "points.log"
    cmp1_in_child({"RECONCILER_FAULT_LOG": str(log)})
    points = log.read_text().splitlines()
    assert any("post_upgrade reboot new-kernel" in p for p in points), points
    for _ in range(4):
        for node in ("cmp2", "cmp1"):
            fleet[node].reconcile_once()
    assert settled(head)

    # The start step's own side effects (the points before it is noted done) are those the
    # migration's kill test covers already; from its record on, each one here.
    first = next(i for i, p in enumerate(points, start=1) if "step compute-agent/start done" in p)
    for n in range(first, len(points) + 1):
        version += 1
        head = upgrade_to(version)
        until_cmp1_reboots()
        before = reboots.read_text().count("\n")
        cmp1_in_child({"RECONCILER_FAULT_AT": str(n)})
        for _ in range(4):
            for node in ("cmp2", "cmp1"):
                fleet[node].reconcile_once()
            if settled(head):
                break
        what = f"killed before side effect {n} of {len(points)} ({points[n - 1]})"
        assert settled(head), what
        assert reboots.read_text().count("\n") == before + 1, what  # rebooted once for this commit
        for node in fleet:
            assert f'"release": "{version}"' in live(fleet[node], "compute-agent"), (what, node)
            assert not leftovers(fleet[node]), (what, node, leftovers(fleet[node]))


def steps_of_nodes(deployment: Deployment, commit: str,
                   nodes: tuple[str, ...]) -> dict[str, dict[tuple[str, str], dict[str, Any]]]:
    return {n: s for n, s in steps_of(deployment, commit).items() if n in nodes}
