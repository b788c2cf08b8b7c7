"""Edits of the repo's own files that keep the operator's comments and layout: a node's entry
in ``inventory.yaml`` (inserted as text at the lines the YAML loader reports), its line in
``trust/nodes``, its recipient in ``.sops.yaml``'s creation rules. What cannot be edited safely
as text (a flow-style ``nodes: {...}``) is refused in one line naming the file, to edit by hand.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reconciler.core.errors import BadInput
from reconciler.core.yamlfile import load_yaml
from reconciler.trust.notesig import NAMESPACE

INVENTORY = "inventory.yaml"
SOPS_CONFIG = ".sops.yaml"


def inside(repo: Path, rel: str) -> Path:
    """``repo/rel``, refused when it is a symlink or resolves out of the repo: an edit (or sops,
    which writes in place) would follow it and change a file elsewhere."""
    path = repo / rel
    if path.is_symlink():
        raise BadInput(f"{rel} is a symlink (to {path.readlink()}): only the repo's own files are edited; "
                       "replace it with the file", file=str(repo))
    resolved = path.resolve()
    if not resolved.is_relative_to(repo.resolve()):
        raise BadInput(f"{rel} resolves outside the repo (to {resolved}): only the repo's own files are edited",
                       file=str(repo))
    return path


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _child_indent(lines: Sequence[str], at: int, parent: int, default: int) -> int:
    """The indent of the first entry below line index ``at`` (``default`` when it has none)."""
    for line in lines[at + 1:]:
        if line.strip() and not line.lstrip().startswith("#"):
            return _indent(line) if _indent(line) > parent else default
    return default


def _block_end(lines: Sequence[str], at: int, parent: int) -> int:
    """The index after the block below line ``at`` (trailing blank and comment lines left after it)."""
    end = at + 1
    for i in range(at + 1, len(lines)):
        line = lines[i]
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if _indent(line) <= parent:
            break
        end = i + 1
    return end


def add_node(text: str, node: str, groups: Sequence[str], recipient: str) -> str:
    """``inventory.yaml`` with ``node`` appended to ``nodes`` (its groups and age recipient)."""
    doc = load_yaml(text.encode(), INVENTORY)
    data = doc.data if isinstance(doc.data, dict) else {}
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    nodes = data.get("nodes")
    if nodes is None and "nodes" not in data:
        step = 2
        return "".join(lines) + f"\nnodes:\n{_entry(node, groups, recipient, step, step)}"
    at = doc.lines[("nodes",)] - 1
    if not isinstance(nodes, dict) or not lines[at].rstrip().endswith(":"):
        raise BadInput("nodes: not a block mapping; add the node by hand", file=INVENTORY, line=at + 1)
    step = _child_indent(lines, at, 0, 2)
    end = _block_end(lines, at, 0)
    return "".join([*lines[:end], _entry(node, groups, recipient, step, step), *lines[end:]])


def _entry(node: str, groups: Sequence[str], recipient: str, indent: int, step: int) -> str:
    pad, inner = " " * indent, " " * (indent + step)
    return (f"{pad}{node}:\n{inner}groups: [{', '.join(groups)}]\n{inner}vars:\n"
            f"{inner}{' ' * step}age_recipient: {recipient}\n")


def set_recipient(text: str, node: str, recipient: str) -> str:
    """``inventory.yaml`` with ``age_recipient`` added to the vars of ``node``, already there."""
    doc = load_yaml(text.encode(), INVENTORY)
    lines = text.splitlines(keepends=True)
    entry: Any = doc.data["nodes"][node]
    at = doc.lines[("nodes", node)] - 1
    if not lines[at].rstrip().endswith(":"):
        raise BadInput(f"nodes.{node}: not a block mapping; add its age_recipient by hand", file=INVENTORY,
                       line=at + 1)
    indent = _indent(lines[at])
    step = _child_indent(lines, at, indent, indent + 2) - indent
    if isinstance(entry, dict) and isinstance(entry.get("vars"), dict):
        vat = doc.lines[("nodes", node, "vars")] - 1
        if not lines[vat].rstrip().endswith(":"):
            raise BadInput(f"nodes.{node}.vars: not a block mapping; add its age_recipient by hand",
                           file=INVENTORY, line=vat + 1)
        vindent = _child_indent(lines, vat, indent + step, indent + 2 * step)
        return "".join([*lines[:vat + 1], f"{' ' * vindent}age_recipient: {recipient}\n", *lines[vat + 1:]])
    if isinstance(entry, dict) and "vars" in entry:
        raise BadInput(f"nodes.{node}.vars: not a mapping", file=INVENTORY, line=doc.lines[("nodes", node, "vars")])
    pad = " " * (indent + step)
    return "".join([*lines[:at + 1], f"{pad}vars:\n{pad}{' ' * step}age_recipient: {recipient}\n", *lines[at + 1:]])


def nodes_line(node: str, public: str) -> str:
    """The node's line in ``trust/nodes`` (as ``reconciler note-key`` prints it)."""
    return f'{node} namespaces="{NAMESPACE}" {public}'


def listed_nodes(text: str) -> set[str]:
    """The principals ``trust/nodes`` lists (its first word per line)."""
    return {line.split()[0] for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")}


def add_recipient(text: str, recipient: str, only: Sequence[str]) -> tuple[str, list[str]]:
    """``.sops.yaml`` with ``recipient`` added to its creation rules (those whose ``path_regex``
    is in ``only``; every rule when empty), and the path_regex of each rule changed. The rules
    are written again (sops' own keys kept, comments above the rules kept)."""
    import yaml

    doc = load_yaml(text.encode(), SOPS_CONFIG)
    rules = doc.data.get("creation_rules") if isinstance(doc.data, dict) else None
    if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
        raise BadInput("creation_rules: not a list of rules", file=SOPS_CONFIG)
    unknown = set(only) - {str(r.get("path_regex")) for r in rules}
    if unknown:
        raise BadInput(f"--rule {sorted(unknown)[0]!r}: no creation rule has this path_regex", file=SOPS_CONFIG)
    changed: list[str] = []
    for rule in rules:
        if only and str(rule.get("path_regex")) not in only:
            continue
        age = [a.strip() for a in re.split(r"[,\n]", str(rule.get("age") or "")) if a.strip()]
        if recipient not in age:
            rule["age"] = ",".join([*age, recipient])
            changed.append(str(rule.get("path_regex", "")))
    head = "".join(line for line in _leading_comments(text))
    body = yaml.safe_dump({**doc.data, "creation_rules": rules}, sort_keys=False, width=1 << 16)
    return head + body, changed


def _leading_comments(text: str) -> list[str]:
    out = []
    for line in text.splitlines(keepends=True):
        if line.strip() and not line.lstrip().startswith("#"):
            break
        out.append(line)
    return out
