"""A rollout in waves, end to end: time from merge to the last note, and each wave's overhead.

N real agents (in this process, each with its own state dir, notes ref and schedule) poll one
`git daemon` every INTERVAL seconds at their own offset (jitter = the interval), on the
daemon's own scheduler, as `reconciler agent` does. The repo's rollout puts them in WAVES waves of one batch each; one service per node (a
real process) restarts for the change. A signed commit is pushed and the clock runs until the
last note. Per wave: when its first node started (its pass began after its predecessors'
notes were on the server) and when its last note landed; the overhead of a wave is the time
from the previous wave's last note to its own last note, less the slowest apply in it. The
target (issue 17): at most one poll interval per wave. The model it is checked against:
merge -> last note <= (WAVES + 1) x INTERVAL + the applies.

Usage: .venv/bin/python bench/waves.py [--nodes 24] [--waves 4] [--interval 3]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from fleet import commit_change, cpu_seconds, git, serve, signed_repo
from server import NOTES_PER_NODE

from reconciler.agent import Agent
from reconciler.core.errors import ReconcilerError
from reconciler.daemon.supervisor import Every, node_offset
from reconciler.drivers.process import ProcessDriver
from reconciler.settings import AgentConfig, TrustConfig

SERVICE = ("runtime:\n  command: [python3, idle.py]\nfiles:\n  - {path: idle.py, source: idle.py}\n"
           "  - {path: idle.conf, template: idle.conf.j2}\n")


def notes_tips(bare: Path) -> dict[str, str]:
    """Each node's notes tip on the server."""
    out = git("for-each-ref", "--format=%(objectname) %(refname:lstrip=3)", "refs/notes/reconciler/", cwd=bare)
    return {name: oid for oid, name in (line.split() for line in out.splitlines())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=24)
    parser.add_argument("--waves", type=int, default=4)
    parser.add_argument("--interval", type=float, default=3.0)
    args = parser.parse_args()
    n, k, interval = args.nodes, args.waves, args.interval
    per = -(-n // k)
    with tempfile.TemporaryDirectory(prefix="reconciler-bench-waves-") as tmp:
        root = Path(tmp)
        names = [f"n{i:03d}" for i in range(n)]
        waves = [names[i:i + per] for i in range(0, n, per)]
        rollout = "".join(f"    - {{name: w{i}, nodes: [{', '.join(w)}], batch: {len(w)}}}\n" for i, w in enumerate(waves))
        files = {"reconciler.yaml": f"format: 1\nname: fleet\nrollout:\n  waves:\n{rollout}",
                 "inventory.yaml": "vars: {v: 0}\ngroups:\n  all: {services: [idle]}\nnodes:\n"
                                   + "".join(f"  {m}: {{groups: [all]}}\n" for m in names),
                 "services/idle/service.yaml": SERVICE,
                 "services/idle/files/idle.py": "import time\nwhile True:\n    time.sleep(3600)\n",
                 "services/idle/templates/idle.conf.j2": "v = {{ v }}\n"}
        work, sign = signed_repo(root, files)
        daemon, url = serve(root, work)
        trust = TrustConfig(allowed_signers=root / "allowed", policy="head")
        agents = {m: Agent(AgentConfig(node=m, remote=url, state_dir=root / "nodes" / m, trust=trust,
                                       interval=interval, jitter=interval), progress=False) for m in names}
        try:
            for a in agents.values():  # everyone on c0, wave by wave
                a.reconcile_once()
            for w in waves[1:]:
                for m in w:
                    agents[m].reconcile_once()
            head = commit_change(work, files, sign)
            bare = root / "srv" / "cloud.git"
            tips0 = notes_tips(bare)
            cpu0 = cpu_seconds(daemon.pid)
            git("push", "-q", url, "main", cwd=work)
            t0 = time.monotonic()
            started: dict[str, float] = {}
            noted: dict[str, float] = {}
            applying: dict[str, float] = {}
            polls = [0]
            failures: list[str] = []
            lock = threading.Lock()
            finished = {m: threading.Event() for m in names}

            def poller(m: str) -> Callable[[], None]:
                def poll() -> None:
                    begun = time.monotonic()
                    try:
                        result = agents[m].reconcile_once()
                    except ReconcilerError as exc:  # as the daemon says it: one line, the next poll tries again
                        with lock:
                            failures.append(f"{m}: {exc}")
                        return
                    with lock:
                        polls[0] += 1
                    if result.commit == head and result.report is not None:  # applied (a waiting pass has none)
                        started[m], applying[m] = begun - t0, time.monotonic() - begun
                    if m in applying and result.pushed:  # its note is on the server (a failed push: the next poll's)
                        noted[m] = time.monotonic() - t0
                        finished[m].set()  # this node's schedule ends here
                return poll

            # The daemon's own schedule (reconciler.daemon.Every): the node's offset, then every interval.
            for m in names:
                Every(m, interval, poller(m), finished[m], first=node_offset(m, interval)).start()
            for m in names:
                finished[m].wait(timeout=(k + 2) * interval * 4 + 120)
            cpu = cpu_seconds(daemon.pid) - cpu0
            missing = sorted(set(names) - set(noted))
            assert not missing, f"no note from {missing}"
            last = max(noted.values())
            print(f"rollout of one change (a restart of one process per node), {n} nodes in {len(waves)} waves, "
                  f"poll interval {interval:g}s, nodes spread over it, one git daemon")
            print(f"  merge -> last note              {last:7.2f} s   (model: <= (waves + 1) x interval + applies"
                  f" = {(len(waves) + 1) * interval + sum(max(applying[m] for m in w) for w in waves):.2f} s)")
            previous = 0.0
            worst = 0.0
            for i, w in enumerate(waves):
                end = max(noted[m] for m in w)
                apply_s = max(applying[m] for m in w)
                overhead = end - previous - apply_s
                worst = max(worst, overhead if i else 0.0)
                print(f"  wave {i} ({len(w)} nodes)  first start {min(started[m] for m in w):6.2f} s  last note {end:6.2f}"
                      f" s  slowest apply {apply_s:5.2f} s  overhead {overhead:5.2f} s"
                      + ("   (the first poll after the merge)" if i == 0 else
                         f"   ({overhead / interval:4.2f} x the interval)"))
                previous = end
            print(f"  worst wave overhead after the first: {worst:.2f} s = {worst / interval:.2f} x the interval"
                  f" (target <= 1)")
            print(f"  polls {polls[0]}, git server CPU {cpu:.2f} s ({cpu / max(polls[0], 1) * 1000:.1f} ms per poll)")
            tips = notes_tips(bare)
            pushed = sorted(int(git("rev-list", "--count", tips[m], *([f"^{tips0[m]}"] if m in tips0 else []),
                                    cwd=bare)) for m in names)
            print(f"  notes commits a node pushed in the rollout: median {pushed[len(pushed) // 2]}, most {pushed[-1]}"
                  f" (bench/server.py's model: {NOTES_PER_NODE})")
            if failures:
                print(f"  {len(failures)} polls failed (tried again at the next), the first: {failures[0]}")
        finally:
            daemon.terminate()
            daemon.wait()
            for m, a in agents.items():
                a.close()
                driver = ProcessDriver(root / "nodes" / m / "services", m)
                for o in driver.observe():
                    driver.remove(o.name)


if __name__ == "__main__":
    main()
