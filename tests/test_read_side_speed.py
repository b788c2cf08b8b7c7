"""The read side made faster without changing what it reads (issue 40): each node's render is
the same bytes whether its service's compiled templates and its group's inputs are shared with
other nodes or made for it alone, and the same as the code before the change rendered them
(digests saved in tests/data/read_side_speed.json); ``status --fleet``'s note checks still judge
every note, one by one, in a fleet where every node has a key of its own."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pygit2
import pytest

from reconciler.core.model import Desired
from reconciler.fleet import view
from reconciler.render import environment
from reconciler.render import node as render_node_module
from reconciler.render.node import render_node
from reconciler.repo.load import load_repo
from reconciler.repo.tree import DirTree
from reconciler.trust.notesig import NoteKey, NoteTrust, parse_nodes, public_line

SAVED = Path(__file__).parent / "data" / "read_side_speed.json"

TEMPLATE = """\
[DEFAULT]
host = {{ node }}
region = {{ region }}
debug = {{ debug }}
{% if extra is defined %}extra = {{ extra }}
{% endif %}
[api]
port = {{ port_base + @I@ }}
workers = {{ workers }}
bind = {{ hostvars[node].addr }}
{% include "part.j2" %}
[peers]
members = {{ groups[role] | join(",") }}
addresses = {% for peer in groups[role] | sort %}{{ hostvars[peer].addr }}{{ "," if not loop.last }}{% endfor %}

{% from "macros.j2" import kv %}{{ kv("limits", limits) }}
"""
PART = "name = {{ name | default('svc') }}-{{ node | upper }}\n"
MACROS = '{% macro kv(title, d) %}[{{ title }}]\n{% for k in d | sort %}{{ k }} = {{ d[k] }}\n{% endfor %}{% endmacro %}'
SERVICE = """\
runtime: {command: [svc%(i)d, --config, svc.conf, --name, "{{ node }}"], env: {REGION: "{{ region }}", FIXED: plain}}
files:
  - {path: svc.conf, template: svc.conf.j2}
  - {path: static.txt, source: static.txt}
defaults: {name: svc%(i)d, limits: {open_files: %(files)d, procs: 64}}
health: {http: "http://127.0.0.1:{{ port_base + %(i)d }}/healthz"}
on_change:
  - {file: svc.conf, keys: [DEFAULT.debug], action: reload}
