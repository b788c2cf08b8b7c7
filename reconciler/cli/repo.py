"""Commands on a deployment repo (a directory or a git repo): no node settings, nothing applied.

``verify --repo`` lives here as ``verify_in_repo``; the ``verify`` command itself is in ``node``
since without --repo it checks the node's mirror.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from reconciler.cli.common import (
    Failed,
    emit_json,
    escape,
    new_table,
    out,
    output_dir,
    output_option,
    style,
    write_output,
)
from reconciler.core.errors import BadInput
from reconciler.core.model import Desired
from reconciler.settings import AgentConfig

if TYPE_CHECKING:
    from reconciler.repo.definitions import DeploymentRepo
    from reconciler.review.diff import NodeDiff
    from reconciler.trust.root import Verdict


@click.command()
@click.option("--repo", "repo_dir", type=click.Path(path_type=Path), default=Path("."), show_default=True,
              help="Deployment repo: a directory, or a git repo when --rev is given.")
@click.option("--rev", help="Check this commit instead of the files on disk.")
@click.option("--age-identity", "age_identity", type=click.Path(path_type=Path),
              help="An age identity file: also find the values of the secrets it opens in plain text "
                   "elsewhere in the repo (named, never shown).")
@output_option
def validate(repo_dir: Path, rev: str | None, age_identity: Path | None, output: str) -> None:
    """Check schemas and references, and render every node.

    Each problem is printed as file:line: message; exit 2 if there is any.

    \b
    Example:
      reconciler validate --repo examples/repo
      reconciler validate --repo . --rev HEAD
      reconciler validate --repo . --age-identity ~/.config/sops/age/keys.txt

    \b
    Exit codes:
      0  valid: every node renders
      2  a problem in the repo (each one printed), or bad input (no such directory or commit)
    """
    from reconciler.core.yamlfile import RepoProblems
    from reconciler.repo.tree import open_tree
    from reconciler.review.diff import validate_tree

    tree = open_tree(repo_dir, rev)
    keys: tuple[object, ...] = ()
    if age_identity is not None:
        from reconciler.core.errors import BadInput
        from reconciler.render.secrets import identities

        try:
            text = age_identity.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise BadInput(f"cannot read the age identity: {getattr(exc, 'strerror', None) or exc}",
                           file=str(age_identity)) from None
        keys = identities(text, str(age_identity))
    from reconciler.fleet.facts import published

    _, problems, nodes, services = validate_tree(tree, keys, published(repo_dir, rev))
    if output == "json":
        result = {"ok": not problems, "nodes": nodes, "services": services,
                  "problems": [{"file": p.file, "line": p.line, "message": p.message} for p in problems]}
        if problems:
            raise Failed(RepoProblems(problems), result)
        emit_json(result)
        return
    for p in problems:
        click.echo(str(p), err=True)
    if not problems:
        out.print(f"[green]ok[/]: {tree.label}: {nodes} nodes, {services} service instances render")
    else:
        sys.exit(2)  # the problems above are the message: no extra error line, as validate always did


@click.command()
@click.option("--repo", "repo_dir", type=click.Path(path_type=Path), default=Path("."), show_default=True)
@click.option("--rev", help="Render this commit instead of the files on disk.")
@click.option("--node", "nodes", multiple=True, help="Node to render (repeatable).")
@click.option("--all", "all_nodes", is_flag=True, help="Render every node.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), help="Write the files per node here.")
@output_option
def render(repo_dir: Path, rev: str | None, nodes: tuple[str, ...], all_nodes: bool,
           out_dir: Path | None, output: str) -> None:
    """Render nodes' slices for review: OUT/<node>/<service>/<file>.

    Same commit, same bytes. Without --out, prints each service's hash and files.

    \b
    Example:
      reconciler render --repo examples/repo --all --out /tmp/rendered
      reconciler render --repo . --rev HEAD --node ctl1 -o json

    \b
    Exit codes:
      0  rendered
      1  --out's disk is full (DISK_FULL)
      2  bad input: neither --node nor --all (or both), an unknown node, a problem in the repo,
         an --out that cannot be written (a file, a directory where a file goes)
    """
    from reconciler.fleet.facts import for_review, published, said
    from reconciler.render.node import render_node
    from reconciler.render.vipnets import checked
    from reconciler.repo.load import load_repo
    from reconciler.repo.tree import open_tree

    if not nodes and not all_nodes or nodes and all_nodes:
        raise BadInput("give --node NODE or --all" + (", not both" if nodes else ""))
    tree = open_tree(repo_dir, rev)
    repo = checked(load_repo(tree))
    names = sorted(repo.nodes) if all_nodes else list(nodes)
    if out_dir is not None:
        _no_spec_clash(repo)
        output_dir("--out", out_dir)  # before the fleet is rendered: that can take minutes
    # each node's facts: its last published ones in the clone's notes, else the inventory's stand-ins
    known = published(repo_dir, rev)
    used = [(n, for_review(repo, n, known)) for n in names]
    slices = [render_node(repo, n, tree.label, facts=f) for n, f in used]
    for line in said(used):
        click.echo(line, err=True)
    if out_dir is not None:
        for d in slices:
            _write_slice(out_dir, d)
    if output == "json":
        emit_json([d.to_dict() for d in slices])
        return
    table = new_table("node", "service", "driver", "hash", "files")
    for d in slices:
        for s in d.services:
            table.add_row(d.node, s.name, s.runtime.driver, s.hash[:12], ", ".join(f.path for f in s.files))
    out.print(table)
    if out_dir is not None:
        out.print(f"written under {out_dir}")


SPEC_FILE = "service.json"  # OUT/<node>/<service>/service.json: the service's runtime spec


def _no_spec_clash(repo: DeploymentRepo) -> None:
    """A repo file where ``--out`` writes a service's spec would be replaced by it, unseen by the
    reviewer: refused before anything is written (the repo is valid; only this output clashes)."""
    for s in repo.services.values():
        for f in s.files:
            if f.path.lstrip("/").split("/")[0] == SPEC_FILE:
                raise BadInput(f"render --out: service {s.name!r} has a file {f.path!r}, the name render --out "
                               f"gives the service's spec: rename the file", file=s.file, line=f.line)


def _write_slice(root: Path, desired: Desired) -> None:
    # A review render is not the node's state: no fsync per file (durable=False), only the
    # temp-and-rename that keeps a reader from seeing half a file when --out is rendered again.
    for s in desired.services:
        base = f"{desired.node}/{s.name}"
        for f in s.files:
            # A host service's paths are absolute (/etc/...): under OUT as well, never at that
            # path on the reviewer's machine. The repo's checks leave no "..", "." or "//" in one.
            write_output("--out", root, f.content, below=f"{base}/{f.path.lstrip('/')}", mode=f.mode, durable=False)
        spec = {"runtime": s.runtime.to_dict(), "health": s.health.to_dict(), "hash": s.hash,
                "depends_on": list(s.depends_on)}
        write_output("--out", root, (json.dumps(spec, indent=2, sort_keys=True) + "\n").encode(),
                     below=f"{base}/{SPEC_FILE}", durable=False)


@click.command()
@click.argument("rev_a", required=False)
@click.argument("rev_b", required=False)
@click.option("--local", "local", is_flag=False, flag_value="", default=None, metavar="[PATH]",
              help="Diff the working tree at PATH (default: --repo's), uncommitted changes included, against "
                   "its commit --rev (default: HEAD), as `flux diff` does: no REV_A, REV_B then.")
@click.option("--rev", "local_rev", default=None, help="With --local: the commit to compare with (default: HEAD).")
@click.option("--repo", "repo_dir", type=click.Path(path_type=Path), default=Path("."), show_default=True,
              help="The deployment repo (a git repo holding both commits).")
@click.option("--node", "nodes", multiple=True, help="Only this node (repeatable); default: every node.")
@click.option("--all", "all_nodes", is_flag=True, help="Every node (the default).")
@click.option("-o", "--output", type=click.Choice(["human", "json", "markdown"]), default="human", show_default=True,
              help="markdown: a pull-request comment; json for scripts (errors too).")
@click.option("--exit-code", "exit_code", is_flag=True,
              help="Exit 1 when some node changes, 0 when none (as git diff --exit-code).")
@click.option("--max-bytes", type=click.IntRange(min=1024), default=None,
              help="With -o markdown: cut the comment to this many bytes (a forge's limit: GitHub 65536).")
@click.option("--artifact-url", help="With --max-bytes: where the full report is; linked when the comment is cut.")
@click.option("--report-file", type=click.Path(path_type=Path),
              help="With -o markdown: also write the uncut report to this file (the artifact).")
@click.option("-j", "--jobs", type=click.IntRange(min=0), default=0, show_default=True,
              help="Worker processes for a large fleet (0: one per CPU; 1: none). Same output either way.")
def diff(rev_a: str | None, rev_b: str | None, local: str | None, local_rev: str | None, repo_dir: Path,
         nodes: tuple[str, ...], all_nodes: bool, output: str, exit_code: bool, max_bytes: int | None,
         artifact_url: str | None, report_file: Path | None, jobs: int) -> None:
    """What REV_B will do on each node, compared with REV_A: changed files and actions.

    Each node's plan hash is the one the node writes in its note when it applies REV_B, so a
    reviewer can check that what ran is what was reviewed.

    \b
    Example:
      reconciler diff --repo . origin/main HEAD
      reconciler diff --repo . main feature --node ctl1 -o markdown > comment.md
      reconciler diff --repo . main feature -o markdown --max-bytes 65536 \\
          --artifact-url "$RUN_URL" --report-file full.md > comment.md
      reconciler diff --repo . origin/main HEAD --exit-code -o json || echo "changes"
      reconciler diff --local                     # the work tree against HEAD, before a commit

    \b
    Exit codes:
      0  the diff is printed (whatever it changes); with --exit-code: no node changes
      1  with --exit-code: some node changes (an action or a file)
      2  bad input: not a git repo, an unknown commit or node, a problem in either commit's repo,
         a --report-file that cannot be written
    """
    from reconciler.repo.tree import open_tree
    from reconciler.review.diff import cutover, diff_repos, load_at
    from reconciler.review.report import markdown, summary

    if output != "markdown" and (max_bytes or artifact_url or report_file):
        raise BadInput("--max-bytes, --artifact-url and --report-file go with -o markdown")
    if local is not None:
        if rev_a is not None or rev_b is not None:
            raise BadInput("--local compares the work tree with --rev (default HEAD): give no REV_A, REV_B")
        work = Path(local) if local else repo_dir  # `--local` alone: the repo given
        tree_a, tree_b = open_tree(work, local_rev or "HEAD", "--local"), open_tree(work, None)
    elif rev_a is None or rev_b is None or local_rev is not None:
        raise BadInput("diff needs REV_A and REV_B (or --local [PATH], with --rev)")
    else:
        needs = "the commits REV_A and REV_B"
        tree_a, tree_b = open_tree(repo_dir, rev_a, needs), open_tree(repo_dir, rev_b, needs)
    repo_a, repo_b = load_at(tree_a), load_at(tree_b)
    from reconciler.fleet.facts import published

    # Published facts count by REV_A's trust/nodes (--local: HEAD's): REV_B cannot vouch for a node key.
    diffs = diff_repos(repo_a, tree_a.label, repo_b, tree_b.label, None if all_nodes or not nodes else list(nodes),
                       jobs=jobs or None, facts=published(repo_dir, rev_a))
    steps = cutover(repo_a, repo_b, diffs)
    changed = any(d.plan.changes or d.files for d in diffs)
    if output == "json":
        emit_json({"from": tree_a.label, "to": tree_b.label, "summary": summary(diffs),
                   "nodes": [d.to_dict() for d in diffs], "cutover": [s.to_dict() for s in steps]})
    elif output == "markdown":
        groups = repo_b.group_members
        if report_file is not None:
            write_output("--report-file", report_file,
                         markdown(diffs, tree_a.label, tree_b.label, groups=groups, steps=steps).encode())
        click.echo(markdown(diffs, tree_a.label, tree_b.label, groups=groups, max_bytes=max_bytes,
                            artifact_url=artifact_url, steps=steps), nl=False)
    else:
        _print_diff(diffs)
        if steps:
            out.print("cutover of the VIP networks, in order (each step gated on the notes):")
            for i, step in enumerate(steps, 1):
                out.print("  " + escape(step.line(i)))
    if exit_code and changed:
        sys.exit(1)  # as `git diff --exit-code`: the changes are the output, not an error


def _print_diff(diffs: list[NodeDiff]) -> None:
    from rich.syntax import Syntax

    from reconciler.review.report import summary

    for d in diffs:
        if not d.plan.changes and not d.files:
            continue
        out.rule(f"{d.node}  (plan {d.plan.hash})")
        if d.facts:  # its render read facts the node did not publish
            out.print(f"facts: {escape(d.facts)}")
        for f in d.files:
            out.print(Syntax(f.text, "diff", theme="ansi_dark", background_color="default"))
        table = new_table("service", "action", "reason")
        for a in d.plan.changes:
            table.add_row(a.service, style(str(a.kind)), escape(a.reason))
        out.print(table)
        for i, line in enumerate(d.upgrade, 1):
            out.print(f"upgrade step {i}: {escape(line)}")
    summ = summary(diffs)
    unchanged = sum(1 for d in diffs if not d.plan.changes)
    parts = [f"{v['nodes']} node{'s' if v['nodes'] != 1 else ''} {k} ({v['services']} service"
             f"{'s' if v['services'] != 1 else ''})" for k, v in summ.items()]
    out.print("summary: " + ("; ".join(parts) if parts else "no node changes")
              + f"; {unchanged} of {len(diffs)} nodes unchanged")


def verify_in_repo(cfg: AgentConfig, repo_dir: Path, spec: str) -> list[Verdict]:
    """``verify --repo``: the commits of any git repo against the trust root given as options."""
    import pygit2

    from reconciler.trust.root import Policy, load_root
    from reconciler.trust.verify import Gate, verify_range

    t = cfg.trust
    node_root = load_root(t.allowed_signers, t.gpg_home, t.revoked, t.sealers)
    if node_root.empty:
        raise BadInput("no trust root: give --allowed-signers and/or --gpg-home")
    try:
        repo = pygit2.Repository(str(repo_dir))
    except pygit2.GitError as exc:
        raise BadInput(f"{repo_dir}: not a git repository") from exc
    gate = Gate(node_root, Policy(t.policy), node_revoked=node_root.revoked)
    return verify_range(repo, spec, gate)
