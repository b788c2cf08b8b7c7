"""Node facts (issue 39): a small, stated set the agent gathers, read by templates as ``facts``
(``ansible_facts`` in the Ansible dialect), published signed in the node's note, read back by
review tools, and a change of them is a change the node plans and notes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pygit2
import pytest
from conftest import SigningKey, git, note_key, small_deployment, wait_for

from reconciler.agent import Agent
from reconciler.core.model.facts import Facts
from reconciler.fleet import notes
from reconciler.fleet.notejson import check
from reconciler.fleet.view import fleet_view
from reconciler.node.facts import CHURN, gather
from reconciler.trust.notesig import note_trust

SERVICE = """\
runtime:
  command: [python3, -c, "import time; time.sleep(3600)"]
files:
  - {path: app.conf, template: app.conf.j2}
"""
READS_FACTS = "host = {{ facts.hostname }}\naddress = {{ facts.interfaces.eth9.ipv4 }}\ncpus = {{ facts.cpus }}\n"


def files(template: str, node_vars: str = "{groups: [g]}") -> dict[str, str]:
    return {"reconciler.yaml": "format: 1\nname: facts\n",
            "inventory.yaml": f"groups:\n  g: {{services: [app]}}\nnodes:\n  n1: {node_vars}\n",
            "services/app/service.yaml": SERVICE, "services/app/templates/app.conf.j2": template}


def with_eth9(facts: Facts, address: str) -> Facts:
    """This machine's facts with an interface ``eth9`` at ``address``: a test's own network."""
    return replace(facts, interfaces={**facts.interfaces, "eth9": {"ipv4": (address,), "ipv6": ()}})


def rendered(agent: Agent) -> str:
    """The service's file as it runs it: in its live directory."""
    [conf] = [p for p in agent.cfg.state_dir.rglob("app.conf") if "live" in p.parts]
    return conf.read_text()


def published(bare: Path, node: str) -> Facts | None:
    """``node``'s facts as a reader sees them: its notes decoded (bounded) and their signatures
    checked against ``trust/nodes`` at the head."""
    repo = pygit2.Repository(str(bare))
    head = str(repo.revparse_single("refs/heads/main").id)
    view = fleet_view(repo, "refs/notes/reconciler/", trust=note_trust(repo, head))
    assert not view.rejected, view.rejected
    [note] = [n for n in view.notes[node] if n.commit == head]
    return note.facts


def test_the_facts_gathered_are_this_machines() -> None:
    facts = gather()
    assert facts.hostname == socket.gethostname()
    assert facts.cpus == len(os.sched_getaffinity(0))
    total_kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                     if line.startswith("MemTotal:"))
    assert facts.memory_mb == total_kib // 1024
    release = dict(line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line)
    assert facts.os["id"] == release["ID"].strip('"')
    assert facts.interfaces["lo"]["ipv4"] == ("127.0.0.1/8",)
    assert set(facts.interfaces) == {n for _, n in socket.if_nameindex() if not CHURN.fullmatch(n)}
    if facts.default_ipv4 is not None:  # this machine has a default route: through an interface it lists
        assert facts.default_ipv4.interface in facts.interfaces
    assert Facts.from_dict(json.loads(json.dumps(facts.to_dict()))) == facts  # as a note carries them
    ansible = facts.ansible()
    assert ansible["lo"]["ipv4"]["address"] == "127.0.0.1" and ansible["processor_vcpus"] == facts.cpus


def test_a_template_reads_the_facts_on_the_node_and_its_note_publishes_them_signed(
        tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]) -> None:
    dep = small_deployment(tmp_path, merge_key, files(READS_FACTS))
    agent = agents("n1", dep.url)
    agent.ctx.resolver.gatherer = lambda: with_eth9(gather(), "10.0.0.5/24")
    result = agent.reconcile_once()
    assert result.exit_code == 0 and result.report is not None and result.report.state == "applied", result
    assert rendered(agent) == f"host = {socket.gethostname()}\naddress = 10.0.0.5\ncpus = {len(os.sched_getaffinity(0))}\n"
    facts = published(dep.bare, "n1")
    assert facts is not None and facts.hostname == socket.gethostname()
    assert facts.interfaces["eth9"]["ipv4"] == ("10.0.0.5/24",)


