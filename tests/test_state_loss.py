"""A node that lost its state dir (a disk replaced, a directory removed by hand) under the
command line as users run it: it adopts the services it finds running as its own, and it never
rewrites a note of its own against the ledger's table of allowed moves.

History used here (each test builds its own)::

    C0 initial deployment --- C1 a change --- C2 ...
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Deployment, SigningKey, age_args, git, make_key, wait_for
from test_faults import processes_of

from reconciler.agent import Agent
from reconciler.daemon.supervisor import Supervisor
from reconciler.trust.notesig import NoteKey


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reconciler", *args], capture_output=True, text=True, timeout=180,
                          env=dict(os.environ))


def node_args(agent: Agent, key: SigningKey) -> list[str]:
    return ["--node", agent.cfg.node, "--remote", agent.cfg.remote, "--state-dir", str(agent.cfg.state_dir),
            "--allowed-signers", str(key.allowed_signers), *age_args(agent)]


def status(agent: Agent, key: SigningKey) -> dict[str, Any]:
    proc = cli("status", *node_args(agent, key), "-o", "json")
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def events(note: dict[str, object]) -> list[str]:
    found = note.get("events") or []
    assert isinstance(found, list)
    return [str(e) for e in found]


@pytest.fixture(autouse=True)
def nothing_left_running(tmp_path: Path) -> Iterator[None]:
    """What a node forgot, the ``agents`` fixture cannot find: a test that fails before the node
    adopted its services must still leave nothing running."""
    yield
    for node in (tmp_path / "nodes").glob("*"):
        for pids in processes_of(node).values():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


class FakeClock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_node_that_lost_its_state_under_a_failed_head_adopts_every_service_it_finds_running(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey
) -> None:
    ctl1 = agents("ctl1", deployment.url)  # its settings, and every service stopped at the end
    args = node_args(ctl1, merge_key)
    assert cli("agent", "--once", *args).returncode == 0
    deployment.edit("services/identity/templates/identity.conf.j2", "port = {{ port_base + ports.identity }}",
                    "port = five-thousand")
    bad = deployment.commit("identity: a config the program rejects")
    assert cli("agent", "--once", *args).returncode == 1
    assert (deployment.note("ctl1", bad) or {}).get("state") == "failed"
    running = processes_of(ctl1.cfg.state_dir)
    assert sorted(running) == ["db", "identity", "lb", "node-exporter"]

    shutil.rmtree(ctl1.cfg.state_dir)  # the node forgets everything; its services run on
    proc = cli("agent", "--once", *args)

    assert proc.returncode == 0, proc.stderr
    assert processes_of(ctl1.cfg.state_dir) == running  # none stopped, none started twice
    for service in running:
        assert f"adopted {service}" in proc.stderr, proc.stderr
    seen = {s["name"]: s for s in status(ctl1, merge_key)["services"]}
    assert {n: (s["running"], s["pid"]) for n, s in seen.items()} == {n: (True, p[0]) for n, p in running.items()}
    note = deployment.note("ctl1", bad) or {}
    assert note.get("state") == "failed"  # what it was: the adoption is an event on it
    assert sorted(str(e).split(" ")[1] for e in events(note) if str(e).startswith("adopted ")) == sorted(running)

    # Managed again: a killed db is restarted by the supervisor, from the record it adopted.
    db = running["db"][0]
    os.kill(db, signal.SIGKILL)
    wait_for(lambda: "db" not in processes_of(ctl1.cfg.state_dir), what="db gone")
    assert Supervisor(agents("ctl1", deployment.url), FakeClock()).tick() == ["db"]
    assert processes_of(ctl1.cfg.state_dir)["db"] != [db]
    # And a second pass finds nothing to adopt and nothing to do.
    again = cli("agent", "--once", *args)
    assert again.returncode == 0 and "adopted" not in again.stderr, again.stderr


def test_a_node_that_lost_its_state_under_a_healthy_head_keeps_its_services_and_notes_the_adoption(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey
) -> None:
    cmp1 = agents("cmp1", deployment.url)
    args = node_args(cmp1, merge_key)
    assert cli("agent", "--once", *args).returncode == 0
    running = processes_of(cmp1.cfg.state_dir)
    head = git("rev-parse", "HEAD", cwd=deployment.work)

    shutil.rmtree(cmp1.cfg.state_dir)
    proc = cli("agent", "--once", *args, "-o", "json")

    assert proc.returncode == 0, proc.stderr
    assert processes_of(cmp1.cfg.state_dir) == running  # adopted, not restarted
    out = json.loads(proc.stdout)
    assert {n: s["action"] for n, s in out["report"]["services"].items()} == \
        {"compute-agent": "none", "node-exporter": "none"}
    note = deployment.note("cmp1", head) or {}
    assert note.get("state") == "applied"
    assert sum(e.startswith("adopted ") for e in events(note)) == 2


def test_a_node_that_lost_its_state_after_a_key_rotation_adopts_what_the_retired_key_signed(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey, tmp_path: Path
) -> None:
    """C0 (merge key) --- C1 rotation to a new key (signed by the merge key) --- C2 compute-agent
    changed (new key): node-exporter still runs as C0 rendered it, signed by a retired key."""
    new_key = make_key(tmp_path / "k", "merge-2026")
    cmp1 = agents("cmp1", deployment.url)
    args = node_args(cmp1, merge_key)
    assert cli("agent", "--once", *args).returncode == 0
    deployment.write("trust/allowed_signers", f'merge@example.org namespaces="git" {new_key.public}\n')
    deployment.commit("rotate the merge key", key=merge_key)
    assert cli("agent", "--once", *args).returncode == 0
    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    change = deployment.commit("compute-agent: kvm, under the new key", key=new_key)
    assert cli("agent", "--once", *args).returncode == 0
    assert (deployment.note("cmp1", change) or {}).get("state") == "applied"
    running = processes_of(cmp1.cfg.state_dir)
    assert sorted(running) == ["compute-agent", "node-exporter"]

    shutil.rmtree(cmp1.cfg.state_dir)
    proc = cli("agent", "--once", *args)

    assert proc.returncode == 0, proc.stderr
    assert processes_of(cmp1.cfg.state_dir) == running, proc.stderr  # none stopped, none restarted
    assert "adopted node-exporter" in proc.stderr and "adopted compute-agent" in proc.stderr, proc.stderr
    assert "stopped" not in proc.stderr, proc.stderr


def test_a_node_that_cannot_prove_its_trust_root_after_state_loss_stops_nothing(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey, tmp_path: Path
) -> None:
    """As above, but the note on the mark names no root (an older agent wrote it): the node
    refuses until the operator gives the root, and meanwhile adopts nothing and stops nothing."""
    new_key = make_key(tmp_path / "k", "merge-2026")
    cmp1 = agents("cmp1", deployment.url)
    args = node_args(cmp1, merge_key)
    assert cli("agent", "--once", *args).returncode == 0
    deployment.write("trust/allowed_signers", f'merge@example.org namespaces="git" {new_key.public}\n')
    deployment.commit("rotate the merge key", key=merge_key)
    assert cli("agent", "--once", *args).returncode == 0
    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    change = deployment.commit("compute-agent: kvm, under the new key", key=new_key)
    assert cli("agent", "--once", *args).returncode == 0
    running = processes_of(cmp1.cfg.state_dir)
    body = {k: v for k, v in (deployment.note("cmp1", change) or {}).items() if k not in ("root", "sig")}
    sealed = NoteKey.load(cmp1.cfg.note_key or Path()).seal("cmp1", change, body)
    git("--git-dir", str(deployment.bare), "-c", "user.name=cmp1", "-c", "user.email=cmp1@example.org", "notes",
        "--ref=reconciler/cmp1", "add", "-f", "-m", json.dumps(sealed, indent=2), change)

    shutil.rmtree(cmp1.cfg.state_dir)
    proc = cli("agent", "--once", *args)

    assert proc.returncode == 2 and proc.stderr.strip().endswith("[ROOT_UNPROVEN]"), proc.stderr
    assert processes_of(cmp1.cfg.state_dir) == running, proc.stderr
    assert "stopped" not in proc.stderr and "adopted" not in proc.stderr, proc.stderr


def test_a_refused_rewind_after_state_loss_leaves_the_applied_note_as_it_was(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey
) -> None:
    cmp2 = agents("cmp2", deployment.url)
    args = node_args(cmp2, merge_key)
    c1 = git("rev-parse", "HEAD", cwd=deployment.work)
    assert cli("agent", "--once", *args).returncode == 0
    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    c2 = deployment.commit("kvm")
    assert cli("agent", "--once", *args).returncode == 0
    applied = deployment.note("cmp2", c1)
    assert (applied or {}).get("state") == "applied"

    deployment.push(c1, force=True)  # main points back at C1
    from reconciler.node.context import drivers_for

    for driver in drivers_for(cmp2.cfg, None).values():  # the disk replaced: nothing runs, nothing is known
        for o in driver.observe():
            driver.remove(o.name)
    shutil.rmtree(cmp2.cfg.state_dir)
    proc = cli("agent", "--once", *args)

    assert proc.returncode == 2 and proc.stderr.strip().endswith("[NOT_DESCENDANT]"), proc.stderr
    assert deployment.note("cmp2", c1) == applied  # its verdict moves only as the table allows
    after = deployment.note("cmp2", c2) or {}
    assert after.get("state") == "applied"
    assert f"refused head {c1[:12]}: NOT_DESCENDANT" in events(after)  # visible, on the node's head
    shown = status(cmp2, merge_key)
    assert shown["head"] == c2 and shown["verdict"] == "applied"
    assert (shown["last_run"] or {}).get("state") == "refused" and shown["last_run"]["commit"] == c1

    # The next poll refuses again, and writes nothing new.
    again = cli("agent", "--once", *args)
    assert again.returncode == 2
    assert deployment.note("cmp2", c1) == applied and deployment.note("cmp2", c2) == after


def test_a_node_that_lost_its_state_dir_and_the_note_key_in_it_still_keeps_its_services(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey
) -> None:
    # no note_key setting: the key the node made lives in the state dir and goes with it, so
    # its notes on the remote prove nothing any more (it starts as a new node)
    cmp1 = agents("cmp1", deployment.url, note_key=None)
    args = node_args(cmp1, merge_key)
    assert "--note-key" not in args
    assert cli("agent", "--once", *args).returncode == 0
    assert (cmp1.cfg.state_dir / "note_key").is_file()
    running = processes_of(cmp1.cfg.state_dir)

    shutil.rmtree(cmp1.cfg.state_dir)
    proc = cli("agent", "--once", *args, "-o", "json")

    assert proc.returncode == 0, proc.stderr
    assert "not signed by its note key" in proc.stderr, proc.stderr  # said: no mark recovered
    assert processes_of(cmp1.cfg.state_dir) == running  # adopted all the same, not started twice
    out = json.loads(proc.stdout)
    assert {n: s["action"] for n, s in out["report"]["services"].items()} == \
        {"compute-agent": "none", "node-exporter": "none"}
