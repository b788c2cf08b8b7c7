"""Onboarding commands: ``init`` (a deployment repo, signed from its first commit), ``check`` (a
node's settings against what its agent will meet) and ``node add`` (a node's keys in the repo).
The work is ``reconciler.bootstrap``'s; here are the options, the words and the exit codes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import click

from reconciler.cli.common import agent_config, agent_options, emit_json, out, output_option

_path = click.Path(path_type=Path)


def _git_config(key: str) -> str | None:
    done = subprocess.run(["git", "config", "--get", key], capture_output=True, text=True)
    return done.stdout.strip() or None if done.returncode == 0 else None


def _keys_home() -> Path:
    return Path.home() / ".config" / "reconciler" / "keys"


@click.command()
@click.argument("directory", type=_path)
@click.option("--node", default="node1", show_default=True, help="The first node's name in inventory.yaml.")
@click.option("--email", help="The signer's email: git's user.email in the repo and the trust root's principal "
                              "[git config user.email, else operator@example.org].")
@click.option("--name", "user_name", help="git's user.name in the repo [git config user.name, else Operator].")
@click.option("--key", type=_path, help="An existing SSH key to sign with (private key; its .pub beside it). "
                                        "Default: a new ed25519 key in --keys-dir.")
@click.option("--age-identity", type=_path, help="An existing age identity of the operator. Default: a new one "
                                                 "in --keys-dir.")
@click.option("--keys-dir", type=_path, help="Where keys made here go [~/.config/reconciler/keys/DIRNAME].")
@output_option
def init(directory: Path, node: str, email: str | None, user_name: str | None, key: Path | None,
         age_identity: Path | None, keys_dir: Path | None, output: str) -> None:
    """Make a deployment repo in DIRECTORY (new or empty): one node, one service, the operator's
    signing key as the trust root, .sops.yaml with the operator's age recipient, git set up in
    the repo to sign every commit, and a first signed commit.

    \b
    Example:
      reconciler init cloud && cd cloud && reconciler validate

    \b
    Exit codes:
      0  made
      1  a tool failed (git, ssh-keygen)
      2  DIRECTORY is not empty, or a key given cannot be read
    """
    from reconciler.bootstrap.skeleton import InitRequest
    from reconciler.bootstrap.skeleton import init as make

    done = make(InitRequest(directory, node, email or _git_config("user.email") or "operator@example.org",
                            user_name or _git_config("user.name") or "Operator",
                            keys_dir or _keys_home() / directory.resolve().name, key, age_identity))
    if output == "json":
        emit_json({"directory": str(done.directory), "commit": done.commit, "branch": done.branch,
                   "signing_key": str(done.signing_key), "signing_key_made": done.signing_key_made,
                   "age_identity": str(done.age_identity), "age_identity_made": done.age_identity_made,
                   "age_recipient": done.age_recipient, "principal": done.principal, "node": done.node})
        return
    out.print(f"made {done.directory}: first commit {done.commit[:12]} on {done.branch}, signed as {done.principal}")
    made = " (made now, no passphrase: ssh-keygen -p -f it to add one)" if done.signing_key_made else ""
    out.print(f"signing key: {done.signing_key}{made}")
    out.print(f"operator's age identity: {done.age_identity}{' (made now)' if done.age_identity_made else ''}; "
              "keep it safe and private: it opens every secret of the repo")
    out.print("next:")
    out.print("  git remote add origin URL && git push -u origin " + done.branch)
    out.print(f"  on each node, trust.allowed_signers: a copy of {done.directory}/trust/allowed_signers")
    out.print(f"  reconciler node add {done.node}    # its keys; then commit and push")


@click.command()
@agent_options
@output_option
def check(agent_opts: dict[str, Any], output: str) -> None:
    """Check this node's settings against what its agent will meet: the files they name and
    their permissions, the remote, the head signed under the trust root, the node in the
    inventory and in trust/nodes, the age identity among its recipients, the drivers, the state
    dir, the clock. One line each, with what to do. Changes nothing.

    \b
    Example:
      reconciler check --config /etc/reconciler/agent.yaml

    \b
    Exit codes:
      0  every check passed
      1  a check failed (its line says what to do)
      2  the settings themselves are wrong (one line each)
    """
    from reconciler.bootstrap.doctor import FAIL, run_checks

    cfg = agent_config(agent_opts)
    checks = run_checks(cfg)
    failed = any(c.status == FAIL for c in checks)
    if output == "json":
        emit_json({"node": cfg.node, "ok": not failed, "checks": [c.to_dict() for c in checks]})
    else:
        width = max(len(c.name) for c in checks)
        for c in checks:
            fix = f"\n      -> {c.fix}" if c.fix and c.status == FAIL else ""
            out.print(f"{c.status:<4}  {c.name:<{width}}  {c.detail}{fix}", markup=False)
    if failed:
        sys.exit(1)


@click.group("node")
def node_group() -> None:
    """The fleet's nodes, in the deployment repo."""


