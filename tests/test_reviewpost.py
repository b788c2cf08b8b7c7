"""The review bot against a real local HTTP server that plays the forge and records every
request: the exact API calls, the comment edited in place, the vote on a broken change, a huge
diff cut with its link, and no secret in anything posted.

GitHub's comment list is served two per page (Link: rel="next"), so finding the bot's comment
again reads every page.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from conftest import Deployment, git
from ports import serving
from test_review import long_files

TOKEN = "ghp_s3cr3t-token-value"
PASSWORD = "gerrit-http-p4ssword"


@dataclass
class Forge:
    """What the fake forge holds (the PR's comments) and every request it got."""

    url: str = ""
    comments: list[dict[str, Any]] = field(default_factory=list)
    requests: list[tuple[str, str, dict[str, Any] | None, dict[str, str]]] = field(default_factory=list)

    def calls(self) -> list[tuple[str, str]]:
        return [(m, p) for m, p, _, _ in self.requests]

    def bodies(self) -> str:
        return json.dumps([b for _, _, b, _ in self.requests])


@pytest.fixture
def forge() -> Iterator[Forge]:
    state = Forge(comments=[{"id": 1, "body": "LGTM"}, {"id": 2, "body": "please add a test"},
                            {"id": 3, "body": "ok"}])

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def answer(self, code: int, data: Any, headers: dict[str, str] | None = None, prefix: str = "") -> None:
            raw = (prefix + json.dumps(data)).encode()
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def handle_any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            state.requests.append((self.command, self.path, body, dict(self.headers)))
            parts = urlsplit(self.path)
            if parts.path.endswith("/issues/7/comments") and self.command == "GET":
                page = int(parse_qs(parts.query).get("page", ["1"])[0])
                items = state.comments[(page - 1) * 2: page * 2]
                more = len(state.comments) > page * 2
                link = {"Link": f'<{state.url}{parts.path}?per_page=100&page={page + 1}>; rel="next"'} if more else {}
                return self.answer(200, items, link)
            if parts.path.endswith("/issues/7/comments") and self.command == "POST":
                new = {"id": 100 + len(state.comments), "body": body["body"]}  # type: ignore[index]
                state.comments.append(new)
                return self.answer(201, new)
            if "/issues/comments/" in parts.path and self.command == "PATCH":
                cid = int(parts.path.rsplit("/", 1)[1])
                for c in state.comments:
                    if c["id"] == cid:
                        c["body"] = body["body"]  # type: ignore[index]
                return self.answer(200, {"id": cid})
            if "/statuses/" in parts.path:
                return self.answer(201, body)
            if parts.path.startswith("/a/changes/"):
                return self.answer(200, {"labels": (body or {}).get("labels", {})}, prefix=")]}'\n")
            return self.answer(404, {"message": "Not Found"})

        do_GET = do_POST = do_PATCH = handle_any

    with serving(Handler) as state.url:
        yield state


def post(deployment: Deployment, forge: Forge, which: str, base: str, head: str,
         *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GITHUB_TOKEN": TOKEN, "GITHUB_API_URL": forge.url, "GITHUB_REPOSITORY": "ops/cloud",
           "GERRIT_URL": forge.url, "GERRIT_USER": "reconciler-bot", "GERRIT_PASSWORD": PASSWORD}
    args = ["--pr", "7"] if which == "github" else ["--change", "ops/cloud~1234", "--revision", head]
    return subprocess.run([sys.executable, "-m", "reconciler", "review-post", "--forge", which, "--repo",
                           str(deployment.work), *args, *extra, base, head], capture_output=True, text=True,
                          env=env, timeout=120)


def change(deployment: Deployment) -> tuple[str, str]:
    base = git("rev-parse", "HEAD", cwd=deployment.work)
    deployment.edit("inventory.yaml", "token_ttl: 3600", "token_ttl: 600")
    return base, deployment.commit("shorter tokens")


def test_github_posts_one_comment_then_edits_it_in_place_with_a_status_per_changed_group(
    deployment: Deployment, forge: Forge
) -> None:
    base, head = change(deployment)
    first = post(deployment, forge, "github", base, head)
    assert first.returncode == 0, first.stderr
    statuses = [("POST", f"/repos/ops/cloud/statuses/{head}")] * 3  # validate, controllers, monitoring
    assert forge.calls() == [
        ("GET", "/repos/ops/cloud/issues/7/comments?per_page=100"),
        ("GET", "/repos/ops/cloud/issues/7/comments?per_page=100&page=2"),
        ("POST", "/repos/ops/cloud/issues/7/comments"),
        *statuses]
    posted = forge.requests[2][2] or {}
    assert posted["body"].startswith("<!-- reconciler-diff -->\n### reconciler diff")
    assert "- **identity** on group controllers (3): **reload**" in posted["body"]
    assert [(b or {})["context"] for _, _, b, _ in forge.requests[3:]] == [
        "reconciler/validate", "reconciler/controllers", "reconciler/monitoring"]
    assert {(b or {})["state"] for _, _, b, _ in forge.requests[3:]} == {"success"}
    assert (forge.requests[4][2] or {})["description"] == "3 of 3 nodes change: 3 reload"
    assert forge.requests[0][3]["Authorization"] == f"Bearer {TOKEN}"

    # A new push to the same PR: the bot's comment (on page 2) is found again and edited.
    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    head2 = deployment.commit("and kvm")
    forge.requests.clear()
    second = post(deployment, forge, "github", base, head2)
    assert second.returncode == 0, second.stderr
    assert forge.calls()[:3] == [
        ("GET", "/repos/ops/cloud/issues/7/comments?per_page=100"),
        ("GET", "/repos/ops/cloud/issues/7/comments?per_page=100&page=2"),
        ("PATCH", "/repos/ops/cloud/issues/comments/103")]
    assert [c["id"] for c in forge.comments] == [1, 2, 3, 103]  # no second bot comment
    assert "**compute-agent** on group computes (2): **restart**" in forge.comments[-1]["body"]
    assert TOKEN not in forge.bodies() and TOKEN not in second.stdout + second.stderr


def test_a_change_that_does_not_validate_fails_its_status_and_votes_verified_minus_1(
    deployment: Deployment, forge: Forge
) -> None:
    base = git("rev-parse", "HEAD", cwd=deployment.work)
    deployment.edit("services/db/service.yaml", "action: reload", "action: bounce")
    head = deployment.commit("db: an action that does not exist")

    gh = post(deployment, forge, "github", base, head)
    assert gh.returncode == 1, gh.stderr
    assert forge.calls()[-1] == ("POST", f"/repos/ops/cloud/statuses/{head}")
    assert forge.requests[-1][2] == {"state": "failure", "context": "reconciler/validate",
                                     "description": "validate failed"}
    comment = forge.comments[-1]["body"]
    assert "does not validate" in comment and "services/db/service.yaml:" in comment and "'bounce'" in comment

    forge.requests.clear()
    gerrit = post(deployment, forge, "gerrit", base, head)
    assert gerrit.returncode == 1, gerrit.stderr
    assert forge.calls() == [("POST", f"/a/changes/ops%2Fcloud~1234/revisions/{head}/review")]
    sent = forge.requests[0][2] or {}
    assert sent["labels"] == {"Verified": -1} and "'bounce' is not one of" in sent["message"]
    assert forge.requests[0][3]["Authorization"].startswith("Basic ")
    assert PASSWORD not in forge.bodies() and "with Verified -1" in gerrit.stdout


def test_gerrit_gets_a_huge_diff_cut_to_its_limit_with_the_artifact_link(
    deployment: Deployment, forge: Forge, tmp_path: Path
) -> None:
    base = git("rev-parse", "HEAD", cwd=deployment.work)
    head = long_files(deployment)
    report = tmp_path / "diff.md"
    proc = post(deployment, forge, "gerrit", base, head, "--artifact-url", "https://zuul.example.org/b/9/diff.md",
                "--report-file", str(report))
    assert proc.returncode == 0, proc.stderr
    [(method, path, sent, _)] = forge.requests
    message = (sent or {})["message"]
    assert "labels" not in (sent or {})  # it validates: no negative vote
    assert len(message.encode()) <= 16000 < len(report.read_text().encode())
    assert message.rstrip().endswith("the full report is at https://zuul.example.org/b/9/diff.md")
    assert PASSWORD not in forge.bodies()


def test_a_report_file_that_cannot_be_written_stops_the_bot_before_it_posts(
    deployment: Deployment, forge: Forge, tmp_path: Path
) -> None:
    base, head = change(deployment)
    proc = post(deployment, forge, "github", base, head, "--report-file", str(tmp_path))
    assert (proc.returncode, proc.stderr) == (2, f"error: --report-file {tmp_path}: a directory, not a file [BAD_INPUT]\n")
    assert forge.requests == []  # no comment pointing at an artifact that was never written
