"""A parallel control plane on a real Docker engine (Fuel's isolated-controllers upgrade).

Three controllers on release A run db, identity and lb containers on a VIP network, where each
answers to its VIP name (``api``, ``db``, ``identity``: the engine's DNS stands in for the
virtual IP). A fourth controller is added with ``pending_release: B``: it comes up isolated,
off the VIP network, seeing only peers of its own release. A reviewed cutover commit moves the
VIP network from the old plane to the new one live (same containers), a revert moves it back,
and a cutover whose new plane fails its check as it attaches puts the old plane back on and
halts the rest of the fleet.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import pytest
from conftest import Deployment, SigningKey, git, nodes_file, small_deployment

from reconciler.agent import Agent

pytestmark = pytest.mark.usefixtures("docker_cleanup")


def service(name: str, net: str, alias: str, health: str = "") -> str:
    return f"""\
driver: docker
runtime:
  image: "{{{{ image }}}}"
  command: [httpd, -f, -p, "8080", -h, /etc/{name}]
  networks: [{{name: {net}, aliases: [{alias}]}}]
files:
  - {{path: index.html, template: index.html.j2}}
  - {{path: {name}.conf, template: {name}.conf.j2}}
{health}"""


CONF = """\
# {{ service }} on {{ node }}
vip = {{ vip_address }}
release = {{ release }}
pending_release = {{ pending_release }}
members = {% for n in groups.controllers %}{{ hostvars[n].address }}{% if not loop.last %},{% endif %}{% endfor %}
"""


def inventory(prefix: str, image: str, new: str = "") -> str:
    nodes = "".join(f"  {prefix}-ctl{i}:\n    groups: [controllers]\n    vars: {{address: 10.0.0.{i}}}\n"
                    for i in (1, 2, 3))
    return (f"release: A\nvars:\n  image: {image}\n  vip_address: 192.0.2.10\n"
            "groups:\n  controllers:\n    services: [db, identity, lb]\n  computes:\n    services: [nova]\n"
            f"nodes:\n{nodes}  {prefix}-cmp1:\n    groups: [computes]\n    vars: {{address: 10.0.1.1}}\n{new}")


def new_controller(prefix: str, mode: str = "") -> str:
    return (f"  {prefix}-ctl4:\n    groups: [controllers]\n    pending_release: B\n"
            + (f"    mode: {mode}\n" if mode else "") + "    vars: {address: 10.0.0.4}\n")


@pytest.fixture
def cloud(tmp_path: Path, merge_key: SigningKey, busybox_image: str) -> tuple[Deployment, str, str]:
    prefix = f"t-{secrets.token_hex(3)}"
    net = f"{prefix}-vip"
    files = {
        "reconciler.yaml": ("format: 1\nname: cutover\n"
                            f"vip:\n  networks: [{net}]\n"
                            "rollout:\n  waves:\n    - {name: control, group: controllers}\n"
                            "    - {name: compute, group: computes}\n"),
        "inventory.yaml": inventory(prefix, busybox_image),
        # every node's notes key, ctl4 too (it joins later): its notes release the cutover
        "trust/nodes": nodes_file(*(f"{prefix}-{n}" for n in ("ctl1", "ctl2", "ctl3", "ctl4", "cmp1"))),
        "services/db/service.yaml": service("db", net, "db"),
        "services/identity/service.yaml": service("identity", net, "identity"),
        # The lb's check: a backend it cannot reach marks itself broken (its data volume, not config).
        "services/lb/service.yaml": service("lb", net, "api",
                                            "health:\n  command: test ! -e /var/lib/lb/broken\n  timeout: 3\n"),
        "services/nova/service.yaml": ("driver: docker\nruntime:\n  image: \"{{ image }}\"\n"
                                       "  command: [sh, -c, 'while true; do sleep 1; done']\n"
                                       "files:\n  - {path: nova.conf, template: nova.conf.j2}\n"),
        "services/nova/templates/nova.conf.j2": "api = http://{{ vip_address }}:8080\n",
    }
    for name in ("db", "identity", "lb"):
        files[f"services/{name}/templates/index.html.j2"] = f"{name} of release {{{{ pending_release or release }}}} " \
                                                             "on {{ node }}\n"
        files[f"services/{name}/templates/{name}.conf.j2"] = CONF
    dep = small_deployment(tmp_path, merge_key, files, "release A: three controllers")
    return dep, prefix, net


def probe(client: docker.DockerClient, net: str, image: str, name: str = "api") -> set[str]:
    """What answers on the VIP name, asked from a client on the VIP network: every address the
    name resolves to, and the name itself ("none" where nothing answers)."""
    get = 'printf "GET /index.html HTTP/1.0\\r\\n\\r\\n" | nc -w 2'
    script = (f'for a in $(nslookup {name} 127.0.0.11 | awk "/^Address: /{{print \\$2}}" | grep -v :53); do '
              f'{get} $a 8080 | tail -1; done; {get} {name} 8080 | tail -1 | grep . || echo none')
    out = client.containers.run(image, ["sh", "-c", script], network=net, remove=True,
                                labels={"reconciler.node": "t-probe"})
    return set(out.decode().splitlines())


def on_vip(client: docker.DockerClient, node: str, net: str) -> dict[str, bool]:
    found = client.containers.list(all=True, filters={"label": f"reconciler.node={node}"})
    out = {}
    for c in found:
        c.reload()
        out[c.labels["reconciler.service"]] = net in (c.attrs["NetworkSettings"]["Networks"] or {})
    return out


def identities(client: docker.DockerClient, node: str) -> dict[str, tuple[str, str]]:
    """Service -> (container id, started at): the same pair means the container was not restarted."""
    found = client.containers.list(all=True, filters={"label": f"reconciler.node={node}"})
    out = {}
    for c in found:
        c.reload()
        out[c.labels["reconciler.service"]] = (c.id, c.attrs["State"]["StartedAt"])
    return out


def noted(dep: Deployment, node: str, commit: str, key: str) -> Any:
    """A field of the node's note on the commit."""
    note = dep.note(node, commit)
    assert note is not None, f"{node} noted nothing on {commit[:12]}"
    return note.get(key)


