"""``reconciler node add NAME``, in the deployment repo: everything the repo must say for a new
node to run and be heard. Its inventory entry and age recipient, its note key's line in
``trust/nodes``, its recipient in ``.sops.yaml`` and the repo's secrets re-encrypted to it (the
real ``sops updatekeys``, with the operator's age identity: the project decrypts, it never
writes SOPS files), and the git server's line that lets its key push its own notes ref only.
The change is staged for review, or committed (signed) when asked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from reconciler.bootstrap import edits, keys
from reconciler.bootstrap.keys import run
from reconciler.bootstrap.skeleton import BRANCH_TRAILER
from reconciler.core.errors import BadInput
from reconciler.core.yamlfile import safe_load

TRUST_NODES = "trust/nodes"
NODE_SHELL = "/usr/local/lib/reconciler/node-shell"


@dataclass(frozen=True)
class AddRequest:
    repo: Path
    node: str
    groups: tuple[str, ...]
    keys_dir: Path
    """Where the node's keys go when made here (to be copied to the node, then removed)."""
    ssh_key: str | None = None
    age_recipient: str | None = None
    age_identity: Path | None = None
    """The operator's: opens the secrets to re-encrypt them."""
    rules: tuple[str, ...] = ()
    git_path: str | None = None
    commit: bool = False


@dataclass(frozen=True)
class ServerLines:
    gitolite_rule: str
    gitolite_key: str
    authorized_keys: str


@dataclass(frozen=True)
class Added:
    node: str
    in_inventory: str  # "added" | "completed" (a node init wrote, given its keys now)
    note_public: str
    note_key: Path | None  # made here: goes to the node (its note_key setting and its git key)
    age_recipient: str
    age_identity: Path | None  # made here: goes to the node (secrets.age_identity)
    reencrypted: tuple[str, ...]
    changed: tuple[str, ...]
    server: ServerLines
    commit: str | None


def add(req: AddRequest) -> Added:
    repo = req.repo
    inventory = repo / edits.INVENTORY
    if not inventory.is_file() or not (repo / "reconciler.yaml").is_file():
        raise BadInput(f"{repo}: not a deployment repo (no inventory.yaml and reconciler.yaml); run it in one "
                       "or give --repo")
    text = inventory.read_text()
    data = safe_load(text.encode(), edits.INVENTORY) or {}
    nodes_text = (repo / TRUST_NODES).read_text() if (repo / TRUST_NODES).is_file() else ""
    if req.node in edits.listed_nodes(nodes_text):
        raise BadInput(f"node {req.node} already has a key in {TRUST_NODES}; to rotate it, edit its line there")
    existing = (data.get("nodes") or {}).get(req.node)
    groups = _groups(req, data, existing)
    known = (existing or {}).get("vars", {}).get("age_recipient") if isinstance(existing, dict) else None

    note_key: Path | None = None
    if req.ssh_key:
        note_public = keys.ssh_public(req.ssh_key)
    else:
        note_key = req.keys_dir / req.node / "note_key"
        note_public = keys.make_ssh_key(note_key, f"reconciler node {req.node}")
    age_identity: Path | None = None
    if req.age_recipient:
        recipient = keys.age_recipient(req.age_recipient)
    elif known:
        recipient = str(known)
    else:
        age_identity = req.keys_dir / req.node / "age.key"
        recipient = keys.make_age_key(age_identity)

    changed = [edits.INVENTORY, TRUST_NODES]
    if existing is None:
        inventory.write_text(edits.add_node(text, req.node, groups, recipient))
    elif known != recipient:
        if known:
            raise BadInput(f"nodes.{req.node}.vars.age_recipient is {known[:16]}...; --age-recipient differs: "
                           "change it there", file=edits.INVENTORY)
        inventory.write_text(edits.set_recipient(text, req.node, recipient))
    (repo / TRUST_NODES).parent.mkdir(exist_ok=True)
    (repo / TRUST_NODES).write_text(_ending(nodes_text) + edits.nodes_line(req.node, note_public) + "\n")

    reencrypted: list[str] = []
    sops_config = repo / edits.SOPS_CONFIG
    if sops_config.is_file():
        new, rules = edits.add_recipient(sops_config.read_text(), recipient, req.rules)
        sops_config.write_text(new)
        changed.append(edits.SOPS_CONFIG)
        reencrypted = _reencrypt(repo, rules, req.age_identity)
        changed += reencrypted
    run("git", "-C", str(repo), "add", "--", *changed)
    commit = None
    if req.commit:
        branch = run("git", "-C", str(repo), "symbolic-ref", "--short", "HEAD").strip()
        run("git", "-C", str(repo), "commit", "-q", "-S", "-m", f"Add node {req.node}", "--trailer",
            f"{BRANCH_TRAILER}: {branch}")
        commit = run("git", "-C", str(repo), "rev-parse", "HEAD").strip()
    name = str((safe_load((repo / "reconciler.yaml").read_bytes(), "reconciler.yaml") or {}).get("name", "cloud"))
    return Added(req.node, "added" if existing is None else "completed", note_public, note_key, recipient,
                 age_identity, tuple(reencrypted), tuple(changed),
                 server_lines(req.node, note_public, name, req.git_path or f"/srv/git/{name}.git"), commit)


