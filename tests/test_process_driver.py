"""The process driver against real processes: hand edits of live files, the environment and
user a service runs with, and a run killed between starting a process and recording it."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Deployment, SigningKey, small_deployment, wait_for
from needs import unavailable
from test_agent import get_json, pids
from test_faults import _cli, processes_of

from reconciler.agent import Agent
from reconciler.core.model import ActionKind
from reconciler.drivers.process import ProcessDriver
from reconciler.node.operations import plan


def live_file(agent: Agent, service: str, path: str) -> Path:
    return agent.cfg.state_dir / "services" / service / "live" / path


def by_service(actions: object) -> dict[str, tuple[str, str]]:
    return {a.service: (str(a.kind), a.reason) for a in actions}  # type: ignore[attr-defined]


def test_a_hand_edit_of_a_live_file_is_put_back_with_the_least_its_rules_allow(
    deployment: Deployment, agents: Callable[..., Agent]
) -> None:
    ctl1 = agents("ctl1", deployment.url)
    ctl1.reconcile_once()
    before = pids(ctl1)
    identity = f"http://127.0.0.1:{deployment.port_bases['ctl1'] + 5}/v3"
    conf = live_file(ctl1, "identity", "identity.conf")
    rendered = conf.read_text()

    # Someone shortens the tokens on the node itself and has the program re-read its config.
    conf.write_text(rendered.replace("ttl = 3600", "ttl = 60"))
    os.kill(before["identity"], signal.SIGHUP)  # type: ignore[arg-type]
    wait_for(lambda: get_json(identity)["token_ttl"] == 60, what="the hand edit served")

    the_plan, _ = plan(ctl1.ctx)
    assert by_service(the_plan.actions)["identity"] == (
        "reload", "files: identity.conf changed by hand; reload puts the repo's version back "
                  "(only [token] ttl changed in identity.conf)")
    assert {a.service for a in the_plan.changes} == {"identity"}

    result = ctl1.reconcile_once()

    assert result.exit_code == 0
    assert by_service(result.plan.actions if result.plan else ())["identity"][0] == "reload"
    assert conf.read_text() == rendered
    assert get_json(identity)["token_ttl"] == 3600
    assert pids(ctl1) == before, "a reload: every process kept"
    assert ctl1.reconcile_once().report is None, "converged: the next run has nothing to do"

    # The file goes and another appears: no rule explains a whole file, so a restart.
    conf.unlink()
    live_file(ctl1, "identity", "notes.txt").write_text("tuning ideas\n")
    the_plan, _ = plan(ctl1.ctx)
    kind, reason = by_service(the_plan.actions)["identity"]
    assert kind == "restart" and reason.startswith("files: identity.conf missing, notes.txt added by hand; ")

    result = ctl1.reconcile_once()

    assert result.exit_code == 0
    assert conf.read_text() == rendered and not live_file(ctl1, "identity", "notes.txt").exists()
    assert pids(ctl1)["identity"] != before["identity"]
    assert get_json(identity)["token_ttl"] == 3600


def test_under_drift_report_a_hand_edit_is_named_and_left_alone(
    deployment: Deployment, agents: Callable[..., Agent]
) -> None:
    deployment.write("services/identity/service.yaml", deployment.read("services/identity/service.yaml")
                     + "drift: report\n")
    deployment.commit("identity: hand edits are only reported")
    ctl1 = agents("ctl1", deployment.url)
    ctl1.reconcile_once()
    before = pids(ctl1)
    conf = live_file(ctl1, "identity", "identity.conf")
    edited = conf.read_text().replace("ttl = 3600", "ttl = 60")
    conf.write_text(edited)

    the_plan, _ = plan(ctl1.ctx)
    assert by_service(the_plan.actions)["identity"] == (
        "none", "drift not corrected (policy report): files: identity.conf changed by hand")
    result = ctl1.reconcile_once()

    assert result.exit_code == 0 and result.report is not None
    assert {r.service: r.action for r in result.report.services}["identity"] is ActionKind.NONE
    assert conf.read_text() == edited
    assert pids(ctl1) == before


# Writes its environment to its data dir, then waits.
DUMP = """\
import json, os, sys, time
try:
    with open(os.path.join(os.environ["RECONCILER_DATA_DIR"], "env.json"), "w") as f:
        json.dump(dict(os.environ), f)
