"""A node's local settings and its state dir, told truthfully (issue 37, items 7-11): the state
dir knows its node, a local settings error stays local, a remote git cannot read is a settings
error, only the agent makes a state dir, and Ctrl-C during a pass says what it interrupted while
``status`` shows the action in flight. Real agents as subprocesses, a real git remote, a real
SIGINT.

History::

    C0 web at level one --- C1 web at level two (a restart, its health check held open)
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import Deployment, SigningKey, note_key, small_deployment, wait_for
from test_cli import as_json, cli

from reconciler.agent import Agent
from reconciler.core.errors import ConfigError
from reconciler.settings import load_config

# web's health check passes only while GATE/release exists, and leaves GATE/checking behind each
# time it runs: the test holds a restart in its health check for as long as it needs, no sleeps.
SERVICE = """\
runtime:
  command: [python3, -c, "import time; time.sleep(100000)"]
files:
  - {path: web.conf, template: web.conf.j2}
health:
  command: "touch {{ gate }}/checking; test -e {{ gate }}/release"
  timeout: 120
"""


def inventory(gate: Path, level: str) -> str:
    return (f"vars:\n  gate: {gate}\n  level: {level}\n"
            "groups:\n  g: {services: [web]}\nnodes:\n  n1: {groups: [g]}\n  n2: {groups: [g]}\n")


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    path = tmp_path / "gate"
    path.mkdir()
    (path / "release").touch()
    return path


@pytest.fixture
def dep(tmp_path: Path, merge_key: SigningKey, gate: Path) -> Deployment:
    return small_deployment(tmp_path, merge_key, {
        "reconciler.yaml": "format: 1\nname: local-truths\n",
        "inventory.yaml": inventory(gate, "one"),
        "services/web/service.yaml": SERVICE,
        "services/web/templates/web.conf.j2": "level = {{ level }}\n",
    })


def args(node: str, dep: Deployment, state: Path, key: SigningKey, *more: str) -> list[str]:
    return ["--node", node, "--remote", dep.url, "--state-dir", str(state), "--allowed-signers",
            str(key.allowed_signers), "--note-key", str(note_key(node)), *more]


@pytest.fixture
def n1(tmp_path: Path, agents: Callable[..., Agent], dep: Deployment) -> Iterator[Path]:
    """n1's state dir; whatever its agents start there is stopped at the end."""
    state = tmp_path / "state" / "n1"
    yield state
    if (state / "state.db").exists():
        agents("n1", dep.url, state_dir=state)  # the fixture stops its services at teardown


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


# ---------------------------------------------------------------------------- 7: the state dir's node
def test_status_reads_the_node_from_its_state_dir_and_every_command_refuses_another(
    dep: Deployment, merge_key: SigningKey, n1: Path
) -> None:
    assert cli("agent", "--once", *args("n1", dep, n1, merge_key)).returncode == 0

    proc = cli("status", "--state-dir", str(n1))  # no --node: the state dir says whose it is
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("node n1:"), proc.stdout
    assert as_json(cli("status", "--state-dir", str(n1), "-o", "json"))["node"] == "n1"

    for command in (["status"], ["suspend"], ["agent", "--once"]):
        proc = cli(*command, *args("n2", dep, n1, merge_key))
        assert proc.returncode == 2, (command, proc.stdout, proc.stderr)
        line = one_line(proc)
        assert "n1" in line and "n2" in line and str(n1) in line, line
    assert dep.note("n2") is None  # n2 noted nothing, from n1's state dir
    assert "suspended" not in cli("status", "--state-dir", str(n1)).stdout


# ---------------------------------------------------------------------------- 8: local settings stay local
@pytest.mark.parametrize(("flag", "reason"), [("--age-identity", "SECRET_UNREADABLE"), ("--note-key", "BAD_CONFIG"),
                                             ("--allowed-signers", "BAD_CONFIG")])
def test_a_missing_local_file_is_a_settings_error_before_anything_and_nothing_is_published(
    dep: Deployment, merge_key: SigningKey, tmp_path: Path, n1: Path, flag: str, reason: str
) -> None:
    state = n1
    missing = tmp_path / "missing" / flag.strip("-")
    proc = cli("agent", "--once", *args("n1", dep, state, merge_key, flag, str(missing)))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    line = one_line(proc)
    assert str(missing) in line and line.endswith(f"[{reason}]"), line
    assert not state.exists()  # nothing fetched, no state dir made
    assert dep.note("n1") is None  # and nothing told the fleet


