"""The merge bot (`reconciler merge`) against a real local HTTP server that plays GitHub's and
Gerrit's REST APIs and records every request, with real git remotes (the nodes' server, the
forge's git holding the change's ref) and real SSH signatures: an approved change becomes a
merge signed by the merge key that a node applies; anything short of an approval of the exact
commit, a clean merge that validates and that the nodes' gate accepts, pushes nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from conftest import ROOT, Deployment, SigningKey, free_port, git, make_key, small_deployment
from ports import serving
from test_crash_points import APP, SERVICE, inventory

from reconciler.agent import Agent
from reconciler.settings import TrustConfig

TOKEN = "ghp_merge-bot-s3cr3t"
PASSWORD = "gerrit-http-p4ssword"
GERRIT_REF = "refs/changes/34/1234/2"


@dataclass
class Forge:
    """What the fake forge says about pull request 7 (and any other in ``others``) and change
    1234, who may write to the repository, and every request it got. With ``closes_from`` (the
    forge's git), a pull request whose head that git's main holds is merged, as GitHub says."""

    url: str = ""
    pr: dict[str, Any] = field(default_factory=dict)
    reviews: list[dict[str, Any]] = field(default_factory=list)
    comments: list[dict[str, Any]] = field(default_factory=list)
    others: dict[int, tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]] = field(default_factory=dict)
    writers: set[str] = field(default_factory=lambda: {"alice", "bob", "carol"})
    closes_from: Path | None = None
    change: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)
    requests: list[tuple[str, str, Any, dict[str, str]]] = field(default_factory=list)

    def calls(self) -> list[tuple[str, str]]:
        return [(m, urlsplit(p).path) for m, p, _, _ in self.requests]

    def posted(self) -> list[Any]:
        return [b for m, _, b, _ in self.requests if m == "POST"]

    def pulls(self) -> dict[int, tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]]:
        pr = dict(self.pr)
        if self.closes_from is not None and pr and subprocess.run(
                ["git", "--git-dir", str(self.closes_from), "merge-base", "--is-ancestor", pr["head"]["sha"], "main"],
                capture_output=True).returncode == 0:
            pr.update(state="closed", merged=True)
        return {7: (pr, self.reviews, self.comments), **self.others}


@pytest.fixture
def forge() -> Iterator[Forge]:
    state = Forge()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def answer(self, data: Any, code: int = 200, prefix: str = "") -> None:
            raw = (prefix + json.dumps(data)).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def handle_any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body: dict[str, Any] = json.loads(self.rfile.read(length)) if length else {}
            state.requests.append((self.command, self.path, body, dict(self.headers)))
            path, get = urlsplit(self.path).path, self.command == "GET"
            gerrit = ")]}'\n"
            pulls = state.pulls()
            github: dict[str, Any] = {"/repos/ops/cloud/pulls": [p for p, _, _ in pulls.values() if p.get("state") == "open"]}
            for n, (pr, reviews, comments) in pulls.items():
                github |= {f"/repos/ops/cloud/pulls/{n}": pr, f"/repos/ops/cloud/pulls/{n}/reviews": reviews,
                           f"/repos/ops/cloud/issues/{n}/comments": comments}
            who = path.removeprefix("/repos/ops/cloud/collaborators/").removesuffix("/permission")
            if get and path.startswith("/repos/ops/cloud/collaborators/"):
                return self.answer({"permission": "write" if who in state.writers else "read"})
            if get and path in github:
                return self.answer(github[path])
            if not get and path in github and "/issues/" in path:
                github[path].append({"id": len(github[path]) + 1, **body})
                return self.answer(github[path][-1], 201)
            if path == "/a/changes/1234" and get:
                return self.answer(state.change, prefix=gerrit)
            if path == "/a/changes/1234/messages" and get:
                return self.answer(state.messages, prefix=gerrit)
            if path.startswith("/a/changes/1234/revisions/") and path.endswith("/review") and not get:
                state.messages.append({"message": body["message"], "tag": body.get("tag")})
                return self.answer({}, prefix=gerrit)
            return self.answer({"message": "Not Found"}, 404)

        do_GET = do_POST = handle_any

    with serving(Handler) as state.url:
        yield state


@dataclass
class World:
    """The nodes' git server (``dep.bare``), the forge's git holding the change's refs, the
    contributor's change (unsigned: the signed merge vouches for it), the bot's clone."""

    dep: Deployment
    forge_git: Path
    bot: Path
    key: SigningKey
    ports: dict[str, int]
    change: str = ""


def _files(ports: dict[str, int], key: SigningKey) -> dict[str, str]:
    return {
        "reconciler.yaml": "format: 1\nname: merge\n",
        "trust/allowed_signers": key.allowed_signers.read_text(),  # as `reconciler init` writes it
        "inventory.yaml": inventory({"value": "a", "level": "info", "mode": "plain"}, ports),
        "services/web/service.yaml": SERVICE, "services/api/service.yaml": SERVICE,
        "services/web/templates/app.conf.j2": "[app]\nvalue = {{ values[service] }}\nlevel = {{ levels[service] }}\n",
        "services/api/templates/app.conf.j2": "[app]\nvalue = {{ values[service] }}\nlevel = {{ levels[service] }}\n",
        "services/web/files/app.py": APP, "services/api/files/app.py": APP,
    }


def contribute(world: World, rel: str, old: str, new: str, message: str, base: str = "refs/heads/main") -> str:
    """A contributor's change on top of ``base`` (of the forge's git), unsigned, pushed as the
    pull request's and the Gerrit change's refs."""
    work = world.forge_git.parent / "contrib"
    if not work.exists():
        git("clone", "-q", str(world.forge_git), str(work))
    git("fetch", "-q", "origin", f"+{base}:refs/tmp/base", cwd=work)
    git("checkout", "-q", "--detach", "refs/tmp/base", cwd=work)
    text = (work / rel).read_text()
    assert old in text
    (work / rel).write_text(text.replace(old, new, 1))
    git("commit", "-qam", message, cwd=work)
    sha = git("rev-parse", "HEAD", cwd=work)
    git("push", "-q", "--force", "origin", "HEAD:refs/pull/7/head", f"HEAD:{GERRIT_REF}", cwd=work)
    world.change = sha
    return sha


@pytest.fixture
def world(tmp_path: Path, merge_key: SigningKey, forge: Forge) -> World:
    ports = {"web": free_port(), "api": free_port()}
    dep = small_deployment(tmp_path, merge_key, _files(ports, merge_key))
    forge_git = tmp_path / "forge" / "cloud.git"
    forge_git.parent.mkdir()
    git("clone", "-q", "--bare", str(dep.bare), str(forge_git))
    bot = tmp_path / "bot"
    git("clone", "-q", str(dep.bare), str(bot))
    w = World(dep, forge_git, bot, merge_key, ports)
    sha = contribute(w, "inventory.yaml", "web: a", "web: b", "web says b")
    approve_on_github(forge, sha)
    return w


def approve_on_github(forge: Forge, head: str, *reviews: tuple[str, str, str]) -> None:
    forge.pr = {"number": 7, "state": "open", "draft": False, "merged": False, "title": "web says b",
                "html_url": "https://github.example/ops/cloud/pull/7", "base": {"ref": "main"},
                "head": {"sha": head, "ref": "feature"}, "user": {"login": "carol"}}
    forge.reviews = [{"id": i, "user": {"login": who}, "state": state, "commit_id": commit}
                     for i, (who, state, commit) in enumerate(reviews or (("alice", "APPROVED", head),))]


def _env(forge: Forge, **extra: str) -> dict[str, str]:
    return {**os.environ, "GITHUB_TOKEN": TOKEN, "GITHUB_API_URL": forge.url, "GITHUB_REPOSITORY": "ops/cloud",
            "GERRIT_URL": forge.url, "GERRIT_USER": "reconciler-bot", "GERRIT_PASSWORD": PASSWORD, **extra}


def merge(world: World, forge: Forge, *extra: str, which: str = "github", key: SigningKey | None = None,
          env: dict[str, str] | None = None, pr: int | None = 7,
          allowed: Path | None = None) -> subprocess.CompletedProcess[str]:
    key = key or world.key
    args = ([] if pr is None else ["--pr", str(pr)]) if which == "github" else ["--change", "1234"]
    return subprocess.run(
        [sys.executable, "-m", "reconciler", "merge", "--forge", which, *args, "--repo", str(world.bot),
         "--remote", world.dep.url, "--forge-git", f"file://{world.forge_git}", "--signing-key", str(key.key),
         "--name", "Merge Bot", "--email", "merge@example.org",
         "--allowed-signers", str(allowed or world.key.allowed_signers),
         "--policy", "first-parent", *extra],
        capture_output=True, text=True, timeout=120, env=_env(forge, **(env or {})))


def main_of(world: World) -> str:
    return git("--git-dir", str(world.dep.bare), "rev-parse", "refs/heads/main")


def test_an_approved_pull_request_becomes_a_signed_merge_that_a_node_applies(
        world: World, forge: Forge, agents: Callable[..., Agent]) -> None:
    before = main_of(world)
    done = merge(world, forge)
    assert done.returncode == 0, done.stderr
    head = main_of(world)
    assert f"pull request #7 merged as {head} into main" in done.stdout
    # The merge: the branch's head and exactly the approved commit, bound to main, naming the change.
    parents = git("--git-dir", str(world.dep.bare), "rev-list", "--parents", "-n1", head).split()[1:]
    assert parents == [before, world.change]
    message = git("--git-dir", str(world.dep.bare), "log", "-1", "--format=%B", head)
    assert message.startswith("Merge pull request #7: web says b\n")
    assert "Reconciler-Branch: main\nReconciler-Change: https://github.example/ops/cloud/pull/7\n" \
           "Reviewed-by: alice" in message
    # The forge was asked, then told; the token went in the header only.
    assert forge.calls() == [("GET", "/repos/ops/cloud/pulls/7"), ("GET", "/repos/ops/cloud/pulls/7/reviews"),
                             ("GET", "/repos/ops/cloud/collaborators/alice/permission"),
                             ("GET", "/repos/ops/cloud/issues/7/comments"),
                             ("POST", "/repos/ops/cloud/issues/7/comments")]
    assert f"<!-- reconciler-merge {head} -->" in forge.comments[0]["body"]
    assert all(r[3]["Authorization"] == f"Bearer {TOKEN}" for r in forge.requests)
    assert TOKEN not in json.dumps(forge.posted()) + done.stdout + done.stderr
    # A node that trusts only the merge key (first-parent policy) applies it.
    node = agents("n1", world.dep.url, TrustConfig(allowed_signers=world.key.allowed_signers, policy="first-parent"))
    node.reconcile_once()
    note = world.dep.note("n1", head)
    assert note is not None and note["state"] == "applied", note
    assert note["signer"]["principal"] == "merge@example.org"  # type: ignore[index]


def test_an_approval_of_an_earlier_push_merges_nothing(world: World, forge: Forge) -> None:
    first = world.change
    second = contribute(world, "inventory.yaml", "api: one", "api: two", "api says two", base="refs/pull/7/head")
    approve_on_github(forge, second, ("alice", "APPROVED", first))
    before = main_of(world)
    done = merge(world, forge)
    assert done.returncode == 3, done.stderr
    assert "0 of 1 approvals on its head" in done.stderr and "alice approved an earlier push" in done.stderr
    assert main_of(world) == before and not forge.comments


def test_changes_requested_after_an_approval_block_the_merge(world: World, forge: Forge) -> None:
    approve_on_github(forge, world.change, ("alice", "APPROVED", world.change),
                      ("bob", "COMMENTED", world.change), ("bob", "CHANGES_REQUESTED", world.change))
    done = merge(world, forge)
    assert done.returncode == 3 and "changes requested by bob" in done.stderr, done.stderr
    # ...until bob approves too: his last verdict counts.
    forge.reviews.append({"id": 9, "user": {"login": "bob"}, "state": "APPROVED", "commit_id": world.change})
    again = merge(world, forge, "--approvals", "2")
    assert again.returncode == 0, again.stderr
    assert "Reviewed-by: alice\nReviewed-by: bob" in git("--git-dir", str(world.dep.bare), "log", "-1", "--format=%B")


def test_a_ref_moved_after_the_approval_is_refused(world: World, forge: Forge) -> None:
    approved = world.change
    contribute(world, "inventory.yaml", "api: one", "api: sneaky", "after review", base="refs/pull/7/head")
    approve_on_github(forge, approved)  # the forge still says the approved commit is the head
    before = main_of(world)
    done = merge(world, forge)
    assert done.returncode == 2, done.stderr
    assert f"the forge approved {approved[:12]} (pushed after the approval?)" in done.stderr
    assert main_of(world) == before and not forge.comments


def test_conflicts_an_invalid_merge_and_an_untrusted_key_push_nothing(
        world: World, forge: Forge, tmp_path: Path) -> None:
    before = main_of(world)
    # The branch moved under the change: both edit the same line.
    world.dep.edit("inventory.yaml", "web: a", "web: c")
    moved = world.dep.commit("web says c")
    git("--git-dir", str(world.forge_git), "fetch", "-q", str(world.dep.bare), "+main:main")  # the forge follows
    done = merge(world, forge)
    assert done.returncode == 2 and "conflicts with main in inventory.yaml" in done.stderr, done.stderr
    assert main_of(world) == moved
    # A change that breaks the repo: validation refuses the merge.
    broken = contribute(world, "services/web/templates/app.conf.j2", "{{ levels[service] }}", "{{ nosuch }}",
                        "typo", base="refs/heads/main")
    approve_on_github(forge, broken)
    done = merge(world, forge)
    assert done.returncode == 2 and "the merge does not validate" in done.stderr and "nosuch" in done.stderr
    # A bot whose key the nodes do not trust: the gate says so before any push.
    good = contribute(world, "inventory.yaml", "api: one", "api: two", "api says two", base="refs/heads/main")
    approve_on_github(forge, good)
    stray = make_key(tmp_path / "stray", "stray")
    done = merge(world, forge, key=stray)
    assert done.returncode == 2 and "the nodes would refuse the merge (UNTRUSTED_KEY)" in done.stderr, done.stderr
    assert main_of(world) == moved != before and not forge.comments


def test_a_branch_that_moves_during_the_push_is_merged_again_onto_its_new_head(
        world: World, forge: Forge, tmp_path: Path) -> None:
    # Another merge lands on the nodes' server just as the bot pushes (its pre-push hook, once).
    once = tmp_path / "moved-once"
    other = tmp_path / "other"
    git("clone", "-q", str(world.dep.bare), str(other))
    (other / "NOTES.md").write_text("unrelated\n")
    git("add", "NOTES.md", cwd=other)
    git("-c", "gpg.format=ssh", "-c", f"user.signingkey={world.key.key}", "commit", "-qS", "-m", "notes",
        "--trailer", "Reconciler-Branch: main", cwd=other)
    hook = world.bot / ".git" / "hooks" / "pre-push"
    hook.write_text(f"#!/bin/sh\n[ -e {once} ] && exit 0\ntouch {once}\nunset GIT_DIR GIT_WORK_TREE GIT_INDEX_FILE\n"
                    f"git -C {other} push -q origin HEAD:refs/heads/main >/dev/null 2>&1\nexit 0\n")
    hook.chmod(0o755)
    done = merge(world, forge)
    assert done.returncode == 0, done.stderr
    head = main_of(world)
    parents = git("--git-dir", str(world.dep.bare), "rev-list", "--parents", "-n1", head).split()[1:]
    assert parents == [git("rev-parse", "HEAD", cwd=other), world.change]
    assert len(forge.comments) == 1


def test_a_merge_killed_at_every_side_effect_is_finished_by_the_next_run_merged_and_reported_once(
        world: World, forge: Forge, tmp_path: Path) -> None:
    """With the merge pushed to the forge too (--also-push), as the recipes do: once the forge's
    branch holds it, the forge says the pull request is merged, no longer open."""
    forge.closes_from = world.forge_git
    also = ["--also-push", f"file://{world.forge_git}"]
    log = tmp_path / "points"
    start = main_of(world)
    counted = merge(world, forge, *also, "--dry-run", env={"RECONCILER_FAULT_LOG": str(log)})
    assert counted.returncode == 0, counted.stderr
    assert main_of(world) == start and not forge.comments  # a dry run pushes and posts nothing
    assert [line.split()[1] for line in log.read_text().splitlines()] == ["fetch", "fetch", "commit"]
    points = ["fetch", "fetch", "commit", "push", "report", "push"]
    n = 0
    for n, kind in enumerate(points, start=1):
        for bare in (world.dep.bare, world.forge_git):
            git("--git-dir", str(bare), "update-ref", "refs/heads/main", start)
        forge.comments.clear()
        killed = merge(world, forge, *also, env={"RECONCILER_FAULT_AT": str(n)})
        assert killed.returncode == -9, f"not killed at side effect {n} ({kind}): {killed.stderr}"
        again = merge(world, forge, *also)
        what = f"killed before side effect {n} ({kind})"
        assert again.returncode == 0, f"{what}: {again.stderr}"
        head = main_of(world)
        merges = git("--git-dir", str(world.dep.bare), "rev-list", "--merges", f"{start}..{head}").split()
        assert merges == [head], f"{what}: merged {len(merges)} times"
        assert git("--git-dir", str(world.forge_git), "rev-parse", "refs/heads/main") == head, what
        assert len(forge.comments) == 1 and head in forge.comments[0]["body"], what
    assert n == 6
    done = merge(world, forge, *also)  # once the forge says merged: nothing left to do, said
    assert done.returncode == 3 and "is merged, not open" in done.stderr, done.stderr


def test_only_reviewers_who_may_write_count_never_the_author(world: World, forge: Forge) -> None:
    before = main_of(world)
    approve_on_github(forge, world.change, ("mallory", "APPROVED", world.change),
                      ("carol", "APPROVED", world.change))  # mallory may only read; carol wrote it
    done = merge(world, forge)
    assert done.returncode == 3 and "0 of 1 approvals" in done.stderr, done.stderr
    forge.reviews.append({"id": 5, "user": {"login": "mallory"}, "state": "CHANGES_REQUESTED",
                          "commit_id": world.change})
    forge.reviews.append({"id": 6, "user": {"login": "alice"}, "state": "APPROVED", "commit_id": world.change})
    done = merge(world, forge)  # mallory's veto counts no more than her approval did
    assert done.returncode == 0, done.stderr
    assert main_of(world) != before
    message = git("--git-dir", str(world.dep.bare), "log", "-1", "--format=%B")
    assert "Reviewed-by: alice" in message and "mallory" not in message and "carol" not in message


def test_a_push_to_the_forge_that_fails_is_said_and_finished_by_the_next_run(world: World, forge: Forge) -> None:
    nowhere = f"file://{world.forge_git.parent / 'nosuch.git'}"
    done = merge(world, forge, "--also-push", nowhere)
    assert done.returncode == 1, done.stderr
    assert "but the push to" in done.stderr and "run again to finish" in done.stderr
    again = merge(world, forge, "--also-push", f"file://{world.forge_git}")
    assert again.returncode == 0 and "already merged" in again.stdout, again.stderr
    assert git("--git-dir", str(world.forge_git), "rev-parse", "refs/heads/main") == main_of(world)
    assert len(forge.comments) == 1


def test_the_root_the_nodes_were_given_is_checked_as_well_as_the_repos(
        world: World, forge: Forge, tmp_path: Path) -> None:
    """Nodes adopt the repo's trust/allowed_signers only from a commit that changes it: a fleet
    provisioned with another root refuses what the repo's file would accept; so does the bot."""
    other = make_key(tmp_path / "other", "other")
    done = merge(world, forge, allowed=other.allowed_signers)
    assert done.returncode == 2 and "the nodes would refuse the merge (UNTRUSTED_KEY)" in done.stderr, done.stderr


