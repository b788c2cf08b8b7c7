"""What checking every note costs a reader: a fleet of N nodes, each with its signed note on the
head, read through ``fleet.view.fleet_view`` (decode within bounds, verify against trust/nodes),
cold (every signature checked) and warm (each note checked once per trust: the daemon's polls),
against the same notes read unsigned (``notes: unsigned-allowed``, no node listed) and against
the real peer for the signature check, ``ssh-keygen -Y verify`` per note.

Usage: .venv/bin/python bench/notes.py [--nodes 100 1000] [--peer-sample 20]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

import pygit2

from reconciler.fleet import view
from reconciler.trust.notesig import UNSIGNED_ALLOWED, NoteKey, NoteTrust, note_trust, payload, public_line

PREFIX = "refs/notes/reconciler/"


def fleet(root: Path, nodes: int) -> tuple[pygit2.Repository, str, dict[str, NoteKey], dict[str, dict[str, object]]]:
    """A repo whose head lists every node's key in trust/nodes, and each node's note on it, signed."""
    repo = pygit2.init_repository(str(root / "repo.git"), bare=True)
    keys = {f"node{i:04d}": NoteKey.load_or_create(root / "keys" / f"node{i:04d}") for i in range(nodes)}
    lines = "".join(public_line(n, k) + "\n" for n, k in keys.items()).encode()
    trust_tree = repo.TreeBuilder()
    trust_tree.insert("nodes", repo.create_blob(lines), pygit2.GIT_FILEMODE_BLOB)
    top = repo.TreeBuilder()
    top.insert("trust", trust_tree.write(), pygit2.GIT_FILEMODE_TREE)
    sig = pygit2.Signature("bench", "bench@example.org")
    head = str(repo.create_commit("refs/heads/main", sig, sig, "fleet", top.write(), []))
    bodies = {}
    for node, key in keys.items():
        body = {"format": 1, "node": node, "commit": head, "state": "applied", "time": "2026-11-26T10:00:00Z",
                "services": {"db": {"result": "ok", "action": "none"}}}
        bodies[node] = body
        repo.create_note(json.dumps(key.seal(node, head, body), indent=2), sig, sig, head, PREFIX + node, True)
        repo.create_note(json.dumps(body, indent=2), sig, sig, head, "refs/notes/plain/" + node, True)
    return repo, head, keys, bodies


def timed(fn: object, runs: int = 3) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        best = min(best, time.perf_counter() - start)
    return best


def peer_per_note(root: Path, head: str, keys: dict[str, NoteKey], bodies: dict[str, dict[str, object]],
                  sample: int) -> float:
    """Seconds per note for ssh-keygen -Y verify (a process per signature, as a shell reader would)."""
    allowed = root / "allowed"
    allowed.write_text("".join(public_line(n, k) + "\n" for n, k in keys.items()))
    chosen = list(keys)[:sample]
    for node in chosen:
        (root / f"{node}.sig").write_text(keys[node].seal(node, head, bodies[node])["sig"])
    start = time.perf_counter()
    for node in chosen:
        subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(allowed), "-I", node, "-n", "reconciler-note",
                        "-s", str(root / f"{node}.sig")], input=payload(node, head, bodies[node]),
                       check=True, capture_output=True)
    return (time.perf_counter() - start) / len(chosen)


def measure(n: int, sample: int) -> str:
    """One row of the table: a fleet of ``n`` nodes, read signed (cold, warm) and unsigned."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        repo, head, keys, bodies = fleet(root, n)
        trust = note_trust(repo, head)
        loose = NoteTrust((), UNSIGNED_ALLOWED, head)

        def signed() -> None:
            seen = view.fleet_view(repo, PREFIX, trust=trust)
            assert len(seen.notes) == n and not seen.rejected, seen.rejected

        def cold() -> None:
            view._CHECKED.clear()
            signed()

        def unsigned() -> None:
            seen = view.fleet_view(repo, "refs/notes/plain/", trust=loose)
            assert len(seen.notes) == n and not seen.rejected

        t_cold, t_warm, t_plain = timed(cold), timed(signed), timed(unsigned)
        per = (t_cold - t_plain) / n
        peer = peer_per_note(root, head, keys, bodies, min(sample, n))
        return (f"{n:>6} {t_cold * 1e3:>10.1f}ms {t_warm * 1e3:>10.1f}ms {t_plain * 1e3:>8.1f}ms "
                f"{per * 1e6:>7.0f}us {peer * 1e3:>9.2f}ms {peer / per:>5.0f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--peer-sample", type=int, default=20)
    args = parser.parse_args()
    print(f"{'nodes':>6} {'signed cold':>12} {'signed warm':>12} {'unsigned':>10} {'per note':>9} "
          f"{'ssh-keygen':>11} {'ratio':>6}")
    for n in args.nodes:
        print(measure(n, args.peer_sample), flush=True)


if __name__ == "__main__":
    main()
