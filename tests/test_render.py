"""Rendering: a node's slice from the repo, deterministic, with documented precedence."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLE, Deployment, git

from reconciler.render.node import render_node
from reconciler.repo.load import load_repo
from reconciler.repo.tree import DirTree, open_tree


def test_each_node_gets_its_own_ports_names_and_peers() -> None:
    repo = load_repo(DirTree(EXAMPLE))
    ctl2 = render_node(repo, "ctl2", "x").by_name()
    db_conf = next(f for f in ctl2["db"].files if f.path == "db.conf").content.decode()
    assert "name = db-ctl2\nport = 18206\npeers = 127.0.0.1:18106,127.0.0.1:18306\n" in db_conf
    assert set(render_node(repo, "cmp1", "x").by_name()) == {"compute-agent", "node-exporter"}


def test_variable_precedence_service_defaults_repo_group_node(tmp_path: Path) -> None:
    (tmp_path / "services/s/templates").mkdir(parents=True)
    (tmp_path / "reconciler.yaml").write_text("format: 1\nname: p\n")
    (tmp_path / "inventory.yaml").write_text(
        "vars: {a: repo, b: repo, c: repo, d: repo}\n"
        "groups:\n  g1: {services: [s], vars: {b: g1, c: g1, d: g1}}\n  g2: {vars: {c: g2, d: g2}}\n"
        "nodes:\n  n: {groups: [g1, g2], vars: {d: node}}\n"
    )
    (tmp_path / "services/s/service.yaml").write_text(
        "runtime: {command: [x]}\ndefaults: {a: default, z: default}\n"
        "files: [{path: out, template: t.j2}]\n"
    )
    (tmp_path / "services/s/templates/t.j2").write_text("{{ z }} {{ a }} {{ b }} {{ c }} {{ d }}")
    out = render_node(load_repo(DirTree(tmp_path)), "n", "x").services[0].files[0].content
    assert out == b"default repo g1 g2 node"


def test_same_commit_same_bytes_and_render_out_writes_a_tree(deployment: Deployment, tmp_path: Path) -> None:
    head = git("rev-parse", "HEAD", cwd=deployment.work)
    trees = []
    for i in range(2):
        out = tmp_path / f"out{i}"
        proc = subprocess.run(
            [sys.executable, "-m", "reconciler", "render", "--repo", str(deployment.work), "--rev", head,
             "--all", "--out", str(out)], capture_output=True, text=True,
        )
        assert proc.returncode == 0, proc.stderr
        trees.append(out)
    cmp = filecmp.dircmp(trees[0], trees[1])
    assert sorted(cmp.common_dirs) == ["cmp1", "cmp2", "ctl1", "ctl2", "ctl3"]
    files = sorted(p.relative_to(trees[0]).as_posix() for p in trees[0].rglob("*") if p.is_file())
    assert "ctl1/identity/identity.conf" in files and "cmp2/compute-agent/service.json" in files
    for rel in files:
        assert (trees[0] / rel).read_bytes() == (trees[1] / rel).read_bytes(), rel
    # The rendered tree at the commit equals the one from the work tree it was made from.
    a = render_node(load_repo(open_tree(deployment.work, head)), "ctl3", head)
    b = render_node(load_repo(open_tree(deployment.work, None)), "ctl3", head)
    assert a == b


def test_an_unrelated_change_keeps_other_services_hashes(deployment: Deployment) -> None:
    before = render_node(load_repo(DirTree(deployment.work)), "ctl1", "x").by_name()
    deployment.edit("services/lb/templates/lb.json.j2", '"timeout": 2.0', '"timeout": 3.0')
    after = render_node(load_repo(DirTree(deployment.work)), "ctl1", "x").by_name()
    changed = sorted(n for n in before if before[n].hash != after[n].hash)
    assert changed == ["lb"]


def test_render_out_writes_without_an_fsync_per_file_and_the_agents_writes_keep_theirs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A review render is output a person reads and can make again: no fsync (issue 17: 17.4 s
    against 1.8 s for 1000 nodes). The node's own files (``atomic_write``'s default) still fsync."""
    import os

    from click.testing import CliRunner

    from reconciler.cli import cli
    from reconciler.core import atomic

    synced: list[int] = []
    real = os.fsync

    def counting(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr("reconciler.core.atomic.os.fsync", counting)
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["render", "--repo", str(EXAMPLE), "--all", "--out", str(out)])
    assert result.exit_code == 0, result.output
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert "ctl1/identity/identity.conf" in written and "cmp2/compute-agent/service.json" in written
    assert synced == []
    # Same bytes as the slices themselves, and no temp file left behind.
    repo = load_repo(DirTree(EXAMPLE))
    for node in repo.nodes:
        for s in render_node(repo, node, "x").services:
            for f in s.files:
                assert (out / node / s.name / f.path).read_bytes() == f.content
    assert not [p for p in out.rglob("*") if p.name.startswith(atomic.TEMP_PREFIX)]
    atomic.atomic_write(tmp_path / "state-file", b"x")
    assert len(synced) == 2  # the file and its directory


def test_render_out_writes_a_host_service_s_absolute_paths_under_out(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from reconciler.cli import cli

    repo = tmp_path / "repo"
    files = {"reconciler.yaml": "format: 1\nname: hosts\n",
             "inventory.yaml": "groups:\n  hv: {services: [host]}\nnodes:\n  hv1: {groups: [hv]}\n",
             "services/host/service.yaml": f"driver: host\nfiles:\n  - {{path: {tmp_path}/etc/sysctl.conf, "
                                           "template: s.j2}\n",
             "services/host/templates/s.j2": "vm.swappiness = 10\n"}
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["render", "--repo", str(repo), "--all", "--out", str(out)])
    assert result.exit_code == 0, result.output
    # The path the node writes, as a reviewer's root running this would have overwritten it.
    assert not (tmp_path / "etc").exists()
    assert (out / "hv1" / "host" / str(tmp_path).lstrip("/") / "etc/sysctl.conf").read_text() == "vm.swappiness = 10\n"
