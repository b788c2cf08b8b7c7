"""One commit judged: its signature (SSH through ``sshsig``, OpenPGP through gpg) under the
node's trust root, and the trailers of its message (``Reconciler-Branch``, ``Reconciler-Seal``:
see ``verify``) read as git reads them.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
from datetime import datetime
from typing import TYPE_CHECKING

from reconciler.trust import sshsig
from reconciler.trust.root import TrustRoot, Verdict
from reconciler.trust.sshkeys import SignatureError

if TYPE_CHECKING:
    import pygit2

# pygit2 (and ``tree``, which reads through it) is imported where a commit is read, not here:
# the node's trust root loads when the agent starts, and an idle agent never reads a commit
# (see ``source``).

# ------------------------------------------------------------------ trailers
_TRAILER = re.compile(r"([A-Za-z0-9-]+)[ \t]*:(.*)")
_GIT_GENERATED = ("Signed-off-by: ", "(cherry picked from commit ")


def trailers(message: str) -> list[tuple[str, str]]:
    """``(key, value)`` of a commit message's trailers, as ``git interpret-trailers --parse
    --no-divider`` reads them: the last paragraph (never the subject's), if all its lines are
    trailers, or a quarter of them with one git itself writes (Signed-off-by); indented lines
    continue the one above."""
    lines = [line for line in message.split("\n") if not line.startswith("#")]
    while lines and not lines[-1].strip():
        lines.pop()
    start = len(lines)
    while start > 0 and lines[start - 1].strip():
        start -= 1
    if start == 0:
        return []  # one paragraph: the subject
    found: list[list[str]] = []
    trailer_lines = other_lines = 0
    recognised = last_was_trailer = False
    for line in lines[start:]:
        if line[:1].isspace():
            if last_was_trailer:
                trailer_lines += 1
                if found:
                    found[-1][1] += " " + line.strip()
            else:
                other_lines += 1
            continue
        match = _TRAILER.fullmatch(line)
        generated = line.startswith(_GIT_GENERATED)
        recognised = recognised or generated
        last_was_trailer = bool(match) or generated
        if match:
            found.append([match.group(1), match.group(2).strip()])
        if last_was_trailer:
            trailer_lines += 1
        else:
            other_lines += 1
    if not trailer_lines or (other_lines and not (recognised and trailer_lines * 3 >= other_lines)):
        return []
    return [(key, value) for key, value in found]


def trailer_values(message: str, key: str) -> list[str]:
    return [v for k, v in trailers(message) if k.lower() == key.lower()]


# ------------------------------------------------------------------ one commit
def _committer_email(commit: pygit2.Commit) -> str:
    return commit.committer.email or ""


def read_commit(repo: pygit2.Repository, commit_id: str) -> pygit2.Commit:
    """A commit a ref or a walk of the mirror named: if it cannot be read, the mirror is damaged."""
    import pygit2

    from reconciler.repo.tree import corrupt

    try:
        commit = repo[commit_id]
    except (KeyError, pygit2.GitError) as exc:
        raise corrupt(repo, exc) from exc
    if not isinstance(commit, pygit2.Commit):
        raise corrupt(repo, ValueError(f"{commit_id} is a {commit.type_str}, not a commit"))
    return commit


def verify_commit(repo: pygit2.Repository, commit_id: str, root: TrustRoot, now: datetime) -> Verdict:
    commit = read_commit(repo, commit_id)
    try:
        signature, payload = commit.gpg_signature
    except (TypeError, ValueError):
        signature, payload = None, None
    if not signature or payload is None:
        return Verdict(commit_id, False, "UNSIGNED", "commit is not signed")
    if signature.lstrip().startswith(b"-----BEGIN SSH SIGNATURE-----"):
        return _verify_ssh(commit_id, signature, payload, _committer_email(commit), root, now)
    if signature.lstrip().startswith(b"-----BEGIN PGP SIGNATURE-----"):
        return _verify_openpgp(commit_id, signature, payload, root, now)
    return Verdict(commit_id, False, "BAD_SIGNATURE", "unknown signature format")


def _verify_ssh(commit_id: str, signature: bytes, payload: bytes, principal: str,
                root: TrustRoot, now: datetime) -> Verdict:
    try:
        sig = sshsig.verify(signature, payload, "git")
        entry = sshsig.find_signer(root.signers, sig, principal, now, "git")
    except SignatureError as exc:
        fpr = ""
        with contextlib.suppress(SignatureError):
            fpr = sshsig.parse_signature(signature).fingerprint
        return Verdict(commit_id, False, exc.reason, str(exc), "ssh", principal, fpr)
    if {sig.fingerprint, entry.fingerprint} & root.revoked:
        return Verdict(commit_id, False, "KEY_REVOKED", f"key {sig.fingerprint} is revoked", "ssh",
                       principal, sig.fingerprint)
    # A revoked CA refuses every certificate it signed, however allowed_signers lists it (a
    # cert-authority line is the CA's key, but a line may name one certificate itself).
    ca = sig.ca_fingerprint
    if ca is not None and ca in root.revoked:
        return Verdict(commit_id, False, "KEY_REVOKED", f"key {sig.fingerprint} is certified by {ca}, "
                       "a revoked CA", "ssh", principal, sig.fingerprint)
    return Verdict(commit_id, True, format="ssh", principal=principal, fingerprint=sig.fingerprint)


def _verify_openpgp(commit_id: str, signature: bytes, payload: bytes, root: TrustRoot, now: datetime) -> Verdict:
    del now  # gpg judges expiry by the system clock, which is the agent's clock
    if root.gpg_home is None:
        return Verdict(commit_id, False, "UNTRUSTED_KEY", "OpenPGP signature but no keyring configured", "openpgp")
    with tempfile.NamedTemporaryFile(suffix=".sig") as sigfile:
        sigfile.write(signature)
        sigfile.flush()
        proc = subprocess.run(
            ["gpg", "--homedir", str(root.gpg_home), "--batch", "--no-tty", "--no-auto-key-retrieve",
             "--trust-model", "always", "--status-fd", "1", "--verify", sigfile.name, "-"],
            input=payload, capture_output=True, env={**os.environ, "LC_ALL": "C"},
        )
    status: dict[str, list[str]] = {}
    for line in proc.stdout.decode(errors="replace").splitlines():
        if line.startswith("[GNUPG:] "):
            word, *rest = line[9:].split()
            status.setdefault(word, rest)
    uid = " ".join(status.get("GOODSIG", status.get("EXPKEYSIG", status.get("REVKEYSIG", ["", ""])))[1:])
    fpr = (status.get("VALIDSIG") or [""])[0]
    primary = (status.get("VALIDSIG") or [""] * 10)[-1] if "VALIDSIG" in status else ""
    if "REVKEYSIG" in status:
        return Verdict(commit_id, False, "KEY_REVOKED", "OpenPGP key is revoked", "openpgp", uid, fpr)
    if "EXPKEYSIG" in status or "KEYEXPIRED" in status:
        return Verdict(commit_id, False, "KEY_EXPIRED", "OpenPGP key has expired", "openpgp", uid, fpr)
    if "NO_PUBKEY" in status or ("ERRSIG" in status and "BADSIG" not in status):
        return Verdict(commit_id, False, "UNTRUSTED_KEY", "signed by a key not in the node's keyring", "openpgp")
    if "GOODSIG" not in status or "VALIDSIG" not in status or proc.returncode != 0:
        return Verdict(commit_id, False, "BAD_SIGNATURE", "OpenPGP signature does not verify", "openpgp", uid)
    if {fpr.upper(), primary.upper()} & root.revoked:
        return Verdict(commit_id, False, "KEY_REVOKED", f"key {fpr} is revoked", "openpgp", uid, fpr)
    return Verdict(commit_id, True, format="openpgp", principal=uid, fingerprint=fpr)