def test_a_sweep_merges_every_approved_pull_request_and_skips_the_others(world: World, forge: Forge) -> None:
    forge.others[8] = ({"number": 8, "state": "open", "draft": False, "merged": False, "title": "wip",
                        "base": {"ref": "main"}, "head": {"sha": world.change}, "user": {"login": "dave"}}, [], [])
    done = merge(world, forge, "--all-approved", pr=None)
    assert done.returncode == 0, done.stderr
    assert "skipped: pull request #8: 0 of 1 approvals" in done.stdout
    assert f"pull request #7 merged as {main_of(world)}" in done.stdout


def test_an_approved_gerrit_change_is_merged_pushed_to_gerrit_too_and_reported_on_its_patch_set(
        world: World, forge: Forge) -> None:
    def gerrit(labels: dict[str, Any], submittable: bool = True) -> None:
        forge.change = {"_number": 1234, "status": "NEW", "branch": "main", "subject": "web says b",
                        "current_revision": world.change, "submittable": submittable,
                        "revisions": {world.change: {"_number": 2, "ref": GERRIT_REF}}, "labels": labels}

    alice = {"name": "Alice", "email": "alice@example.org", "value": 2}
    gerrit({"Code-Review": {"rejected": {"name": "Bob"}, "all": [alice, {"name": "Bob", "value": -2}]}})
    done = merge(world, forge, which="gerrit")
    assert done.returncode == 3 and "Code-Review vetoed by Bob" in done.stderr, done.stderr
    gerrit({"Code-Review": {"approved": alice, "all": [alice]}}, submittable=False)
    done = merge(world, forge, which="gerrit")
    assert done.returncode == 3 and "not submittable" in done.stderr, done.stderr
    del forge.change["submittable"]  # a server that did not evaluate its submit requirements
    done = merge(world, forge, which="gerrit")
    assert done.returncode == 3 and "not submittable" in done.stderr, done.stderr
    gerrit({"Code-Review": {"approved": alice, "all": [alice, {"name": "Carol", "value": 1}]}})
    done = merge(world, forge, "--also-push", f"file://{world.forge_git}", which="gerrit")
    assert done.returncode == 0, done.stderr
    head = main_of(world)
    # The nodes' server and Gerrit's branch hold the same signed merge (Gerrit closes the change).
    assert git("--git-dir", str(world.forge_git), "rev-parse", "refs/heads/main") == head
    message = git("--git-dir", str(world.dep.bare), "log", "-1", "--format=%B", head)
    assert message.startswith("Merge change 1234: web says b\n")
    assert "Reviewed-by: Alice <alice@example.org>" in message and "Carol" not in message
    assert forge.calls()[-1] == ("POST", f"/a/changes/1234/revisions/{world.change}/review")
    assert f"<!-- reconciler-merge {head} -->" in forge.messages[-1]["message"]
    assert all(r[3]["Authorization"].startswith("Basic ") for r in forge.requests)


