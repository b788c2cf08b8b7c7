"""The slice hash a node records is the one it compares with on every later run: its bytes never
change with how they are computed."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.core.model import (
    Action,
    ActionKind,
    DesiredService,
    FileSpec,
    Health,
    Runtime,
    canonical_json,
    sha256_hex,
)


def api(files: tuple[FileSpec, ...], networks: tuple[str, ...] = ("mgmt",)) -> DesiredService:
    return DesiredService("api", Runtime("docker", ("api", "--config", "api.conf"), image="reg/api:1", networks=networks,
                                         aliases=(("mgmt", "api"),) if networks else ()), files,
                          Health("tcp", "127.0.0.1:1"))


def test_a_slice_hashes_to_what_nodes_recorded_before() -> None:
    # Computed by the release before the hash was written without the JSON encoder: a node
    # that upgrades sees its services unchanged.
    svc = api((FileSpec("api.conf", 0o644, b"[DEFAULT]\nport = 1\n"),
               FileSpec('"odd" p\u00e4th\n', 0o600, b"x", True, b"key")))
    assert svc.hash == "eb2a85a23c74ad9720ab04c897fba5b748b9fdb633624186ed7edd4b39a5c517"


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.text(max_size=6), st.tuples(st.integers(0, 0o7777), st.binary(max_size=16), st.booleans()),
                       max_size=4),
       st.lists(st.text(max_size=3), max_size=2, unique=True))
def test_a_slice_hash_is_of_the_canonical_json_of_its_fingerprint(
        files: dict[str, tuple[int, bytes, bool]], networks: list[str]) -> None:
    svc = api(tuple(FileSpec(p, mode, content, keyed, b"k" if keyed else b"") for p, (mode, content, keyed)
                    in files.items()), tuple(networks))
    assert svc.hash == sha256_hex(canonical_json(svc.fingerprint()))


def test_a_review_keeps_every_part_of_an_action_but_the_rendered_service() -> None:
    svc = api(())
    action = Action(ActionKind.RELOAD, "api", "why", svc, "docker", sync=True, staged=True, waiting="w", held_by="B")
    assert all(getattr(action, f.name) != f.default for f in dataclasses.fields(Action))  # none left at its default
    kept = action.without_desired()
    assert kept.desired is None
    assert dataclasses.replace(kept, desired=svc) == action


def test_a_value_kept_by_identity_keeps_its_object_so_its_id_names_no_other() -> None:
    import gc
    import weakref

    from reconciler.core.memo import ByIdentity

    class Rules:
        pass

    kept: ByIdentity[str] = ByIdentity(limit=2)
    rules = Rules()
    alive = weakref.ref(rules)
    key = (id(rules), "svc.conf")
    kept.put(key, "judged", rules)
    del rules
    gc.collect()
    assert alive() is not None and kept.get(key) == "judged"  # its id cannot be reused meanwhile
    kept.put("b", "x")
    kept.put("c", "y")  # past the limit: the table starts over, and lets the object go
    gc.collect()
    assert kept.get(key) is None and alive() is None and kept.get("c") == "y"
