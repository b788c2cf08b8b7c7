"""What a commit will do, per node, before it is merged: rendered file diffs and the plan.

Both commits are rendered for every node; the plan for B is made against "A as applied", the
same pure planner a node runs, so the plan hash printed here is the one a node writes in its
note when it applies B on top of A: a reviewer approves an exact plan.

Also here: ``validate``'s checks of one commit, and the worker processes a large fleet's
diff runs in. What a reviewer reads (the summary, the markdown comment) is ``report``.
"""

from __future__ import annotations

import dataclasses
import gc
import multiprocessing
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.core.errors import BadInput, ReconcilerError
from reconciler.core.model import ActionKind, Desired, FileSpec, Plan
from reconciler.core.yamlfile import Problem, RepoProblems
from reconciler.fleet.facts import Published, for_review, said
from reconciler.fleet.rollout import plan_rollout
from reconciler.render.facts import NodeFacts
from reconciler.render.inputs import Inputs
from reconciler.render.node import render_node
from reconciler.render.vipnets import check_vip_networks, checked
from reconciler.repo.checks import check_file_names, unprintable
from reconciler.repo.cutover import CutoverStep, cutover_steps
from reconciler.repo.definitions import DeploymentRepo
from reconciler.repo.load import load_repo
from reconciler.repo.steps import Stage
from reconciler.repo.tree import Tree
from reconciler.review.applied import planned
from reconciler.review.linediff import quoted, unified, visible
from reconciler.upgrades.rules import (
    Upgrade,
    bases,
    describe,
    describe_post,
    fleet_upgrades_of,
    held_back,
    holding,
    stage_of,
    upgraded,
)


@dataclass(frozen=True)
class FileDiff:
    service: str
    path: str
    text: str  # unified diff; a note for binary or unreadable content

    def to_dict(self) -> dict[str, str]:
        return {"service": self.service, "path": self.path, "diff": self.text}


@dataclass(frozen=True)
class NodeDiff:
    node: str
    plan: Plan
    files: tuple[FileDiff, ...]
    upgrade: tuple[str, ...] = ()  # the upgrade steps this node runs, each with its barrier
    facts: str = ""  # its render read facts not published by the node: where they came from

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "plan_hash": self.plan.hash, "files": [f.to_dict() for f in self.files],
                "actions": [a.to_dict() for a in self.plan.changes], "upgrade": list(self.upgrade),
                **({"facts": self.facts} if self.facts else {})}


def load_at(tree: Tree) -> DeploymentRepo:
    """The repo at one of a review's two commits; a problem in it names that commit."""
    try:
        return checked(load_repo(tree))
    except BadInput as exc:
        raise exc.in_commit(tree.label) from None


def validate_tree(tree: Tree, keys: Iterable[Any] = (), facts: Mapping[str, Published] | None = None,
                  ) -> tuple[DeploymentRepo | None, list[Problem], int, int]:
    """``reconciler validate``: the repo (None when it does not load), each problem located, and
    how many nodes and service instances rendered. ``keys`` (age identities): also look for the
    values of the secrets they open in plain text elsewhere in the repo. ``facts``: each node's
    last published facts (``fleet.facts``; without them, only the inventory's stand-ins)."""
    problems: list[Problem] = path_problems(tree)
    nodes = services = 0
    try:
        repo = load_repo(tree)
    except RepoProblems as exc:
        return None, problems + exc.problems, 0, 0
    problems += check_file_names(repo.services)
    problems += check_vip_networks(repo)  # the names written through a variable, as each node renders them
    problems += trust_problems(tree)
    failed: dict[tuple[str, int | None, str], list[str]] = {}
    for node in sorted(repo.nodes):
        try:
            services += len(render_node(repo, node, tree.label, facts=for_review(repo, node, facts or {})).services)
            nodes += 1
        except BadInput as exc:
            message = str(exc).split(": ", 1)[1] if exc.file else str(exc)
            # The node's name aside: the same mistake on five nodes is one problem, said once.
            failed.setdefault((exc.file or "?", exc.line, message.removeprefix(f"node {node}")), []).append(node)
    problems += [Problem(file, line, _for_nodes(tail, names)) for (file, line, tail), names in failed.items()]
    keys = tuple(keys)
    if keys:
        try:
            problems += plain_text_secrets(tree, repo, keys)
        except BadInput as exc:  # a file these keys should open and cannot: said, never its value
            problems.append(Problem(exc.file or "?", exc.line, str(exc).split(": ", 1)[-1]))
    return repo, problems, nodes, services


