"""The secrets ``node add`` re-encrypts to a new node (the real ``sops updatekeys``, as the
operator), checked before the repo is touched, and what each file was and is now encrypted to.

``sops updatekeys`` encrypts a file to every recipient of the creation rule it matches, not only
the one just added: a recipient slipped into ``.sops.yaml`` earlier would silently get every
secret. So the plan reads each file's own recipients (its sops metadata) and the rule's, and
says which recipients other than the new node's would be added, for the caller to refuse.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from reconciler.bootstrap import edits, keys
from reconciler.core.errors import BadInput
from reconciler.core.yamlfile import safe_load, safe_load_all
from reconciler.repo.sops import parse_documents, recipient_id


@dataclass(frozen=True)
class FilePlan:
    path: str  # repo-relative: secrets/NAME.yaml
    before: tuple[str, ...]  # the recipients its sops metadata names now
    rule: tuple[str, ...]  # the recipients of the creation rule sops will apply (after the edit)

    def others(self, new: str) -> tuple[str, ...]:
        """Recipients updatekeys would add besides ``new``."""
        have = {recipient_id(r) for r in self.before} | {recipient_id(new)}
        return tuple(r for r in self.rule if recipient_id(r) not in have)


@dataclass(frozen=True)
class Reencrypted:
    path: str
    before: tuple[str, ...]
    after: tuple[str, ...]


def recipients(repo: Path, path: str) -> tuple[str, ...]:
    """The age recipients ``path``'s sops metadata names, as the repo's loader reads the file."""
    raw = edits.inside(repo, path).read_bytes()
    return tuple(parse_documents(path, safe_load_all(raw, path)).recipients)


def _rules(sops_text: str) -> list[tuple[str, tuple[str, ...]]]:
    data = safe_load(sops_text.encode(), edits.SOPS_CONFIG) or {}
    out = []
    for rule in data.get("creation_rules") or []:
        age = tuple(a.strip() for a in re.split(r"[,\n]", str(rule.get("age") or "")) if a.strip())
        out.append((str(rule.get("path_regex") or ""), age))
    return out


def plan(repo: Path, sops_text: str, changed: list[str], identity: Path | None) -> list[FilePlan]:
    """The ``secrets/*.yaml`` whose rule (the first that matches, as sops picks it, in
    ``.sops.yaml`` as it will be) is one of ``changed``; every check made before any write: each
    file inside the repo, the operator's identity readable and a recipient of each, sops there."""
    secrets = edits.inside(repo, "secrets")
    files = sorted(f"secrets/{p.name}" for p in secrets.glob("*.yaml")) if secrets.is_dir() else []
    rules = _rules(sops_text)
    out: list[FilePlan] = []
    for path in files:
        rule = next(((regex, age) for regex, age in rules if re.search(regex, path)), None)
        if rule is None or rule[0] not in changed:
            continue
        out.append(FilePlan(path, recipients(repo, path), rule[1]))
    if not out:
        return out
    more = f" (and {len(out) - 1} more)" if len(out) > 1 else ""
    if identity is None:
        raise BadInput(f"--age-identity: the operator's age identity is needed to re-encrypt {out[0].path}{more} "
                       "to the new node")
    mine = recipient_id(keys.age_public(identity))  # readable, private, an age key: said here, not by sops
    for f in out:
        if mine not in {recipient_id(r) for r in f.before}:
            raise BadInput(f"--age-identity {identity}: its recipient {mine[:20]}... is not one of {f.path}'s, "
                           "so sops could not open it: give the identity the file is encrypted to")
    keys.sops_binary()
    return out


def run(repo: Path, files: list[FilePlan], identity: Path) -> list[Reencrypted]:
    """``sops updatekeys`` on each file; what each is encrypted to before and after."""
    sops = keys.sops_binary()
    done = []
    for f in files:
        keys.run(sops, "updatekeys", "--yes", f.path, cwd=repo, env={"SOPS_AGE_KEY_FILE": str(identity.resolve())},
                 subject=f.path)
        done.append(Reencrypted(f.path, f.before, recipients(repo, f.path)))
    return done
