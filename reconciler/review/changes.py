"""What a forge says about a change the merge bot is asked to merge, read as hostile input.

The bot merges exactly the commit the reviewers approved: GitHub counts an approval only when it
was given on the pull request's current head (``commit_id``), so a push after the approval
needs a new one, whatever the repository's "dismiss stale approvals" setting; Gerrit's approval
belongs to the current patch set, and the change must be submittable (Gerrit's own submit
requirements: Verified, a required label). Every field the bot uses is checked for its shape:
a sha is 40 hex digits, a ref is one the forge makes for changes, a name goes into a trailer
only as one printable line.

``Reported`` finds the bot's own earlier report by a marker that names the merge, so a run
killed after its push and run again reports once.
"""

from __future__ import annotations

import base64
import re
import urllib.parse
from dataclasses import dataclass
from typing import Any, Protocol

from reconciler.core.errors import BadInput, ReconcilerError, RemoteError
from reconciler.core.text import printable
from reconciler.review.forge import _NEXT, Http

_SHA = re.compile(r"[0-9a-f]{40}")
_GERRIT_REF = re.compile(r"refs/changes/\d{2}/\d+/\d+")
BRANCH = re.compile(r"[A-Za-z0-9._/-]{1,200}")
_LOGIN = re.compile(r"[A-Za-z0-9-]{1,39}(\[bot\])?")


class NotApproved(ReconcilerError):
    """The forge does not (or no longer) approve the change: nothing is merged."""

    reason = "NOT_APPROVED"
    exit_code = 3  # not an error of the bot's input: a job polling for approval tells them apart


@dataclass(frozen=True)
class Approved:
    """A change approved for merge: the exact commit, where to fetch it, who approved it."""

    label: str  # "pull request #7", "change 1234"
    title: str
    url: str
    branch: str
    sha: str
    fetch_ref: str
    reviewers: tuple[str, ...]


def one_line(text: object, most: int = 200) -> str:
    """A forge's free text (a title, a name) made fit for a commit message's trailer."""
    flat = " ".join(printable(str(text)).split())
    return flat if len(flat) <= most else flat[: most - 3] + "..."


def _sha(value: object, what: str) -> str:
    text = str(value or "")
    if not _SHA.fullmatch(text):
        raise RemoteError(f"the forge's {what} is not a commit id: {one_line(text, 60)!r}", reason="FORGE_REFUSED")
    return text


class ChangeForge(Protocol):
    def approved(self, branch: str) -> Approved:
        """The change, if the forge approves it for ``branch`` (``NotApproved`` if not)."""
        ...

    def reported(self, marker: str) -> bool:
        """Does the change already carry a report holding ``marker``?"""
        ...

    def report(self, approved: Approved, text: str) -> str:
        """Say on the change what was done; what was posted, one line (for the log)."""
        ...


class GitHubChange:
    def __init__(self, api_url: str, token: str, repository: str, pr: int, approvals: int = 1) -> None:
        if not token:
            raise BadInput("no GitHub token: set GITHUB_TOKEN")
        if not re.fullmatch(r"[\w.-]+/[\w.-]+", repository):
            raise BadInput(f"GitHub repository {repository!r} is not OWNER/NAME (--github-repo or GITHUB_REPOSITORY)")
        self.http = Http(api_url, f"Bearer {token}")
        self.repo, self.pr, self.approvals = repository, pr, approvals

    def _pages(self, path: str, query: str = "") -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        url: str | None = f"{path}?{query + '&' if query else ''}per_page=100"
        while url:
            page, headers = self.http.call("GET", url)
            items += [i for i in page or () if isinstance(i, dict)]
            found = _NEXT.search(headers.get("link", ""))
            url = found.group(1) if found else None
        return items

    def approved(self, branch: str) -> Approved:
        pr, _ = self.http.call("GET", f"/repos/{self.repo}/pulls/{self.pr}")
        if not isinstance(pr, dict):
            raise RemoteError(f"GitHub: pull request #{self.pr} is not an object", reason="FORGE_REFUSED")
        label = f"pull request #{self.pr}"
        if pr.get("merged") or pr.get("state") != "open":
            raise NotApproved(f"{label} is {'merged' if pr.get('merged') else pr.get('state')}, not open")
        if pr.get("draft"):
            raise NotApproved(f"{label} is a draft")
        base = str((pr.get("base") or {}).get("ref") or "")
        if base != branch:
            raise NotApproved(f"{label} is for branch {one_line(base, 80)!r}, not {branch!r}")
        head = _sha((pr.get("head") or {}).get("sha"), "pull request head")
        author = str((pr.get("user") or {}).get("login") or "")
        # Each reviewer's last verdict counts (reviews come oldest first); a comment is no verdict.
        last: dict[str, tuple[str, str]] = {}
        for r in self._pages(f"/repos/{self.repo}/pulls/{self.pr}/reviews"):
            state = str(r.get("state") or "")
            login = str((r.get("user") or {}).get("login") or "")
            if state in ("APPROVED", "CHANGES_REQUESTED", "DISMISSED") and _LOGIN.fullmatch(login):
                last[login] = (state, str(r.get("commit_id") or ""))
        # Anyone who can read the repository can submit a review (on a public one, anyone at all):
        # only a verdict of someone who may write to it counts, as in GitHub's branch protection;
        # never the author's own, nor a bot's.
        last = {u: v for u, v in last.items() if u != author and not u.endswith("[bot]") and self._may_write(u)}
        blocking = sorted(u for u, (s, _) in last.items() if s == "CHANGES_REQUESTED")
        if blocking:
            raise NotApproved(f"{label}: changes requested by {', '.join(blocking)}")
        current = sorted(u for u, (s, c) in last.items() if s == "APPROVED" and c == head)
        stale = sorted(u for u, (s, c) in last.items() if s == "APPROVED" and c != head)
        if len(current) < self.approvals:
            more = f" ({', '.join(stale)} approved an earlier push)" if stale else ""
            raise NotApproved(f"{label}: {len(current)} of {self.approvals} approvals on its head "
                              f"{head[:12]}{more}")
        return Approved(label, one_line(pr.get("title") or ""), one_line(pr.get("html_url") or "", 300), branch,
                        head, f"refs/pull/{self.pr}/head", tuple(current))

    def _may_write(self, login: str) -> bool:
        answer, _ = self.http.call("GET", f"/repos/{self.repo}/collaborators/{login}/permission")
        return isinstance(answer, dict) and answer.get("permission") in ("admin", "write")

    def open_changes(self, branch: str) -> list[int]:
        """The open pull requests for ``branch``, oldest first (what a sweep tries to merge)."""
        pulls = self._pages(f"/repos/{self.repo}/pulls", f"state=open&base={urllib.parse.quote(branch, safe='')}")
        return sorted(int(p["number"]) for p in pulls if isinstance(p.get("number"), int))

    def reported(self, marker: str) -> bool:
        comments = self._pages(f"/repos/{self.repo}/issues/{self.pr}/comments")
        return any(marker in str(c.get("body", "")) for c in comments)

    def report(self, approved: Approved, text: str) -> str:
        self.http.call("POST", f"/repos/{self.repo}/issues/{self.pr}/comments", {"body": text})
        return f"commented on {self.repo}#{self.pr}"


