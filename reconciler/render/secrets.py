"""SOPS files of the deployment repo (``secrets/*.yaml``), read without the ``sops`` binary.

Pure: bytes and keys in, values out; no file is opened here (the agent reads the identity file,
the repo loader reads the SOPS files from the tree). What the format is, as SOPS writes it:

- every leaf value is ``ENC[AES256_GCM,data:<b64>,iv:<b64>,tag:<b64>,type:<str|int|float|bool|bytes|time>]``:
  AES-256-GCM under the file's data key, 32-byte nonce, the tag apart, and as additional data
  the path of mapping keys to the value joined with ``:`` plus a trailing ``:`` (a list item
  has its list's path; indexes are not part of it);
- ``sops.age``: one entry per recipient, ``enc`` the data key age-encrypted to it (armored); a
  recipient is an age X25519 key or an ssh public key (ssh-ed25519, ssh-rsa), opened with the
  ssh private key as the identity;
- ``sops.mac``: SHA-512 over every value's plaintext in document order, upper-case hex,
  encrypted like a value with ``sops.lastmodified`` as additional data: a value swapped,
  removed or added without the data key is refused.

A ``type:time`` value (an unquoted date or timestamp) is the text ``sops -d`` prints for it (Go's
RFC 3339, e.g. ``2027-01-01T00:00:00Z``); a file of several YAML documents is the names of all
of them (see ``repo.sops``).

Handled: YAML files, age recipients, ``unencrypted_suffix``/``encrypted_suffix`` and their
regex forms, ``mac_only_encrypted``. Not handled (refused with a clear error): PGP, KMS and
Vault keys without an age recipient, ``key_groups`` with Shamir thresholds, the comment regex
rules, JSON/INI/dotenv stores. A value never appears in an error raised here.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import hashlib
import hmac
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reconciler.core.errors import BadInput
from reconciler.repo.sops import ENC, Opened, SopsFile, encrypted_at, go_time, leaves

# The constant SOPS feeds the MAC first when only encrypted values are authenticated, so the two
# kinds of MAC never coincide (sops.go, MACOnlyEncryptedInitialization).
# pyrage and cryptography are imported where a file is opened: the render imports this module
# for its names, and a node whose repo has no secrets never loads them (11 ms of a change's
# first pass, issue 40).
MAC_ONLY_ENCRYPTED_INIT = bytes.fromhex("8a3fd2ad54ce66527b1034f3d147be0b0b975b3bf44f72c6fdadec8176f27d69")


class SecretUnreadable(BadInput):
    """This node cannot decrypt a secret it needs: not a recipient (any more), or the file does
    not verify. Permanent until a new commit: the node keeps running what it has."""

    reason = "SECRET_UNREADABLE"


@dataclass(frozen=True)
class AgeKey:
    """One identity a node decrypts with, and the recipient it opens (as ``repo.sops.recipient_id``)."""

    identity: Any  # pyrage.x25519.Identity or pyrage.ssh.Identity
    recipient: str

    def __repr__(self) -> str:
        return f"AgeKey({self.recipient})"  # never the private key

    def to_public(self) -> str:
        return self.recipient


def identities(text: str, file: str) -> tuple[AgeKey, ...]:
    """The identities of an identity file: ``age-keygen``'s format (comments, one key a line), or
    an OpenSSH private key (ed25519 or rsa, no passphrase), as ``age -i`` and sops read them."""
    import pyrage

    if "-----BEGIN" in text:
        return (_ssh_identity(text, file),)
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            key = pyrage.x25519.Identity.from_str(line)
            out.append(AgeKey(key, str(key.to_public())))
        except pyrage.IdentityError:
            # The line is a private key, or meant to be one: never echo it.
            raise BadInput("not an age identity (AGE-SECRET-KEY-1...)", file=file, line=n) from None
    if not out:
        raise BadInput("no age identity in the file", file=file)
    return tuple(out)


def _ssh_identity(text: str, file: str) -> AgeKey:
    """An OpenSSH private key as an age identity; its public key (derived here: pyrage's ssh
    identity does not say it) is the recipient it opens. Never echoes the key."""
    import pyrage
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat, load_ssh_private_key

    data = text.encode()
    try:
        private = load_ssh_private_key(data, password=None)
    except TypeError:
        raise BadInput("an ssh key with a passphrase: the agent cannot type it; use a key without one, "
                       "readable by its owner only", file=file) from None
    except (ValueError, UnsupportedAlgorithm):
        raise BadInput("neither an age identity (AGE-SECRET-KEY-1...) nor an OpenSSH private key", file=file) from None
    public = private.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()
    kind = public.split()[0]
    if kind not in ("ssh-ed25519", "ssh-rsa"):
        raise BadInput(f"an ssh key of type {kind}: age reads ssh-ed25519 and ssh-rsa keys only", file=file)
    try:
        identity = pyrage.ssh.Identity.from_buffer(data)
    except pyrage.IdentityError:
        raise BadInput(f"an ssh key of type {kind} that age cannot read", file=file) from None
    return AgeKey(identity, public)


def public_keys(keys: Iterable[AgeKey]) -> frozenset[str]:
    return frozenset(k.recipient for k in keys)


def _open(f: SopsFile, value: str, key: bytes, aad: str, where: str) -> tuple[bytes, str]:
    """(plaintext, type) of one ENC[...] value; SecretUnreadable naming the file and key path."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    m = ENC.match(value)
    if m is None:
        raise SecretUnreadable(f"{where}: not an ENC[AES256_GCM,...] value", file=f.path)
    try:
        data, iv, tag = (base64.b64decode(m[i], validate=True) for i in (1, 2, 3))
        return AESGCM(key).decrypt(iv, data + tag, aad.encode()), m[4]
    except (binascii.Error, ValueError, InvalidTag):
        raise SecretUnreadable(f"{where}: does not decrypt with the file's data key (tampered?)", file=f.path) from None