@node_group.command("add")
@click.argument("name")
@click.option("--repo", "repo_dir", type=_path, default=Path("."), show_default=True, help="The deployment repo.")
@click.option("--group", "groups", multiple=True, help="A group the node joins (repeatable) [the only group].")
@click.option("--ssh-key", help="The node's SSH public key (a line or a .pub file): signs its notes, and its git "
                                "login. Default: a new key in --keys-dir, to copy to the node.")
@click.option("--age-recipient", help="The node's age public key (age1...). Default: a new identity in --keys-dir.")
@click.option("--age-identity", type=_path, help="The operator's age identity: re-encrypts the secrets to the node.")
@click.option("--rule", "rules", multiple=True, help="Only the .sops.yaml creation rule of this path_regex "
                                                     "(repeatable) [every rule].")
@click.option("--keys-dir", type=_path, help="Where keys made here go [~/.config/reconciler/keys/REPO/nodes].")
@click.option("--git-path", help="The repo's path on the git server, for the authorized_keys line "
                                 "[/srv/git/NAME.git].")
@click.option("--commit", is_flag=True, help="Commit the change (signed) instead of leaving it staged.")
@click.option("--yes", is_flag=True, help="Re-encrypt even when the .sops.yaml rule would add recipients other "
                                          "than this node's (sops updatekeys gives a file to every recipient of "
                                          "its rule).")
@output_option
def add(name: str, repo_dir: Path, groups: tuple[str, ...], ssh_key: str | None, age_recipient: str | None,
        age_identity: Path | None, rules: tuple[str, ...], keys_dir: Path | None, git_path: str | None,
        commit: bool, yes: bool, output: str) -> None:
    """Add node NAME to the deployment repo: its inventory entry (or the keys of one there
    already), its note key in trust/nodes, its age recipient in .sops.yaml and the secrets
    re-encrypted to it (sops updatekeys); prints the git server line for its own notes ref.
    Every check is made before the first write, and the edit is all or nothing. Each secrets
    file's recipients before and after are printed; a rule that would give a file to anyone
    besides the new node is refused without --yes.

    \b
    Example:
      reconciler node add ctl2 --group controllers --age-identity ~/.config/reconciler/keys/cloud/operator.agekey

    \b
    Exit codes:
      0  added (staged, or committed with --commit)
      1  a tool failed (git, ssh-keygen, sops)
      2  bad input: not a deployment repo, the node has a key already, an unknown group, a
         symlink among the files edited, other recipients the rule would add (without --yes)
    """
    from reconciler.bootstrap.enrol import AddRequest
    from reconciler.bootstrap.enrol import add as enrol

    done = enrol(AddRequest(repo_dir, name, groups, keys_dir or _keys_home() / repo_dir.resolve().name / "nodes",
                            ssh_key, age_recipient, age_identity, rules, git_path, commit, yes))
    if output == "json":
        emit_json({"node": done.node, "inventory": done.in_inventory, "note_public": done.note_public,
                   "note_key": str(done.note_key) if done.note_key else None, "age_recipient": done.age_recipient,
                   "age_identity": str(done.age_identity) if done.age_identity else None,
                   "reencrypted": [{"path": f.path, "before": list(f.before), "after": list(f.after)}
                                   for f in done.reencrypted], "changed": list(done.changed), "commit": done.commit,
                   "server": vars(done.server)})
        return
    say = out.print
    say(f"{done.node}: {done.in_inventory} in inventory.yaml; note key in trust/nodes; age recipient "
        f"{done.age_recipient[:16]}... in .sops.yaml", markup=False)
    for f in done.reencrypted:
        say(f"re-encrypted {f.path} (sops updatekeys):\n  was: {', '.join(f.before)}\n  now: {', '.join(f.after)}",
            markup=False)
    if done.note_key or done.age_identity:
        say("copy to the node (mode 0600), then delete here:", markup=False)
        if done.note_key:
            say(f"  {done.note_key} -> /etc/reconciler/id_ed25519 (note_key:, and its git key: ssh_command)",
                markup=False)
        if done.age_identity:
            say(f"  {done.age_identity} -> /etc/reconciler/age.key (secrets.age_identity:)", markup=False)
    say("on the git server, its own notes ref only; with gitolite:", markup=False)
    say(f"  {done.server.gitolite_key}", markup=False)
    say("".join(f"  {line}\n" for line in done.server.gitolite_rule.splitlines()).rstrip("\n"), markup=False)
    say("or in ~git/.ssh/authorized_keys (contrib/git-server/node-shell):", markup=False)
    say(f"  {done.server.authorized_keys}", markup=False)
    if done.commit:
        say(f"committed {done.commit[:12]} (signed); push it", markup=False)
    else:
        say(f"staged for review: git diff --cached; then git commit -S -m 'Add node {done.node}' && git push",
            markup=False)