def _for_nodes(tail: str, names: list[str], most: int = 5) -> str:
    """A render problem as one node's, or once for all the ``names`` it breaks. ``tail``: its
    message after "node N" (": ..." or ", service S: ..."); the whole message if it names none."""
    named = tail.startswith((": ", ", "))
    if len(names) == 1:
        return f"node {names[0]}{tail}" if named else tail
    shown = names if len(names) <= most else [*names[:most - 1], f"{len(names) - most + 1} more"]
    return f"{tail[2:] if named else tail} (nodes {', '.join(shown)})"


def path_problems(tree: Tree) -> list[Problem]:
    """Every path in the repo with a control character or a line break, named escaped: the
    loader would read it, and a review comment, a terminal or a log line would show it as
    something else (a newline and "<!--" hide the rest of a comment)."""
    problems = []
    for entry in tree.listdir(""):
        if entry == ".git":
            continue
        try:
            below = tree.files(entry)
        except BadInput:
            below = []  # a symlink: load_repo names it where it reads it
        problems += [Problem(visible(path), None, "a file name with a control character or a line break: "
                                                  "not allowed in a deployment repo")
                     for path in below or [entry] if unprintable(path)]
    return problems


def trust_problems(tree: Tree) -> list[Problem]:
    """The repo's ``trust/`` files read as a node reads them in a rotation: one it cannot read
    refuses the commit on every node (``BAD_TRUST_ROOT``), so it must not merge."""
    from reconciler.trust.notesig import parse_nodes
    from reconciler.trust.root import TRUST_DIR, parse_revoked
    from reconciler.trust.sshsig import parse_allowed_signers

    problems = []
    # trust/nodes (whose key signs which node's notes): one that cannot be read makes every
    # note of the fleet count for nothing, and every wave wait
    for name, parse in (("allowed_signers", parse_allowed_signers), ("revoked", parse_revoked),
                        ("nodes", parse_nodes)):
        path = f"{TRUST_DIR}/{name}"
        try:
            if tree.exists(path):
                parse(tree.read(path).decode(), path)
        except UnicodeDecodeError:
            problems.append(Problem(path, None, "not UTF-8 text"))
        except BadInput as exc:
            problems.append(Problem(exc.file or path, exc.line, str(exc).split(": ", 1)[-1]))
    return problems


PLAIN_MIN = 8  # shorter values ("true", a port) would match plain text by chance


def plain_text_secrets(tree: Tree, repo: DeploymentRepo, keys: Iterable[Any]) -> list[Problem]:
    """Secret values (those ``keys`` open) that also appear in plain text anywhere else in the
    repo, e.g. a password pasted into inventory.yaml: each located by file and line, naming the
    secret, never showing the value. Values under ``PLAIN_MIN`` characters are not looked for."""
    from reconciler.render.secrets import open_files, secret_values

    wanted = {value.encode(): f"{name} of {path}"
              for path, name, value in secret_values(open_files(repo.secret_files, keys)) if len(value) >= PLAIN_MIN}
    if not wanted:
        return []
    paths = []
    for entry in tree.listdir(""):
        if entry in ("secrets", ".git"):
            continue
        below = tree.files(entry)
        paths += below if below else [entry]
    problems = []
    for path in paths:
        try:
            data = tree.read(path, repo.limits.file_bytes)
        except (OSError, ReconcilerError):
            continue  # load_repo reports what cannot be read
        for value, what in wanted.items():
            at = data.find(value)
            if at >= 0:
                problems.append(Problem(path, data.count(b"\n", 0, at) + 1,
                                        f"a plain-text value matches secret {what}: use {{{{ secrets.<name> }}}}"))
    return problems


