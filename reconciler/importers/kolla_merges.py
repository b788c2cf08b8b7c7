"""kolla's config merges as the repo's ``merge`` entries (service.yaml, docs/repo.md "Merged
files"): a ``merge_configs`` task's sources after the template (``format: ini``), a
``merge_yaml`` task's (``format: yaml``), a ``with_first_found`` template task's candidates
before the role's template (``first_found: true``), each ``{{ node_custom_config }}/X`` as
``kolla-config/X``, where the import copies kolla's config/. Variables in a path stay as kolla
writes them (``{{ inventory_hostname }}``), rendered per node.

What cannot be said so stays listed in IMPORT.md: a source outside ``node_custom_config``, and
an override the import carried as a secret (it is not under kolla-config/, so no merge reads
it: its file renders without it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from reconciler.importers.kolla_services import KollaFile, KollaService
from reconciler.repo.overrides import part_matches, path_parts, templated

CUSTOM = re.compile(r"\{\{\s*node_custom_config\s*\}\}/(.+)")
CONFIG = "kolla-config"


def repo_sources(f: KollaFile) -> tuple[str, ...] | None:
    """The file's merge sources as repo paths; None when one is not under node_custom_config."""
    out = []
    for source in f.merges:
        found = CUSTOM.fullmatch(source.strip())
        if found is None:
            return None
        out.append(f"{CONFIG}/{found.group(1)}")
    return tuple(out)


def merge_entry(f: KollaFile) -> dict[str, Any] | None:
    """The ``merge`` of the file's entry in service.yaml, or None (no merge, or one not said)."""
    sources = repo_sources(f) if f.merges else None
    if sources is None:
        return None
    if f.merge_kind == "first_found":
        return {"first_found": True, "from": list(sources)}
    return {"format": f.merge_kind, "from": list(sources)}


def reads(f: KollaFile, rel: Path) -> bool:
    """Whether the file's merge may read config/``rel`` on some node."""
    sources = repo_sources(f) if f.merges else None
    target = [CONFIG, *rel.parts]
    for source in sources or ():
        parts = path_parts(source)
        if len(parts) == len(target) and all(
                part_matches(p, t) if templated(p) else p == t
                for p, t in zip(parts, target, strict=True)):
            return True
    return False


def unexpressed(services: Iterable[KollaService], secret: Iterable[Path]) -> list[str]:
    """IMPORT.md's lines for the merges the repo does not say: a source outside config/, an
    override carried as a secret that a merge would read."""
    kept = list(secret)
    out = []
    for s in services:
        for f in s.files:
            if not f.merges:
                continue
            where = f"services/{s.name}/{f.path}"
            if repo_sources(f) is None:
                out.append(f"{where}: kolla merges {', '.join(f.merges)} into it; a source outside "
                           "node_custom_config: the repo renders the template alone")
                continue
            out += [f"{where}: config/{rel} is secret material (carried in secrets/, not kolla-config/): not merged"
                    for rel in kept if reads(f, rel)]
    return sorted(set(out))
