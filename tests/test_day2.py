"""Day-2 commands (docs/day2.md): `stop` and `start`, the decommission of a node that left the
inventory, `poll` and the webhook receiver, `diff --local`. Real agents, real processes, real
git, a real daemon answering a real HTTP POST; the CLI as a subprocess.
"""

from __future__ import annotations

import hashlib
import hmac
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import yaml
from conftest import Deployment, SigningKey, git, wait_for
from ports import free_port, wait_listening
from test_cli import as_json, cli, node_args

from reconciler.agent import Agent
from reconciler.drivers.observe import observe
from reconciler.node.context import drivers_for


def running(agent: Agent) -> dict[str, bool]:
    return {o.name: o.running for o in observe(agent.cfg.node, drivers_for(agent.cfg, None)).services}


def events(note: dict[str, object] | None) -> str:
    return "\n".join((note or {}).get("events", []))  # type: ignore[arg-type]


def test_stop_keeps_services_stopped_through_passes_until_start(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey
) -> None:
    ctl1 = agents("ctl1", deployment.url)
    assert ctl1.reconcile_once().exit_code == 0
    args = node_args(ctl1, merge_key)
    assert set(running(ctl1)) == {"db", "identity", "lb", "node-exporter"}

    proc = cli("stop", "lb", *args, "-o", "json")  # one service
    assert proc.returncode == 0, proc.stderr
    assert as_json(proc)["held"] == ["lb"]
    assert cli("agent", "--once", *args).returncode == 0
    assert set(running(ctl1)) == {"db", "identity", "node-exporter"}  # the pass left it stopped
    head = git("rev-parse", "HEAD", cwd=deployment.work)
    assert (deployment.note("ctl1", head) or {}).get("held") == ["lb"]  # the fleet view reads it
    proc = cli("apply", "--service", "lb", *args)  # a held service: said so, and how to lift it
    assert proc.returncode == 2 and "HELD_STOPPED" in proc.stderr and "reconciler start lb" in proc.stderr, \
        proc.stderr
    assert cli("rollback", "lb", *args).returncode == 2
    fleet = as_json(cli("status", "--fleet", *args, "-o", "json"))
    assert "held stopped: lb" in {n["node"]: n for n in fleet["nodes"]}["ctl1"]["detail"], fleet

    proc = cli("stop", "db", *args, "-o", "json")  # a dependency: what needs it is stopped with it
    assert proc.returncode == 0, proc.stderr
    assert as_json(proc)["dependents"] == ["identity"], as_json(proc)
    assert [s["service"] for s in as_json(proc)["stopped"]] == ["identity", "db"]  # dependents first
    assert set(running(ctl1)) == {"node-exporter"}

    proc = cli("stop", *args, "-o", "json")  # all the rest
    assert proc.returncode == 0, proc.stderr
    assert [s["service"] for s in as_json(proc)["stopped"]] == ["node-exporter"]
    assert running(ctl1) == {}
    assert "stopped" in events(deployment.note("ctl1")) and "by " in events(deployment.note("ctl1"))
    assert cli("agent", "--once", *args).returncode == 0
    assert running(ctl1) == {}
    status = as_json(cli("status", *args, "-o", "json"))
    assert set(status["held_stopped"]) == {"db", "identity", "lb", "node-exporter"}
    assert cli("stop", "nope", *args).returncode == 2  # a service that is not there: bad input

    proc = cli("start", "lb", *args, "-o", "json")
    assert as_json(proc)["started"] == ["lb"]
    assert cli("start", *args).returncode == 0  # the rest
    assert cli("agent", "--once", *args).returncode == 0
    assert running(ctl1) == {"db": True, "identity": True, "lb": True, "node-exporter": True}
    assert as_json(cli("status", *args, "-o", "json"))["held_stopped"] == {}


def test_only_a_decommission_listing_stops_a_node_which_idles_until_named_again(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey
) -> None:
    cmp2 = agents("cmp2", deployment.url)
    assert cmp2.reconcile_once().exit_code == 0
    ran = running(cmp2)
    assert ran
    args = node_args(cmp2, merge_key)
    inventory = yaml.safe_load(deployment.read("inventory.yaml"))
    entry = inventory["nodes"].pop("cmp2")
    deployment.write("inventory.yaml", yaml.safe_dump(inventory))
    deployment.commit("cmp2 gone (a typo, a rename): nothing may stop")
    proc = cli("agent", "--once", *args)
    assert proc.returncode == 2 and "UNKNOWN_NODE" in proc.stderr, proc.stderr
    assert running(cmp2) == ran

    inventory["decommission"] = ["cmp2"]
    deployment.write("inventory.yaml", yaml.safe_dump(inventory))
    head = deployment.commit("cmp2 leaves the fleet")
    assert cli("suspend", "--reason", "not yet", *args).returncode == 0
    assert cli("agent", "--once", *args).returncode == 0
    assert running(cmp2) == ran  # held by the suspension, as any apply
    assert "would stop" in events(deployment.note("cmp2", head))
    assert cli("resume", *args).returncode == 0

    proc = cli("agent", "--once", *args)
    assert proc.returncode == 0, proc.stderr
    assert running(cmp2) == {}
    note = deployment.note("cmp2", head) or {}
    assert note.get("state") == "applied" and f"decommissioned at {head[:12]}" in events(note), note
    assert as_json(cli("status", *args, "-o", "json"))["retired"]["commit"] == head

    deployment.commit("a later commit")
    proc = cli("agent", "--once", *args, "-o", "json")  # idle from now on: nothing, exit 0
    assert proc.returncode == 0, proc.stderr
    assert "decommissioned" in as_json(proc)["skipped"]
    assert running(cmp2) == {}

    del inventory["decommission"]
    inventory["nodes"]["cmp2"] = entry
    deployment.write("inventory.yaml", yaml.safe_dump(inventory))
    back = deployment.commit("cmp2 back in the fleet")
    proc = cli("agent", "--once", *args)  # the retirement lifted: it converges as any node
    assert proc.returncode == 0, proc.stderr
    assert running(cmp2) == ran
    assert (deployment.note("cmp2", back) or {}).get("state") == "applied"
    assert as_json(cli("status", *args, "-o", "json")).get("retired") is None


