"""A ref of the node's mirror read from its files, without loading libgit2.

An idle agent reads two refs on every poll (its branch and its notes ref) and nothing else of
the mirror through pygit2; pygit2 with its libgit2 and OpenSSL is ~19 MB of an idle agent's
RSS (issue 17). The plain cases are read here as git's "files" ref storage keeps them: a loose
ref file that holds an object id, else that name's line in ``packed-refs``. Anything else (a
symbolic ref, a file git would call a broken ref, another ref storage) raises ``NotPlain`` and
the caller asks pygit2, which says what it always said.
"""

from __future__ import annotations

import re
from pathlib import Path

# Where each node's notes live: refs/notes/reconciler/<node>, one ref a node, which only that
# node writes (a server can enforce it: contrib/git-server).
NOTES_PREFIX = "refs/notes/reconciler/"

_OID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # SHA-1 or SHA-256 repositories


class NotPlain(Exception):
    """The ref's files do not say plainly where it points (or that it is absent)."""


def read_ref(git_dir: Path, name: str) -> str | None:
    """The object id ``name`` points at; None when neither a loose file nor ``packed-refs``
    has it. Loose first: a loose ref overrides its packed line, and ``git pack-refs`` writes
    ``packed-refs`` before it deletes the loose files, so this order never misses a ref."""
    if (git_dir / "reftable").exists():
        raise NotPlain("reftable ref storage")
    try:
        text = (git_dir / name).read_text(encoding="ascii")
    except FileNotFoundError:
        pass
    except (OSError, UnicodeDecodeError) as exc:
        raise NotPlain(str(exc)) from None
    else:
        oid = text.removesuffix("\n")
        if not _OID.fullmatch(oid):
            raise NotPlain(f"{name} is not a plain object id")
        return oid
    try:
        packed = (git_dir / "packed-refs").read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise NotPlain(str(exc)) from None
    for line in packed.splitlines():
        oid, sep, ref = line.partition(" ")
        if sep and ref == name:
            if not _OID.fullmatch(oid):
                raise NotPlain(f"packed {name} is not a plain object id")
            return oid
    return None
