"""The signature check a fleet's reader runs once a note (issue 40: ``status --fleet`` of 10,000
nodes): ed25519 verified by libsodium, a key parsed once a note, and the same verdicts, texts
and reasons as the careful path (OpenSSL's verify, the key read field by field, every
allowed-signers line tried) on many generated inputs, and as ``ssh-keygen`` on its own
signatures. Where libsodium is stricter than OpenSSL and ssh-keygen (a small-order key signs
every message), the refusal is the point."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import struct
import subprocess
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from needs import unavailable

from reconciler.core.errors import ReconcilerError
from reconciler.trust import sshkeys, sshsig
from reconciler.trust.notesig import NAMESPACE, NoteKey, NoteTrust, parse_nodes, payload, public_line, verified
from reconciler.trust.sshkeys import SignatureError, check_signature, parse_key
from reconciler.trust.sshsig import find_signer, verify

P = 2**255 - 19  # the field of ed25519
L = 2**252 + 27742317777372353535851937790883648493  # the order of its base point
AT = datetime(2026, 11, 27, tzinfo=UTC)
PAYLOAD = b"tree 4b825dc642cb6eb9a060e54bf8d69288fbee4904\n\nchange\n"


def string(data: bytes | str) -> bytes:
    raw = data.encode() if isinstance(data, str) else data
    return struct.pack(">I", len(raw)) + raw


def ed_blob(raw: bytes) -> bytes:
    return string("ssh-ed25519") + string(raw)


def armor(key_blob: bytes, raw_signature: bytes, namespace: str = "git") -> bytes:
    blob = (b"SSHSIG" + struct.pack(">I", 1) + string(key_blob) + string(namespace) + string(b"")
            + string("sha512") + string(raw_signature))
    b64 = base64.b64encode(blob)
    return (b"-----BEGIN SSH SIGNATURE-----\n" + b"\n".join(b64[i : i + 70] for i in range(0, len(b64), 70))
            + b"\n-----END SSH SIGNATURE-----\n")


def to_sign(payload: bytes, namespace: str = "git") -> bytes:
    return b"SSHSIG" + string(namespace) + string(b"") + string("sha512") + string(hashlib.sha512(payload).digest())


def outcome(check: object, *args: object) -> tuple[str, str] | None:
    """None when it passed; else what a user is told: the reason code and the text."""
    try:
        check(*args)  # type: ignore[operator]
    except SignatureError as exc:
        return exc.reason or "", str(exc)
    return None


def openssl_verdict(public: bytes, signature: bytes, data: bytes) -> tuple[str, str] | None:
    """The careful path's verdict on an ssh-ed25519 signature blob: OpenSSL (through
    cryptography), after the same wire checks."""
    r = sshkeys.WireReader(signature)
    try:
        alg = r.text()
        if alg != "ssh-ed25519":
            raise sshkeys.bad_signature(f"signature algorithm {alg!r} does not fit a ssh-ed25519 key")
        sig = r.string()
        r.done("signature")
    except SignatureError as exc:
        return exc.reason or "", str(exc)
    try:
        ed25519.Ed25519PublicKey.from_public_bytes(public).verify(sig, data)
    except (InvalidSignature, ValueError):
        return "BAD_SIGNATURE", "signature does not verify"
    return None


@pytest.fixture(scope="module")
def ssh_keygen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("ssh-keygen") is None:
        unavailable("ssh-keygen", "these tests compare with OpenSSH's own signatures")
    root = tmp_path_factory.mktemp("verify-speed")
    for name in ("alice", "bob"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(root / name)], check=True)
    return root


def keygen_sign(root: Path, name: str, payload: bytes, namespace: str = "git") -> bytes:
    (root / "msg").write_bytes(payload)
    (root / "msg.sig").unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-Y", "sign", "-f", str(root / name), "-n", namespace, str(root / "msg")],
                   check=True, capture_output=True)
    return (root / "msg.sig").read_bytes()


def keygen_verdict(root: Path, armored: bytes, key_blob: bytes, payload: bytes) -> bool:
    (root / "allowed").write_text(f"alice ssh-ed25519 {base64.b64encode(key_blob).decode()}\n")
    (root / "forged.sig").write_bytes(armored)
    done = subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(root / "allowed"), "-I", "alice", "-n", "git",
                           "-s", str(root / "forged.sig")], input=payload, capture_output=True)
    return done.returncode == 0


def blob_of(root: Path, name: str) -> bytes:
    return base64.b64decode((root / f"{name}.pub").read_text().split()[1])


# Libsodium against OpenSSL and ssh-keygen.


@pytest.mark.parametrize("public", [(1).to_bytes(32, "little"), (P + 1).to_bytes(32, "little")],
                         ids=["identity", "identity-non-canonical"])
def test_a_small_order_key_signs_nothing_though_openssl_and_ssh_keygen_take_its_forgery(
        ssh_keygen: Path, public: bytes) -> None:
    # R = the identity, s = 0: [s]B = R + [h]A for every message when A is the identity. Only a
    # trust/nodes or allowed-signers line could name such a key; it must not make every note its node's.
    forged = string("ssh-ed25519") + string((1).to_bytes(32, "little") + bytes(32))
    armored = armor(ed_blob(public), forged)
    assert keygen_verdict(ssh_keygen, armored, ed_blob(public), b"anything at all")
    assert openssl_verdict(public, forged, to_sign(b"anything at all")) is None
    assert outcome(verify, armored, b"anything at all") == ("BAD_SIGNATURE", "signature does not verify")


def test_ssh_keygen_signatures_verify_and_damaged_ones_are_refused_as_before(ssh_keygen: Path) -> None:
    armored = keygen_sign(ssh_keygen, "alice", PAYLOAD)
    alice, bob = blob_of(ssh_keygen, "alice"), blob_of(ssh_keygen, "bob")
    assert verify(armored, PAYLOAD).key_blob == alice
    raw = base64.b64decode(b"".join(armored.strip().split(b"\n")[1:-1]))
    sig = raw[-64:]  # R || s, the envelope's last field
    assert raw.endswith(string(string("ssh-ed25519") + string(sig)))
    bad = ("BAD_SIGNATURE", "signature does not verify")
    assert outcome(verify, armored, PAYLOAD + b"x") == bad  # altered payload
    assert outcome(verify, armor(bob, string("ssh-ed25519") + string(sig)), PAYLOAD) == bad  # another key
    assert outcome(verify, armor(alice, string("ssh-ed25519") + string(sig[:63])), PAYLOAD) == bad  # truncated
    assert outcome(verify, armor(alice, string("ssh-ed25519") + string(sig + b"\0")), PAYLOAD) == bad  # extended
    assert outcome(verify, armor(alice, string("ssh-ed25519") + string(b"")), PAYLOAD) == bad  # empty
    s = (int.from_bytes(sig[32:], "little") + L).to_bytes(32, "little")  # the same s, not reduced
    assert outcome(verify, armor(alice, string("ssh-ed25519") + string(sig[:32] + s)), PAYLOAD) == bad
    flipped = bytes([sig[0] ^ 1]) + sig[1:]
    assert outcome(verify, armor(alice, string("ssh-ed25519") + string(flipped)), PAYLOAD) == bad
    assert outcome(verify, armor(alice, string("ssh-ed25519") + string(sig) + b"\0"), PAYLOAD) == (
        "BAD_SIGNATURE", "trailing data after signature")
    assert outcome(verify, armor(alice, string("ssh-rsa") + string(sig)), PAYLOAD) == (
        "BAD_SIGNATURE", "signature algorithm 'ssh-rsa' does not fit a ssh-ed25519 key")
    assert outcome(verify, armor(alice, string("ssh-ed25519") + struct.pack(">I", 65) + sig), PAYLOAD) == (
        "BAD_SIGNATURE", "truncated data")


def test_a_checked_ed25519_signature_builds_no_openssl_key(ssh_keygen: Path) -> None:
    armored = keygen_sign(ssh_keygen, "bob", PAYLOAD)
    parse_key.cache_clear()
    verify(armored, PAYLOAD)
    key = parse_key(blob_of(ssh_keygen, "bob"))
    assert "public" not in key.__dict__  # libsodium took the 32 bytes; OpenSSL's object is built only when asked
    assert isinstance(key.public, ed25519.Ed25519PublicKey)


_SECRETS = [ed25519.Ed25519PrivateKey.from_private_bytes(bytes([n]) * 32) for n in range(1, 4)]
_PUBLICS = [k.public_key().public_bytes_raw() for k in _SECRETS]


@st.composite
def ed25519_cases(draw: st.DrawFn) -> tuple[bytes, bytes, bytes]:
    """(public key, SSH signature blob, signed data): a real signature, often damaged."""
    signer = draw(st.integers(0, len(_SECRETS) - 1))
    data = draw(st.binary(max_size=200))
    sig = _SECRETS[signer].sign(data)
    public = _PUBLICS[draw(st.sampled_from([signer, signer, signer, (signer + 1) % len(_SECRETS)]))]
    damage = draw(st.sampled_from(["none", "sig-bit", "data-bit", "cut", "extend", "s+L", "random-key", "alg"]))
    if damage == "sig-bit":
        bit = draw(st.integers(0, 511))
        sig = bytes(b ^ (1 << (bit % 8)) if i == bit // 8 else b for i, b in enumerate(sig))
    elif damage == "data-bit" and data:
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + bytes([data[i] ^ 0x80]) + data[i + 1 :]
    elif damage == "cut":
        sig = sig[: draw(st.integers(0, 63))]
    elif damage == "extend":
        sig += draw(st.binary(min_size=1, max_size=3))
    elif damage == "s+L":
        sig = sig[:32] + ((int.from_bytes(sig[32:], "little") + L) % 2**256).to_bytes(32, "little")
    elif damage == "random-key":
        public = draw(st.binary(min_size=32, max_size=32))
    alg = "ssh-ed25519" if damage != "alg" else draw(st.sampled_from(["ssh-rsa", "ssh-ed25519\0", ""]))
    return public, string(alg) + string(sig), data


@settings(max_examples=400, deadline=None)
@given(ed25519_cases())
def test_ed25519_verdicts_are_openssl_s_on_real_and_damaged_signatures(case: tuple[bytes, bytes, bytes]) -> None:
    public, signature, data = case
    assert outcome(check_signature, parse_key(ed_blob(public)), signature, data) == openssl_verdict(public, signature, data)


# One parse a key: the quick reading of a plain ed25519 key against the careful one.


@st.composite
def key_blobs(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["ed25519", "near", "random"]))
    if kind == "random":
        return draw(st.binary(max_size=80))
    blob = bytearray(ed_blob(draw(st.binary(min_size=32, max_size=32))))
    if kind == "near":  # one byte changed, or cut, or grown: what the quick path must not take
        how = draw(st.sampled_from(["byte", "cut", "grow"]))
        if how == "byte":
            i = draw(st.integers(0, len(blob) - 1))
            blob[i] = draw(st.integers(0, 255))
        elif how == "cut":
            del blob[draw(st.integers(0, len(blob) - 1)) :]
        else:
            blob += draw(st.binary(min_size=1, max_size=4))
    return bytes(blob)


def _read(parse: object, blob: bytes) -> object:
    try:
        return parse(blob)  # type: ignore[operator]
    except ReconcilerError as exc:
        return type(exc), str(exc), exc.reason


@settings(max_examples=500, deadline=None)
@given(key_blobs())
def test_a_key_read_quickly_is_the_key_read_field_by_field(blob: bytes) -> None:
    parse_key.cache_clear()
    quick, careful = _read(parse_key, blob), _read(sshkeys._parse_key, blob)
    assert quick == careful
    if isinstance(quick, sshkeys.SshKey):
        assert isinstance(careful, sshkeys.SshKey) and vars(quick) == vars(careful)


# A note's verdict: the indexed judge against verify + find_signer over every line.


class Fleet:
    def __init__(self, root: Path) -> None:
        def make(name: str, kind: str) -> NoteKey:
            private = ed25519.Ed25519PrivateKey.generate() if kind == "ed25519" else ec.generate_private_key(ec.SECP256R1())
            return NoteKey(root / name, private)

        self.keys = {n: make(n, "ecdsa" if n == "n3" else "ed25519") for n in ("n1", "n2", "n3", "n4")}
        self.stranger = make("stranger", "ed25519")
        lines = [public_line(n, k) for n, k in self.keys.items() if n != "n4"]
        lines.append(f"n4,n5 {self.keys['n4'].public_line}")  # no namespaces option: any namespace
        lines.append(f'n1 namespaces="git" {self.keys["n2"].public_line}')  # n2's key, for n1, elsewhere
        lines.append(f'n6 valid-before="20200101" {self.keys["n1"].public_line}')  # expired
        self.trust = NoteTrust(parse_nodes("\n".join(lines) + "\n", "trust/nodes"), "signed", "c0")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    return Fleet(tmp_path_factory.mktemp("fleet"))


NODES = ["n1", "n2", "n3", "n4", "n5", "n6", "n7"]


@st.composite
def notes(draw: st.DrawFn, fleet: Fleet) -> tuple[str, str, dict[str, object]]:
    node = draw(st.sampled_from(NODES))
    obj = draw(st.sampled_from(["a" * 40, "b" * 40]))
    own = fleet.keys.get(node, fleet.stranger)
    signer = draw(st.sampled_from([own, own, own, *fleet.keys.values(), fleet.stranger]))
    body: dict[str, object] = {"format": 1, "node": node, "state": draw(st.sampled_from(["applied", "failed"]))}
    sealed = signer.seal(draw(st.sampled_from([node, node, node, *NODES])),
                         draw(st.sampled_from([obj, obj, obj, "a" * 40])), body)
    damage = draw(st.sampled_from(["none"] * 6 + ["body", "sig-char", "sig-type", "no-sig"]))
    if damage == "body":
        sealed["state"] = "other"
    elif damage == "sig-char":
        text = str(sealed["sig"])
        i = draw(st.integers(30, len(text) - 30))
        sealed["sig"] = text[:i] + ("A" if text[i] != "A" else "B") + text[i + 1 :]
    elif damage == "sig-type":
        sealed["sig"] = 7
    elif damage == "no-sig":
        del sealed["sig"]
    return node, obj, sealed


def careful_judge(trust: NoteTrust, node: str, obj: str, data: dict[str, object]) -> str | None:
    """What a note is worth by the definitions: its signature verified, then every line of
    trust/nodes tried in turn, each line's key parsed again (what the judge's index by key and
    the keys kept from parsing the lines must not change)."""
    sig = data.get("sig")
    if sig is None:
        return "unsigned" if trust.listed(node) else f"unsigned, and {node} has no key in trust/nodes"
    if not isinstance(sig, str):
        return "the signature is not an SSH signature"
    try:
        every = [replace(s, plain_blob=b"") for s in trust.signers]
        find_signer(every, verified(node, obj, data), node, AT, NAMESPACE)
    except (ReconcilerError, ValueError) as exc:
        return f"bad signature: {exc}"
    return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_a_note_s_verdict_is_the_careful_one(fleet: Fleet, data: st.DataObject) -> None:
    node, obj, note = data.draw(notes(fleet))
    parse_key.cache_clear()
    fresh = NoteTrust(fleet.trust.signers, fleet.trust.policy, fleet.trust.origin)  # its index built anew
    assert fresh.judge(node, obj, note, AT) == careful_judge(fleet.trust, node, obj, note)



# A fleet's trust/nodes line read in one match, against the careful reader.

_ED_KEY = "ssh-ed25519 " + base64.b64encode(ed_blob(_PUBLICS[0])).decode()
_EC_KEY = NoteKey(Path("ec"), ec.generate_private_key(ec.SECP256R1())).public_line


@st.composite
def allowed_lines(draw: st.DrawFn) -> str:
    """Lines of public_line's shape, each part (or none) drawn from a few that are not."""
    part = draw(st.sampled_from(["none", "none", "none", "principal", "option", "key", "comment", "sep"]))

    def pick(name: str, plain: str, others: st.SearchStrategy[str]) -> str:
        return draw(others) if part == name else plain

    principal = pick("principal", draw(st.from_regex(r"[a-z0-9.,*?!-]{1,12}", fullmatch=True)), st.sampled_from(["a,b", "*.example.org", "cert-authority", "x=y", ""])
                     | st.text(alphabet='ab,*"= \t\x1c\u00a0', max_size=6))
    namespaces = draw(st.sampled_from(["reconciler-note", "git"]) | st.text(alphabet="ab-,*", max_size=8))
    option = pick("option", f'namespaces="{namespaces}"', st.sampled_from([
        'namespaces=""', 'namespaces="a,b"', 'NAMESPACES="x"', 'namespaces="a\\"b"', 'namespaces="x",cert-authority',
        'namespaces="x" ', 'cert-authority', 'valid-before="20300101"', 'namespaces="x', 'namespaces=x', ""])
        | st.text(alphabet='namespces="x,\\ \t', max_size=12))
    plain_key = draw(st.sampled_from([_ED_KEY, _EC_KEY, *(f"ssh-ed25519 {base64.b64encode(ed_blob(k)).decode()}"
                                                         for k in _PUBLICS[1:])]))
    key = pick("key", plain_key, st.sampled_from([_EC_KEY, _ED_KEY[:-4], _ED_KEY.replace(" ", "  "),
                                                _ED_KEY.replace(" ", "\x1c"), "ssh-rsa " + _ED_KEY.split()[1],
                                                "ssh-ed25519 !!", "ssh-dss " + _ED_KEY.split()[1]]))
    comment = pick("comment", "", st.sampled_from([" comment", "\tc", " a b", "\u00a0c"]))
    sep = pick("sep", " ", st.sampled_from(["  ", "\t", "\u00a0", "\x1c"]))
    return f"{principal}{sep}{option}{sep if option else ''}{key}{comment}"


def _line(parse: object, text: str) -> object:
    try:
        signer = parse(text, 7)  # type: ignore[operator]
    except ValueError as exc:
        return type(exc), str(exc)
    return vars(signer)  # plain_blob too, which equality leaves out


@settings(max_examples=600, deadline=None)
@given(allowed_lines())
def test_a_trust_nodes_line_read_in_one_match_is_the_line_read_carefully(text: str) -> None:
    assert _line(sshsig._parse_line, text) == _line(sshsig._parse_line_careful, text)


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                     max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=6), _JSON, max_size=5))
def test_a_payload_is_the_canonical_json_the_module_defines(body: dict[str, object]) -> None:
    def defined() -> bytes:
        text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
        return b"reconciler-note 1\nn1\n" + b"a" * 40 + b"\n" + text.encode()

    def made() -> bytes:
        return payload("n1", "a" * 40, body)

    assert _value_or_error(made) == _value_or_error(defined)


def _value_or_error(make: object) -> object:
    try:
        return make()  # type: ignore[operator]
    except ValueError as exc:  # NaN, infinities: no canonical form
        return type(exc), str(exc)
