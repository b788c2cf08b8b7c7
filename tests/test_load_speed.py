"""Loading a repo the fast way gives what the careful way gives (issue 40's ``status --fleet``).

Three shortcuts, each held to the code it stands in for, on generated inputs: a plain YAML
document built in one walk (``yamlfast``) against compose, expansion check, line walk and
PyYAML's constructor (``yamlfile._load(plain=False)``): the same data, lines and errors; the
schemas compiled into closures (``schemacompile``) against ``schemacheck``'s walk: the same
verdict; and ``check_drivers`` judging each (service, driver) once against the per-node loop
it replaced (copied here): the same problems, in the same order.
"""

from __future__ import annotations

import datetime
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.core import schemacheck, schemacompile, yamlfast, yamlfile
from reconciler.core.errors import BadInput
from reconciler.core.yamlfile import Problem, schema
from reconciler.drivers.kinds import kind_of, names
from reconciler.repo.checks import check_drivers
from reconciler.repo.definitions import DeploymentRepo, FileDecl
from reconciler.repo.load import load_repo
from reconciler.repo.tree import DirTree

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def inventory(nodes: int) -> str:
    """An inventory shaped like the bench's fleet (bench/fleet_status.py)."""
    groups = ["control", "compute", "storage", "network"]
    lines = ["vars: {debug: false, region: RegionOne, workers: 4}", "groups:"]
    lines += [f"  {g}: {{services: [svc00, svc01], vars: {{role: {g}}}}}" for g in groups]
    lines += ["nodes:"] + [f"  node{i:04d}: {{groups: [{groups[i % 4]}], vars: {{port_base: {10000 + i * 100}}}}}"
                           for i in range(nodes)]
    return "\n".join(lines) + "\n"


def outcome(text: str, max_nodes: int, *, plain: bool, with_lines: bool = True) -> tuple[Any, ...]:
    """What loading ``text`` gives, comparable: the data's repr (types, key order, NaN alike)
    and the lines in their order; or the error's class, text, line and reason."""
    lines: dict[Any, int] | None = {} if with_lines else None
    try:
        data = yamlfile._load(text.encode(), "f.yaml", max_nodes, lines=lines, plain=plain)
    except BadInput as exc:
        return ("error", type(exc).__name__, str(exc), exc.line, exc.reason)
    return ("ok", repr(data), list((lines or {}).items()))


# Scalars as an operator writes them, and the unusual ones the careful path keeps: ints in each
# base, sexagesimal, floats, bools of YAML 1.1, nulls, dates (and one that is no date), binary,
# explicit and custom tags, a merge key, a value key, anchors and aliases, a huge integer.
PLAIN = ["a", "node0001", "compute", "1", "0", "01", "0x1F", "0o17", "0b101", "1_000", "1:30", "-2", "+3", "3.5",
         "1e3", "6.8e+2", ".inf", "-.Inf", ".NaN", "true", "False", "yes", "no", "on", "OFF", "null", "~", "",
         "'quoted'", '"dq \\u00e9"', "'1'", "a b", "x: y", "- z"]
ODD = ["2026-01-02", "2026-13-01", "2001-12-14t21:59:43.10-05:00", "!!binary aGVsbG8=", "!!str 12", "!!int '7'",
       "!!float 1", "!custom x", "!!set {a, b}", "!!omap [a: 1]", "&x 5", "*x", "&y {k: v}", "*y", "1" * 5000,
       "!!bool yes", "!!null ''", "!!int 'x'"]
KEYS = ["a", "b", "a", "1", "01", "true", "null", "~", "=", "<<", "port", "'a'", "? c"]


def _render(node: Any, indent: int, flow: bool) -> str:
    kind, body = node
    pad = " " * indent
    if kind == "scalar":
        return str(body)
    if flow or not body:
        if kind == "map":
            return "{" + ", ".join(f"{k}: {_render(v, 0, True)}" for k, v in body) + "}"
        return "[" + ", ".join(_render(v, 0, True) for v in body) + "]"
    out = []
    for item in body:
        key, value = item if kind == "map" else ("-", item)
        lead = f"{pad}{key}:" if kind == "map" else f"{pad}-"
        if value[0] == "scalar" or not value[1] or value[0] == "flow":
            out.append(f"{lead} {_render(value, 0, True)}")
        else:
            out.append(lead + "\n" + _render(value, indent + 2, False))
    return "\n".join(out)


scalars = st.tuples(st.just("scalar"), st.one_of(st.sampled_from(PLAIN), st.sampled_from(PLAIN + ODD)))
trees = st.recursive(
    scalars,
    lambda inner: st.one_of(st.tuples(st.just("map"), st.lists(st.tuples(st.sampled_from(KEYS), inner), max_size=4)),
                            st.tuples(st.just("seq"), st.lists(inner, max_size=4))),
    max_leaves=12)
