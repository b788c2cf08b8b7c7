"""The review comment's size on N nodes x M services, as `reconciler diff -o markdown` writes
it uncut, and cut for GitHub (65,536) and Gerrit (16,000), for two one-line changes: a line of
one service's template (every node restarts that service) and ``debug: false`` -> ``true`` in
the inventory (every node reloads every service). The comment groups nodes that change the
same lines, so its size follows the services that change, not the nodes.

Usage: .venv/bin/python bench/review.py [--nodes 500] [--services 30]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from plan import generate, git  # bench/plan.py: the same generated repo

from reconciler.repo.load import load_repo
from reconciler.repo.tree import open_tree
from reconciler.review.diff import diff_repos
from reconciler.review.report import markdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--services", type=int, default=30)
    args = parser.parse_args()
    for what, path, old, new in (
            ("one line of one service's template", "services/svc00/templates/svc.conf.j2",
             "workers = {{ workers }}", "workers = {{ workers * 2 }}"),
            ("one inventory line read by every service", "inventory.yaml", "debug: false", "debug: true")):
        measure(what, args.nodes, args.services, path, old, new)


def measure(what: str, nodes: int, services: int, path: str, old: str, new: str) -> None:
    with tempfile.TemporaryDirectory(prefix="reconciler-bench-review-") as tmp:
        work = Path(tmp)
        generate(work, nodes, services)
        git("init", "-q", "-b", "main", cwd=work)
        git("add", "-A", cwd=work)
        git("commit", "-q", "-m", "a", cwd=work)
        changed = work / path
        changed.write_text(changed.read_text().replace(old, new))
        git("commit", "-q", "-am", "b", cwd=work)
        a, b = open_tree(work, "HEAD~1"), open_tree(work, "HEAD")
        repo_b = load_repo(b)
        diffs = diff_repos(load_repo(a), a.label, repo_b, b.label)
        groups = repo_b.group_members
        t = time.perf_counter()
        full = markdown(diffs, a.label, b.label, groups=groups)
        took = time.perf_counter() - t
        print(f"review comment, {what}, {nodes} nodes x {services} services")
        print(f"  uncut                    {len(full.encode()):9,d} bytes  ({took * 1000:.0f} ms to write)")
        for forge, limit in (("GitHub", 65536), ("Gerrit", 16000)):
            cut = markdown(diffs, a.label, b.label, groups=groups, max_bytes=limit,
                           artifact_url="https://ci.example.org/run/1/diff.md")
            print(f"  cut for {forge:6s} ({limit:6,d}) {len(cut.encode()):9,d} bytes"
                  f"{'  (cut)' if 'Cut to fit' in cut else ''}")

if __name__ == "__main__":
    main()