# ---- the contrib pipelines that call it, run as their runners would --------------------------

def test_the_github_merge_workflow_run_as_the_runner_would_merges_the_approved_pull_request(
        world: World, forge: Forge, tmp_path: Path) -> None:
    from test_package import run_steps

    workflow = yaml.safe_load((ROOT / "contrib/github/merge.yml").read_text())
    steps = [s for s in workflow["jobs"]["merge"]["steps"] if "pip install" not in s.get("run", "")]
    checkout = tmp_path / "checkout"  # actions/checkout: the forge's repo as origin
    git("clone", "-q", str(world.forge_git), str(checkout))
    runner = tmp_path / "runner-temp"
    runner.mkdir()
    assert set(workflow[True]) == {"schedule", "workflow_dispatch"}, "a pull request's event would run its own copy"
    assert workflow["jobs"]["merge"]["environment"] == "merge"
    context = {"github": {"token": TOKEN, "event": {"repository": {"default_branch": "main"}}},
               "secrets": {"MERGE_KEY": world.key.key.read_text()}, "runner": {"temp": str(runner)},
               "vars": {"NODES_GIT": world.dep.url, "NODES_GIT_KNOWN_HOSTS": "", "MERGE_EMAIL": "merge@example.org"}}
    env = {**os.environ, "GITHUB_API_URL": forge.url, "GITHUB_REPOSITORY": "ops/cloud",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    printed = run_steps(steps, context, checkout, env)
    head = main_of(world)
    assert f"pull request #7 merged as {head} into main" in "".join(printed)
    assert git("--git-dir", str(world.forge_git), "rev-parse", "refs/heads/main") == head  # GitHub's branch too
    verified = subprocess.run([sys.executable, "-m", "reconciler", "verify", "--repo", str(world.dep.bare),
                               "--allowed-signers", str(world.key.allowed_signers), head, "-o", "json"],
                              capture_output=True, text=True, timeout=60)
    assert json.loads(verified.stdout)[0]["principal"] == "merge@example.org", verified.stdout + verified.stderr
    assert not (runner / "merge").exists(), "the key was left on the runner"


def test_the_gerrit_merge_script_merges_an_approved_change_and_says_so_when_it_is_not_approved(
        world: World, forge: Forge, tmp_path: Path) -> None:
    checkout = tmp_path / "jenkins"
    git("clone", "-q", str(world.forge_git), str(checkout))
    env = {**os.environ, "GERRIT_URL": forge.url, "GERRIT_USER": "jenkins", "GERRIT_PASSWORD": PASSWORD,
           "GERRIT_CHANGE_NUMBER": "1234", "GERRIT_BRANCH": "main", "NODES_GIT": world.dep.url,
           "MERGE_KEY_FILE": str(world.key.key), "MERGE_EMAIL": "merge@example.org",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    script = str(ROOT / "contrib/gerrit/merge.sh")
    alice = {"name": "Alice", "email": "alice@example.org", "value": 2}
    forge.change = {"_number": 1234, "status": "NEW", "branch": "main", "subject": "web says b",
                    "current_revision": world.change, "submittable": True,
                    "revisions": {world.change: {"_number": 2, "ref": GERRIT_REF}},
                    "labels": {"Code-Review": {"all": [{"name": "Alice", "value": 1}]}}}
    waiting = subprocess.run([script], cwd=checkout, env=env, capture_output=True, text=True, timeout=120)
    assert waiting.returncode == 0 and "not approved for merge yet: nothing merged" in waiting.stdout, waiting.stderr
    forge.change["labels"] = {"Code-Review": {"approved": alice, "all": [alice]}}
    done = subprocess.run([script], cwd=checkout, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    head = main_of(world)
    assert f"change 1234 merged as {head}" in done.stdout
    assert git("--git-dir", str(world.forge_git), "rev-parse", "refs/heads/main") == head  # Gerrit's branch too
