"""The node's trust root: the SSH allowed signers, the OpenPGP keyring, the revoked keys and
the sealers, loaded from the node's files; the policy that says which commits must be signed;
and the verdict on one commit, the refusal that carries them.

The root lives on the node, never in the branch it protects (``verify`` rotates its SSH part
through the repo's ``trust/``, from commits that verified under it).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from reconciler.core.errors import BadInput, ConfigError, ReconcilerError
from reconciler.trust import sshsig

TRUST_DIR = "trust"
log = logging.getLogger("reconciler.agent")

UNSEALABLE = frozenset({"KEY_REVOKED"})
"""Failures no seal covers: a revoked key may have signed anything, reviewed or not."""


class Policy(StrEnum):
    HEAD = "head"
    FIRST_PARENT = "first-parent"
    EVERY_COMMIT = "every-commit"

    @property
    def strictness(self) -> int:
        return [Policy.HEAD, Policy.FIRST_PARENT, Policy.EVERY_COMMIT].index(self)

    @staticmethod
    def strictest(*policies: Policy) -> Policy:
        return max(policies, key=lambda p: p.strictness)


class TrustError(ReconcilerError):
    """A refusal: permanent for this head, like bad input (exit 2). Carries every verdict."""

    reason = "UNTRUSTED"
    exit_code = 2

    def __init__(self, message: str, reason: str, verdicts: Sequence[Verdict] = ()) -> None:
        super().__init__(message, reason=reason)
        self.verdicts = tuple(verdicts)


@dataclass(frozen=True)
class Verdict:
    commit: str
    ok: bool
    reason: str = ""
    message: str = ""
    format: str = "none"  # ssh | openpgp | none
    principal: str = ""
    fingerprint: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "commit": self.commit, "ok": self.ok, "reason": self.reason, "message": self.message,
            "format": self.format, "principal": self.principal, "fingerprint": self.fingerprint,
        }


@dataclass(frozen=True)
class TrustRoot:
    signers: tuple[sshsig.AllowedSigner, ...] = ()
    revoked: frozenset[str] = frozenset()
    gpg_home: Path | None = None
    origin: str = "node"  # "node", or "repo@<commit>" after a rotation
    sealers: frozenset[str] = frozenset()
    """Who may seal: SSH principals, or key fingerprints (SSH ``SHA256:...``, OpenPGP hex).
    The node's own, never rotated through the repo."""

    @property
    def empty(self) -> bool:
        return not self.signers and self.gpg_home is None

    def may_seal(self, verdict: Verdict) -> bool:
        # An OpenPGP user id is whatever the key's owner wrote: only its fingerprint names it.
        by_principal = verdict.format == "ssh" and verdict.principal in self.sealers
        by_key = bool(verdict.fingerprint) and _fingerprint(verdict.fingerprint) in map(_fingerprint, self.sealers)
        return verdict.ok and (by_principal or by_key)


def _fingerprint(text: str) -> str:
    """SSH fingerprints are base64 (case matters); OpenPGP ones hex, written in either case."""
    return text if text.startswith("SHA256:") else text.upper()


_SSH_FINGERPRINT = re.compile(r"SHA256:[A-Za-z0-9+/]{43}")
_KEYGEN_LINE = re.compile(r"\d+\s+(SHA256:[A-Za-z0-9+/]{43})\s.*")  # ssh-keygen -l: bits, fingerprint, comment
_OPENPGP_FINGERPRINT = re.compile(r"[0-9A-Fa-f]{40}|[0-9A-Fa-f]{64}")  # v4, v6


def parse_revoked(text: str, file: str, *, strict: bool = True) -> frozenset[str]:
    """One key per line: its fingerprint (SHA256:... for SSH, alone or as ``ssh-keygen -l``
    prints it; hex for OpenPGP, spaces allowed as gpg prints them) or an SSH public key as a
    .pub file holds it; # comments.

    A line that is none of these is refused, naming it: read as a fingerprint that matches no
    key, a pasted key id or a typo would leave the leaked key trusted without a word. Not
    ``strict`` (a list the node adopted before these checks): such a line is skipped with a
    warning, as it revoked nothing then either, rather than keep the agent from starting."""
    revoked = set()
    for n, raw in enumerate(text.split("\n"), start=1):
        entry = raw.split("#", 1)[0].strip()
        if not entry:
            continue
        try:
            revoked.add(_revoked_key(entry))
        except ValueError as exc:
            problem = BadInput(f"revoked keys: not a key fingerprint (SHA256:... or OpenPGP hex) nor an SSH "
                               f"public key: {exc}", file=file, line=n)
            if strict:
                raise problem from None
            log.warning("%s (skipped)", problem)
    return frozenset(revoked)


def _revoked_key(entry: str) -> str:
    if _SSH_FINGERPRINT.fullmatch(entry):
        return entry
    if keygen := _KEYGEN_LINE.fullmatch(entry):
        return keygen.group(1)
    if _OPENPGP_FINGERPRINT.fullmatch(hexed := entry.replace(" ", "")):
        return hexed.upper()
    return sshsig.public_key_fingerprint(entry)


def parse_sealers(text: str) -> frozenset[str]:
    """One principal or fingerprint per line; # comments."""
    return frozenset(e for line in text.splitlines() if (e := line.split("#", 1)[0].strip()))


def load_root(allowed_signers: Path | None, gpg_home: Path | None, revoked: Path | None,
              sealers: Path | None = None) -> TrustRoot:
    signers: tuple[sshsig.AllowedSigner, ...] = ()
    if allowed_signers is not None:
        signers = sshsig.parse_allowed_signers(_read(allowed_signers, "allowed signers"), str(allowed_signers))
        if not signers and gpg_home is None:
            # Else the caller's "no trust root: give --allowed-signers" would ask for what was given.
            raise ConfigError("allowed signers: holds no keys (only blank or comment lines)",
                              file=str(allowed_signers))
    rev: frozenset[str] = frozenset()
    if revoked is not None:
        rev = parse_revoked(_read(revoked, "revocation list"), str(revoked))
    if gpg_home is not None and not gpg_home.is_dir():
        raise ConfigError("OpenPGP home is not a directory", file=str(gpg_home))
    seal: frozenset[str] = frozenset()
    if sealers is not None:
        seal = parse_sealers(_read(sealers, "sealers"))
    return TrustRoot(signers, rev, gpg_home, sealers=seal)


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {what}: {exc.strerror}", file=str(path)) from exc
    except UnicodeDecodeError as exc:  # a key in binary form, or the wrong file given
        raise ConfigError("not UTF-8 text", file=str(path)) from exc


