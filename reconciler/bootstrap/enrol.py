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

from reconciler.bootstrap import edits, keys, reencrypt
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
    yes: bool = False
    """Re-encrypt even when the rule adds recipients other than this node's."""


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
    reencrypted: tuple[reencrypt.Reencrypted, ...]
    changed: tuple[str, ...]
    server: ServerLines
    commit: str | None


def add(req: AddRequest) -> Added:
    """Every check first (nothing written until each passed), then the edit, all or nothing: a
    failure part way (sops on the second file) puts back the files changed so far and removes
    the keys made."""
    repo = req.repo.resolve()  # named in full by what fails below
    if not (repo / edits.INVENTORY).is_file() or not (repo / "reconciler.yaml").is_file():
        raise BadInput(f"{repo}: not a deployment repo (no inventory.yaml and reconciler.yaml); run it in one "
                       "or give --repo")
    inventory, nodes_file, sops_config = (edits.inside(repo, rel) for rel in
                                          (edits.INVENTORY, TRUST_NODES, edits.SOPS_CONFIG))
    text = inventory.read_text()
    data = safe_load(text.encode(), edits.INVENTORY) or {}
    nodes_text = nodes_file.read_text() if nodes_file.is_file() else ""
    if req.node in edits.listed_nodes(nodes_text):
        raise BadInput(f"node {req.node} already has a key in {TRUST_NODES}; to rotate it, edit its line there")
    existing = (data.get("nodes") or {}).get(req.node)
    groups = _groups(req, data, existing)
    known = (existing or {}).get("vars", {}).get("age_recipient") if isinstance(existing, dict) else None

    note_key = None if req.ssh_key else req.keys_dir / req.node / "note_key"
    note_public = keys.ssh_public(req.ssh_key) if req.ssh_key else ""
    age_identity: Path | None = None
    new_secret = ""
    if req.age_recipient:
        recipient = keys.age_recipient(req.age_recipient)
    elif known:
        recipient = str(known)
    else:
        age_identity = req.keys_dir / req.node / "age.key"
        new_secret, recipient = keys.new_age_identity()
    for made_here in (note_key, note_key and note_key.with_name("note_key.pub"), age_identity):
        if made_here is not None and made_here.exists():
            raise BadInput(f"{made_here} already exists: give the node's key with --ssh-key/--age-recipient "
                           "(or remove it)")

    writes: dict[str, str] = {}
    if existing is None:
        writes[edits.INVENTORY] = edits.add_node(text, req.node, groups, recipient)
    elif known != recipient:
        if known:
            raise BadInput(f"nodes.{req.node}.vars.age_recipient is {known[:16]}...; --age-recipient differs: "
                           "change it there", file=edits.INVENTORY)
        writes[edits.INVENTORY] = edits.set_recipient(text, req.node, recipient)
    files: list[reencrypt.FilePlan] = []
    if sops_config.is_file():
        new, rules = edits.add_recipient(sops_config.read_text(), recipient, req.rules)
        writes[edits.SOPS_CONFIG] = new
        files = reencrypt.plan(repo, new, rules, req.age_identity)
        others = [(f.path, f.others(recipient)) for f in files if f.others(recipient)]
        if others and not req.yes:
            where, extra = others[0]
            raise BadInput(f"{where}: sops updatekeys would also encrypt it to {', '.join(extra)} (in .sops.yaml's "
                           f"rule, not in the file now), not only to {req.node}'s {recipient}: check .sops.yaml, "
                           "or --yes")

    made: list[Path] = []
    saved = {rel: (repo / rel).read_bytes() if (repo / rel).is_file() else None
             for rel in [edits.INVENTORY, TRUST_NODES, edits.SOPS_CONFIG, *(f.path for f in files)]}
    try:
        if note_key is not None:
            made += [note_key, note_key.with_name("note_key.pub")]
            note_public = keys.make_ssh_key(note_key, f"reconciler node {req.node}")
        if age_identity is not None:
            made.append(age_identity)
            keys.write_age_key(age_identity, new_secret, recipient)
        writes[TRUST_NODES] = _ending(nodes_text) + edits.nodes_line(req.node, note_public) + "\n"
        nodes_file.parent.mkdir(exist_ok=True)
        for rel, new_text in writes.items():
            (repo / rel).write_text(new_text)
        done = reencrypt.run(repo, files, req.age_identity) if files and req.age_identity else []
        changed = [*writes, *(f.path for f in done)]
        run("git", "-C", str(repo), "add", "--", *changed)
    except BaseException:
        _put_back(repo, saved, made)
        raise
    commit = None
    if req.commit:
        branch = run("git", "-C", str(repo), "symbolic-ref", "--short", "HEAD").strip()
        try:
            run("git", "-C", str(repo), "commit", "-q", "-S", "-m", f"Add node {req.node}", "--trailer",
                f"{BRANCH_TRAILER}: {branch}")
        except keys.ToolFailed as exc:
            raise keys.ToolFailed(f"{exc} (the change is staged: commit it by hand)") from None
        commit = run("git", "-C", str(repo), "rev-parse", "HEAD").strip()
    name = str((safe_load((repo / "reconciler.yaml").read_bytes(), "reconciler.yaml") or {}).get("name", "cloud"))
    return Added(req.node, "added" if existing is None else "completed", note_public, note_key, recipient,
                 age_identity, tuple(done), tuple(changed),
                 server_lines(req.node, note_public, name, req.git_path or f"/srv/git/{name}.git"), commit)


def _put_back(repo: Path, saved: dict[str, bytes | None], made: list[Path]) -> None:
    """The repo's files as they were before this ``node add``, and none of the keys it made."""
    for rel, raw in saved.items():
        if raw is None:
            (repo / rel).unlink(missing_ok=True)
        elif not (repo / rel).is_file() or (repo / rel).read_bytes() != raw:
            (repo / rel).write_bytes(raw)
    for path in made:
        path.unlink(missing_ok=True)


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


def server_lines(node: str, public: str, repo_name: str, git_path: str) -> ServerLines:
    """What the git server needs for this node's key: gitolite's rule and key file, or the
    ``authorized_keys`` line with ``node-shell`` (contrib/git-server): its own notes ref only."""
    refex = re.escape(node).replace("\\-", "-")
    return ServerLines(
        gitolite_rule=f"repo {repo_name}\n    RW+ refs/notes/reconciler/{refex}$ = {node}\n    R = {node}",
        gitolite_key=f"keydir/{node}.pub: {public} {node}",
        authorized_keys=f'command="{NODE_SHELL} {node} {git_path}",restrict {public} {node}',
    )
