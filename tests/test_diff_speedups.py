"""`diff` near plain Jinja2 (issue 40): what a fleet's diff now works out once, for a group of
nodes or for a commit, says what the same work done for each node alone says, on fleets whose
nodes differ (own variables, services, rules, dependencies)."""

from __future__ import annotations

from pathlib import Path

from reconciler.core.model import Desired, DesiredService, Runtime
from reconciler.plan.planner import plan
from reconciler.render.inputs import Inputs
from reconciler.render.node import render_node
from reconciler.repo.definitions import DeploymentRepo
from reconciler.repo.load import load_repo
from reconciler.repo.tree import DirTree
from reconciler.review.applied import applied_against, as_applied
from reconciler.review.diff import diff_repos

CONF = """\
[DEFAULT]
host = {{ node }}
region = {{ region }}
workers = {{ workers }}

[api]
port = {{ port_base + %(i)d }}
"""


def service(i: int, rules: str = "[{file: svc.conf, keys: [DEFAULT.region], action: reload}]",
            extra: str = "") -> dict[str, str]:
    name = f"svc{i}"
    return {f"services/{name}/service.yaml": f"runtime: {{command: [{name}, --config, svc.conf]}}\n"
                                             f"files: [{{path: svc.conf, template: svc.conf.j2}}{extra}]\n"
                                             f"on_change: {rules}\n",
            f"services/{name}/templates/svc.conf.j2": CONF % {"i": i}}


def fleet(root: Path, files: dict[str, str]) -> DeploymentRepo:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return load_repo(DirTree(root))


INVENTORY = """\
vars: {region: one, workers: 4}
groups:
  api: {services: [svc0, svc1, svc2], vars: {workers: 6}}
  db: {services: [svc1, svc3], vars: {workers: 8}}
nodes:
  n1: {groups: [api], vars: {port_base: 1000}}
  n2: {groups: [api], vars: {port_base: 2000}}
  n3: {groups: [api], vars: {port_base: 3000, workers: 2}}
  n4: {groups: [db], vars: {port_base: 4000}}
  n5: {groups: [db, api], vars: {port_base: 5000}}
"""


def base_files() -> dict[str, str]:
    return {"reconciler.yaml": "format: 1\nname: fleet\n", "inventory.yaml": INVENTORY,
            **service(0), **service(1, rules="[]"), **service(2), **service(3)}


def test_a_plan_against_a_applied_unhashed_is_the_plan_against_a_hashed(tmp_path: Path) -> None:
    """A as applied takes B's hash wherever A's part is the same (``review.applied``): each
    node's plan reads exactly as against A's own hashes, for every kind of change at once."""
    ra = fleet(tmp_path / "a", base_files())
    after = base_files()
    after["inventory.yaml"] = INVENTORY.replace("region: one", "region: two").replace(
        "port_base: 3000, workers: 2", "port_base: 3000, workers: 3")
    after.update(service(1, rules="[]", extra=", {path: notes.txt, template: svc.conf.j2}"))  # a file added
    after["services/svc2/service.yaml"] = after["services/svc2/service.yaml"].replace(
        "--config, svc.conf]", "--config, svc.conf, --verbose]")  # how it runs
    after["services/svc3/service.yaml"] = after["services/svc3/service.yaml"].replace(
        "template: svc.conf.j2}", "template: svc.conf.j2, mode: '0640'}")  # a mode
    rb = fleet(tmp_path / "b", after)
    kinds = set()
    for node in sorted(rb.nodes):
        da, db = render_node(ra, node, "a" * 40), render_node(rb, node, "b" * 40)
        quick, hashed = plan(db, applied_against(da, db)), plan(db, as_applied(da))
        assert quick.to_dict() == hashed.to_dict(), node
        kinds |= {(a.service, str(a.kind)) for a in hashed.actions}
    # Every case met: a reload by rule, a restart by none, a recreate, a mode change, a file added.
    assert {("svc0", "reload"), ("svc1", "restart"), ("svc2", "recreate"), ("svc3", "reload")} <= kinds
    # And a slice that did not change reads as unchanged: the same hash as B's.
    same_b = fleet(tmp_path / "same", base_files())
    da, db = render_node(ra, "n4", "a" * 40), render_node(same_b, "n4", "b" * 40)
    assert [o.hash for o in applied_against(da, db).services] == [s.hash for s in db.services]
    assert {str(a.kind) for a in plan(db, applied_against(da, db)).actions} == {"none"}