def _groups(req: AddRequest, data: dict[str, object], existing: object) -> list[str]:
    defined = data.get("groups") if isinstance(data.get("groups"), dict) else {}
    assert isinstance(defined, dict)
    if existing is not None:
        if req.groups:
            raise BadInput(f"node {req.node} is in inventory.yaml already: change its groups there, not with --group")
        return []
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", req.node):
        raise BadInput(f"{req.node!r}: a node name is letters, digits, '.', '_' and '-'")
    for group in req.groups:
        if group not in defined:
            raise BadInput(f"--group {group}: no such group in inventory.yaml (there: {', '.join(defined) or 'none'})")
    if req.groups:
        return list(req.groups)
    if len(defined) == 1:
        return [str(next(iter(defined)))]
    raise BadInput(f"--group: which groups does {req.node} join? (inventory.yaml has {', '.join(defined) or 'none'})")


def _ending(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"


def _reencrypt(repo: Path, rules: list[str], identity: Path | None) -> list[str]:
    """``sops updatekeys`` on every ``secrets/*.yaml`` a changed rule covers, as the operator."""
    files = sorted(str(p.relative_to(repo)) for p in (repo / "secrets").glob("*.yaml")) \
        if (repo / "secrets").is_dir() else []
    covered = [f for f in files if any(re.search(rule, f) for rule in rules)]
    if not covered:
        return []
    if identity is None:
        raise BadInput(f"--age-identity: the operator's age identity is needed to re-encrypt {covered[0]} "
                       f"(and {len(covered) - 1} more) to the new node" if len(covered) > 1 else
                       f"--age-identity: the operator's age identity is needed to re-encrypt {covered[0]} to the "
                       "new node")
    keys.age_public(identity)  # readable, private, an age key: said here rather than by sops
    sops = keys.sops_binary()
    for path in covered:
        run(sops, "updatekeys", "--yes", path, cwd=repo, env={"SOPS_AGE_KEY_FILE": str(identity.resolve())})
    return covered


def server_lines(node: str, public: str, repo_name: str, git_path: str) -> ServerLines:
    """What the git server needs for this node's key: gitolite's rule and key file, or the
    ``authorized_keys`` line with ``node-shell`` (contrib/git-server): its own notes ref only."""
    refex = re.escape(node).replace("\\-", "-")
    return ServerLines(
        gitolite_rule=f"repo {repo_name}\n    RW+ refs/notes/reconciler/{refex}$ = {node}\n    R = {node}",
        gitolite_key=f"keydir/{node}.pub: {public} {node}",
        authorized_keys=f'command="{NODE_SHELL} {node} {git_path}",restrict {public} {node}',
    )