def test_a_changed_fact_is_rendered_planned_and_noted(tmp_path: Path, merge_key: SigningKey,
                                                      agents: Callable[..., Agent]) -> None:
    dep = small_deployment(tmp_path, merge_key, files(READS_FACTS))
    agent = agents("n1", dep.url)
    address = ["10.0.0.5/24"]
    agent.ctx.resolver.gatherer = lambda: with_eth9(gather(), address[0])
    first = agent.reconcile_once()
    assert first.report is not None and first.report.state == "applied"
    assert agent.reconcile_once().report is None  # nothing changed: an idle poll
    address[0] = "10.0.0.6/24"  # the node's address moved (DHCP, an operator)
    moved = agent.reconcile_once()
    assert moved.report is not None and moved.report.state == "applied", moved
    assert "facts changed: eth9 ipv4 10.0.0.5/24 -> 10.0.0.6/24" in moved.report.events
    assert [(r.service, str(r.action)) for r in moved.report.services] == [("app", "restart")]
    assert "address = 10.0.0.6\n" in rendered(agent)
    note = dep.note("n1", first.commit) or {}
    events = note.get("events")
    assert isinstance(events, list) and "facts changed: eth9 ipv4 10.0.0.5/24 -> 10.0.0.6/24" in events
    facts = published(dep.bare, "n1")
    assert facts is not None and facts.interfaces["eth9"]["ipv4"] == ("10.0.0.6/24",)
    assert agent.reconcile_once().report is None  # and then idle again


def test_a_slice_that_reads_no_facts_gathers_none_on_an_idle_poll(tmp_path: Path, merge_key: SigningKey,
                                                                 agents: Callable[..., Agent]) -> None:
    dep = small_deployment(tmp_path, merge_key, files("plain = {{ node }}\n"))
    agent = agents("n1", dep.url)
    gathered: list[int] = []

    def counted() -> Facts:
        gathered.append(1)
        return gather()
    agent.ctx.resolver.gatherer = counted
    assert agent.reconcile_once().report is not None
    assert len(gathered) == 1  # once for the pass that rendered (and its note publishes them)
    assert agent.reconcile_once().report is None
    assert len(gathered) == 1  # the idle poll gathered nothing


def _note(facts: object) -> str:
    return json.dumps({"format": 1, "node": "n1", "commit": "c" * 40, "state": "applied", "time": "t",
                       "services": {}, "facts": facts})


def test_a_hostile_notes_facts_are_refused_by_the_bounded_decoder() -> None:
    good = gather().to_dict()
    assert isinstance(check(_note(good)), dict)
    parsed = notes.Note.parse("n1", "c" * 40, notes.decode(_note(good)) or {})
    assert parsed.facts == gather()
    many: dict[str, object] = {f"if{i}": {"ipv4": [], "ipv6": []} for i in range(10_000)}
    assert "more than 64 KiB" in str(check(_note({**good, "interfaces": many})))
    assert "at most 64 interfaces" in str(check(_note({**good, "interfaces": dict(list(many.items())[:65])})))
    assert "more than 64 KiB" in str(check(_note({**good, "hostname": "x" * 2**20})))
    assert "facts.hostname" in str(check(_note({**good, "hostname": "x" * 300})))
    assert "not an address" in str(check(_note({**good, "interfaces": {"eth0": {"ipv4": ["<script>"]}}})))
    assert "at most 16 addresses" in str(check(_note({**good, "interfaces": {
        "eth0": {"ipv4": [f"10.0.0.{i}/24" for i in range(17)]}}})))


def render_cli(work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reconciler", "render", "--repo", str(work), "--rev", "HEAD",
                           *args], capture_output=True, text=True)


def test_review_renders_with_the_facts_the_node_published_or_says_it_used_stand_ins(
        tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]) -> None:
    dep = small_deployment(tmp_path, merge_key, files(READS_FACTS))
    never_ran = render_cli(dep.work, "--node", "n1")  # no note yet, no stand-in: said, not guessed
    assert never_ran.returncode == 2 and "facts are not known here" in never_ran.stderr, never_ran.stderr
    agent = agents("n1", dep.url)
    agent.ctx.resolver.gatherer = lambda: with_eth9(gather(), "10.0.0.5/24")
    assert agent.reconcile_once().exit_code == 0
    subprocess.run(["git", "fetch", "-q", str(dep.bare), "+refs/notes/*:refs/notes/*"], cwd=dep.work, check=True)
    out = tmp_path / "out"
    done = render_cli(dep.work, "--node", "n1", "--out", str(out))
    assert done.returncode == 0 and "facts:" not in done.stderr, done.stderr  # the node's own
    assert (out / "n1/app/app.conf").read_text().startswith(f"host = {socket.gethostname()}\naddress = 10.0.0.5\n")
    dep.write("inventory.yaml", files("", "{groups: [g], vars: {facts: {hostname: standin, interfaces: "
                                          "{eth9: {ipv4: 192.0.2.9}}, cpus: 1}}}")["inventory.yaml"])
    dep.commit("n1: stand-in facts")
    stood = render_cli(dep.work, "--node", "n1", "--out", str(tmp_path / "out2"))
    assert stood.returncode == 0 and "node n1: facts: the inventory's stand-ins" in stood.stderr, stood.stderr
    assert (tmp_path / "out2/n1/app/app.conf").read_text() == "host = standin\naddress = 192.0.2.9\ncpus = 1\n"