def test_an_age_identity_others_can_read_is_refused_at_start(dep: Deployment, merge_key: SigningKey,
                                                              tmp_path: Path, n1: Path) -> None:
    key = tmp_path / "n1.key"
    key.write_text("AGE-SECRET-KEY-1QQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQ\n")
    key.chmod(0o644)
    state = n1
    proc = cli("agent", "--once", *args("n1", dep, state, merge_key, "--age-identity", str(key)))
    assert proc.returncode == 2 and "chmod 600" in one_line(proc), proc.stderr
    assert not state.exists() and dep.note("n1") is None


# ---------------------------------------------------------------------------- 9: a remote git cannot read
def test_a_remote_git_cannot_read_is_a_settings_error_not_a_network_fault(
    dep: Deployment, merge_key: SigningKey, n1: Path
) -> None:
    state = n1
    proc = cli("agent", "--once", *args("n1", dep, state, merge_key, "--remote", "htps://x/y.git"))
    assert proc.returncode == 2, proc.stderr
    line = one_line(proc)
    assert "htps" in line and line.endswith("[BAD_CONFIG]"), line
    assert not state.exists()


@pytest.mark.parametrize("url", ["file:///srv/cloud.git", "ssh://git@host:2222/cloud.git", "git://host/cloud.git",
                                 "http://host/cloud.git", "https://host:8443/git/cloud.git",
                                 "git@host:cloud.git", "host:srv/cloud.git", "/srv/cloud.git", "cloud.git",
                                 "git+ssh://host/cloud.git", "bundle:///media/usb/cloud.bundle"])
def test_every_form_git_reads_is_a_remote(url: str) -> None:
    assert load_config(None, {"node": "n1", "remote": url}).remote


@pytest.mark.parametrize("url", ["htps://x/y.git", "https://", "ssh:///cloud.git", "file://srv/cloud.git"])
def test_a_remote_git_cannot_read_is_refused_naming_the_setting(url: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="remote"):
        load_config(None, {"node": "n1", "remote": url})
    config = tmp_path / "agent.yaml"
    config.write_text(f"node: n1\nremotes:\n  - url: file:///srv/cloud.git\n    role: read\n  - url: '{url}'\n")
    with pytest.raises(ConfigError, match=r"remotes\[1\]"):
        load_config(config, {})


# ---------------------------------------------------------------------------- 10: only the agent makes a state dir
@pytest.mark.parametrize("command", ["suspend", "resume", "retry", "unpin web"])
def test_a_command_that_steers_a_node_refuses_a_state_dir_the_agent_never_made(
    dep: Deployment, merge_key: SigningKey, tmp_path: Path, command: str
) -> None:
    typo = tmp_path / "stat" / "n1"
    proc = cli(*command.split(), *args("n1", dep, typo, merge_key))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    line = one_line(proc)
    assert f"no state dir at {typo}: the agent has not run there" in line, line
    assert not typo.exists() and not typo.parent.exists()


def test_a_node_made_ready_but_never_run_can_start_out_suspended(
    dep: Deployment, merge_key: SigningKey, n1: Path
) -> None:
    n1.mkdir(parents=True)  # as an installer makes it (systemd's StateDirectory=)
    proc = cli("suspend", "--reason", "racking", *args("n1", dep, n1, merge_key))
    assert proc.returncode == 0 and "n1: suspended" in proc.stdout, proc.stderr
    assert cli("agent", "--once", *args("n1", dep, n1, merge_key)).returncode == 0
    assert (dep.note("n1") or {}).get("state") == "waiting"  # held, as asked


