"""``review-post``: validate and diff a change, and post both on the forge where it is reviewed
(a GitHub pull request or a Gerrit change) through ``reconciler.forge``."""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import click

from reconciler.cli.common import emit_json, forge_options, out, output_option, write_output
from reconciler.core.errors import BadInput

if TYPE_CHECKING:
    from reconciler.review.report import Change


@click.command("review-post")
@click.argument("base")
@click.argument("head")
@click.option("--repo", "repo_dir", type=click.Path(path_type=Path), default=Path("."), show_default=True,
              help="The deployment repo (a git repo holding both commits).")
@forge_options
@click.option("--revision", envvar="GERRIT_PATCHSET_REVISION",
              help="Gerrit: the patch set's commit [$GERRIT_PATCHSET_REVISION].")
@click.option("--max-bytes", type=click.IntRange(min=1024),
              help="Cut the comment to this size [the forge's: GitHub 65536, Gerrit 16000].")
@click.option("--artifact-url", help="Where the full report is; linked when the comment is cut.")
@click.option("--report-file", type=click.Path(path_type=Path), help="Also write the uncut report here.")
@output_option
def review_post(base: str, head: str, repo_dir: Path, forge: str, pr: int | None, github_repo: str | None,
                api_url: str, gerrit_url: str | None, change: str | None, revision: str | None,
                max_bytes: int | None, artifact_url: str | None, report_file: Path | None, output: str) -> None:
    """Validate HEAD, diff it against BASE for every node, and post the diff on the change:
    GitHub: one comment, found again by a hidden marker and edited in place, and a commit status
    per changed node group (reconciler/<group>) and reconciler/validate; Gerrit: a review
    message, Verified -1 when validation fails.

    Secrets come from the environment only: GITHUB_TOKEN; GERRIT_USER, GERRIT_PASSWORD.

    \b
    Example:
      reconciler review-post --forge github --pr 42 origin/main "$HEAD_SHA"
      reconciler review-post --forge gerrit --change 1234 --revision "$SHA" HEAD~1 HEAD

    \b
    Exit codes:
      0  posted; HEAD validates
      1  posted, and HEAD does not validate (the vote says so); or the forge refused or did not answer
      2  bad input: missing settings, not a git repo, an unknown commit, a --report-file
         that cannot be written (nothing is posted)
    """
    from reconciler.repo.tree import open_tree
    from reconciler.review.diff import diff_repos, validate_tree
    from reconciler.review.forge import GERRIT_LIMIT, GITHUB_LIMIT, MARKER, Forge, Gerrit, GitHub, GroupStatus, Review
    from reconciler.review.report import changes, code_span, markdown

    the_forge: Forge
    if forge == "github":
        if pr is None:
            raise BadInput("--forge github needs --pr NUMBER")
        the_forge = GitHub(api_url, os.environ.get("GITHUB_TOKEN", ""), github_repo or "", pr)
    else:
        if not gerrit_url:
            raise BadInput("--forge gerrit needs --gerrit-url (or GERRIT_URL)")
        the_forge = Gerrit(gerrit_url, os.environ.get("GERRIT_USER", ""), os.environ.get("GERRIT_PASSWORD", ""),
                           change or "", revision or "")
    limit = (max_bytes or (GITHUB_LIMIT if forge == "github" else GERRIT_LIMIT)) - len(MARKER) - 1
    needs = "the commits BASE and HEAD"
    tree_a, tree_b = open_tree(repo_dir, base, needs), open_tree(repo_dir, head, needs)
    from reconciler.fleet.facts import published

    # Each node's last published facts, what its render reads, judged by the base's trust/nodes
    # as the merge bot judges trust: the change under review cannot vouch for a key of its own.
    known = published(repo_dir, base)
    repo_b, problems, _, _ = validate_tree(tree_b, facts=known)
    groups: tuple[GroupStatus, ...] = ()
    if repo_b is None or problems:
        lines = [f"### reconciler: `{tree_b.label[:12]}` does not validate", ""]
        lines += [f"- {code_span(str(p))}" for p in problems]  # a problem quotes the repo: escaped
        body = full = "\n".join(lines) + "\n"
        if len(body.encode()) > limit:
            body = body.encode()[:limit - 200].decode(errors="ignore") + "\n\n(cut; run `reconciler validate`)\n"
    else:
        from reconciler.review.diff import cutover, load_at

        repo_a = load_at(tree_a)
        diffs = diff_repos(repo_a, tree_a.label, repo_b, tree_b.label, facts=known)
        steps = cutover(repo_a, repo_b, diffs)
        members = repo_b.group_members
        full = markdown(diffs, tree_a.label, tree_b.label, groups=members, steps=steps)
        body = markdown(diffs, tree_a.label, tree_b.label, groups=members, max_bytes=limit, artifact_url=artifact_url,
                        steps=steps)
        # Per inventory group with a changed node: one status, saying what changes there.
        found = changes(diffs)
        changed = {n for c in found for n in c.nodes}
        groups = tuple(GroupStatus(g, True, _what(g, m, changed, found)) for g, m in members.items()
                       if set(m) & changed)
    if report_file is not None:
        write_output("--report-file", report_file, full.encode())
    valid = repo_b is not None and not problems
    posted = the_forge.post(Review(tree_b.label, body, valid, groups))
    if output == "json":
        emit_json({"base": tree_a.label, "head": tree_b.label, "valid": valid, "posted": posted,
                   "problems": [{"file": p.file, "line": p.line, "message": p.message} for p in problems],
                   "groups": [{"group": g.group, "ok": g.ok, "description": g.description} for g in groups]})
    else:
        for line in posted:
            out.print(line)
    if not valid:
        sys.exit(1)  # the comment and the vote carry the problems


def _what(group: str, members: list[str], changed: set[str], found: list[Change]) -> str:
    kinds: Counter[str] = Counter()
    for c in found:
        kinds[str(c.kind)] += len(set(c.nodes) & set(members))
    return (f"{len(set(members) & changed)} of {len(members)} nodes change: "
            + ", ".join(f"{v} {k}" for k, v in sorted(kinds.items()) if v))


