"""Issue 40's no-op figures, each beside its peer or floor measured in the same run, in turns:

- the no-op poll inside the daemon (``Agent.reconcile_once`` in a warm process: its own CPU and
  its git's) against ``git ls-remote`` of the same branch of the same remote (the floor: a poll
  cannot ask less), and against ``ansible-pull -o`` (which clones nothing new either);
- ``reconciler agent --once`` on a no-op, the whole process's CPU (its git included), installed
  as the docs say (``pip install`` of the checkout into a venv of its own: bytecode compiled at
  install), against ``ansible-pull -o`` from ansible-core in a venv of its own, and a bare
  interpreter of the same venv (the floor of any Python agent);
- the idle daemon's RSS (that install, a few 1 s polls after it converged) against a bare
  interpreter.

The two venvs are made from the package index on the first run, under ``$RECONCILER_BENCH_CACHE``
(default ``~/.cache/reconciler-bench``); the checkout is installed again into its venv on every
run (``--no-deps``), so the figure is the code's as it is. Used by ``bench/poll.py --targets``.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ANSIBLE = "ansible-core==2.19.*"
PLAY = """- hosts: localhost
  gather_facts: false
  connection: local
  tasks:
    - ansible.builtin.copy: {{dest: "{out}", content: "idle\\n"}}
"""


def cache() -> Path:
    path = Path(os.environ.get("RECONCILER_BENCH_CACHE", Path.home() / ".cache" / "reconciler-bench"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def venv(name: str, *install: str) -> Path:
    """A venv of its own under the cache, with ``install`` (pip's words) in it; its bin dir."""
    where = cache() / name
    stamp = where / "installed"
    if not stamp.is_file() or stamp.read_text() != repr(install):
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(where)], check=True)
        subprocess.run([str(where / "bin/python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        *install], check=True)
        stamp.write_text(repr(install))
    return where / "bin"


def installed_reconciler(checkout: Path = ROOT) -> Path:
    """The checkout installed as the docs say, in a venv of its own (its dependencies once, the
    package again on every call); checked to have its bytecode compiled, as pip does by default.
    The dependencies are named in the venv's stamp: one added to pyproject.toml makes it anew."""
    import tomllib

    deps = tomllib.loads((checkout / "pyproject.toml").read_text())["project"]["dependencies"]
    bin_dir = venv("reconciler", str(checkout), *deps)
    subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "--no-deps", "--force-reinstall", str(checkout)], check=True)
    where = subprocess.run([str(bin_dir / "python"), "-c", "import reconciler.agent as a; print(a.__cached__)"],
                           capture_output=True, text=True, check=True, env=_clean_env()).stdout.strip()
    if not Path(where).is_file():
        raise SystemExit(f"pip compiled no bytecode for the installed package ({where})")
    return bin_dir


def _clean_env() -> dict[str, str]:
    """The environment without what would make a run differ from a node's (no bytecode writes
    suppressed, no path of the checkout)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")}


class AnsiblePull:
    """``ansible-pull -o`` of a one-task playbook in a repo of its own (no fact gathering, local
    connection: its best case), cloned once; after that every run finds nothing new."""

    def __init__(self, root: Path) -> None:
        bin_dir = venv("ansible", ANSIBLE)
        work, bare = root / "play", root / "play.git"
        work.mkdir(parents=True)
        (work / "local.yml").write_text(PLAY.format(out=root / "played.txt"))
        env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x", "GIT_COMMITTER_NAME": "b",
               "GIT_COMMITTER_EMAIL": "b@x"}
        for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "play"],
                     ["init", "-q", "--bare", "-b", "main", str(bare)], ["push", "-q", str(bare), "main"]):
            subprocess.run(["git", *args], cwd=work, env=env, check=True, capture_output=True)
        self.cmd = [str(bin_dir / "ansible-pull"), "-U", f"file://{bare}", "-C", "main", "-d", str(root / "pulled"),
                    "-i", "localhost,", "-c", "local", "-o", "local.yml"]
        self.env = {**_clean_env(), "ANSIBLE_PYTHON_INTERPRETER": str(bin_dir / "python")}
        subprocess.run(self.cmd, env=self.env, check=True, capture_output=True)  # the clone and first run

    def once(self) -> float:
        return children_cpu(self.cmd, self.env)


def children_cpu(cmd: list[str], env: dict[str, str] | None = None) -> float:
    """CPU seconds of ``cmd``, its processes included (what it waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def poll_cpu(poll: Callable[[], object], batch: int) -> tuple[float, float]:
    """CPU seconds per call of ``poll`` over ``batch`` calls: its own, and its children's."""
    c0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.process_time()
    for _ in range(batch):
        poll()
    own = time.process_time() - t0
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own / batch, ((c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)) / batch


def median(values: list[float]) -> float:
    return statistics.median(values)


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]


def idle_rss(cmd: list[str], idle_s: float) -> float:
    """RSS of the daemon ``cmd`` after ``idle_s`` seconds (converged already: no-op polls)."""
    daemon = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_clean_env())
    try:
        time.sleep(idle_s)
        if daemon.poll() is not None:
            raise SystemExit(f"the daemon exited ({daemon.returncode}): {' '.join(cmd)}")
        return rss_mb(daemon.pid)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)