def acts(result) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {r.service: str(r.action) for r in result.report.services} if result.report else {}


def test_isolated_new_plane_then_cutover_then_revert(cloud: tuple[Deployment, str, str],
                                                     agents: Callable[..., Agent], docker_engine: docker.DockerClient,
                                                     busybox_image: str, tmp_path: Path) -> None:
    dep, prefix, net = cloud
    old = [f"{prefix}-ctl{i}" for i in (1, 2, 3)]
    new, compute = f"{prefix}-ctl4", f"{prefix}-cmp1"
    node = {n: agents(n, dep.url) for n in [*old, new, compute]}
    for n in [*old, compute]:
        assert node[n].reconcile_once().exit_code == 0
    assert probe(docker_engine, net, busybox_image) <= {f"lb of release A on {n}" for n in old}

    # A new controller, release B: isolated on its own, the old plane untouched.
    dep.write("inventory.yaml", inventory(prefix, busybox_image, new_controller(prefix)))
    added = dep.commit("add ctl4, pending release B")
    for n in old:
        result = node[n].reconcile_once()
        assert result.exit_code == 0 and set(acts(result).values()) == {"none"}, acts(result)
    result = node[new].reconcile_once()
    assert result.exit_code == 0, result.report
    assert set(acts(result).values()) == {"start"}
    assert on_vip(docker_engine, new, net) == {"db": False, "identity": False, "lb": False}
    assert all(on_vip(docker_engine, n, net) == {"db": True, "identity": True, "lb": True} for n in old)
    rendered = "".join(p.read_text() for p in (tmp_path / "nodes" / new / "docker").glob("*/live/*"))
    assert "members = 10.0.0.4\n" in rendered and "vip = 192.0.2.10" in rendered
    assert not any(f"10.0.0.{i}" in rendered for i in (1, 2, 3)), "an old node's address reached the new plane"
    assert noted(dep, new, added, "plane") == {"release": "A", "pending_release": "B", "mode": "isolated",
                                                  "derived": True, "vip": "detached"}
    assert all(line.startswith("lb of release A") for line in probe(docker_engine, net, busybox_image))

    # The cutover: the old plane leaves the VIP network first, then the new one joins; live.
    before = {n: identities(docker_engine, n) for n in [*old, new]}
    dep.write("inventory.yaml", inventory(prefix, busybox_image, new_controller(prefix, "cutover")))
    cut = dep.commit("cut over to release B")
    early = node[new].reconcile_once()
    assert early.waiting.startswith(f"cutover: waiting for {old[0]}, {old[1]}, {old[2]}"), early.waiting
    assert on_vip(docker_engine, new, net) == {"db": False, "identity": False, "lb": False}
    for n in old:
        result = node[n].reconcile_once()
        assert result.exit_code == 0 and set(acts(result).values()) == {"connect"}, acts(result)
        assert on_vip(docker_engine, n, net) == {"db": False, "identity": False, "lb": False}
    assert node[new].reconcile_once().exit_code == 0
    assert on_vip(docker_engine, new, net) == {"db": True, "identity": True, "lb": True}
    assert {n: identities(docker_engine, n) for n in [*old, new]} == before, "a container was restarted"
    assert probe(docker_engine, net, busybox_image) == {f"lb of release B on {new}"}
    assert probe(docker_engine, net, busybox_image, "db") == {f"db of release B on {new}"}
    assert noted(dep, old[0], cut, "plane") == {"release": "A", "mode": "normal", "vip": "detached", "watch": [new]}

    # git revert: the new plane leaves first, then the old one comes back.
    git("revert", "--no-commit", cut, cwd=dep.work)
    dep.commit("revert the cutover", push=True)
    waiting = node[old[0]].reconcile_once()
    assert waiting.waiting.startswith(f"cutover: waiting for {new}"), waiting.waiting
    assert node[new].reconcile_once().exit_code == 0
    assert on_vip(docker_engine, new, net) == {"db": False, "identity": False, "lb": False}
    for n in old:
        assert node[n].reconcile_once().exit_code == 0
        assert on_vip(docker_engine, n, net) == {"db": True, "identity": True, "lb": True}
    assert {n: identities(docker_engine, n) for n in [*old, new]} == before
    assert all(line.startswith("lb of release A") for line in probe(docker_engine, net, busybox_image))
    assert node[compute].reconcile_once().exit_code == 0

    # A cutover whose new lb fails its check once on the VIP network: the new plane leaves it
    # again, the old one comes back on, and the computes (a later wave) halt.
    broke = docker_engine.containers.get(f"rc-{new}-lb").exec_run(["/bin/sh", "-c", "touch /var/lib/lb/broken"])
    assert broke.exit_code == 0, broke
    dep.write("inventory.yaml", inventory(prefix, busybox_image, new_controller(prefix, "cutover")))
    again = dep.commit("cut over to release B, again")
    for n in old:
        assert node[n].reconcile_once().exit_code == 0
    failed = node[new].reconcile_once()
    assert failed.exit_code == 1 and failed.report is not None and failed.report.state == "failed"
    assert on_vip(docker_engine, new, net) == {"db": False, "identity": False, "lb": False}
    assert noted(dep, new, again, "plane")["vip"] == "detached"
    for n in old:
        result = node[n].reconcile_once()
        assert result.exit_code == 0 and set(acts(result).values()) == {"connect"}, acts(result)
        assert on_vip(docker_engine, n, net) == {"db": True, "identity": True, "lb": True}
        assert noted(dep, n, again, "plane") == {"release": "A", "mode": "normal", "vip": "attached", "aborted": True}
        events = noted(dep, n, again, "events")
        assert any(e.startswith(f"cutover aborted: {new} failed") for e in events), events
    assert all(line.startswith("lb of release A") for line in probe(docker_engine, net, busybox_image))
    halted = node[compute].reconcile_once()
    assert halted.exit_code == 1 and halted.report is not None and halted.report.state == "halted"
    # Polled again, the old plane stays on: the abort is remembered, not undone by the next pass.
    for n in old:
        assert node[n].reconcile_once().exit_code == 0
        assert on_vip(docker_engine, n, net)["lb"] is True
