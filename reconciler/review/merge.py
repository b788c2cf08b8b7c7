"""``reconciler merge``: a merge bot that turns an approved change into the signed merge commit
the nodes apply.

Where reviews happen (a GitHub pull request, a Gerrit change) the forge's own merge either
does not sign (Gerrit's submit) or signs with the forge's key (GitHub's web flow: whoever may
press the button would be trusted). The bot signs with a key of its own, in the nodes' trust
root, and only:

1. the exact commit the forge approved (``changes``): the change's ref is fetched and must hold
   that commit, so a push after the approval merges nothing;
2. a merge with no conflict, made without a work tree (``git merge-tree --write-tree``, then
   ``git commit-tree -S``), carrying ``Reconciler-Branch`` (the binding), the change's address
   and its reviewers as trailers;
3. a merge that validates (every node renders) and that the nodes' gate accepts: the same
   ``Gate`` a node runs, under the root in force at the branch's head (the repo's own
   ``trust/allowed_signers`` once it carries one, else the root given), with the repo's policy;
4. pushed without force: a branch that moved meanwhile is fetched and merged again (three tries).

Each side effect (fetch, commit, push, report) is a numbered fault point. A run killed anywhere
is finished by the next: a change already in the branch is not merged again; its merge is found
on the branch, pushed to the other targets and reported once (the report's marker names it).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from reconciler.core import faults
from reconciler.core.errors import BadInput, ReconcilerError, RemoteError
from reconciler.review.changes import Approved, ChangeForge
from reconciler.source.gitrun import git_cause, safe_url, scrub
from reconciler.trust.root import Policy, TrustError, TrustRoot

BASE_REF = "refs/reconciler/merge/base"
CHANGE_REF = "refs/reconciler/merge/change"
OTHER_REF = "refs/reconciler/merge/other"
TRIES = 3
TRUST_SIGNERS = "trust/allowed_signers"


class MergeRefused(ReconcilerError):
    """The change cannot be merged as it is (conflicts, does not validate, the nodes would
    refuse the merge): nothing is pushed."""

    reason = "MERGE_REFUSED"
    exit_code = 2


@dataclass(frozen=True)
class Signing:
    """Who the merge is from and the key it is signed with (git's own settings when empty)."""

    name: str
    email: str
    key: str = ""  # an SSH private key's path, or an OpenPGP key id
    format: str = "ssh"  # "ssh" or "openpgp"


@dataclass(frozen=True)
class Target:
    """Where the branch is read and the merge pushed (the nodes' git server) and where the
    change is fetched from (the forge's git; the same server when empty)."""

    remote: str
    forge_git: str
    branch: str
    also_push: tuple[str, ...] = ()


@dataclass(frozen=True)
class Merged:
    change: Approved
    commit: str
    new: bool  # False: the change was already in the branch (a run before this one merged it)
    pushed: tuple[str, ...]
    reported: str  # what was posted on the change ("" if it already carried the report)


def marker(commit: str) -> str:
    return f"<!-- reconciler-merge {commit} -->"


class Git:
    def __init__(self, repo: Path, signing: Signing) -> None:
        self.repo = repo
        self.env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C", "LANGUAGE": "C",
                    "GIT_AUTHOR_NAME": signing.name, "GIT_AUTHOR_EMAIL": signing.email,
                    "GIT_COMMITTER_NAME": signing.name, "GIT_COMMITTER_EMAIL": signing.email}
        self.config: list[str] = []
        if signing.key:
            self.config = ["-c", f"gpg.format={'openpgp' if signing.format == 'openpgp' else 'ssh'}",
                           "-c", f"user.signingkey={signing.key}"]

    def run(self, *args: str, stdin: str | None = None, url: str = "") -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["git", *self.config, *args], cwd=self.repo, input=stdin, capture_output=True,
                              text=True, env=self.env, timeout=300)
        if url:  # a remote's credentials never reach a message
            proc.stderr = scrub(proc.stderr, url)
        return proc

    def must(self, *args: str, stdin: str | None = None, what: str) -> str:
        proc = self.run(*args, stdin=stdin)
        if proc.returncode != 0:
            raise BadInput(f"{what}: {_cause(proc)}")
        return proc.stdout.strip()

    def fetch(self, url: str, ref: str, into: str) -> str:
        faults.point("fetch", f"{ref} -> {into}")
        proc = self.run("fetch", "--quiet", "--no-tags", "--no-write-fetch-head", url, f"+{ref}:{into}", url=url)
        if proc.returncode != 0:
            raise RemoteError(f"fetch {ref} from {safe_url(url)}: {_cause(proc)}", reason="FETCH_FAILED")
        return self.must("rev-parse", f"{into}^{{commit}}", what=f"{into}")

    def is_ancestor(self, a: str, b: str) -> bool:
        return self.run("merge-base", "--is-ancestor", a, b).returncode == 0

    def merge_of(self, change: str, base: str) -> str:
        """The merge on ``base``'s first-parent chain that brought ``change`` in (the bot's, or any)."""
        out = self.must("rev-list", "--first-parent", "--merges", "--parents", f"{change}..{base}", what="history")
        for line in reversed(out.splitlines()):  # oldest first
            commit, *parents = line.split()
            if any(self.is_ancestor(change, p) for p in parents[1:]):
                return commit
        return base  # a fast-forward or a rebase brought it: the branch's head holds it