class GerritChange:
    def __init__(self, url: str, user: str, password: str, change: str) -> None:
        if not user or not password:
            raise BadInput("no Gerrit credentials: set GERRIT_USER and GERRIT_PASSWORD (an HTTP password)")
        if not change:
            raise BadInput("give --change (or GERRIT_CHANGE_NUMBER)")
        basic = base64.b64encode(f"{user}:{password}".encode()).decode()
        self.http = Http(url, f"Basic {basic}", strip=")]}'")
        self.base = url.rstrip("/")
        self.change = urllib.parse.quote(change, safe="%~")
        self.revision = ""

    def approved(self, branch: str) -> Approved:
        c, _ = self.http.call("GET", f"/a/changes/{self.change}?o=CURRENT_REVISION&o=DETAILED_LABELS&o=SUBMITTABLE")
        if not isinstance(c, dict):
            raise RemoteError(f"Gerrit: change {self.change} is not an object", reason="FORGE_REFUSED")
        label = f"change {one_line(c.get('_number') or self.change, 40)}"
        if c.get("status") != "NEW":
            raise NotApproved(f"{label} is {one_line(c.get('status'), 40)}, not open")
        if c.get("branch") != branch:
            raise NotApproved(f"{label} is for branch {one_line(c.get('branch'), 80)!r}, not {branch!r}")
        sha = _sha(c.get("current_revision"), "current revision")
        ref = str(((c.get("revisions") or {}).get(sha) or {}).get("ref") or "")
        if not _GERRIT_REF.fullmatch(ref):
            raise RemoteError(f"Gerrit: the patch set's ref {one_line(ref, 80)!r} is not refs/changes/NN/N/N",
                              reason="FORGE_REFUSED")
        review = (c.get("labels") or {}).get("Code-Review") or {}
        if review.get("rejected"):
            raise NotApproved(f"{label}: Code-Review vetoed by {_who(review['rejected'])}")
        if not review.get("approved"):
            raise NotApproved(f"{label}: no Code-Review approval on patch set {sha[:12]}")
        if c.get("submittable") is not True:  # absent: the server did not evaluate its submit requirements
            raise NotApproved(f"{label}: Gerrit says it is not submittable (a required label is missing)")
        best = max((int(a.get("value") or 0) for a in review.get("all") or () if isinstance(a, dict)), default=0)
        names = tuple(sorted({_who(a) for a in review.get("all") or ()
                              if isinstance(a, dict) and best > 0 and int(a.get("value") or 0) == best}))
        self.revision = sha
        return Approved(label, one_line(c.get("subject") or ""), f"{self.base}/c/{one_line(c.get('_number'), 20)}",
                        branch, sha, ref, names or (_who(review["approved"]),))

    def reported(self, marker: str) -> bool:
        messages, _ = self.http.call("GET", f"/a/changes/{self.change}/messages")
        return any(marker in str(m.get("message", "")) for m in messages or () if isinstance(m, dict))

    def report(self, approved: Approved, text: str) -> str:
        self.http.call("POST", f"/a/changes/{self.change}/revisions/{approved.sha}/review",
                       {"message": text, "tag": "autogenerated:reconciler"})
        return f"reported on change {self.change}"


def _who(account: object) -> str:
    if not isinstance(account, dict):
        return "?"
    name, email = account.get("name") or account.get("username") or "?", account.get("email")
    return one_line(f"{name} <{email}>" if email else name, 120)
