"""What an import must not write into the repo in clear, and what it says of it in IMPORT.md
(names and paths, never a value):

- Ansible's connection and privilege variables (``ansible_user``, ``ansible_become_password``,
  ``ansible_ssh_pass``, ``ansible_ssh_private_key_file``...) on host lines and in ``[group:vars]``:
  the agent runs on the node itself, so they have no use in the repo, and their values are
  credentials. Every ``ansible_*`` name goes but ``ansible_facts`` (the facts stand-in kolla's
  templates read); kolla-ansible 22.2.0's templates and role defaults read no other from the
  inventory (``ansible_host`` included).
- ``config/`` files that are secret material (external Ceph keyrings, keys, a ``.conf`` override
  holding a password): encrypted into ``secrets/kolla-config.yaml`` (one secret per file, its
  whole text), not copied to ``kolla-config/``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconciler.importers.kolla_inventory import KollaDeployment

KEPT = frozenset({"ansible_facts"})
# A path part that names secret material: keyring, keytab, *key(s), *secret(s), password(s),
# credential(s) (``keystone`` is not one: a part must end with the word).
SECRET_NAME = re.compile(r"\w*keys?|keyring|keytab|\w*secrets?|passw(?:or)?ds?|credentials?")
SECRET_TEXT = re.compile(rb"PRIVATE KEY-----|(?m:^\s*key\s*=\s*AQ[A-Za-z0-9+/]{20,})")  # a PEM key, a Ceph key
SHORTEST = 4  # a passwords.yml value shorter than this is not looked for (it would match every file)
SECRETS_FILE = "secrets/kolla-config.yaml"


def connection_vars(values: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``values`` without Ansible's connection and privilege variables, and the names dropped."""
    kept = {k: v for k, v in values.items() if not k.startswith("ansible_") or k in KEPT}
    return kept, [k for k in values if k not in kept]


def dropped_note(where: str, names: list[str]) -> str:
    return (f"{where}: {', '.join(names)} not carried over (Ansible's connection and privilege variables: the agent "
            "runs on the node, and their values are credentials)")


@dataclass(frozen=True)
class ConfigFiles:
    clear: tuple[tuple[Path, str], ...]  # config/ path, text: copied to kolla-config/
    secret: tuple[tuple[Path, str, str], ...]  # config/ path, secret name, text: into SECRETS_FILE
    notes: tuple[str, ...]  # what IMPORT.md says of the secret and refused ones


def _values(data: Any) -> set[str]:
    if isinstance(data, Mapping):
        return {v for item in data.values() for v in _values(item)}
    if isinstance(data, list):
        return {v for item in data for v in _values(item)}
    if data is None or isinstance(data, bool):
        return set()
    text = str(data).strip()
    return {text} if len(text) >= SHORTEST else set()


def _read(path: Path) -> bytes:
    """The file itself, never what a symlink swapped in since config/ was listed points at."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def _why_secret(rel: Path, raw: bytes, passwords: Mapping[str, Any]) -> str | None:
    parts = [t for part in rel.parts for t in re.split(r"[^a-z0-9]+", part.lower()) if t]
    named = next((t for t in parts if SECRET_NAME.fullmatch(t)), None)
    if named is not None:
        return f"its name says {named!r}"
    if SECRET_TEXT.search(raw):
        return "it holds a private key"
    holds = sorted(k for k, v in passwords.items() if any(t.encode() in raw for t in _values(v)))
    if holds:
        return f"it holds the value of passwords.yml's {', '.join(holds[:3])}{' and more' if len(holds) > 3 else ''}"
    return None


def config_files(dep: KollaDeployment) -> ConfigFiles:
    """The deployment's config/ overrides sorted into those copied as they are and the secret
    ones; the symlinks and special files ``read_deployment`` refused, noted."""
    config = dep.directory / "config"
    clear: list[tuple[Path, str]] = []
    secret: list[tuple[Path, str, str]] = []
    notes = [f"config/{rel}: {what}; not followed, not carried over (it may point at any file the operator can "
             "read): put the file itself in config/ if it belongs there" for rel, what in dep.refused]
    for rel in dep.overrides:
        raw = _read(config / rel)
        why = _why_secret(rel, raw, dep.passwords)
        if why is None:
            clear.append((rel, raw.decode(errors="replace")))
            continue
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            notes.append(f"config/{rel}: secret material ({why}), not text: not carried over; carry it as a secret")
            continue
        name = base = "kolla_config_" + re.sub(r"[^A-Za-z0-9]+", "_", str(rel)).strip("_")
        n = 1
        while name in {s[1] for s in secret}:
            n += 1
            name = f"{base}_{n}"
        secret.append((rel, name, text))
        notes.append(f"config/{rel}: secret material ({why}): not copied to kolla-config/, carried as a secret, "
                     f"`secrets.{name}` in {SECRETS_FILE} (its whole text)")
    return ConfigFiles(tuple(clear), tuple(secret), tuple(notes))
