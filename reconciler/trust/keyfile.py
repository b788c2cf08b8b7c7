"""A node's ed25519 note key read and used through libsodium, without the cryptography package.

A node signs a note at the end of each pass that acted. Through cryptography, its first note
after a (re-)start imports some 11 ms of modules (issue 40: a change's cost beyond its restart);
libsodium is loaded already, by the signature check of the commit. This reads the one shape
`ssh-keygen -t ed25519` and the agent's own key write: an unencrypted "openssh-key-v1" file
holding one ed25519 key. Anything else (a passphrase, ECDSA, RSA, a damaged file) is left to
cryptography (``NoteKey.load``), which reads it or says what is wrong with it. Ed25519 signatures
are deterministic: the two paths sign byte for byte alike (tests/test_note_keyfile.py).

The format (OpenSSH's PROTOCOL.key): the magic, cipher and kdf names ("none"), empty kdf
options, a count of keys (1), the public key's blob, then a private section: two equal check
words, the key type, the public key, the 64-byte secret (seed, then the public key again), a
comment, and padding 1, 2, 3... to a multiple of 8.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from reconciler.core.errors import ReconcilerError
from reconciler.trust.sshkeys import WireReader, wire_string

BEGIN, END = b"-----BEGIN OPENSSH PRIVATE KEY-----", b"-----END OPENSSH PRIVATE KEY-----"
MAGIC = b"openssh-key-v1\0"


@dataclass(frozen=True, repr=False)
class SodiumEd25519:
    """An ed25519 private key as libsodium holds it (never shown: no repr of the secret)."""

    secret: bytes  # seed || public key, 64 bytes
    blob: bytes  # the public key's SSH wire blob

    def sign(self, data: bytes) -> bytes:
        from nacl.bindings import crypto_sign

        return crypto_sign(data, self.secret)[:64]  # crypto_sign returns signature || message

    def __repr__(self) -> str:
        return "SodiumEd25519(<private>)"


def read_ed25519(raw: bytes) -> SodiumEd25519 | None:
    """The key of an unencrypted OpenSSH ed25519 private key file; None for any other content."""
    lines = raw.strip().splitlines()
    if len(lines) < 3 or lines[0].strip() != BEGIN or lines[-1].strip() != END:
        return None
    try:
        body = base64.b64decode(b"".join(line.strip() for line in lines[1:-1]), validate=True)
        return _parse(body)
    except (binascii.Error, ReconcilerError, ValueError):
        return None


def _parse(body: bytes) -> SodiumEd25519 | None:
    if not body.startswith(MAGIC):
        return None
    r = WireReader(body[len(MAGIC):])
    if (r.string(), r.string(), r.string(), r.u32()) != (b"none", b"none", b"", 1):
        return None
    blob, private = r.string(), r.string()
    r.done("the private section")
    p = WireReader(private)
    if p.u32() != p.u32() or p.string() != b"ssh-ed25519":
        return None
    public, secret = p.string(), p.string()
    p.string()  # the comment
    padding = private[p.pos:]
    # What a writer pads (0-7 bytes); OpenSSH allows more, cryptography at most 16: a longer run
    # is left to cryptography, so this path takes no file it refused.
    if len(private) % 8 or len(padding) >= 8 or padding != bytes(range(1, len(padding) + 1)):
        return None
    if len(public) != 32 or len(secret) != 64 or secret[32:] != public:
        return None
    if blob != wire_string("ssh-ed25519") + wire_string(public):
        return None
    from nacl.bindings import crypto_sign_seed_keypair

    derived, full = crypto_sign_seed_keypair(secret[:32])
    if derived != public or full != secret:  # a public key that is not the seed's
        return None
    return SodiumEd25519(secret, blob)
