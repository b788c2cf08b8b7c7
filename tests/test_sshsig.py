"""SSHSIG verification and allowed-signers decisions, judged against ``ssh-keygen -Y verify``.

Keys, certificates and signatures are made at test time with ssh-keygen (nothing private is
committed). Every verdict goes through ``judge``, which runs our code and ssh-keygen on the same
files and fails unless both accept or both reject; the tests then pin our reason code. Where we
are deliberately stricter than ssh-keygen, the test says so and asserts both sides.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from hypothesis import given, settings
from hypothesis import strategies as st
from needs import unavailable

from reconciler.core.errors import BadInput
from reconciler.trust.sshkeys import SignatureError
from reconciler.trust.sshsig import (
    AllowedSigner,
    find_signer,
    parse_allowed_signers,
    parse_signature,
    verify,
)


@pytest.fixture(autouse=True, scope="module")
def _ssh_keygen() -> None:
    if shutil.which("ssh-keygen") is None:
        unavailable("ssh-keygen", "these tests compare with OpenSSH's own signatures")


PAYLOAD = b"tree 4b825dc642cb6eb9a060e54bf8d69288fbee4904\nauthor A <a@example.org> 1700000000 +0000\n\nchange\n"
ALICE = "alice@example.org"
KEY_TYPES = {
    "ed25519": ["-t", "ed25519"],
    "ecdsa256": ["-t", "ecdsa", "-b", "256"],
    "ecdsa384": ["-t", "ecdsa", "-b", "384"],
    "ecdsa521": ["-t", "ecdsa", "-b", "521"],
    "rsa": ["-t", "rsa", "-b", "3072"],
}
ENV = {**os.environ, "TZ": "UTC"}


def keygen(*args: str | Path, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["ssh-keygen", *map(str, args)], input=stdin, capture_output=True, env=ENV)


class Keys:
    """ssh-keygen key pairs in one directory, made once per session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.n = 0

    def new(self, name: str, *args: str) -> Path:
        path = self.root / name
        if not path.exists():
            assert keygen("-q", "-N", "", "-C", "", "-f", path, *args).returncode == 0
        return path

    def pub(self, name: str) -> str:
        return (self.root / f"{name}.pub").read_text().strip()

    def sign(self, key: Path, payload: bytes = PAYLOAD, namespace: str = "git", *opts: str) -> bytes:
        self.n += 1
        msg = self.root / f"msg{self.n}"
        msg.write_bytes(payload)
        out = keygen("-Y", "sign", "-f", key, "-n", namespace, *opts, msg)
        assert out.returncode == 0, out.stderr
        return msg.with_name(msg.name + ".sig").read_bytes()

    def cert(self, key: str, *opts: str) -> Path:
        """A certificate for a copy of ``key`` (so each test gets its own KEY-cert.pub)."""
        self.n += 1
        copy = self.root / f"{key}-c{self.n}"
        shutil.copy(self.root / key, copy)
        shutil.copy(self.root / f"{key}.pub", copy.with_name(copy.name + ".pub"))
        out = keygen("-q", "-s", self.root / "ca", "-I", f"id{self.n}", *opts, copy.with_name(copy.name + ".pub"))
        assert out.returncode == 0, out.stderr
        return copy.with_name(copy.name + "-cert.pub")


@pytest.fixture(scope="session")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    k = Keys(tmp_path_factory.mktemp("sshsig"))
    for name, args in KEY_TYPES.items():
        k.new(name, *args)
    k.new("other", "-t", "ed25519")
    k.new("ca", "-t", "ed25519")
    return k


def judge(
    tmp_path: Path,
    armored: bytes,
    allowed: str,
    principal: str = ALICE,
    payload: bytes = PAYLOAD,
    namespace: str = "git",
    at: datetime | None = None,
) -> str | None:
    """Our verdict (None = accepted, else the reason code), after asserting ssh-keygen agrees."""
    (tmp_path / "allowed").write_text(allowed)
    (tmp_path / "sig").write_bytes(armored)
    args: list[str | Path] = ["-Y", "verify", "-f", tmp_path / "allowed", "-I", principal, "-n", namespace, "-s", tmp_path / "sig"]
    if at is not None:
        args.append(f"-Overify-time={at:%Y%m%d%H%M%S}Z")
    theirs = keygen(*args, stdin=payload)
    try:
        sig = verify(armored, payload, namespace)
        find_signer(parse_allowed_signers(allowed, "allowed"), sig, principal, at or datetime.now(UTC), namespace)
        ours = None
    except SignatureError as exc:
        ours = exc.reason
    assert (ours is None) == (theirs.returncode == 0), (ours, theirs.stdout, theirs.stderr)
    return ours


