"""A second look at ed25519 checked by libsodium (commit 149f7a3): where it parts from OpenSSL
and ``ssh-keygen``, it only refuses. Signatures are made here from a known scalar (the RFC 8032
arithmetic, a few lines), so that odd but well-formed ones can be built: a certificate of a
small-order CA, a real key's signature whose R is the identity, an unreduced s, and a key with a
torsion part, where a cofactored check (as ZIP-215 verifiers make) would take what OpenSSL and
ssh-keygen refuse."""

from __future__ import annotations

import base64
import hashlib
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from needs import unavailable
from test_verify_speed import L, P, armor, ed_blob, openssl_verdict, outcome, string, to_sign

from reconciler.trust.sshkeys import check_signature, parse_key
from reconciler.trust.sshsig import verify

REFUSED = ("BAD_SIGNATURE", "signature does not verify")
PAYLOAD = b"tree 4b825dc642cb6eb9a060e54bf8d69288fbee4904\n\nreview\n"

# Ed25519's curve, affine (x, y): slow and plain, enough for a few signatures.
_D = -121665 * pow(121666, P - 2, P) % P
Point = tuple[int, int]
IDENTITY: Point = (0, 1)


def _add(p: Point, q: Point) -> Point:
    (x1, y1), (x2, y2) = p, q
    t = _D * x1 * x2 * y1 * y2
    return (x1 * y2 + x2 * y1) * pow(1 + t, P - 2, P) % P, (y1 * y2 + x1 * x2) * pow(1 - t, P - 2, P) % P


def _mul(p: Point, n: int) -> Point:
    out = IDENTITY
    while n:
        out, p, n = (_add(out, p) if n & 1 else out), _add(p, p), n >> 1
    return out


def _point(y: int) -> Point | None:
    xx = (y * y - 1) * pow(_D * y * y + 1, P - 2, P) % P
    x = pow(xx, (P + 3) // 8, P)
    if (x * x - xx) % P:
        x = x * pow(2, (P - 1) // 4, P) % P
    return (x, y) if (x * x - xx) % P == 0 else None


def _enc(p: Point) -> bytes:
    return (p[1] | (p[0] & 1) << 255).to_bytes(32, "little")


def _base() -> Point:
    found = _point(4 * pow(5, P - 2, P) % P)
    assert found is not None
    return (found[0] if found[0] % 2 == 0 else P - found[0], found[1])  # x even, as RFC 8032's B


BASE = _base()


def _h(*parts: bytes) -> int:
    return int.from_bytes(hashlib.sha512(b"".join(parts)).digest(), "little") % L


class Signer:
    """An ed25519 key pair from a seed, as OpenSSH and OpenSSL derive it, that signs with any nonce."""

    def __init__(self, seed: bytes, torsion: Point = IDENTITY) -> None:
        digest = hashlib.sha512(seed).digest()
        self.a = (int.from_bytes(digest[:32], "little") & ((1 << 254) - 8)) | (1 << 254)
        self.public = _enc(_add(_mul(BASE, self.a), torsion))
        if torsion == IDENTITY:
            assert self.public == ed25519.Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes_raw()

    def sign(self, data: bytes, nonce: int, unreduced: bool = False) -> bytes:
        r_point = _enc(_mul(BASE, nonce))
        s = (nonce + _h(r_point, self.public, data) * self.a) % L + (L if unreduced else 0)
        return string("ssh-ed25519") + string(r_point + s.to_bytes(32, "little"))


ALICE = Signer(bytes(range(32)))


@pytest.fixture(scope="module")
def keygen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("ssh-keygen") is None:
        unavailable("ssh-keygen", "these tests compare with OpenSSH's own verdicts")
    return tmp_path_factory.mktemp("review")


def keygen_takes(root: Path, armored: bytes, allowed: str) -> bool:
    (root / "allowed").write_text(allowed + "\n")
    (root / "msg.sig").write_bytes(armored)
    done = subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(root / "allowed"), "-I", "alice", "-n", "git",
                           "-s", str(root / "msg.sig")], input=PAYLOAD, capture_output=True)
    return done.returncode == 0


def b64(blob: bytes) -> str:
    return base64.b64encode(blob).decode()


def test_a_certificate_from_a_small_order_ca_is_refused_though_ssh_keygen_takes_any_such_certificate(
        keygen: Path) -> None:
    # The identity point as a CA, R = identity and s = 0 as its "signature": every certificate
    # verifies, for any key and principal. Only an allowed-signers line could name such a CA.
    ca = ed_blob((1).to_bytes(32, "little"))
    body = (string("ssh-ed25519-cert-v01@openssh.com") + string(bytes(32)) + string(ALICE.public)
            + struct.pack(">QI", 1, 1) + string("id") + string(string("alice")) + struct.pack(">QQ", 0, 2**64 - 1)
            + string(b"") * 3 + string(ca))
    cert = body + string(string("ssh-ed25519") + string((1).to_bytes(32, "little") + bytes(32)))
    armored = armor(cert, ALICE.sign(to_sign(PAYLOAD), nonce=5))
    assert keygen_takes(keygen, armored, f"alice cert-authority ssh-ed25519 {b64(ca)}")
    assert outcome(verify, armored, PAYLOAD) == REFUSED


