"""The git server's cost of a fleet, replayed at the protocol level: a real `git daemon`, real
git clients making the requests the agent makes, no rendering.

For N nodes (each with its notes ref on the server, one note per node on the head), per request:

- ``poll``: the no-op poll (``ls-remote --heads`` of the branch, protocol v2 ``ref-prefix``);
- ``wait-all``: a waiting node reading every node's notes (``refs/notes/reconciler/*``), as the
  agent did before it read only the batches before it;
- ``wait-1``: a node reading one node's notes (its sentinel, ``rollout.sentinel``: what a
  waiting node reads while the batch before it has not begun);
- ``wait-10``: a node reading the notes of 10 predecessors (one glob refspec each);
- ``wait-batch``: a node reading the batch before it, N/10 nodes (what a waiting node reads
  each poll in a plan of 10 waves once that batch has begun: ``Rollout.frontier``);
- ``push``: a node pushing its own new note (one ref);
- ``http poll``: the no-op poll over smart HTTP (nginx, fcgiwrap, ``git http-backend``), when
  fcgiwrap is installed;
- ``probe``: the tip probe instead of a poll (``probe:`` on a remote): a GET of the tips file
  ``contrib/git-server/post-receive-tips`` wrote, from a real nginx, a new connection per
  request as the agent makes it (the agent's own ``read_tips``); the same as a waiting node's
  GET of its sentinel's notes tip, a file of the same kind and size beside it;

the server's CPU (the daemon and the upload-pack/receive-pack it forks, or nginx and its worker,
from getrusage of its children once it is stopped). Then, from those figures,
the server's load for N nodes polling every 10 s (with a probe: a probe per poll and a git check
every 300 s), and one rollout of 10 waves of N/10: every node pushes its notes; a waiting node
reads its sentinel once per poll while the batch before it has not begun, that batch once per
poll when it has (and whole every 300 s), and every node before it once, when that batch is
done; against reading the batch before on every poll (the last release) and every node
before on every poll (the one before); and the time from merge to the last note this leaves
on a server of C cores.

Usage: .venv/bin/python bench/server.py [--nodes 1000 10000] [--requests 200]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fleet import free_port

from reconciler.fleet.rollout import WHOLE_READ_EVERY
from reconciler.source.probe import read_tips

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from nginx import Nginx  # noqa: E402  (the tests' own nginx, so the bench serves what they check)
from ports import wait_listening  # noqa: E402

HOOK = Path(__file__).resolve().parent.parent / "contrib" / "git-server" / "post-receive-tips"
NODE_SHELL = HOOK.parent / "node-shell"
CHECK_EVERY = 300.0  # the probe's default: a real git check this often

ENV = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x", "GIT_COMMITTER_NAME": "b",
       "GIT_COMMITTER_EMAIL": "b@x", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}


NOTES_PER_NODE = 1
"""Notes commits a node pushes in a plain rollout in waves: its applied note, as bench/waves.py
counts on the server (median and most: 1 at 40 nodes). A waiting node pushes nothing; a budget
or an upgrade's barriers add claims."""

def git(*args: str, cwd: Path | None = None, stdin: str | None = None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=ENV, check=True, capture_output=True, text=True,
                          input=stdin).stdout


def make_server(root: Path, nodes: int) -> Path:
    """A bare repo with a branch of 50 commits and one notes ref per node (a note on the head)."""
    bare = root / "cloud.git"
    git("init", "-q", "--bare", "-b", "main", str(bare))
    work = root / "work"
    git("init", "-q", "-b", "main", str(work))
    for i in range(50):
        (work / "inventory.yaml").write_text(f"# change {i}\n")
        git("add", "-A", cwd=work)
        git("commit", "-q", "-m", f"change {i}", cwd=work)
    git("push", "-q", str(bare), "main", cwd=work)
    head = git("rev-parse", "HEAD", cwd=work).strip()
    # One notes commit per node, through fast-import: 10,000 in seconds, each a distinct object.
    stream = []
    for n in range(nodes):
        body = f'{{"node": "n{n:05d}", "state": "applied", "commit": "{head}"}}\n'
        stream.append(f"commit refs/notes/reconciler/n{n:05d}\ncommitter b <b@x> 0 +0000\ndata 4\nnote\n"
                      f"M 644 inline {head}\ndata {len(body)}\n{body}\n")
    git("fast-import", "--quiet", cwd=bare, stdin="".join(stream))
    git("gc", "-q", cwd=bare)  # as a served repo is after its gc: packed refs, objects, a commit-graph
    return bare