def test_a_node_that_never_applied_anything_is_not_decommissioned_and_validate_refuses_a_node_in_both(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey
) -> None:
    inventory = yaml.safe_load(deployment.read("inventory.yaml"))
    inventory["decommission"] = ["cmp2"]
    deployment.write("inventory.yaml", yaml.safe_dump(inventory))
    proc = cli("validate", "--repo", str(deployment.work))
    assert proc.returncode == 2 and "under both `nodes` and `decommission`" in proc.stderr, proc.stderr
    del inventory["nodes"]["cmp2"]
    deployment.write("inventory.yaml", yaml.safe_dump(inventory))
    deployment.commit("cmp2 decommissioned before its agent ever ran")
    cmp2 = agents("cmp2", deployment.url)
    proc = cli("agent", "--once", *node_args(cmp2, merge_key))
    assert proc.returncode == 2 and "UNKNOWN_NODE" in proc.stderr, proc.stderr
    assert as_json(cli("status", *node_args(cmp2, merge_key), "-o", "json")).get("retired") is None


def _signature(secret: bytes, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def _post(port: int, body: bytes, headers: dict[str, str]) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:  # noqa: S310
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_poll_and_a_signed_webhook_make_a_running_daemon_poll_now(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path, merge_key: SigningKey
) -> None:
    port = free_port()
    secret = tmp_path / "receiver.secret"
    secret.write_text("s3cret\n")
    secret.chmod(0o600)
    state_dir = tmp_path / "nodes" / "cmp1"
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({
        "node": "cmp1", "remote": deployment.url, "state_dir": str(state_dir), "interval": 3600, "jitter": 0,
        "trust": {"allowed_signers": str(merge_key.allowed_signers)},
        "receiver": {"listen": f"127.0.0.1:{port}", "secret_file": str(secret)},
    }))
    agents("cmp1", deployment.url, state_dir=state_dir)  # cleanup
    daemon = subprocess.Popen([sys.executable, "-m", "reconciler", "agent", "--config", str(config)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_listening(port, "the webhook receiver", daemon, seconds=30)
        first = git("rev-parse", "HEAD", cwd=deployment.work)
        wait_for(lambda: (deployment.note("cmp1", first) or {}).get("state") == "applied", 30, "the first pass")

        second = deployment.commit("second")
        proc = cli("poll", "--config", str(config))
        assert proc.returncode == 0, proc.stderr
        wait_for(lambda: deployment.note("cmp1", second) is not None, 5, "a poll after `reconciler poll`")

        third = deployment.commit("third")
        body = b'{"ref": "refs/heads/main"}'
        assert _post(port, body, {"X-Hub-Signature-256": _signature(b"wrong", body)}) == 401
        assert _post(port, body, {}) == 401
        assert daemon.poll() is None
        assert deployment.note("cmp1", third) is None  # nothing happened
        assert _post(port, body, {"X-Hub-Signature-256": _signature(b"s3cret", body)}) == 202
        wait_for(lambda: deployment.note("cmp1", third) is not None, 5, "a poll after a signed webhook")
        assert _post(port, body, {"X-Signature": _signature(b"s3cret", body)}) == 202  # within the gap: coalesced
    finally:
        daemon.send_signal(signal.SIGTERM)
        _, stderr = daemon.communicate(timeout=30)
    assert daemon.returncode == 0, stderr
    proc = cli("poll", "--config", str(config))  # no daemon: said, exit 2
    assert proc.returncode == 2 and "NO_DAEMON" in proc.stderr, proc.stderr


def test_diff_local_shows_the_uncommitted_change_of_a_work_tree_as_diff_would(deployment: Deployment) -> None:
    deployment.edit("inventory.yaml", "token_ttl: 3600", "token_ttl: 7200")  # not committed
    proc = cli("diff", "--local", str(deployment.work), "--node", "ctl1", "-o", "json", "--exit-code")
    assert proc.returncode == 1, proc.stderr  # a node changes
    report = as_json(proc)
    assert report["from"] == git("rev-parse", "HEAD", cwd=deployment.work)
    [node] = report["nodes"]
    assert [(a["service"], a["action"]) for a in node["actions"] if a["action"] != "none"] == [("identity", "reload")]
    git("commit", "-qam", "ttl", cwd=deployment.work)  # the same change committed: `diff` says the same
    same = as_json(cli("diff", "--repo", str(deployment.work), "HEAD~1", "HEAD", "--node", "ctl1", "-o", "json"))
    assert same["nodes"] == report["nodes"]
    assert cli("diff", "--local", str(deployment.work), "HEAD~1", "HEAD").returncode == 2  # one or the other
