"""A second reading of `diff`'s speed-ups (issue 40): what they keep between calls must not grow
in a node's long-running daemon, and the sandbox's cheaper checks must still refuse what a
hostile template builds with the operators and filters they skip."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

import jinja2
import pytest
from test_diff_speedups import fleet
from test_limits import make, validate

from reconciler.core.compare import decide
from reconciler.core.limits import Limits
from reconciler.core.model import Desired, DesiredService, FileSpec, Observed, ObservedService, Rule, Runtime
from reconciler.core.model.desired import ActionKind
from reconciler.plan.planner import plan
from reconciler.render.sandbox import Budget, Sandbox, budget_in_use
from reconciler.review.diff import diff_repos

COMMIT = "c" * 40


def test_a_node_planning_every_pass_for_months_keeps_no_more_than_one_pass() -> None:
    """The daemon plans each pass against what its drivers observe, new objects every time: a
    service with no files (an image alone) and one whose file changed. What the planner keeps
    for a review's shared stand-ins must not pile up one entry per pass there."""
    conf = FileSpec("api.conf", 0o644, b"[DEFAULT]\nregion = two\n")
    rules = (Rule("api.conf", ActionKind.RELOAD, ("DEFAULT.region",)),)
    desired = Desired("n1", COMMIT, (DesiredService("cache", Runtime("docker", (), image="redis:7"), ()),
                                     DesiredService("api", Runtime("process", ("api",)), (conf,), rules=rules)))
    cache, api = desired.services
    was_api = tuple(sorted({**api.fingerprint(), "file:api.conf": "644:" + "0" * 64}.items()))

    def one_pass() -> None:
        observed = Observed("n1", (
            ObservedService("cache", "docker", True, cache.hash, COMMIT, 7, fingerprint=tuple(cache.fingerprint().items())),
            ObservedService("api", "process", True, "0" * 64, COMMIT, 8, fingerprint=was_api,
                            files=(FileSpec("api.conf", 0o644, b"[DEFAULT]\nregion = one\n"),))))
        kinds = [str(a.kind) for a in plan(desired, observed).actions]
        assert kinds == ["reload", "none"]

    for _ in range(100):
        one_pass()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(1500):
            one_pass()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 32 * 1024, f"{grown} bytes kept after 1500 passes"


# Each would take minutes of CPU or gigabytes before the render limits saw it; run by
# ``validate`` under the kernel's memory and CPU bounds (``test_limits._bounded_memory``).
@pytest.mark.parametrize("template", [
    "{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}{{ ns.x > 1 }}",
    "{{ ([[0] * 10000] * 10000) | sum(start=[]) | length }}",
    "{{ (['x' * 60000] * 60000) | join | length }}",
    "{% set ns = namespace(a=['x' * 30000]) %}{% for i in range(16) %}{% set ns.a = ns.a + ns.a %}{% endfor %}"
    "{{ ns.a | join | length }}",
    "{{ ('x' * 10000).translate({120: 'y' * 10000000}) | length }}",
    "{{ (['x'] * 100000) | map('center', 10000000) | list | length }}",
], ids=["int-squaring", "sum-of-lists", "list-of-big-strings", "list-doubling", "translate", "many-big-strings"])
def test_a_value_built_by_numbers_or_lists_is_refused_before_it_is_built(tmp_path: Path, template: str) -> None:
    proc = validate(make(tmp_path, {"services/api/templates/api.conf.j2": template}))

    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("services/api/templates/api.conf.j2:1: node n1, service api: "), line
    assert line.endswith(" (render limit)"), line


@pytest.mark.parametrize("template", [
    "{{ ports | sum }}", "{{ shares | sum(start=0.5) }}", "{{ lists | sum(start=[]) }}", "{{ pairs | sum(start=()) }}",
    "{{ hosts | sum(attribute='port') }}", "{{ [] | sum(start=[]) }}", "{{ (lists, pairs) | sum(start=[]) }}",
])
def test_sum_in_the_sandbox_adds_what_jinjas_sum_adds(template: str) -> None:
    values = {"ports": [80, 443, 8080], "shares": [0.1, 0.2, 0.3, 1e16, 1.0, -1e16], "lists": [[1, 2], [], [3]],
              "pairs": [("a",), ("b", "c")], "hosts": [{"port": 1}, {"port": 2}]}
    try:
        expected = jinja2.Environment().from_string(template).render(values)
    except TypeError as e:
        expected = repr(e)
    with budget_in_use(Budget(Limits())):
        try:
            got = Sandbox().from_string(template).render(values)
        except TypeError as e:
            got = repr(e)
    assert got == expected