def node_shell_env(node: str) -> dict[str, str]:
    """What contrib/git-server/node-shell sets for a node's key, read from the script itself."""
    text = NODE_SHELL.read_text()
    ref = f"refs/notes/reconciler/{node}"
    pairs = re.findall(r"GIT_CONFIG_KEY_(\d)=(\S+) GIT_CONFIG_VALUE_\1=(\S+)", text)
    env = {"GIT_CONFIG_COUNT": str(len(pairs))}
    for i, key, value in pairs:
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value.strip('"').replace("$ref", ref)
    return env


class Daemon:
    def __init__(self, base: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["git", "daemon", "--reuseaddr", f"--base-path={base}", "--export-all", "--enable=receive-pack",
             f"--port={self.port}", "--listen=127.0.0.1", str(base)], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, env={**ENV, **(env or {})})
        wait_listening(self.port, "git daemon", self.proc)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def run_clients(requests: list[list[str]], cwd: Path | None = None, expect: str = "") -> float:
    """Run the git clients one after the other; their own CPU, which getrusage counts with the
    server's (both are our children), to be taken off it. Each must succeed (and print ``expect``)."""
    clients = 0.0
    for argv in requests:
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.run(argv, cwd=cwd, env=ENV, capture_output=True)
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if p.returncode != 0 or expect not in p.stdout.decode():
            raise SystemExit(f"{' '.join(argv)}: {p.stderr.decode()[-300:]}")
        clients += (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
    return clients


def server_cpu(base: Path, requests: list[list[str]], cwd: Path, env: dict[str, str] | None = None) -> float:
    """Seconds of server CPU (user + system) for ``requests`` (``env``: the server's, more)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    daemon = Daemon(base, env)
    clients = run_clients([[a.replace("PORT", str(daemon.port)) for a in argv] for argv in requests], cwd)
    daemon.stop()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return max(0.0, total - clients)


def probe_cpu(root: Path, bare: Path, count: int) -> tuple[float, int]:
    """Seconds of nginx CPU for ``count`` probes of the tips file the hook wrote, and its size."""
    tips = root / "www" / "tips" / "cloud"
    tips.parent.mkdir(parents=True)
    subprocess.run([str(HOOK)], cwd=bare, env={**ENV, "RECONCILER_TIPS": str(tips)}, check=True,
                   stdin=subprocess.DEVNULL)
    port = free_port()
    server = Nginx(root / "www", root / "nginx", port)
    if not server.available:
        raise SystemExit(f"nginx is needed for the probe figures ({server.binary}): apt-get install nginx-light")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    server.start()
    head = git("--git-dir", str(bare), "rev-parse", "refs/heads/main").strip()
    for _ in range(count):
        if read_tips(server.url("tips/cloud")).get("refs/heads/main") != head:
            raise SystemExit("the probe did not name the branch head")
    server.stop()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), tips.stat().st_size


def http_poll_cpu(root: Path, count: int) -> float | None:
    """Seconds of server CPU (nginx, fcgiwrap, http-backend, upload-pack) for ``count`` no-op
    polls over smart HTTP; None without fcgiwrap or a cpuacct cgroup we may make."""
    fcgiwrap = "/usr/sbin/fcgiwrap"
    if not os.access(fcgiwrap, os.X_OK):
        return None
    sock = root / "fcgi.sock"
    backend = Path(git("--exec-path").strip()) / "git-http-backend"
    location = f"""        location /git/ {{
            fastcgi_pass unix:{sock};
            fastcgi_param SCRIPT_FILENAME {backend};
            fastcgi_param GIT_PROJECT_ROOT {root};
            fastcgi_param GIT_HTTP_EXPORT_ALL 1;
            fastcgi_param GIT_PROTOCOL $http_git_protocol;
            fastcgi_param QUERY_STRING $query_string;
            fastcgi_param REQUEST_METHOD $request_method;
            fastcgi_param CONTENT_TYPE $content_type;
            fastcgi_param CONTENT_LENGTH $content_length;
            fastcgi_split_path_info ^(/git)(/.*)$;
            fastcgi_param PATH_INFO $fastcgi_path_info;
        }}"""
    port = free_port()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    # fcgiwrap does not wait for the CGIs it runs, so getrusage misses them: a cpuacct cgroup
    # (v1, as here) holds fcgiwrap from before its exec, and every process it starts with it.
    group = Path("/sys/fs/cgroup/cpuacct") / f"reconciler-bench-{os.getpid()}"
    try:
        group.mkdir()
    except OSError:
        return None

    def join() -> None:
        (group / "cgroup.procs").write_text(str(os.getpid()))

    wrap = subprocess.Popen([fcgiwrap, "-s", f"unix:{sock}"], env=ENV, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, preexec_fn=join)
    server = Nginx(root / "www", root / "nginx-http", port, extra=location)
    clients = 0.0
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.05)
        server.start()
        url = server.url("git/cloud.git")
        poll = ["git", "-c", "protocol.version=2", "ls-remote", "--heads", url, "refs/heads/main"]
        clients = run_clients([poll] * count, expect="refs/heads/main")
    finally:
        server.stop()
        # nginx, waited for, is in getrusage now; fcgiwrap and its CGIs only in the cgroup
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        wrap.terminate()
        wrap.wait()
        cgi = int((group / "cpuacct.usage").read_text()) / 1e9
        group.rmdir()
    return max(0.0, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime) - clients) + cgi


def measure(nodes: int, count: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-server-") as tmp:
        root = Path(tmp)
        bare = make_server(root, nodes)
        client = root / "client.git"
        git("init", "-q", "--bare", str(client))
        url = "git://127.0.0.1:PORT/cloud.git"
        v2 = ["git", "-c", "protocol.version=2"]
        git("-c", "protocol.version=2", "fetch", "-q", str(bare), "+refs/heads/main:refs/heads/main", cwd=client)
        poll = [v2 + ["ls-remote", "--heads", url, "refs/heads/main"]] * count
        wait_all = [v2 + ["fetch", "-q", "--no-tags", "--prune", url,
                          "+refs/notes/reconciler/*:refs/reconciler/fleet/*"]] * max(5, count // 10)
        one = [v2 + ["fetch", "-q", "--no-tags", "--prune", url,
                     f"+refs/notes/reconciler/n{nodes - 1:05d}*:refs/reconciler/fleet/n{nodes - 1:05d}*"]] * count
        ten = [f"+refs/notes/reconciler/n{n:05d}*:refs/reconciler/fleet/n{n:05d}*" for n in range(10)]
        wait_10 = [v2 + ["fetch", "-q", "--no-tags", "--prune", url, *ten]] * count
        batch = [f"+refs/notes/reconciler/n{n:05d}*:refs/reconciler/fleet/n{n:05d}*"
                 for n in range(nodes - max(1, nodes // 10), nodes)]
        wait_batch = [v2 + ["fetch", "-q", "--no-tags", "--prune", url, *batch]] * max(5, count // 3)
        pushes = note_pushes(bare, client, url, nodes, max(5, count // 10), "new")
        out: dict[str, float] = {}
        for name, reqs in (("poll", poll), ("wait-1", one), ("wait-10", wait_10), ("wait-batch", wait_batch), ("wait-all", wait_all), ("push", pushes)):
            cpu = server_cpu(root, reqs, client)
            out[f"{name} ms"] = 1000 * cpu / len(reqs)
        # The same pushes from one node's key behind contrib/git-server/node-shell: receive-pack
        # shows it, and checks its objects against, its own notes ref only.
        own = note_pushes(bare, client, url, 1, max(5, count // 10), "own")
        out["push own ms"] = 1000 * server_cpu(root, own, client, node_shell_env("n00000")) / len(own)
        # A read mirror kept current by fetching from the primary (a timer, as `git fetch` from
        # cron or a mirror's own poller does): one fetch bringing the last 10 note pushes; the
        # primary's CPU for it (the pushes go to the repo's path, not the daemon: a local push is
        # the client's child, its CPU counted with the client's and so not the server's).
        mirror = root / "mirror.git"
        git("clone", "-q", "--mirror", str(bare), str(mirror))
        replicate = v2 + ["-C", str(mirror), "fetch", "-q", "--prune", url, "+refs/heads/*:refs/heads/*",
                          "+refs/notes/*:refs/notes/*"]
        batch_pushes = note_pushes(bare, client, str(bare), nodes, 10 * max(2, count // 20), "mirrored")
        fetches = len(batch_pushes) // 10
        cpu = server_cpu(root, [argv for i, push in enumerate(batch_pushes)
                                for argv in ((push, replicate) if i % 10 == 9 else (push,))], client)
        out["replicate ms"] = 1000 * cpu / fetches
        probes = 20 * count  # a probe costs so little that fewer would measure the clock's grain
        cpu, size = probe_cpu(root, bare, probes)
        out["probe ms"], out["probe bytes"] = 1000 * cpu / probes, size
        http = http_poll_cpu(root, count)
        out["http poll ms"] = float("nan") if http is None else 1000 * http / count
        return out


def note_pushes(bare: Path, client: Path, url: str, nodes: int, count: int, tag: str) -> list[list[str]]:
    """``count`` requests, each pushing a new notes commit onto one node's ref, as its agent does."""
    pushes = []
    for i in range(count):
        ref = f"refs/notes/reconciler/n{i % nodes:05d}"
        pushes.append(["git", "-c", "protocol.version=2", "push", "-q", url, f"{ref}-{tag}{i}:{ref}"])
        # on top of the ref as the server will have it by then: the earlier pushes of this list
        base = f"{ref}-{tag}{i - nodes}" if i >= nodes else None
        if base is None:
            git("fetch", "-q", str(bare), f"+{ref}:{ref}-{tag}base{i}", cwd=client)
            base = f"{ref}-{tag}base{i}"
        blob = git("hash-object", "-w", "--stdin", cwd=client, stdin=f'{{"state": "applied", "{tag}": {i}}}\n').strip()
        head = git("--git-dir", str(bare), "rev-parse", "refs/heads/main").strip()
        tree = git("mktree", cwd=client, stdin=f"100644 blob {blob}\t{head}\n").strip()
        commit = git("commit-tree", tree, "-p", base, "-m", "note", cwd=client).strip()
        git("update-ref", f"{ref}-{tag}{i}", commit, cwd=client)
    return pushes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[10, 1000, 10000])
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--cores", type=int, nargs="+", default=[4, 16], help="server cores, for the rollout model")
    ap.add_argument("--apply-s", type=float, default=5.0, help="a node's apply time, for the rollout model")
    ap.add_argument("--mirrors", type=int, nargs="*", default=[4], help="read mirrors, for the rollout model")
    args = ap.parse_args()
    print(f"git {git('--version').split()[-1]}, {os.cpu_count()} cores; server CPU per request "
          f"(git daemon + what it forks), {args.requests} requests per kind", flush=True)
    rows = {}
    for n in args.nodes:
        t0 = time.monotonic()
        rows[n] = measure(n, args.requests)
        r = rows[n]
        print(f"N={n:>6}: poll {r['poll ms']:.2f} ms | wait-1 {r['wait-1 ms']:.2f} ms | wait-10 {r['wait-10 ms']:.2f} ms | "
              f"wait-batch {r['wait-batch ms']:.2f} ms | "
              f"wait-all {r['wait-all ms']:.1f} ms | "
              f"push {r['push ms']:.2f} ms (node-shell {r['push own ms']:.2f} ms) | mirror fetch of 10 notes {r['replicate ms']:.2f} ms | smart-HTTP poll {r['http poll ms']:.2f} ms | probe {r['probe ms']:.3f} ms ({r['probe bytes']:.0f} B)"
              f"   [{time.monotonic() - t0:.0f} s]", flush=True)
    for n, r in rows.items():
        polls_per_s = n / 10  # every node polls every 10 s
        cores = polls_per_s * r["poll ms"] / 1000
        probed = (polls_per_s * r["probe ms"] + n / CHECK_EVERY * r["poll ms"]) / 1000
        # One rollout of 10 waves of N/10: each node pushes NOTES_PER_NODE notes; wave j's nodes
        # wait while the j - 1 waves before them go, each taking a poll and an apply at least
        # (``rollout_s`` on an idle server), polling all the while; then they read every node
        # before them once.
        polls_a_wave = (10 + args.apply_s) / 10
        pushes = NOTES_PER_NODE * n * r["push ms"] / 1000
        waits = {how: pushes + sum((n / 10) * (polls_a_wave * sum(_waiting_ms(r, n, how, j, k, probed=True)
                                                                  for k in range(1, j))
                                               + _read_ms(r, n, (j - 1) * n / 10)) for j in range(2, 11)) / 1000
                 for how in READS}
        http = polls_per_s * r["http poll ms"] / 1000
        print(f"N={n:>6}: idle polling every 10 s: {cores:.3f} of a core with git daemon ({http:.3f} over smart "
              f"HTTP), {probed:.3f} with the probe ({cores / max(probed, 1e-9):.0f}x less); one rollout of 10 "
              f"waves: {waits['sentinel']:.0f} CPU-s ({pushes:.0f} of them pushes) with sentinels (probed), "
              f"{waits['batch']:.0f} reading the batch before every poll, {waits['every']:.0f} reading every "
              f"node before every poll ({waits['every'] / max(waits['sentinel'], 1e-9):.1f}x); the pushes "
              f"{NOTES_PER_NODE * n * r['push own ms'] / 1000:.0f} CPU-s with every node behind node-shell")
        # With M read mirrors the reads (polls, waiting reads) leave the primary; it keeps the
        # pushes and serves each mirror a fetch a second while the rollout lasts.
        took = rollout_s(n, r, max(args.cores), args.apply_s, probed=True)
        for m in args.mirrors:
            if took == float("inf"):
                continue
            replicating = m * took * r["replicate ms"] / 1000
            print(f"N={n:>6}, {m} read mirrors fetching every second: the primary {pushes + replicating:.0f} "
                  f"CPU-s a rollout of {took:.0f} s ({pushes:.0f} pushes, {replicating:.0f} replicating), each "
                  f"mirror {(waits['sentinel'] - pushes) / m:.0f} CPU-s of reads; idle, each mirror "
                  f"{cores / m:.3f} of a core polled with git, {probed / m:.3f} probed, and the primary "
                  f"{m * r['replicate ms'] / 1000:.3f} replicating")
    print(f"merge to last note, 10 waves, 10 s polls, {args.apply_s:g} s applies (bound without a busy server: "
          f"{10 * (10 + args.apply_s):.0f} s), on a server of C cores:")
    for n, r in rows.items():
        cells = []
        for cores in args.cores:
            by_reads = {how: rollout_s(n, r, cores, args.apply_s, probed=True, reads=how) for how in READS}
            own = rollout_s(n, r, cores, args.apply_s, probed=True, push="push own ms")
            cells.append(f"C={cores}: {_secs(by_reads['sentinel'])} with the probe and sentinels, "
                         f"{_secs(own)} with node-shell's pushes "
                         f"({_secs(rollout_s(n, r, cores, args.apply_s, probed=False))} polling git; "
                         f"{_secs(by_reads['batch'])} reading the batch before, {_secs(by_reads['every'])} every node "
                         f"before, every poll)")
        print(f"N={n:>6}: " + " | ".join(cells))
    sys.stdout.flush()


