"""Apply a one-config change to one service among 10 running containers, on a real engine.

Prints the time of `reconciler apply` for that commit (poll, verify, render, observe, plan,
restart, health check, note), how many containers were touched (must be 1), and the floor:
a bare `docker restart` of the same container through the API.

Usage: .venv/bin/python bench/docker_apply.py [--services 10] [--rounds 5]
Needs an engine (eval "$(scripts/docker-engine.sh | tail -1)") and reconciler-test/busybox:1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import docker

from reconciler.agent import Agent
from reconciler.drivers.docker import DockerDriver
from reconciler.settings import AgentConfig, TrustConfig

ENV = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x", "GIT_COMMITTER_NAME": "Merge",
       "GIT_COMMITTER_EMAIL": "merge@example.org", "GIT_CONFIG_GLOBAL": "/dev/null"}
SERVICE = """\
driver: docker
runtime:
  image: reconciler-test/busybox:1
  command: [httpd, -f, -p, "80", -h, /etc/{name}]
  ports: ["127.0.0.1:{{{{ base + {i} }}}}:80"]
files:
  - {{path: index.html, template: index.html.j2}}
health:
  http: "http://127.0.0.1:{{{{ base + {i} }}}}/index.html"
"""


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, env=ENV, check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    client = docker.from_env()
    node = f"bench-{os.getpid()}"
    with tempfile.TemporaryDirectory(prefix="reconciler-bench-docker-") as tmp:
        root = Path(tmp)
        key = root / "merge"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        (root / "allowed").write_text(f"merge@example.org {(root / 'merge.pub').read_text()}")
        work = root / "work"
        names = [f"svc{i:02d}" for i in range(args.services)]
        files = {
            "reconciler.yaml": "format: 1\nname: bench\n",
            "inventory.yaml": f"groups:\n  all: {{services: [{', '.join(names)}]}}\n"
                              f"nodes:\n  {node}: {{groups: [all], vars: {{base: 28300, version: 0}}}}\n",
        }
        for i, name in enumerate(names):
            files[f"services/{name}/service.yaml"] = SERVICE.format(name=name, i=i)
            files[f"services/{name}/templates/index.html.j2"] = (
                "{{ service }} v{{ version }}\n" if i == 0 else "{{ service }}\n")
        for rel, text in files.items():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).write_text(text)
        git("init", "-q", "-b", "main", cwd=work)
        sign = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={key}", "commit", "-S", "-q", "-am"]
        git("add", "-A", cwd=work)
        git(*sign, "base", cwd=work)
        bare = root / "remote.git"
        git("init", "-q", "--bare", "-b", "main", str(bare), cwd=root)
        git("push", "-q", str(bare), "main", cwd=work)
        cfg = AgentConfig(node=node, remote=f"file://{bare}", state_dir=root / "node",
                          trust=TrustConfig(allowed_signers=root / "allowed"))
        agent = Agent(cfg, progress=False)
        try:
            t = time.perf_counter()
            assert agent.reconcile_once().exit_code == 0
            print(f"{args.services} containers created and healthy in {time.perf_counter() - t:.2f} s")
            times, touched = [], []
            for r in range(1, args.rounds + 1):
                before = {c.name: (c.id, c.attrs["State"]["StartedAt"])
                          for c in client.containers.list(filters={"label": f"reconciler.node={node}"})}
                inv = work / "inventory.yaml"
                inv.write_text(inv.read_text().replace(f"version: {r - 1}", f"version: {r}"))
                git(*sign, f"svc00 v{r}", cwd=work)
                git("push", "-q", str(bare), "main", cwd=work)
                t = time.perf_counter()
                result = agent.reconcile_once()
                times.append(time.perf_counter() - t)
                assert result.exit_code == 0
                after = {c.name: (c.id, c.attrs["State"]["StartedAt"])
                         for c in client.containers.list(filters={"label": f"reconciler.node={node}"})}
                touched.append(sum(1 for n in after if before.get(n) != after[n]))
            target = client.containers.get(f"rc-{node}-svc00")
            floor = []
            for _ in range(args.rounds):
                t = time.perf_counter()
                target.restart(timeout=10)
                floor.append(time.perf_counter() - t)
            ours, bare_restart = statistics.median(times), statistics.median(floor)
            print(f"one config change among {args.services} running containers, median of {args.rounds}:")
            print(f"  reconciler apply (whole pass)   {ours * 1000:8.1f} ms   containers touched: {sorted(set(touched))}")
            print(f"  docker restart (API, the floor) {bare_restart * 1000:8.1f} ms")
            print(f"  ratio                           {ours / bare_restart:8.2f}x the floor")
        finally:
            driver = DockerDriver(root / "node" / "docker", node, client)
            for o in driver.observe():
                driver.remove(o.name)
            for v in client.volumes.list(filters={"name": f"rc-{node}-"}):
                v.remove(force=True)


if __name__ == "__main__":
    main()
