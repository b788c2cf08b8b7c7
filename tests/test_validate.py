"""Bad input: one clear line naming file and line (or node, service), exit code 2.

Each test starts from a small valid repo and breaks one thing, the way an operator would.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import git

from reconciler.core.errors import BadInput, RenderError, UnknownNode
from reconciler.core.yamlfile import RepoProblems
from reconciler.render.node import render_node
from reconciler.repo.checks import RENDER_NAMES
from reconciler.repo.load import load_repo
from reconciler.repo.tree import DirTree

SMALL = {
    "reconciler.yaml": "format: 1\nname: small\n",
    "inventory.yaml": (
        "vars:\n  greeting: hello\n"
        "groups:\n  web:\n    services: [api]\n"
        "nodes:\n  n1:\n    groups: [web]\n    vars: {port: 1}\n  n2:\n    groups: [web]\n    vars: {port: 2}\n"
    ),
    "services/api/service.yaml": (
        "runtime:\n  command: [python3, api.py]\n"
        "files:\n  - path: api.conf\n    template: api.conf.j2\n"
    ),
    "services/api/templates/api.conf.j2": "greeting = {{ greeting }}\nport = {{ port }}\n",
}


def make(tmp_path: Path, changes: dict[str, str | None] | None = None) -> Path:
    files = dict(SMALL)
    for path, text in (changes or {}).items():
        if text is None:
            files.pop(path, None)
        else:
            files[path] = text
    for rel, text in files.items():
        p = tmp_path / "repo" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path / "repo"


def problem(repo: Path) -> str:
    with pytest.raises(BadInput) as info:
        loaded = load_repo(DirTree(repo))
        for node in loaded.nodes:
            render_node(loaded, node, "test")
    return str(info.value)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reconciler", *args], capture_output=True, text=True)


def test_the_small_repo_is_valid(tmp_path: Path) -> None:
    repo = load_repo(DirTree(make(tmp_path)))
    assert render_node(repo, "n1", "x").services[0].files[0].content == b"greeting = hello\nport = 1\n"


def test_broken_yaml_names_file_and_line(tmp_path: Path) -> None:
    repo = make(tmp_path, {"inventory.yaml": "groups:\n  web:\n    services: [api\nnodes: {}\n"})
    msg = problem(repo)
    assert msg.startswith("inventory.yaml:4: invalid YAML"), msg


def test_duplicate_key_is_an_error_not_a_silent_override(tmp_path: Path) -> None:
    repo = make(tmp_path, {"reconciler.yaml": "format: 1\nname: a\nname: b\n"})
    assert problem(repo).startswith("reconciler.yaml:3: duplicate key 'name' (first at line 2)")


def test_schema_violation_points_at_the_key(tmp_path: Path) -> None:
    repo = make(tmp_path, {"services/api/service.yaml": (
        "runtime:\n  command: [python3, api.py]\n  restrat: always\n"
    )})
    msg = problem(repo)
    assert msg.startswith("services/api/service.yaml:3: runtime: unknown key 'restrat' (did you mean 'restart'?)"), msg


def test_an_unknown_top_level_key_is_found_on_its_own_line(tmp_path: Path) -> None:
    repo = make(tmp_path, {"reconciler.yaml": "format: 1\nname: a\n\n# waves\nrolout: {batch: 1}\n"})
    assert problem(repo).startswith("reconciler.yaml:5: unknown key 'rolout' (did you mean 'rollout'?)")


@pytest.mark.parametrize("url", ["notaurl", "localhost:8080/health", "http:///health", "ftp://h/x",
                                 "http://h:99999/x", "{{ greeting }}/health"])
def test_a_health_url_that_no_check_could_reach_is_refused_where_it_is_written(tmp_path: Path, url: str) -> None:
    repo = make(tmp_path, {"services/api/service.yaml": (
        f"runtime:\n  command: [python3, api.py]\nhealth:\n  http: '{url}'\n"
    )})
    shown = url.replace("{{ greeting }}", "hello")
    assert problem(repo) == (f"services/api/service.yaml:3: node n1: health: http {shown!r} is not an http:// or "
                             "https:// URL with a host")


@pytest.mark.parametrize("url", ["http://127.0.0.1:{{ port }}/health", "https://[::1]:8443/", "http://api/",
                                 "http://api/health\\n"])  # a newline at its end, as a block scalar leaves: urlopen strips it
def test_a_health_url_a_check_can_reach_renders(tmp_path: Path, url: str) -> None:
    repo = load_repo(DirTree(make(tmp_path, {"services/api/service.yaml": (
        f'runtime:\n  command: [python3, api.py]\nhealth:\n  http: "{url}"\n'
    )})))
    rendered = url.replace("{{ port }}", "1").replace("\\n", "\n")
    assert render_node(repo, "n1", "x").services[0].health.target == rendered


@pytest.mark.parametrize("included", [False, True], ids=["the-template", "an-include"])
def test_a_template_that_is_a_directory_says_so(tmp_path: Path, included: bool) -> None:
    base = "services/api/templates"
    if included:
        repo = make(tmp_path, {f"{base}/api.conf.j2": "a = 1\n{% include 'common.j2' %}\n",
                               f"{base}/common.j2/README": "moved\n"})
        assert problem(repo) == f"{base}/api.conf.j2:2: node n1, service api: {base}/common.j2 is a directory, not a file"
    else:
        repo = make(tmp_path, {f"{base}/api.conf.j2": None, f"{base}/api.conf.j2/README": "moved\n"})
        assert problem(repo) == f"services/api/service.yaml:4: template 'api.conf.j2': {base}/api.conf.j2 is a " \
                                "directory, not a file"


def test_validate_reads_the_trust_files_as_a_rotating_node_would(tmp_path: Path) -> None:
    from reconciler.review.diff import validate_tree

    repo = make(tmp_path, {"trust/allowed_signers": "merge@example.org ssh-ed25519 AAAAC3Nza\n",
                           "trust/revoked": "# leaked\n3AA5C34371567BD2\n"})
    _, problems, _, _ = validate_tree(DirTree(repo))
    assert [(p.file, p.line, p.message.split(":")[0]) for p in problems] == [
        ("trust/allowed_signers", 1, "allowed signers"), ("trust/revoked", 2, "revoked keys")]


def test_unknown_service_in_a_group(tmp_path: Path) -> None:
    repo = make(tmp_path, {"inventory.yaml": SMALL["inventory.yaml"].replace("[api]", "[api, keystone]")})
    assert problem(repo) == (
        "inventory.yaml:5: group 'web': unknown service 'keystone' (no services/keystone/service.yaml)"
    )


def test_undefined_template_variable_names_template_line_and_node(tmp_path: Path) -> None:
    repo = make(tmp_path, {"services/api/templates/api.conf.j2": "a = 1\nb = {{ nope }}\n"})
    msg = problem(repo)
    assert msg == "services/api/templates/api.conf.j2:2: node n1: 'nope' is undefined", msg


def test_template_syntax_error(tmp_path: Path) -> None:
    repo = make(tmp_path, {"services/api/templates/api.conf.j2": "a = 1\n\n{% if x %}\n"})
    with pytest.raises(RenderError) as info:
        render_node(load_repo(DirTree(repo)), "n1", "x")
    assert str(info.value).startswith("services/api/templates/api.conf.j2:3: node n1: template syntax error")


def test_templates_are_sandboxed(tmp_path: Path) -> None:
    evil = "{{ greeting.__class__.__mro__[1].__subclasses__() }}\n"
    repo = make(tmp_path, {"services/api/templates/api.conf.j2": evil})
    with pytest.raises(RenderError, match="unsafe template"):
        render_node(load_repo(DirTree(repo)), "n1", "x")


def test_unknown_node(tmp_path: Path) -> None:
    with pytest.raises(UnknownNode, match="node 'n9' is not in the inventory"):
        render_node(load_repo(DirTree(make(tmp_path))), "n9", "x")


def test_dependency_cycle_names_its_members(tmp_path: Path) -> None:
    repo = make(tmp_path, {"services/api/service.yaml": (
        "depends_on: [api]\nruntime:\n  command: [x]\n"
    )})
    assert "dependency cycle: api -> api" in problem(repo)


def test_upgrades_that_wait_on_each_other_are_refused(tmp_path: Path) -> None:
    # Each would hold its first step until the other was upgraded everywhere: neither starts.
    repo = make(tmp_path, {
        "inventory.yaml": SMALL["inventory.yaml"].replace("[api]", "[api, db]"),
        "services/api/service.yaml": SMALL["services/api/service.yaml"] + "upgrade_after: [db]\n",
        "services/db/service.yaml": "runtime:\n  command: [db]\nupgrade_after: [api]\n",
    })
    assert problem(repo) == "services/api/service.yaml:6: upgrade_after cycle: api -> db -> api"


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    repo = make(tmp_path, {"inventory.yaml": SMALL["inventory.yaml"].replace("[api]", "[api, nova]").replace("groups: [web]\n    vars: {port: 2}", "groups: [db]\n    vars: {port: 2}"),
        "services/api/service.yaml": "runtime:\n  command: []\n"})
    with pytest.raises(RepoProblems) as info:
        load_repo(DirTree(repo))
    assert [str(p) for p in info.value.problems] == [
        "inventory.yaml:5: group 'web': unknown service 'nova' (no services/nova/service.yaml)",
        "inventory.yaml:11: node 'n2': unknown group 'db'",
        "services/api/service.yaml:2: runtime/command: [] should be non-empty",
    ]


def test_cli_validate_prints_one_line_per_problem_and_exits_2(tmp_path: Path) -> None:
    repo = make(tmp_path, {"services/api/templates/api.conf.j2": "{{ missing_var }}\n"})
    proc = cli("validate", "--repo", str(repo))
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [  # the same mistake on both nodes: said once (issue 37)
        "services/api/templates/api.conf.j2:1: 'missing_var' is undefined (nodes n1, n2)",
    ]
    assert "Traceback" not in proc.stderr


def test_cli_validate_ok(tmp_path: Path) -> None:
    proc = cli("validate", "--repo", str(make(tmp_path)))
    assert proc.returncode == 0, proc.stderr
    assert "2 nodes, 2 service instances render" in proc.stdout


def test_cli_render_unknown_node_exits_2_with_one_line(tmp_path: Path) -> None:
    proc = cli("render", "--repo", str(make(tmp_path)), "--node", "n9")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "error: inventory.yaml: node 'n9' is not in the inventory (known: n1, n2) [UNKNOWN_NODE]"
    )


def test_agent_config_errors_are_located_and_flags_override(tmp_path: Path) -> None:
    from reconciler.core.errors import ConfigError
    from reconciler.settings import load_config

    cfg_file = tmp_path / "agent.yaml"
    cfg_file.write_text("node: n1\nremote: /srv/cloud.git\ninterval: 30\npoll_every: 5\n")
    with pytest.raises(ConfigError, match=r"agent.yaml:4: unknown setting 'poll_every'"):
        load_config(cfg_file, {})
    cfg_file.write_text("node: n1\nremote: /srv/cloud.git\ninterval: 30\n")
    cfg = load_config(cfg_file, {"interval": 5.0, "node": None})
    assert (cfg.node, cfg.remote, cfg.interval) == ("n1", "file:///srv/cloud.git", 5.0)
    proc = cli("status", "--config", str(cfg_file), "--interval", "x")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    proc = cli("plan", "--state-dir", str(tmp_path / "s"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"error: state dir {tmp_path / 's'} does not exist (is --state-dir right?) [NO_STATE]"  # before no node
    )


def test_only_a_host_service_may_ask_for_a_reboot(tmp_path: Path) -> None:
    repo = make(tmp_path, {"services/api/service.yaml": SMALL["services/api/service.yaml"]
                           + "on_change:\n  - {file: api.conf, action: reboot}\n"})
    assert problem(repo) == ("services/api/service.yaml:1: node n1 runs api with process: only a host service "
                             "(driver: host) can ask for a reboot (and 1 more problem)")


@pytest.mark.parametrize(("setting", "message"), [
    ("interval: fast", "interval: 'fast' is not a number"),
    ("jitter: true", "jitter: True is not a number"),
    ("interval: 0", "interval: 0 must be > 0 and at most 604800"),
    ("jitter: -1", "jitter: -1 must be >= 0 and at most 604800"),
    # A scheduler asked to wait past the end of its clock died in its thread: no more polls.
    ("supervise_interval: 99999999999999999999999999999",
     "supervise_interval: 99999999999999999999999999999 must be > 0 and at most 604800"),
    ("interval: .nan", "interval: nan must be > 0 and at most 604800"),
])
def test_a_number_setting_out_of_range_names_its_line(tmp_path: Path, setting: str, message: str) -> None:
    cfg_file = tmp_path / "agent.yaml"
    cfg_file.write_text(f"node: n1\nremote: /srv/cloud.git\n{setting}\n")
    proc = cli("status", "--config", str(cfg_file))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == f"error: {cfg_file}:3: {message} [BAD_CONFIG]"


@pytest.mark.parametrize(("wave", "message"), [
    ("{name: canary, group: canaries}", "rollout wave 'canary': unknown group 'canaries'"),
    ("{name: canary, nodes: [n9]}", "rollout wave 'canary': 'n9' names no node"),
    ("{name: canary, nodes: [n1], batch: 0}",
     "rollout wave 'canary': batch '0' must be at least 1 node, or a percentage above 0 and at most 100"),
    ("{name: canary, nodes: [n1], batch: '250%'}",
     "rollout wave 'canary': batch '250%' must be at least 1 node, or a percentage above 0 and at most 100"),
])
def test_a_rollout_wave_that_would_be_dropped_or_bent_is_refused(tmp_path: Path, wave: str, message: str) -> None:
    # Before: the wave went without a word (its nodes joined the last one), a batch of 0 became 1.
    repo = make(tmp_path, {"reconciler.yaml": f"format: 1\nname: small\nrollout:\n  waves:\n    - {wave}\n"})
    assert problem(repo) == f"reconciler.yaml:5: {message}"


@pytest.mark.parametrize(("runtime", "extra", "message"), [
    # Written to the node's disk at that path, or by `render --out` outside OUT.
    ("", "  - path: /tmp/elsewhere.conf\n    template: api.conf.j2\n",
     "services/api/service.yaml:6: node n1 runs api with process: file path '/tmp/elsewhere.conf' must be "
     "relative to its config dir (and 1 more problem)"),
    # Accepted before, and the change it meant to reload restarted the service ("no rule").
    ("", "on_change:\n  - {file: api.cnf, action: reload}\n",
     "services/api/service.yaml:7: on_change/0: 'api.cnf' matches no file of this service (api.conf)"),
    # An infinite health timeout waited forever on a service that never came up.
    ("", "health:\n  tcp: 127.0.0.1:1\n  timeout: .inf\n",
     "services/api/service.yaml:8: health/timeout: inf is greater than the maximum of 86400"),
    # Not a name a process can be given in its environment.
    ("  env: {'A B': x}\n", "", "services/api/service.yaml:3: runtime/env: 'A B' does not match "
                               "'^[A-Za-z_][A-Za-z0-9_]*$'"),
], ids=["absolute-path", "on-change-typo", "endless-health-timeout", "env-name"])
def test_a_service_definition_that_would_not_do_what_it_says_is_refused(
        tmp_path: Path, runtime: str, extra: str, message: str) -> None:
    text = SMALL["services/api/service.yaml"].replace("files:", runtime + "files:") + extra
    assert problem(make(tmp_path, {"services/api/service.yaml": text})) == message


def test_render_with_both_node_and_all_says_which_to_give(tmp_path: Path) -> None:
    proc = cli("render", "--repo", str(make(tmp_path)), "--node", "n1", "--all")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: give --node NODE or --all, not both [BAD_INPUT]"


def test_a_variable_named_like_one_the_render_gives_is_refused(tmp_path: Path) -> None:
    # Before: {{ node }} in a template still said the node's name, and the variable was lost.
    from reconciler.render.variables import context

    loaded = load_repo(DirTree(make(tmp_path / "ok")))
    given = context(loaded, "n1", loaded.services["api"])
    # The names the check knows are exactly those the render adds to the variables: a new one
    # that the check missed would be shadowed without a word.
    variables = {"greeting", "port"}
    # ``facts`` is given too, and a node variable of that name is its stand-in (docs/facts.md):
    # it replaces the gathered facts on purpose, so it is no name to refuse.
    assert set(given) - variables - {"facts"} == RENDER_NAMES and given["node"] == "n1"
    repo = make(tmp_path, {"inventory.yaml": SMALL["inventory.yaml"].replace("vars: {port: 1}",
                                                                             "vars: {port: 1, node: web1}")})
    assert problem(repo) == ("inventory.yaml:9: node 'n1': vars: 'node' is a name the render gives every template "
                             "(groups, hostvars, node, pending_release, release, secrets, service, "
                             "service_version): rename the variable")


@pytest.mark.parametrize("rel", ["inventory.yaml", "reconciler.yaml", "services/api/service.yaml",
                                 "services/api/files/api.py"])
def test_a_directory_where_a_file_belongs_is_named_not_a_traceback(tmp_path: Path, rel: str) -> None:
    repo = make(tmp_path, {"services/api/service.yaml": SMALL["services/api/service.yaml"]
                           + "  - path: api.py\n    source: api.py\n",
                           "services/api/files/api.py": "print(1)\n"})
    (repo / rel).unlink()
    (repo / rel).mkdir()  # `mkdir inventory.yaml` by a slip of the shell
    for command in (["validate"], ["render", "--all"]):
        proc = cli(*command, "--repo", str(repo))
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
    assert proc.stderr.strip() == f"error: {rel}: a directory, not a file [INVALID_REPO]"


def test_a_committed_directory_where_a_file_belongs_is_named_too(tmp_path: Path) -> None:
    repo = make(tmp_path)
    (repo / "inventory.yaml").unlink()
    (repo / "inventory.yaml").mkdir()
    (repo / "inventory.yaml/hosts").write_text("n1\n")  # git keeps no empty directory
    git("init", "-q", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "inventory as a folder", cwd=repo)
    proc = cli("validate", "--repo", str(repo), "--rev", "HEAD")
    assert (proc.returncode, proc.stderr.strip()) == (2, "inventory.yaml: a directory, not a file")


def test_a_driver_named_as_a_template_variable_in_a_services_defaults_is_no_driver(tmp_path: Path) -> None:
    repo = make(tmp_path, {"services/api/service.yaml": (
        "defaults: {driver: e1000}\nruntime:\n  command: [python3, api.py]\n"
        "files:\n  - path: api.conf\n    template: api.conf.j2\n"
    )})
    assert load_repo(DirTree(repo)).services["api"].defaults["driver"] == "e1000"


@pytest.mark.parametrize(("path", "text", "where"), [
    ("services/api/service.yaml", "driver:\nruntime:\n  command: [python3, api.py]\n", "services/api/service.yaml:1: driver"),
    ("reconciler.yaml", "format: 1\nname: small\ndefaults:\n  driver:\n", "reconciler.yaml:4: defaults/driver"),
    ("reconciler.yaml", "format: 1\nname: small\ndefaults:\n  driver: dokcer\n", "reconciler.yaml:4: defaults/driver"),
])
def test_a_driver_that_is_no_registered_kind_is_refused_where_it_is_written(
    tmp_path: Path, path: str, text: str, where: str
) -> None:
    msg = problem(make(tmp_path, {path: text}))
    assert msg.startswith(f"{where}: ") and "is not one of ['process', 'docker', 'systemd', 'host']" in msg, msg