# What a waiting node reads on each poll: its sentinel while the batch before has not begun,
# then that batch (now); that batch on every poll (the last release); every node before it.
READS = ("sentinel", "batch", "every")


def _waiting_ms(r: dict[str, float], n: int, how: str, j: int, k: int, interval: float = 10.0,
                probed: bool = False) -> float:
    """One poll of a node of wave ``j`` waiting while wave ``k`` applies (10 waves of N/10);
    ``probed``: its sentinel's notes tip is read from the hook's file, not with git."""
    if how == "every":
        return _read_ms(r, n, (j - 1) * n / 10)
    if how == "batch" or k == j - 1:
        return r["wait-batch ms"]
    # and the batch whole now and then
    return r["probe ms" if probed else "wait-1 ms"] + r["wait-batch ms"] * interval / WHOLE_READ_EVERY


def rollout_s(n: int, r: dict[str, float], cores: int, apply_s: float, probed: bool,
              waves: int = 10, interval: float = 10.0, reads: str = "sentinel", push: str = "push ms") -> float:
    """Seconds from merge to the last node's note: each wave notices its predecessors within a
    poll, applies, and pushes (``NOTES_PER_NODE``), and reads every node before it once,
    while every node keeps polling (``probed``: with the probe, and its sentinel's notes tip
    from the hook's files) and the waiting ones read as ``reads`` says once a poll. A wave
    takes interval + apply, or longer when that work needs more than the server's cores in
    that time (inf: it never catches up). Reads may go to read mirrors: C is then their cores
    and the primary's together. ``push``: what a note push costs ("push own ms": from a node's
    key behind contrib/git-server/node-shell)."""
    total = 0.0
    per_wave = n / waves
    poll_ms = r["probe ms"] + interval / CHECK_EVERY * r["poll ms"] if probed else r["poll ms"]
    for k in range(1, waves + 1):
        waiting = sum(_waiting_ms(r, n, reads, j, k, interval, probed) for j in range(k + 1, waves + 1)) * per_wave
        rate = (n * poll_ms + waiting) / 1000 / interval  # CPU-s per second
        work = per_wave * (NOTES_PER_NODE * r[push] + (_read_ms(r, n, (k - 1) * per_wave) if reads != "every" else 0)) / 1000
        if rate >= cores:
            return float("inf")
        total += max(interval + apply_s, work / (cores - rate))
    return total


def _read_ms(r: dict[str, float], n: int, refs: float) -> float:
    """A read of ``refs`` nodes' notes: on the line from wait-10 (10 refs) to wait-all (N refs)."""
    if n <= 10:
        return r["wait-10 ms"]
    return r["wait-10 ms"] + (r["wait-all ms"] - r["wait-10 ms"]) * max(0.0, refs - 10) / (n - 10)


def _secs(s: float) -> str:
    return "never (saturated)" if s == float("inf") else f"{s:.0f} s"


if __name__ == "__main__":
    main()
