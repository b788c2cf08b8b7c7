"""Issue 40's change figure: one template change -> the service restarted, healthy, noted.

A signed repo of 10 process services (32 files), 5 of them on the node, each a small server
whose health is its TCP port answering (`health: tcp`, as a real service's is); the node's
daemon is warm (a fresh interpreter that has made its no-op poll, as a daemon that re-executed
after its last change is), then one service's template changes: the pass that fetches,
verifies, loads (the node's slice), renders, restarts that service, waits for its port, holds
it for the `min_healthy` the repo asks (0.5 s) and notes it is measured, wall and CPU (its own
and the git processes it waited for; the service runs on, unreaped, so its CPU is in neither
side's figure). The service's own restart (the old process
stopped, the new one's interpreter started until its port answers, timed here with a 1 ms
poll) is on that path: the agent waits for it. What is left beyond it and the hold is the
agent's cost. Beside it, in turns: `ansible-pull -o` doing the same (a playbook that templates
the five services' files and restarts the changed one by a handler, waiting for nothing; no
fact gathering, local connection), ansible-core in a venv of its own (``peers.venv``). Last, a
yardstick of the machine (``yardstick``): the figure is absolute, and one commit (0ce15d8) gave
0.12-0.14 s on one VM, 0.17-0.24 s on another slower at the imports the figure is mostly made of.

Usage: .venv/bin/python bench/change.py [--runs 5]   (also printed by bench/floor.sh)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchrepo import ENV, git, make_key
from peers import ANSIBLE, children_cpu, load, venv

HOLD = 0.5  # the min_healthy each service asks for
SERVICES, MINE = 10, 5
ANSIBLE_PLAY = """- hosts: localhost
  gather_facts: false
  connection: local
  vars: {{greeting: hello, root: "{root}", port_base: {port_base}}}
  tasks:
{tasks}
  handlers:
{handlers}
"""


# The service: its port read from its config; it answers connections (its health check) and
# takes SIGHUP (a reload). Binding is retried: a peer's handler starts it before the old one is gone.
SERVICE = """import signal, socket, sys, time
signal.signal(signal.SIGHUP, lambda *a: None)
port = int(next(line.split("=")[1] for line in open(sys.argv[1]) if line.startswith("port")))
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
for _ in range(500):
    try:
        s.bind(("127.0.0.1", port))
        break
    except OSError:
        time.sleep(0.01)
s.listen(16)
while True:
    s.accept()[0].close()
"""


def free_base(count: int) -> int:
    """A first port of ``count`` free ones in a row on 127.0.0.1."""
    import random
    import socket

    for _ in range(200):
        base = random.randrange(20000, 60000 - count)
        try:
            for port in range(base, base + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise SystemExit("no free ports for the bench's services")


def repo_files(stamp: str, port_base: int = 0) -> dict[str, str]:
    out = {"reconciler.yaml": "format: 1\nname: change\ndefaults:\n  driver: process\n"}
    mine = ", ".join(f"s{i}" for i in range(MINE))
    theirs = ", ".join(f"s{i}" for i in range(MINE, SERVICES))
    out["inventory.yaml"] = (f"vars:\n  greeting: hello\n  port_base: {port_base}\ngroups:\n  mine:\n    services: [{mine}]\n"
                             f"  theirs:\n    services: [{theirs}]\n"
                             "nodes:\n  bench1:\n    groups: [mine]\n  other:\n    groups: [theirs]\n")
    for i in range(SERVICES):
        out[f"services/s{i}/service.yaml"] = (
            "description: a sleeper with a config file\nversion: '1'\n"
            "runtime:\n  command: [python3, svc.py, svc.conf]\n  env: {MODE: bench}\n"
            "files:\n  - {path: svc.conf, template: svc.conf.j2}\n  - {path: svc.py, source: svc.py}\n"
            f"health:\n  tcp: '127.0.0.1:{{{{ port_base + {i} }}}}'\n  min_healthy: {HOLD}\n"
            "on_change:\n  - {file: svc.conf, keys: ['main.level'], action: reload}\n"
            "reload: {signal: SIGHUP}\n")
        out[f"services/s{i}/templates/svc.conf.j2"] = (
            f"[main]\nname = {{{{ service }}}}\ngreeting = {{{{ greeting }}}}\nport = {{{{ port_base + {i} }}}}\n"
            + (f"stamp = {stamp}\n" if i == 0 else ""))
        out[f"services/s{i}/files/svc.py"] = SERVICE
    return out


def write(work: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)


# One pass of the daemon after a change, in a fresh interpreter that has polled once (as the
# daemon after its re-execution): prints wall, own CPU and children's CPU of the pass, as JSON.
PASS = """
import json, pickle, resource, sys, time
from reconciler.agent import Agent
agent = Agent(pickle.load(open(sys.argv[1], "rb")), progress=False)
assert agent.reconcile_once().exit_code == 0  # the no-op poll before it
print("polled", flush=True)
input()  # the change is pushed
c0, o0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.process_time(), time.perf_counter()
result = agent.reconcile_once()
wall, own = time.perf_counter() - t0, time.process_time() - o0
c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
actions = [(r.service, str(r.action), str(r.state)) for r in result.report.services] if result.report else []
print(json.dumps({"jsonschema": "jsonschema" in sys.modules, "wall": wall, "own": own, "children": c1.ru_utime - c0.ru_utime + c1.ru_stime - c0.ru_stime,
                  "exit": result.exit_code, "actions": actions}))
