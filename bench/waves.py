"""A rollout in waves, end to end: time from merge to the last node applied, and each wave's overhead.

N real agents (in this process, each with its own state dir, notes ref and schedule) poll one
`git daemon` every INTERVAL seconds at their own offset (jitter = the interval), on the
daemon's own scheduler, as `reconciler agent` does; the branch's tips file and each node's
notes tip are served by a real nginx from `contrib/git-server/post-receive-tips` (the tip
probe, ``probe:``). The repo's rollout puts them in WAVES waves of one batch each; one service
per node (a real process) restarts for the change. A signed commit is pushed and the clock runs
until the last note. Per wave: when its first node started and when its last note landed; the
overhead of a wave is the time from the previous wave's last note to its own last note, less
the slowest apply in it.

Run twice, the two schedules side by side: ``before``, a waiting node looks again at its next
poll (``wait_poll: 0``, as before issue 40: 0.88 of the interval a wave, median of two runs);
``now``, a waiting node wait-polls the notes tips of the few nodes it waits on every
``wait_poll`` seconds (the daemon's own ``WaitPolls``) and polls at once when one moved. The
target (issue 40): merge to last node applied across 4 waves at a 10 s interval = the applies
plus at most 4 s (the waves after the first each start on the note of the one before).

Both runs start from the push's webhook (every node's receiver called: a poll now), so the
first wave starts on the merge; ``--no-wake`` leaves it to the nodes' next polls.

Usage: .venv/bin/python bench/waves.py [--nodes 24] [--waves 4] [--interval 10] [--wait-poll 1]
                                       [--only before|now] [--no-wake]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fleet import commit_change, cpu_seconds, free_port, git, serve, signed_repo
from server import NOTES_PER_NODE

from reconciler.agent import Agent
from reconciler.core.errors import ReconcilerError
from reconciler.daemon.supervisor import Every, WaitPolls, node_offset
from reconciler.drivers.process import ProcessDriver
from reconciler.settings import AgentConfig, RemoteConfig, TrustConfig
from reconciler.trust.notesig import NoteKey, public_line

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from nginx import Nginx  # noqa: E402  (the tests' own nginx)

HOOK = Path(__file__).resolve().parent.parent / "contrib" / "git-server" / "post-receive-tips"
WAKE_GAP = 0.02  # seconds between two webhook calls of the push's hook
SERVICE = ("runtime:\n  command: [python3, idle.py]\nfiles:\n  - {path: idle.py, source: idle.py}\n"
           "  - {path: idle.conf, template: idle.conf.j2}\n")


def notes_tips(bare: Path) -> dict[str, str]:
    """Each node's notes tip on the server."""
    out = git("for-each-ref", "--format=%(objectname) %(refname:lstrip=3)", "refs/notes/reconciler/", cwd=bare)
    return {name: oid for oid, name in (line.split() for line in out.splitlines())}


@dataclass(frozen=True)
class Rollout:
    """One rollout's figures: seconds from the push."""

    waves: list[list[str]]
    started: dict[str, float]
    noted: dict[str, float]
    applying: dict[str, float]
    polls: int
    wait_polls: int
    server_cpu: float
    pushed: list[int]
    failures: list[str]

    @property
    def last(self) -> float:
        return max(self.noted.values())

    @property
    def applies(self) -> float:
        """The slowest apply of each wave, summed: what no schedule saves."""
        return sum(max(self.applying[m] for m in w) for w in self.waves)

    def overheads(self) -> list[float]:
        """Each wave's overhead: its last note less the wave before's, less its slowest apply."""
        out, previous = [], 0.0
        for w in self.waves:
            end = max(self.noted[m] for m in w)
            out.append(end - previous - max(self.applying[m] for m in w))
            previous = end
        return out