def with_devices(facts: Facts, devices: dict[str, dict[str, tuple[str, ...]]]) -> Facts:
    """This machine's facts with ``devices`` beside its own interfaces: a test's own network."""
    return replace(facts, interfaces={**facts.interfaces, **devices})


def test_a_device_coming_and_going_is_no_change_to_a_slice_that_does_not_read_it(
        tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]) -> None:
    dep = small_deployment(tmp_path, merge_key, files("host = {{ facts.hostname }}\n"))
    agent = agents("n1", dep.url)
    devices: dict[str, dict[str, tuple[str, ...]]] = {}
    agent.ctx.resolver.gatherer = lambda: with_devices(gather(), devices)
    assert agent.reconcile_once().report is not None
    devices["tap0"] = {"ipv4": (), "ipv6": ("fe80::1/64",)}  # a VM booted here: its port's device
    assert agent.reconcile_once().report is None  # the slice read the hostname only: an idle poll
    # The record of an agent from before reads were kept: every fact is compared, once.
    record = agent.ctx.ledger.facts_rendered()
    assert record is not None
    agent.ctx.ledger.set_facts_rendered(*record)
    devices["tap1"] = {"ipv4": (), "ipv6": ("fe80::2/64",)}
    again = agent.reconcile_once()
    assert again.report is not None and "facts changed: tap1 ipv6 (none) -> fe80::2/64" in again.report.events
    del devices["tap0"]  # the VM went away: and now the render's reads are known
    assert agent.reconcile_once().report is None


