"""One node, then five, converge on commits of a real git remote with real processes.

History used here (each test builds its own)::

    C1 initial deployment --- C2 identity template changed --- C3 ...
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from conftest import NODES, Deployment, git

from reconciler.agent import Agent
from reconciler.core.errors import RemoteError
from reconciler.core.model import ActionKind, RunState
from reconciler.node.operations import plan

CONTROLLER_SERVICES = ["db", "identity", "lb", "node-exporter"]
COMPUTE_SERVICES = ["compute-agent", "node-exporter"]


def pids(agent: Agent) -> dict[str, int | None]:
    from reconciler.drivers.observe import observe
    from reconciler.node.context import drivers_for

    return {o.name: o.pid for o in observe(agent.cfg.node, drivers_for(agent.cfg, None)).services}


def get_json(url: str, data: bytes | None = None) -> Any:
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def actions(result: Any) -> dict[str, str]:
    return {r.service: str(r.action) for r in result.report.services}


def test_one_node_converges_and_notes_the_commit(deployment: Deployment, agents: Callable[..., Agent]) -> None:
    ctl1 = agents("ctl1", deployment.url)
    head = git("rev-parse", "HEAD", cwd=deployment.work)

    result = ctl1.reconcile_once()

    assert result.exit_code == 0 and result.commit == head and result.fetched
    assert actions(result) == {s: "start" for s in CONTROLLER_SERVICES}
    assert all(pid for pid in pids(ctl1).values())
    note = deployment.note("ctl1")
    assert note is not None
    assert note["state"] == "applied" and note["commit"] == head and note["node"] == "ctl1"
    assert note["services"]["identity"]["action"] == "start"  # type: ignore[index]
    # The service really serves its rendered config.
    port = deployment.port_bases["ctl1"] + 5
    assert get_json(f"http://127.0.0.1:{port}/v3")["node"] == "ctl1"


def test_second_run_on_the_same_commit_touches_nothing(deployment: Deployment, agents: Callable[..., Agent]) -> None:
    ctl1 = agents("ctl1", deployment.url)
    ctl1.reconcile_once()
    before = pids(ctl1)

    again = ctl1.reconcile_once()

    assert again.report is None and not again.fetched and again.exit_code == 0
    assert pids(ctl1) == before


def test_five_nodes_then_a_template_change_restarts_only_identity_on_controllers(
    deployment: Deployment, agents: Callable[..., Agent], git_daemon: str
) -> None:
    fleet = {n: agents(n, git_daemon) for n in NODES}
    for node, agent in fleet.items():
        assert agent.reconcile_once().exit_code == 0, node
    before = {n: pids(a) for n, a in fleet.items()}
    # The whole control plane works: a token through ctl1's lb, identity, db.
    lb = deployment.port_bases["ctl1"]
    token = get_json(f"http://127.0.0.1:{lb}/v3/auth/tokens", data=b"{}")
    assert token["expires_in"] == 3600

    deployment.edit("services/identity/templates/identity.conf.j2", "port = {{ port_base + ports.identity }}",
                    "port = {{ port_base + ports.identity }}\nworkers = 4")
    c2 = deployment.commit("identity: four API workers")
    results = {n: a.reconcile_once() for n, a in fleet.items()}

    after = {n: pids(a) for n, a in fleet.items()}
    for node, result in results.items():
        assert result.commit == c2 and result.exit_code == 0
        changed = {s for s, a in actions(result).items() if a != "none"}
        if node.startswith("ctl"):
            assert changed == {"identity"}
            assert actions(result)["identity"] == "restart"
            assert after[node]["identity"] != before[node]["identity"]
            untouched = {s: p for s, p in after[node].items() if s != "identity"}
            assert untouched == {s: p for s, p in before[node].items() if s != "identity"}
        else:
            assert changed == set()
            assert after[node] == before[node]
        note = deployment.note(node, c2)
        assert note is not None and note["state"] == "applied"
    reason = results["ctl2"].report.services  # type: ignore[union-attr]
    assert next(r.reason for r in reason if r.service == "identity") == (
        "only [api] workers added in identity.conf (no rule: restart)")
    assert get_json(f"http://127.0.0.1:{deployment.port_bases['ctl2'] + 5}/v3")["node"] == "ctl2"


def test_a_service_removed_from_the_group_is_stopped(deployment: Deployment, agents: Callable[..., Agent]) -> None:
    cmp1 = agents("cmp1", deployment.url)
    cmp1.reconcile_once()
    exporter_pid = pids(cmp1)["node-exporter"]
    assert exporter_pid

    deployment.edit("inventory.yaml", "groups: [computes, monitoring]\n    vars: {port_base: "
                    f"{deployment.port_bases['cmp1']}",
                    f"groups: [computes]\n    vars: {{port_base: {deployment.port_bases['cmp1']}")
    deployment.commit("cmp1 leaves monitoring")
    result = cmp1.reconcile_once()

    assert actions(result) == {"compute-agent": "none", "node-exporter": "stop"}
    assert set(pids(cmp1)) == {"compute-agent"}
    with pytest.raises(ProcessLookupError):
        import os
        os.kill(exporter_pid, 0)


@pytest.mark.parametrize("breakage, expected", [
    ({"services/db/templates/db.conf.j2": "port = {{ no_such_var }}\n"},
     "services/db/templates/db.conf.j2:1: node ctl1: 'no_such_var' is undefined"),
    ({"inventory.yaml": "groups: [\n"}, "inventory.yaml:2: invalid YAML"),
])
def test_a_broken_commit_applies_nothing_and_is_noted(
    deployment: Deployment, agents: Callable[..., Agent], breakage: dict[str, str], expected: str
) -> None:
    ctl1 = agents("ctl1", deployment.url)
    ctl1.reconcile_once()
    before = pids(ctl1)
    for rel, text in breakage.items():
        deployment.write(rel, text)
    bad = deployment.commit("a broken change")

    result = ctl1.reconcile_once()

    assert result.exit_code == 2 and result.commit == bad
    assert str(result.error).startswith(expected)
    assert pids(ctl1) == before, "running services untouched"
    note = deployment.note("ctl1", bad)
    assert note is not None and note["state"] == "error" and str(note["error"]).startswith(expected)
    assert result.report is not None and result.report.state is RunState.ERROR


def test_unreachable_remote_is_a_remote_error(agents: Callable[..., Agent], tmp_path: Any) -> None:
    agent = agents("ctl1", "git://127.0.0.1:9/nothing.git")
    with pytest.raises(RemoteError, match="ref check of git://127.0.0.1:9/nothing.git failed"):
        agent.reconcile_once()


def test_credentials_never_reach_error_messages(agents: Callable[..., Agent]) -> None:
    agent = agents("ctl1", "https://deploy:s3cret@127.0.0.1:9/cloud.git")
    with pytest.raises(RemoteError) as info:
        agent.reconcile_once()
    assert "s3cret" not in str(info.value) and "https://127.0.0.1:9/cloud.git" in str(info.value)


def test_a_note_that_could_not_be_pushed_is_pushed_on_the_next_run(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Any
) -> None:
    ctl1 = agents("ctl1", deployment.url)
    ctl1.reconcile_once()
    deployment.edit("inventory.yaml", "token_ttl: 3600", "token_ttl: 1800")
    c2 = deployment.commit("shorter tokens")
    # The remote refuses writes for a while (a hook that declines every push).
    hook = deployment.bare / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho 'read-only maintenance' >&2\nexit 1\n")
    hook.chmod(0o755)

    result = ctl1.reconcile_once()
    assert result.exit_code == 0 and not result.pushed
    assert deployment.note("ctl1", c2) is None

    hook.unlink()
    again = ctl1.reconcile_once()
    assert again.report is None and again.pushed
    note = deployment.note("ctl1", c2)
    assert note is not None and note["state"] == "applied"


def test_notes_survive_the_loss_of_the_state_dir(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Any
) -> None:
    import shutil

    first = agents("cmp2", deployment.url)
    c1 = first.reconcile_once().commit
    # The node's disk is replaced: its services and its whole state dir are gone.
    from reconciler.drivers.process import ProcessDriver
    driver = ProcessDriver(first.cfg.state_dir / "services", "cmp2")
    for o in driver.observe():
        driver.remove(o.name)
    first.close()
    shutil.rmtree(first.cfg.state_dir)
    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    c2 = deployment.commit("kvm")

    second = agents("cmp2", deployment.url)
    assert second.reconcile_once().exit_code == 0

    # Both notes are on the remote: the old one was recovered, not overwritten.
    assert (deployment.note("cmp2", c1) or {}).get("state") == "applied"
    assert (deployment.note("cmp2", c2) or {}).get("state") == "applied"


def test_plan_is_a_dry_run(deployment: Deployment, agents: Callable[..., Agent]) -> None:
    cmp1 = agents("cmp1", deployment.url)
    the_plan, fetched = plan(cmp1.ctx)
    assert fetched
    assert [(str(a.kind), a.service) for a in the_plan.actions] == [
        ("start", "compute-agent"), ("start", "node-exporter")]
    assert pids(cmp1) == {}
    assert all(a.kind is ActionKind.START for a in the_plan.changes)


def test_smart_http_remote_fetch_and_note_push(
    deployment: Deployment, agents: Callable[..., Agent], http_remote: str
) -> None:
    cmp2 = agents("cmp2", http_remote)
    result = cmp2.reconcile_once()
    assert result.exit_code == 0 and result.pushed
    assert (deployment.note("cmp2") or {}).get("state") == "applied"
    # Only the branch was fetched, and only this node's notes ref was pushed.
    assert sorted(r for r in cmp2.source.repo.references if not r.startswith("refs/reconciler/")) == [
        "refs/heads/main", "refs/notes/reconciler/cmp2"]
    remote_refs = git("--git-dir", str(deployment.bare), "for-each-ref", "--format=%(refname)").split()
    assert remote_refs == ["refs/heads/main", "refs/notes/reconciler/cmp2"]


def test_ssh_remote_fetch_and_note_push(
    deployment: Deployment, agents: Callable[..., Agent], ssh_remote: tuple[str, str]
) -> None:
    url, command = ssh_remote
    ctl3 = agents("ctl3", url, ssh_command=command)
    result = ctl3.reconcile_once()
    assert result.exit_code == 0 and result.pushed
    assert (deployment.note("ctl3") or {}).get("state") == "applied"


def test_a_change_that_fails_its_health_check_puts_the_previous_version_back(
    deployment: Deployment, agents: Callable[..., Agent]
) -> None:
    ctl1 = agents("ctl1", deployment.url)
    ctl1.reconcile_once()
    before = pids(ctl1)
    port = deployment.port_bases["ctl1"] + 5
    deployment.edit("services/identity/templates/identity.conf.j2", "port = {{ port_base + ports.identity }}",
                    "port = five-thousand")
    bad = deployment.commit("identity: a config the program rejects")

    result = ctl1.reconcile_once()

    assert result.exit_code == 1 and result.report is not None and result.report.state == "failed"
    failed = next(r for r in result.report.services if r.service == "identity")
    assert failed.state == "failed" and "previous version restored" in failed.detail
    assert "exited at once" in failed.detail
    assert {r.service: str(r.action) for r in result.report.services if r.service != "identity"} == {
        "db": "none", "lb": "none", "node-exporter": "none"}
    after = pids(ctl1)
    assert after["identity"] not in (None, before["identity"])
    assert {s: p for s, p in after.items() if s != "identity"} == {s: p for s, p in before.items() if s != "identity"}
    assert get_json(f"http://127.0.0.1:{port}/v3")["token_ttl"] == 3600  # the old config serves
    assert (deployment.note("ctl1", bad) or {}).get("state") == "failed"


def test_a_reload_only_change_keeps_the_process_and_serves_the_new_value(
    deployment: Deployment, agents: Callable[..., Agent]
) -> None:
    ctl1 = agents("ctl1", deployment.url)
    ctl1.reconcile_once()
    before = pids(ctl1)
    deployment.edit("inventory.yaml", "token_ttl: 3600", "token_ttl: 900")
    deployment.commit("shorter tokens")

    result = ctl1.reconcile_once()

    assert actions(result) == {"db": "none", "identity": "reload", "lb": "none", "node-exporter": "none"}
    identity = next(r for r in result.report.services if r.service == "identity")  # type: ignore[union-attr]
    assert identity.reason == "only [token] ttl changed in identity.conf" and identity.steps == ("reload: ok",)
    assert pids(ctl1) == before
    assert get_json(f"http://127.0.0.1:{deployment.port_bases['ctl1'] + 5}/v3")["token_ttl"] == 900
