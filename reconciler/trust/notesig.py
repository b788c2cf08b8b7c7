"""Notes signed by the node that wrote them, and checked by every reader before they count.

A note steers other nodes (waves, barriers, disruption slots, cutovers), so it is judged like a
commit: by a key, never by where it was read. The writer signs, with its own SSH key, SSHSIG in
the namespace ``reconciler-note``, over::

    "reconciler-note 1\\n" NODE "\\n" OBJECT "\\n" canonical-JSON-of-the-body

so a signature is bound to the node it speaks for and to the object (commit, or the claim
object) it is attached to: a note copied onto another commit, or into another node's ref, does
not verify. The signature travels inside the note as ``"sig"``; the canonical body is the note
without it, with sorted keys and no spaces.

Which key speaks for which node is the repo's ``trust/nodes``, in the allowed-signers format
(``NODE [options] TYPE BASE64``: a principal is a node's name; ``cert-authority`` lines let an
SSH CA vouch for node keys; ``valid-before`` retires a key), changed only by a verified commit,
like the rest of the root. ``reconciler.yaml``'s ``trust.notes`` says whether unsigned notes may
still count while a fleet moves to signing (``unsigned-allowed``: only for nodes not yet listed
in ``trust/nodes``); the default is ``signed``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.core.errors import BadInput, ConfigError, ReconcilerError
from reconciler.trust import sshsig
from reconciler.trust.keyfile import SodiumEd25519, read_ed25519
from reconciler.trust.sshkeys import bad_signature, parse_key, wire_string

if TYPE_CHECKING:
    import pygit2

NAMESPACE = "reconciler-note"
NODES_FILE = "trust/nodes"
SIGNED, UNSIGNED_ALLOWED = "signed", "unsigned-allowed"
NOTE_POLICIES = (SIGNED, UNSIGNED_ALLOWED)
SIG_FIELD = "sig"
PROBE_OBJECT = "0" * 40  # what a node signs to learn whether its notes would count (never written)


# What json.dumps(body, sort_keys=True, ...) builds on every call, built once (a fleet's reader
# makes 10,000 payloads); encode() keeps no state between calls.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def payload(node: str, obj: str, body: Mapping[str, Any]) -> bytes:
    """What is signed: the node, the object the note is on, and the body's canonical bytes."""
    canonical = _CANONICAL.encode(body)
    return f"{NAMESPACE} 1\n{node}\n{obj}\n".encode() + canonical.encode()


