"""The project as a user gets it: the package `reconciler-gitops` (PyPI's `reconciler` is another
project) built into a wheel and an sdist with complete metadata, `twine check` clean, installed
by that name from a package index (a PEP 503 directory served on loopback) into a fresh venv,
and the pipelines in contrib/ run as their runners would: the GitHub Action's steps and the
Zuul job's playbook (ansible-playbook with Zuul's variables) install it and post a review to a
recording forge; actionlint checks the workflows."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT, Deployment, git
from ports import free_port, wait_listening
from test_reviewpost import PASSWORD, TOKEN, Forge, change, forge  # noqa: F401 (forge: the fixture)

pytestmark = pytest.mark.xdist_group("package")  # one worker builds the wheel and serves the index
BIN = Path(sys.executable).parent
ACTION = ROOT / "contrib/github/action.yml"
ROLLOUT = ROOT / "contrib/github/rollout.yml"
PLAYBOOK = ROOT / "contrib/gerrit/playbooks/reconciler-review.yaml"


@dataclass(frozen=True)
class Index:
    url: str  # http://127.0.0.1:PORT/simple/
    wheel: Path
    sdist: Path

    def env(self, **extra: str) -> dict[str, str]:
        """pip sees this index and nothing else: no config file, no PIP_* of the machine's."""
        clean = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
        return {**clean, "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": self.url,
                "PIP_DISABLE_PIP_VERSION_CHECK": "1", **extra}


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def _simple_index(files: Path, root: Path) -> None:
    """root/simple/<project>/index.html linking to each of files' distributions (PEP 503)."""
    projects: dict[str, list[str]] = {}
    for f in sorted(files.iterdir()):
        name = f.name.split("-")[0] if f.suffix == ".whl" else f.name[:f.name.rfind("-")]
        projects.setdefault(_normalized(name), []).append(f.name)
    for project, names in projects.items():
        (root / "simple" / project).mkdir(parents=True)
        links = "".join(f'<a href="../../files/{n}">{n}</a>\n' for n in names)
        (root / "simple" / project / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    links = "".join(f'<a href="{p}/">{p}</a>\n' for p in projects)
    (root / "simple" / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")


@pytest.fixture(scope="session")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Index]:
    """The wheel and sdist built from a copy of the project (no build/ left in the tree), the
    dependencies' wheels downloaded beside them once a session, all served as a simple index."""
    top = tmp_path_factory.mktemp("package")
    src = top / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "reconciler", src / "reconciler", ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run([sys.executable, "-m", "build", "--outdir", str(top / "files"), str(src)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    wheel, = (top / "files").glob("*.whl")
    sdist, = (top / "files").glob("*.tar.gz")
    got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--dest", str(top / "files"), str(wheel)],
                         capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-3000:]
    _simple_index(top / "files", top)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(top),
                               str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_listening(port, "the package index", server)
        yield Index(f"http://127.0.0.1:{port}/simple/", wheel, sdist)
    finally:
        server.terminate()
        server.wait(timeout=10)


def fresh_venv(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=120)
    return where / "bin"


def test_the_wheel_and_sdist_carry_complete_metadata_under_a_name_of_their_own_and_twine_finds_nothing(
    index: Index,
) -> None:
    with zipfile.ZipFile(index.wheel) as whl:
        meta = whl.read("reconciler_gitops-0.1.0.dist-info/METADATA").decode()
        scripts = whl.read("reconciler_gitops-0.1.0.dist-info/entry_points.txt").decode()
        assert [n for n in whl.namelist() if n.startswith("reconciler/schema/") and n.endswith(".json")]
    fields = [tuple(line.split(": ", 1)) for line in meta.split("\n\n", 1)[0].splitlines() if ": " in line]
    has = {k for k, _ in fields}
    assert ("Name", "reconciler-gitops") in fields and ("Version", "0.1.0") in fields
    assert ("License-Expression", "Apache-2.0") in fields and ("Requires-Python", ">=3.11") in fields
    assert {"Summary", "Author", "Maintainer", "Keywords", "Project-URL", "Classifier", "License-File"} <= has, has
    assert ("Description-Content-Type", "text/markdown") in fields
    assert "reconciler = reconciler.entry:main" in scripts
    checked = subprocess.run([str(BIN / "twine"), "check", "--strict", str(index.wheel), str(index.sdist)],
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0 and checked.stdout.count("PASSED") == 2, checked.stdout + checked.stderr


# ---- the pipelines, run as their runners would ----------------------------------------------

EXPRESSION = re.compile(r"\$\{\{\s*(.+?)\s*\}\}")


def evaluate(text: str, context: dict[str, Any]) -> str:
    """A runner's ${{ a.b.c }}: a path in the contexts; any other expression is this test's gap."""
    def one(m: re.Match[str]) -> str:
        value: Any = context
        for part in m.group(1).split("."):
            assert isinstance(value, dict) and part in value, f"unknown in this test's runner: {m.group(0)}"
            value = value[part]
        return str(value)
    return EXPRESSION.sub(one, text)


def run_steps(steps: list[dict[str, Any]], context: dict[str, Any], cwd: Path, env: dict[str, str]) -> list[str]:
    """Each `run:` step in bash, its env: and expressions filled in; `uses:` steps are the
    runner's (setup-python: the venv's python is first on PATH). Returns what each step printed."""
    out = []
    for step in steps:
        if "run" not in step:
            continue
        step_env = {k: evaluate(str(v), context) for k, v in (step.get("env") or {}).items()}
        proc = subprocess.run(["bash", "-e", "-c", evaluate(step["run"], context)], cwd=cwd, env={**env, **step_env},
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0 or step.get("continue-on-error"), (step.get("name"), proc.stdout, proc.stderr)
        out.append(proc.stdout + proc.stderr)
    return out


def test_the_github_action_installs_the_named_release_validates_diffs_and_posts_its_review(
    index: Index, deployment: Deployment, forge: Forge, tmp_path: Path  # noqa: F811
) -> None:
    base, head = change(deployment)
    venv = fresh_venv(tmp_path / "runner")
    action = yaml.safe_load(ACTION.read_text())
    github = {"event": {"pull_request": {"base": {"sha": base}, "head": {"sha": head}, "number": 7}},
              "token": TOKEN, "api_url": forge.url, "repository": "ops/cloud"}
    defaults = {k: evaluate(str(v.get("default", "")), {"github": github}) for k, v in action["inputs"].items()}
    inputs = {**defaults, "version": "0.1.0"}
    context = {"inputs": inputs, "github": github,
               "steps": {"artifact": {"outputs": {"artifact-url": "https://github.example/artifacts/1"}}}}
    env = index.env(PATH=f"{venv}:{os.environ['PATH']}")
    run_steps(action["runs"]["steps"], context, deployment.work, env)

    assert (venv / "reconciler").exists(), "the install step put the command in the runner's python"
    assert "- **identity** on group controllers (3): **reload**" in (deployment.work / "reconciler-diff.md").read_text()
    assert ("POST", "/repos/ops/cloud/issues/7/comments") in forge.calls()
    assert [(b or {})["context"] for m, p, b, _ in forge.requests if "/statuses/" in p] == [
        "reconciler/validate", "reconciler/controllers", "reconciler/monitoring"]


def test_pip_installs_reconciler_gitops_by_name_from_an_index_as_the_rollout_workflow_does_and_it_runs(
    index: Index, tmp_path: Path
) -> None:
    workflow = yaml.safe_load(ROLLOUT.read_text())
    install = [s for s in workflow["jobs"]["rollout"]["steps"] if "pip install" in s.get("run", "")]
    venv = fresh_venv(tmp_path / "runner")
    run_steps(install, {}, tmp_path, index.env(PATH=f"{venv}:{os.environ['PATH']}"))
    version = subprocess.run([str(venv / "reconciler"), "--version"], capture_output=True, text=True, cwd=tmp_path)
    assert version.stdout.strip() == "reconciler, version 0.1.0", version.stdout + version.stderr
    ok = subprocess.run([str(venv / "reconciler"), "validate", "--repo", str(ROOT / "examples/repo")],
                        capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert ok.returncode == 0 and ok.stdout.startswith("ok: "), ok.stdout + ok.stderr


def test_actionlint_finds_nothing_in_the_workflows_nor_in_a_workflow_using_the_action(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / ".github/workflows").mkdir(parents=True)
    (repo / "contrib/github").mkdir(parents=True)
    shutil.copy(ACTION, repo / "contrib/github/action.yml")
    shutil.copy(ROLLOUT, repo / ".github/workflows/rollout.yml")
    shutil.copy(ROOT / "contrib/github/merge.yml", repo / ".github/workflows/merge.yml")
    (repo / ".github/workflows/review.yml").write_text(
        "on: pull_request\npermissions: {pull-requests: write, statuses: write}\njobs:\n  review:\n"
        "    runs-on: ubuntu-latest\n    steps:\n      - uses: actions/checkout@v5\n        with: {fetch-depth: 0}\n"
        "      - uses: ./contrib/github\n        with: {version: 0.1.0, repo: .}\n")
    git("init", "-q", cwd=repo)
    linted = subprocess.run([str(BIN / "actionlint"), "-shellcheck=", "-pyflakes="], cwd=repo, capture_output=True,
                            text=True, timeout=120)
    assert linted.returncode == 0, linted.stdout + linted.stderr


ZUUL_RETURN = '''
import json, os
from ansible.plugins.action import ActionBase

class ActionModule(ActionBase):
    """Zuul's zuul_return: the data goes to the executor's work root, read after the job."""
    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        path = os.path.join(task_vars["zuul"]["executor"]["work_root"], "results.json")
        with open(path, "w") as f:
            json.dump(self._task.args.get("data", {}), f)
        result["changed"] = True
        return result
'''


def test_ansible_replays_the_zuul_job_it_installs_the_package_and_posts_the_review_on_the_change(
    index: Index, deployment: Deployment, forge: Forge, tmp_path: Path  # noqa: F811
) -> None:
    base, head = change(deployment)
    home, work = tmp_path / "home", tmp_path / "executor"
    src_dir = "src/review.example.org/ops/cloud"
    git("clone", "-q", str(deployment.work), str(home / src_dir), cwd=tmp_path)  # Zuul's prepared checkout
    (work / "plugins").mkdir(parents=True)
    (work / "plugins/zuul_return.py").write_text(ZUUL_RETURN)
    job = yaml.safe_load((ROOT / "contrib/gerrit/zuul.d/jobs.yaml").read_text().replace("!encrypted/pkcs1-oaep", ""))
    job_vars = next(item["job"] for item in job if "job" in item).get("vars", {})
    zuul_vars = {
        **job_vars, "reconciler_version": "0.1.0", "ansible_user_dir": str(home),
        "zuul": {"project": {"src_dir": src_dir, "name": "ops/cloud", "canonical_name": "review.example.org/ops/cloud"},
                 "change": "1234", "patchset": "1", "build": "b5d0a2c1", "pipeline": "check", "job": "reconciler-review",
                 "executor": {"work_root": str(work), "log_root": str(work / "logs"), "src_root": str(work / "src")}},
        "gerrit": {"url": forge.url, "user": "reconciler-bot", "password": PASSWORD},
    }
    (work / "vars.json").write_text(json.dumps(zuul_vars))
    (work / "inventory").write_text(f"worker ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    env = index.env(ANSIBLE_HOME=str(work / "ansible"), ANSIBLE_LOCAL_TEMP=str(work / "tmp"),
                    ANSIBLE_ACTION_PLUGINS=str(work / "plugins"), ANSIBLE_NOCOLOR="1", ANSIBLE_RETRY_FILES_ENABLED="0",
                    PATH=f"{BIN}:{os.environ['PATH']}")
    played = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(work / "inventory"), "-e", f"@{work / 'vars.json'}",
                             str(PLAYBOOK)], cwd=home, env=env, capture_output=True, text=True, timeout=300)  # a job's cwd
    assert played.returncode == 0, played.stdout[-4000:] + played.stderr[-2000:]

    shown = subprocess.run([str(home / "reconciler-venv/bin/pip"), "show", "reconciler-gitops"], capture_output=True,
                           text=True, env=index.env())
    assert "Version: 0.1.0" in shown.stdout, shown.stdout + shown.stderr
    review = [b for m, p, b, _ in forge.requests if p.startswith("/a/changes/1234/revisions/1/review")]
    assert review and "identity" in json.dumps(review), forge.calls()
    assert "identity" in (home / "zuul-output/logs/reconciler-diff.md").read_text()
    assert json.loads((work / "results.json").read_text())["zuul"]["artifacts"][0]["url"] == "reconciler-diff.md"
    assert PASSWORD not in played.stdout + played.stderr
