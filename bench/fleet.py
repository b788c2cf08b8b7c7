"""A fleet polling one git server: time from merge to every node's note, and the server's CPU.

N agents (in this process, each with its own state dir and notes ref) poll one `git daemon`
on loopback every INTERVAL seconds, either all at the same moment (no jitter) or spread over
the interval (each node's fixed offset plus jitter, as `reconciler agent` does). A signed
commit is pushed; the clock stops when every node's note for it is on the server. Server CPU
is the daemon's process tree (its own and its reaped children's user+system time).

Usage: .venv/bin/python bench/fleet.py [--nodes 50 200 1000] [--interval 10] [--workers 16]
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from reconciler.agent import Agent
from reconciler.daemon.supervisor import node_offset
from reconciler.settings import AgentConfig, TrustConfig

ENV = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x", "GIT_COMMITTER_NAME": "Merge",
       "GIT_COMMITTER_EMAIL": "merge@example.org", "GIT_CONFIG_GLOBAL": "/dev/null"}
TICK = os.sysconf("SC_CLK_TCK")


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=ENV, check=True, capture_output=True, text=True).stdout


def cpu_seconds(pid: int) -> float:
    """CPU of a process tree: `git daemon` is a wrapper whose child serves, and that child's
    reaped children (upload-pack, receive-pack) count in its cutime/cstime."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    total = sum(int(x) for x in fields[11:15]) / TICK  # utime, stime, cutime, cstime
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return total + sum(cpu_seconds(int(c)) for c in children)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def signed_repo(root: Path, files: dict[str, str]) -> tuple[Path, list[str]]:
    """A work tree of ``files`` under root/work, its first commit signed by a throwaway key that
    root/allowed trusts; and the arguments of a signed ``git commit -am``."""
    key = root / "merge"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    (root / "allowed").write_text(f"merge@example.org {(root / 'merge.pub').read_text()}")
    work = root / "work"
    for rel, text in files.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    sign = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={key}", "commit", "-S", "-q", "-am"]
    git("init", "-q", "-b", "main", cwd=work)
    git("add", "-A", cwd=work)
    git(*sign, "c0", cwd=work)
    return work, sign


def commit_change(work: Path, files: dict[str, str], sign: list[str]) -> str:
    """The change every bench rolls out (the inventory's ``v: 0`` to ``v: 1``), signed, not yet
    pushed; its id."""
    (work / "inventory.yaml").write_text(files["inventory.yaml"].replace("v: 0", "v: 1"))
    git(*sign, "c1", cwd=work)
    return git("rev-parse", "HEAD", cwd=work).strip()


def serve(root: Path, work: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A `git daemon` on loopback serving root/srv/cloud.git, with work's main pushed to it."""
    srv = root / "srv"
    git("init", "-q", "--bare", "-b", "main", str(srv / "cloud.git"), cwd=root)
    port = free_port()
    daemon = subprocess.Popen(["git", "daemon", "--reuseaddr", f"--base-path={srv}", "--export-all",
                               "--enable=receive-pack", f"--port={port}", "--listen=127.0.0.1",
                               "--max-connections=0", str(srv)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    url = f"git://127.0.0.1:{port}/cloud.git"
    git("push", "-q", url, "main", cwd=work)
    return daemon, url


def run(n: int, interval: float, jitter: bool, workers: int) -> tuple[float, float, int]:
    with tempfile.TemporaryDirectory(prefix="reconciler-bench-fleet-") as tmp:
        root = Path(tmp)
        names = [f"n{i:04d}" for i in range(n)]
        files = {"reconciler.yaml": "format: 1\nname: fleet\n",
                 "inventory.yaml": "vars: {v: 0}\ngroups:\n  all: {services: []}\nnodes:\n"
                                   + "".join(f"  {m}: {{groups: [all]}}\n" for m in names)}
        work, sign = signed_repo(root, files)
        daemon, url = serve(root, work)
        trust = TrustConfig(allowed_signers=root / "allowed", policy="head")
        agents = [Agent(AgentConfig(node=m, remote=url, state_dir=root / "nodes" / m, trust=trust,
                                    interval=interval, jitter=interval if jitter else 0), progress=False)
                  for m in names]
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda a: a.reconcile_once(), agents))  # everyone on c0
            head = commit_change(work, files, sign)
            cpu0 = cpu_seconds(daemon.pid)
            git("push", "-q", url, "main", cwd=work)
            t0 = time.monotonic()
            done = 0
            lock = threading.Lock()

            def poll(agent: Agent) -> None:
                nonlocal done
                result = agent.reconcile_once()
                assert result.commit == head and result.pushed, result
                with lock:
                    done += 1

            # One polling round after the merge: the change is seen on each node's next tick.
            rng = random.Random(1)
            delays = [(node_offset(a.cfg.node, interval) + rng.uniform(0, interval)) % interval if jitter else 0.0
                      for a in agents]
            # Each node polls at its own moment; the pool only bounds how many run at once.
            futures = []
            for delay, agent in sorted(zip(delays, agents, strict=True), key=lambda x: x[0]):
                time.sleep(max(0.0, t0 + delay - time.monotonic()))
                futures.append(pool.submit(poll, agent))
            for f in futures:
                f.result()
            elapsed = time.monotonic() - t0
            cpu = cpu_seconds(daemon.pid) - cpu0
        daemon.terminate()
        daemon.wait()
        for a in agents:
            a.close()
        return elapsed, cpu, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[50, 200])
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=16, help="agents polling at the same moment, at most")
    args = parser.parse_args()
    print(f"merge -> every node's note on one git daemon, poll interval {args.interval:g}s, "
          f"{args.workers} concurrent pollers, {os.cpu_count()} cores")
    for n in args.nodes:
        for jitter in (False, True):
            elapsed, cpu, done = run(n, args.interval, jitter, args.workers)
            print(f"  {n:5d} nodes  {'jitter   ' if jitter else 'no jitter'}  all {done} notes in {elapsed:7.2f} s"
                  f"   git server CPU {cpu:6.2f} s ({cpu / n * 1000:5.1f} ms/node)")


if __name__ == "__main__":
    main()