def file_diffs(node: str, a: Desired, b: Desired) -> list[FileDiff]:
    out = []
    before, after = a.by_name(), b.by_name()
    for name in sorted(set(before) | set(after)):
        if before.get(name) is after.get(name):
            continue  # one stand-in on both sides: no file
        files_a = before[name].files if name in before else ()
        files_b = after[name].files if name in after else ()
        if len(files_a) == 1 and len(files_b) == 1 and files_a[0].path == files_b[0].path:  # most services
            pairs: list[tuple[str, FileSpec | None, FileSpec | None]] = [(files_a[0].path, files_a[0], files_b[0])]
        else:
            fa, fb = {f.path: f for f in files_a}, {f.path: f for f in files_b}
            pairs = [(path, fa.get(path), fb.get(path)) for path in sorted(set(fa) | set(fb))]
        for path, old, new in pairs:
            if old is not None and new is not None and old.content == new.content and old.mode == new.mode:
                continue
            la = old.lines if old else []
            lb = new.lines if new else []
            if (old is not None and old.secret) or (new is not None and new.secret):
                # Never the content of a file that holds a secret: that it changed, and short hashes.
                where = quoted(f"{node}/{name}/{path}")
                text = (f"<secret changed> {where}: sha256 {old.sha256[:12] if old else '(none)'}"
                        f" -> {new.sha256[:12] if new else '(none)'}\n")
                if old is not None and new is not None and old.mode != new.mode:
                    text = f"mode {old.mode:04o} -> {new.mode:04o}\n" + text
            elif la is None or lb is None:
                text = "binary content differs\n"
            else:
                where = f"{node}/{name}/{path}"
                if quoted(where) is where:  # nothing to escape: neither with "a/" or "b/" before it
                    text = unified(la, lb, "a/" + where, "b/" + where)
                else:
                    text = unified(la, lb, quoted(f"a/{where}"), quoted(f"b/{where}"))
                if old is not None and new is not None and old.mode != new.mode:
                    text = f"mode {old.mode:04o} -> {new.mode:04o}\n" + text
            out.append(FileDiff(name, path, text))
    return out


@dataclass(frozen=True)
class _Review:
    """What every node's diff reads alike (workers inherit it when forked)."""

    repo_a: DeploymentRepo
    a: str
    repo_b: DeploymentRepo
    b: str
    inputs: Inputs | None
    base: Mapping[str, tuple[str, DeploymentRepo]]
    upgrades: Mapping[str, Upgrade]
    stage: Stage | None
    holding: Mapping[str, tuple[str, ...]]  # service -> nodes outside the stage that keep it (post steps wait)
    facts: Mapping[str, Published]  # each node's last published facts (``fleet.facts``)


# Below this many nodes a diff is quicker than starting workers.
PARALLEL_FROM = 64
_JOB: _Review | None = None  # the review a forked worker diffs its nodes of