def test_odd_signatures_of_a_real_key_ssh_keygen_takes_are_refused(keygen: Path) -> None:
    allowed = f"alice ssh-ed25519 {b64(ed_blob(ALICE.public))}"
    signed = to_sign(PAYLOAD)
    honest = armor(ed_blob(ALICE.public), ALICE.sign(signed, nonce=12345))
    assert keygen_takes(keygen, honest, allowed) and outcome(verify, honest, PAYLOAD) is None
    # s + L (ssh-keygen reads s up to 2^253, OpenSSL and libsodium only below L): refused before too
    unreduced = ALICE.sign(signed, nonce=12345, unreduced=True)
    # a nonce of 0 makes R the identity: libsodium refuses an R of small order, OpenSSL takes it
    zero_nonce = ALICE.sign(signed, nonce=0)
    assert openssl_verdict(ALICE.public, unreduced, signed) == REFUSED
    assert openssl_verdict(ALICE.public, zero_nonce, signed) is None
    for raw in (unreduced, zero_nonce):
        armored = armor(ed_blob(ALICE.public), raw)
        assert keygen_takes(keygen, armored, allowed)
        assert outcome(verify, armored, PAYLOAD) == REFUSED


def _order_8_point() -> Point:
    y = 2
    while True:
        found = _point(y)
        if found is not None and _mul(found, 4) != IDENTITY:
            t = _mul(found, L)  # its part of order 8 (or less)
            if _mul(t, 4) != IDENTITY:
                return t
        y += 1


def test_a_key_with_a_torsion_part_verifies_exactly_what_openssl_verifies() -> None:
    # [s]B = R + [h]A' holds for A' = aB + T only when [h]T = 0; checked times 8 (cofactored) it
    # would hold for every h: signatures OpenSSL and ssh-keygen refuse would then count.
    torsion = _order_8_point()
    assert _mul(torsion, 8) == IDENTITY and _mul(torsion, 4) != IDENTITY
    mixed = Signer(bytes(range(32)), torsion)
    key = parse_key(ed_blob(mixed.public))
    seen = set()
    for nonce in range(1, 64):
        raw = mixed.sign(b"data", nonce)
        h = _h(raw[19:51], mixed.public, b"data")
        verdict = openssl_verdict(mixed.public, raw, b"data")
        assert verdict == (None if h % 8 == 0 else REFUSED)
        assert outcome(check_signature, key, raw, b"data") == verdict
        seen.add(verdict)
        if len(seen) == 2:
            break
    assert seen == {None, REFUSED}


def _cert_line_key() -> str:
    """An ed25519 user certificate of ALICE's key, signed by a real ed25519 CA."""
    ca = Signer(bytes(range(1, 33)))
    body = (string("ssh-ed25519-cert-v01@openssh.com") + string(bytes(32)) + string(ALICE.public)
            + struct.pack(">QI", 1, 1) + string("id") + string(string("n1")) + struct.pack(">QQ", 0, 2**64 - 1)
            + string(b"") * 3 + string(ed_blob(ca.public)))
    return f"ssh-ed25519-cert-v01@openssh.com {b64(body + string(ca.sign(body, nonce=7)))}"


def _line_keys() -> dict[str, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    def openssh(private: object) -> str:
        public = private.public_key()  # type: ignore[attr-defined]
        return str(public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode())

    sk = string("sk-ssh-ed25519@openssh.com") + string(ALICE.public) + string("ssh:")
    dss = string("ssh-dss") + string(b"\x01") * 4  # refused by its type alone
    return {"rsa": openssh(rsa.generate_private_key(65537, 2048)),
            **{f"ecdsa-{c.name}": openssh(ec.generate_private_key(c)) for c in (ec.SECP256R1(), ec.SECP384R1(), ec.SECP521R1())},
            "certificate": _cert_line_key(), "security-key": f"sk-ssh-ed25519@openssh.com {b64(sk)}",
            "dsa": f"ssh-dss {b64(dss)}"}


def _read_line(parse: object, text: str) -> object:
    from reconciler.trust import sshsig

    try:
        signer = parse(text, 3)  # type: ignore[operator]
    except ValueError as exc:  # RefusedKeyType (DSA) too
        return type(exc), str(exc)
    assert isinstance(signer, sshsig.AllowedSigner)
    return vars(signer)  # plain_blob too, which find_signer and the notes' index use


def test_a_line_of_each_other_key_kind_read_in_one_match_is_the_line_read_carefully() -> None:
    # test_verify_speed's generated lines are of ed25519 and P-256 keys: here every kind a
    # trust/nodes line can name, written as public_line writes it (the one-match shape).
    from reconciler.trust import sshsig

    for kind, key in _line_keys().items():
        for text in (f'n1 namespaces="reconciler-note" {key}', f'n1,n2 namespaces="git,*" {key}'):
            assert sshsig._PLAIN_LINE.fullmatch(text), kind
            quick = _read_line(sshsig._parse_line, text)
            assert quick == _read_line(sshsig._parse_line_careful, text), kind
            if kind == "certificate":  # the bare key's blob, not the certificate's
                assert isinstance(quick, dict) and quick["plain_blob"] == ed_blob(ALICE.public)