except OSError as e:
    print(f"dump: {e}", file=sys.stderr, flush=True)
    sys.exit(2)
while True:
    time.sleep(60)
"""

DUMP_SERVICE = """\
runtime:
  command: [python3, dump.py]
  env: {{GREETING: hello}}
{account}files:
  - {{path: dump.py, source: dump.py}}
  - {{path: value.txt, template: value.txt.j2}}
  - {{path: drain.txt, template: drain.txt.j2}}
reload: {{command: "env > $RECONCILER_DATA_DIR/reload.env"}}
on_change:
  - {{file: value.txt, action: reload}}
  - {{file: drain.txt, action: drain+restart}}
drain: "env > {hooks}/drain.env"
"""

CLEAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def dump_repo(tmp_path: Path, key: SigningKey, account: str = "") -> Deployment:
    files = {
        "reconciler.yaml": "format: 1\nname: env\n",
        "inventory.yaml": "vars: {value: one, zone: a}\ngroups:\n  g: {services: [dump]}\nnodes:\n  n1: {groups: [g]}\n",
        "services/dump/service.yaml": DUMP_SERVICE.format(account=account, hooks=tmp_path),
        "services/dump/files/dump.py": DUMP,
        "services/dump/templates/value.txt.j2": "{{ value }}\n",
        "services/dump/templates/drain.txt.j2": "{{ zone }}\n",
    }
    return small_deployment(tmp_path / "repo", key, files, "a service that shows its environment")


def shell_env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def test_services_reload_commands_and_hooks_get_a_clean_environment(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECONCILER_TEST_SECRET", "the agent's, not the service's")
    dep = dump_repo(tmp_path, merge_key)
    node = agents("n1", dep.url)
    assert node.reconcile_once().exit_code == 0
    data = node.cfg.state_dir / "services" / "dump" / "data"
    me = pwd.getpwuid(os.getuid())

    env = json.loads((data / "env.json").read_text())
    assert {k: v for k, v in env.items() if not k.startswith("RECONCILER_")} == {
        "PATH": CLEAN_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": me.pw_dir, "USER": me.pw_name,
        "LOGNAME": me.pw_name, "GREETING": "hello"}
    assert sorted(k for k in env if k.startswith("RECONCILER_")) == [
        "RECONCILER_COMMIT", "RECONCILER_DATA_DIR", "RECONCILER_INSTANCE", "RECONCILER_NODE",
        "RECONCILER_SERVICE"]

    dep.edit("inventory.yaml", "value: one", "value: two")
    dep.commit("a value the program reloads")
    assert node.reconcile_once().exit_code == 0
    reload = shell_env(data / "reload.env")
    assert reload["PATH"] == CLEAN_PATH and reload["GREETING"] == "hello" and reload["RECONCILER_PID"]
    assert "RECONCILER_TEST_SECRET" not in reload and "RECONCILER_INSTANCE" not in reload

    dep.edit("inventory.yaml", "zone: a", "zone: b")
    dep.commit("a change that drains first")
    assert node.reconcile_once().exit_code == 0
    drain = shell_env(tmp_path / "drain.env")
    assert drain["PATH"] == CLEAN_PATH and drain["RECONCILER_SERVICE"] == "dump"
    assert "RECONCILER_TEST_SECRET" not in drain


def proc_ids(pid: int) -> dict[str, str]:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines())
    return {k: fields[k].split()[0] if fields[k].split() else "" for k in ("Uid", "Gid", "Groups")}


def test_a_service_runs_as_its_user_and_owns_its_data_dir(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]
) -> None:
    if os.geteuid() != 0:
        unavailable("root", "starting a process as another user needs root (CI runs as root)")
    nobody = pwd.getpwnam("nobody")
    dep = dump_repo(tmp_path, merge_key, account="  user: nobody\n")
    # The state dir's parents must let the service's user through, as /var/lib does.
    parent = Path(tempfile.mkdtemp(prefix="reconciler-user-"))
    parent.chmod(0o755)
    try:
        node = agents("n1", dep.url, state_dir=parent / "n1")
        assert node.reconcile_once().exit_code == 0

        [pid] = processes_of(node.cfg.state_dir)["dump"]
        assert proc_ids(pid) == {"Uid": str(nobody.pw_uid), "Gid": str(nobody.pw_gid), "Groups": ""}
        data = node.cfg.state_dir / "services" / "dump" / "data"
        assert (data.stat().st_uid, data.stat().st_gid) == (nobody.pw_uid, nobody.pw_gid)
        env = json.loads((data / "env.json").read_text())  # it wrote there as nobody
        assert (env["HOME"], env["USER"]) == (nobody.pw_dir, "nobody")
    finally:
        stop_all(parent / "n1")
        shutil.rmtree(parent)


def test_an_unknown_user_or_group_is_a_located_error(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]
) -> None:
    dep = dump_repo(tmp_path, merge_key, account="  user: nobody\n  group: no-such-group-here\n")
    node = agents("n1", dep.url)

    result = node.reconcile_once()

    assert result.exit_code == 2 and result.report is not None and result.report.state == "error"
    assert re.fullmatch(r"services/dump/service\.yaml:\d+: node n1: service dump: runtime\.group: "
                        r"no group 'no-such-group-here' on this node", str(result.error)), result.error
    assert processes_of(node.cfg.state_dir) == {}


SLEEPER = "import time\nwhile True:\n    time.sleep(60)\n"


def two_services(tmp_path: Path, key: SigningKey) -> Deployment:
    files = {
        "reconciler.yaml": "format: 1\nname: crash\n",
        "inventory.yaml": "groups:\n  g: {services: [alpha, beta]}\nnodes:\n  n1: {groups: [g]}\n",
    }
    for name in ("alpha", "beta"):
        files[f"services/{name}/service.yaml"] = (
            "runtime:\n  command: [python3, sleeper.py]\nfiles:\n  - {path: sleeper.py, source: sleeper.py}\n")
        files[f"services/{name}/files/sleeper.py"] = SLEEPER
    return small_deployment(tmp_path, key, files, "two services")


def test_an_agent_killed_between_spawn_and_record_leaves_no_second_copy(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]
) -> None:
    def run_cli(case: str, **env: str) -> tuple[Deployment, Path, int]:
        """One `agent --once` on a fresh remote and state dir, with the fault variables given."""
        dep = two_services(tmp_path / case, merge_key)
        state = tmp_path / case / "state"
        args = ["agent", "--once", "--node", "n1", "--remote", dep.url, "--state-dir", str(state),
                "--allowed-signers", str(merge_key.allowed_signers)]
        done = subprocess.run(_cli(*args), env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
        return dep, state, done.returncode

    log = tmp_path / "points.log"
    _, state, code = run_cli("count", RECONCILER_FAULT_LOG=str(log))
    assert code == 0
    stop_all(state)
    points = [line.split(" ", 2) for line in log.read_text().splitlines()]
    spawns = {int(n): detail for n, kind, detail in points if kind == "spawn"}
    assert sorted(spawns.values()) == ["alpha", "beta"]

    for n, service in sorted(spawns.items()):
        for at, when in ((n, "before"), (n + 1, "after")):
            case = f"{service}-{when}"
            dep, state, code = run_cli(case, RECONCILER_FAULT_AT=str(at))
            assert code == -signal.SIGKILL, f"{case}: the agent was not killed at point {at}"
            if when == "after":  # the process it spawned outlived it, and no record names it
                assert len(processes_of(state).get(service, [])) == 1, case

            node = agents("n1", dep.url, state_dir=state)
            result = node.reconcile_once()

            assert result.exit_code == 0 and result.report is not None and result.report.state == "applied", case
            running = processes_of(state)
            assert {s: len(p) for s, p in running.items()} == {"alpha": 1, "beta": 1}, f"{case}: {running}"
            assert pids(node) == {s: p[0] for s, p in running.items()}, f"{case}: the records name them"
            again = node.reconcile_once()
            assert again.report is None and again.exit_code == 0, f"{case}: the next run is a no-op"
            assert processes_of(state) == running
            stop_all(state)


def stop_all(state: Path) -> None:
    driver = ProcessDriver(state / "services", "n1")
    for o in driver.observe():
        driver.remove(o.name)
    assert processes_of(state) == {}