def test_comparing_files_with_long_lines_keeps_no_copy_of_them() -> None:
    """The line table reads a line alike on every node once (``core.compare``): a line as long as
    a certificate or a key on one line is this node's own, and a thousand of them must not
    stay in memory for the rest of a review, or of a daemon's life."""
    rules = (Rule("tls.ini", ActionKind.RELOAD, ("DEFAULT.cert",)),)

    def one_change(i: int) -> None:
        old, new = (FileSpec("tls.ini", 0o644, b"[DEFAULT]\nport = 1\ncert = " + (b"%d" % (i + k)) * 40_000 + b"\n")
                    for k in (0, 1))
        assert decide({"file"}, (old,), (new,), rules) == (ActionKind.RELOAD, "only [DEFAULT] cert changed in tls.ini")

    one_change(0)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(20):
            one_change(1000 + 7 * i)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 256 * 1024, f"{grown} bytes kept"


def test_nodes_of_one_shape_plan_their_own_rendered_services_in_the_whole_order(tmp_path: Path) -> None:
    """``review.applied.planned``: the stand-ins' actions and the order are worked out once per
    shape; each node's rendered services still get their own actions, in the place the whole
    plan gives them (here a rendered service depends on a stand-in that depends on another
    rendered one, so planning the rendered ones alone would order them otherwise)."""
    def svc(name: str, deps: str, template: str) -> dict[str, str]:
        return {f"services/{name}/service.yaml": f"runtime: {{command: [{name}]}}\ndepends_on: [{deps}]\n"
                                                 f"files: [{{path: {name}.ini, template: {name}.ini.j2}}]\n"
                                                 f"on_change: [{{file: {name}.ini, keys: [DEFAULT.level], "
                                                 "action: reload}]\n",
                f"services/{name}/templates/{name}.ini.j2": template}

    inventory = ("groups:\n  all: {services: [aa, mid, zz]}\nnodes:\n"
                 + "".join(f"  n{i}: {{groups: [all], vars: {{level: {i % 3}, port: {i}}}}}\n" for i in range(6)))
    base = {"reconciler.yaml": "format: 1\nname: fleet\n", "inventory.yaml": inventory,
            **svc("aa", "mid", "[DEFAULT]\nlevel = {{ level }}\nport = {{ port }}\n"),
            **svc("mid", "zz", "[DEFAULT]\nname = mid\n"), **svc("zz", "", "[DEFAULT]\nname = {{ node }}\n")}
    changed = {**base, **svc("aa", "mid", "[DEFAULT]\nlevel = {{ level if level else 7 }}\nport = {{ port }}\n"),
               **svc("zz", "", "[DEFAULT]\nname = {{ node if port > 2 else 'low' }}\n")}
    ra, rb = fleet(tmp_path / "a", base), fleet(tmp_path / "b", changed)
    quick = diff_repos(ra, "a" * 40, rb, "b" * 40, jobs=1)
    whole = diff_repos(ra, "a" * 40, rb, "b" * 40, jobs=1, every_service=True)
    assert [d.to_dict() for d in quick] == [d.to_dict() for d in whole]
    assert [d.plan.actions for d in quick] == [d.plan.actions for d in whole]
    plans = {d.node: [(a.service, str(a.kind)) for a in d.plan.actions] for d in quick}
    assert plans["n0"] == [("zz", "restart"), ("mid", "none"), ("aa", "reload")]  # level 0 -> 7, by its rule
    assert plans["n1"] == [("zz", "restart"), ("mid", "none"), ("aa", "none")]
    assert plans["n4"] == [("zz", "none"), ("mid", "none"), ("aa", "none")]
