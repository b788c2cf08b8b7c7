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
signatures (also by a certificate's CA) and webauthn security-key signatures are refused; a
malformed allowed-signers line is an error for the whole file, where ssh-keygen skips it. Times
without "Z" in the file are read as UTC, where ssh-keygen uses the local time zone.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where a signature is checked: an idle agent never loads OpenSSL's bindings
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from reconciler.core.errors import BadInput, ReconcilerError

_BEGIN = b"-----BEGIN SSH SIGNATURE-----\n"
_END = b"\n-----END SSH SIGNATURE-----"
_HASHES = ("sha256", "sha512")
_CERT_SUFFIX = "-cert-v01@openssh.com"
_RSA_ALGORITHMS = ("rsa-sha2-256", "rsa-sha2-512")
_POINT_BYTES = {"nistp256": 65, "nistp384": 97, "nistp521": 133}  # uncompressed: 0x04, x, y
# Key type -> ECDSA curve name in the blob ("" for other kinds). sk-* are FIDO security keys.
_KEY_TYPES = {
    "ssh-ed25519": "",
    "sk-ssh-ed25519@openssh.com": "",
    "ssh-rsa": "",
    "ecdsa-sha2-nistp256": "nistp256",
    "ecdsa-sha2-nistp384": "nistp384",
    "ecdsa-sha2-nistp521": "nistp521",
    "sk-ecdsa-sha2-nistp256@openssh.com": "nistp256",
}
_MIN_RSA_BITS = 2048
_USER_CERT = 1
_HOST_CERT = 2


class SignatureError(ReconcilerError):
    """A signature that must not be trusted; ``reason`` says why in a stable code."""

    reason = "BAD_SIGNATURE"
    exit_code = 1

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message, reason=reason)


def _bad(message: str) -> SignatureError:
    return SignatureError(message, "BAD_SIGNATURE")


