"""What the commands say must be the truth, said once, where the operator looks: a template error
once (not once per node), every mistake of a file at its own line with the name meant, the
option a command really has, a file that is not a directory called so, and ``-o json`` on
``review-post`` as on every other command.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Deployment
from test_reviewpost import Forge, change, forge, post  # noqa: F401  (forge: the fixture, shared)
from test_validate import make

from reconciler.core.errors import ConfigError
from reconciler.settings import load_config


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reconciler", *args], capture_output=True, text=True, timeout=120)


def test_a_template_syntax_error_is_said_once_for_all_the_nodes_it_breaks(tmp_path: Path) -> None:
    repo = make(tmp_path, {"services/api/templates/api.conf.j2": "greeting = {{ greeting }}\n{% if %}\n"})

    done = cli("validate", "--repo", str(repo))

    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("services/api/templates/api.conf.j2:2: template syntax error: ")
    assert lines[0].endswith("(nodes n1, n2)")
    as_json = json.loads(cli("validate", "--repo", str(repo), "-o", "json").stdout)
    assert [(p["file"], p["line"]) for p in as_json["problems"]] == [("services/api/templates/api.conf.j2", 2)]


def test_validate_names_every_unknown_key_on_its_own_line_with_the_name_meant(tmp_path: Path) -> None:
    repo = make(tmp_path, {
        "services/api/service.yaml": ("runtime:\n  comand: [python3, api.py]\n  restrat: always\n"
                                      "files:\n  - path: api.conf\n    template: api.conf.j2\n"),
        "reconciler.yaml": "format: 1\nname: small\nrolout: {}\n",
    })

    done = cli("validate", "--repo", str(repo))

    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "reconciler.yaml:3: unknown key 'rolout' (did you mean 'rollout'?)",
        "services/api/service.yaml:2: runtime: unknown key 'comand' (did you mean 'command'?)",
        "services/api/service.yaml:3: runtime: unknown key 'restrat' (did you mean 'restart'?)",
    ]


AGENT_YAML = """\
node: n1
remote: file:///srv/cloud.git
trust:
  allowed_signer: /etc/reconciler/allowed_signers
metrics:
  listen: "9469"
intervall: 30
"""


def test_every_mistake_of_the_agent_settings_is_named_at_its_line(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(AGENT_YAML)
    with pytest.raises(ConfigError) as caught:
        load_config(config, {})
    assert str(caught.value).splitlines() == [
        f"{config}:4: unknown setting trust.allowed_signer (did you mean 'allowed_signers'?)",
        f"{config}:6: metrics.listen '9469' must be host:port (127.0.0.1:9469)",
        f"{config}:7: unknown setting 'intervall' (did you mean 'interval'?)",
    ]

    done = cli("agent", "--once", "--config", str(config))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith(f"error: {config}:") for line in lines), done.stderr


# Each problem a different check finds, every one of them on its own line: none hides another.
EVERY_KIND_OF_MISTAKE = """\
node: n1
remote: htps://x/y.git
interval: -5
jitter: -3
trust:
  policy: bogus
  require_branch_binding: sometimes
host:
  systemctl: 5
secrets: /etc/reconciler/age.key
metrics:
  listen: "9469"
remotes:
  - url: file:///srv/cloud.git
    role: reed
  - url: https://user:hunter2@/cloud.git
"""


def test_every_check_of_the_agent_settings_says_its_problem_none_hides_another(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(EVERY_KIND_OF_MISTAKE)
    with pytest.raises(ConfigError) as caught:
        load_config(config, {})
    said = [line.removeprefix(f"{config}:") for line in str(caught.value).splitlines()]
    expected = [
        "2: remote: git cannot fetch from 'htps://' URLs",
        "3: interval: -5 must be > 0 and at most 604800",
        "4: jitter: -3 must be >= 0 and at most 604800",
        "6: trust.policy: 'bogus' is not one of every-commit, first-parent, head",
        "7: trust.require_branch_binding must be true or false",
        "9: host.systemctl: 5 must be a command (a string, or a list of strings)",
        "10: secrets: a mapping with age_identity (the node's age key file)",
        "12: metrics.listen '9469' must be host:port (127.0.0.1:9469)",
        "15: remotes[0].role: 'reed' is not one of read, write, both (did you mean 'read'?)",
        "16: remotes[1].url: a https:// URL names no host",
    ]
    assert len(said) == len(expected) and all(s.startswith(e) for s, e in zip(said, expected, strict=True)), said
    assert "hunter2" not in str(caught.value)

    done = cli("agent", "--once", "--config", str(config))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == len(expected), done.stderr


def test_diff_outside_a_git_repo_does_not_ask_for_an_option_it_has_not(tmp_path: Path) -> None:
    done = cli("diff", "--repo", str(tmp_path), "HEAD~1", "HEAD")
    assert done.returncode == 2
    assert "--rev" not in done.stderr and f"{tmp_path}: not a git repository" in done.stderr


def test_a_state_dir_that_is_a_file_is_called_so(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("not a directory\n")
    done = cli("status", "--node", "n1", "--state-dir", str(tmp_path / "state"))
    assert done.returncode == 2
    assert f"{tmp_path / 'state'} is not a directory" in done.stderr and "does not exist" not in done.stderr


def test_review_post_speaks_json_like_every_other_command(deployment: Deployment, forge: Forge) -> None:  # noqa: F811
    base, head = change(deployment)
    done = post(deployment, forge, "github", base, head, "-o", "json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["valid"], result["head"], result["problems"]) == (True, head, [])
    assert result["posted"][0] == "commented on ops/cloud#7"
    assert {g["group"]: g["ok"] for g in result["groups"]} == {"controllers": True, "monitoring": True}

    deployment.write("services/identity/templates/identity.conf.j2", "{% if %}\n")
    broken = deployment.commit("identity: a broken template")
    done = post(deployment, forge, "github", base, broken, "-o", "json")
    assert done.returncode == 1
    result = json.loads(done.stdout)
    assert result["valid"] is False and result["head"] == broken
    assert [p["file"] for p in result["problems"]] == ["services/identity/templates/identity.conf.j2"]

    done = post(deployment, forge, "gerrit", base, head, "-o", "json", "--gerrit-url", "")
    assert done.returncode == 2
    assert json.loads(done.stdout)["error"]["reason"] == "BAD_INPUT"