def merge_change(repo: Path, forge: ChangeForge, target: Target, signing: Signing, root: TrustRoot,
                 policy: Policy, dry_run: bool = False) -> Merged:
    if not (repo / ".git").exists() and not (repo / "HEAD").is_file():
        raise BadInput(f"{repo}: not a git repository (the bot's clone)")
    g = Git(repo, signing)
    approved = forge.approved(target.branch)
    for _ in range(TRIES):
        base = g.fetch(target.remote, f"refs/heads/{target.branch}", BASE_REF)
        got = g.fetch(target.forge_git or target.remote, approved.fetch_ref, CHANGE_REF)
        if got != approved.sha:
            raise MergeRefused(f"{approved.label}: {approved.fetch_ref} holds {got[:12]}, the forge approved "
                               f"{approved.sha[:12]} (pushed after the approval?): nothing merged")
        if g.is_ancestor(approved.sha, base):
            return _finish(g, forge, target, approved, g.merge_of(approved.sha, base), new=False, dry_run=dry_run)
        commit = _make(g, approved, base, target.branch)
        _check(repo, commit, base, root, policy, target.branch)
        if dry_run:
            return Merged(approved, commit, True, (), "")
        faults.point("push", f"{commit[:12]} -> {target.branch}")
        proc = g.run("push", "--quiet", target.remote, f"{commit}:refs/heads/{target.branch}", url=target.remote)
        if proc.returncode == 0:
            return _finish(g, forge, target, approved, commit, new=True, dry_run=False)
        # Refused because the branch moved since the fetch (git says it several ways: "fetch
        # first", "non-fast-forward", a lost race for the ref's lock)? Then merge onto its new head.
        if _remote_head(g, target.remote, target.branch) in (base, None):
            raise RemoteError(f"push to {safe_url(target.remote)}: {_cause(proc)}", reason="PUSH_FAILED")
    raise RemoteError(f"{target.branch} on {safe_url(target.remote)} moved during each of {TRIES} tries: "
                      "run again", reason="BRANCH_BUSY")


def _make(g: Git, approved: Approved, base: str, branch: str) -> str:
    proc = g.run("merge-tree", "--write-tree", "--no-messages", base, approved.sha)
    if proc.returncode == 1:
        files = sorted({line.split("\t", 1)[1] for line in proc.stdout.splitlines()[1:] if "\t" in line})
        raise MergeRefused(f"{approved.label} conflicts with {branch} in {', '.join(files[:10]) or 'its files'}: "
                           "rebase it, then approve it again")
    if proc.returncode != 0:
        raise BadInput(f"merge: {_cause(proc)}")
    tree = proc.stdout.split("\n", 1)[0].strip()
    trailers = [f"Reconciler-Branch: {branch}"]
    if approved.url:
        trailers.append(f"Reconciler-Change: {approved.url}")
    trailers += [f"Reviewed-by: {r}" for r in approved.reviewers]
    message = f"Merge {approved.label}: {approved.title}\n\n" + "\n".join(trailers) + "\n"
    faults.point("commit", f"merge of {approved.sha[:12]}")
    return g.must("commit-tree", "-S", tree, "-p", base, "-p", approved.sha, "-F", "-", stdin=message,
                  what="sign the merge (is the signing key readable, and git's signing set up?)")


