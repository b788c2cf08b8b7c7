"""``review-post``: validate and diff a change, and post both on the forge where it is reviewed
(a GitHub pull request or a Gerrit change) through ``reconciler.forge``."""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import click

from reconciler.cli.common import emit_json, out, output_option, write_output
from reconciler.core.errors import BadInput

if TYPE_CHECKING:
    from reconciler.review.report import Change


@click.command("review-post")
@click.argument("base")
@click.argument("head")
@click.option("--repo", "repo_dir", type=click.Path(path_type=Path), default=Path("."), show_default=True,
              help="The deployment repo (a git repo holding both commits).")
@click.option("--forge", type=click.Choice(["github", "gerrit"]), required=True)
@click.option("--pr", type=int, help="GitHub: the pull request's number.")
@click.option("--github-repo", envvar="GITHUB_REPOSITORY", help="GitHub: OWNER/NAME [$GITHUB_REPOSITORY].")
@click.option("--api-url", envvar="GITHUB_API_URL", default="https://api.github.com", show_default=True,
              help="GitHub: the REST API [$GITHUB_API_URL].")
@click.option("--gerrit-url", envvar="GERRIT_URL", help="Gerrit: the server's URL [$GERRIT_URL].")
@click.option("--change", envvar="GERRIT_CHANGE_NUMBER", help="Gerrit: the change [$GERRIT_CHANGE_NUMBER].")
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
    repo_b, problems, _, _ = validate_tree(tree_b)
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
        diffs = diff_repos(repo_a, tree_a.label, repo_b, tree_b.label)
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



@click.command("merge")
@click.option("--repo", "repo_dir", type=click.Path(path_type=Path), default=Path("."), show_default=True,
              help="The bot's clone of the deployment repo (its git settings sign, unless --signing-key).")
@click.option("--forge", type=click.Choice(["github", "gerrit"]), required=True)
@click.option("--pr", type=int, help="GitHub: the pull request's number.")
@click.option("--github-repo", envvar="GITHUB_REPOSITORY", help="GitHub: OWNER/NAME [$GITHUB_REPOSITORY].")
@click.option("--api-url", envvar="GITHUB_API_URL", default="https://api.github.com", show_default=True,
              help="GitHub: the REST API [$GITHUB_API_URL].")
@click.option("--approvals", type=click.IntRange(min=1), default=1, show_default=True,
              help="GitHub: approvals needed on the pull request's head commit.")
@click.option("--gerrit-url", envvar="GERRIT_URL", help="Gerrit: the server's URL [$GERRIT_URL].")
@click.option("--change", envvar="GERRIT_CHANGE_NUMBER", help="Gerrit: the change [$GERRIT_CHANGE_NUMBER].")
@click.option("--remote", required=True, help="The git server the nodes read: its branch is merged into and pushed.")
@click.option("--forge-git", default="", help="Where the change's ref is fetched (the forge's git URL) [--remote].")
@click.option("--branch", default="main", show_default=True)
@click.option("--also-push", multiple=True, help="Push the merge here too after --remote (e.g. the forge, so it "
              "shows the change merged). Repeatable.")
@click.option("--signing-key", default="", help="The merge key: an SSH private key's path, or an OpenPGP key id "
              "with --signing-format openpgp [git's user.signingkey].")
@click.option("--signing-format", type=click.Choice(["ssh", "openpgp"]), default="ssh", show_default=True)
@click.option("--name", default="", help="The merge's committer name [git's user.name].")
@click.option("--email", default="",
              help="The merge's committer email, the principal the nodes check [git's user.email].")
@click.option("--allowed-signers", type=click.Path(path_type=Path),
              help="The nodes' SSH trust root, used until the repo carries trust/allowed_signers.")
@click.option("--gpg-home", type=click.Path(path_type=Path), help="The nodes' OpenPGP keyring.")
@click.option("--revoked", type=click.Path(path_type=Path), help="The nodes' revocation list.")
@click.option("--policy", type=click.Choice(["every-commit", "first-parent", "head"]), default="every-commit",
              show_default=True, help="The nodes' trust policy (the repo's, if stricter, applies too).")
