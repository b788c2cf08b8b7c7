"""contrib/'s pipeline files: every YAML file parses, every `reconciler` command line in them
names a command and options that the CLI has, and each installs the project itself. The
pipelines are run as their runners would in tests/test_package.py."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from click.testing import CliRunner

from reconciler.cli import cli

CONTRIB = Path(__file__).resolve().parent.parent / "contrib"
FILES = sorted([*CONTRIB.glob("github/*.yml"), *CONTRIB.glob("gerrit/**/*.yaml"), CONTRIB / "gerrit/review.sh",
                CONTRIB / "gerrit/merge.sh"])


class AnyTag(yaml.SafeLoader):
    """Zuul's !encrypted/... tags are data to Zuul, not to us."""


AnyTag.add_multi_constructor("!", lambda loader, suffix, node: None)


def test_every_yaml_file_parses() -> None:
    yamls = [f for f in FILES if f.suffix in (".yml", ".yaml")]
    assert len(yamls) == 5
    for f in yamls:
        assert yaml.load(f.read_text(), Loader=AnyTag), f


def test_every_reconciler_command_line_uses_commands_and_options_that_exist() -> None:
    seen = set()
    for f in FILES:
        text = re.sub(r"\\\n\s*|>\n\s*|\n\s{8,}", " ", f.read_text())  # folded and continued lines as one
        for cmd, rest in re.findall(r"reconciler (validate|diff|status|history|review-post|merge)\b([^\n]*)", text):
            usage = CliRunner().invoke(cli, [cmd, "--help"]).output
            for option in re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", rest):
                assert re.search(rf"{re.escape(option)}(?![\w-])", usage), (f.name, cmd, option)
            seen.add(cmd)
    assert seen == {"validate", "diff", "status", "review-post", "merge"}


def test_every_pipeline_installs_the_project_itself_never_pypis_unrelated_reconciler() -> None:
    """PyPI's "reconciler" reconciles DataFrames and has no command: a pipeline that installs it
    fails at `reconciler validate` with "command not found"."""
    action, rollout, merge = (yaml.safe_load((CONTRIB / "github" / f).read_text())
                              for f in ("action.yml", "rollout.yml", "merge.yml"))
    steps = [*action["runs"]["steps"], *rollout["jobs"]["rollout"]["steps"], *merge["jobs"]["merge"]["steps"]]
    installs = [s["run"] for s in steps if "pip install" in s.get("run", "")]
    playbook = yaml.safe_load((CONTRIB / "gerrit/playbooks/reconciler-review.yaml").read_text())
    installs += [t["ansible.builtin.pip"]["name"] for t in playbook[0]["tasks"] if "ansible.builtin.pip" in t]
    job = next(i["job"] for i in yaml.load((CONTRIB / "gerrit/zuul.d/jobs.yaml").read_text(), Loader=AnyTag) if "job" in i)
    assert len(installs) == 4 and all("reconciler-gitops" in line for line in installs), installs
    assert job["vars"]["reconciler_package"] == "reconciler-gitops"
