"""Resource limits: a hostile or careless commit fails fast with a located error, in bounded memory.

Every pathological input here once ran `reconciler validate` for minutes and many GB. Subprocesses
run under a 1.5 GB address-space limit, so a regression fails here instead of swapping the machine.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jinja2
import pytest
from conftest import SigningKey, git, small_deployment

from reconciler.agent import Agent
from reconciler.core.errors import BadInput, RenderLimit, RepoLimit, YamlLimit
from reconciler.core.limits import Limits
from reconciler.core.yamlfile import RepoProblems, load_yaml
from reconciler.render.node import render_node
from reconciler.render.sandbox import Sandbox
from reconciler.repo.load import load_repo
from reconciler.repo.tree import DirTree

ONE_NODE = {
    "reconciler.yaml": "format: 1\nname: small\n",
    "inventory.yaml": "groups:\n  web:\n    services: [api]\nnodes:\n  n1:\n    groups: [web]\n",
    "services/api/service.yaml": (
        "runtime:\n  command: [python3, api.py]\n"
        "files:\n  - path: api.conf\n    template: api.conf.j2\n"
    ),
    "services/api/templates/api.conf.j2": "port = 1\n",
}
NESTED_LOOPS = "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}"
SILENT_LOOPS = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"


def billion_laughs() -> str:
    """Nine levels of nine aliases: 9**9 strings once expanded, from a 1 KB file."""
    lines = ["vars:", '  l0: &l0 "lol"']
    for level in range(1, 10):
        lines.append(f"  l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * 9)}]")
    return "\n".join(lines) + "\n" + ONE_NODE["inventory.yaml"]


def make(tmp_path: Path, changes: dict[str, str]) -> Path:
    repo = tmp_path / "repo"
    for rel, text in {**ONE_NODE, **changes}.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    return repo


def commit_all(repo: Path) -> None:
    git("init", "-q", "-b", "main", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "pathological", cwd=repo)


def _bounded_memory() -> None:
    # A limit that does not hold shows as the kernel stopping the command (SIGKILL past the
    # memory, SIGXCPU past the CPU time), never as a wall-clock bound a loaded machine breaks.
    limit = 1536 * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))


CPU_SECONDS = 20  # about 2 s here: a render limit that did not stop the loops would run for hours


def validate(repo: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reconciler", "validate", "--repo", str(repo), *extra],
                          capture_output=True, text=True, timeout=600, preexec_fn=_bounded_memory)


@pytest.mark.parametrize("rev", [None, "HEAD"], ids=["work-tree", "commit"])
def test_nested_loops_that_print_stop_at_the_output_limit(tmp_path: Path, rev: str | None) -> None:
    repo = make(tmp_path, {"services/api/templates/api.conf.j2": "port = 1\n" + NESTED_LOOPS})
    if rev:
        commit_all(repo)

    proc = validate(repo, *(["--rev", rev] if rev else []))

    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        "services/api/templates/api.conf.j2:2: node n1, service api: api.conf is larger than 10 MiB "
        "(render limit)"]


@pytest.mark.parametrize("rev", [None, "HEAD"], ids=["work-tree", "commit"])
def test_a_billion_laughs_inventory_is_refused_before_it_expands(tmp_path: Path, rev: str | None) -> None:
    repo = make(tmp_path, {"inventory.yaml": billion_laughs()})
    if rev:
        commit_all(repo)

    proc = validate(repo, *(["--rev", rev] if rev else []))

    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    # l7 (line 9) is the first list whose expansion passes a million nodes.
    assert proc.stderr.splitlines() == [
        "inventory.yaml:9: YAML expands to more than 1000000 nodes (aliases count at their expanded size)"]


def test_the_render_command_reports_the_reason_code(tmp_path: Path) -> None:
    repo = make(tmp_path, {"services/api/templates/api.conf.j2": NESTED_LOOPS})
    proc = subprocess.run([sys.executable, "-m", "reconciler", "render", "--repo", str(repo), "--all"],
                          capture_output=True, text=True, timeout=600, preexec_fn=_bounded_memory)
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith("[RENDER_LIMIT]"), proc.stderr


def render(tmp_path: Path, template: str, limits: Limits, **changes: str) -> bytes:
    repo = load_repo(DirTree(make(tmp_path, {"services/api/templates/api.conf.j2": template, **changes})), limits)
    return render_node(repo, "n1", "x").services[0].files[0].content


# The bounds below are CPU seconds of this process (time.process_time): what the render limits
# save is CPU, and a loaded machine stretches wall time, not that.
def test_a_loop_that_prints_nothing_stops_at_the_deadline(tmp_path: Path) -> None:
    start = time.process_time()
    with pytest.raises(RenderLimit) as info:
        render(tmp_path, "a\n" + SILENT_LOOPS, Limits(render_seconds=0.5))
    assert time.process_time() - start < 5
    assert str(info.value) == ("services/api/templates/api.conf.j2:2: node n1, service api: rendering took "
                               "longer than 0.5 s (render limit)")


def test_a_file_over_its_limit_and_a_node_over_its_budget(tmp_path: Path) -> None:
    limits = Limits(file_bytes=1000, node_bytes=1500)
    assert render(tmp_path, "{{ 'x' * 1000 }}", limits) == b"x" * 1000
    with pytest.raises(RenderLimit, match=r"api.conf.j2:1: node n1, service api: api.conf is larger than 1000 B"):
        render(tmp_path, "{% for i in range(1001) %}x{% endfor %}", limits)

    two_files = ONE_NODE["services/api/service.yaml"] + "  - path: b.conf\n    template: api.conf.j2\n"
    with pytest.raises(RenderLimit, match=r"node n1, service api: the node's files are larger than 1500 B"):
        render(tmp_path, "{{ 'x' * 800 }}", limits, **{"services/api/service.yaml": two_files})


# Renders the node of the repo given, in a process of its own: its error, then its peak RSS in MiB.
PEAK = """
import resource, sys
from pathlib import Path
from reconciler.core.errors import RenderLimit
from reconciler.render.node import render_node
from reconciler.repo.load import load_repo
from reconciler.repo.tree import DirTree
try:
    render_node(load_repo(DirTree(Path(sys.argv[1]))), "n1", "x")
