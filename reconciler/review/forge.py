"""Post a review to the forge where operators vote: one comment (the diff) and a verdict.

One interface, ``Forge.post(Review)``, two faces:
- ``GitHub``: the pull request's comment carrying ``MARKER`` is found again (REST, paginated)
  and edited in place, else created; a commit status per changed node group
  (``reconciler/<group>``) and one for validation (``reconciler/validate``).
- ``Gerrit``: one review on the patch set, the markdown as its message, ``Verified -1`` when
  validation fails.

Secrets (a token, a password) go in the Authorization header only: never in a body, a URL, an
error message. HTTP through the standard library: two JSON calls need no client library.
"""

from __future__ import annotations

import base64
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Protocol

from reconciler.core.errors import BadInput, RemoteError
from reconciler.source.gitrun import safe_url

MARKER = "<!-- reconciler-diff -->"
GITHUB_LIMIT = 65536  # characters in an issue comment
GERRIT_LIMIT = 16000  # a common change.maxMessageLength... set lower by many sites: --max-bytes
TIMEOUT = 30.0


@dataclass(frozen=True)
class GroupStatus:
    group: str
    ok: bool
    description: str  # what changes there, one line ("3 nodes: 3 reload")


@dataclass(frozen=True)
class Review:
    """What the bot says about one commit: the comment, whether it validates, per group."""

    sha: str
    body: str  # markdown, already cut to the forge's limit
    valid: bool
    groups: tuple[GroupStatus, ...] = ()


class Forge(Protocol):
    limit: int  # the most bytes a comment may hold, the marker included

    def post(self, review: Review) -> list[str]:
        """Post ``review``; what was done, one line each (for the log)."""
        ...


class Http:
    """JSON over HTTP with one Authorization header; failures as ``RemoteError``."""

    def __init__(self, base: str, authorization: str, strip: str = "") -> None:
        if not base.startswith(("http://", "https://")):
            raise BadInput(f"forge URL {safe_url(base)!r} is not http(s)://")
        self.base = base.rstrip("/")
        self.authorization = authorization
        self.strip = strip  # Gerrit's XSSI guard before every JSON body

    def call(self, method: str, path: str, data: Any = None) -> tuple[Any, dict[str, str]]:
        url = path if path.startswith(("http://", "https://")) else self.base + path
        if not url.startswith(self.base + "/"):
            # An absolute URL comes from an answer (a Link: next): the credentials go with every
            # request, so never to a host the answer names.
            raise RemoteError(f"{method} {safe_url(url)}: not under {safe_url(self.base)}", reason="FORGE_REFUSED")
        body = None if data is None else json.dumps(data).encode()
        req = urllib.request.Request(url, body, method=method, headers={
            "Authorization": self.authorization, "Accept": "application/json",
            "Content-Type": "application/json", "User-Agent": "reconciler-review-bot"})
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
                text = resp.read().decode()
                headers = {k.lower(): v for k, v in resp.headers.items()}
        except urllib.error.HTTPError as exc:
            raise RemoteError(f"{method} {safe_url(url)}: HTTP {exc.code} {exc.reason}",
                              reason="FORGE_REFUSED") from None
        except (urllib.error.URLError, OSError) as exc:
            why = getattr(exc, "reason", exc)
            raise RemoteError(f"{method} {safe_url(url)}: {why}", reason="FORGE_UNREACHABLE") from None
        text = text.removeprefix(self.strip).strip() if self.strip else text.strip()
        try:
            return (json.loads(text) if text else None), headers
        except json.JSONDecodeError:
            raise RemoteError(f"{method} {safe_url(url)}: the answer is not JSON", reason="FORGE_REFUSED") from None


_NEXT = re.compile(r'<([^>]+)>;\s*rel="next"')


class GitHub:
    limit = GITHUB_LIMIT

    def __init__(self, api_url: str, token: str, repository: str, pr: int) -> None:
        if not token:
            raise BadInput("no GitHub token: set GITHUB_TOKEN")
        if not re.fullmatch(r"[\w.-]+/[\w.-]+", repository):
            raise BadInput(f"GitHub repository {repository!r} is not OWNER/NAME (--github-repo or GITHUB_REPOSITORY)")
        self.http = Http(api_url, f"Bearer {token}")
        self.repo = repository
        self.pr = pr

    def _ours(self) -> int | None:
        """The id of the comment that carries the marker, reading every page."""
        url: str | None = f"/repos/{self.repo}/issues/{self.pr}/comments?per_page=100"
        while url:
            page, headers = self.http.call("GET", url)
            for c in page or ():
                if MARKER in str(c.get("body", "")):
                    return int(c["id"])
            found = _NEXT.search(headers.get("link", ""))
            url = found.group(1) if found else None
        return None

    def post(self, review: Review) -> list[str]:
        body = f"{MARKER}\n{review.body}"
        done = []
        found = self._ours()
        if found is None:
            self.http.call("POST", f"/repos/{self.repo}/issues/{self.pr}/comments", {"body": body})
            done.append(f"commented on {self.repo}#{self.pr}")
        else:
            self.http.call("PATCH", f"/repos/{self.repo}/issues/comments/{found}", {"body": body})
            done.append(f"updated comment {found} on {self.repo}#{self.pr}")
        statuses = [GroupStatus("validate", review.valid, "every node renders" if review.valid else "validate failed")]
        for g in (*statuses, *review.groups):
            self.http.call("POST", f"/repos/{self.repo}/statuses/{review.sha}", {
                "state": "success" if g.ok else "failure", "context": f"reconciler/{g.group}",
                "description": g.description[:140]})  # GitHub's limit for a description
            done.append(f"status reconciler/{g.group}: {'success' if g.ok else 'failure'}")
        return done


class Gerrit:
    limit = GERRIT_LIMIT

    def __init__(self, url: str, user: str, password: str, change: str, revision: str) -> None:
        if not user or not password:
            raise BadInput("no Gerrit credentials: set GERRIT_USER and GERRIT_PASSWORD (an HTTP password)")
        if not change or not revision:
            raise BadInput("give --change and --revision (or GERRIT_CHANGE_NUMBER and GERRIT_PATCHSET_REVISION)")
        basic = base64.b64encode(f"{user}:{password}".encode()).decode()
        self.http = Http(url, f"Basic {basic}", strip=")]}'")
        self.change = urllib.parse.quote(change, safe="%~")  # "ops/cloud~1234" and its encoded form alike
        self.revision = urllib.parse.quote(revision, safe="")

    def post(self, review: Review) -> list[str]:
        data: dict[str, Any] = {"message": f"{MARKER}\n{review.body}", "tag": "autogenerated:reconciler"}
        if not review.valid:
            data["labels"] = {"Verified": -1}
        self.http.call("POST", f"/a/changes/{self.change}/revisions/{self.revision}/review", data)
        return [f"reviewed change {self.change} revision {self.revision}"
                + ("" if review.valid else " with Verified -1")]
