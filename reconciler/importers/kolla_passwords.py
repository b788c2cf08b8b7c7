"""passwords.yml into the repo, each password encrypted only to the nodes that read it.

kolla-ansible never gives a compute node the database root password: a node receives the
rendered configs of its own services. So the import puts each password in the SOPS file of the
nodes whose services' files read it (``kolla_readers``, computed on the repo just written), one
file per distinct set of reader nodes:

- ``secrets/read-by-<label>.yaml``, the label naming the set by kolla's inventory groups (the
  groups the inventory lists hosts under, in its order: ``control``, ``network``, ``compute``...)
  whose union it is, then any node no such group covers: ``read-by-network+compute.yaml``,
  ``read-by-control+compute01.yaml``; a label past 80 characters is ``<N>-nodes-<hash>``.
- ``secrets/unread.yaml``: the passwords no enabled service's files read (kolla's deploy tasks
  use some: the database root password, keystone's admin password; a service enabled later
  needs its own). Encrypted to the operator's recipient when one is given, else to the nodes of
  kolla's ``control`` group (where kolla runs those tasks), else to every node.
- ``secrets/kolla-config.yaml`` (``kolla_secrets``): to every node, as before.

The operator's recipient, when given, reads every file. ``.sops.yaml`` has one creation rule
per file, with its recipients, so that a later ``sops`` on a file encrypts it to the same
readers; there is no catch-all rule: a new secrets file needs a rule saying who reads it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from reconciler.importers.kolla_inventory import KollaDeployment
from reconciler.importers.kolla_readers import secret_readers
from reconciler.importers.kolla_secrets import SECRETS_FILE

UNREAD = "secrets/unread.yaml"
LONGEST = 80  # characters of a label made of names; longer, a count and a hash


@dataclass(frozen=True)
class SecretsFile:
    path: str
    values: Mapping[str, Any]
    readers: tuple[str, ...]  # nodes, in the inventory's order
    recipients: tuple[str, ...]
    why: str  # who reads it, for IMPORT.md


def _label(readers: frozenset[str], groups: list[tuple[str, frozenset[str]]], order: list[str]) -> str:
    """The groups whose union is ``readers`` (the largest first, each adding nodes), then the
    nodes none of them covers."""
    left, chosen = set(readers), []
    while True:
        fits = [(len(m & left), -i, g) for i, (g, m) in enumerate(groups) if m and m <= readers and m & left]
        if not fits:
            break
        _, rank, group = max(fits)
        chosen.append(-rank)
        left -= groups[-rank][1]
    parts = [groups[i][0] for i in sorted(chosen)] + [n for n in order if n in left]
    label = "+".join(re.sub(r"[^A-Za-z0-9_.-]", "_", p) for p in parts)
    if len(label) > LONGEST:
        digest = hashlib.sha256(",".join(sorted(readers)).encode()).hexdigest()[:8]
        label = f"{len(readers)}-nodes-{digest}"
    return label


def split(work: Path, dep: KollaDeployment, passwords: Mapping[str, Any], config: Mapping[str, str],
          recipients: Mapping[str, str], operator: str | None) -> tuple[SecretsFile, ...]:
    """The repo's secrets files: ``passwords`` by their readers in the repo at ``work`` (the
    import's own output, its secrets not written yet), ``config`` (kolla_secrets' secret config/
    files) to every node."""
    from reconciler.repo.load import load_repo
    from reconciler.repo.tree import DirTree

    repo = load_repo(DirTree(work))
    inv = dep.inventory
    order = [n for n in inv.hosts if n in repo.nodes]
    groups = [(g, frozenset(h for h in inv.hosts_of(g) if h in repo.nodes))
              for g in sorted(inv.members, key=lambda g: inv.lines.get(g, 0))]
    by_readers: dict[frozenset[str], dict[str, Any]] = {}
    for name, readers in sorted(secret_readers(repo, frozenset(passwords)).items()):
        by_readers.setdefault(readers, {})[name] = passwords[name]
    mine = {operator} if operator else set()

    def made(path: str, values: Mapping[str, Any], readers: frozenset[str], why: str) -> SecretsFile:
        nodes = tuple(n for n in order if n in readers)
        return SecretsFile(path, dict(sorted(values.items())), nodes,
                           tuple(sorted({recipients[n] for n in nodes} | mine)), why)

    out, taken = [], {UNREAD, SECRETS_FILE}
    for readers, values in sorted(by_readers.items(), key=lambda kv: (-len(kv[0]), sorted(kv[0]))):
        if not readers:
            continue
        label = _label(readers, groups, order)
        path, n = f"secrets/read-by-{label}.yaml", 1
        while path in taken:  # a node named as a group, say: a name of its own all the same
            n += 1
            path = f"secrets/read-by-{label}-{n}.yaml"
        taken.add(path)
        out.append(made(path, values, readers, "the nodes whose services' files read them"))
    if by_readers.get(frozenset()):
        control = frozenset(inv.hosts_of("control")) & frozenset(order)
        fallback = frozenset() if operator else control or frozenset(order)
        who = ("the operator's recipient alone" if operator else
               "the nodes of kolla's control group" if control else "every node (the inventory has no control group)")
        out.append(made(UNREAD, by_readers[frozenset()], fallback, f"no enabled service's files read them: {who}"))
    if config:
        out.append(made(SECRETS_FILE, config, frozenset(order), "every node"))
    return tuple(out)


def sops_config(files: tuple[SecretsFile, ...]) -> str:
    rules = [{"path_regex": f"(^|/){re.escape(f.path)}$", "age": ",".join(f.recipients)} for f in files]
    return ("# Who can read which secrets file (sops reads this; reconciler never does): one rule per file,\n"
            "# as `reconciler import kolla-ansible` split passwords.yml by the nodes that read each (IMPORT.md).\n"
            "# A new secrets file needs a rule of its own.\n"
            + yaml.safe_dump({"creation_rules": rules}, sort_keys=False, width=1000))


def write(work: Path, files: tuple[SecretsFile, ...], encrypt: Callable[[Path, str], None]) -> None:
    """.sops.yaml, then each file in clear and encrypted in place by ``encrypt`` (the real sops)."""
    (work / ".sops.yaml").write_text(sops_config(files))
    for f in files:
        (work / f.path).parent.mkdir(exist_ok=True)
        (work / f.path).write_text(yaml.safe_dump(dict(f.values), sort_keys=False, width=120, allow_unicode=True))
        encrypt(work, f.path)


def report(files: tuple[SecretsFile, ...]) -> str:
    """IMPORT.md's section on who decrypts which password (names, never a value)."""
    lines = ["", "## Who decrypts which password", "",
             "passwords.yml is split by the nodes whose services' files read each password (through kolla's "
             "variables too), one SOPS file per set of nodes, each with its rule in .sops.yaml. A password read "
             "by no enabled service is in secrets/unread.yaml: when a service is enabled later, move its "
             "passwords to the file of the nodes that run it (`sops decrypt`, `sops set`), or import again.", ""]
    for f in files:
        who = ", ".join(f.readers) or "no node"
        lines.append(f"- {f.path} ({f.why}: {who}): {', '.join(f.values)}")
    return "\n".join(lines) + "\n"