"""


class Reconciler:
    def __init__(self, root: Path) -> None:
        import pickle

        from reconciler.agent import Agent
        from reconciler.settings import AgentConfig, TrustConfig

        root.mkdir(parents=True)
        self.key, allowed = make_key(root)
        self.work, self.bare = root / "work", root / "remote.git"
        self.port_base = free_base(MINE)
        write(self.work, repo_files("0", self.port_base))
        git("init", "-q", "-b", "main", cwd=self.work)
        git("init", "-q", "--bare", "-b", "main", str(self.bare))
        self.rounds = 0
        self.commit()
        self.cfg = AgentConfig(node="bench1", remote=f"file://{self.bare}", state_dir=root / "node",
                               trust=TrustConfig(allowed_signers=allowed))
        agent = Agent(self.cfg, progress=False)
        assert agent.reconcile_once().exit_code == 0  # the first deploy
        agent.close()
        self.pickled = root / "cfg.pickle"
        self.pickled.write_bytes(pickle.dumps(self.cfg))

    def commit(self) -> None:
        git("add", "-A", cwd=self.work)
        git("-c", "gpg.format=ssh", "-c", f"user.signingkey={self.key}", "commit", "-S", "-q", "-m",
            f"change {self.rounds}", cwd=self.work)
        git("push", "-q", str(self.bare), "main", cwd=self.work)

    def change(self) -> dict[str, float]:
        self.rounds += 1
        daemon = subprocess.Popen([sys.executable, "-c", PASS, str(self.pickled)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        assert daemon.stdout is not None and daemon.stdout.readline().strip() == "polled"  # the daemon idles
        write(self.work, {"services/s0/templates/svc.conf.j2": repo_files(str(self.rounds), self.port_base)[
            "services/s0/templates/svc.conf.j2"]})
        self.commit()
        out, _ = daemon.communicate("\n", timeout=120)
        done = json.loads(out.strip().splitlines()[-1])
        acted = [a for a in done["actions"] if a[1] != "none"]
        assert done["exit"] == 0 and acted == [["s0", "restart", "ok"]], done
        return done  # type: ignore[no-any-return]

    def close(self) -> None:
        from reconciler.drivers.process import ProcessDriver

        driver = ProcessDriver(self.cfg.state_dir / "services", "bench1")
        for o in driver.observe():
            driver.remove(o.name)


class AnsibleChange:
    """`ansible-pull -o` of a playbook that templates the five services' config files and
    restarts the changed one (a handler: kill, start again, as the process driver does)."""

    def __init__(self, root: Path) -> None:
        bin_dir = venv("ansible", ANSIBLE)
        self.root, self.work, self.bare = root, root / "play", root / "play.git"
        run = root / "run"
        run.mkdir(parents=True)
        (run / "svc.py").write_text(repo_files("0")["services/s0/files/svc.py"])
        tasks = "".join(f"    - ansible.builtin.template: {{src: s{i}.conf.j2, dest: \"{{{{ root }}}}/s{i}.conf\"}}\n"
                        f"      notify: restart s{i}\n" for i in range(MINE))
        handlers = "".join(
            f"    - name: restart s{i}\n      ansible.builtin.shell: >-\n"
            f"        cd {run} && (test -f s{i}.pid && kill $(cat s{i}.pid) || true) &&\n"
            f"        (nohup python3 svc.py s{i}.conf >/dev/null 2>&1 & echo $! > s{i}.pid)\n" for i in range(MINE))
        self.rounds = 0
        self.write_templates()
        (self.work / "local.yml").write_text(ANSIBLE_PLAY.format(root=run, port_base=free_base(MINE),
                                                                 tasks=tasks.rstrip("\n"),
                                                                 handlers=handlers.rstrip("\n")))
        for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "play"],
                     ["init", "-q", "--bare", "-b", "main", str(self.bare)], ["push", "-q", str(self.bare), "main"]):
            subprocess.run(["git", *args], cwd=self.work, env=ENV, check=True, capture_output=True)
        self.cmd = [str(bin_dir / "ansible-pull"), "-U", f"file://{self.bare}", "-C", "main", "-d",
                    str(root / "pulled"), "-i", "localhost,", "-c", "local", "-o", "local.yml"]
        self.env = {**os.environ, "ANSIBLE_PYTHON_INTERPRETER": str(bin_dir / "python")}
        self.env.pop("PYTHONDONTWRITEBYTECODE", None)
        subprocess.run(self.cmd, env=self.env, check=True, capture_output=True)  # the first deploy
        self.run = run

    def write_templates(self) -> None:
        for i in range(MINE):
            text = repo_files(str(self.rounds))[f"services/s{i}/templates/svc.conf.j2"]
            (self.work / f"s{i}.conf.j2").parent.mkdir(parents=True, exist_ok=True)
            (self.work / f"s{i}.conf.j2").write_text(text.replace("{{ service }}", f"s{i}"))

    def change(self) -> dict[str, float]:
        self.rounds += 1
        self.write_templates()
        for args in (["commit", "-q", "-am", f"change {self.rounds}"], ["push", "-q", str(self.bare), "main"]):
            subprocess.run(["git", *args], cwd=self.work, env=ENV, check=True, capture_output=True)
        t0 = time.perf_counter()
        cpu = children_cpu(self.cmd, self.env)
        return {"wall": time.perf_counter() - t0, "cpu": cpu}

    def close(self) -> None:
        for pid in self.run.glob("*.pid"):
            subprocess.run(["kill", pid.read_text().strip()], capture_output=True)


def own_restart(root: Path, runs: int = 5) -> float:
    """The service's own restart, the least any agent waits for it: the old process stopped
    (SIGTERM, until it is gone), the new one started until its port answers (a 1 ms poll); its
    ``python3`` the one the process driver finds on a service's PATH (not the bench's, which may
    be a version manager's shim)."""
    import shutil
    import socket

    from reconciler.drivers.base import SERVICE_PATH

    python3 = shutil.which("python3", path=SERVICE_PATH) or "python3"

    port = free_base(1)
    (root / "own.conf").write_text(f"[main]\nport = {port}\n")
    (root / "own.py").write_text(SERVICE)

    def up() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([python3, "own.py", "own.conf"], cwd=root)
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return proc
            time.sleep(0.001)

    times, proc = [], up()
    try:
        for _ in range(runs):
            t0 = time.perf_counter()
            proc.terminate()
            proc.wait()
            proc = up()
            times.append(time.perf_counter() - t0)
    finally:
        proc.kill()
        proc.wait()
    return statistics.median(times)