except RenderLimit as exc:
    print(exc)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def test_a_loop_of_values_each_as_large_as_a_file_stops_at_the_second_holding_two(tmp_path: Path) -> None:
    # Each value is allowed (10 Mi characters, 40 MiB as Python holds them); the file passes its
    # limit at the second. Counted as each is printed, two are held at most, not the 64 (2.5 GiB)
    # a render that took many chunks before counting them would hold.
    repo = make(tmp_path, {"services/api/templates/api.conf.j2":
                           "{% for i in range(64) %}{{ '\\U0001F600' * 10485760 }}{% endfor %}\n"})

    proc = subprocess.run([sys.executable, "-c", PEAK, str(repo)], capture_output=True, text=True, timeout=600,
                          preexec_fn=_bounded_memory, check=True)

    error, peak = proc.stdout.splitlines()
    assert error == ("services/api/templates/api.conf.j2:1: node n1, service api: api.conf is larger than 10 MiB "
                     "(render limit)")
    assert int(peak) < 400, f"{peak} MiB at its peak"


def test_a_file_over_its_limit_in_its_first_few_chunks_names_the_line_that_passed_it(tmp_path: Path) -> None:
    # The line printing when the file passed its limit is the one named, not a later one
    # (a render that took its chunks a batch at a time would have been further on).
    limits = Limits(file_bytes=1000)
    with pytest.raises(RenderLimit) as info:
        render(tmp_path, "a\n{{ 'x' * 600 }}\n{{ 'y' * 600 }}\nz\n", limits)
    assert str(info.value) == ("services/api/templates/api.conf.j2:3: node n1, service api: api.conf is larger "
                               "than 1000 B (render limit)")
    # The limit is met before the error that follows it, as when each chunk is counted.
    with pytest.raises(RenderLimit, match=r"api.conf.j2:1: node n1, service api: api.conf is larger than 1000 B"):
        render(tmp_path, "{% for i in range(2) %}{{ 'x' * 600 }}{% endfor %}\n{{ 1 / 0 }}\n", limits)
    # At its limit exactly, after its first check, a file renders as it is.
    assert render(tmp_path, "{{ 'x' * 600 }}\n{{ 'y' * 399 }}", limits) == b"x" * 600 + b"\n" + b"y" * 399


