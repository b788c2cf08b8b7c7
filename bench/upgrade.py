"""An upgrade across N in-process nodes with 4 steps (pin, stop, a once migration, start):
how long nodes wait at barriers beyond one poll interval, and what the git side costs.

Every node is a real agent with its own state dir and a real idle process (process driver);
they share one file:// remote. Time is counted in poll rounds, not seconds: in each round
every node polls once, in the worst order (the node a barrier waits on polls last). The
target is that a step starts at most one poll interval after its barrier opened (the round
after the last node noted the step before it).

Reported:
- rounds from the upgrade commit to the last node applied, against the ideal (one round per
  barrier, plus one);
- per barrier, the extra rounds beyond one interval (max over nodes);
- CPU of the git processes the agents ran (fetches, note pushes; file:// runs the server side
  in those processes too), per node and per poll, with wall time per round;
- the peer: a plain `git fetch` of the notes refs into a clone, per poll.

Usage: .venv/bin/python bench/upgrade.py [--nodes 50]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import tempfile
import time
from pathlib import Path

from benchrepo import ENV, git, make_key

from reconciler.agent import Agent
from reconciler.drivers.process import ProcessDriver
from reconciler.settings import AgentConfig, TrustConfig

SERVICE = """\
version: "{version}"
runtime:
  command: [python3, idle.py]
files:
  - {{path: idle.py, source: idle.py}}
  - {{path: app.conf, template: app.conf.j2}}
health: {{min_healthy: 0.1}}
upgrade:
  - {{name: pin, action: pin, set: {{rpc: "old"}}}}
  - {{name: stop, action: stop}}
  - {{name: migrate, action: command, scope: once, command: "echo migrated"}}
  - {{name: start, action: start}}
"""
STEPS = ("pin", "stop", "migrate", "start")


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(nodes: int) -> None:
    with tempfile.TemporaryDirectory(prefix="reconciler-bench-upgrade-") as tmp:
        root = Path(tmp)
        key, allowed = make_key(root)
        names = [f"n{i:03d}" for i in range(nodes)]
        work, bare = root / "work", root / "remote.git"
        files = {
            "reconciler.yaml": "format: 1\nname: bench\n",
            "inventory.yaml": "vars: {rpc: auto}\ngroups:\n  all: {services: [app]}\nnodes:\n"
                              + "".join(f"  {n}: {{groups: [all]}}\n" for n in names),
            "services/app/service.yaml": SERVICE.format(version=1),
            "services/app/files/idle.py": "import time\nwhile True:\n    time.sleep(3600)\n",
            "services/app/templates/app.conf.j2": "rpc = {{ rpc }}\nversion = {{ service_version }}\n",
        }
        for rel, text in files.items():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).write_text(text)
        git("init", "-q", "-b", "main", cwd=work)
        git("init", "-q", "--bare", "-b", "main", str(bare))

        def commit(message: str) -> str:
            git("add", "-A", cwd=work)
            git("-c", "gpg.format=ssh", "-c", f"user.signingkey={key}", "commit", "-S", "-q", "-m", message, cwd=work)
            git("push", "-q", str(bare), "main", cwd=work)
            return git("rev-parse", "HEAD", cwd=work).strip()

        commit("version 1")
        url = f"file://{bare}"
        trust = TrustConfig(allowed_signers=allowed)
        fleet = [Agent(AgentConfig(node=n, remote=url, state_dir=root / "nodes" / n, trust=trust), progress=False)
                 for n in names]
        try:
            for agent in fleet:
                assert agent.reconcile_once().exit_code == 0
            (work / "services/app/service.yaml").write_text(SERVICE.format(version=2))
            head = commit("version 2")

            done_round: dict[tuple[str, str], int] = {}
            cpu0, wall0, polls, rounds = children_cpu(), time.perf_counter(), 0, 0
            order = list(reversed(fleet))  # n000 runs the migration and polls last: the worst case
            while rounds < 40:
                rounds += 1
                for agent in order:
                    agent.reconcile_once()
                    polls += 1
                    for rec in agent.ledger.steps(head):
                        if str(rec.status) in ("done", "skipped"):
                            done_round.setdefault((agent.cfg.node, rec.step), rounds)
                if all(a.ledger.verdict(head) == "applied" for a in fleet):
                    break
            cpu, wall = children_cpu() - cpu0, time.perf_counter() - wall0

            print(f"{nodes} nodes, steps {' -> '.join(STEPS)}; git {git('--version').split()[-1]}, file:// remote")
            print(f"  rounds to the last node applied: {rounds} (at most {len(STEPS)}: one per barrier and one to begin)")
            for prev, step in zip(STEPS, STEPS[1:], strict=False):
                opened = max(done_round[(n, prev)] for n in names if (n, prev) in done_round)
                extra = max(done_round[(n, step)] - opened for n in names) - 1
                print(f"  barrier before {step:8s}: opened in round {opened}, extra rounds beyond one "
                      f"interval: {max(extra, 0)}")
            print(f"  git CPU (fetch + note push, client and server): {cpu:.2f} s in all, {cpu / nodes * 1000:.0f} ms "
                  f"per node, {cpu / polls * 1000:.1f} ms per poll ({polls} polls); {wall / rounds:.1f} s wall per round")

            clone = root / "peer.git"
            git("clone", "-q", "--bare", url, str(clone))
            c0 = children_cpu()
            for _ in range(20):
                subprocess.run(["git", "fetch", "-q", url, "+refs/notes/reconciler/*:refs/notes/peer/*"], cwd=clone,
                               env=ENV, check=True, capture_output=True)
            peer = (children_cpu() - c0) / 20
            print(f"  peer: git fetch of every node's notes ref into a clone: {peer * 1000:.1f} ms CPU per fetch "
                  f"(a reconciler poll at a barrier: {cpu / polls / peer:.1f}x that, it also pushes its own note)")
        finally:
            for agent in fleet:
                driver = ProcessDriver(agent.cfg.state_dir / "services", agent.cfg.node)
                for o in driver.observe():
                    driver.remove(o.name)
                agent.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=50)
    run(parser.parse_args().nodes)


if __name__ == "__main__":
    main()
