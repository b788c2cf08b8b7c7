"""Verify OpenSSH SSHSIG signatures (``git commit -S`` with ``gpg.format=ssh``) in process.

An armoured signature ("-----BEGIN SSH SIGNATURE-----", base64 split over lines) holds one
blob in SSH wire format (OpenSSH PROTOCOL.sshsig)::

    byte[6] "SSHSIG"  uint32 version=1  string public_key  string namespace
    string reserved  string hash_alg ("sha256"|"sha512")  string signature

The key signs ``"SSHSIG" || string namespace || string reserved || string hash_alg ||
string H(payload)``; ``signature`` is the usual SSH signature (string algorithm, then
algorithm-specific data). Trust comes from an allowed-signers file (ssh-keygen(1), ALLOWED
SIGNERS): ``principal-patterns [options] keytype base64 [comment]``.

Verdicts must agree with ``ssh-keygen -Y verify`` (OpenSSH 9.x sshsig.c is the reference, and
the tests run both on every case), including its odd corners: the file's valid-before second is
still valid but a certificate's is not, and a security key's user-presence flag is not required.
Deliberate differences, all stricter: signature version 0, RSA keys under 2048 bits, DSA, SHA-1
signatures (also by a certificate's CA), webauthn security-key signatures, ed25519 keys of
small order or not canonically encoded and ed25519 signatures whose R is of small order or whose s
is not reduced (libsodium's checks: under the identity point as a key, which ssh-keygen takes, the
signature R = identity, s = 0 verifies for every message) are refused; a
malformed allowed-signers line is an error for the whole file, where ssh-keygen skips it. A
well-formed line of a key type refused on purpose (DSA) or not known here is skipped, as
ssh-keygen skips a line it cannot use, with a warning naming the file and line (said once): a
retired DSA key left in the file must not take every other signer down with it. Times
without "Z" in the file are read as UTC, where ssh-keygen uses the local time zone.

The keys, certificates and the check of one signature blob are ``sshkeys``; here the SSHSIG
envelope and the allowed-signers file, which decide what a signature is worth.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache

from reconciler.core.errors import BadInput
from reconciler.trust.sshkeys import (
    USER_CERT,
    SignatureError,
    SshKey,
    WireReader,
    bad_signature,
    check_signature,
    parse_key,
    wire_string,
)

log = logging.getLogger("reconciler.trust")

_BEGIN = b"-----BEGIN SSH SIGNATURE-----\n"
_END = b"\n-----END SSH SIGNATURE-----"
_HASHES = ("sha256", "sha512")


def _dearmor(armored: bytes) -> bytes:
    if not armored.startswith(_BEGIN):
        raise bad_signature("missing '-----BEGIN SSH SIGNATURE-----' line")
    end = armored.find(_END, len(_BEGIN))
    if end < 0:
        raise bad_signature("missing '-----END SSH SIGNATURE-----' line")
    body = armored[len(_BEGIN) : end].translate(None, b" \t\n\v\f\r")  # a fleet's reader: 10,000 notes
    try:
        blob = binascii.a2b_base64(body, strict_mode=True)
    except binascii.Error:
        raise bad_signature("invalid base64 in signature") from None
    # OpenSSH's decoder refuses non-zero padding bits; without this a flipped bit there would pass here only.
    if base64.b64encode(blob) != body:
        raise bad_signature("non-canonical base64 in signature")
    return blob


@dataclass(frozen=True)
class Signature:
    key_type: str
    key_blob: bytes  # for a certificate, the whole certificate
    namespace: str
    hash_alg: str
    sig_alg: str

    @property
    def fingerprint(self) -> str:
        """Of the signing key; for a certificate, of its key (as ssh-keygen prints it)."""
        return parse_key(self.key_blob).fingerprint

    @property
    def ca_fingerprint(self) -> str | None:
        cert = parse_key(self.key_blob).cert
        return cert.ca.fingerprint if cert else None


def _parse(armored: bytes) -> tuple[Signature, bytes, SshKey]:
    r = WireReader(_dearmor(armored))
    if r.take(6) != b"SSHSIG":
        raise bad_signature("not an SSHSIG signature (bad magic)")
    version = r.u32()
    if version != 1:
        raise bad_signature(f"unsupported SSHSIG version {version}")
    key_blob, namespace = r.string(), r.text()
    r.string()  # reserved
    hash_alg, raw = r.text(), r.string()
    r.done("signature blob")
    if hash_alg not in _HASHES:
        raise bad_signature(f"unknown hash algorithm {hash_alg!r}")
    key = parse_key(key_blob)
    return Signature(key.key_type, key_blob, namespace, hash_alg, WireReader(raw).text()), raw, key


def parse_signature(armored: bytes) -> Signature:
    """Decode an armoured SSHSIG signature without verifying it."""
    return _parse(armored)[0]


def verify(armored: bytes, payload: bytes, namespace: str = "git") -> Signature:
    """Check that ``armored`` is a valid signature of ``payload`` in ``namespace`` by the key it
    names. Says nothing about whether that key is trusted: see ``find_signer``."""
    sig, raw, key = _parse(armored)
    if sig.namespace != namespace:
        raise SignatureError(f"signature is for namespace {sig.namespace!r}, not {namespace!r}", "WRONG_NAMESPACE")
    import hashlib  # when a signature is checked: it loads OpenSSL, 3.5 MB of an idle daemon (issue 40)

    digest = hashlib.new(sig.hash_alg, payload).digest()
    signed = _signed_prefix(namespace, sig.hash_alg) + wire_string(digest)
    check_signature(key, raw, signed)
    return sig


@lru_cache(maxsize=16)
def _signed_prefix(namespace: str, hash_alg: str) -> bytes:
    """What the key signs before the payload's hash: the same for every note of a fleet."""
    return b"SSHSIG" + wire_string(namespace) + wire_string(b"") + wire_string(hash_alg)