def test_nodes_of_a_group_render_what_their_own_variables_change(tmp_path: Path) -> None:
    """The services to render are worked out once per set of services and names changed
    (``Inputs.changed``): nodes of one group whose own variables differ still get their own."""
    ra = fleet(tmp_path / "a", base_files())
    after = base_files()
    after["inventory.yaml"] = INVENTORY.replace("port_base: 2000", "port_base: 2001").replace(
        "port_base: 3000, workers: 2", "port_base: 3000, workers: 3").replace(
        "db: {services: [svc1, svc3], vars: {workers: 8}}", "db: {services: [svc1, svc3], vars: {workers: 9}}")
    rb = fleet(tmp_path / "b", after)
    shared = Inputs(ra, rb)
    got = {n: shared.changed(n) for n in sorted(rb.nodes)}
    assert got == {n: Inputs(ra, rb).changed(n) for n in sorted(rb.nodes)}  # each alone, nothing shared
    assert got == {"n1": frozenset(), "n2": {"svc0", "svc1", "svc2"}, "n3": {"svc0", "svc1", "svc2"},
                   "n4": {"svc1", "svc3"}, "n5": frozenset()}  # n5: the api group it lists last sets its workers
    full = diff_repos(ra, "a" * 40, rb, "b" * 40, every_service=True)
    assert [d.to_dict() for d in diff_repos(ra, "a" * 40, rb, "b" * 40, jobs=1)] == [d.to_dict() for d in full]


def test_the_same_change_under_other_rules_plans_each_services_own_action(tmp_path: Path) -> None:
    """An action and its reason are worked out once per (rules, changed keys): two services whose
    files change alike but whose rules differ each get their own."""
    ra = fleet(tmp_path / "a", base_files())
    rb = fleet(tmp_path / "b", {**base_files(), "inventory.yaml": INVENTORY.replace("region: one", "region: two")})
    diffs = {d.node: {a.service: (str(a.kind), a.reason) for a in d.plan.changes}
             for d in diff_repos(ra, "a" * 40, rb, "b" * 40, jobs=1)}
    for node in ("n1", "n2", "n3", "n5"):
        assert diffs[node]["svc0"] == diffs[node]["svc2"] == ("reload", "only [DEFAULT] region changed in svc.conf")
        assert diffs[node]["svc1"] == ("restart", "only [DEFAULT] region changed in svc.conf (no rule: restart)")
    assert diffs["n4"]["svc3"][0] == "reload" and diffs["n4"]["svc1"][0] == "restart"


def test_nodes_with_the_same_services_and_other_dependencies_start_each_in_its_own_order() -> None:
    """The order of a node's services is worked out once per set of names and dependencies."""
    def desired(node: str, deps: dict[str, tuple[str, ...]]) -> Desired:
        return Desired(node, "c" * 40, tuple(DesiredService(n, Runtime("process", (n,)), (), depends_on=d)
                                              for n, d in sorted(deps.items())))

    def order(d: Desired) -> list[str]:
        return [a.service for a in plan(d, as_applied(Desired(d.node, "c" * 40, ()))).actions]

    assert order(desired("n1", {"a": ("b",), "b": (), "c": ()})) == ["b", "c", "a"]
    assert order(desired("n2", {"a": (), "b": ("c",), "c": ()})) == ["a", "c", "b"]
    assert order(desired("n3", {"a": ("b",), "b": (), "c": ()})) == ["b", "c", "a"]
