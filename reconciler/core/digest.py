"""SHA-256 and HMAC-SHA256, with OpenSSL's code or the interpreter's own (issue 40).

Importing ``hashlib`` (or ``hmac``) loads OpenSSL's libcrypto: about 3.5 MB of RSS, an eighth
of an idle daemon, which hashes little: its node's name once, and its services' live files (the
drift check: at its first poll, every five minutes, and when a file's stat changed). The
interpreter has its own SHA-256 (what hashlib falls back to where OpenSSL is missing): the same
digest, as quick on a few bytes, about six times slower on kilobytes. A command hashing a
fleet's rendered files (``diff``: 120,000 hashes) wants OpenSSL's, and gets it by default
(hashlib imported at its first hash); the daemon asks for the interpreter's
(``without_openssl``), and OpenSSL stays out of it until a change loads it for other reasons
(pygit2, the signature check), which the daemon gives back by re-executing (``daemon.shed``).

Except for big data (``BIG``, a MiB and more): the interpreter's code takes 5.6 times OpenSSL's
CPU there (0.33 s against 0.06 s for 100 MB) and holds the GIL throughout (the supervisor's and
the wake receiver's threads stall as long), and a node whose live files are that big reads them
whole every five minutes anyway, beside which libcrypto's 3.5 MB is small.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hashlib import _Hash


def _builtin_sha256() -> Callable[[bytes], _Hash] | None:
    for name in ("_sha256", "_sha2"):  # CPython 3.11's module; 3.12's
        try:
            return importlib.import_module(name).sha256  # type: ignore[no-any-return]
        except ImportError:
            continue
    return None  # an interpreter built without its own hashes: OpenSSL's it is


_BUILTIN = _builtin_sha256()
BIG = 1 << 20  # bytes from which a hash is OpenSSL's, the daemon's too (see above)


def _openssl_sha256(data: bytes = b"") -> _Hash:
    """hashlib's SHA-256, imported at the first hash and bound in this function's place: no
    import statement on every one of a fleet diff's hashes (but the daemon's big ones)."""
    global _sha256
    import hashlib

    if _sha256 is _openssl_sha256:
        _sha256 = hashlib.sha256
    return hashlib.sha256(data)


_sha256: Callable[[bytes], _Hash] = _openssl_sha256


def without_openssl() -> None:
    """From now on, the interpreter's own SHA-256 (a daemon's choice: see above)."""
    global _sha256
    if _BUILTIN is not None:
        _sha256 = _BUILTIN


def _for(data: bytes) -> Callable[[bytes], _Hash]:
    return _openssl_sha256 if _sha256 is _BUILTIN and len(data) >= BIG else _sha256


def sha256(data: bytes) -> bytes:
    return _for(data)(data).digest()


def sha256_hex(data: bytes) -> str:
    return _for(data)(data).hexdigest()


_BLOCK = 64  # SHA-256's block size, in bytes
_INNER = bytes(b ^ 0x36 for b in range(256))  # RFC 2104's ipad and opad, as translation tables
_OUTER = bytes(b ^ 0x5C for b in range(256))


def hmac_sha256_hex(key: bytes, data: bytes) -> str:
    """HMAC-SHA256 of ``data`` under ``key``. The ``hmac`` module loads OpenSSL whichever hash
    it is given, so with the interpreter's SHA-256 it is RFC 2104 here (checked against
    ``hmac`` in tests/test_idle.py and, for any key and message, tests/test_digest_review.py)."""
    if _sha256 is not _BUILTIN or len(data) >= BIG:
        import hashlib
        import hmac

        return hmac.new(key, data, hashlib.sha256).hexdigest()
    if len(key) > _BLOCK:
        key = _sha256(key).digest()
    key = key.ljust(_BLOCK, b"\0")
    inner = _sha256(key.translate(_INNER))
    inner.update(data)
    outer = _sha256(key.translate(_OUTER))
    outer.update(inner.digest())
    return outer.hexdigest()
