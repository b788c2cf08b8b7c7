"""The deployment repo's SOPS files (``secrets/*.yaml``) as committed, and as a node opened them.

Parsing here is the metadata and the form of the values (recipients, MAC, the suffix and regex
rules, each value an ``ENC[...]`` of a type SOPS writes): what loading the repo needs to check a
file and keep it, still encrypted, in ``DeploymentRepo.secret_files``. Every check that needs no
key is here, so ``validate`` refuses what a node would. Decrypting is ``render.secrets``'s
(above the repo: it needs keys).
"""

from __future__ import annotations

import base64
import binascii
import datetime
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from reconciler.core.errors import InvalidRepo

ENC = re.compile(r"^ENC\[AES256_GCM,data:(.*),iv:(.+),tag:(.+),type:(.+)\]$", re.S)
# What SOPS writes after ``type:`` in a YAML file (aes/cipher.go; ``comment`` values are YAML
# comments, which are neither read nor authenticated here).
TYPES = frozenset({"str", "int", "float", "bool", "bytes", "time"})
# The recipients age (and so a node) can decrypt to: X25519 keys, and ssh keys through agessh
# (ssh-ed25519 and ssh-rsa: what pyrage.ssh reads).
_AGE = re.compile(r"age1[02-9ac-hj-np-z]{58}")
_SSH = re.compile(r"(ssh-ed25519|ssh-rsa) ([A-Za-z0-9+/]+={0,2})")
_TIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)[Tt ](\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?([Zz]|[+-]\d\d:\d\d)?")
# sops' rules for which values it encrypts: at most one, ``unencrypted_suffix: _unencrypted`` when none
# (stores.go, Metadata.ToInternal)
RULES = ("unencrypted_suffix", "encrypted_suffix", "unencrypted_regex", "encrypted_regex")


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


def go_time(value: Any, nano: bool = True) -> str:
    """A time as Go formats it (``time.RFC3339Nano``, or ``RFC3339`` without ``nano``): what SOPS
    encrypts and authenticates for a ``type:time`` value, and what ``sops -d`` prints for it; a
    time without a zone is UTC, as yaml.v3 reads it. ValueError for text that is not one."""
    if isinstance(value, datetime.datetime):
        offset = value.utcoffset() or datetime.timedelta(0)
        digits = f"{value.microsecond:06d}"
    elif isinstance(value, datetime.date):
        value, offset, digits = datetime.datetime(value.year, value.month, value.day), datetime.timedelta(0), ""
    else:
        m = _TIME.fullmatch(str(value))
        if m is None:
            raise ValueError("not an RFC 3339 time")
        zone = (m[8] or "Z").upper()
        sign = -1 if zone.startswith("-") else 1
        offset = datetime.timedelta(0) if zone == "Z" else sign * datetime.timedelta(hours=int(zone[1:3]),
                                                                                     minutes=int(zone[4:6]))
        y, mo, d, h, mi, sec = (int(m[i]) for i in range(1, 7))
        value = datetime.datetime(y, mo, d, h, mi, sec)  # ValueError: a 13th month
        digits = m[7] or ""
    text: str = value.strftime("%Y-%m-%dT%H:%M:%S")
    fraction = digits.rstrip("0")
    if nano and fraction:
        text += "." + fraction
    if not offset:
        return text + "Z"
    minutes = int(offset.total_seconds()) // 60
    return text + f"{'-' if minutes < 0 else '+'}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def recipient_id(recipient: str) -> str:
    """A recipient as compared: an ssh public key without its comment (``.sops.yaml`` and an
    inventory's ``age_recipient`` may each carry one, or not)."""
    fields = recipient.split()
    return " ".join(fields[:2]) if fields and fields[0].startswith("ssh-") else recipient.strip()


def _recipient_problem(recipient: str) -> str | None:
    if _AGE.fullmatch(recipient):
        return None
    m = _SSH.fullmatch(recipient)
    try:
        blob = base64.b64decode(m[2], validate=True) if m else b""
    except binascii.Error:
        blob = b""
    kind = m[1].encode() if m else b""
    if m and blob[:4] == len(kind).to_bytes(4, "big") and blob[4:4 + len(kind)] == kind:
        return None
    return f"sops.age: {recipient[:60]!r} is not an age recipient (age1..., ssh-ed25519 or ssh-rsa)"


def enc_problem(value: str) -> str | None:
    """What is wrong with an ``ENC[...]`` value that no key can change (its form, its type):
    found by ``validate`` without a key, as every node would find it."""
    m = ENC.match(value)
    if m is None:
        return "not an ENC[AES256_GCM,...] value"
    if m[4] not in TYPES:
        return f"a value of type {m[4][:20]} that SOPS would not write"
    try:
        _, iv, tag = (base64.b64decode(m[i], validate=True) for i in (1, 2, 3))
    except binascii.Error:
        return "an ENC[...] value that is not base64"
    if not 8 <= len(iv) <= 128 or len(tag) != 16:
        return "an ENC[...] value with a malformed iv or tag"
    return None


def encrypted_at(f: SopsFile, path: list[str]) -> bool:
    """Whether SOPS encrypted the value at ``path`` (sops.go, Tree.shouldBeEncrypted)."""
    encrypted = True
    if f.unencrypted_suffix and any(p.endswith(f.unencrypted_suffix) for p in path):
        encrypted = False
    if f.encrypted_suffix:
        encrypted = any(p.endswith(f.encrypted_suffix) for p in path)
    if f.unencrypted_regex and any(re.search(f.unencrypted_regex, p) for p in path):
        encrypted = False
    if f.encrypted_regex:
        encrypted = any(re.search(f.encrypted_regex, p) for p in path)
    return encrypted


def leaves(value: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
    """Leaves in document order, each with its SOPS path (list items share their list's)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from leaves(v, [*path, str(k)])
    elif isinstance(value, list):
        for v in value:
            yield from leaves(v, path)
    elif value is not None:
        yield path, value


def _check_values(f: SopsFile) -> None:
    """Every value SOPS encrypts is an ``ENC[...]`` of a type it writes: what a node would refuse
    after decrypting, refused before (and without a key, in ``validate``)."""
    for path, value in leaves(dict(f.tree), []):
        if not encrypted_at(f, path) or value == "":
            continue
        where = ".".join(path)
        if not isinstance(value, str):
            raise InvalidRepo(f"{where}: a plain value where SOPS writes ENC[...]", file=f.path)
        problem = enc_problem(value)
        if problem:
            raise InvalidRepo(f"{where}: {problem}", file=f.path)


def parse(path: str, data: Any) -> SopsFile:
    """A loaded YAML document as a SOPS file, or InvalidRepo naming ``path``."""
    return parse_documents(path, [data])


def _merged(path: str, docs: list[Any]) -> dict[str, Any]:
    """The names of every document of the file (``sops`` dropped from each, as sops reads only
    the first's): ``secrets.<name>`` is one namespace, so a name in two documents is refused.
    In document order, which is the order SOPS authenticates them in."""
    tree: dict[str, Any] = {}
    where: dict[str, int] = {}
    for n, doc in enumerate(docs, 1):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise InvalidRepo(f"document {n} of the file is not a mapping of secret names", file=path)
        for key, value in doc.items():
            if key == "sops":
                continue
            if key in where:
                raise InvalidRepo(f"secret {key} is defined in documents {where[key]} and {n} of the file", file=path)
            tree[key], where[key] = value, n
    return tree


def _version_problem(meta: Mapping[str, Any]) -> str | None:
    version = meta.get("version")
    if version is None:
        return "sops metadata lacks version"
    if not re.fullmatch(r"3(\.\d+)*", str(version)):
        return f"written by sops {str(version)[:20]}: only files of sops 3 are read"
    return None


def parse_documents(path: str, docs: list[Any]) -> SopsFile:
    """A SOPS file's YAML documents (one, or several ``---``-separated: sops encrypts each, under
    one data key and one MAC, its metadata in the first) as a SOPS file, or InvalidRepo naming
    ``path``. Every check that needs no key is made here: ``validate`` refuses what a node would."""
    data = docs[0] if docs else None
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
        problem = _recipient_problem(recipient_id(entry["recipient"]))
        if problem:
            raise InvalidRepo(problem, file=path)
        if not entry["enc"].lstrip().startswith("-----BEGIN AGE ENCRYPTED FILE-----"):
            raise InvalidRepo(f"sops.age: the enc of {entry['recipient'][:60]!r} is not an armored age file",
                              file=path)
        recipients[recipient_id(entry["recipient"])] = entry["enc"]
    if not recipients:
        raise InvalidRepo("no age recipient in sops metadata (PGP, KMS and Vault keys are not supported)", file=path)
    if not isinstance(meta.get("mac"), str) or "lastmodified" not in meta:
        raise InvalidRepo("sops metadata lacks mac or lastmodified", file=path)
    problem = enc_problem(meta["mac"])
    if problem or not meta["mac"].endswith(",type:str]"):
        raise InvalidRepo(f"sops.mac: {problem or 'not a MAC as SOPS writes it (type:str)'}", file=path)
    try:
        lastmodified = go_time(meta["lastmodified"], nano=False)
    except ValueError:
        raise InvalidRepo("sops.lastmodified: not an RFC 3339 time", file=path) from None
    problem = _version_problem(meta)
    if problem:
        raise InvalidRepo(problem, file=path)
    for rule in ("unencrypted_comment_regex", "encrypted_comment_regex"):
        if meta.get(rule):
            raise InvalidRepo(f"sops {rule} is not supported (comments are not read): use a key suffix or regex",
                              file=path)
    rules = [r for r in RULES if meta.get(r)]
    if len(rules) > 1:
        raise InvalidRepo(f"sops metadata sets {' and '.join(rules)}: sops allows one of them", file=path)
    for rule in ("unencrypted_regex", "encrypted_regex"):
        try:
            re.compile(str(meta.get(rule) or ""))
        except re.error as exc:
            raise InvalidRepo(f"sops {rule}: not a regular expression ({exc})", file=path) from None
    tree = _merged(path, docs)
    for key in tree:
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise InvalidRepo(f"secret name {key!r} is not an identifier (templates read secrets.<name>)", file=path)
    f = SopsFile(
        path=path, tree=tree, recipients=recipients, lastmodified=lastmodified, mac=meta["mac"],
        unencrypted_suffix=str(meta.get("unencrypted_suffix") or ("" if rules else "_unencrypted")),
        encrypted_suffix=str(meta.get("encrypted_suffix") or ""),
        unencrypted_regex=str(meta.get("unencrypted_regex") or ""),
        encrypted_regex=str(meta.get("encrypted_regex") or ""),
        mac_only_encrypted=bool(meta.get("mac_only_encrypted")),
    )
    _check_values(f)
    return f


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