def _match_pattern_list(name: str, patterns: str) -> int:
    """OpenSSH match_pattern_list: 1 on a positive match, -1 if a negated pattern matches, else 0.
    Works on bytes because OpenSSH's '?' matches one byte, not one character."""
    subject, pattern = name.encode(), patterns.encode()
    result, i = 0, 0
    while i < len(pattern):  # a trailing comma adds no empty subpattern, a leading one does
        negated = pattern[i : i + 1] == b"!"
        i += negated
        end = pattern.find(b",", i)
        end = len(pattern) if end < 0 else end
        sub, i = pattern[i:end], end + 1
        if len(sub) >= 1023:
            return 0
        # no wildcard: the pattern matches itself only (a fleet's trust/nodes has one such per node,
        # too many for the regex cache)
        if sub == subject if b"*" not in sub and b"?" not in sub else _wildcard(sub).fullmatch(subject):
            if negated:
                return -1
            result = 1
    return result


@lru_cache(maxsize=256)
def _wildcard(sub: bytes) -> re.Pattern[bytes]:
    return re.compile(b"".join(b".*" if c == 42 else b"." if c == 63 else re.escape(bytes([c])) for c in sub), re.S)


@dataclass(frozen=True)
class AllowedSigner:
    principals: tuple[str, ...]
    key_type: str
    key_blob: bytes
    namespaces: tuple[str, ...] | None
    valid_after: datetime | None
    valid_before: datetime | None
    cert_authority: bool
    line: int
    # The bare key's canonical blob, as parsed with the line (b"" for a CA's line): a reader
    # indexing a fleet's 10,000 lines by key would otherwise parse each key again.
    plain_blob: bytes = field(default=b"", compare=False, repr=False)

    @property
    def fingerprint(self) -> str:
        return parse_key(self.key_blob).fingerprint


def _token(text: str) -> tuple[str, str]:
    """One word, part of which may be in double quotes (OpenSSH strdelimw), and the rest."""
    m = re.search(r'[ \t"]', text)
    if m is None:
        return text, ""
    if m.group() != '"':
        return text[: m.start()], text[m.start() :].lstrip(" \t")
    close = text.find('"', m.end())
    if close < 0:
        raise ValueError("unterminated quote")
    return text[: m.start()] + text[m.end() : close], text[close + 1 :].lstrip(" \t")


def _parse_time(value: str) -> datetime:
    m = re.fullmatch(r"(\d{4})(\d\d)(\d\d)(?:(\d\d)(\d\d)(\d\d)?)?(?:Z|UTC)?", value, re.I)
    if m is None:
        raise ValueError(f"invalid time {value!r} (YYYYMMDD[HHMM[SS]][Z])")
    year, month, day, hour, minute, second = (int(g or 0) for g in m.groups())
    try:
        when = datetime(year, month, day, hour, minute, second, tzinfo=UTC)  # local time in OpenSSH without Z
    except ValueError:
        raise ValueError(f"invalid time {value!r}") from None
    if when.timestamp() <= 0:  # 0 means "unset" to OpenSSH
        raise ValueError(f"invalid time {value!r}")
    return when


_Options = tuple[bool, tuple[str, ...] | None, datetime | None, datetime | None]