def rollout(n: int, k: int, interval: float, wait_poll: float, wake: bool) -> Rollout:
    per = -(-n // k)
    with tempfile.TemporaryDirectory(prefix="reconciler-bench-waves-") as tmp:
        root = Path(tmp)
        names = [f"n{i:03d}" for i in range(n)]
        waves = [names[i:i + per] for i in range(0, n, per)]
        plan = "".join(f"    - {{name: w{i}, nodes: [{', '.join(w)}], batch: {len(w)}}}\n" for i, w in enumerate(waves))
        files = {"reconciler.yaml": f"format: 1\nname: fleet\nrollout:\n  waves:\n{plan}",
                 "inventory.yaml": "vars: {v: 0}\ngroups:\n  all: {services: [idle]}\nnodes:\n"
                                   + "".join(f"  {m}: {{groups: [all]}}\n" for m in names),
                 "services/idle/service.yaml": SERVICE,
                 "services/idle/files/idle.py": "import time\nwhile True:\n    time.sleep(3600)\n",
                 "services/idle/templates/idle.conf.j2": "v = {{ v }}\n"}
        keys = {m: root / "keys" / m for m in names}  # each node signs its notes; trust/nodes lists them
        (root / "keys").mkdir()
        files["trust/nodes"] = "".join(public_line(m, NoteKey.load_or_create(keys[m])) + "\n" for m in names)
        work, sign = signed_repo(root, files)
        www = root / "www"
        web = Nginx(www, root / "nginx", free_port())
        if not web.available:  # said before anything starts
            raise SystemExit(f"nginx is needed for the tip probe ({web.binary}): apt-get install nginx-light")
        daemon, url = serve(root, work)
        agents: dict[str, Agent] = {}
        waits: dict[str, WaitPolls] = {}
        finished = {m: threading.Event() for m in names}  # a node's schedule ends when set
        try:  # from here on, whatever fails stops what started (the daemon, nginx, the services)
            bare = root / "srv" / "cloud.git"
            (www / "tips").mkdir(parents=True)
            git("config", "reconciler.tips", str(www / "tips" / "cloud"), cwd=bare)
            (bare / "hooks" / "post-receive").write_bytes(HOOK.read_bytes())
            (bare / "hooks" / "post-receive").chmod(0o755)
            subprocess.run([str(HOOK)], cwd=bare, check=True, stdin=subprocess.DEVNULL)
            web.start()
            trust = TrustConfig(allowed_signers=root / "allowed", policy="head")
            remotes = (RemoteConfig(url, "both", probe=web.url("tips/cloud")),)
            agents.update({m: Agent(AgentConfig(node=m, remote=url, state_dir=root / "nodes" / m, trust=trust,
                                                remotes=remotes, note_key=keys[m], interval=interval, jitter=interval,
                                                wait_poll=wait_poll), progress=False)
                           for m in names})
            for a in agents.values():  # everyone on c0, wave by wave
                a.reconcile_once()
            for w in waves[1:]:
                for m in w:
                    agents[m].reconcile_once()
            head = commit_change(work, files, sign)
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
            passing = {m: threading.Lock() for m in names}  # the daemon's one pass at a time

            def poller(m: str) -> Callable[[], None]:
                def poll() -> None:
                    if not passing[m].acquire(timeout=WaitPolls.HELD):
                        return
                    begun = time.monotonic()
                    try:
                        result = agents[m].reconcile_once()
                    except ReconcilerError as exc:  # as the daemon says it: one line, the next poll tries again
                        with lock:
                            failures.append(f"{m}: {exc}")
                        return
                    finally:
                        passing[m].release()
                    with lock:
                        polls[0] += 1
                    waits[m].after(result.waiting)  # as the daemon's pass ends
                    if result.commit == head and result.report is not None:  # applied (a waiting pass has none)
                        started[m], applying[m] = begun - t0, time.monotonic() - begun
                    if m in applying and result.pushed:  # its note is on the server (a failed push: the next poll's)
                        noted[m] = time.monotonic() - t0
                        finished[m].set()  # this node's schedule ends here
                return poll

            # The daemon's own schedule (reconciler.daemon.Every): the node's offset, then every
            # interval; its wait-polls (WaitPolls) while a pass waits.
            everys = {m: Every(m, interval, poller(m), finished[m], first=node_offset(m, interval)) for m in names}
            for m in names:
                waits[m] = WaitPolls(agents[m], everys[m], passing[m], finished[m], wait_poll)
                everys[m].start()
            if wake:  # the git server's hook calls each node's webhook receiver: a poll now (Every.soon),
                # one after the other as a hook's loop does (a burst at once overflows `git daemon`'s
                # listen backlog of 5: connections reset, those polls lost until the next interval)
                for e in everys.values():
                    e.now()
                    time.sleep(WAKE_GAP)
            for m in names:
                finished[m].wait(timeout=(k + 2) * interval * 4 + 120)
            cpu = cpu_seconds(daemon.pid) - cpu0
            missing = sorted(set(names) - set(noted))
            assert not missing, f"no note from {missing}"
            tips = notes_tips(bare)
            pushed = sorted(int(git("rev-list", "--count", tips[m], *([f"^{tips0[m]}"] if m in tips0 else []),
                                    cwd=bare)) for m in names)
            wait_polls = sum(len(web.requests(f"tips/cloud.notes/{m}")) for m in names)
            return Rollout(waves, started, noted, applying, polls[0], wait_polls, cpu, pushed, failures)
        finally:
            for m in names:  # every node's schedule ends, a failed run's too
                finished[m].set()
            for wp in waits.values():
                wp.wake()
            daemon.terminate()
            daemon.wait()
            web.stop()
            for m, a in agents.items():
                a.close()
                driver = ProcessDriver(root / "nodes" / m / "services", m)
                for o in driver.observe():
                    driver.remove(o.name)


def show(label: str, r: Rollout, interval: float) -> None:
    over = r.overheads()
    print(f"  {label}: merge -> last node applied {r.last:6.2f} s = applies {r.applies:5.2f} s"
          f" + {r.last - r.applies:5.2f} s")
    for i, w in enumerate(r.waves):
        print(f"    wave {i} ({len(w)} nodes)  first start {min(r.started[m] for m in w):6.2f} s  last note"
              f" {max(r.noted[m] for m in w):6.2f} s  slowest apply {max(r.applying[m] for m in w):5.2f} s"
              f"  overhead {over[i]:5.2f} s"
              + ("   (the first poll after the merge)" if i == 0 else f"   ({over[i] / interval:4.2f} x the interval)"))
    later = over[1:] or [0.0]
    print(f"    after the first wave: overhead per wave median {statistics.median(later):.2f} s"
          f" ({statistics.median(later) / interval:.2f} x the interval), total {sum(later):.2f} s")
    print(f"    passes {r.polls}, wait-polls {r.wait_polls} (probe reads of a notes tip), git server CPU"
          f" {r.server_cpu:.2f} s; notes commits a node pushed: median {r.pushed[len(r.pushed) // 2]}, most"
          f" {r.pushed[-1]} (bench/server.py's model: {NOTES_PER_NODE})")
    if r.failures:
        print(f"    {len(r.failures)} passes failed (tried again at the next), the first: {r.failures[0]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=24)
    parser.add_argument("--waves", type=int, default=4)
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--wait-poll", type=float, default=1.0)
    parser.add_argument("--only", choices=("before", "now"))
    parser.add_argument("--no-wake", action="store_true",
                        help="no webhook on the push: the first wave starts at its nodes' next polls")
    args = parser.parse_args()
    print(f"rollout of one change (a restart of one process per node), {args.nodes} nodes in {args.waves} waves,"
          f" poll interval {args.interval:g} s, nodes spread over it, one git daemon, the tip probe from nginx"
          + ("" if args.no_wake else ", the push's webhook waking every node"))
    runs = {}
    for label, wait_poll in (("before", 0.0), ("now", args.wait_poll)):
        if args.only in (None, label):
            runs[label] = rollout(args.nodes, args.waves, args.interval, wait_poll, not args.no_wake)
            show(f"{label} (wait_poll {wait_poll:g} s)", runs[label], args.interval)
    if len(runs) == 2:
        before, now = runs["before"], runs["now"]
        print(f"  merge -> last node applied: before {before.last:.2f} s, now {now.last:.2f} s; beyond the applies"
              f" {before.last - before.applies:.2f} s -> {now.last - now.applies:.2f} s"
              f" (target: at most {args.waves:d} s across {args.waves} waves at a 10 s interval)")


if __name__ == "__main__":
    main()
