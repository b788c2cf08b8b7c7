"""SSH public keys and certificates in SSH wire format, and an SSH signature checked with a key.

The building blocks of ``sshsig``: a reader of the wire format (RFC 4251 strings, integers,
mpints), the key types OpenSSH signs commits with (Ed25519, ECDSA, RSA, their FIDO security-key
variants, and OpenSSH user certificates of them) parsed and fingerprinted, and one signature
blob verified over some data. Refused here, as ``sshsig`` says why: RSA keys under 2048 bits,
DSA, SHA-1 signatures (also by a certificate's CA) and webauthn security-key signatures.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, cached_property, lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where a signature is checked: an idle agent never loads OpenSSL's bindings
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from reconciler.core.errors import ReconcilerError

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
USER_CERT = 1
_HOST_CERT = 2


class SignatureError(ReconcilerError):
    """A signature that must not be trusted; ``reason`` says why in a stable code."""

    reason = "BAD_SIGNATURE"
    exit_code = 1

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message, reason=reason)


def bad_signature(message: str) -> SignatureError:
    return SignatureError(message, "BAD_SIGNATURE")


class WireReader:
    """SSH wire-format reader (RFC 4251 types); every shortfall is a bad signature."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if n > len(self.data) - self.pos:
            raise bad_signature("truncated data")
        self.pos += n
        return self.data[self.pos - n : self.pos]

    def u32(self) -> int:
        return int(struct.unpack(">I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack(">Q", self.take(8))[0])

    def string(self) -> bytes:
        # In one call, not three (u32, take): a fleet's reader parses some 13 strings per note.
        data, pos = self.data, self.pos
        size = int.from_bytes(data[pos : pos + 4], "big") if len(data) - pos >= 4 else -1
        if size < 0 or size > len(data) - pos - 4:
            raise bad_signature("truncated data")
        self.pos = pos + 4 + size
        return data[pos + 4 : self.pos]

    def text(self) -> str:
        raw = self.string()
        if b"\0" in raw:  # OpenSSH reads these as C strings, which cannot hold a NUL
            raise bad_signature("NUL in a text field")
        try:
            return raw.decode()
        except UnicodeError:
            raise bad_signature("text field is not UTF-8") from None

    def mpint(self) -> int:
        raw = self.string()
        if raw and raw[0] & 0x80:
            raise bad_signature("negative integer")
        return int.from_bytes(raw, "big")

    def at_end(self) -> bool:
        return self.pos == len(self.data)

    def done(self, what: str) -> None:
        if not self.at_end():
            raise bad_signature(f"trailing data after {what}")


def wire_string(data: bytes | str) -> bytes:
    raw = data.encode() if isinstance(data, str) else data
    return struct.pack(">I", len(raw)) + raw


def _mpint(value: int) -> bytes:
    # Canonical form (no redundant leading zeros) so equal RSA keys have equal blobs.
    return wire_string(value.to_bytes(value.bit_length() // 8 + 1, "big") if value else b"")


@dataclass(frozen=True)
class _Cert:
    cert_type: int
    principals: tuple[str, ...]
    valid_after: int
    valid_before: int
    ca: SshKey


@dataclass(frozen=True)
class SshKey:
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
            raise bad_signature(f"invalid {self.plain_type} public key: {exc}") from None

    @property
    def fingerprint(self) -> str:
        import hashlib  # where used: it loads OpenSSL, 3.5 MB of an idle daemon, which parses keys (issue 40)

        return "SHA256:" + base64.b64encode(hashlib.sha256(self.plain_blob).digest()).decode().rstrip("=")


def _plain_type(key_type: str) -> str:
    base = key_type.removesuffix(_CERT_SUFFIX)
    return base + "@openssh.com" if base != key_type and base.startswith("sk-") else base


_ED25519 = "ssh-ed25519"
_ED25519_HEAD = wire_string(_ED25519) + (32).to_bytes(4, "big")  # a plain ed25519 key's blob is this + 32 bytes


@lru_cache(maxsize=256)
def parse_key(blob: bytes) -> SshKey:
    """Parse a public key or certificate blob. A certificate's CA signature is checked here, as
    OpenSSH does while parsing, so no certificate exists unverified."""
    if len(blob) == len(_ED25519_HEAD) + 32 and blob.startswith(_ED25519_HEAD):
        # A plain ed25519 key, every note of a fleet: what _parse_key makes of it (its blob is
        # already canonical), without reading it field by field.
        return SshKey(_ED25519, _ED25519, blob, blob[len(_ED25519_HEAD) :], None, None)
    return _parse_key(blob)


def _parse_key(blob: bytes) -> SshKey:
    r = WireReader(blob)
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
                raise bad_signature("ECDSA curve does not match the key type")
            point = r.string()
            if point[:1] != b"\x04":  # OpenSSH takes uncompressed points only
                raise bad_signature("compressed ECDSA point")
            if len(point) != _POINT_BYTES[curve]:
                raise ValueError(f"a {curve} point is {_POINT_BYTES[curve]} bytes, not {len(point)}")
            numbers: tuple[str, bytes] | tuple[int, int] | bytes = (curve, point)
            fields = wire_string(curve) + wire_string(point)
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
            fields = wire_string(raw)
    except (ValueError, OverflowError) as exc:
        raise bad_signature(f"invalid {plain} public key: {exc}") from None
    application = r.text().encode() if plain.startswith("sk-") else None
    if application is not None:
        fields += wire_string(application)
    cert = _parse_cert(r, blob) if plain != key_type else None
    r.done("public key")
    return SshKey(key_type, plain, wire_string(plain) + fields, numbers, application, cert)


def _parse_cert(r: WireReader, blob: bytes) -> _Cert:
    r.u64()  # serial
    cert_type = r.u32()
    r.string()  # key id
    principals_field = r.string()
    valid_after, valid_before = r.u64(), r.u64()
    for section in (r.string(), r.string()):  # critical options, extensions: name/data pairs
        pairs = WireReader(section)
        while not pairs.at_end():
            pairs.string()
            pairs.string()
    r.string()  # reserved
    ca_blob = r.string()
    signed = blob[: r.pos]
    ca_signature = r.string()
    if cert_type not in (USER_CERT, _HOST_CERT):
        raise bad_signature(f"unknown certificate type {cert_type}")
    names = WireReader(principals_field)
    principals: list[str] = []
    while not names.at_end():
        principals.append(names.text())
    if len(principals) > 256:
        raise bad_signature("too many certificate principals")
    ca = parse_key(ca_blob)
    if ca.cert is not None:
        raise bad_signature("certificate signed by a certificate")
    check_signature(ca, ca_signature, signed)
    return _Cert(cert_type, tuple(principals), valid_after, valid_before, ca)


@cache
def _libsodium() -> tuple[Callable[[bytes, bytes], bytes], type[Exception]]:
    """Loaded with the first signature checked (an idle agent checks none); once, not per note."""
    from nacl.bindings import crypto_sign_open
    from nacl.exceptions import BadSignatureError

    return crypto_sign_open, BadSignatureError


def _ed25519_verify(public: bytes, sig: bytes, data: bytes) -> None:
    """Ed25519 through libsodium: half OpenSSL's time (a fleet's reader checks 10,000 notes), and
    stricter: it refuses small-order and non-canonical public keys, and an R of small order, which
    OpenSSL and ssh-keygen take (under the identity point as a key, R = identity, s = 0 verifies
    for every message); it is cofactorless, as they are (tests/test_verify_speed_review.py)."""
    crypto_sign_open, refused = _libsodium()
    # libsodium reads the first 64 bytes of R || s || data as the signature: a shorter one would
    # take bytes of the data (OpenSSL refuses any but 64)
    if len(sig) != 64:
        raise bad_signature("signature does not verify")
    try:
        crypto_sign_open(sig + data, public)
    except refused:
        raise bad_signature("signature does not verify") from None


def check_signature(key: SshKey, signature: bytes, data: bytes) -> None:
    """Verify an SSH signature blob (string algorithm, algorithm-specific data) over ``data``."""
    if key.key_type == _ED25519:  # a fleet's notes: the same checks, without the dispatch below
        r = WireReader(signature)
        alg = r.text()
        if alg != _ED25519:
            raise bad_signature(f"signature algorithm {alg!r} does not fit a ssh-ed25519 key")
        sig = r.string()
        r.done("signature")
        assert isinstance(key.numbers, bytes)
        _ed25519_verify(key.numbers, sig, data)
        return
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

    r = WireReader(signature)
    alg = r.text()
    # an ed25519 certificate or security key: libsodium takes the 32 bytes, as above
    public = None if isinstance(key.numbers, bytes) else key.public
    try:
        if isinstance(public, rsa.RSAPublicKey):
            if alg == "ssh-rsa":
                raise SignatureError("RSA signature with SHA-1 (ssh-rsa)", "WEAK_ALGORITHM")
            if alg not in _RSA_ALGORITHMS:
                raise bad_signature(f"signature algorithm {alg!r} does not fit a {key.plain_type} key")
            if public.key_size < _MIN_RSA_BITS:
                raise SignatureError(f"RSA key of {public.key_size} bits", "WEAK_ALGORITHM")
            sig = r.string()
            r.done("signature")
            size = (public.key_size + 7) // 8
            if len(sig) > size:
                raise bad_signature("RSA signature longer than the modulus")
            # OpenSSH left-pads short signatures: some signers drop leading zero bytes.
            digest = hashes.SHA256() if alg == "rsa-sha2-256" else hashes.SHA512()
            public.verify(sig.rjust(size, b"\0"), data, padding.PKCS1v15(), digest)
            return
        if alg != key.plain_type:
            raise bad_signature(f"signature algorithm {alg!r} does not fit a {key.plain_type} key")
        sig = r.string()
        if key.application is not None:
            # The token signs H(application) || flags || counter || H(data). Like ssh-keygen, the
            # user-presence flag is not required.
            flags_counter = r.take(5)
            import hashlib  # as in ``fingerprint``

            data = hashlib.sha256(key.application).digest() + flags_counter + hashlib.sha256(data).digest()
        r.done("signature")
        if public is None:
            assert isinstance(key.numbers, bytes)
            _ed25519_verify(key.numbers, sig, data)
        else:
            assert isinstance(public, ec.EllipticCurvePublicKey)
            inner = WireReader(sig)
            rs = inner.mpint(), inner.mpint()
            inner.done("ECDSA signature")
            size = public.curve.key_size
            ec_digest = hashes.SHA256() if size == 256 else hashes.SHA384() if size == 384 else hashes.SHA512()
            public.verify(encode_dss_signature(*rs), data, ec.ECDSA(ec_digest))
    except (InvalidSignature, ValueError):
        raise bad_signature("signature does not verify") from None