# Wire-format helpers, to build signatures ssh-keygen would never make.


def string(data: bytes | str) -> bytes:
    raw = data.encode() if isinstance(data, str) else data
    return struct.pack(">I", len(raw)) + raw


def mpint(value: int) -> bytes:
    return string(value.to_bytes(value.bit_length() // 8 + 1, "big"))


def dearmor(armored: bytes) -> bytes:
    return base64.b64decode(b"".join(armored.strip().split(b"\n")[1:-1]))


def armor(blob: bytes) -> bytes:
    b64 = base64.b64encode(blob)
    lines = b"\n".join(b64[i : i + 70] for i in range(0, len(b64), 70))
    return b"-----BEGIN SSH SIGNATURE-----\n" + lines + b"\n-----END SSH SIGNATURE-----\n"


def fields(blob: bytes) -> list[bytes]:
    """magic+version, then the five strings: key, namespace, reserved, hash, signature."""
    out, pos = [blob[:10]], 10
    while pos < len(blob):
        (n,) = struct.unpack(">I", blob[pos : pos + 4])
        out.append(blob[pos + 4 : pos + 4 + n])
        pos += 4 + n
    return out


def sshsig(key_blob: bytes, signature: bytes, namespace: str = "git", hash_alg: str = "sha512", version: int = 1) -> bytes:
    return armor(
        b"SSHSIG" + struct.pack(">I", version) + string(key_blob) + string(namespace) + string(b"")
        + string(hash_alg) + string(signature)
    )


def to_sign(payload: bytes = PAYLOAD, namespace: str = "git", hash_alg: str = "sha512") -> bytes:
    return b"SSHSIG" + string(namespace) + string(b"") + string(hash_alg) + string(hashlib.new(hash_alg, payload).digest())


def private(keys: Keys, name: str) -> object:
    return serialization.load_ssh_private_key((keys.root / name).read_bytes(), None)


def key_blob(keys: Keys, name: str) -> bytes:
    return base64.b64decode(keys.pub(name).split()[1])


def rsa_sign(keys: Keys, alg: str, digest: hashes.HashAlgorithm, hash_alg: str = "sha512") -> bytes:
    key = private(keys, "rsa")
    assert isinstance(key, rsa.RSAPrivateKey)
    raw = key.sign(to_sign(hash_alg=hash_alg), padding.PKCS1v15(), digest)
    return sshsig(key_blob(keys, "rsa"), string(alg) + string(raw), hash_alg=hash_alg)


def line(keys: Keys, name: str, principals: str = ALICE, options: str = "") -> str:
    return f"{principals} {options} {keys.pub(name)}\n".replace("  ", " ")


def fingerprint(pub: Path) -> str:
    return keygen("-l", "-f", pub).stdout.split()[1].decode()


# Each supported key type, and the signature algorithms.


@pytest.mark.parametrize("name", KEY_TYPES)
def test_each_key_type_verifies(keys: Keys, tmp_path: Path, name: str) -> None:
    armored = keys.sign(keys.root / name)
    assert judge(tmp_path, armored, line(keys, name)) is None
    sig = parse_signature(armored)
    assert sig.fingerprint == fingerprint(keys.root / f"{name}.pub")
    assert (sig.namespace, sig.hash_alg, sig.ca_fingerprint) == ("git", "sha512", None)
    assert sig.sig_alg == {"rsa": "rsa-sha2-512"}.get(name, sig.key_type)
    [entry] = parse_allowed_signers(line(keys, name), "allowed")
    assert entry.fingerprint == sig.fingerprint and entry.key_type == sig.key_type


def test_sha256_message_hash(keys: Keys, tmp_path: Path) -> None:
    armored = keys.sign(keys.root / "ecdsa256", PAYLOAD, "git", "-O", "hashalg=sha256")
    assert parse_signature(armored).hash_alg == "sha256"
    assert judge(tmp_path, armored, line(keys, "ecdsa256")) is None


@pytest.mark.parametrize(("alg", "digest"), [("rsa-sha2-256", hashes.SHA256()), ("rsa-sha2-512", hashes.SHA512())])
def test_rsa_sha2_signature_algorithms(keys: Keys, tmp_path: Path, alg: str, digest: hashes.HashAlgorithm) -> None:
    # ssh-keygen 9.x always signs with rsa-sha2-512, so rsa-sha2-256 is made here with the same key.
    armored = rsa_sign(keys, alg, digest, hash_alg="sha256")
    assert parse_signature(armored).sig_alg == alg
    assert judge(tmp_path, armored, line(keys, "rsa")) is None


def test_sha1_rsa_is_weak(keys: Keys, tmp_path: Path) -> None:
    armored = rsa_sign(keys, "ssh-rsa", hashes.SHA1())
    assert judge(tmp_path, armored, line(keys, "rsa")) == "WEAK_ALGORITHM"


def test_signature_algorithm_must_fit_key(keys: Keys, tmp_path: Path) -> None:
    ed = fields(dearmor(keys.sign(keys.root / "ed25519")))
    rsa_sig = fields(dearmor(keys.sign(keys.root / "rsa")))[5]
    assert judge(tmp_path, sshsig(ed[1], rsa_sig), line(keys, "ed25519")) == "BAD_SIGNATURE"
    assert judge(tmp_path, sshsig(key_blob(keys, "rsa"), ed[5]), line(keys, "rsa")) == "BAD_SIGNATURE"


# Broken or tampered signatures.


def test_modified_payload(keys: Keys, tmp_path: Path) -> None:
    armored = keys.sign(keys.root / "ed25519")
    assert judge(tmp_path, armored, line(keys, "ed25519"), payload=PAYLOAD + b" ") == "BAD_SIGNATURE"


def test_wrong_namespace(keys: Keys, tmp_path: Path) -> None:
    armored = keys.sign(keys.root / "ed25519", PAYLOAD, "file")
    assert judge(tmp_path, armored, line(keys, "ed25519")) == "WRONG_NAMESPACE"
    assert judge(tmp_path, armored, line(keys, "ed25519"), namespace="file") is None


@pytest.mark.parametrize(
    "damage",
    [
        lambda a: a[: len(a) // 2],
        lambda a: a[:-30] + b"\n-----END SSH SIGNATURE-----\n",
        lambda a: a.replace(b"\n", b"\r\n"),
        lambda a: a.replace(b"BEGIN SSH SIGNATURE", b"BEGIN PGP SIGNATURE"),
        lambda a: a[:40] + b"*" + a[41:],
        lambda a: b"",
    ],
    ids=["half", "body", "crlf", "header", "bad-base64", "empty"],
)
def test_broken_armour(keys: Keys, tmp_path: Path, damage: Callable[[bytes], bytes]) -> None:
    armored = damage(keys.sign(keys.root / "ed25519"))
    assert judge(tmp_path, armored, line(keys, "ed25519")) == "BAD_SIGNATURE"


def test_armour_tolerates_other_line_lengths_and_trailing_text(keys: Keys, tmp_path: Path) -> None:
    blob = dearmor(keys.sign(keys.root / "ed25519"))
    b64 = base64.b64encode(blob)
    armored = b"-----BEGIN SSH SIGNATURE-----\n" + b64[:10] + b"\n \t" + b64[10:] + b"\n-----END SSH SIGNATURE-----\nx"
    assert judge(tmp_path, armored, line(keys, "ed25519")) is None


def test_nonzero_base64_padding_bits(keys: Keys, tmp_path: Path) -> None:
    # Python's decoder ignores the unused low bits of the last base64 character; OpenSSH refuses them.
    armored = keys.sign(keys.root / "ed25519")  # 173-byte blob: ends in one "=", two spare bits
    assert len(dearmor(armored)) % 3 == 2
    last = armored.index(b"=") - 1
    alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    tweaked = armored[:last] + bytes([alphabet[alphabet.index(armored[last]) ^ 1]]) + armored[last + 1 :]
    assert judge(tmp_path, tweaked, line(keys, "ed25519")) == "BAD_SIGNATURE"


def test_short_rsa_signature_is_left_padded(keys: Keys, tmp_path: Path) -> None:
    # Some signers drop an RSA signature's leading zero byte; OpenSSH pads it back.
    key = private(keys, "rsa")
    assert isinstance(key, rsa.RSAPrivateKey)
    for n in range(5000):
        payload = PAYLOAD + str(n).encode()
        raw = key.sign(to_sign(payload), padding.PKCS1v15(), hashes.SHA512())
        if raw[0] == 0:
            break
    armored = sshsig(key_blob(keys, "rsa"), string("rsa-sha2-512") + string(raw[1:]))
    assert judge(tmp_path, armored, line(keys, "rsa"), payload=payload) is None


def test_trailing_bytes_after_blob(keys: Keys, tmp_path: Path) -> None:
    armored = armor(dearmor(keys.sign(keys.root / "ed25519")) + b"\0")
    assert judge(tmp_path, armored, line(keys, "ed25519")) == "BAD_SIGNATURE"


def test_version_2(keys: Keys, tmp_path: Path) -> None:
    blob = dearmor(keys.sign(keys.root / "ed25519"))
    armored = armor(blob[:6] + struct.pack(">I", 2) + blob[10:])
    assert judge(tmp_path, armored, line(keys, "ed25519")) == "BAD_SIGNATURE"
    with pytest.raises(SignatureError, match="version 2"):
        parse_signature(armored)


def test_version_0_is_refused_though_ssh_keygen_takes_it(keys: Keys, tmp_path: Path) -> None:
    # OpenSSH only refuses versions *above* 1; version 0 was never defined, so we refuse it.
    blob = dearmor(keys.sign(keys.root / "ed25519"))
    armored = armor(blob[:6] + struct.pack(">I", 0) + blob[10:])
    with pytest.raises(AssertionError):
        judge(tmp_path, armored, line(keys, "ed25519"))
    with pytest.raises(SignatureError, match="version 0"):
        verify(armored, PAYLOAD)


def test_bad_magic(keys: Keys, tmp_path: Path) -> None:
    blob = dearmor(keys.sign(keys.root / "ed25519"))
    assert judge(tmp_path, armor(b"SSHSIH" + blob[6:]), line(keys, "ed25519")) == "BAD_SIGNATURE"


def test_unknown_hash_algorithm(keys: Keys, tmp_path: Path) -> None:
    key = private(keys, "ed25519")
    assert isinstance(key, ed25519.Ed25519PrivateKey)
    raw = key.sign(to_sign(hash_alg="sha1"))
    armored = sshsig(key_blob(keys, "ed25519"), string("ssh-ed25519") + string(raw), hash_alg="sha1")
    assert judge(tmp_path, armored, line(keys, "ed25519")) == "BAD_SIGNATURE"
    with pytest.raises(SignatureError, match="unknown hash"):
        parse_signature(armored)


def test_weak_keys_are_refused_though_ssh_keygen_takes_them(keys: Keys, tmp_path: Path) -> None:
    # OpenSSH still verifies with 1024-bit RSA and with DSA; our policy refuses both.
    for name, args in {"rsa1024": ["-t", "rsa", "-b", "1024"], "dsa": ["-t", "dsa"]}.items():
        armored = keys.sign(keys.new(name, *args))
        with pytest.raises(AssertionError):
            judge(tmp_path, armored, line(keys, name))
        with pytest.raises(SignatureError) as exc:
            verify(armored, PAYLOAD)
        assert exc.value.reason == "WEAK_ALGORITHM"


# Security keys (FIDO): ssh-keygen needs a token to sign, so a software key plays the token.


def _sk_signature(kind: str, payload: bytes, flags: int = 1) -> tuple[str, bytes]:
    app = "ssh:"
    tail = bytes([flags]) + struct.pack(">I", 7)
    def signed(data: bytes) -> bytes:
        return hashlib.sha256(app.encode()).digest() + tail + hashlib.sha256(data).digest()
    if kind == "ed25519":
        ed = ed25519.Ed25519PrivateKey.generate()
        pk = ed.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        key_type, blob = "sk-ssh-ed25519@openssh.com", string("sk-ssh-ed25519@openssh.com") + string(pk) + string(app)
        raw = ed.sign(signed(to_sign(payload)))
    else:
        ecd = ec.generate_private_key(ec.SECP256R1())
        point = ecd.public_key().public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
        key_type = "sk-ecdsa-sha2-nistp256@openssh.com"
        blob = string(key_type) + string("nistp256") + string(point) + string(app)
        r, s = decode_dss_signature(ecd.sign(signed(to_sign(payload)), ec.ECDSA(hashes.SHA256())))
        raw = mpint(r) + mpint(s)
    pub = f"{key_type} {base64.b64encode(blob).decode()}"
    return pub, sshsig(blob, string(key_type) + string(raw) + tail)


@pytest.mark.parametrize("kind", ["ed25519", "ecdsa"])
def test_security_keys(tmp_path: Path, kind: str) -> None:
    pub, armored = _sk_signature(kind, PAYLOAD)
    assert judge(tmp_path, armored, f"{ALICE} {pub}\n") is None
    # ssh-keygen -Y verify does not demand the user-presence flag, so neither do we.
    pub, armored = _sk_signature(kind, PAYLOAD, flags=0)
    assert judge(tmp_path, armored, f"{ALICE} {pub}\n") is None
    assert judge(tmp_path, armored, f"{ALICE} {pub}\n", payload=b"x") == "BAD_SIGNATURE"


# The allowed-signers file.


def test_key_not_listed(keys: Keys, tmp_path: Path) -> None:
    armored = keys.sign(keys.root / "ed25519")
    assert judge(tmp_path, armored, line(keys, "other")) == "UNTRUSTED_KEY"
    assert judge(tmp_path, armored, "# nobody\n\n") == "UNTRUSTED_KEY"


def test_wrong_principal(keys: Keys, tmp_path: Path) -> None:
    armored = keys.sign(keys.root / "ed25519")
    allowed = line(keys, "ed25519", "bob@example.org") + line(keys, "other")
    assert judge(tmp_path, armored, allowed) == "WRONG_PRINCIPAL"


@pytest.mark.parametrize(
    ("patterns", "principal", "reason"),
    [
        ("*@example.org", ALICE, None),
        ("*@example.org", "alice@example.com", "WRONG_PRINCIPAL"),
        ("bob@example.org,alice@example.???", ALICE, None),
        ("*@example.org,!mallory@example.org", "mallory@example.org", "WRONG_PRINCIPAL"),
        ("!mallory@example.org,*@example.org", ALICE, None),
        ("!mallory@example.org", ALICE, "WRONG_PRINCIPAL"),
        ('"alice smith,*@example.org"', "alice smith", None),
        (",alice", "", None),
        ("alice,", "", "WRONG_PRINCIPAL"),
    ],
)
def test_principal_patterns(keys: Keys, tmp_path: Path, patterns: str, principal: str, reason: str | None) -> None:
    armored = keys.sign(keys.root / "ed25519")
    assert judge(tmp_path, armored, line(keys, "ed25519", patterns), principal) == reason


@pytest.mark.parametrize(
    ("option", "reason"),
    [
        ('namespaces="file"', "WRONG_NAMESPACE"),
        ('namespaces="file,git"', None),
        ('NAMESPACES="g?t"', None),
        ('namespaces="*,!git"', "WRONG_NAMESPACE"),
        ('namespaces="gi"', "WRONG_NAMESPACE"),
    ],
)
def test_namespaces_option(keys: Keys, tmp_path: Path, option: str, reason: str | None) -> None:
    armored = keys.sign(keys.root / "ed25519")
    assert judge(tmp_path, armored, line(keys, "ed25519", options=option)) == reason


def stamp(when: datetime) -> str:
    return f"{when:%Y%m%d%H%M%S}Z"


def test_validity_window_against_the_real_clock(keys: Keys, tmp_path: Path) -> None:
    armored = keys.sign(keys.root / "ed25519")
    now = datetime.now(UTC)
    past, future = stamp(now - timedelta(days=2)), stamp(now + timedelta(days=2))
    yesterday = stamp(now - timedelta(days=1))
    expired = line(keys, "ed25519", options=f'valid-before="{yesterday}"')
    assert judge(tmp_path, armored, expired) == "KEY_EXPIRED"
    early = line(keys, "ed25519", options=f'valid-after="{future}"')
    assert judge(tmp_path, armored, early) == "KEY_NOT_YET_VALID"
    inside = line(keys, "ed25519", options=f'valid-after="{past}",valid-before="{future}"')
    assert judge(tmp_path, armored, inside) is None
    # A failing entry does not stop the search: the next one for the same key can still allow it.
    assert judge(tmp_path, armored, expired + inside) is None
    signers = parse_allowed_signers(expired + inside, "f")
    assert find_signer(signers, verify(armored, PAYLOAD), ALICE, now) == signers[1]


def test_validity_bounds_are_inclusive_to_the_second(keys: Keys, tmp_path: Path) -> None:
    # ssh-keygen's check is "now < valid-after" and "now > valid-before": both ends are allowed.
    armored = keys.sign(keys.root / "ed25519")
    t = datetime(2030, 6, 1, 12, 0, 0, tzinfo=UTC)
    entry = line(keys, "ed25519", options=f'valid-after="{stamp(t)}",valid-before="{stamp(t + timedelta(hours=1))}"')
    second = timedelta(seconds=1)
    assert judge(tmp_path, armored, entry, at=t - second) == "KEY_NOT_YET_VALID"
    assert judge(tmp_path, armored, entry, at=t) is None
    assert judge(tmp_path, armored, entry, at=t + timedelta(hours=1)) is None
    assert judge(tmp_path, armored, entry, at=t + timedelta(hours=1) + second) == "KEY_EXPIRED"
    signers = parse_allowed_signers(entry, "f")
    with pytest.raises(SignatureError):  # fractions of a second count as the whole second after
        find_signer(signers, verify(armored, PAYLOAD), ALICE, t + timedelta(hours=1, seconds=1, microseconds=1))


def test_short_time_formats(keys: Keys, tmp_path: Path) -> None:
    armored = keys.sign(keys.root / "ed25519")
    entry = line(keys, "ed25519", options='valid-after="20300601",valid-before="203006011230UTC"')
    assert judge(tmp_path, armored, entry, at=datetime(2030, 6, 1, 12, 30, tzinfo=UTC)) is None
    assert judge(tmp_path, armored, entry, at=datetime(2030, 5, 31, 23, 59, 59, tzinfo=UTC)) == "KEY_NOT_YET_VALID"
    [signer] = parse_allowed_signers(entry, "f")
    assert signer.valid_after == datetime(2030, 6, 1, tzinfo=UTC)
    assert signer.valid_before == datetime(2030, 6, 1, 12, 30, tzinfo=UTC)


# Certificates signed by a cert-authority entry.


def ca_line(keys: Keys, principals: str = "*@example.org") -> str:
    return line(keys, "ca", principals, "cert-authority")


def test_certificate_from_trusted_ca(keys: Keys, tmp_path: Path) -> None:
    cert = keys.cert("ed25519", "-n", f"{ALICE},bob@example.org", "-V", "-1h:+1h")
    armored = keys.sign(cert)
    assert judge(tmp_path, armored, ca_line(keys)) is None
    assert judge(tmp_path, armored, ca_line(keys), "bob@example.org") is None
    sig = parse_signature(armored)
    assert sig.key_type == "ssh-ed25519-cert-v01@openssh.com"
    assert sig.fingerprint == fingerprint(keys.root / "ed25519.pub")
    assert sig.ca_fingerprint == fingerprint(keys.root / "ca.pub")


def test_certificate_must_name_the_principal(keys: Keys, tmp_path: Path) -> None:
    armored = keys.sign(keys.cert("ecdsa256", "-n", "bob@example.org", "-V", "-1h:+1h"))
    assert judge(tmp_path, armored, ca_line(keys)) == "WRONG_PRINCIPAL"
    # ...and the principal must also match the entry's patterns.
    armored = keys.sign(keys.cert("ecdsa256", "-n", ALICE, "-V", "-1h:+1h"))
    assert judge(tmp_path, armored, ca_line(keys, "*@example.com")) == "WRONG_PRINCIPAL"


@pytest.mark.parametrize(("window", "reason"), [("-2d:-1d", "KEY_EXPIRED"), ("+1d:+2d", "KEY_NOT_YET_VALID")])
def test_certificate_validity(keys: Keys, tmp_path: Path, window: str, reason: str) -> None:
    armored = keys.sign(keys.cert("ed25519", "-n", ALICE, "-V", window))
    assert judge(tmp_path, armored, ca_line(keys)) == reason


def test_certificate_window_end_is_exclusive(keys: Keys, tmp_path: Path) -> None:
    # Unlike the file's valid-before, a certificate's valid-before second is already outside.
    armored = keys.sign(keys.cert("ed25519", "-n", ALICE, "-V", "20300601120000Z:20300601130000Z"))
    assert judge(tmp_path, armored, ca_line(keys), at=datetime(2030, 6, 1, 12, tzinfo=UTC)) is None
    assert judge(tmp_path, armored, ca_line(keys), at=datetime(2030, 6, 1, 13, tzinfo=UTC)) == "KEY_EXPIRED"


def test_host_certificate_cannot_sign(keys: Keys, tmp_path: Path) -> None:
    armored = keys.sign(keys.cert("ed25519", "-h", "-n", ALICE, "-V", "-1h:+1h"))
    assert judge(tmp_path, armored, ca_line(keys)) == "UNTRUSTED_KEY"


def test_certificate_needs_cert_authority_entry(keys: Keys, tmp_path: Path) -> None:
    armored = keys.sign(keys.cert("ed25519", "-n", ALICE, "-V", "-1h:+1h"))
    # The CA key without cert-authority, and the certificate's own key, both do not count.
    assert judge(tmp_path, armored, line(keys, "ca", "*@example.org")) == "UNTRUSTED_KEY"
    assert judge(tmp_path, armored, line(keys, "ed25519")) == "UNTRUSTED_KEY"
    # And a cert-authority entry does not trust the CA key's own plain signatures.
    assert judge(tmp_path, keys.sign(keys.root / "ca"), ca_line(keys)) == "UNTRUSTED_KEY"


def test_certificate_listed_as_a_key(keys: Keys, tmp_path: Path) -> None:
    # Without cert-authority an entry may name one exact certificate.
    cert = keys.cert("ed25519", "-n", "bob@example.org", "-V", "-1h:+1h")
    armored = keys.sign(cert)
    assert judge(tmp_path, armored, f"{ALICE} {cert.read_text()}") is None
    other = keys.cert("ed25519", "-n", "bob@example.org", "-V", "-1h:+1h")
    assert judge(tmp_path, armored, f"{ALICE} {other.read_text()}") == "UNTRUSTED_KEY"


def test_certificate_with_bad_ca_signature(keys: Keys, tmp_path: Path) -> None:
    blob = dearmor(keys.sign(keys.cert("ed25519", "-n", ALICE, "-V", "-1h:+1h")))
    parts = fields(blob)
    cert = bytearray(parts[1])
    cert[-5] ^= 1  # inside the CA's signature
    armored = armor(parts[0] + b"".join(string(p) for p in [bytes(cert), *parts[2:]]))
    assert judge(tmp_path, armored, ca_line(keys)) == "BAD_SIGNATURE"


# Parsing the file itself.


def test_parse_allowed_signers(keys: Keys) -> None:
    ed = keys.pub("ed25519")
    text = (
        "# team\n"
        "\n"
        f'  alice@example.org,"bob smith" {ed} alice laptop\r\n'
        f'*@example.org namespaces="git,file",valid-after="20240101Z",cert-authority {keys.pub("ca")}\n'
    )
    first, second = parse_allowed_signers(text, "allowed_signers")
    assert first.principals == ("alice@example.org", "bob smith")
    assert (first.key_type, first.key_blob) == ("ssh-ed25519", base64.b64decode(ed.split()[1]))
    assert (first.namespaces, first.valid_after, first.valid_before, first.cert_authority, first.line) == (
        None, None, None, False, 3,
    )
    assert second == AllowedSigner(
        ("*@example.org",), "ssh-ed25519", key_blob(keys, "ca"), ("git", "file"),
        datetime(2024, 1, 1, tzinfo=UTC), None, True, 4,
    )


@pytest.mark.parametrize(
    "options",
    [
        "no-touch-required",
        "namespaces=git",
        'namespaces="git",namespaces="file"',
        'valid-after="2024"',
        'valid-after="20240230"',
        'valid-after="20250101",valid-before="20240101"',
        "cert-authority,",
        'namespaces="git',
    ],
)
def test_bad_options_name_the_line(keys: Keys, options: str) -> None:
    with pytest.raises(BadInput) as exc:
        parse_allowed_signers(f"# c\n{ALICE} {options} {keys.pub('ed25519')}\n", "signers")
    assert (exc.value.file, exc.value.line) == ("signers", 2)


@pytest.mark.parametrize(
    "entry",
    [
        f"{ALICE}",
        f"{ALICE} ssh-ed25519",
        f"{ALICE} ssh-ed25519 AAAA!!!",
        f"{ALICE} ssh-rsa AAAAC3NzaC1lZDI1NTE5AAAAIOmpl6dqIbF/ORWSVrpm1Ab6ZWwa8Oqa5+hrkT3HlVDL",
        f'"{ALICE} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOmpl6dqIbF/ORWSVrpm1Ab6ZWwa8Oqa5+hrkT3HlVDL',
    ],
)
def test_bad_keys_name_the_line(entry: str) -> None:
    with pytest.raises(BadInput, match="signers:1:"):
        parse_allowed_signers(entry + "\n", "signers")


@pytest.mark.parametrize("refused", ["dsa", "unknown"])
def test_a_line_of_a_key_type_we_refuse_is_skipped_with_a_warning_said_once(
        keys: Keys, tmp_path: Path, caplog: pytest.LogCaptureFixture, refused: str) -> None:
    # A DSA key left in the file from before (or a type this verifier does not know) must not
    # take the valid ed25519 line below it down with it: ssh-keygen skips such a line, and so do we.
    other = (line(keys, keys.new("dsa", "-t", "dsa").name, "old@example.org") if refused == "dsa"
             else f"new@example.org ssh-foo {base64.b64encode(string('ssh-foo') + string(b'x' * 32)).decode()}\n")
    allowed = f"# the team\n{other}{line(keys, 'ed25519')}"
    armored = keys.sign(keys.root / "ed25519")

    with caplog.at_level("WARNING", logger="reconciler.trust"):
        assert judge(tmp_path, armored, allowed) is None  # accepted, as ssh-keygen accepts it
        assert len(parse_allowed_signers(allowed, "allowed")) == 1
        parse_allowed_signers(allowed, "allowed")

    said = [r.getMessage() for r in caplog.records if r.name == "reconciler.trust"]
    why = "DSA keys are not accepted" if refused == "dsa" else "unsupported key type 'ssh-foo'"
    assert said == [f"allowed:2: allowed signers: {why}: line skipped"], said
    # A line that is broken, not merely of a refused type, still refuses the whole file.
    with pytest.raises(BadInput, match="allowed:4: allowed signers: invalid ssh-dss key"):
        parse_allowed_signers(f"{allowed}{ALICE} ssh-dss AAAA!!!\n", "allowed")


def test_naive_time_is_a_programming_error(keys: Keys) -> None:
    sig = verify(keys.sign(keys.root / "ed25519"), PAYLOAD)
    with pytest.raises(ValueError):
        find_signer(parse_allowed_signers(line(keys, "ed25519"), "f"), sig, ALICE, datetime(2030, 1, 1))


# No corruption of a valid signature verifies, and nothing but SignatureError escapes.


@pytest.fixture(scope="session")
def samples(keys: Keys) -> list[bytes]:
    return [
        keys.sign(keys.root / "ed25519"),
        keys.sign(keys.root / "ecdsa256"),
        keys.sign(keys.root / "rsa"),
        keys.sign(keys.cert("ecdsa384", "-n", ALICE, "-V", "-1h:+1h")),
    ]


def _rejected(armored: bytes) -> None:
    with pytest.raises(SignatureError):
        verify(armored, PAYLOAD)


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_flipped_blob_bytes_never_verify(samples: list[bytes], data: st.DataObject) -> None:
    blob = bytearray(dearmor(data.draw(st.sampled_from(samples))))
    pos = data.draw(st.integers(0, len(blob) - 1))
    blob[pos] ^= data.draw(st.integers(1, 255))
    _rejected(armor(bytes(blob)))


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_flipped_armour_bytes_never_verify(samples: list[bytes], data: st.DataObject) -> None:
    armored = bytearray(data.draw(st.sampled_from(samples)))
    # Whitespace is free-form and text after the END line is ignored (also by ssh-keygen).
    end = armored.index(b"-----END SSH SIGNATURE-----") + len(b"-----END SSH SIGNATURE-----")
    pos = data.draw(st.sampled_from([i for i in range(end) if armored[i] not in b" \t\n\r\v\f"]))
    armored[pos] ^= data.draw(st.integers(1, 255))
    _rejected(bytes(armored))


def _blob(*fields: bytes) -> str:
    return base64.b64encode(b"".join(struct.pack(">I", len(f)) + f for f in fields)).decode()


def test_a_short_ed25519_key_is_refused_where_it_is_listed() -> None:
    entry = f"{ALICE} ssh-ed25519 {_blob(b'ssh-ed25519', bytes(31))}"
    with pytest.raises(BadInput, match="signers:1: .*ed25519 key is 32 bytes, not 31"):
        parse_allowed_signers(entry + "\n", "signers")


def test_reading_the_trust_root_loads_no_openssl_bindings(keys: Keys) -> None:
    """An idle agent parses its allowed signers at start; the signature code loads with the
    first commit it verifies (issue 17: the idle agent's memory)."""
    text = f"{ALICE} {keys.pub('ed25519')}\n{ALICE} {keys.pub('ecdsa256')}\n{ALICE} {keys.pub('rsa')}\n"
    probe = ("import sys; from reconciler.trust.sshsig import parse_allowed_signers as p; "
             f"assert len(p({text!r}, 's')) == 3; print('cryptography' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
