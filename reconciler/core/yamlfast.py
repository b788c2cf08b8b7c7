"""A plain YAML document's data (and its lines) in one pass over its composed nodes.

``yamlfile`` reads a document in three walks of its node graph: the aliases' expanded size,
the line of every value (and duplicate keys), then PyYAML's constructor. For a 10,000-node
inventory that is most of what loading the repo costs (issue 40's ``status --fleet``). Most
repo files are plain: mappings, sequences and scalars the resolver tagged str, int, float,
bool or null, no anchor, no merge key, shallow. Those this builds in one walk, calling
PyYAML's own scalar constructors, so every value is the one PyYAML builds. Anything else, and
any document with something wrong in it, is ``NOT_PLAIN``: the careful walks decide, and say
what is wrong in their words, in their order.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import SafeConstructor

Path_ = tuple[str | int, ...]

NOT_PLAIN: Any = object()

_STR, _MAP, _SEQ = "tag:yaml.org,2002:str", "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"
INT = "tag:yaml.org,2002:int"
# Python reads no decimal integer of more digits (``sys.get_int_max_str_digits``'s default).
MAX_INT_TEXT = 4300


def bounded_int(constructor: Any, node: yaml.ScalarNode) -> Any:
    """SafeConstructor's integer, a sexagesimal one (``1:30``) of more than ``MAX_INT_TEXT``
    characters refused as Python refuses a decimal one: PyYAML builds it multiplying a base by
    60 a part, quadratic in its length (hours of CPU for a file within the size bound, and
    ``reconciler.yaml`` is read before its commit is verified). ``yamlfile``'s loaders use it
    too, so the fast path and the careful one say the same."""
    if ":" in node.value and len(node.value) > MAX_INT_TEXT:
        raise ValueError("number too large")
    return SafeConstructor.construct_yaml_int(constructor, node)


# The scalar tags built here, by SafeConstructor's own functions (a timestamp, binary, a merge
# key, a custom tag: the careful path).
_SCALARS = {tag: SafeConstructor.yaml_constructors[tag]
            for tag in ("tag:yaml.org,2002:null", "tag:yaml.org,2002:bool", "tag:yaml.org,2002:float")}
_SCALARS[INT] = bounded_int  # SafeConstructor's, bounded
# Deeper than this, the careful path (its walks take more frames a level, so it may refuse as
# nested too deeply what one walk would build).
MAX_DEPTH = 32


class _NotPlain(Exception):
    pass


def build(loader: Any, root: yaml.Node, text: str, max_nodes: int, lines: dict[Path_, int] | None) -> Any:
    """The document at ``root`` as PyYAML constructs it, ``lines`` filled as ``yamlfile._walk``
    fills them; or ``NOT_PLAIN`` (``lines`` then left partly filled: the caller clears them).
    ``text``: with no ``&`` in it there is no anchor, so no alias: every node is walked once and
    the expanded size is the composed one (still counted here against ``max_nodes``)."""
    if "&" in text:
        return NOT_PLAIN
    count = [1]
    try:
        if lines is not None:
            lines[()] = root.start_mark.line + 1
        data = _value(loader, root, (), 0, lines, count)
    except Exception:  # noqa: BLE001 - whatever it is, the careful path says it in its words
        return NOT_PLAIN
    return NOT_PLAIN if count[0] > max_nodes else data


def _value(loader: Any, node: yaml.Node, path: Path_, depth: int, lines: dict[Path_, int] | None,
           count: list[int]) -> Any:
    cls = type(node)
    if cls is yaml.ScalarNode:
        if node.tag == _STR:
            return node.value
        return _SCALARS[node.tag](loader, node)  # KeyError: not plain
    if depth >= MAX_DEPTH:
        raise _NotPlain
    if cls is yaml.MappingNode and node.tag == _MAP:
        out: dict[Any, Any] = {}
        pairs = node.value
        count[0] += 2 * len(pairs)
        seen: set[str] = set()
        for key_node, value_node in pairs:
            if type(key_node) is not yaml.ScalarNode:
                raise _NotPlain  # a collection as a key: PyYAML's error
            tag = key_node.tag
            key = key_node.value if tag == _STR else _SCALARS[tag](loader, key_node)
            if lines is not None:
                name = key_node.value
                if name in seen:
                    raise _NotPlain  # a duplicate key: the careful walk names both lines
                seen.add(name)
                sub = (*path, name)
                # A key's own line, as the careful walk leaves it (set before the value's own
                # paths, so the map's order is the walk's too).
                lines[sub] = key_node.start_mark.line + 1
            else:
                sub = path
            if type(value_node) is yaml.ScalarNode and value_node.tag == _STR:
                out[key] = value_node.value  # the most common value, without a call
            else:
                out[key] = _value(loader, value_node, sub, depth + 1, lines, count)
        return out
    if cls is yaml.SequenceNode and node.tag == _SEQ:
        items = node.value
        count[0] += len(items)
        if lines is None:
            return [_value(loader, item, path, depth + 1, None, count) for item in items]
        seq = []
        for i, item in enumerate(items):
            sub = (*path, i)
            lines[sub] = item.start_mark.line + 1
            seq.append(_value(loader, item, sub, depth + 1, lines, count))
        return seq
    raise _NotPlain