class _Reader:
    """SSH wire-format reader (RFC 4251 types); every shortfall is a bad signature."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if n > len(self.data) - self.pos:
            raise _bad("truncated data")
        self.pos += n
        return self.data[self.pos - n : self.pos]

    def u32(self) -> int:
        return int(struct.unpack(">I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack(">Q", self.take(8))[0])

    def string(self) -> bytes:
        return self.take(self.u32())

    def text(self) -> str:
        raw = self.string()
        if b"\0" in raw:  # OpenSSH reads these as C strings, which cannot hold a NUL
            raise _bad("NUL in a text field")
        try:
            return raw.decode()
        except UnicodeError:
            raise _bad("text field is not UTF-8") from None

    def mpint(self) -> int:
        raw = self.string()
        if raw and raw[0] & 0x80:
            raise _bad("negative integer")
        return int.from_bytes(raw, "big")

    def at_end(self) -> bool:
        return self.pos == len(self.data)

    def done(self, what: str) -> None:
        if not self.at_end():
            raise _bad(f"trailing data after {what}")


def _string(data: bytes | str) -> bytes:
    raw = data.encode() if isinstance(data, str) else data
    return struct.pack(">I", len(raw)) + raw


def _mpint(value: int) -> bytes:
    # Canonical form (no redundant leading zeros) so equal RSA keys have equal blobs.
    return _string(value.to_bytes(value.bit_length() // 8 + 1, "big") if value else b"")


@dataclass(frozen=True)
class _Cert:
    cert_type: int
    principals: tuple[str, ...]
    valid_after: int
    valid_before: int
    ca: _Key


@dataclass(frozen=True)
class _Key:
    key_type: str
    plain_type: str
    plain_blob: bytes  # canonical blob of the bare key: what fingerprints and key equality use
    numbers: tuple[str, bytes] | tuple[int, int] | bytes  # (curve, point), (e, n) or the ed25519 key
    application: bytes | None  # security keys sign for an application ("ssh:")
    cert: _Cert | None

    @cached_property
    def public(self) -> ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey | rsa.RSAPublicKey:
        """The key as OpenSSL checks it (a point on its curve...): built when first used to verify."""
        from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

        curves: dict[str, ec.EllipticCurve] = {"nistp256": ec.SECP256R1(), "nistp384": ec.SECP384R1(),
                                               "nistp521": ec.SECP521R1()}
        try:
            if isinstance(self.numbers, bytes):
                return ed25519.Ed25519PublicKey.from_public_bytes(self.numbers)
            first, second = self.numbers
            if isinstance(first, str) and isinstance(second, bytes):
                return ec.EllipticCurvePublicKey.from_encoded_point(curves[first], second)
            assert isinstance(first, int) and isinstance(second, int)
            return rsa.RSAPublicNumbers(first, second).public_key()
        except (ValueError, OverflowError) as exc:
            raise _bad(f"invalid {self.plain_type} public key: {exc}") from None

    @property
    def fingerprint(self) -> str:
        return "SHA256:" + base64.b64encode(hashlib.sha256(self.plain_blob).digest()).decode().rstrip("=")


def _plain_type(key_type: str) -> str:
    base = key_type.removesuffix(_CERT_SUFFIX)
    return base + "@openssh.com" if base != key_type and base.startswith("sk-") else base


@lru_cache(maxsize=256)
def _parse_key(blob: bytes) -> _Key:
    """Parse a public key or certificate blob. A certificate's CA signature is checked here, as
    OpenSSH does while parsing, so no certificate exists unverified."""
    r = _Reader(blob)
    key_type = r.text()
    plain = _plain_type(key_type)
    if plain != key_type:
        r.string()  # nonce
    if plain == "ssh-dss":
        raise SignatureError("DSA keys are not accepted", "WEAK_ALGORITHM")
    if plain not in _KEY_TYPES:
        raise SignatureError(f"unsupported key type {key_type!r}", "UNSUPPORTED_KEY")
    curve = _KEY_TYPES[plain]
    try:
        if curve:
            if r.text() != curve:
                raise _bad("ECDSA curve does not match the key type")
            point = r.string()
            if point[:1] != b"\x04":  # OpenSSH takes uncompressed points only
                raise _bad("compressed ECDSA point")
            if len(point) != _POINT_BYTES[curve]:
                raise ValueError(f"a {curve} point is {_POINT_BYTES[curve]} bytes, not {len(point)}")
            numbers: tuple[str, bytes] | tuple[int, int] | bytes = (curve, point)
            fields = _string(curve) + _string(point)
        elif plain == "ssh-rsa":
            e, n = r.mpint(), r.mpint()
            if e < 3 or e % 2 == 0 or n < 3 or e >= n:
                raise ValueError("exponent and modulus out of range")
            numbers = (e, n)
            fields = _mpint(e) + _mpint(n)
        else:
            raw = r.string()
            if len(raw) != 32:
                raise ValueError(f"an ed25519 key is 32 bytes, not {len(raw)}")
            numbers = raw
            fields = _string(raw)
    except (ValueError, OverflowError) as exc:
        raise _bad(f"invalid {plain} public key: {exc}") from None
    application = r.text().encode() if plain.startswith("sk-") else None
    if application is not None:
        fields += _string(application)
    cert = _parse_cert(r, blob) if plain != key_type else None
    r.done("public key")
    return _Key(key_type, plain, _string(plain) + fields, numbers, application, cert)


def _parse_cert(r: _Reader, blob: bytes) -> _Cert:
    r.u64()  # serial
    cert_type = r.u32()
    r.string()  # key id
    principals_field = r.string()
    valid_after, valid_before = r.u64(), r.u64()
    for section in (r.string(), r.string()):  # critical options, extensions: name/data pairs
        pairs = _Reader(section)
        while not pairs.at_end():
            pairs.string()
            pairs.string()
    r.string()  # reserved
    ca_blob = r.string()
    signed = blob[: r.pos]
    ca_signature = r.string()
    if cert_type not in (_USER_CERT, _HOST_CERT):
        raise _bad(f"unknown certificate type {cert_type}")
    names = _Reader(principals_field)
    principals: list[str] = []
    while not names.at_end():
        principals.append(names.text())
    if len(principals) > 256:
        raise _bad("too many certificate principals")
    ca = _parse_key(ca_blob)
    if ca.cert is not None:
        raise _bad("certificate signed by a certificate")
    _check(ca, ca_signature, signed)
    return _Cert(cert_type, tuple(principals), valid_after, valid_before, ca)


def _check(key: _Key, signature: bytes, data: bytes) -> None:
    """Verify an SSH signature blob (string algorithm, algorithm-specific data) over ``data``."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

    r = _Reader(signature)
    alg = r.text()
    public = key.public
    try:
        if isinstance(public, rsa.RSAPublicKey):
            if alg == "ssh-rsa":
                raise SignatureError("RSA signature with SHA-1 (ssh-rsa)", "WEAK_ALGORITHM")
            if alg not in _RSA_ALGORITHMS:
                raise _bad(f"signature algorithm {alg!r} does not fit a {key.plain_type} key")
            if public.key_size < _MIN_RSA_BITS:
                raise SignatureError(f"RSA key of {public.key_size} bits", "WEAK_ALGORITHM")
            sig = r.string()
            r.done("signature")
            size = (public.key_size + 7) // 8
            if len(sig) > size:
                raise _bad("RSA signature longer than the modulus")
            # OpenSSH left-pads short signatures: some signers drop leading zero bytes.
            digest = hashes.SHA256() if alg == "rsa-sha2-256" else hashes.SHA512()
            public.verify(sig.rjust(size, b"\0"), data, padding.PKCS1v15(), digest)
            return
        if alg != key.plain_type:
            raise _bad(f"signature algorithm {alg!r} does not fit a {key.plain_type} key")
        sig = r.string()
        if key.application is not None:
            # The token signs H(application) || flags || counter || H(data). Like ssh-keygen, the
            # user-presence flag is not required.
            flags_counter = r.take(5)
            data = hashlib.sha256(key.application).digest() + flags_counter + hashlib.sha256(data).digest()
        r.done("signature")
        if isinstance(public, ed25519.Ed25519PublicKey):
            public.verify(sig, data)
        else:
            inner = _Reader(sig)
            rs = inner.mpint(), inner.mpint()
            inner.done("ECDSA signature")
            size = public.curve.key_size
            ec_digest = hashes.SHA256() if size == 256 else hashes.SHA384() if size == 384 else hashes.SHA512()
            public.verify(encode_dss_signature(*rs), data, ec.ECDSA(ec_digest))
    except (InvalidSignature, ValueError):
        raise _bad("signature does not verify") from None


