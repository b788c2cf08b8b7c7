"""The deployment repo's SOPS files (``secrets/*.yaml``) as committed, and as a node opened them.

Parsing here is the metadata only (recipients, MAC, the suffix and regex rules): what loading
the repo needs to check a file and keep it, still encrypted, in ``DeploymentRepo.secret_files``.
Decrypting, and the format's details, are ``render.secrets``'s (above the repo: it needs keys).
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from reconciler.core.errors import InvalidRepo


@dataclass(frozen=True)
class SopsFile:
    """One ``secrets/*.yaml`` as committed: encrypted values and their metadata, no key needed."""

    path: str
    tree: Mapping[str, Any]  # the document without ``sops``: values still ENC[...]
    recipients: Mapping[str, str]  # age public key -> the data key encrypted to it (armored)
    lastmodified: str
    mac: str
    unencrypted_suffix: str = ""
    encrypted_suffix: str = ""
    unencrypted_regex: str = ""
    encrypted_regex: str = ""
    mac_only_encrypted: bool = False

    @property
    def names(self) -> tuple[str, ...]:
        """The secrets this file defines (top-level keys: ``secrets.<name>`` in templates)."""
        return tuple(sorted(self.tree))


def _rfc3339(value: Any) -> str:
    """``lastmodified`` as SOPS formats it for the MAC's additional data (Go's RFC3339, UTC)."""
    if isinstance(value, datetime.datetime):
        value = value.astimezone(datetime.UTC) if value.tzinfo else value.replace(tzinfo=datetime.UTC)
        return str(value.strftime("%Y-%m-%dT%H:%M:%SZ"))
    return str(value)


def parse(path: str, data: Any) -> SopsFile:
    """A loaded YAML document as a SOPS file, or InvalidRepo naming ``path``."""
    if not isinstance(data, dict) or not isinstance(data.get("sops"), dict):
        raise InvalidRepo("not a SOPS file (no sops: metadata); encrypt it with `sops --encrypt --in-place`",
                          file=path)
    meta = data["sops"]
    if meta.get("key_groups") or meta.get("shamir_threshold"):
        raise InvalidRepo("sops key_groups / shamir_threshold are not supported: list age recipients only", file=path)
    recipients: dict[str, str] = {}
    for entry in meta.get("age") or ():
        if not isinstance(entry, dict) or not isinstance(entry.get("recipient"), str) \
                or not isinstance(entry.get("enc"), str):
            raise InvalidRepo("sops.age: each entry needs a recipient and an enc", file=path)
        recipients[entry["recipient"]] = entry["enc"]
    if not recipients:
        raise InvalidRepo("no age recipient in sops metadata (PGP, KMS and Vault keys are not supported)", file=path)
    if not isinstance(meta.get("mac"), str) or "lastmodified" not in meta:
        raise InvalidRepo("sops metadata lacks mac or lastmodified", file=path)
    tree = {k: v for k, v in data.items() if k != "sops"}
    for key in tree:
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise InvalidRepo(f"secret name {key!r} is not an identifier (templates read secrets.<name>)", file=path)
    return SopsFile(
        path=path, tree=tree, recipients=recipients, lastmodified=_rfc3339(meta["lastmodified"]), mac=meta["mac"],
        unencrypted_suffix=str(meta.get("unencrypted_suffix") or ""),
        encrypted_suffix=str(meta.get("encrypted_suffix") or ""),
        unencrypted_regex=str(meta.get("unencrypted_regex") or ""),
        encrypted_regex=str(meta.get("encrypted_regex") or ""),
        mac_only_encrypted=bool(meta.get("mac_only_encrypted")),
    )


@dataclass(frozen=True)
class Opened:
    """A SOPS file this node decrypted: its values, and the key its secret files are hashed with."""

    values: Mapping[str, Any]
    # HMAC-SHA256 of ``render.secrets.HASH_LABEL`` under the file's data key: what hashes a rendered file that
    # holds one of these values (``FileSpec.key``). A plain SHA-256 of such a file, printed in a
    # note or a review, would let anyone who reads the repo try passwords against it offline;
    # keyed, it cannot be checked without the data key. Derived from the data key, not the node's
    # own: every recipient hashes alike, it changes exactly when sops makes a new data key
    # (``--rotate``, when the values' ciphertext, and so a reviewer's markers, change too), and a
    # key's leak (the agent keeps it in its private records, for drift) opens no value.
    hash_key: bytes = field(repr=False)
