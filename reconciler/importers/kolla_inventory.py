"""A kolla-ansible deployment directory, read: its INI inventory (the subset kolla's example
inventories use: ``[group]`` with hosts and ``key=value`` host vars on the host line,
``[group:children]``, ``[group:vars]``, ``#``/``;`` comments, ``name[01:03]`` ranges),
``globals.yml``, ``passwords.yml`` and the ``config/`` overrides (kolla's /etc/kolla/config).

Every mistake is one ``BadInput`` naming the file and line.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reconciler.core.errors import BadInput
from reconciler.core.yamlfile import load_yaml

SECTION = re.compile(r"\[([A-Za-z0-9_.-]+)(?::(children|vars))?\]")
RANGE = re.compile(r"\[([0-9]+):([0-9]+)\]")
HOSTNAME = re.compile(r"[A-Za-z0-9_.\[\]:-]+")


@dataclass(frozen=True)
class IniInventory:
    path: Path
    hosts: dict[str, dict[str, Any]]  # host -> its vars from the host lines, in file order
    members: dict[str, tuple[str, ...]]  # group -> hosts listed under it directly
    children: dict[str, tuple[str, ...]]  # group -> its child groups
    group_vars: dict[str, dict[str, str]]  # [group:vars]
    lines: dict[str, int]  # host or group -> the line it first appears on

    def groups(self) -> list[str]:
        return sorted(set(self.members) | set(self.children))

    def hosts_of(self, group: str) -> list[str]:
        """Every host of ``group``, children included (a cycle is cut where it closes)."""
        seen: set[str] = set()
        out: list[str] = []

        def walk(g: str) -> None:
            if g in seen:
                return
            seen.add(g)
            out.extend(h for h in self.members.get(g, ()) if h not in out)
            for child in self.children.get(g, ()):
                walk(child)

        if group == "all":
            return list(self.hosts)
        walk(group)
        return [h for h in self.hosts if h in out]


def expand(name: str, where: str) -> list[str]:
    """``control[01:03]`` -> control01, control02, control03 (Ansible's numeric ranges; the width
    of the first bound is kept)."""
    found = RANGE.search(name)
    if found is None:
        return [name]
    low, high = found.group(1), found.group(2)
    if int(low) > int(high):
        raise BadInput(f"{where}: range {found.group(0)} runs backwards")
    width = len(low) if low.startswith("0") else 0
    return [h for n in range(int(low), int(high) + 1)
            for h in expand(name[:found.start()] + str(n).zfill(width) + name[found.end():], where)]


def _ini_value(text: str) -> Any:
    """A host line's value as Ansible's INI inventory reads it: a Python literal (a number, a
    list, ``{'processor_vcpus': 4}`` for a node's ``ansible_facts`` stand-in), else the text."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text


def read_inventory(path: Path) -> IniInventory:
    if not path.is_file():
        raise BadInput(f"{path}: no such inventory file (the multinode or all-in-one INI inventory)")
    hosts: dict[str, dict[str, Any]] = {}
    members: dict[str, list[str]] = {}
    children: dict[str, list[str]] = {}
    group_vars: dict[str, dict[str, str]] = {}
    lines: dict[str, int] = {}
    section: tuple[str, str | None] = ("ungrouped", None)
    for number, raw in enumerate(path.read_text(errors="replace").splitlines(), 1):
        where = f"{path}:{number}"
        text = raw.strip()
        if not text or text.startswith(("#", ";")):
            continue
        if text.startswith("["):
            found = SECTION.fullmatch(text)
            if found is None:
                raise BadInput(f"{where}: {text[:60]!r} is not a section header ([group], [group:children] "
                               "or [group:vars])", file=str(path), line=number)
            section = (found.group(1), found.group(2))
            lines.setdefault(section[0], number)
            (children if section[1] == "children" else members).setdefault(section[0], [])
            continue
        group, kind = section
        try:
            words = shlex.split(text, comments=True)
        except ValueError as exc:
            raise BadInput(f"{where}: {exc}", file=str(path), line=number) from None
        if kind == "vars":
            key, eq, value = text.partition("=")
            if not eq or not key.strip():
                raise BadInput(f"{where}: {text[:60]!r} is not key=value", file=str(path), line=number)
            group_vars.setdefault(group, {})[key.strip()] = value.strip()
            continue
        if kind == "children":
            if len(words) != 1 or not HOSTNAME.fullmatch(words[0]):
                raise BadInput(f"{where}: {text[:60]!r} is not a group name", file=str(path), line=number)
            children[group].append(words[0])
            lines.setdefault(words[0], number)
            continue
        name, *assignments = words
        if not HOSTNAME.fullmatch(name):
            raise BadInput(f"{where}: {name[:60]!r} is not a host name", file=str(path), line=number)
        host_vars: dict[str, Any] = {}
        for word in assignments:
            key, eq, value = word.partition("=")
            if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise BadInput(f"{where}: {word[:60]!r} is not a host variable (key=value)", file=str(path),
                               line=number)
            host_vars[key] = _ini_value(value)
        for host in expand(name, where):
            hosts.setdefault(host, {}).update(host_vars)
            lines.setdefault(host, number)
            if host not in members.setdefault(group, []):
                members[group].append(host)
    for kids in children.values():
        for kid in kids:
            if kid not in members and kid not in children:
                members[kid] = []  # Ansible makes an empty group of a child never defined
    return IniInventory(path, hosts, {g: tuple(h) for g, h in members.items()},
                        {g: tuple(c) for g, c in children.items()}, group_vars, lines)


@dataclass(frozen=True)
class KollaDeployment:
    directory: Path
    inventory: IniInventory
    globals: dict[str, Any]
    passwords: dict[str, Any] = field(repr=False)
    overrides: tuple[Path, ...]  # regular files under config/, relative to it
    refused: tuple[tuple[Path, str], ...] = ()  # symlinks and special files under config/, and why


def _yaml_mapping(path: Path, what: str) -> dict[str, Any]:
    doc = load_yaml(path.read_bytes(), str(path))
    if doc.data is None:
        return {}
    if not isinstance(doc.data, dict):
        raise BadInput(f"{path}:1: {what} is not a mapping of variables", file=str(path), line=1)
    return dict(doc.data)


def read_deployment(directory: Path, inventory: Path | None = None) -> KollaDeployment:
    """``directory`` as kolla-ansible's /etc/kolla: globals.yml, passwords.yml, config/, and the
    inventory (``inventory`` or, else, ``multinode`` / ``all-in-one`` / ``inventory`` in it)."""
    if not directory.is_dir():
        raise BadInput(f"{directory}: no such directory (a kolla-ansible deployment: globals.yml, passwords.yml, "
                       "an inventory)")
    if inventory is None:
        inventory = next((directory / n for n in ("multinode", "all-in-one", "inventory")
                          if (directory / n).is_file()), directory / "multinode")
    inv = read_inventory(inventory)
    globals_file, passwords_file = directory / "globals.yml", directory / "passwords.yml"
    for f in (globals_file, passwords_file):
        if not f.is_file():
            raise BadInput(f"{f}: missing (kolla-ansible's {f.name})")
    overrides, refused = _config_files(directory / "config")
    return KollaDeployment(directory, inv, _yaml_mapping(globals_file, "globals.yml"),
                           _yaml_mapping(passwords_file, "passwords.yml"), overrides, refused)


def _config_files(config: Path) -> tuple[tuple[Path, ...], tuple[tuple[Path, str], ...]]:
    """The regular files under config/, and what is refused: a symlink (file or directory: it
    may point at any file the operator can read, a private key of theirs) is not followed, a
    special file (a fifo would hang the read) not read."""
    if not config.is_dir():
        return (), ()
    files: list[Path] = []
    refused: list[tuple[Path, str]] = []
    for top, dirs, names in os.walk(config):  # followlinks=False: a linked directory is listed, not entered
        for name in sorted(dirs + names):
            path = Path(top) / name
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                refused.append((path.relative_to(config), "a symbolic link"))
            elif stat.S_ISREG(mode):
                files.append(path.relative_to(config))
            elif not stat.S_ISDIR(mode):
                refused.append((path.relative_to(config), "not a regular file"))
    return tuple(sorted(files)), tuple(sorted(refused))