@pytest.mark.parametrize("template", [
    "{{ 'x' * 10 ** 10 }}",
    "{{ 10 ** (10 ** 10) }}",
    "{{ 'x' | center(10 ** 10) }}",
    "{{ '%01000000000d' % 1 }}",
    "{{ '{:>1000000000}'.format(1) }}",
    "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% else %}x{% endif %}{% endmacro %}{{ f(60) }}",
], ids=["repeat", "power", "center", "percent-width", "format-width", "concat-doubling", "plus-doubling",
        "macro-doubling"])
def test_a_value_that_would_take_gigabytes_is_refused_before_it_is_built(tmp_path: Path, template: str) -> None:
    start = time.process_time()
    with pytest.raises(RenderLimit, match=r"^services/api/templates/api.conf.j2:1: node n1, service api: "):
        render(tmp_path, template, Limits(file_bytes=1 << 14, render_seconds=5))
    assert time.process_time() - start < 8


def test_includes_nest_only_so_deep(tmp_path: Path) -> None:
    with pytest.raises(RenderLimit, match=r"api.conf.j2:1: node n1, service api: includes nest deeper than 3"):
        render(tmp_path, "{% include 'api.conf.j2' %}", Limits(include_depth=3))
    deep = {f"services/api/templates/{i}.j2": f"{{% include '{i + 1}.j2' %}}" for i in range(3)}
    deep["services/api/templates/3.j2"] = "bottom"
    assert render(tmp_path, "{% include '0.j2' %}", Limits(include_depth=4), **deep) == b"bottom"


def test_a_limit_hit_for_one_node_fails_the_others_at_once(tmp_path: Path) -> None:
    inventory = ONE_NODE["inventory.yaml"] + "".join(f"  n{i}:\n    groups: [web]\n" for i in range(2, 6))
    repo = load_repo(DirTree(make(tmp_path, {"inventory.yaml": inventory,
                                             "services/api/templates/api.conf.j2": SILENT_LOOPS})),
                     Limits(render_seconds=0.5))
    start = time.process_time()
    errors = []
    for node in sorted(repo.nodes):
        with pytest.raises(RenderLimit) as info:
            render_node(repo, node, "x")
        errors.append(str(info.value))
    assert time.process_time() - start < 3
    assert errors[1] == ("services/api/templates/api.conf.j2: node n2, service api: not rendered: it passed "
                         "a render limit for node n1")


def test_yaml_limits_count_nodes_as_composed_and_as_expanded(tmp_path: Path) -> None:
    flat = "".join(f"k{i}: {i}\n" for i in range(200))
    with pytest.raises(YamlLimit, match=r"^big.yaml:50: YAML has more than 100 nodes"):
        load_yaml(flat.encode(), "big.yaml", max_nodes=100)
    with pytest.raises(YamlLimit, match=r"^loop.yaml:1: YAML alias refers to its own anchor"):
        load_yaml(b"a: &a [1, *a]\n", "loop.yaml")
    shared = load_yaml(b"base: &b {x: 1}\nfirst: *b\nsecond:\n  <<: *b\n  y: 2\n", "ok.yaml", max_nodes=100)
    assert shared.data["second"] == {"x": 1, "y": 2}
    assert shared.line(("first", "x")) == 2