def _dearmor(armored: bytes) -> bytes:
    if not armored.startswith(_BEGIN):
        raise _bad("missing '-----BEGIN SSH SIGNATURE-----' line")
    end = armored.find(_END, len(_BEGIN))
    if end < 0:
        raise _bad("missing '-----END SSH SIGNATURE-----' line")
    body = re.sub(rb"[ \t\n\v\f\r]", b"", armored[len(_BEGIN) : end])
    try:
        blob = binascii.a2b_base64(body, strict_mode=True)
    except binascii.Error:
        raise _bad("invalid base64 in signature") from None
    # OpenSSH's decoder refuses non-zero padding bits; without this a flipped bit there would pass here only.
    if base64.b64encode(blob) != body:
        raise _bad("non-canonical base64 in signature")
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
        return _parse_key(self.key_blob).fingerprint

    @property
    def ca_fingerprint(self) -> str | None:
        cert = _parse_key(self.key_blob).cert
        return cert.ca.fingerprint if cert else None


def _parse(armored: bytes) -> tuple[Signature, bytes]:
    r = _Reader(_dearmor(armored))
    if r.take(6) != b"SSHSIG":
        raise _bad("not an SSHSIG signature (bad magic)")
    version = r.u32()
    if version != 1:
        raise _bad(f"unsupported SSHSIG version {version}")
    key_blob, namespace = r.string(), r.text()
    r.string()  # reserved
    hash_alg, raw = r.text(), r.string()
    r.done("signature blob")
    if hash_alg not in _HASHES:
        raise _bad(f"unknown hash algorithm {hash_alg!r}")
    key = _parse_key(key_blob)
    return Signature(key.key_type, key_blob, namespace, hash_alg, _Reader(raw).text()), raw


