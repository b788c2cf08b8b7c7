"""The benchmarks' deployment: one idle process service, committed and signed with a
throwaway key, pushed to a bare remote with as many extra refs as asked (shared by poll.py and
peers.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ENV = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x", "GIT_COMMITTER_NAME": "b",
       "GIT_COMMITTER_EMAIL": "b@x"}
REPO = {
    "reconciler.yaml": "format: 1\nname: bench\n",
    "inventory.yaml": "groups:\n  all:\n    services: [idle]\nnodes:\n  bench1:\n    groups: [all]\n",
    "services/idle/service.yaml": (
        "runtime:\n  command: [python3, idle.py]\nfiles:\n  - {path: idle.py, source: idle.py}\n"
    ),
    "services/idle/files/idle.py": "import time\nwhile True:\n    time.sleep(3600)\n",
}


def git(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=ENV, check=True, capture_output=True, text=True).stdout


def make_key(root: Path) -> tuple[Path, Path]:
    """A throwaway signing key and an allowed-signers file for the committer."""
    key = root / "merge"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    allowed = root / "allowed_signers"
    allowed.write_text(f"b@x namespaces=\"git\" {(root / 'merge.pub').read_text()}")
    return key, allowed


def signed_remote(work: Path, bare: Path, files: dict[str, str], key: Path, message: str) -> None:
    """``files`` committed in ``work``, signed with ``key``, and pushed to a new bare ``bare``."""
    for rel, text in files.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    git("init", "-q", "-b", "main", cwd=work)
    git("add", "-A", cwd=work)
    git("-c", "gpg.format=ssh", "-c", f"user.signingkey={key}", "commit", "-S", "-q", "-m", message, cwd=work)
    git("init", "-q", "--bare", "-b", "main", str(bare))
    git("push", "-q", str(bare), "main", cwd=work)


def make_remote(root: Path, refs: int, key: Path) -> Path:
    work, bare = root / "work", root / "remote.git"
    signed_remote(work, bare, REPO, key, "bench")
    head = git("rev-parse", "HEAD", cwd=work).strip()
    # Many refs, as a busy review system has: changes, tags, other nodes' notes.
    lines = "".join(f"create refs/changes/{i % 100:02d}/{i}/1 {head}\n" for i in range(refs))
    subprocess.run(["git", "update-ref", "--stdin"], cwd=bare, input=lines, text=True, check=True)
    git("pack-refs", "--all", cwd=bare)
    return bare
