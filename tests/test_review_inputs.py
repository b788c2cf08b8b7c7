"""`diff` renders a service only where its inputs changed (issue 17), and says exactly what a
full render of both commits says: every case compares the two, whole (JSON, plans, markdown)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest.mock import patch

import yaml
from conftest import EXAMPLE, Deployment, git
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from reconciler.core.errors import ReconcilerError
from reconciler.core.model import DesiredService
from reconciler.render import node as render
from reconciler.render.inputs import Inputs, same
from reconciler.repo.definitions import DeploymentRepo, ServiceDef
from reconciler.repo.load import load_repo
from reconciler.repo.tree import DirTree, open_tree
from reconciler.review.diff import diff_repos
from reconciler.review.report import markdown

A, B = "a" * 40, "b" * 40
CONTROLLERS = {"ctl1", "ctl2", "ctl3"}


def same_diff(ra: DeploymentRepo, rb: DeploymentRepo, a: str = A, b: str = B) -> dict[str, frozenset[str]]:
    """Assert the skipping diff is the full one; return what it rendered per node (the services
    render_service was called for, at either commit)."""
    calls: dict[str, set[str]] = {n: set() for n in set(ra.nodes) | set(rb.nodes)}
    real = render.render_service

    def recording(repo: DeploymentRepo, node: str, svc: ServiceDef, *args: Any, **kwargs: Any) -> DesiredService:
        calls[node].add(svc.name)
        return real(repo, node, svc, *args, **kwargs)

    with patch.object(render, "render_service", recording):
        quick = diff_repos(ra, a, rb, b, jobs=1)
    full = diff_repos(ra, a, rb, b, every_service=True)
    assert [d.to_dict() for d in quick] == [d.to_dict() for d in full]
    assert [d.plan.to_dict() for d in quick] == [d.plan.to_dict() for d in full]
    assert markdown(quick, a, b, groups=rb.group_members) == markdown(full, a, b, groups=rb.group_members)
    rendered = {n: frozenset(calls[n]) for n in sorted(calls)}
    assert rendered == {n: Inputs(ra, rb).changed(n) & (set(ra.services_of(n) if n in ra.nodes else ())
                                                        | set(rb.services_of(n) if n in rb.nodes else ()))
                        for n in rendered}
    # Whatever changes on a node was rendered there (a stand-in never shows a change).
    for d in full:
        touched = {a.service for a in d.plan.changes} | {f.service for f in d.files}
        assert touched <= rendered[d.node], (d.node, touched, rendered[d.node])
    return rendered


def edited(tmp: Path, change: Callable[[Path], None]) -> tuple[DeploymentRepo, DeploymentRepo]:
    before, after = tmp / "a", tmp / "b"
    shutil.copytree(EXAMPLE, before)
    shutil.copytree(before, after)
    change(after)
    return load_repo(DirTree(before)), load_repo(DirTree(after))


def replace_in(root: Path, rel: str, old: str, new: str) -> None:
    text = (root / rel).read_text()
    assert old in text, (rel, old)
    (root / rel).write_text(text.replace(old, new, 1))


def only_on(services: set[str], nodes: set[str], everyone: set[str]) -> dict[str, frozenset[str]]:
    return {n: frozenset(services) if n in nodes else frozenset() for n in sorted(everyone)}


EVERY = {"ctl1", "ctl2", "ctl3", "cmp1", "cmp2"}


def test_a_template_change_renders_that_service_only(tmp_path: Path) -> None:
    ra, rb = edited(tmp_path, lambda r: replace_in(r, "services/lb/templates/lb.json.j2", '"timeout": 2.0',
                                                   '"timeout": 3.0'))
    assert same_diff(ra, rb) == only_on({"lb"}, CONTROLLERS, EVERY)


def test_a_variable_one_service_reads_renders_that_service_only(tmp_path: Path) -> None:
    ra, rb = edited(tmp_path, lambda r: replace_in(r, "inventory.yaml", "token_ttl: 3600", "token_ttl: 7200"))
    assert same_diff(ra, rb) == only_on({"identity"}, CONTROLLERS, EVERY)


def test_a_group_variable_renders_what_reads_it_on_that_group(tmp_path: Path) -> None:
    ra, rb = edited(tmp_path, lambda r: replace_in(r, "inventory.yaml", "db_max_connections: 200",
                                                   "db_max_connections: 300"))
    assert same_diff(ra, rb) == only_on({"db"}, CONTROLLERS, EVERY)


def test_a_value_of_another_type_that_compares_equal_is_still_a_change(tmp_path: Path) -> None:
    # false == 0 in Python, but the file says "false" and then "0".
    ra, rb = edited(tmp_path, lambda r: replace_in(r, "inventory.yaml", "identity_debug: false", "identity_debug: 0"))
    assert same_diff(ra, rb) == only_on({"identity"}, CONTROLLERS, EVERY)
    assert not same(False, 0) and not same({"a": 1, "b": 2}, {"b": 2, "a": 1}) and same([1, {"x": "y"}], [1, {"x": "y"}])


def test_another_nodes_hostvars_render_its_peers_that_read_them(tmp_path: Path) -> None:
    ra, rb = edited(tmp_path, lambda r: replace_in(r, "inventory.yaml", "port_base: 18200", "port_base: 18201"))
    rendered = same_diff(ra, rb)
    # ctl2 itself: everything reads port_base. Its peers: what reads hostvars (db's peers, lb's
    # backends, compute-agent's controller address), never node-exporter.
    assert rendered["ctl2"] == {"db", "identity", "lb", "node-exporter"}
    assert rendered["ctl1"] == rendered["ctl3"] == {"db", "lb"}
    assert rendered["cmp1"] == rendered["cmp2"] == {"compute-agent"}


def test_an_included_template_renders_the_service_that_includes_it(tmp_path: Path) -> None:
    def include(root: Path, value: str) -> None:
        (root / "services/identity/templates/lib").mkdir(exist_ok=True)
        (root / "services/identity/templates/lib/extra.j2").write_text(f"extra = {{{{ {value} }}}}\n")
        text = (root / "services/identity/templates/identity.conf.j2").read_text()
        if "include" not in text:
            (root / "services/identity/templates/identity.conf.j2").write_text(text + "{% include 'lib/extra.j2' %}")

    base = tmp_path / "base"
    shutil.copytree(EXAMPLE, base)
    include(base, "region")
    after = tmp_path / "after"
    shutil.copytree(base, after)
    include(after, "region ~ '-x'")
    assert same_diff(load_repo(DirTree(base)), load_repo(DirTree(after))) == only_on({"identity"}, CONTROLLERS, EVERY)
    # The variable only the included template reads counts as the service's input.
    again = tmp_path / "again"
    shutil.copytree(after, again)
    replace_in(again, "inventory.yaml", "region: RegionOne", "region: RegionTwo")
    rendered = same_diff(load_repo(DirTree(after)), load_repo(DirTree(again)))
    assert "identity" in rendered["ctl1"] and "lb" not in rendered["ctl1"]


def test_a_new_member_of_a_group_renders_what_reads_groups_or_hostvars(tmp_path: Path) -> None:
    def add(root: Path) -> None:
        replace_in(root, "inventory.yaml", "    vars: {port_base: 18500, vcpus: 64}",
                   "    vars: {port_base: 18500, vcpus: 64}\n  cmp3:\n    groups: [computes, monitoring]\n"
                   "    vars: {port_base: 18600, vcpus: 8}")

    ra, rb = edited(tmp_path, add)
    rendered = same_diff(ra, rb)
    assert rendered["cmp3"] == {"compute-agent", "node-exporter"}  # new: everything, on both sides
    assert "node-exporter" not in rendered["ctl1"] and "db" in rendered["ctl1"]


def test_a_service_yaml_change_renders_that_service_everywhere_it_runs(tmp_path: Path) -> None:
    def change(root: Path) -> None:
        text = (root / "services/node-exporter/service.yaml").read_text()
        (root / "services/node-exporter/service.yaml").write_text(text.replace("health:", "drift: report\nhealth:", 1))

    ra, rb = edited(tmp_path, change)
    assert same_diff(ra, rb) == only_on({"node-exporter"}, EVERY, EVERY)


def test_a_rotated_secret_renders_the_files_of_the_nodes_that_read_it(deployment: Deployment, tmp_path: Path) -> None:
    from test_secrets import add_secret, keys, sops

    k = keys(tmp_path)
    c1 = git("rev-parse", "HEAD", cwd=deployment.work)
    c2 = add_secret(deployment, k)
    sops(deployment.work, "set", "secrets/controllers.yaml", '["db_password"]', '"second-Pw-0d9e8b7a"', key=k["ctl2"])
    c3 = deployment.commit("rotate the db password")
    repos = {c: load_repo(open_tree(deployment.work, c)) for c in (c1, c2, c3)}
    rendered = same_diff(repos[c2], repos[c3], c2, c3)
    assert rendered["ctl1"] >= {"db", "identity"} and rendered["cmp1"] == set()
    same_diff(repos[c1], repos[c2], c1, c2)
    same_diff(repos[c1], repos[c3], c1, c3)


# A small generated fleet for the property: services whose templates read variables, a peer's
# variables, groups and an included template; then random edits of any of those.
VARS = ("x", "y", "z")
VALUES = st.one_of(st.integers(0, 3), st.booleans(), st.sampled_from(["a", "b", "1"]),
                   st.dictionaries(st.sampled_from(["k", "m"]), st.integers(0, 2), max_size=2))
TEMPLATES = st.sampled_from([
    "{{ x }}", "{{ y }} {{ node }}", "{{ hostvars[peer].x | default('-') }}", "{{ groups.g1 | join(',') }}",
    "{% include 'lib.j2' %}", "{% for k in z %}{{ k }}{% endfor %}", "{{ z }}", "plain",
])


@st.composite
def fleets(draw: st.DrawFn) -> dict[str, object]:
    return {
        "vars": {v: draw(VALUES) for v in VARS if draw(st.booleans())} | {"peer": "n0"},
        "groups": {g: {"services": draw(st.lists(st.sampled_from(["s0", "s1", "s2"]), min_size=1, unique=True)),
                       "vars": {v: draw(VALUES) for v in VARS if draw(st.booleans())}} for g in ("g1", "g2")},
        "nodes": {f"n{i}": {"groups": draw(st.lists(st.sampled_from(["g1", "g2"]), min_size=1, max_size=2,
                                                     unique=True)),
                            "vars": {v: draw(VALUES) for v in VARS if draw(st.booleans())}} for i in range(4)},
        "templates": {s: draw(TEMPLATES) for s in ("s0", "s1", "s2")},
        "lib": draw(st.sampled_from(["{{ x }}", "{{ y }}", "lib"])),
        "defaults": {v: draw(VALUES) for v in VARS},
    }


def write_fleet(root: Path, fleet: dict[str, object]) -> None:
    root.mkdir()
    (root / "reconciler.yaml").write_text("format: 1\nname: prop\n")
    inv = {k: fleet[k] for k in ("vars", "groups", "nodes")}
    (root / "inventory.yaml").write_text(yaml.safe_dump(inv, sort_keys=False))
    templates = fleet["templates"]
    assert isinstance(templates, dict)
    for s, text in templates.items():
        d = root / "services" / s
        (d / "templates").mkdir(parents=True)
        (d / "service.yaml").write_text(yaml.safe_dump({
            "runtime": {"command": ["prog", "{{ y | default('') }}"]},
            "files": [{"path": "out", "template": "t.j2"}], "defaults": fleet["defaults"]}))
        (d / "templates/t.j2").write_text(text)
        (d / "templates/lib.j2").write_text(str(fleet["lib"]))


EDITS = st.sampled_from(["repo var", "group var", "node var", "template", "lib", "membership", "default", "none"])
# One drawn edit: kind (EDITS), node index, variable (VARS), value (VALUES), template (TEMPLATES).
Edit = tuple[str, int, str, int | str | dict[str, int], str]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets(), st.lists(st.tuples(EDITS, st.integers(0, 3), st.sampled_from(VARS), VALUES, TEMPLATES),
                          min_size=1, max_size=3))
def test_property_the_skipping_diff_is_the_full_diff(fleet: dict[str, object], edits: list[Edit]) -> None:
    import copy

    after = copy.deepcopy(fleet)
    for kind, i, var, value, template in edits:
        node, group, svc = f"n{i}", ("g1", "g2")[i % 2], f"s{i % 3}"
        if kind == "repo var":
            after["vars"][var] = value  # type: ignore[index]
        elif kind == "group var":
            after["groups"][group]["vars"][var] = value  # type: ignore[index]
        elif kind == "node var":
            after["nodes"][node]["vars"][var] = value  # type: ignore[index]
        elif kind == "template":
            after["templates"][svc] = template  # type: ignore[index]
        elif kind == "lib":
            after["lib"] = template
        elif kind == "membership":
            after["nodes"][node]["groups"] = ["g2"] if after["nodes"][node]["groups"] != ["g2"] else ["g1"]  # type: ignore[index]
        elif kind == "default":
            after["defaults"][var] = value  # type: ignore[index]
    with tempfile.TemporaryDirectory() as tmp:
        write_fleet(Path(tmp) / "a", fleet)
        write_fleet(Path(tmp) / "b", after)
        try:
            ra, rb = load_repo(DirTree(Path(tmp) / "a")), load_repo(DirTree(Path(tmp) / "b"))
            diff_repos(ra, A, ra, A, every_service=True)
            diff_repos(rb, B, rb, B, every_service=True)
        except ReconcilerError:
            assume(False)  # a drawn fleet that does not render (a loop over a number): not this case
        same_diff(ra, rb)