def bare_rss(python: Path) -> float:
    """RSS of a bare interpreter of that venv, idle (the floor of any Python daemon)."""
    bare = subprocess.Popen([str(python), "-c", "import time; time.sleep(60)"], env=_clean_env())
    try:
        time.sleep(1.0)
        return rss_mb(bare.pid)
    finally:
        bare.kill()
        bare.wait()


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def targets(runs: int, batch: int, idle_s: float) -> list[tuple[str, str, str, str, str]]:
    """Rows of (measure, reconciler, peer or floor, ratio, target), every pair taken in turns."""
    import tempfile

    from benchrepo import make_key, make_remote  # the bench's one-service repo, signed

    from reconciler.agent import Agent
    from reconciler.drivers.process import ProcessDriver
    from reconciler.settings import AgentConfig, TrustConfig

    bin_dir = installed_reconciler()
    with tempfile.TemporaryDirectory(prefix="reconciler-bench-") as tmp:
        root = Path(tmp)
        key, allowed = make_key(root)
        url = f"file://{make_remote(root, 10, key)}"
        state = root / "node"
        args = ["--node", "bench1", "--remote", url, "--state-dir", str(state), "--allowed-signers", str(allowed)]
        once = [str(bin_dir / "reconciler"), "agent", "--once", *args]
        subprocess.run(once, check=True, capture_output=True, env=_clean_env())  # converged
        pull = AnsiblePull(root / "ansible")
        agent = Agent(AgentConfig(node="bench1", remote=url, state_dir=state, trust=TrustConfig(allowed_signers=allowed)),
                      progress=False)
        ls_remote = ["git", "-c", "protocol.version=2", "ls-remote", "--heads", url, "refs/heads/main"]
        try:
            for _ in range(3):
                agent.reconcile_once()  # warm: the daemon's first looks are full ones
            polls: list[tuple[float, float]] = []
            floors, pulls, onces, bares = [], [], [], []
            for _ in range(runs):
                polls.append(poll_cpu(agent.reconcile_once, batch))
                floors.append(poll_cpu(lambda: children_cpu(ls_remote), batch)[1])
                # A timer's run after a timer's run: the passes above (a daemon's, in process) remove
                # what a no-op `agent --once` leaves for the next one to check (node.quiet).
                subprocess.run(once, check=True, capture_output=True, env=_clean_env())
                onces.append(children_cpu(once, _clean_env()))
                pulls.append(pull.once())
                bares.append(children_cpu([str(bin_dir / "python"), "-c", "pass"], _clean_env()))
            own, git = median([p[0] for p in polls]), median([p[1] for p in polls])
            poll_ms, floor_ms, pull_s = (own + git) * 1000, median(floors) * 1000, median(pulls)
            daemon = [str(bin_dir / "reconciler"), "agent", *args, "--interval", "1", "--jitter", "0"]
            agent.close()
            rss, bare = idle_rss(daemon, idle_s), bare_rss(bin_dir / "python")
        finally:
            driver = ProcessDriver(state / "services", "bench1")
            for o in driver.observe():
                driver.remove(o.name)
    once_s = median(onces)
    return [
        ("no-op poll in the daemon, CPU", f"{poll_ms:.2f} ms ({own * 1000:.2f} own + {git * 1000:.2f} git)",
         f"git ls-remote {floor_ms:.2f} ms", f"{poll_ms / floor_ms:.2f}x", "<= 1.5x"),
        ("  the same against ansible-pull -o", f"{poll_ms:.2f} ms", f"ansible-pull -o {pull_s * 1000:.0f} ms",
         f"1/{pull_s * 1000 / poll_ms:.0f}", ""),
        ("agent --once no-op, whole process, CPU", f"{once_s:.3f} s", f"ansible-pull -o {pull_s:.3f} s",
         f"1/{pull_s / once_s:.1f}", "<= 0.1 s, 1/10"),
        ("  a bare interpreter of that venv", f"{median(bares):.3f} s", "", "", ""),
        ("idle daemon RSS", f"{rss:.1f} MB", f"bare interpreter {bare:.1f} MB", f"{rss / bare:.2f}x", "<= 25 MB"),
    ]