class NoteKey:
    """A node's private SSH key (OpenSSH format, no passphrase): ed25519, ECDSA or RSA."""

    def __init__(self, path: Path, private: Any) -> None:
        self.path = path
        self._key = private
        if isinstance(private, SodiumEd25519):
            self.key_type, self.blob = "ssh-ed25519", private.blob
            self.public_line = f"{self.key_type} {base64.b64encode(self.blob).decode()}"
            return
        from cryptography.hazmat.primitives import serialization

        line = private.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                 serialization.PublicFormat.OpenSSH).decode()
        self.key_type, blob = line.split()[:2]
        self.blob = base64.b64decode(blob)
        self.public_line = f"{self.key_type} {blob}"

    @staticmethod
    def load(path: Path) -> NoteKey:
        check_private_mode(path)
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read the note key: {exc.strerror}", file=str(path)) from exc
        quick = read_ed25519(raw)  # the usual key, through libsodium (``trust.keyfile``)
        if quick is not None:
            return NoteKey(path, quick)
        from cryptography.exceptions import UnsupportedAlgorithm
        from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
        from cryptography.hazmat.primitives.serialization import load_ssh_private_key

        try:
            key = load_ssh_private_key(raw, password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:  # a cipher or key type it lacks: -Z, -sk
            raise ConfigError(f"not an unencrypted OpenSSH private key ({exc})", file=str(path)) from exc
        if not isinstance(key, ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
            raise ConfigError(f"a note key must be ed25519, ECDSA or RSA, not {type(key).__name__}", file=str(path))
        if isinstance(key, rsa.RSAPrivateKey) and key.key_size < 2048:
            raise ConfigError("an RSA note key must have at least 2048 bits", file=str(path))
        return NoteKey(path, key)

    @staticmethod
    def load_or_create(path: Path) -> NoteKey:
        """The key at ``path``; a new ed25519 key there (0600) when there is none yet."""
        if not path.exists():
            from cryptography.hazmat.primitives import serialization
            from cryptography.hazmat.primitives.asymmetric import ed25519

            from reconciler.core.atomic import atomic_write

            key = ed25519.Ed25519PrivateKey.generate()
            pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                    serialization.NoEncryption())
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, pem, 0o600)
        return NoteKey.load(path)

    def _raw_signature(self, data: bytes) -> bytes:
        key = self._key
        if isinstance(key, SodiumEd25519):
            return wire_string(self.key_type) + wire_string(key.sign(data))
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
        from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

        if isinstance(key, ed25519.Ed25519PrivateKey):
            return wire_string(self.key_type) + wire_string(key.sign(data))
        if isinstance(key, ec.EllipticCurvePrivateKey):
            hash_for = {256: hashes.SHA256(), 384: hashes.SHA384(), 521: hashes.SHA512()}[key.curve.key_size]
            r, s = decode_dss_signature(key.sign(data, ec.ECDSA(hash_for)))
            return wire_string(self.key_type) + wire_string(_mpint(r) + _mpint(s))
        assert isinstance(key, rsa.RSAPrivateKey)
        return wire_string("rsa-sha2-512") + wire_string(key.sign(data, padding.PKCS1v15(), hashes.SHA512()))

    def sign(self, message: bytes) -> str:
        """An armoured SSHSIG signature of ``message`` in the notes' namespace (what
        ``ssh-keygen -Y sign -n reconciler-note`` writes)."""
        import hashlib

        signed = (b"SSHSIG" + wire_string(NAMESPACE) + wire_string(b"") + wire_string("sha512")
                  + wire_string(hashlib.sha512(message).digest()))
        blob = (b"SSHSIG" + (1).to_bytes(4, "big") + wire_string(self.blob) + wire_string(NAMESPACE)
                + wire_string(b"") + wire_string("sha512") + wire_string(self._raw_signature(signed)))
        text = base64.b64encode(blob).decode()
        lines = [text[i:i + 70] for i in range(0, len(text), 70)]
        return "-----BEGIN SSH SIGNATURE-----\n" + "\n".join(lines) + "\n-----END SSH SIGNATURE-----\n"

    def signed(self, node: str, obj: str, data: Mapping[str, Any]) -> bool:
        """Did this key sign ``data`` as ``node``'s note on ``obj``? (A node reading back its own
        notes from a remote that could have written them.)"""
        try:
            found = verified(node, obj, data)
        except (ReconcilerError, ValueError, TypeError, OverflowError, UnicodeError):
            return False
        return parse_key(found.key_blob).plain_blob == parse_key(self.blob).plain_blob

    def seal(self, node: str, obj: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """``body`` with this key's signature for ``node``'s note on ``obj``."""
        plain = {k: v for k, v in body.items() if k != SIG_FIELD}
        return {**plain, SIG_FIELD: self.sign(payload(node, obj, plain))}


def verified(node: str, obj: str, data: Mapping[str, Any]) -> sshsig.Signature:
    """The signature ``data`` carries, checked over ``node``'s note on ``obj`` (whose key it is
    says nothing yet). Raises ``ReconcilerError`` (or a ``ValueError`` of the payload's JSON)."""
    sig = data.get(SIG_FIELD)
    if not isinstance(sig, str):
        raise bad_signature("no signature")
    plain = {k: v for k, v in data.items() if k != SIG_FIELD}
    return sshsig.verify(sig.encode(), payload(node, obj, plain), NAMESPACE)


def check_private_mode(path: Path) -> None:
    """As ssh does for a private key: one that others can read speaks for anyone who read it."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError(f"cannot read the note key: {exc.strerror}", file=str(path)) from exc
    if mode & 0o077:
        raise ConfigError(f"permissions {mode & 0o777:04o} for the note key are too open (chmod 600)", file=str(path))


def _mpint(value: int) -> bytes:
    raw = value.to_bytes((value.bit_length() + 8) // 8, "big") if value else b""
    return wire_string(raw)


@dataclass(frozen=True)
class NoteTrust:
    """Whose signature a note needs: the keys of ``trust/nodes`` at one commit, and the policy."""

    signers: tuple[sshsig.AllowedSigner, ...] = ()
    policy: str = SIGNED
    origin: str = ""  # the commit whose trust/nodes this is ("": none)
    problem: str = ""  # trust/nodes could not be read: no note verifies, and this says why

    @cached_property
    def ident(self) -> int:
        """Names this trust in a reader's cache (hashing the keys once, not per note)."""
        return hash((self.signers, self.policy, self.origin, self.problem))

    @cached_property
    def _by_key(self) -> dict[bytes, tuple[sshsig.AllowedSigner, ...]]:
        out: dict[bytes, tuple[sshsig.AllowedSigner, ...]] = {}
        for s in self.signers:
            if not s.cert_authority:
                blob = s.plain_blob or parse_key(s.key_blob).plain_blob
                out[blob] = (*out.get(blob, ()), s)
        return out

    @cached_property
    def _authorities(self) -> tuple[sshsig.AllowedSigner, ...]:
        return tuple(s for s in self.signers if s.cert_authority)

    @cached_property
    def timeless(self) -> bool:
        """No key of it has a validity window (nor a certificate's): a note's verdict holds for
        good, and a reader need not judge it again as time passes."""
        return not any(s.valid_after or s.valid_before or s.cert_authority for s in self.signers)

    def refuses(self, node: str, key: NoteKey, at: datetime) -> str | None:
        """Why ``node``'s notes signed with ``key`` would count for nobody here (None: they count)."""
        probe = {"format": 1, "probe": True}
        return self.judge(node, PROBE_OBJECT, key.seal(node, PROBE_OBJECT, probe), at)

    def listed(self, node: str) -> bool:
        return any(sshsig._match_pattern_list(node, ",".join(s.principals)) == 1 for s in self.signers)

    def judge(self, node: str, obj: str, data: Mapping[str, Any], at: datetime) -> str | None:
        """None when ``node``'s note on ``obj`` counts; otherwise why it does not."""
        sig = data.get(SIG_FIELD)
        if self.policy == UNSIGNED_ALLOWED and not self.problem and not self.listed(node):
            return None  # moving to signed notes: a node not listed yet counts as it did (signed or not)
        if sig is None:
            if self.problem:
                return f"unsigned ({self.problem})"
            return "unsigned" if self.listed(node) else f"unsigned, and {node} has no key in {NODES_FILE}"
        if not isinstance(sig, str) or len(sig) > 8192:
            return "the signature is not an SSH signature"
        if self.problem:
            return self.problem
        try:
            signature = verified(node, obj, data)
            key = parse_key(signature.key_blob)
            # only the lines of this key (and the CAs, for a certificate): a fleet's trust/nodes
            # has a line per node, and each note would otherwise be matched against all of them
            candidates = self._by_key.get(key.plain_blob, ()) + (self._authorities if key.cert else ())
            sshsig.find_signer(candidates, signature, node, at, NAMESPACE)
        except ReconcilerError as exc:
            return f"bad signature: {exc}"
        except (ValueError, TypeError, OverflowError, UnicodeError) as exc:
            return f"bad signature: {exc}"
        return None


def parse_nodes(text: str, file: str) -> tuple[sshsig.AllowedSigner, ...]:
    """``trust/nodes``: an allowed-signers file whose principals are node names."""
    return sshsig.parse_allowed_signers(text, file)


def note_trust(repo: pygit2.Repository, commit: str | None) -> NoteTrust:
    """The note trust in force at ``commit`` (a verified one: the readers' own head or the one
    they decide about): its ``trust/nodes`` and ``reconciler.yaml``'s ``trust.notes``."""
    from reconciler.trust.verify import tree_file

    if commit is None:
        return NoteTrust(problem=f"no commit to read {NODES_FILE} from")
    try:
        policy = note_policy(tree_file(repo, commit, "reconciler.yaml"))
    except BadInput:  # past the repo's file limit: unread, it loosens nothing
        policy = SIGNED
    try:
        raw = tree_file(repo, commit, NODES_FILE)
        if raw is None:
            return NoteTrust((), policy, commit)
        return NoteTrust(parse_nodes(raw.decode(), f"{NODES_FILE}@{commit[:12]}"), policy, commit)
    except (UnicodeDecodeError, BadInput) as exc:
        return NoteTrust((), policy, commit, problem=f"{NODES_FILE} at {commit[:12]} unreadable: {exc}")


def note_policy(raw: bytes | None) -> str:
    """``trust.notes`` of a reconciler.yaml (validated elsewhere); ``signed`` unless it says otherwise."""
    from reconciler.core.yamlfile import safe_load

    if not raw:
        return SIGNED
    try:
        data = safe_load(raw, "reconciler.yaml")
    except (BadInput, ValueError):
        return SIGNED  # a bad file is reported by validation; it cannot loosen anything
    trust = data.get("trust") if isinstance(data, dict) else None
    wanted = trust.get("notes") if isinstance(trust, dict) else None
    return UNSIGNED_ALLOWED if wanted == UNSIGNED_ALLOWED else SIGNED


def default_key_path(state_dir: Path) -> Path:
    """Where a node with no ``note_key`` setting keeps the key it made itself."""
    return state_dir / "note_key"


def public_line(node: str, key: NoteKey) -> str:
    """The ``trust/nodes`` line for this node's key."""
    return f"{node} namespaces=\"{NAMESPACE}\" {key.public_line}"


__all__ = ["NAMESPACE", "NODES_FILE", "NOTE_POLICIES", "NoteKey", "NoteTrust", "note_trust", "payload",
           "public_line", "default_key_path"]
