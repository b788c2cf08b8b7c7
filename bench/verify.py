"""Signature verification cost: 1000 SSH-signed commits checked in process by the agent's
trust gate, against `git verify-commit` (which runs ssh-keygen) per commit; and proof that an
unchanged poll does no signature work at all.

Usage: .venv/bin/python bench/verify.py [--commits 1000] [--peer-sample 200]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

import pygit2

from reconciler.agent import Agent
from reconciler.drivers.process import ProcessDriver
from reconciler.settings import AgentConfig, TrustConfig
from reconciler.trust import verify as trust
from reconciler.trust.commits import verify_commit
from reconciler.trust.root import Policy, Verdict, load_root
from reconciler.trust.verify import Gate

ENV = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x", "GIT_COMMITTER_NAME": "Merge",
       "GIT_COMMITTER_EMAIL": "merge@example.org", "GIT_CONFIG_GLOBAL": "/dev/null"}


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=ENV, check=True, capture_output=True, text=True).stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commits", type=int, default=1000)
    parser.add_argument("--peer-sample", type=int, default=200, help="commits timed with git verify-commit")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="reconciler-bench-verify-") as tmp:
        root = Path(tmp)
        key = root / "merge"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        allowed = root / "allowed_signers"
        allowed.write_text(f"merge@example.org namespaces=\"git\" {(root / 'merge.pub').read_text()}")
        work = root / "work"
        work.mkdir()
        files = {
            "reconciler.yaml": "format: 1\nname: bench\n",
            "inventory.yaml": "groups:\n  all: {services: []}\nnodes:\n  n1: {groups: [all]}\n",
        }
        for rel, text in files.items():
            (work / rel).write_text(text)
        git("init", "-q", "-b", "main", cwd=work)
        git("add", "-A", cwd=work)
        sign = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={key}", "commit", "-S", "-q"]
        t = time.perf_counter()
        git(*sign, "-m", "base", cwd=work)
        base = git("rev-parse", "HEAD", cwd=work).strip()
        for i in range(args.commits):
            git(*sign, "--allow-empty", "-m", f"change {i}", cwd=work)
        head = git("rev-parse", "HEAD", cwd=work).strip()
        print(f"made {args.commits} SSH-signed commits in {time.perf_counter() - t:.1f} s")

        repo = pygit2.Repository(str(work))
        gate = Gate(load_root(allowed, None, None), Policy.EVERY_COMMIT)
        t = time.perf_counter()
        decision = gate.decide(repo, head, base)
        ours = time.perf_counter() - t
        assert len(decision.verdicts) == args.commits and all(v.ok for v in decision.verdicts)

        commits = git("rev-list", f"{base}..{head}", cwd=work).split()[: args.peer_sample]
        t = time.perf_counter()
        for c in commits:
            git("-c", f"gpg.ssh.allowedSignersFile={allowed}", "verify-commit", c, cwd=work)
        peer = (time.perf_counter() - t) / len(commits) * args.commits
        print(f"\nverify {args.commits} commits (every-commit policy, ed25519)")
        print(f"  reconciler in process     {ours:8.3f} s   {ours / args.commits * 1000:6.3f} ms/commit")
        print(f"  git verify-commit (peer)  {peer:8.3f} s   {peer / args.commits * 1000:6.3f} ms/commit"
              f"   (timed on {len(commits)} commits, scaled)")
        print(f"  ratio                     {peer / ours:8.1f}x faster than the peer")

        # An unchanged poll: the agent must not verify anything.
        bare = root / "remote.git"
        git("init", "-q", "--bare", "-b", "main", str(bare), cwd=root)
        git("push", "-q", str(bare), "main", cwd=work)
        cfg = AgentConfig(node="n1", remote=f"file://{bare}", state_dir=root / "node",
                          trust=TrustConfig(allowed_signers=allowed, policy="head"))
        agent = Agent(cfg, progress=False)
        calls = 0
        original = verify_commit

        def counting(*a: object, **kw: object) -> Verdict:
            nonlocal calls
            calls += 1
            return original(*a, **kw)  # type: ignore[arg-type]

        trust.verify_commit = counting  # type: ignore[attr-defined]  # the gate's name for it
        try:
            assert agent.reconcile_once().exit_code == 0
            first = calls
            t = time.perf_counter()
            for _ in range(20):
                result = agent.reconcile_once()
                assert result.report is None
            poll = (time.perf_counter() - t) / 20
        finally:
            trust.verify_commit = original  # type: ignore[attr-defined]
            for o in ProcessDriver(root / "node" / "services", "n1").observe():
                ProcessDriver(root / "node" / "services", "n1").remove(o.name)
        print("\nsignature checks: first run on a new head", first, "; 20 unchanged polls", calls - first,
              f"(median poll {poll * 1000:.1f} ms)")


if __name__ == "__main__":
    main()