"""
ANSIBLE_PART = "tls = {{ tls | bool | ternary('on', 'off') }}\n"


def fleet(root: Path, dialect: str, variables: str, nodes: int = 12, services: int = 5) -> Path:
    """A varied fleet: three groups (one node in two of them), service defaults under group and
    node variables, peers read through groups and hostvars, an include and a macro import, a
    static file, variables in the command, env and health check; with templated variables, values
    that are templates themselves (a chain of two, a peer's read through hostvars)."""
    roles = ["control", "compute", "storage"]
    templated = variables == "templated"
    inv = [f"vars: {{debug: false, region: RegionOne, workers: 4, tls: 'yes', "
           f"extra: {json.dumps('{{ region }}-{{ workers }}' if templated else 'x')}}}", "groups:"]
    for i, r in enumerate(roles):
        names = [f"svc{j}" for j in range(services) if (j + i) % 3 != 2]
        more = ", workers: 8" if r == "control" else ""
        inv.append(f"  {r}: {{services: [{', '.join(names)}], vars: {{role: {r}{more}}}}}")
    inv.append("nodes:")
    for n in range(nodes):
        groups = [roles[n % 3]] + (["storage"] if n == 1 else [])
        addr = f"'{{{{ subnet }}}}.{n + 10}'" if templated else f"10.0.0.{n + 10}"
        more = f", limits: {{open_files: {n * 7}, procs: 8}}" if n % 4 == 0 else ""
        inv.append(f"  node{n:02d}: {{groups: [{', '.join(groups)}], vars: {{port_base: {10000 + n * 100}, "
                   f"addr: {addr}, subnet: 10.0.0{more}}}}}")
    files = {"reconciler.yaml": f"format: 1\nname: fleet\ntemplates: {{dialect: {dialect}, variables: {variables}}}\n",
             "inventory.yaml": "\n".join(inv) + "\n"}
    for i in range(services):
        base = f"services/svc{i}"
        files[f"{base}/service.yaml"] = SERVICE % {"i": i, "files": 1024 * (i + 1)}
        files[f"{base}/templates/svc.conf.j2"] = TEMPLATE.replace("@I@", str(i))
        files[f"{base}/templates/part.j2"] = PART + (ANSIBLE_PART if dialect == "ansible" else "")
        files[f"{base}/templates/macros.j2"] = MACROS
        files[f"{base}/files/static.txt"] = f"static {i}\n"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


VARIANTS = [("jinja", "literal"), ("jinja", "templated"), ("ansible", "templated")]


def digest(desired: Desired) -> str:
    """Everything a node's slice holds, as one hash: each service's spec and hash, each file's
    path, mode, secrecy and bytes."""
    out: list[Any] = []
    for s in desired.services:
        out.append([s.to_dict(), [[f.path, f.mode, f.secret, f.key.hex(), f.content.hex()] for f in s.files],
                    s.reload.signal, s.reload.command, s.drain, s.undrain, str(s.ceiling), s.manual])
    return hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest()


def forget_compiled() -> None:
    """Every cache a render shares between nodes and services, emptied: the next render
    compiles and computes all it reads for itself."""
    render_node_module._COMPILED_SERVICES._entries.clear()
    render_node_module._stand_in.cache_clear()
    environment._INLINE._entries.clear()
    for cache in environment._COMPILED.values():
        cache.code.clear()


def renders(root: Path, dialect: str, variables: str, alone: bool) -> dict[str, str]:
    repo = load_repo(DirTree(fleet(root, dialect, variables)))
    out = {}
    for node in sorted(repo.nodes):
        if alone:
            forget_compiled()
            repo = load_repo(DirTree(root))  # and nothing kept on the repo's objects either
        out[node] = digest(render_node(repo, node, "c0"))
    return out


@pytest.mark.parametrize(("dialect", "variables"), VARIANTS)
def test_a_node_renders_the_same_alone_or_after_the_fleet(tmp_path: Path, dialect: str, variables: str) -> None:
    together = renders(tmp_path / "shared", dialect, variables, alone=False)
    alone = renders(tmp_path / "alone", dialect, variables, alone=True)
    assert together == alone
    assert len(set(together.values())) == len(together), "every node's slice is its own"


@pytest.mark.parametrize(("dialect", "variables"), VARIANTS)
def test_each_node_renders_what_the_code_before_the_speed_up_rendered(tmp_path: Path, dialect: str,
                                                                        variables: str) -> None:
    saved = json.loads(SAVED.read_text())[f"{dialect}/{variables}"]
    assert renders(tmp_path, dialect, variables, alone=False) == saved


def reviews(root: Path, dialect: str, variables: str) -> dict[str, str]:
    """Each node's diff (files, plan and its hash) for two changes: one line of one service's
    template, and one node's variable and the region every node reads."""
    from reconciler.review.diff import diff_repos

    fleet(root, dialect, variables)
    a = load_repo(DirTree(root))
    tpl = root / "services/svc1/templates/svc.conf.j2"
    tpl.write_text(tpl.read_text().replace("workers = {{ workers }}", "workers = {{ workers * 2 }}"))
    b = load_repo(DirTree(root))
    inv = root / "inventory.yaml"
    inv.write_text(inv.read_text().replace("port_base: 10300", "port_base: 10301").replace("RegionOne", "RegionTwo"))
    c = load_repo(DirTree(root))
    out = {}
    for what, (x, y) in (("one template", (a, b)), ("variables", (b, c))):
        for d in diff_repos(x, "a", y, "b", jobs=1):
            out[f"{what}: {d.node}"] = hashlib.sha256(json.dumps(d.to_dict(), sort_keys=True).encode()).hexdigest()
    return out


@pytest.mark.parametrize(("dialect", "variables"), VARIANTS)
def test_each_node_diffs_as_before_the_speed_up(tmp_path: Path, dialect: str, variables: str) -> None:
    saved = json.loads(SAVED.read_text())[f"diff {dialect}/{variables}"]
    assert reviews(tmp_path, dialect, variables) == saved


def test_every_note_of_a_fleet_of_own_keys_is_judged_on_its_own(tmp_path: Path) -> None:
    """Each node's note verified against its own line of trust/nodes: a note signed by another
    node's key, one whose body was altered after signing, and an unsigned one do not count,
    whatever was accepted before them in the same view; the rest all do."""
    repo = pygit2.init_repository(str(tmp_path / "r.git"), bare=True)
    names = [f"node{i:02d}" for i in range(40)]
    keys = {n: NoteKey.load_or_create(tmp_path / "keys" / n) for n in names}
    sig = pygit2.Signature("t", "t@example.org")
    head = str(repo.create_commit("refs/heads/main", sig, sig, "c", repo.TreeBuilder().write(), []))
    trust = NoteTrust(parse_nodes("".join(public_line(n, k) + "\n" for n, k in keys.items()), "trust/nodes"),
                      origin=head)
    for n in names:
        body = {"format": 1, "node": n, "commit": head, "state": "applied", "time": "2026-11-26T10:00:00Z",
                "services": {}}
        sealed = keys["node00" if n == "node07" else n].seal(n, head, body)  # node07: another node's key
        if n == "node13":
            sealed["state"] = "failed"  # altered once signed
        if n == "node21":
            del sealed["sig"]
        repo.create_note(json.dumps(sealed), sig, sig, head, f"{view.FLEET_PREFIX}{n}", True)
    for _ in range(2):  # cold, then with what the first view kept
        seen = view.fleet_view(repo, trust=trust, at=datetime.now(UTC))
        assert sorted(seen.rejected) == ["node07", "node13", "node21"]
        assert "bad signature" in seen.rejected["node07"][0][1]
        assert "bad signature" in seen.rejected["node13"][0][1]
        assert seen.rejected["node21"][0][1] == "unsigned"
        assert sum(1 for n in names if seen.notes[n]) == len(names) - 3