def test_kolla_address_reads_its_interface_only(tmp_path: Path) -> None:
    # kolla_address reads hostvars[node].ansible_facts[api_interface], through variables that are
    # templates (the Ansible dialect's): the render reads that interface, not every fact.
    from reconciler.core.model.facts import changes
    from reconciler.render.facts import NodeFacts
    from reconciler.render.node import render_node
    from reconciler.repo.tree import open_tree
    from reconciler.review.diff import load_at

    root = tmp_path / "repo"
    for rel, text in {
        "reconciler.yaml": "format: 1\nname: p\ntemplates: {dialect: ansible}\n",
        "inventory.yaml": "vars: {api_interface: eth9, where: \"{{ 'api' | kolla_address }}\"}\n"
                          "groups:\n  g: {services: [s]}\nnodes:\n  n1: {groups: [g]}\n",
        "services/s/service.yaml": "runtime: {command: [x]}\nfiles: [{path: out, template: t.j2}]\n",
        "services/s/templates/t.j2": "bind = {{ where }}\n",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    facts = with_eth9(gather(), "10.0.0.5/24")
    held = NodeFacts(facts)
    desired = render_node(load_at(open_tree(root, None)), "n1", "c" * 40, facts=held)
    assert [f.content for s in desired.services for f in s.files] == [b"bind = 10.0.0.5\n"]
    assert held.read
    vm_booted = with_devices(facts, {"tap0": {"ipv4": ("169.254.0.1/16",), "ipv6": ()}})
    assert changes(facts, replace(vm_booted, fqdn="elsewhere.example.org"), held.reads) == []
    assert changes(facts, with_eth9(facts, "10.0.0.6/24"), held.reads) == ["eth9 ipv4 10.0.0.5/24 -> 10.0.0.6/24"]


def test_an_ipv6_address_that_comes_and_goes_is_not_gathered() -> None:
    from reconciler.node.facts import CHURN, if_inet6

    proc_net_if_inet6 = (  # address ifindex prefix scope flags name
        "00000000000000000000000000000001 01 80 10 80       lo\n"
        "20010db8000000000000000000000001 02 40 00 80     eth0\n"  # static (permanent): kept
        "20010db8000000000211223344556677 02 40 00 00     eth0\n"  # SLAAC, stable: kept
        "20010db800000000a1b2c3d4e5f60718 02 40 00 01     eth0\n"  # temporary (privacy): rotates
        "20010db8000000000000000000000002 02 40 00 20     eth0\n"  # deprecated: on its way out
        "20010db8000000000000000000000003 02 40 00 40     eth0\n"  # tentative: DAD not done
        "20010db8000000000000000000000004 02 40 00 08     eth0\n"  # DAD failed: another host has it
        "fe800000000000000211223344556677 02 40 20 80     eth0\n"
    )
    assert if_inet6(proc_net_if_inet6) == {
        "lo": ["::1/128"], "eth0": ["2001:db8::1/64", "2001:db8::211:2233:4455:6677/64", "fe80::211:2233:4455:6677/64"]}
    # Devices made per VM port, router or docker network are no facts of the node; named ones are.
    assert [n for n in ("tap1a2b3c4d-5e", "qvo1a2b3c4d-5e", "qbr1a2b3c4d-5e", "qr-1a2b3c4d-5e", "veth12ab",
                        "br-0123456789ab", "br-ex", "br-int", "docker0", "tun0", "vxlan_sys_4789", "eth0")
            if not CHURN.fullmatch(n)] == ["br-ex", "br-int", "docker0", "tun0", "vxlan_sys_4789", "eth0"]


def test_a_resolver_that_stops_answering_leaves_the_last_answer_and_one_lookup(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from reconciler.node import facts as node_facts

    host = f"fqdn-test-{os.getpid()}"
    assert node_facts.fqdn(host, lambda h: f"{h}.example.org") == f"{host}.example.org"
    monkeypatch.setattr(node_facts, "FQDN_KEPT", 0.0)  # ten minutes later
    monkeypatch.setattr(node_facts, "FQDN_SECONDS", 0.1)
    answer, asked = threading.Event(), []

    def hung(name: str) -> str:  # an NSS module that does not return
        asked.append(name)
        answer.wait(30)
        return f"{name}.example.net"
    try:
        assert node_facts.fqdn(host, hung) == f"{host}.example.org"  # not the hostname: no change of facts
        assert node_facts.fqdn(host, hung) == f"{host}.example.org"
        assert asked == [host]  # no second lookup beside the one still running
    finally:
        answer.set()
    wait_for(lambda: not any(t.name == "fqdn" for t in threading.enumerate()), what="the lookup to end")
    assert node_facts.fqdn(host, hung) == f"{host}.example.net"  # its late answer kept


def test_a_change_under_review_cannot_vouch_for_a_key_that_gives_a_node_another_nodes_facts(
        tmp_path: Path, merge_key: SigningKey) -> None:
    from reconciler.trust.notesig import NoteKey, public_line

    inventory = "groups:\n  g: {services: [app]}\nnodes:\n  n1: {groups: [g]}\n  n2: {groups: [g]}\n"
    dep = small_deployment(tmp_path, merge_key, {**files("host = {{ facts.hostname }}\n"),
                                                 "inventory.yaml": inventory})
    base = git("rev-parse", "HEAD", cwd=dep.work)
    n1 = NoteKey.load(note_key("n1"))
    # The change under review: a line of the template, and n2 speaking with n1's key.
    dep.write("trust/nodes", f"{public_line('n1', n1)}\n{public_line('n2', n1)}\n")
    dep.write("services/app/templates/app.conf.j2", "host = {{ facts.hostname }}\nport = 1\n")
    head = dep.commit("n2's notes by n1's key", push=False)

    def publish(node: str, signer: str, commit: str, hostname: str, time: str) -> None:
        body = {"format": 1, "node": node, "commit": commit, "state": "applied", "time": time, "services": {},
                "facts": replace(gather(), hostname=hostname).to_dict()}
        sealed = NoteKey.load(note_key(signer)).seal(node, commit, body)
        git("notes", f"--ref=reconciler/{node}", "add", "-f", "-m", json.dumps(sealed), commit, cwd=dep.work)
    publish("n2", "n2", base, "n2-itself", "2026-01-01T00:00:00Z")
    publish("n2", "n1", head, "forged-by-n1", "2026-01-02T00:00:00Z")  # in n2's ref, newer
    done = subprocess.run([sys.executable, "-m", "reconciler", "diff", "--repo", str(dep.work), base, head,
                           "--node", "n2", "-o", "json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "forged-by-n1" not in done.stdout and "host = n2-itself" in done.stdout, done.stdout