# ---------------------------------------------------------------------------- 11: Ctrl-C mid-pass
def test_ctrl_c_during_a_health_check_says_what_it_interrupted_and_status_shows_it_in_flight(
    dep: Deployment, merge_key: SigningKey, n1: Path, gate: Path
) -> None:
    node = args("n1", dep, n1, merge_key)
    assert cli("agent", "--once", *node).returncode == 0
    (gate / "release").unlink()
    (gate / "checking").unlink()
    dep.write("inventory.yaml", inventory(gate, "two"))
    c1 = dep.commit("web: level two")

    agent = subprocess.Popen([sys.executable, "-m", "reconciler", "agent", "--once", *node],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for((gate / "checking").exists, timeout=60, what="the new web's health check")
        proc = cli("status", "--state-dir", str(n1), "-o", "json")  # the restart is under way
        assert [(f["service"], f["action"], f["state"]) for f in as_json(proc)["in_flight"]] == [
            ("web", "restart", "in progress")], proc.stdout
        agent.send_signal(signal.SIGINT)
        out, err = agent.communicate(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    assert agent.returncode == 130, (out, err)
    assert f"restart web at {c1[:12]}" in err and "the next run finishes it" in err, err

    proc = cli("status", "--state-dir", str(n1))
    assert proc.returncode == 0, proc.stderr
    assert f"restart web at {c1[:12]}: interrupted; the next run finishes it" in proc.stdout, proc.stdout
    assert " ok " not in proc.stdout, proc.stdout  # web, the only service, is not said to run well
    assert [(f["service"], f["action"], f["commit"], f["state"]) for f in as_json(
        cli("status", "--state-dir", str(n1), "-o", "json"))["in_flight"]] == [("web", "restart", c1, "interrupted")]

    (gate / "release").touch()
    proc = cli("agent", "--once", *node)
    assert proc.returncode == 0, proc.stderr
    assert (dep.note("n1", c1) or {}).get("state") == "applied"
    status = as_json(cli("status", "--state-dir", str(n1), "-o", "json"))
    assert status["in_flight"] == [] and "interrupted" not in cli("status", "--state-dir", str(n1)).stdout


def test_the_agent_documents_exit_130() -> None:
    for command in ("agent", "apply"):
        assert "130  interrupted" in cli(command, "--help").stdout


# ---------------------------------------------------------------------------- 9: a URL short of a slash
@pytest.mark.parametrize("url", ["https:/host/cloud.git", "ssh:/host/cloud.git", "file:/srv/cloud.git",
                                 "htps:/host/cloud.git", "http//host/cloud.git", "https//host/cloud.git"])
def test_a_url_short_of_a_slash_is_a_settings_error_not_a_host_or_a_local_path(url: str, tmp_path: Path) -> None:
    # Before: 'https:/host' was taken as ssh to a host named https, 'http//host' as a local
    # directory: both failed at every poll as REMOTE_UNREACHABLE.
    with pytest.raises(ConfigError, match=r"^command line: --remote: "):
        load_config(None, {"node": "n1", "remote": url})
    config = tmp_path / "agent.yaml"
    config.write_text(f"node: n1\nremotes:\n  - url: file:///srv/cloud.git\n    role: read\n  - url: '{url}'\n")
    with pytest.raises(ConfigError, match=rf"^{config}:5: remotes\[1\]\.url: "):
        load_config(config, {})


@pytest.mark.parametrize("url", ["backup:/srv/cloud.git", "git.example.org:/srv/cloud.git", "./http/cloud.git"])
def test_a_host_path_remote_and_a_local_path_still_read(url: str) -> None:
    assert load_config(None, {"node": "n1", "remote": url}).remote


@pytest.mark.parametrize("url", ["file://user:hunter2@host/cloud.git", "htps://user:hunter2@host/cloud.git",
                                 "https://user:hunter2@/cloud.git", "https:/user:hunter2@host/cloud.git",
                                 "http//user:hunter2@host/cloud.git"])
def test_a_refused_remote_never_says_its_password(url: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, {"node": "n1", "remote": url})
    assert "hunter2" not in str(caught.value) and "user:" not in str(caught.value), caught.value
    config = tmp_path / "agent.yaml"
    config.write_text(f"node: n1\nremotes:\n  - url: '{url}'\n")
    with pytest.raises(ConfigError) as caught:
        load_config(config, {})
    assert "hunter2" not in str(caught.value), caught.value


# ---------------------------------------------------------------------------- review of items 7-11
def test_a_mistyped_node_on_a_state_dir_that_names_none_yet_never_shuts_out_the_real_agent(
    dep: Deployment, merge_key: SigningKey, n1: Path
) -> None:
    """Only the agent records whose state dir it is: a command typed with the wrong --node, on
    a state dir made ready for the node or kept by an agent from before it recorded its node,
    changes whose it is for nobody (the real agent would exit 2 forever: RestartPreventExitStatus)."""
    n1.mkdir(parents=True)  # made ready by an installer; suspend takes it on purpose
    assert cli("suspend", *args("n1x", dep, n1, merge_key)).returncode == 0
    assert cli("resume", *args("n1x", dep, n1, merge_key)).returncode == 0
    proc = cli("agent", "--once", *args("n1", dep, n1, merge_key))
    assert proc.returncode == 0, proc.stderr

    import sqlite3

    with sqlite3.connect(n1 / "state.db") as db:  # as an agent of an earlier release left it
        db.execute("DELETE FROM meta WHERE key='node'")
    db.close()
    for command in (["plan", "--no-fetch"], ["status", "--fleet"], ["retry"], ["suspend"], ["resume"]):
        cli(*command, *args("n1x", dep, n1, merge_key))  # whatever each says of n1x
    proc = cli("agent", "--once", *args("n1", dep, n1, merge_key))
    assert proc.returncode == 0, proc.stderr
    assert cli("status", "--state-dir", str(n1)).stdout.startswith("node n1:")  # the agent's, now


@pytest.mark.parametrize("kind", ["an ssh key with a passphrase", "an ecdsa ssh key", "a malformed age key"])
def test_an_age_identity_a_pass_could_not_use_is_refused_at_start_in_one_line_never_showing_it(
    dep: Deployment, merge_key: SigningKey, tmp_path: Path, n1: Path, kind: str
) -> None:
    key = tmp_path / "n1.key"
    if kind == "a malformed age key":
        key.write_text("# n1\nAGE-SECRET-KEY-1NOTAKEYATALLNOTAKEYATALLNOTAKEYATALL\n")
        key.chmod(0o600)
    else:
        kind_of, passphrase = ("ecdsa", "") if "ecdsa" in kind else ("ed25519", "open sesame")
        subprocess.run(["ssh-keygen", "-q", "-t", kind_of, "-N", passphrase, "-f", str(key)], check=True)
    secret = [line for line in key.read_text().splitlines() if line and not line.startswith(("#", "-----"))][0]
    proc = cli("agent", "--once", *args("n1", dep, n1, merge_key, "--age-identity", str(key)))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    line = one_line(proc)
    assert str(key) in line and line.endswith("[SECRET_UNREADABLE]"), line
    assert secret[8:40] not in proc.stderr + proc.stdout  # the key itself is never said
    assert not n1.exists() and dep.note("n1") is None  # nothing fetched, nothing told the fleet


def test_status_says_a_mistyped_state_dir_and_status_fleet_reads_the_node_from_it(
    dep: Deployment, merge_key: SigningKey, tmp_path: Path, n1: Path
) -> None:
    typo = tmp_path / "stat" / "n1"
    proc = cli("status", "--state-dir", str(typo))
    assert proc.returncode == 2 and f"state dir {typo} does not exist" in one_line(proc), proc.stderr

    assert cli("agent", "--once", *args("n1", dep, n1, merge_key)).returncode == 0
    proc = cli("status", "--fleet", "--state-dir", str(n1), "--remote", dep.url, "--allowed-signers",
               str(merge_key.allowed_signers), "-o", "json")  # no --node: the state dir's
    assert proc.returncode == 0, proc.stderr
    assert "n1" in proc.stdout


def test_only_the_agent_and_apply_make_a_state_dir_every_other_command_refuses_a_path_it_never_ran_at(
    dep: Deployment, merge_key: SigningKey, tmp_path: Path
) -> None:
    typo = tmp_path / "stat" / "n1"
    for command in (["plan"], ["rollback", "web"], ["status", "--fleet"], ["verify"], ["prepull"]):
        proc = cli(*command, *args("n1", dep, typo, merge_key))
        assert proc.returncode == 2, (command, proc.stdout, proc.stderr)
        line = one_line(proc)
        assert f"no state dir at {typo}: the agent has not run there" in line, (command, line)
        assert not typo.parent.exists(), command


UPGRADING = """\
version: "{version}"
runtime:
  command: [python3, -c, "import time; time.sleep(100000)"]
files:
  - {{path: web.conf, template: web.conf.j2}}
health:
  command: "test -e {{{{ gate }}}}/release"
  timeout: 120
"""

STEPS = """\
upgrade:
  - {{name: stop, action: stop}}
  - name: migrate
    action: command
    command: "touch {gate}/migrating; while [ ! -e {gate}/go ]; do sleep 0.1; done"
  - {{name: start, action: start}}
"""


def test_ctrl_c_during_an_upgrade_step_says_which_step_and_status_shows_it_in_flight(
    dep: Deployment, merge_key: SigningKey, n1: Path, gate: Path
) -> None:
    """web is stopped (the upgrade's first step) and a migration runs when Ctrl-C comes: no
    service action is journalled then, yet the node is mid-upgrade."""
    dep.write("inventory.yaml", inventory(gate, "one").replace("  n2: {groups: [g]}\n", ""))
    dep.write("services/web/service.yaml", UPGRADING.format(version="1"))
    dep.commit("web: version 1, on n1 only")
    node = args("n1", dep, n1, merge_key)
    assert cli("agent", "--once", *node).returncode == 0
    dep.write("services/web/service.yaml", UPGRADING.format(version="2") + STEPS.format(gate=gate))
    c1 = dep.commit("web: version 2, with a migration")

    agent = subprocess.Popen([sys.executable, "-m", "reconciler", "agent", "--once", *node],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for((gate / "migrating").exists, timeout=60, what="the migration step")
        flight = as_json(cli("status", "--state-dir", str(n1), "-o", "json"))["in_flight"]
        assert [(f["service"], f["action"], f.get("step"), f["state"]) for f in flight] == [
            ("web", "step", "migrate", "in progress")], flight
        agent.send_signal(signal.SIGINT)
        out, err = agent.communicate(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        if agent.returncode != 130:
            (gate / "go").touch()  # the migration's command runs in its own session: let it end
    assert agent.returncode == 130, (out, err)
    assert f"step migrate of web's upgrade at {c1[:12]}" in err and "no service was being changed" not in err, err

    proc = cli("status", "--state-dir", str(n1))
    assert f"step migrate of web's upgrade at {c1[:12]}: interrupted" in proc.stdout, proc.stdout
    flight = as_json(cli("status", "--state-dir", str(n1), "-o", "json"))["in_flight"]
    assert [(f["service"], f["step"], f["commit"], f["state"]) for f in flight] == [
        ("web", "migrate", c1, "interrupted")], flight

    (gate / "go").touch()
    proc = cli("agent", "--once", *node)
    assert proc.returncode == 0, proc.stderr
    assert (dep.note("n1", c1) or {}).get("state") == "applied"
    assert as_json(cli("status", "--state-dir", str(n1), "-o", "json"))["in_flight"] == []


HOLD = """
import sys
from pathlib import Path
from reconciler.ledger.statedir import State
with State(Path(sys.argv[1])).lock():
    print("held", flush=True)
    sys.stdin.read()
"""


def test_a_pass_holding_the_lock_is_seen_even_where_the_kernel_lists_another_device(tmp_path: Path) -> None:
    """btrfs (a subvolume) and overlay can list a file's lock in /proc/locks under a device
    number other than stat's: the holder's pid, written in the lock file, still finds it."""
    from reconciler.ledger.statedir import State

    state = State(tmp_path / "state")
    assert state.held() is False  # no pass ever ran here
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(state.root)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert state.held() is True
        table = Path("/proc/locks").read_text()
        ino = (state.root / "lock").stat().st_ino
        elsewhere = tmp_path / "locks"
        elsewhere.write_text("".join(
            " ".join([*f[:5], "00:99:" + f[5].rsplit(":", 1)[1], *f[6:]]) + "\n"
            if len(f := line.split()) > 5 and f[5].endswith(f":{ino}") else line + "\n"
            for line in table.splitlines()))
        assert state.held(locks=elsewhere) is True
        assert state.held(locks=tmp_path / "unreadable") is None  # not sure: neither said
    finally:
        holder.kill()
        holder.wait()
    assert state.held() is False  # its holder is gone: interrupted, surely


def test_note_key_never_prints_a_line_for_another_node_with_the_key_in_this_state_dir(
    dep: Deployment, merge_key: SigningKey, n1: Path
) -> None:
    """The line would list n1's key as n2's in trust/nodes: n2's notes would be n1's to forge."""
    assert cli("agent", "--once", *args("n1", dep, n1, merge_key)).returncode == 0
    where = ["--remote", dep.url, "--state-dir", str(n1), "--allowed-signers", str(merge_key.allowed_signers)]

    proc = cli("note-key", "--node", "n2", *where)
    assert proc.returncode == 2, proc.stdout
    line = one_line(proc)
    assert "n1" in line and "n2" in line and str(n1) in line, line
    assert proc.stdout == ""

    proc = cli("note-key", "--node", "n1", *where)  # its own: the key in its state dir, as the agent signs with
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("n1 "), proc.stdout