documents = st.builds(lambda tree, flow: _render(tree, 0, flow) + "\n", trees, st.booleans())


@FUZZ
@given(documents, st.sampled_from([10**6, 40, 12]))
def test_a_document_loads_as_the_careful_path_loads_it(text: str, max_nodes: int) -> None:
    assert outcome(text, max_nodes, plain=True) == outcome(text, max_nodes, plain=False), text
    assert (outcome(text, max_nodes, plain=True, with_lines=False)
            == outcome(text, max_nodes, plain=False, with_lines=False)), text


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 60))
def test_deep_and_large_documents_load_as_the_careful_path_loads_them(width: int, depth: int) -> None:
    nested = "\n".join(" " * (2 * i) + "a:" for i in range(depth)) + " 1\n"
    flow = "[" * depth + ", ".join(["x"] * width) + "]" * depth + "\n"
    for text in (nested, flow, inventory(width * 10)):
        for max_nodes in (10**6, depth * width + 5, 30):
            assert outcome(text, max_nodes, plain=True) == outcome(text, max_nodes, plain=False)


def built(text: str, lines: dict[Any, int]) -> Any:
    """What ``yamlfast`` makes of ``text`` (``NOT_PLAIN``: it leaves it to the careful path)."""
    loader = yaml.CSafeLoader(text)
    try:
        root = loader.get_single_node()
        assert root is not None
        return yamlfast.build(loader, root, text, 10**6, lines)
    finally:
        loader.dispose()


def test_the_fleets_inventory_is_built_in_one_walk_with_every_line() -> None:
    text = inventory(200)
    lines: dict[Any, int] = {}
    data = built(text, lines)

    assert data is not yamlfast.NOT_PLAIN
    careful = yamlfile.YamlDoc("inventory.yaml", None, {})
    careful_data = yamlfile._load(text.encode(), "inventory.yaml", 10**6, lines=careful.lines, plain=False)
    assert repr(data) == repr(careful_data) and list(lines.items()) == list(careful.lines.items())
    assert lines[("nodes", "node0007", "vars", "port_base")] == 15


def test_what_is_not_plain_is_left_to_the_careful_path() -> None:
    for text in ("a: &x 1\nb: *x\n", "a: 2026-01-02\n", "<<: {a: 1}\n", "a: 1\na: 2\n", "a: " + "9" * 5000 + "\n",
                 "a: !custom 1\n", "? [1]\n: 2\n"):
        assert built(text, {}) is yamlfast.NOT_PLAIN, text


# --- the schema check ---------------------------------------------------------------------

def verdict(check: Any, instance: Any, against: Any) -> tuple[str, Any]:
    try:
        return ("ok", check(instance, against))
    except Exception as exc:  # noqa: BLE001 - a schema the careful walk crashes on: the same crash
        return ("raised", type(exc).__name__)


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([0.5, 2.0, -1.0]),
                         st.sampled_from(["", "a", "ab", "Ab-1", "x y", "abc", "1"]))
odd_values = st.sampled_from([datetime.date(2026, 1, 2), b"bytes", (1, 2), {1: "int key"}, {None: 1}, float("nan")])
instances = st.recursive(
    st.one_of(json_scalars, odd_values),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.sampled_from(["a", "b", "c", "x1", "_p", "A"]), inner, max_size=4)),
    max_leaves=10)
TYPES = ["object", "array", "string", "integer", "number", "boolean", "null", "nosuchtype"]
PATTERNS = ["^a", "b$", "^[A-Za-z_][A-Za-z0-9_]*$", "x", "(", "^\\d"]


def _schemas(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    keyword = st.one_of(
        st.tuples(st.just("type"), st.one_of(st.sampled_from(TYPES), st.lists(st.sampled_from(TYPES), max_size=3))),
        st.tuples(st.just("enum"), st.lists(json_scalars, max_size=3)),
        st.tuples(st.just("const"), json_scalars),
        st.tuples(st.sampled_from(["not", "items", "propertyNames", "additionalProperties"]), inner),
        st.tuples(st.sampled_from(["oneOf", "anyOf"]), st.lists(inner, min_size=1, max_size=3)),
        st.tuples(st.just("properties"), st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3)),
        st.tuples(st.just("patternProperties"), st.dictionaries(st.sampled_from(PATTERNS), inner, max_size=2)),
        st.tuples(st.just("required"), st.lists(st.sampled_from(["a", "b"]), max_size=2)),
        st.tuples(st.sampled_from(["minProperties", "minItems", "minLength", "maxLength", "minimum", "maximum",
                                   "exclusiveMinimum", "exclusiveMaximum"]), st.integers(0, 2)),
        st.tuples(st.just("uniqueItems"), st.booleans()),
        st.tuples(st.just("pattern"), st.sampled_from(PATTERNS)),
        st.tuples(st.just("$ref"), st.sampled_from(["#/$defs/name", "#/$defs/vars", "#/$defs/none", "#/x", "#/$defs/a/b"])),
        st.tuples(st.sampled_from(["maxItems", "description", "items"]), st.sampled_from([1, "text", [True]])),
    )
    return st.lists(keyword, max_size=4).map(dict)