def _typed(plain: bytes, kind: str, f: SopsFile, where: str) -> tuple[Any, bytes]:
    """The value as its type, and the bytes the MAC takes for it (SOPS' ToBytes)."""
    text = plain.decode("utf-8", errors="strict") if kind != "bytes" else ""
    try:
        if kind == "str":
            return text, plain
        if kind == "bytes":
            return plain, plain
        if kind == "int":
            return int(text), str(int(text)).encode()
        if kind == "float":
            return float(text), plain
        if kind == "bool":
            # strconv.ParseBool's spellings; the MAC takes Python's own True/False, as SOPS does.
            b = {"1": True, "t": True, "true": True, "0": False, "f": False, "false": False}[text.lower()]
            return b, str(b).encode()
        if kind == "time":
            # The text sops -d prints (Go's RFC3339Nano), and what its MAC takes (time.MarshalText).
            when = go_time(text)
            return when, when.encode()
    except (KeyError, ValueError):
        pass
    raise SecretUnreadable(f"{where}: a value of type {kind} that SOPS would not write", file=f.path)


def _plain_bytes(value: Any) -> bytes:
    """SOPS' ToBytes for a value left unencrypted (``*_unencrypted`` keys)."""
    if isinstance(value, bool):
        return b"True" if value else b"False"
    if isinstance(value, bytes):
        return value
    if isinstance(value, datetime.datetime | datetime.date):
        return go_time(value).encode()  # time.MarshalText, not Python's isoformat
    return str(value).encode()


def data_key(f: SopsFile, keys: Iterable[AgeKey]) -> bytes | None:
    """The file's data key, if one of ``keys`` is among its recipients; None otherwise."""
    import pyrage

    keys = tuple(keys)
    mine = public_keys(keys)
    for recipient, enc in sorted(f.recipients.items()):
        if recipient not in mine:
            continue
        try:
            key: bytes = pyrage.decrypt(enc.encode(), [k.identity for k in keys])
        except pyrage.DecryptError:
            raise SecretUnreadable(f"the data key for {recipient} does not decrypt with this node's identity",
                                   file=f.path) from None
        if len(key) != 32:
            raise SecretUnreadable("the data key is not 32 bytes", file=f.path)
        return key
    return None


