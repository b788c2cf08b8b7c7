"""`status --fleet` of a big fleet from a plain clone: N nodes (default 10,000) x 5 services,
each node's signed note on the head (its key in ``trust/nodes``), served by a bare repo.

For each run a fresh ``git clone`` of the bare repo, then:

- fetch: the notes fetch `status --fleet` does (``fleet.view.fetch_from_clone``: every node's
  notes ref and the branch), alone, in process;
- after the fetch, first run: the rest of the command on the clone just fetched (read every
  notes ref, decode each note within bounds, verify each signature against ``trust/nodes``, load
  the repo at the head, plan the waves, the statuses, the JSON output), in process, cold (no
  note decoded or verified before in this process: ``fleet.view``'s caches emptied; the user's
  cache of notes verified, ``fleet.known``, empty: ``XDG_CACHE_HOME`` a new directory);
- after the fetch, a later run: the same on another fresh clone, cold in process, the user's
  cache as the first run left it (each note was verified once: decoded and read, not checked);
- the whole command, `python -m reconciler status --fleet --repo CLONE -o json` in a fresh
  process on another fresh clone (imports and fetch included; the user's cache as left);
- floor: reading the same notes with git itself, `git for-each-ref` of the fetched notes refs
  and one `git cat-file --batch` of every node's note on the head (``REF:COMMIT``), bytes only:
  no decoding, no signature check, no repo.

Usage: .venv/bin/python bench/fleet_status.py [--nodes 10000] [--runs 3]

Each figure is the best of --runs (a shared machine's noise only adds; the medians beside), as
wall time and as CPU time (the process's own, or its git children's for the floor): on a loaded
machine the CPU figure is the one that compares.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

import pygit2
from plan import generate, git  # bench/plan.py: the same generated repo

from reconciler.fleet import view
from reconciler.trust.notesig import NoteKey, public_line

SERVICES = 5


def server(root: Path, nodes: int) -> tuple[Path, str]:
    """A bare repo: the generated fleet with every node's key in trust/nodes, and every node's
    signed note on its head. Its path and the head."""
    from cryptography.hazmat.primitives.asymmetric import ed25519

    work = root / "work"
    work.mkdir()
    generate(work, nodes, SERVICES)
    names = [f"node{n:04d}" for n in range(nodes)]
    keys = {n: NoteKey(root / n, ed25519.Ed25519PrivateKey.generate()) for n in names}
    (work / "trust").mkdir()
    (work / "trust/nodes").write_text("".join(public_line(n, k) + "\n" for n, k in keys.items()))
    git("init", "-q", "-b", "main", cwd=work)
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "fleet", cwd=work)
    bare = root / "srv.git"
    git("clone", "-q", "--bare", str(work), str(bare), cwd=root)
    repo = pygit2.Repository(str(bare))
    head = str(repo.references["refs/heads/main"].target)
    sig = pygit2.Signature("bench", "bench@example.org")
    for n, key in keys.items():
        body = {"format": 1, "node": n, "commit": head, "state": "applied", "time": "2026-11-26T10:00:00Z",
                "plan_hash": "0" * 64,
                "services": {f"svc{i:02d}": {"action": "none", "result": "ok", "reason": "", "detail": "",
                                             "steps": [], "pid": 1000 + i, "hash": "a" * 64}
                             for i in range(SERVICES)}}
        repo.create_note(json.dumps(key.seal(n, head, body), indent=2, sort_keys=True) + "\n", sig, sig, head,
                         f"refs/notes/reconciler/{n}", True)
    return bare, head


def after_fetch(clone: Path, head: str) -> tuple[float, float, float, int]:
    """The fetch, then the rest of `status --fleet -o json`, in process, cold: (fetch seconds,
    after-the-fetch seconds, its CPU seconds, nodes applied)."""
    from reconciler.cli import fleet as cli_fleet

    for cache in (view._DECODED, view._CHECKED):
        cache.clear()
    t = time.perf_counter()
    fetched = view.fetch_from_clone(clone, "origin", "main")
    fetch = time.perf_counter() - t
    assert fetched == head
    real = view.fetch_from_clone
    view.fetch_from_clone = lambda *a: fetched  # the fetch is done: time what follows it
    try:
        t, cpu = time.perf_counter(), time.process_time()
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            cli_fleet.show_fleet({}, None, None, "json", repo_dir=clone)
        rest, cpu = time.perf_counter() - t, time.process_time() - cpu
    finally:
        view.fetch_from_clone = real
    applied = json.loads(printed.getvalue())["counts"].get("applied", 0)
    return fetch, rest, cpu, applied


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def floor(clone: Path, head: str) -> tuple[float, float]:
    """Wall and CPU seconds of git reading every node's note on the head."""
    t, cpu = time.perf_counter(), children_cpu()
    refs = subprocess.run(["git", "for-each-ref", "--format=%(refname)", view.FLEET_PREFIX], cwd=clone,
                          check=True, capture_output=True, text=True).stdout.split()
    out = subprocess.run(["git", "cat-file", "--batch"], cwd=clone, check=True, capture_output=True,
                         input="".join(f"{r}:{head}\n" for r in refs).encode()).stdout
    took, cpu = time.perf_counter() - t, children_cpu() - cpu
    assert out.count(b" blob ") == len(refs), "a note missing"
    return took, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    # ignore_cleanup_errors: git may still be packing a clone's 10,000 fetched refs in the
    # background (gc --auto) while the directory is removed; a run's figures are printed by then.
    with tempfile.TemporaryDirectory(prefix="reconciler-bench-fleet-status-", ignore_cleanup_errors=True) as tmp:
        root = Path(tmp)
        load = " ".join(f"{x:.1f}" for x in os.getloadavg())
        t = time.perf_counter()
        bare, head = server(root, args.nodes)
        print(f"status --fleet from a plain clone, {args.nodes} nodes x {SERVICES} services, signed notes "
              f"(made in {time.perf_counter() - t:.0f} s), best of {args.runs}")
        runs: list[list[float]] = [[] for _ in range(8)]
        fetch, rest, rest_cpu, again, again_cpu, low, low_cpu, whole = runs
        for i in range(args.runs):
            os.environ["XDG_CACHE_HOME"] = str(root / f"cache{i}")  # the user's: empty at first
            clone = root / f"clone{i}"
            git("clone", "-q", str(bare), str(clone), cwd=root)
            f, r, c, applied = after_fetch(clone, head)
            assert applied == args.nodes, f"{applied} of {args.nodes} notes counted"
            w, wc = floor(clone, head)
            for figures, value in ((fetch, f), (rest, r), (rest_cpu, c), (low, w), (low_cpu, wc)):
                figures.append(value)
            later = root / f"later{i}"
            git("clone", "-q", str(bare), str(later), cwd=root)
            _, r, c, applied = after_fetch(later, head)
            assert applied == args.nodes, f"{applied} of {args.nodes} notes counted"
            again.append(r)
            again_cpu.append(c)
            other = root / f"whole{i}"
            git("clone", "-q", str(bare), str(other), cwd=root)
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "reconciler", "status", "--fleet", "--repo", str(other), "-o",
                            "json"], check=True, stdout=subprocess.DEVNULL)
            whole.append(time.perf_counter() - t)
        floor_cpu = min(low_cpu)

        def both(wall: list[float], cpu: list[float]) -> str:
            return (f"{min(wall):7.2f} s wall  {min(cpu):7.2f} s CPU   {min(cpu) / args.nodes * 1e6:5.0f} us/node"
                    f"   {min(cpu) / floor_cpu:5.1f}x the floor's CPU   (medians {median(wall):.2f} wall,"
                    f" {median(cpu):.2f} CPU)")

        print(f"  fetch (every notes ref and the branch)       {min(fetch):7.2f} s")
        print(f"  after the fetch, first run (all verified)    {both(rest, rest_cpu)}")
        print(f"  after the fetch, later run (user's cache)    {both(again, again_cpu)}")
        print(f"  floor: for-each-ref + cat-file --batch       {min(low):7.2f} s wall  {floor_cpu:7.2f} s CPU"
              "   (the notes' bytes only)")
        print(f"  the whole command, fresh process             {min(whole):7.2f} s   (imports and fetch included)")
        print(f"  load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} (at the start: {load})")


if __name__ == "__main__":
    main()
