"""A deployment repo is read only through regular files: a symlink anywhere the loader reads is
a located error (exit 2), in a work tree and in a commit, and its target never reaches output.

The bug this pins: `render --repo .` followed `files/app.py -> /etc/passwd` and printed the
machine's passwd into the output a review bot posts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import git

from reconciler.core.errors import RenderError
from reconciler.render.node import render_node
from reconciler.repo.load import load_repo
from reconciler.repo.tree import DirTree

SMALL = {
    "reconciler.yaml": "format: 1\nname: small\n",
    "inventory.yaml": "groups:\n  web:\n    services: [api]\nnodes:\n  n1:\n    groups: [web]\n",
    "services/api/service.yaml": (
        "runtime:\n  command: [python3, app.py]\n"
        "files:\n  - path: api.conf\n    template: api.conf.j2\n  - path: app.py\n    source: app.py\n"
    ),
    "services/api/templates/api.conf.j2": "port = 1\n",
    "services/api/files/app.py": "print('hello')\n",
}
PASSWD_LINE = Path("/etc/passwd").read_text().splitlines()[0]


def make(tmp_path: Path, changes: dict[str, str] | None = None) -> Path:
    repo = tmp_path / "repo"
    for rel, text in {**SMALL, **(changes or {})}.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    return repo


def link(repo: Path, rel: str, target: str) -> None:
    path = repo / rel
    if path.is_dir():
        os.rename(path, path.with_name(path.name + ".real"))
    else:
        path.unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reconciler", *args], capture_output=True, text=True, timeout=60)


def test_a_work_tree_source_linked_to_etc_passwd_is_refused_and_never_printed(tmp_path: Path) -> None:
    repo = make(tmp_path)
    link(repo, "services/api/files/app.py", "/etc/passwd")

    rendered = cli("render", "--repo", str(repo), "--all", "-o", "json")
    assert rendered.returncode == 2
    assert rendered.stderr.strip() == ("error: services/api/files/app.py: a symlink (to '/etc/passwd'): "
                                       "not allowed in a deployment repo [REPO_SYMLINK]")
    assert PASSWD_LINE not in rendered.stdout

    validated = cli("validate", "--repo", str(repo))
    assert validated.returncode == 2
    assert validated.stderr.splitlines() == [
        "services/api/files/app.py: a symlink (to '/etc/passwd'): not allowed in a deployment repo"]


@pytest.mark.parametrize(("rel", "target"), [
    ("reconciler.yaml", "{outside}/reconciler.yaml"),
    ("inventory.yaml", "{outside}/inventory.yaml"),
    ("services/api/templates/api.conf.j2", "{outside}/api.conf.j2"),
    ("services/api/templates/helpers.j2", "/etc/passwd"),  # no file names it: read for {% include %}
    ("services/api", "{outside}/api"),
    ("services/api/templates", "../../../outside/api/templates"),
    ("services", "{outside}/services"),
])
def test_a_symlink_anywhere_the_loader_reads_names_itself(tmp_path: Path, rel: str, target: str) -> None:
    outside = make(tmp_path / "elsewhere").rename(tmp_path / "outside")  # a valid repo to point into
    repo = make(tmp_path)
    target = target.format(outside=outside)
    link(repo, rel, target)

    proc = cli("validate", "--repo", str(repo))

    assert proc.returncode == 2, proc.stdout
    assert proc.stderr.splitlines() == [f"{rel}: a symlink (to {target!r}): not allowed in a deployment repo"]


def test_a_committed_symlink_is_refused_at_that_commit(tmp_path: Path) -> None:
    repo = make(tmp_path)
    link(repo, "services/api/files/app.py", "/etc/passwd")
    link(repo, "services/api/templates", "../../shared")
    (repo / "shared").mkdir()
    (repo / "shared/api.conf.j2").write_text("port = 1\n")
    git("init", "-q", "-b", "main", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "links", cwd=repo)
    # The commit is what a node reads: make the work tree innocent so only the commit can fail.
    for rel in ("services/api/files/app.py", "services/api/templates"):
        (repo / rel).unlink()
    (repo / "services/api/files/app.py").write_text("print('hello')\n")
    (repo / "services/api/templates").mkdir()
    (repo / "services/api/templates/api.conf.j2").write_text("port = 1\n")
    assert cli("validate", "--repo", str(repo)).returncode == 0

    rendered = cli("render", "--repo", str(repo), "--rev", "HEAD", "--all", "-o", "json")
    assert rendered.returncode == 2
    assert "services/api/files/app.py: a symlink (to '/etc/passwd')" in rendered.stderr
    # Under -o json stdout is the error object (it names the link and where it points); the
    # machine's passwd itself never reaches the output.
    assert PASSWD_LINE not in rendered.stdout
    assert json.loads(rendered.stdout)["error"]["reason"] == "REPO_SYMLINK"

    validated = cli("validate", "--repo", str(repo), "--rev", "HEAD")
    assert validated.returncode == 2
    assert validated.stderr.splitlines() == [
        "services/api/files/app.py: a symlink (to '/etc/passwd'): not allowed in a deployment repo",
        "services/api/templates: a symlink (to '../../shared'): not allowed in a deployment repo",
    ]


@pytest.mark.parametrize("statement", [
    "{% include '../files/app.py' %}",
    "{% include '../../../inventory.yaml' %}",
    "{% include '/etc/passwd' %}",
    "{% import '../../../reconciler.yaml' as settings %}",
    "{% from '/etc/passwd' import root %}",
    "{% extends '../service.yaml' %}",
])
def test_includes_stay_inside_the_services_templates(tmp_path: Path, statement: str) -> None:
    repo = make(tmp_path, {"services/api/templates/api.conf.j2": f"a = 1\n{statement}\n"})
    with pytest.raises(RenderError) as info:
        render_node(load_repo(DirTree(repo)), "n1", "x")
    name = statement.split("'")[1]
    assert str(info.value) == (f"services/api/templates/api.conf.j2:2: node n1, service api: template not found: "
                               f"{name} (outside services/api/templates/)")


def test_templates_include_and_import_their_neighbours(tmp_path: Path) -> None:
    repo = make(tmp_path, {
        "services/api/templates/api.conf.j2": "{% import 'lib/macros.j2' as m %}{% include 'head.j2' %}{{ m.kv('port', 1) }}",
        "services/api/templates/head.j2": "# {{ node }}\n",
        "services/api/templates/lib/macros.j2": "{% macro kv(k, v) %}{{ k }} = {{ v }}\n{% endmacro %}",
    })
    files = render_node(load_repo(DirTree(repo)), "n1", "x").services[0].files
    assert files[0].content == b"# n1\nport = 1\n"