def _parse_options(text: str) -> tuple[_Options, str]:
    """The comma-separated options at the start of ``text`` (they end at whitespace outside
    quotes), and the rest of it. Names are case-insensitive, values double-quoted."""
    ca, i = False, 0
    values: dict[str, str] = {}
    while True:
        lower = text[i:].lower()
        name = next((n for n in ("namespaces", "valid-after", "valid-before") if lower.startswith(n + "=")), None)
        if lower.startswith("cert-authority"):
            ca, i = True, i + len("cert-authority")
        elif name is None:
            raise ValueError(f"unknown option at {text[i:]!r}")
        else:
            m = re.match(r'"((?:\\"|[^"])*+)"', text[i + len(name) + 1 :])
            if m is None:
                raise ValueError(f"{name} needs a value in double quotes")
            if name in values:
                raise ValueError(f"{name} given twice")
            values[name] = m.group(1).replace('\\"', '"')
            i += len(name) + 1 + m.end()
        if i == len(text) or text[i] in " \t":
            break
        if text[i] != "," or text[i + 1 : i + 2] in ("", " ", "\t"):
            raise ValueError(f"unknown option at {text[i:]!r}")
        i += 1
    after, before = (_parse_time(values[n]) if n in values else None for n in ("valid-after", "valid-before"))
    if after and before and before <= after:
        raise ValueError("valid-before is not after valid-after")
    namespaces = tuple(values["namespaces"].split(",")) if "namespaces" in values else None
    return (ca, namespaces, after, before), text[i:].lstrip(" \t")


# A line as ``public_line`` writes one (each node's in a fleet's trust/nodes): read in one match;
# anything else (other options, quotes, tabs, upper case, a comment) the careful way below.
_PLAIN_LINE = re.compile(r'([^\s"]+) namespaces="([^"\\]*)" ([^\s]+) ([^\s]+)')


def _parse_line(text: str, n: int) -> AllowedSigner:
    m = _PLAIN_LINE.fullmatch(text)
    if m is None:
        return _parse_line_careful(text, n)
    principal, namespaces, key_type, encoded = m.groups()
    key, blob = _key_of(key_type, encoded)
    return AllowedSigner(tuple(principal.split(",")), key.key_type, blob, tuple(namespaces.split(",")),
                         None, None, False, n, key.plain_blob)


def _parse_line_careful(text: str, n: int) -> AllowedSigner:
    principals, rest = _token(text)
    first = rest.split(None, 1)[0] if rest else ""
    options: _Options = (False, None, None, None)
    # OpenSSH reads the word as a key type first and as options only if that fails; no key type
    # contains these characters or is "cert-authority".
    if first.lower().startswith("cert-authority") or any(c in first for c in '=,"'):
        options, rest = _parse_options(rest)
    words = rest.split(None, 2)
    if len(words) < 2:
        raise ValueError("missing key")
    key, blob = _key_of(words[0], words[1])
    ca, namespaces, after, before = options
    return AllowedSigner(tuple(principals.split(",")), key.key_type, blob, namespaces, after, before, ca, n,
                         b"" if ca else key.plain_blob)


def public_key_fingerprint(line: str) -> str:
    """The fingerprint of an SSH public key written as ``TYPE BASE64 [COMMENT]`` (an
    ``authorized_keys`` or ``.pub`` line); ValueError if it is not one."""
    words = line.split(None, 2)
    if len(words) < 2:
        raise ValueError(f"{line[:60]!r}")
    return _key_of(words[0], words[1])[0].fingerprint


class RefusedKeyType(ValueError):
    """A well-formed key of a type refused on purpose (DSA) or not known here."""


def _key_of(key_type: str, base64: str) -> tuple[SshKey, bytes]:
    """The key written as ``TYPE BASE64`` (and its blob); ValueError saying why it is not one,
    ``RefusedKeyType`` when it is one of a type this verifier does not take."""
    try:
        blob = binascii.a2b_base64(base64, strict_mode=True)
        key = parse_key(blob)
    except SignatureError as exc:
        if exc.reason in ("WEAK_ALGORITHM", "UNSUPPORTED_KEY"):
            raise RefusedKeyType(str(exc)) from None
        raise ValueError(f"invalid {key_type} key: {exc}") from None
    except binascii.Error as exc:
        raise ValueError(f"invalid {key_type} key: {exc}") from None
    if key.key_type != key_type:
        raise ValueError(f"the key is {key.key_type}, not {key_type}")
    return key, blob