schemas: st.SearchStrategy[Any] = st.recursive(st.one_of(st.booleans(), st.just({})), _schemas, max_leaves=8)


@FUZZ
@given(schemas, instances, st.sampled_from([{}, {"name": {"type": "string", "pattern": "^[a-z]"}, "vars": {}}]))
def test_a_compiled_schema_judges_as_the_careful_walk(tree: Any, instance: Any, defs: dict[str, Any]) -> None:
    root = {"$defs": defs, **tree} if isinstance(tree, dict) else tree

    assert verdict(schemacompile.valid, instance, root) == verdict(schemacheck.valid, instance, root)


# Every keyword alone, and each inside the keywords that turn a verdict round or count them:
# where ``_valid`` raises (a value of no JSON type, a key that is no string, a bad pattern, an
# unknown keyword or type, a missing definition) and where it stops before raising.
ONE_KEYWORD: list[dict[str, Any]] = [
    {"type": "string"}, {"type": ["null", "object"]}, {"type": "nosuchtype"}, {"type": []}, {"type": "integer"},
    {"enum": ["a", "b"]}, {"enum": [1, True, None]}, {"enum": []}, {"const": 1}, {"const": "a"},
    {"required": ["a"]}, {"minProperties": 1}, {"propertyNames": {"pattern": "^a"}},
    {"properties": {"a": {"type": "string"}}}, {"patternProperties": {"^a": {"type": "integer"}}},
    {"additionalProperties": False}, {"additionalProperties": False, "properties": {"a": True}},
    {"properties": {"a": True}, "patternProperties": {"b": False}, "additionalProperties": {"type": "null"}},
    {"patternProperties": {"(": True}}, {"pattern": "("}, {"pattern": "^a"}, {"minLength": 2}, {"maxLength": 1},
    {"items": {"type": "string"}}, {"items": [True]}, {"minItems": 1}, {"uniqueItems": True},
    {"minimum": 1}, {"exclusiveMaximum": 1}, {"maxItems": 1}, {"$ref": "#/$defs/name"}, {"$ref": "#/$defs/none"},
    {"$ref": "#/x"}, {"type": "object", "required": ["a"], "maxItems": 3}, {"description": "only words"},
    {"type": "string", "pattern": "("}, {"type": "string", "description": "a name", "pattern": "^a"},
]
TRICKY_SCHEMAS = [*ONE_KEYWORD, True, False, 5,
                  *({"not": k} for k in ONE_KEYWORD), *({"oneOf": [k, {"type": "string"}]} for k in ONE_KEYWORD),
                  *({"anyOf": [{"const": 1}, k]} for k in ONE_KEYWORD), *({"items": k} for k in ONE_KEYWORD),
                  *({"properties": {"a": k}, "required": ["a"]} for k in ONE_KEYWORD)]
TRICKY_VALUES: list[Any] = [None, True, False, 0, 1, 1.0, 1.5, "", "a", "ab", "b", "Ab", [], ["a", "a"], ["a", "b"], [1, True],
                 [1, 1.0], {}, {"a": "x"}, {"a": 1}, {"b": None}, {"a": 1, "b": 2}, {1: "x"}, {None: 1},
                 {"a": datetime.date(2026, 1, 2)}, [datetime.date(2026, 1, 2)], datetime.date(2026, 1, 2), b"x",
                 ("a",), float("nan"), [{"a": 1}], [{1: 2}], [[]]]


def test_every_keyword_judges_as_the_careful_walk_where_it_raises_and_where_it_stops() -> None:
    for tree in TRICKY_SCHEMAS:
        root = {"$defs": {"name": {"type": "string", "pattern": "^[a-z]"}}, **tree} if isinstance(tree, dict) else tree
        for instance in TRICKY_VALUES:
            assert verdict(schemacompile.valid, instance, root) == verdict(schemacheck.valid, instance, root), (
                tree, instance)


def _mutated(doc: Any, path: list[Any], value: Any) -> Any:
    """``doc`` with the value at the end of ``path`` (as far as it leads) replaced by ``value``."""
    if not path or not isinstance(doc, dict | list) or not doc:
        return value
    if isinstance(doc, dict):
        key = list(doc)[path[0] % len(doc)]
        return {**doc, key: _mutated(doc[key], path[1:], value)} if path[0] >= 0 else {**doc, "extra": value}
    i = path[0] % len(doc)
    return [*doc[:i], _mutated(doc[i], path[1:], value), *doc[i + 1:]]


