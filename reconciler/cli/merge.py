"""``merge``: the merge bot's command, one approved change (or, on GitHub, every approved pull
request of a branch: a sweep run from the default branch, never from a pull request's own
workflow) merged as a commit signed by the merge key, through ``reconciler.review.merge``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import click

from reconciler.cli.common import emit_json, err, forge_options, out, output_option
from reconciler.core.errors import BadInput, ReconcilerError, RemoteError


@click.command("merge")
@click.option("--repo", "repo_dir", type=click.Path(path_type=Path), default=Path("."), show_default=True,
              help="The bot's clone of the deployment repo (its git settings sign, unless --signing-key).")
@forge_options
@click.option("--approvals", type=click.IntRange(min=1), default=1, show_default=True,
              help="GitHub: approvals needed on the pull request's head commit.")
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
@click.option("--all-approved", is_flag=True, help="GitHub: every open pull request of BRANCH in turn (a scheduled "
              "sweep); those not approved are skipped, said.")
@click.option("--dry-run", is_flag=True, help="Make and check the merge; push and post nothing.")
@output_option
def merge(repo_dir: Path, forge: str, pr: int | None, github_repo: str | None, api_url: str, approvals: int,
          gerrit_url: str | None, change: str | None, remote: str, forge_git: str, branch: str,
          also_push: tuple[str, ...], signing_key: str, signing_format: str, name: str, email: str,
          allowed_signers: Path | None, gpg_home: Path | None, revoked: Path | None, policy: str,
          all_approved: bool, dry_run: bool, output: str) -> None:
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
      0  merged and pushed (or the change was already merged: reported); --all-approved:
         every approved one merged, the others skipped
      1  the forge or a git server did not answer or refused; the branch kept moving
      2  refused: conflicts, the merge does not validate, the nodes would refuse it, the
         change's ref moved after approval; or bad input (nothing pushed); --all-approved:
         one of them was refused (the others were merged)
      3  not approved (yet): nothing merged
    """
    from reconciler.review.changes import BRANCH, ChangeForge, GerritChange, GitHubChange, NotApproved
    from reconciler.review.merge import Merged, Signing, Target, merge_change
    from reconciler.trust.root import Policy, load_root

    if not BRANCH.fullmatch(branch) or branch.startswith(("-", "/")) or ".." in branch:
        raise BadInput(f"--branch {branch!r} is not a branch name")
    if (pr is None) == (not all_approved) and forge == "github":
        raise BadInput("--forge github needs --pr NUMBER or --all-approved (one of them)")
    if forge == "gerrit" and not gerrit_url:
        raise BadInput("--forge gerrit needs --gerrit-url (or GERRIT_URL)")
    if all_approved and forge != "github":
        raise BadInput("--all-approved is for --forge github (on Gerrit, the job runs per approval)")

    def config(key: str) -> str:
        proc = subprocess.run(["git", "config", key], cwd=repo_dir, capture_output=True, text=True)
        return proc.stdout.strip()

    name, email = name or config("user.name"), email or config("user.email")
    if not email or not name:
        raise BadInput("the merge needs a committer: give --name and --email (the principal the nodes trust), "
                       "or set git's user.name and user.email in the bot's clone")
    # git resolves a key's path from --repo: a path given here is the caller's.
    key = str(Path(signing_key).expanduser().resolve()) if signing_key and signing_format == "ssh" else signing_key
    root = load_root(allowed_signers, gpg_home, revoked)
    target, signing = Target(remote, forge_git, branch, also_push), Signing(name, email, key, signing_format)

    def one(the_forge: ChangeForge) -> Merged:
        return merge_change(repo_dir, the_forge, target, signing, root, Policy(policy), dry_run)

    def github(number: int) -> GitHubChange:
        return GitHubChange(api_url, os.environ.get("GITHUB_TOKEN", ""), github_repo or "", number, approvals)

    if not all_approved:
        the_forge: ChangeForge = github(pr) if forge == "github" and pr is not None else GerritChange(
            gerrit_url or "", os.environ.get("GERRIT_USER", ""), os.environ.get("GERRIT_PASSWORD", ""), change or "")
        done = one(the_forge)
        if output == "json":
            emit_json(_as_dict(done, dry_run))
        else:
            _say(done, branch, dry_run)
        return
    # The sweep: each open pull request of the branch in turn, oldest first. One that is not
    # approved or cannot be merged is said and skipped; a forge or git server that fails stops it.
    results: list[dict[str, Any]] = []
    refused = 0
    for number in github(0).open_changes(branch):
        try:
            done = one(github(number))
        except NotApproved as exc:
            results.append({"change": f"pull request #{number}", "skipped": str(exc)})
            if output != "json":
                out.print(f"skipped: {exc}")
            continue
        except RemoteError:
            raise
        except ReconcilerError as exc:
            refused += 1
            results.append({"change": f"pull request #{number}", "refused": str(exc), "reason": exc.reason})
            if output != "json":
                err.print(f"refused: {exc} [{exc.reason}]")
            continue
        results.append(_as_dict(done, dry_run))
        if output != "json":
            _say(done, branch, dry_run)
    if output == "json":
        emit_json(results)
    if refused:
        sys.exit(2)


def _as_dict(done: Any, dry_run: bool) -> dict[str, Any]:
    return {"change": done.change.label, "url": done.change.url, "commit": done.commit, "new": done.new,
            "pushed": list(done.pushed), "reported": done.reported, "reviewers": list(done.change.reviewers),
            "dry_run": dry_run}


def _say(done: Any, branch: str, dry_run: bool) -> None:
    verb = ("would merge" if dry_run else "merged") if done.new else "already merged"
    out.print(f"{done.change.label} {verb} as {done.commit} into {branch}"
              + (f", pushed to {', '.join(done.pushed)}" if done.pushed else ""))
    if done.reported:
        out.print(done.reported)