def parse_signature(armored: bytes) -> Signature:
    """Decode an armoured SSHSIG signature without verifying it."""
    return _parse(armored)[0]


def verify(armored: bytes, payload: bytes, namespace: str = "git") -> Signature:
    """Check that ``armored`` is a valid signature of ``payload`` in ``namespace`` by the key it
    names. Says nothing about whether that key is trusted: see ``find_signer``."""
    sig, raw = _parse(armored)
    if sig.namespace != namespace:
        raise SignatureError(f"signature is for namespace {sig.namespace!r}, not {namespace!r}", "WRONG_NAMESPACE")
    digest = hashlib.new(sig.hash_alg, payload).digest()
    signed = b"SSHSIG" + _string(namespace) + _string(b"") + _string(sig.hash_alg) + _string(digest)
    _check(_parse_key(sig.key_blob), raw, signed)
    return sig


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
        regex = b"".join(b".*" if c == 42 else b"." if c == 63 else re.escape(bytes([c])) for c in sub)
        if re.fullmatch(regex, subject, re.S):
            if negated:
                return -1
            result = 1
    return result


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

    @property
    def fingerprint(self) -> str:
        return _parse_key(self.key_blob).fingerprint


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


def _parse_line(text: str, n: int) -> AllowedSigner:
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
    return AllowedSigner(tuple(principals.split(",")), key.key_type, blob, namespaces, after, before, ca, n)


def public_key_fingerprint(line: str) -> str:
    """The fingerprint of an SSH public key written as ``TYPE BASE64 [COMMENT]`` (an
    ``authorized_keys`` or ``.pub`` line); ValueError if it is not one."""
    words = line.split(None, 2)
    if len(words) < 2:
        raise ValueError(f"{line[:60]!r}")
    return _key_of(words[0], words[1])[0].fingerprint


def _key_of(key_type: str, base64: str) -> tuple[_Key, bytes]:
    """The key written as ``TYPE BASE64`` (and its blob); ValueError saying why it is not one."""
    try:
        blob = binascii.a2b_base64(base64, strict_mode=True)
        key = _parse_key(blob)
    except (binascii.Error, SignatureError) as exc:
        raise ValueError(f"invalid {key_type} key: {exc}") from None
    if key.key_type != key_type:
        raise ValueError(f"the key is {key.key_type}, not {key_type}")
    return key, blob


def parse_allowed_signers(text: str, file: str) -> tuple[AllowedSigner, ...]:
    """Parse an allowed-signers file; any malformed line is a ``BadInput`` naming it."""
    signers = []
    for n, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip(" \t\r")
        if not line or line.startswith("#"):
            continue
        try:
            signers.append(_parse_line(line, n))
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
    key = _parse_key(sig.key_blob)
    problem: SignatureError | None = None
    elsewhere = False
    for entry in signers:
        listed = _parse_key(entry.key_blob)
        if entry.cert_authority:
            if key.cert is None or key.cert.ca.plain_blob != listed.plain_blob:
                continue
        elif listed.key_type != key.key_type or (
            listed.plain_blob != key.plain_blob if key.cert is None else entry.key_blob != sig.key_blob
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


def _entry_problem(entry: AllowedSigner, key: _Key, principal: str, now: int, namespace: str) -> SignatureError | None:
    where = f"allowed signers line {entry.line}"
    cert = key.cert
    if entry.cert_authority and cert is not None:
        # OpenSSH's certificate window is [after, before) while the file's is [after, before].
        if cert.cert_type != _USER_CERT:
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
