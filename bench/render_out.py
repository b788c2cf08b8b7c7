"""`reconciler render --all --out DIR` at fleet scale: what writing the review tree costs.

A generated repo (bench/plan.py's: N nodes x M services, one file each, plus service.json) is
rendered once, then its slices are written three ways, each into a fresh directory:

- durable: temp file, fsync, rename, fsync of the directory per file (``atomic_write``'s
  default, what the agent's own writes keep; what `render --out` did before issue 17);
- review: temp file and rename, no fsync (``durable=False``, what `render --out` does now);
- peer: plain ``open().write()`` of the same bytes, the floor of any tool writing that tree.

Then the whole command (`python -m reconciler render --all --out`) in a subprocess, rendering
included. The machine may be shared: figures are as measured, under whatever load there is.

Usage: .venv/bin/python bench/render_out.py [--nodes 200] [--services 30]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from plan import generate

from reconciler.cli.repo import _write_slice
from reconciler.core.atomic import atomic_write
from reconciler.core.model import Desired
from reconciler.render.node import render_node
from reconciler.repo.load import load_repo
from reconciler.repo.tree import DirTree


def _plain(root: Path, desired: Desired) -> None:
    for s in desired.services:
        base = root / desired.node / s.name
        base.mkdir(parents=True, exist_ok=True)
        for f in s.files:
            (base / f.path).write_bytes(f.content)
        (base / "service.json").write_bytes(s.hash.encode())


def _durable(root: Path, desired: Desired) -> None:
    for s in desired.services:
        base = root / desired.node / s.name
        for f in s.files:
            atomic_write(base / f.path, f.content, f.mode)
        atomic_write(base / "service.json", s.hash.encode())


def _timed(write: Callable[[Path, Desired], None], root: Path, slices: list[Desired]) -> float:
    t = time.perf_counter()
    for d in slices:
        write(root, d)
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--services", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="reconciler-bench-out-") as tmp:
        work = Path(tmp) / "repo"
        work.mkdir()
        generate(work, args.nodes, args.services)
        repo = load_repo(DirTree(work))
        t = time.perf_counter()
        slices = [render_node(repo, n, "x") for n in sorted(repo.nodes)]
        rendered = time.perf_counter() - t
        files = sum(len(s.files) + 1 for d in slices for s in d.services)
        peer = _timed(_plain, Path(tmp) / "peer", slices)
        review = _timed(_write_slice, Path(tmp) / "review", slices)
        durable = _timed(_durable, Path(tmp) / "durable", slices)
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "reconciler", "render", "--repo", str(work), "--all", "--out",
                        str(Path(tmp) / "cli"), "-o", "json"], check=True, stdout=subprocess.DEVNULL)
        whole = time.perf_counter() - t
        print(f"render --all --out, {args.nodes} nodes x {args.services} services ({files} files written)")
        print(f"  render the slices (in process)            {rendered:8.2f} s")
        print(f"  write, durable (fsync per file: before)   {durable:8.2f} s   {durable / peer:6.2f}x the peer")
        print(f"  write, review (no fsync: now)             {review:8.2f} s   {review / peer:6.2f}x the peer")
        print(f"  peer: plain open().write(), same bytes    {peer:8.2f} s")
        print(f"  the whole command, now (subprocess)       {whole:8.2f} s")


if __name__ == "__main__":
    main()