def test_a_repo_file_over_the_size_limit_is_not_read(tmp_path: Path) -> None:
    repo = make(tmp_path, {"services/api/templates/api.conf.j2": "x" * 2000})
    with pytest.raises(RepoProblems) as info:
        load_repo(DirTree(repo), Limits(file_bytes=1000))
    assert str(info.value) == "services/api/templates/api.conf.j2: larger than 1000 B (repo limit)"
    assert info.value.reason == RepoLimit.reason


@pytest.mark.parametrize(("changes", "reason"), [
    ({"services/api/templates/api.conf.j2": NESTED_LOOPS}, "RENDER_LIMIT"),
    ({"inventory.yaml": billion_laughs()}, "YAML_LIMIT"),
    # Read before anything else, for the commit's trust policy: once a RecursionError in the agent.
    ({"reconciler.yaml": "format: 1\nname: x\ntrust: " + "[" * 3000 + "]" * 3000 + "\n"}, "INVALID_REPO"),
], ids=["nested-loops", "billion-laughs", "deep-nesting"])
def test_the_agent_notes_a_hostile_commit_as_an_error(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent], changes: dict[str, str], reason: str
) -> None:
    runs = {"services/api/service.yaml": ONE_NODE["services/api/service.yaml"] + "  - {path: api.py, source: api.py}\n",
            "services/api/files/api.py": "import time\nwhile True:\n    time.sleep(1)\n"}
    dep = small_deployment(tmp_path, merge_key, {**ONE_NODE, **runs})
    node = agents("n1", dep.url)
    assert node.reconcile_once().exit_code == 0
    for rel, text in changes.items():
        dep.write(rel, text)
    dep.commit("hostile")

    result = node.reconcile_once()

    assert result.exit_code == 2
    note = dep.note("n1")
    assert note is not None and (note["state"], note["reason"]) == ("error", reason), note


@pytest.mark.parametrize("template", [
    "{{ names | join(',') }}", "{{ mixed | join('-') }}", "{{ pair | join }}", "{{ hosts | join(', ', attribute='n') }}",
    "{{ range(3) | join('/') }}", "{{ names | map('upper') | join(' ') }}", "{{ ('a' | safe, 'b') | join('|') }}",
])
def test_join_in_the_sandbox_prints_what_jinjas_join_prints(template: str) -> None:
    # The sandbox joins a list of strings without Jinja's str() per item: same text, all kinds of lists.
    values = {"names": ["n1", "n2", "n3"], "mixed": [1, "z", None, 2.5], "pair": ("p", "q"),
              "hosts": [{"n": "h1"}, {"n": 2}]}
    assert Sandbox().from_string(template).render(values) == jinja2.Environment().from_string(template).render(values)


def test_a_number_too_large_for_python_to_read_is_located(tmp_path: Path) -> None:
    huge = "9" * 5000  # Python refuses int() of more than 4300 digits
    repo = make(tmp_path, {"inventory.yaml": ONE_NODE["inventory.yaml"] + f"vars:\n  token_ttl: {huge}\n"})
    for command in (["validate"], ["render", "--all"]):
        proc = subprocess.run([sys.executable, "-m", "reconciler", *command, "--repo", str(repo)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
    assert proc.stderr.strip() == "error: inventory.yaml:8: number too large [INVALID_REPO]"
    # libyaml's parser for small files, the counting one for large: both say where.
    for max_nodes in (10**6, 100):
        with pytest.raises(BadInput, match=r"^big.yaml:2: number too large$"):
            load_yaml(f"a: 1\nb: [{huge}]\n".encode(), "big.yaml", max_nodes)
    with pytest.raises(BadInput, match=r"^dates.yaml:1: '2026-13-01': month must be in 1..12$"):
        load_yaml(b"born: 2026-13-01\n", "dates.yaml")


def test_a_template_that_prints_a_number_python_will_not_print_is_a_render_limit(tmp_path: Path) -> None:
    with pytest.raises(RenderLimit) as info:
        render(tmp_path, "port = 1\n{{ 10 ** 5000 }}\n", Limits())
    assert str(info.value) == ("services/api/templates/api.conf.j2:2: node n1, service api: a number of more than "
                               "4300 digits (render limit)")