def yardstick(runs: int = 7) -> float:
    """This machine's speed at what the figure is mostly made of: importing pygit2 and Jinja2
    in a fresh interpreter of the bench's venv, beyond a bare one (wall, median). The figure is
    absolute; this says how it compares with one taken on another machine or day."""
    def wall(code: str) -> float:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        return time.perf_counter() - t0

    return statistics.median(wall("import pygit2, jinja2") - wall("pass") for _ in range(runs))


def change_rows(runs: int) -> list[tuple[str, str, str, str, str]]:
    """Rows of (measure, reconciler, peer, ratio, target) for bench/poll.py --targets."""
    with tempfile.TemporaryDirectory(prefix="reconciler-bench-") as tmp:
        root = Path(tmp)
        ours, theirs = Reconciler(root / "r"), AnsibleChange(root / "a")
        try:
            mine, peer = [], []
            for _ in range(runs):
                mine.append(ours.change())
                peer.append(theirs.change())
            restart = own_restart(root)
            stick = yardstick()
        finally:
            ours.close()
            theirs.close()
    wall = statistics.median(m["wall"] for m in mine)
    cpu = statistics.median(m["own"] + m["children"] for m in mine)
    beyond = wall - HOLD - restart
    pwall, pcpu = statistics.median(p["wall"] for p in peer), statistics.median(p["cpu"] for p in peer)
    return [
        ("one template change, wall", f"{wall:.3f} s", f"ansible-pull -o {pwall:.3f} s", f"1/{pwall / wall:.1f}", ""),
        ("  CPU (own + children)", f"{cpu:.3f} s", f"ansible-pull -o {pcpu:.3f} s", f"1/{pcpu / cpu:.1f}", ""),
        ("  the hold the repo asks (apart)", f"{HOLD:.3f} s", "", "", ""),
        ("  the service's own restart", f"{restart:.3f} s", "", "", ""),
        ("  beyond the hold and the restart", f"{beyond:.3f} s", "", "", "<= 0.15 s"),
        ("  yardstick: pygit2 + Jinja2 imported", f"{stick:.3f} s", "", "", ""),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"issue 40, one template change: medians of {args.runs} runs taken in turns (load {load()})")
    for row in change_rows(args.runs):
        print(f"{row[0]:40s} {row[1]:34s} {row[2]:28s} {row[3]:8s} {row[4]}")


if __name__ == "__main__":
    main()
