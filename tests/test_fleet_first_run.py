"""`status --fleet` of a big fleet on a first run (issue 40): the work a reader of 10,000 nodes
does once per key and per file, not again per note, with the same verdicts."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.core import yamlfile
from reconciler.core.errors import BadInput, YamlLimit
from reconciler.trust import sshkeys
from reconciler.trust.notesig import NoteKey, NoteTrust, parse_nodes, public_line


class _NoCountingCompose:
    """Stands for the loader that composes in Python, counting: a test fails if it is used."""

    def __init__(self, *args: object) -> None:
        raise AssertionError("composed in Python, node by node")


def _inventory(nodes: int) -> bytes:
    return ("nodes:\n" + "".join(f"  node{n:05d}: {{groups: [compute], vars: {{port_base: {n}}}}}\n"
                                 for n in range(nodes))).encode()


def test_a_big_inventory_within_the_node_bound_is_composed_by_libyaml(monkeypatch: pytest.MonkeyPatch) -> None:
    # 400 nodes x 6 YAML nodes in ~20,000 characters: more characters than half the bound (the
    # old test for libyaml's composer), far fewer events than the bound.
    text = _inventory(400)
    expected = yamlfile.load_yaml(text, "inventory.yaml", 30_000)
    monkeypatch.setattr(yamlfile, "_COUNTING_C", _NoCountingCompose)
    monkeypatch.setattr(yamlfile, "_CountingLoader", _NoCountingCompose)
    doc = yamlfile.load_yaml(text, "inventory.yaml", 30_000)
    assert doc == expected and doc.line(("nodes", "node00399", "vars")) == 401


def test_an_inventory_past_the_node_bound_is_still_refused_where_it_tips_over() -> None:
    with pytest.raises(YamlLimit, match=r"^inventory.yaml:\d+: YAML has more than 2000 nodes"):
        yamlfile.load_yaml(_inventory(400), "inventory.yaml", 2000)


def test_a_broken_big_inventory_still_says_its_line() -> None:
    text = _inventory(400) + b"  node99999: {groups: [compute]\n"
    with pytest.raises(BadInput, match=r"^inventory.yaml:403: invalid YAML: did not find expected ',' or '}'$"):
        yamlfile.load_yaml(text, "inventory.yaml", 30_000)


def test_a_fleets_trust_indexes_its_keys_without_parsing_them_again(tmp_path: Path) -> None:
    # More keys than parse_key's cache holds: each would be parsed again when indexed.
    from cryptography.hazmat.primitives.asymmetric import ed25519

    lines = "".join(public_line(f"n{i}", NoteKey(tmp_path / f"n{i}", ed25519.Ed25519PrivateKey.generate())) + "\n"
                    for i in range(300))
    trust = NoteTrust(parse_nodes(lines, "trust/nodes"), origin="c" * 40)
    sshkeys.parse_key.cache_clear()
    index = trust._by_key
    assert len(index) == 300
    assert sshkeys.parse_key.cache_info().misses == 0