def decrypt(f: SopsFile, key: bytes) -> dict[str, Any]:
    """The file's values, the MAC checked. SecretUnreadable if anything does not verify."""
    mac = hashlib.sha512()
    if f.mac_only_encrypted:
        mac.update(MAC_ONLY_ENCRYPTED_INIT)

    def walk(value: Any, path: list[str]) -> Any:
        if isinstance(value, dict):
            return {k: walk(v, [*path, str(k)]) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, path) for v in value]
        if value is None:
            return None
        encrypted = encrypted_at(f, path)
        where = ".".join(path)
        if encrypted and value == "":
            out, raw = "", b""  # SOPS leaves an empty string as it is
        elif encrypted:
            if not isinstance(value, str):
                raise SecretUnreadable(f"{where}: a plain value where SOPS writes ENC[...]", file=f.path)
            plain, kind = _open(f, value, key, ":".join(path) + ":", where)
            out, raw = _typed(plain, kind, f, where)
        else:
            raw = _plain_bytes(value)
            # a time left plain reads as sops -d prints it, like an encrypted one
            out = raw.decode() if isinstance(value, datetime.date) else value
        if encrypted or not f.mac_only_encrypted:
            mac.update(raw)
        return out

    values = {k: walk(v, [k]) for k, v in f.tree.items()}
    stored, kind = _open(f, f.mac, key, f.lastmodified, "sops.mac")
    if kind != "str" or stored.decode(errors="replace") != mac.hexdigest().upper():
        raise SecretUnreadable("MAC mismatch: the file was changed without its data key", file=f.path)
    return values


# What the key of a secret file's hash is derived with (HMAC of this under the file's data key).
HASH_LABEL = b"reconciler: hash of a rendered file that holds a secret, v1"


def open_files(files: Mapping[str, SopsFile], keys: Iterable[AgeKey]) -> dict[str, Opened]:
    """Path -> the opened file, for every file encrypted to one of ``keys``; the others are left
    alone (another group's secrets: this node never holds them)."""
    keys = tuple(keys)
    out = {}
    for path in sorted(files):
        key = data_key(files[path], keys)
        if key is not None:
            out[path] = Opened(decrypt(files[path], key), hmac.new(key, HASH_LABEL, hashlib.sha256).digest())
    return out


def unlock(files: Mapping[str, SopsFile], keys: Iterable[AgeKey]) -> dict[str, dict[str, Any]]:
    """Path -> values of every file encrypted to one of ``keys`` (see ``open_files``)."""
    return {path: dict(f.values) for path, f in open_files(files, keys).items()}


def file_key(hash_keys: Sequence[bytes]) -> bytes:
    """The key that hashes a rendered file holding values of these files (``Opened.hash_key``,
    in path order); b"" for none: a file with no value in it hashes plain."""
    if len(hash_keys) <= 1:
        return hash_keys[0] if hash_keys else b""
    return hmac.new(b"".join(hash_keys), HASH_LABEL, hashlib.sha256).digest()


def placeholders(f: SopsFile) -> dict[str, Any]:
    """What a reviewer's render (no key) sees instead of values: a marker per leaf naming it,
    with a short hash of its ciphertext. SOPS keeps a value's nonce when an edit leaves it
    unchanged, so an unchanged secret keeps its marker and a changed one shows as changed."""

    def walk(value: Any, path: list[str]) -> Any:
        if isinstance(value, dict):
            return {k: walk(v, [*path, str(k)]) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, path) for v in value]
        digest = hashlib.sha256(str(value).encode()).hexdigest()[:12]
        return f"<secret {'.'.join(path)} {digest}>"

    return {k: walk(v, [k]) for k, v in f.tree.items()}


def named_values(values: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(dotted name, value as text) of every leaf, for telling where a value is and never what;
    not the empty ones (an empty text is in every text)."""
    for path, value in leaves(dict(values), []):
        if str(value):
            yield ".".join(path), str(value)


def secret_values(opened: Mapping[str, Opened] | None) -> Iterator[tuple[str, str, str]]:
    """(file, dotted name, value as text) of every value of the opened files (an unlocked repo's
    ``unlocked``, or ``open_files``; None: none opened), in path order: the one list of what must
    never show. The agent cleans every output it captures of these (``core.redact.Redactor``),
    a review looks for them in the repo's plain text."""
    files = opened or {}
    for path in sorted(files):
        for name, text in named_values(files[path].values):
            yield path, name, text