def diff_repos(repo_a: DeploymentRepo, a: str, repo_b: DeploymentRepo, b: str,
               nodes: list[str] | None = None, *, every_service: bool = False,
               jobs: int | None = None, facts: Mapping[str, Published] | None = None) -> list[NodeDiff]:
    """Per node, B's files and plan against A as applied. A service is rendered only where its
    inputs differ between A and B (``inputs``): the others would render the same bytes at both,
    plan "none" and show no file, so a stand-in takes their place on both sides. A one-service
    change across 1000 nodes renders that service only. ``every_service``: render them all (what
    the tests compare against). The one thing skipping changes: a service that fails to render
    at A and at B with the same inputs is not reported here (``validate`` reports it).
    ``jobs``: worker processes (None: one per CPU this process may use); each node's diff is
    independent of the others', so the output and the first error (in node order) are the same.
    ``facts``: each node's last published facts; both commits render with the same."""
    names = nodes or sorted(set(repo_a.nodes) | set(repo_b.nodes))
    inputs = None if every_service else Inputs(repo_a, repo_b)
    rollout = plan_rollout(repo_b.settings, repo_b.nodes, repo_b.members)
    order = [n for _, members in rollout.batches() for n in members]
    # A review compares with A alone: every node's base is A (a node's stage history is the agent's).
    base = bases(set(repo_a.nodes) | set(repo_b.nodes), [(a, repo_a)])
    upgrades = fleet_upgrades_of(repo_b, upgraded(repo_b, base), order)
    review = _Review(repo_a, a, repo_b, b, inputs, base, upgrades, stage_of(repo_b),
                     holding(repo_b, base) if upgrades and repo_b.post_upgrade else {}, facts or {})
    for node in names:
        if node not in repo_a.nodes and node not in repo_b.nodes:
            repo_b.node(node)  # raises UnknownNode
    workers = min(jobs or usable_cpus(), -(-len(names) // PARALLEL_FROM))
    if workers <= 1:
        return [_diff_node(review, node) for node in names]
    return _in_workers(review, names, workers)


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _in_workers(review: _Review, names: list[str], workers: int) -> list[NodeDiff]:
    global _JOB
    # Forked, so each worker starts with both repos loaded (each compiles the templates it
    # renders, in parallel with the others); small chunks even out nodes that render more.
    size = max(1, len(names) // (workers * 8))
    chunks = [names[i:i + size] for i in range(0, len(names), size)]
    _JOB = review
    # What this process holds is moved out of the collector's sight while the workers run: a
    # worker's collection would otherwise write to every inherited object's header, copying the
    # pages of both loaded repos into each worker (a tenth of a fleet diff's CPU).
    gc.freeze()
    try:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            out: list[NodeDiff] = []
            for part in pool.imap(_diff_chunk, chunks):  # in order: the first error is the serial one's
                out += part
            return out
    finally:
        _JOB = None
        gc.unfreeze()


def _diff_chunk(names: list[str]) -> list[NodeDiff]:
    assert _JOB is not None
    return [_diff_node(_JOB, node) for node in names]


def _diff_node(r: _Review, node: str) -> NodeDiff:
    fresh = r.inputs.changed(node) if r.inputs is not None else None
    used = [for_review(r.repo_b if node in r.repo_b.nodes else r.repo_a, node, r.facts) for _ in "ab"]
    da, db = (_render_at(repo, node, commit, fresh, f)
              for (repo, commit), f in zip(((r.repo_a, r.a), (r.repo_b, r.b)), used, strict=True))
    held = held_back(r.repo_b, node, r.base)
    if held:  # outside the commit's stage: these stay as at A
        kept = da.by_name()
        db = Desired(node, r.b, tuple(kept[s.name] if s.name in held and s.name in kept else s for s in db.services))
    steps = tuple(line for up in r.upgrades.values() if node in up.participants for line in describe(up, node))
    if held and r.stage is not None:
        steps += (f"{', '.join(sorted(held))}: kept at their version (not in stage {r.stage.name})",)
    if r.upgrades and r.repo_b.post_upgrade:
        steps += describe_post(r.repo_b, node, r.upgrades, r.repo_b.members, r.holding)
    # A review keeps what it prints: not every rendered file of every action (a worker would
    # send them all back).
    plan, shown_a, shown_b = planned(da, db)
    if node in r.repo_a.nodes and node not in r.repo_b.nodes:
        plan, steps = _leaves(r.repo_b, node, plan, steps)
    return NodeDiff(node, plan, tuple(file_diffs(node, shown_a, shown_b)), steps,
                    next((line.split(": facts: ", 1)[1] for line in said([(node, f) for f in used])), ""))


def _leaves(repo_b: DeploymentRepo, node: str, plan: Plan, steps: tuple[str, ...]) -> tuple[Plan, tuple[str, ...]]:
    """A node that leaves ``nodes``: under ``decommission`` its agent stops what it runs; merely
    gone, it stops nothing (its passes err, UNKNOWN_NODE), and the review says so."""
    stops = [a.service for a in plan.actions if a.kind is ActionKind.STOP]
    if node in repo_b.decommission:
        why = f"decommission {node}: stops {', '.join(stops) or 'nothing'}"
        return Plan(plan.node, plan.commit, tuple(dataclasses.replace(a, reason=why) for a in plan.actions)), \
            (*steps, why)
    return Plan(plan.node, plan.commit, ()), (*steps, f"{node} is no longer in the inventory: its agent stops "
                                                      "nothing (UNKNOWN_NODE); list it under `decommission` to stop "
                                                      "its services")


def _render_at(repo: DeploymentRepo, node: str, commit: str, only: frozenset[str] | None,
               facts: NodeFacts | None = None) -> Desired:
    if node not in repo.nodes:
        return Desired(node, commit, ())
    try:
        return render_node(repo, node, commit, only=only, facts=facts)
    except BadInput as exc:  # which of the two commits fails to render
        raise exc.in_commit(commit) from None


def cutover(repo_a: DeploymentRepo, repo_b: DeploymentRepo, diffs: list[NodeDiff]) -> tuple[CutoverStep, ...]:
    """For a commit that moves the VIP networks from one control plane to another: the nodes
    that leave them, then those that join them once the first noted it (see ``repo.planes``)."""
    moves = (ActionKind.START, ActionKind.STOP)  # a VIP holder (vip.services) starts or stops with its plane
    connects = {d.node: tuple(a.service for a in d.plan.changes if a.kind is ActionKind.CONNECT
                              or (a.kind in moves and a.service in repo_b.vip_services)) for d in diffs}
    return cutover_steps(repo_a, repo_b, [d.node for d in diffs], connects)