# The skipped lines warned about so far, (file, line, text): a root is read again on every
# rotation and by every command, the warning is said once a process.
_SKIPPED: set[tuple[str, int, str]] = set()
_SKIPPED_AT_MOST = 1000


def parse_allowed_signers(text: str, file: str) -> tuple[AllowedSigner, ...]:
    """Parse an allowed-signers file; any malformed line is a ``BadInput`` naming it, and a line
    of a key type refused on purpose is skipped with a warning (see the module's docstring)."""
    signers = []
    for n, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip(" \t\r")
        if not line or line.startswith("#"):
            continue
        try:
            signers.append(_parse_line(line, n))
        except RefusedKeyType as exc:
            if (file, n, line) not in _SKIPPED:
                if len(_SKIPPED) >= _SKIPPED_AT_MOST:
                    _SKIPPED.clear()
                _SKIPPED.add((file, n, line))
                log.warning("%s:%d: allowed signers: %s: line skipped", file, n, exc)
        except ValueError as exc:
            raise BadInput(f"allowed signers: {exc}", file=file, line=n) from None
    return tuple(signers)


def find_signer(
    signers: Sequence[AllowedSigner], sig: Signature, principal: str, at: datetime, namespace: str = "git"
) -> AllowedSigner:
    """The first entry that lets ``principal`` sign in ``namespace`` at time ``at`` with the key
    of ``sig`` (call ``verify`` first), as ``ssh-keygen -Y verify -I principal`` decides. ``at`` is
    the verifier's clock and must be timezone-aware (a naive one is a ``ValueError``)."""
    if at.tzinfo is None:
        raise ValueError("find_signer needs a timezone-aware time")
    now = int(at.timestamp())  # OpenSSH compares whole seconds
    key = parse_key(sig.key_blob)
    problem: SignatureError | None = None
    elsewhere = False
    for entry in signers:
        if entry.cert_authority:
            ca = parse_key(entry.key_blob)
            if key.cert is None or key.cert.ca.plain_blob != ca.plain_blob:
                continue
        else:
            # a line's key as parsed with it (one parse a note, not two, for a fleet's reader)
            listed = (entry.key_type, entry.plain_blob) if entry.plain_blob else _type_and_plain(entry.key_blob)
            if listed[0] != key.key_type or (
                listed[1] != key.plain_blob if key.cert is None else entry.key_blob != sig.key_blob
            ):
                continue
        if _match_pattern_list(principal, ",".join(entry.principals)) != 1:
            elsewhere = True
            continue
        found = _entry_problem(entry, key, principal, now, namespace)
        if found is None:
            return entry
        problem = problem or found
    if problem is not None:
        raise problem
    if elsewhere:
        raise SignatureError(f"key {key.fingerprint} is not allowed to sign as {principal!r}", "WRONG_PRINCIPAL")
    raise SignatureError(f"key {key.fingerprint} is not in the allowed signers", "UNTRUSTED_KEY")


def _type_and_plain(blob: bytes) -> tuple[str, bytes]:
    key = parse_key(blob)
    return key.key_type, key.plain_blob


def _entry_problem(entry: AllowedSigner, key: SshKey, principal: str, now: int,
                   namespace: str) -> SignatureError | None:
    where = f"allowed signers line {entry.line}"
    cert = key.cert
    if entry.cert_authority and cert is not None:
        # OpenSSH's certificate window is [after, before) while the file's is [after, before].
        if cert.cert_type != USER_CERT:
            return SignatureError(f"{where}: certificate is not a user certificate", "UNTRUSTED_KEY")
        if now < cert.valid_after:
            return SignatureError(f"{where}: certificate is not yet valid", "KEY_NOT_YET_VALID")
        if now >= cert.valid_before:
            return SignatureError(f"{where}: certificate has expired", "KEY_EXPIRED")
        if principal not in cert.principals:
            return SignatureError(f"{where}: certificate does not name {principal!r}", "WRONG_PRINCIPAL")
    if entry.namespaces is not None and _match_pattern_list(namespace, ",".join(entry.namespaces)) != 1:
        return SignatureError(f"{where}: key may not sign in namespace {namespace!r}", "WRONG_NAMESPACE")
    if entry.valid_after is not None and now < int(entry.valid_after.timestamp()):
        return SignatureError(f"{where}: key is valid from {entry.valid_after:%Y-%m-%d %H:%M:%SZ}", "KEY_NOT_YET_VALID")
    if entry.valid_before is not None and now > int(entry.valid_before.timestamp()):
        return SignatureError(f"{where}: key expired at {entry.valid_before:%Y-%m-%d %H:%M:%SZ}", "KEY_EXPIRED")
    return None