@click.option("--dry-run", is_flag=True, help="Make and check the merge; push and post nothing.")
@output_option
def merge(repo_dir: Path, forge: str, pr: int | None, github_repo: str | None, api_url: str, approvals: int,
          gerrit_url: str | None, change: str | None, remote: str, forge_git: str, branch: str,
          also_push: tuple[str, ...], signing_key: str, signing_format: str, name: str, email: str,
          allowed_signers: Path | None, gpg_home: Path | None, revoked: Path | None, policy: str, dry_run: bool,
          output: str) -> None:
    """Merge an approved change into BRANCH as a commit signed by the merge key, the one the
    nodes trust, and push it to the nodes' git server.

    Only the commit the forge approved (GitHub: approved on the pull request's head, no changes
    requested; Gerrit: Code-Review approved, submittable), only without conflicts, only if the
    merge validates and the nodes' gate would accept it. A branch that moved meanwhile is merged
    again. Run again after any failure: a change already merged is reported, not merged twice.

    Secrets come from the environment only: GITHUB_TOKEN; GERRIT_USER, GERRIT_PASSWORD.

    \b
    Example:
      reconciler merge --forge github --pr 42 --remote git@git.example.org:cloud \\
        --signing-key ~/.ssh/merge_key --email merge@example.org --policy first-parent
      reconciler merge --forge gerrit --change 1234 --remote ssh://git@nodes/cloud \\
        --forge-git https://review.example.org/cloud --also-push https://review.example.org/cloud

    \b
    Exit codes:
      0  merged and pushed (or the change was already merged: reported)
      1  the forge or a git server did not answer or refused; the branch kept moving
      2  refused: conflicts, the merge does not validate, the nodes would refuse it, the
         change's ref moved after approval; or bad input (nothing pushed)
      3  not approved (yet): nothing merged
    """
    import subprocess

    from reconciler.review.changes import ChangeForge, GerritChange, GitHubChange
    from reconciler.review.merge import Signing, Target, merge_change
    from reconciler.trust.root import Policy, load_root

    the_forge: ChangeForge
    if forge == "github":
        if pr is None:
            raise BadInput("--forge github needs --pr NUMBER")
        the_forge = GitHubChange(api_url, os.environ.get("GITHUB_TOKEN", ""), github_repo or "", pr, approvals)
    else:
        if not gerrit_url:
            raise BadInput("--forge gerrit needs --gerrit-url (or GERRIT_URL)")
        the_forge = GerritChange(gerrit_url, os.environ.get("GERRIT_USER", ""), os.environ.get("GERRIT_PASSWORD", ""),
                                 change or "")

    def config(key: str) -> str:
        proc = subprocess.run(["git", "config", key], cwd=repo_dir, capture_output=True, text=True)
        return proc.stdout.strip()

    name, email = name or config("user.name"), email or config("user.email")
    if not email or not name:
        raise BadInput("the merge needs a committer: give --name and --email (the principal the nodes trust), "
                       "or set git's user.name and user.email in the bot's clone")
    root = load_root(allowed_signers, gpg_home, revoked)
    done = merge_change(repo_dir, the_forge, Target(remote, forge_git, branch, also_push),
                        Signing(name, email, signing_key, signing_format), root, Policy(policy), dry_run)
    if output == "json":
        emit_json({"change": done.change.label, "url": done.change.url, "commit": done.commit, "new": done.new,
                   "pushed": list(done.pushed), "reported": done.reported, "reviewers": list(done.change.reviewers),
                   "dry_run": dry_run})
        return
    verb = "would merge" if dry_run else ("merged" if done.new else "already merged")
    out.print(f"{done.change.label} {verb} as {done.commit} into {branch}"
              + (f", pushed to {', '.join(done.pushed)}" if done.pushed else ""))
    if done.reported:
        out.print(done.reported)

