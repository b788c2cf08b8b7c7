"""The command line as a script sees it: every command documents its exit codes, and under
``-o json`` every outcome, a failure included, is one JSON object on stdout with the one-line
error still on stderr and the exit code unchanged.

History used by the node scenarios (canary ctl1, then the rest)::

    C0 initial --- C1 canary first --- C2 a change to identity --- C3 identity broken
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLE, Deployment, SigningKey, age_args, git

from reconciler.agent import Agent
from reconciler.core.errors import ConfigError

COMMANDS = ("validate", "render", "diff", "plan", "apply", "agent", "verify", "status", "history", "rollback",
            "unpin", "retry", "logs", "suspend", "resume", "bundle", "prepull", "note-key",
            "stop", "start", "poll",  # day 2 (docs/day2.md)
            "init", "check", "node",  # bootstrap and onboarding (docs/bootstrap.md)
            "merge", "import")  # signed merges (docs/operations/signed-merges.md), kolla-ansible's import

ROLLOUT = """\
rollout:
  waves:
    - {name: canary, nodes: [ctl1]}
    - {name: rest, nodes: [ctl2, ctl3, "cmp*"]}
"""


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reconciler", *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ))


def as_json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """stdout as one JSON object; a failure names what came instead."""
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"not JSON (rc {proc.returncode}): {proc.stdout!r} / {proc.stderr!r}") from None
    assert isinstance(data, dict), data
    return data


def one_error_line(proc: subprocess.CompletedProcess[str], reason: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and lines[0].endswith(f"[{reason}]"), proc.stderr


def node_args(agent: Agent, key: SigningKey) -> list[str]:
    return ["--node", agent.cfg.node, "--remote", agent.cfg.remote, "--state-dir", str(agent.cfg.state_dir),
            "--allowed-signers", str(key.allowed_signers), *age_args(agent)]


def break_identity(deployment: Deployment) -> str:
    deployment.edit("services/identity/templates/identity.conf.j2", "port = {{ port_base + ports.identity }}",
                    "port = five-thousand")
    return deployment.commit("identity: a config the program rejects")


# ---------------------------------------------------------------------------- help
def test_the_group_lists_exactly_the_documented_commands() -> None:
    proc = cli("--help")
    assert proc.returncode == 0, proc.stderr
    listed = re.findall(r"^  ([\w-]+)  ", proc.stdout.split("Commands:")[1], flags=re.M)
    # a new command joins COMMANDS, so its help is checked below (a group: its command)
    assert sorted(listed) == sorted((*COMMANDS, "review-post"))


@pytest.mark.parametrize("command", [*({"node": "node add", "import": "import kolla-ansible"}.get(c, c) for c in COMMANDS),
                                     "review-post"])
def test_every_command_help_shows_an_example_and_its_exit_codes(command: str) -> None:
    proc = cli(*command.split(), "--help")
    assert proc.returncode == 0, proc.stderr
    example = proc.stdout.split("Example:")[1].splitlines()[1].strip()
    assert example.startswith(f"reconciler {command}"), example
    codes = re.search(r"Exit codes[^\n]*:\n((?:    .*\n)+)", proc.stdout)
    assert codes is not None, proc.stdout
    listed = re.findall(r"^    (\d+)  \S", codes.group(1), flags=re.M)
    assert listed[0] == "0" and "2" in listed, codes.group(1)  # ok, and what bad input means here
    assert "json" in proc.stdout  # -o json everywhere


# ---------------------------------------------------------------------------- errors as JSON
def test_a_read_command_on_a_missing_node_is_a_json_error_and_exit_2(tmp_path: Path) -> None:
    for command in ("status", "history"):
        proc = cli(command, "--node", "ctl1", "--state-dir", str(tmp_path / "nonexistent"), "-o", "json")
        assert proc.returncode == 2, (command, proc.stderr)
        error = as_json(proc)["error"]
        assert error["reason"] == "NO_STATE" and error["exit_code"] == 2, (command, error)
        assert "does not exist" in error["message"]
        one_error_line(proc, "NO_STATE")
    proc = cli("status", "--state-dir", "/nonexistent", "-o", "json")  # and no node at all
    assert proc.returncode == 2 and as_json(proc)["error"]["reason"] == "NO_STATE"  # said as such, not "no node"


def test_a_usage_error_is_json_too_and_plain_without_o_json() -> None:
    proc = cli("apply", "--no-such-flag", "-o", "json")
    assert proc.returncode == 2
    assert as_json(proc)["error"] == {"reason": "USAGE", "message": "No such option '--no-such-flag'.",
                                      "exit_code": 2}
    one_error_line(proc, "USAGE")
    proc = cli("apply", "--no-such-flag")
    assert proc.returncode == 2 and proc.stdout == "" and "Usage:" in proc.stderr


def test_validate_of_a_broken_inventory_is_json_with_its_problems_and_exit_2(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE, repo)
    inventory = repo / "inventory.yaml"
    inventory.write_text(inventory.read_text().replace("groups: [computes, monitoring]", "groups: [hypervisors]", 1))

    proc = cli("validate", "--repo", str(repo), "-o", "json")
    assert proc.returncode == 2, proc.stderr
    result = as_json(proc)
    assert result["ok"] is False and result["error"]["reason"] == "INVALID_REPO"
    assert result["error"]["exit_code"] == 2
    assert any(p["file"] == "inventory.yaml" and "hypervisors" in p["message"] for p in result["problems"])
    one_error_line(proc, "INVALID_REPO")

    proc = cli("validate", "--repo", str(EXAMPLE), "-o", "json")  # the same command on a sound repo
    assert proc.returncode == 0 and "error" not in as_json(proc)


# ---------------------------------------------------------------------------- a node
def test_unpin_and_apply_of_an_unknown_service_speak_json_on_a_converged_node(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey
) -> None:
    ctl1 = agents("ctl1", deployment.url)
    assert ctl1.reconcile_once().exit_code == 0
    deployment.edit("services/identity/templates/identity.conf.j2", "port = {{ port_base + ports.identity }}",
                    "port = {{ port_base + ports.identity }}\nworkers = 4")
    deployment.commit("identity: four workers")
    assert ctl1.reconcile_once().exit_code == 0
    ctl1.close()
    args = node_args(ctl1, merge_key)

    proc = cli("apply", "--service", "nope", *args, "-o", "json")
    assert proc.returncode == 2, proc.stderr
    result = as_json(proc)
    assert result["error"]["reason"] == "UNKNOWN_SERVICE" and result["error"]["exit_code"] == 2
    assert "nope" in result["error"]["message"]
    one_error_line(proc, "UNKNOWN_SERVICE")

    assert cli("rollback", "identity", *args).returncode == 0
    proc = cli("unpin", "identity", *args, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    assert as_json(proc) == {"service": "identity", "released": True}

    proc = cli("unpin", "identity", *args, "-o", "json")  # nothing left to release
    assert proc.returncode == 2
    assert as_json(proc) == {"service": "identity", "released": False, "error": {
        "reason": "NOT_PINNED", "message": "service identity is not pinned on node ctl1", "exit_code": 2}}
    one_error_line(proc, "NOT_PINNED")


def test_a_failing_canary_fails_its_apply_and_status_fleet_and_retry_names_the_commit(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey, tmp_path: Path
) -> None:
    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml") + ROLLOUT)
    deployment.commit("canary first")
    ctl1 = agents("ctl1", deployment.url)
    assert ctl1.reconcile_once().exit_code == 0
    ctl1.close()
    # ctl2's view of the fleet, from a state dir of its own that has applied nothing.
    (tmp_path / "ctl2-view").mkdir()  # made ready for it: only the agent makes one where none is
    fleet = ["status", "--fleet", "--node", "ctl2", "--remote", deployment.url, "--state-dir",
             str(tmp_path / "ctl2-view"), "--allowed-signers", str(merge_key.allowed_signers), "-o", "json"]

    proc = cli(*fleet)
    assert proc.returncode == 0, proc.stderr
    assert as_json(proc)["counts"]["applied"] == 1 and "error" not in as_json(proc)
    proc = cli("retry", *node_args(ctl1, merge_key), "-o", "json")
    assert proc.returncode == 0 and as_json(proc) == {"retry": None}

    bad = break_identity(deployment)
    proc = cli("apply", *node_args(ctl1, merge_key), "-o", "json")
    assert proc.returncode == 1
    applied = as_json(proc)
    assert applied["report"]["state"] == "failed" and applied["commit"] == bad
    assert applied["error"]["exit_code"] == 1 and applied["error"]["reason"] == "APPLY_FAILED"
    assert "identity" in applied["error"]["message"]
    assert proc.stderr.strip().splitlines()[-1].endswith("[APPLY_FAILED]")

    proc = cli(*fleet)
    assert proc.returncode == 1, proc.stderr
    status = as_json(proc)
    assert status["commit"] == bad and status["counts"]["failed"] == 1
    assert {s["node"]: s["state"] for s in status["nodes"]}["ctl1"] == "failed"
    assert status["error"]["reason"] == "ROLLOUT_STOPPED" and status["error"]["exit_code"] == 1
    one_error_line(proc, "ROLLOUT_STOPPED")
    human = cli(*fleet[:-2])
    assert human.returncode == 1 and "1 failed" in human.stdout

    proc = cli("retry", *node_args(ctl1, merge_key), "-o", "json")
    assert proc.returncode == 0 and as_json(proc) == {"retry": bad}


def test_an_installed_node_reads_etc_reconciler_agent_yaml_when_no_config_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reconciler.cli import common

    installed = tmp_path / "etc" / "agent.yaml"
    installed.parent.mkdir()
    installed.write_text(f"node: ctl1\nremote: file://{tmp_path}/cloud.git\nstate_dir: {tmp_path}/state\n")
    monkeypatch.setattr(common, "DEFAULT_CONFIG", installed)
    opts = dict.fromkeys(common.AGENT_KEYS)
    cfg = common.agent_config(opts)
    assert (cfg.node, cfg.state_dir) == ("ctl1", tmp_path / "state")
    assert common.agent_config({**opts, "node": "ctl2"}).node == "ctl2"  # flags still win
    monkeypatch.setattr(common, "DEFAULT_CONFIG", tmp_path / "absent.yaml")
    with pytest.raises(ConfigError, match="missing setting 'node'"):
        common.agent_config(opts)


# ---------------------------------------------------------------------------- output paths


@pytest.mark.parametrize(("setup", "out", "message"), [
    (lambda t: (t / "out").write_text("a file"), "out", "--out {t}/out: not a directory"),
    (lambda t: None, "/dev/null/out", "--out /dev/null/out: /dev/null is not a directory"),
    (lambda t: (t / "out/ctl1/db/db.conf").mkdir(parents=True), "out",
     "--out {t}/out: ctl1/db/db.conf: a directory, not a file"),
    (lambda t: ((t / "out").mkdir(), (t / "out/ctl1").write_text("")), "out", "--out {t}/out: ctl1 is not a directory"),
], ids=["out-is-a-file", "out-under-a-device", "a-directory-at-a-file", "a-file-at-a-node"])
def test_render_out_that_cannot_be_written_names_the_path_and_exits_2(
    tmp_path: Path, setup: Callable[[Path], object], out: str, message: str
) -> None:
    setup(tmp_path)
    out_dir = out if out.startswith("/") else str(tmp_path / out)
    proc = cli("render", "--repo", str(EXAMPLE), "--all", "--out", out_dir)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"error: {message.format(t=tmp_path)} [BAD_INPUT]\n"


def test_a_report_or_page_that_cannot_be_written_names_the_path_and_exits_2(
    deployment: Deployment, tmp_path: Path
) -> None:
    repo = str(tmp_path / "ci")
    git("clone", "-q", deployment.url, repo)  # what a CI job reviews and draws the rollout from
    for report, message in ((tmp_path, f"{tmp_path}: a directory, not a file"),
                            (Path("/dev/null/full.md"), "/dev/null/full.md: /dev/null is not a directory")):
        proc = cli("diff", "--repo", repo, "HEAD", "HEAD", "-o", "markdown", "--report-file", str(report))
        assert (proc.returncode, proc.stderr) == (2, f"error: --report-file {message} [BAD_INPUT]\n")
        assert proc.stdout == ""  # no comment without its artifact
        proc = cli("status", "--fleet", "--repo", repo, "--html", str(report))
        assert (proc.returncode, proc.stderr) == (2, f"error: --html {message} [BAD_INPUT]\n")


def test_a_full_disk_under_out_stays_disk_full_and_exit_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from reconciler.cli import common
    from reconciler.core.errors import DiskFull

    def no_room(self: Path, *args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))

    monkeypatch.setattr(Path, "mkdir", no_room)  # room may come: not the user's mistake
    with pytest.raises(DiskFull, match=rf"^cannot write --out {tmp_path}: no space left on device") as info:
        common.output_dir("--out", tmp_path)
    assert info.value.exit_code == 1
    with pytest.raises(DiskFull, match=rf"^cannot write --out {tmp_path}: n1/api/a.conf: no space left on device"):
        common.write_output("--out", tmp_path, b"x", below="n1/api/a.conf")
