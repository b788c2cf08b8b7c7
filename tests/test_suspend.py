"""Suspend: a node (or the whole fleet, from a signed commit) that still fetches, verifies and
observes, and applies nothing until it is resumed. Real agents, real processes, the CLI as a
subprocess.

History of the node scenario::

    C0 initial --- C1 identity: four workers (held back while suspended, applied after resume)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from conftest import Deployment, SigningKey
from test_cli import as_json, cli, node_args
from test_metrics import parse, value

from reconciler.agent import Agent
from reconciler.drivers.observe import observe
from reconciler.node.context import drivers_for

WORKERS = ("port = {{ port_base + ports.identity }}", "port = {{ port_base + ports.identity }}\nworkers = 4")


def running(agent: Agent) -> dict[str, tuple[int | None, str | None]]:
    """Each service's pid and the hash of the config it runs."""
    return {o.name: (o.pid, o.hash) for o in observe(agent.cfg.node, drivers_for(agent.cfg, None)).services}


def test_a_suspended_node_applies_nothing_reports_drift_and_converges_after_resume(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey, tmp_path: Path
) -> None:
    ctl1 = agents("ctl1", deployment.url)
    assert ctl1.reconcile_once().exit_code == 0
    before = running(ctl1)
    args = node_args(ctl1, merge_key)

    proc = cli("suspend", "--reason", "disk swap", *args, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    first = as_json(proc)["suspended"]
    assert first["reason"] == "disk swap" and first["by"] and first["since"]
    proc = cli("suspend", "--reason", "disk swap, ticket 4411", *args, "-o", "json")  # twice: the reason changes
    assert as_json(proc)["already"] is True
    assert as_json(proc)["suspended"] == {**first, "reason": "disk swap, ticket 4411"}

    conf = ctl1.cfg.state_dir / "services" / "identity" / "live" / "identity.conf"
    conf.write_text(conf.read_text() + "# edited by hand\n")
    assert cli("agent", "--once", *args).returncode == 0  # same head, drifted

    assert conf.read_text().endswith("# edited by hand\n")  # the drift is reported, not put back
    note = deployment.note("ctl1") or {}
    assert note["state"] == "applied" and note["suspended"] == {**first, "reason": "disk swap, ticket 4411"}
    assert any("identity drifted" in e for e in note["events"])  # type: ignore[attr-defined]

    deployment.edit("services/identity/templates/identity.conf.j2", *WORKERS)
    head = deployment.commit("identity: four workers")
    textfile = tmp_path / "r.prom"
    proc = cli("agent", "--once", *args, "--metrics-textfile", str(textfile), "-o", "json")

    assert proc.returncode == 0, proc.stderr  # held back on purpose: not a failure
    assert running(ctl1) == before  # same pid, same config: nothing applied
    assert conf.read_text().endswith("# edited by hand\n")
    note = deployment.note("ctl1", head) or {}
    assert note["state"] == "waiting" and note["reason"] == "SUSPENDED"
    assert note["suspended"] == {**first, "reason": "disk swap, ticket 4411"}
    events = "\n".join(note.get("events", []))  # type: ignore[arg-type]
    assert "identity drifted" in events and "would restart identity" in events
    assert value(parse(textfile.read_text()), "reconciler_suspended") == 1.0
    status = as_json(cli("status", *args, "-o", "json"))
    assert status["suspended"]["reason"] == "disk swap, ticket 4411"

    proc = cli("resume", *args)
    assert proc.returncode == 0 and "resumed" in proc.stdout, proc.stderr
    assert "not suspended" in cli("resume", *args).stdout  # again: says so, exit 0
    proc = cli("agent", "--once", *args, "--metrics-textfile", str(textfile))

    assert proc.returncode == 0, proc.stderr
    note = deployment.note("ctl1", head) or {}
    assert note["state"] == "applied" and "suspended" not in note
    assert running(ctl1)["identity"] != before["identity"]  # restarted on the new config
    assert "# edited by hand" not in conf.read_text()
    assert value(parse(textfile.read_text()), "reconciler_suspended") == 0.0


def test_a_signed_suspend_in_reconciler_yaml_holds_every_node_until_a_commit_removes_it(
    deployment: Deployment, agents: Callable[..., Agent]
) -> None:
    nodes = [agents("ctl1", deployment.url), agents("cmp1", deployment.url)]
    assert all(n.reconcile_once().exit_code == 0 for n in nodes)
    before = [running(n) for n in nodes]
    settings = deployment.read("reconciler.yaml")

    deployment.write("reconciler.yaml", settings + 'suspend: true\nsuspend_reason: "datacenter move"\n')
    deployment.edit("services/identity/templates/identity.conf.j2", *WORKERS)
    held = deployment.commit("fleet: suspend for the move, and four identity workers")
    results = [n.reconcile_once() for n in nodes]

    assert [r.exit_code for r in results] == [0, 0]
    assert [running(n) for n in nodes] == before
    for n in nodes:
        note = deployment.note(n.cfg.node, held) or {}
        assert note["state"] == "waiting", note
        assert note["suspended"]["reason"] == "datacenter move"  # type: ignore[index]
        assert n.ledger.suspension() is not None

    deployment.write("reconciler.yaml", settings)
    lifted = deployment.commit("fleet: the move is done")
    assert [n.reconcile_once().exit_code for n in nodes] == [0, 0]
    for n in nodes:
        assert (deployment.note(n.cfg.node, lifted) or {})["state"] == "applied"
        assert n.ledger.suspension() is None
    assert running(nodes[0])["identity"] != before[0]["identity"]


def test_an_unsigned_commit_adding_suspend_is_refused_and_suspends_nothing(
    deployment: Deployment, agents: Callable[..., Agent]
) -> None:
    ctl1 = agents("ctl1", deployment.url)
    assert ctl1.reconcile_once().exit_code == 0
    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml") + "suspend: true\n")
    forged = deployment.commit("suspend the fleet (unsigned)", key=None)

    result = ctl1.reconcile_once()

    assert result.error is not None and result.exit_code != 0
    assert (deployment.note("ctl1", forged) or {})["state"] == "refused"
    assert ctl1.ledger.suspension() is None
    assert json.loads(json.dumps(result.to_dict()))["suspended"] == ""