def _check(repo: Path, commit: str, base: str, root: TrustRoot, policy: Policy, branch: str) -> None:
    """Refuse to push what the nodes would refuse: it must validate and pass their gate."""
    import pygit2

    from reconciler.repo.tree import open_tree
    from reconciler.review.diff import validate_tree
    from reconciler.trust.verify import Gate, repo_policy, repo_requires_binding, rotated_root_at, tree_file

    _, problems, _, _ = validate_tree(open_tree(repo, commit))
    if problems:
        shown = "; ".join(str(p) for p in problems[:3]) + (f" (+{len(problems) - 3} more)" if len(problems) > 3 else "")
        raise MergeRefused(f"the merge does not validate: {shown}: nothing pushed")
    git_repo = pygit2.Repository(str(repo))
    # The roots a node may hold at the branch's head: the one it was provisioned with (given),
    # and the repo's own once a rotation made the nodes adopt it. The merge must pass both.
    roots: list[tuple[str, TrustRoot]] = []
    if not root.empty:
        roots.append(("--allowed-signers", root))
    try:
        if tree_file(git_repo, base, TRUST_SIGNERS) is not None:
            roots.append((f"{TRUST_SIGNERS} at {base[:12]}", rotated_root_at(git_repo, base, root)))
        if not roots:
            raise BadInput("no trust root to check the merge under: give --allowed-signers (the nodes' root), "
                           "or carry trust/allowed_signers in the repo")
        for _, in_force in roots:
            gate = Gate(in_force, policy, node_revoked=root.revoked, branch=branch)
            gate.decide(git_repo, commit, base, repo_policy(git_repo, base, commit),
                        repo_requires_binding(git_repo, base, commit))
    except TrustError as exc:
        raise MergeRefused(f"the nodes would refuse the merge ({exc.reason}): {exc}: nothing pushed") from None


def _finish(g: Git, forge: ChangeForge, target: Target, approved: Approved, commit: str, new: bool,
            dry_run: bool) -> Merged:
    """Say on the change what was done, once, then push the merge to the other targets. In that
    order: pushed to the forge's branch, the forge closes the change as merged, and a run killed
    before its report could not find the change open again to finish it."""
    if dry_run:
        return Merged(approved, commit, new, (), "")
    said = ""
    if not forge.reported(marker(commit)):
        text = (f"{marker(commit)}\nMerged as `{commit}` into `{target.branch}` on {safe_url(target.remote)}, "
                f"signed by the merge bot ({g.env['GIT_COMMITTER_EMAIL']}); the nodes apply it on their next poll.")
        faults.point("report", approved.label)
        said = forge.report(approved, text)
    pushed = [target.remote]
    for url in target.also_push:
        faults.point("push", f"{commit[:12]} -> {safe_url(url)}")
        proc = g.run("push", "--quiet", url, f"{commit}:refs/heads/{target.branch}", url=url)
        if proc.returncode != 0:
            # Pushed there before (a run killed after it), and the branch moved on since?
            fetched = g.run("fetch", "--quiet", "--no-tags", "--no-write-fetch-head", url,
                            f"+refs/heads/{target.branch}:{OTHER_REF}", url=url)
            if fetched.returncode != 0 or not g.is_ancestor(commit, OTHER_REF):
                raise RemoteError(f"merged as {commit[:12]} on {safe_url(target.remote)}, but the push to "
                                  f"{safe_url(url)} failed: {_cause(proc)} (run again to finish)", reason="PUSH_FAILED")
        pushed.append(url)
    return Merged(approved, commit, new, tuple(safe_url(u) for u in pushed), said)


def _remote_head(g: Git, url: str, branch: str) -> str | None:
    proc = g.run("ls-remote", url, f"refs/heads/{branch}", url=url)
    words = proc.stdout.split()
    return words[0] if proc.returncode == 0 and words else None


def _cause(proc: subprocess.CompletedProcess[str]) -> str:
    return git_cause(proc.stderr) or proc.stderr.strip()[:300] or f"git exited {proc.returncode}"
