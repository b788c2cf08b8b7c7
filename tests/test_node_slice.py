"""A node checks the repo it reads (issue 40): its own services in full, and of the others
only what it reads of them (their names, versions and upgrade steps); the review and
`validate` still check everything, and the nodes that run a broken service refuse it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import SigningKey, small_deployment

from reconciler.agent import Agent
from reconciler.core.yamlfile import RepoProblems
from reconciler.repo.load import load_repo
from reconciler.repo.tree import DirTree

SERVICE = ("version: '1'\nruntime:\n  command: [python3, svc.py]\n"
           "files:\n  - {path: svc.py, source: svc.py}\n  - {path: svc.conf, template: svc.conf.j2}\n")
FILES = {
    "reconciler.yaml": "format: 1\nname: slices\n",
    "inventory.yaml": "vars:\n  greeting: hello\n"
                      "groups:\n  front:\n    services: [web]\n  back:\n    services: [db]\n"
                      "nodes:\n  n1:\n    groups: [front]\n  n2:\n    groups: [back]\n",
    "services/web/service.yaml": SERVICE,
    "services/web/files/svc.py": "import time\nwhile True:\n    time.sleep(3600)\n",
    "services/web/templates/svc.conf.j2": "greeting = {{ greeting }}\n",
    "services/db/service.yaml": SERVICE,
    "services/db/files/svc.py": "import time\nwhile True:\n    time.sleep(3600)\n",
    "services/db/templates/svc.conf.j2": "greeting = {{ greeting }}\n",
}


def validate(repo: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reconciler", "validate", "--repo", str(repo)],
                          capture_output=True, text=True)


def test_a_broken_service_refuses_only_the_nodes_that_run_it(tmp_path: Path, merge_key: SigningKey,
                                                             agents: Callable[..., Agent]) -> None:
    dep = small_deployment(tmp_path, merge_key, FILES)
    n1, n2 = agents("n1", dep.url), agents("n2", dep.url)
    assert n1.reconcile_once().exit_code == 0
    assert n2.reconcile_once().exit_code == 0
    # db's health check gets a port that is no string (a schema error), its template loses a
    # brace: parts only db's nodes read. And web's greeting changes, for n1 to apply.
    dep.write("services/db/service.yaml", SERVICE + "health:\n  tcp: 5432\n")
    dep.write("services/db/templates/svc.conf.j2", "greeting = {{ greeting }\n")
    dep.edit("inventory.yaml", "greeting: hello", "greeting: hi")
    commit = dep.commit("db broken, greeting changed")

    said = validate(dep.work)  # the review's and validate's check: everything, each at its line
    assert said.returncode == 2, said
    assert "services/db/service.yaml:8: health/tcp: 5432 is not of type 'string'" in said.stderr, said.stderr

    first = n1.reconcile_once()  # n1 runs web only: it converges on the commit
    assert (first.exit_code, first.commit) == (0, commit), first
    assert (n1.cfg.state_dir / "services/web/live/svc.conf").read_text() == "greeting = hi\n"
    assert dep.note("n1", commit)["state"] == "applied"  # type: ignore[index]
    second = n2.reconcile_once()  # n2 runs db: it refuses the commit, naming the file and line
    assert second.exit_code == 2, second
    note = dep.note("n2", commit)
    assert note is not None and (note["state"], note.get("reason")) == ("error", "INVALID_REPO"), note
    assert str(note["error"]).startswith("services/db/service.yaml:8: health/tcp"), note


def _repo(tmp_path: Path, changes: dict[str, str]) -> DirTree:
    for rel, text in {**FILES, **changes}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return DirTree(tmp_path)


@pytest.mark.parametrize(("changes", "where"), [
    # what every node reads: the inventory's variables, the settings
    ({"inventory.yaml": FILES["inventory.yaml"].replace("vars:\n  greeting: hello", "vars: [greeting]")},
     "inventory.yaml:1"),
    ({"reconciler.yaml": "format: 1\nname: slices\nrollout: {waves: 3}\n"}, "reconciler.yaml:3"),
    # a shared secrets file that is no SOPS file: any template may read it
    ({"secrets/shared.yaml": "greeting: hello\n"}, "secrets/shared.yaml"),
    # what a node reads of every service: its upgrade steps (a barrier waits on them), its version
    ({"services/db/service.yaml": SERVICE + "upgrade:\n  - {name: migrate}\n"}, "services/db/service.yaml:8"),
    ({"services/db/service.yaml": SERVICE.replace("version: '1'", "version: [1]")}, "services/db/service.yaml:1"),
    # the rules of upgrade steps, not only their schema: a name twice, pin without set, once on a stop
    ({"services/db/service.yaml": SERVICE + "upgrade:\n  - {name: m, action: command, command: 'true'}\n"
      "  - {name: m, action: command, command: 'true'}\n"}, "services/db/service.yaml:9"),
    ({"services/db/service.yaml": SERVICE + "upgrade:\n  - {name: p, action: pin}\n"}, "services/db/service.yaml:8"),
    ({"services/db/service.yaml": SERVICE + "upgrade:\n  - {name: s, action: stop, scope: once}\n"},
     "services/db/service.yaml:8"),
    # a service web depends on is read in full
    ({"services/web/service.yaml": SERVICE + "depends_on: [db]\n",
      "services/db/service.yaml": SERVICE + "health:\n  tcp: 5432\n"}, "services/db/service.yaml:8"),
])
def test_what_a_node_reads_of_the_repo_broken_refuses_it(tmp_path: Path, changes: dict[str, str],
                                                          where: str) -> None:
    tree = _repo(tmp_path, changes)
    for node in ("n1", "n2", None):
        with pytest.raises(RepoProblems) as refused:
            load_repo(tree, node=node)
        assert where in str(refused.value), (node, str(refused.value))


def test_a_node_loads_the_others_services_as_far_as_it_reads_them(tmp_path: Path) -> None:
    tree = _repo(tmp_path, {"services/db/service.yaml": SERVICE + "health:\n  tcp: 5432\n"
                                                     + "upgrade:\n  - {name: migrate, action: command, command: 'true'}\n",
                            "services/db/templates/svc.conf.j2": "{% if %}\n"})
    with pytest.raises(RepoProblems):
        load_repo(tree)  # the whole repo, as validate and the review see it
    mine = load_repo(tree, node="n1")
    assert set(mine.services) == {"web", "db"}
    assert mine.services["web"].templates and mine.services["web"].sources
    db = mine.services["db"]
    assert (db.version, [s.name for s in db.upgrade], db.templates, db.files) == ("1", ["migrate"], {}, ())
    with pytest.raises(RepoProblems):
        load_repo(tree, node="n2")
    with pytest.raises(RepoProblems):
        load_repo(tree, node="n3")  # a node the inventory does not name reads it all


def _names(schema: object) -> set[str]:
    """Every property name and string constant a schema mentions: what a generated document uses."""
    out: set[str] = set()
    if isinstance(schema, dict):
        out |= {k for k in schema.get("properties", {})}
        out |= {v for v in schema.get("enum", []) if isinstance(v, str)}
        for v in schema.values():
            out |= _names(v)
    elif isinstance(schema, list):
        for v in schema:
            out |= _names(v)
    return out


@pytest.mark.parametrize("name", ["service", "inventory", "reconciler"])
def test_the_schema_check_without_jsonschema_never_passes_what_jsonschema_refuses(name: str) -> None:
    """A node loads a commit without importing jsonschema when its documents are valid
    (issue 40): what that check calls valid, jsonschema finds nothing wrong with (documents made
    of the schema's own names and values, and the repo's own files broken at random); and on
    the repo's own files it agrees, so a valid repo never needs jsonschema."""
    import jsonschema
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from reconciler.core.schemacheck import valid
    from reconciler.core.yamlfile import load_yaml, schema

    checks = schema(name)
    words = st.sampled_from(sorted(_names(checks)) + ["", "x", "0644", "1.2.3", "a b"])
    scalars = st.none() | st.booleans() | st.integers(-3, 100000) | st.floats(allow_nan=False) | words
    docs = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(words, inner, max_size=6),
                        max_leaves=30)

    def agrees(doc: object) -> None:
        errors = list(jsonschema.Draft202012Validator(checks).iter_errors(doc))
        assert not (valid(doc, checks) and errors), (doc, errors[0].message)

    given(docs)(settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))(agrees))()
    own = {"service": "services/identity/service.yaml", "inventory": "inventory.yaml",
           "reconciler": "reconciler.yaml"}[name]
    example = Path(__file__).resolve().parent.parent / "examples" / "repo" / own
    data = load_yaml(example.read_bytes(), own, 10**6).data
    assert valid(data, checks)

    @given(st.lists(words, min_size=1, max_size=3), docs)
    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    def broken(path: list[str], value: object) -> None:
        import copy

        doc = copy.deepcopy(data)
        at = doc
        for key in path[:-1]:
            at = at.setdefault(key, {}) if isinstance(at, dict) else at
        if isinstance(at, dict):
            at[path[-1]] = value
        agrees(doc)

    broken()


BROKEN_SERVICES = [  # one keyword of the service schema each
    {"health": {"tcp": "a:1", "http": "http://x"}}, {"files": [{"path": "a"}]},
    {"files": [{"path": "a", "template": "t", "source": "s"}]}, {"depends_on": ["a", "a"]}, {"drift": "maybe"},
    {"version": True}, {"health": {"timeout": 0}}, {"health": {"min_healthy": 100000}},
    {"files": [{"path": "a", "template": "t", "mode": "999"}]}, {"bogus": 1}, {"runtime": {"command": "x"}},
    {"upgrade": [{"name": "m"}]}, {"defaults": {"not an identifier": 1}}, {"version": 1.5, "depends_on": [1]},
]


@pytest.mark.parametrize("doc", BROKEN_SERVICES)
def test_each_kind_of_schema_error_is_left_to_jsonschema(doc: dict[str, object]) -> None:
    import jsonschema

    from reconciler.core.schemacheck import valid
    from reconciler.core.yamlfile import schema

    assert list(jsonschema.Draft202012Validator(schema("service")).iter_errors(doc)), doc  # broken indeed
    assert not valid(doc, schema("service"))