REPO_DOCS = {
    "inventory": yamlfile.safe_load(inventory(6).encode(), "inventory.yaml"),
    "service": yamlfile.safe_load(b"driver: docker\nruntime: {command: [a], image: 'x:1', env: {A: '1'}}\n"
                                  b"files:\n  - {path: a.conf, template: a.j2}\nhealth: {http: 'http://x/'}\n"
                                  b"on_change:\n  - {file: a.conf, action: reload}\ndepends_on: [db]\n", "s.yaml"),
    "reconciler": yamlfile.safe_load(b"format: 1\nname: small\nrollout:\n  waves:\n    - {name: one, group: web}\n",
                                     "r.yaml"),
}


@FUZZ
@given(st.sampled_from(sorted(REPO_DOCS)), st.lists(st.integers(-1, 5), max_size=5), instances)
def test_the_repos_own_schemas_judge_a_changed_file_as_the_careful_walk(name: str, path: list[int],
                                                                       value: Any) -> None:
    doc = REPO_DOCS[name]
    assert schemacompile.valid(doc, schema(name)) is schemacheck.valid(doc, schema(name)) is True
    changed = _mutated(doc, path, value)

    assert schemacompile.valid(changed, schema(name)) == schemacheck.valid(changed, schema(name))


# --- check_drivers ------------------------------------------------------------------------

def drivers_before(repo: DeploymentRepo) -> list[Problem]:
    """check_drivers as it was before it judged each (service, driver) once: the oracle."""
    problems = []
    for node in sorted(repo.nodes):
        for name in repo.services_of(node):
            svc, driver = repo.services[name], repo.driver_of(node, name)
            kind = kind_of(driver)
            if not kind.may_reboot and any(r.get("action") == "reboot" for r in svc.on_change):
                problems.append(Problem(svc.file, svc.lines.get("runtime"),
                                        f"node {node} runs {name} with {driver}: only a host service "
                                        "(driver: host) can ask for a reboot"))
            wrong = [f for f in svc.files if f.path.startswith("/") != kind.absolute_paths]
            if wrong:
                where = "absolute" if kind.absolute_paths else "relative to its config dir"
                problems.append(Problem(svc.file, wrong[0].line, f"node {node} runs {name} with {driver}: "
                                        f"file path {wrong[0].path!r} must be {where}"))
            if kind.needs_image and not svc.container.get("image"):
                problems.append(Problem(svc.file, svc.lines.get("runtime"),
                                        f"node {node} runs {name} with {driver}: runtime needs an image"))
            elif kind.needs_command and not svc.command:
                problems.append(Problem(svc.file, svc.lines.get("runtime"),
                                        f"node {node} runs {name} with {driver}: runtime needs a command"))
    return problems


def _fleet(tmp: Path) -> DeploymentRepo:
    files = {"reconciler.yaml": "format: 1\nname: fleet\n",
             "inventory.yaml": "groups:\n  a: {services: [s0, s1]}\n  b: {services: [s1, s2]}\n"
                               "nodes:\n" + "".join(f"  n{i}: {{groups: [{'ab'[i % 2]}]}}\n" for i in range(8))}
    for s in range(3):
        files[f"services/s{s}/service.yaml"] = "runtime: {command: [run]}\nfiles:\n  - {path: c.conf, source: c}\n"
        files[f"services/s{s}/files/c"] = "x\n"
    for rel, text in files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(text)
    return load_repo(DirTree(tmp))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_drivers_are_judged_once_a_pair_and_said_for_each_node(tmp_path: Path, data: st.DataObject) -> None:
    repo = _FLEET.get("repo") or _FLEET.setdefault("repo", _fleet(tmp_path))
    drivers = st.one_of(st.none(), st.sampled_from(names()))
    services = {}
    for name, svc in repo.services.items():
        services[name] = replace(
            svc, driver=data.draw(drivers), command=data.draw(st.sampled_from([(), ("run",)])),
            container=data.draw(st.sampled_from([{}, {"image": "x:1"}, {"image": ""}])),
            on_change=data.draw(st.sampled_from([(), ({"action": "reboot"},), ({"action": "reload"},)])),
            files=tuple(FileDecl(p, 0o644, None, "c", 3 + i, None)
                        for i, p in enumerate(data.draw(st.lists(st.sampled_from(["c.conf", "/etc/c.conf"]),
                                                                 max_size=3, unique=True)))))
    nodes = {n: replace(d, driver=data.draw(drivers)) for n, d in repo.nodes.items()}
    changed = replace(repo, services=services, nodes=nodes)

    assert check_drivers(changed) == drivers_before(changed)


_FLEET: dict[str, DeploymentRepo] = {}
