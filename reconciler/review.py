"""What a commit will do, per node, before it is merged: rendered file diffs and the plan.

Both commits are rendered for every node; the plan for B is made against "A as applied", the
same pure planner a node runs, so the plan hash printed here is the one a node writes in its
note when it applies B on top of A: a reviewer approves an exact plan.
"""

from __future__ import annotations

import difflib
from collections import Counter
from dataclasses import dataclass
from typing import Any

from .model import ActionKind, Desired, Observed, ObservedService, Plan
from .plan import plan as make_plan
from .render import render_node
from .repo import DeploymentRepo
from .rollout import plan_rollout
from .upgrade import bases, describe, fleet_upgrades_of, held_back, stage_of, upgraded


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

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "plan_hash": self.plan.hash, "files": [f.to_dict() for f in self.files],
                "actions": [a.to_dict() for a in self.plan.changes], "upgrade": list(self.upgrade)}


def as_applied(desired: Desired) -> Observed:
    """What a node observes once ``desired`` is applied and healthy."""
    return Observed(desired.node, tuple(
        ObservedService(s.name, s.runtime.driver, True, s.hash, desired.commit, None, "",
                        tuple(sorted(s.fingerprint().items())), "", s.files)
        for s in desired.services))


def _text(content: bytes) -> list[str] | None:
    try:
        return content.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        return None


def file_diffs(node: str, a: Desired, b: Desired) -> list[FileDiff]:
    out = []
    before, after = a.by_name(), b.by_name()
    for name in sorted(set(before) | set(after)):
        fa = {f.path: f for f in before[name].files} if name in before else {}
        fb = {f.path: f for f in after[name].files} if name in after else {}
        for path in sorted(set(fa) | set(fb)):
            old, new = fa.get(path), fb.get(path)
            if old is not None and new is not None and old.content == new.content and old.mode == new.mode:
                continue
            la = _text(old.content) if old else []
            lb = _text(new.content) if new else []
            if la is None or lb is None:
                text = "binary content differs\n"
            else:
                text = "".join(difflib.unified_diff(la, lb, f"a/{node}/{name}/{path}", f"b/{node}/{name}/{path}"))
                if old is not None and new is not None and old.mode != new.mode:
                    text = f"mode {old.mode:04o} -> {new.mode:04o}\n" + text
            out.append(FileDiff(name, path, text))
    return out


def diff_repos(repo_a: DeploymentRepo, a: str, repo_b: DeploymentRepo, b: str,
               nodes: list[str] | None = None) -> list[NodeDiff]:
    names = nodes or sorted(set(repo_a.nodes) | set(repo_b.nodes))
    rollout = plan_rollout(repo_b.settings, repo_b.nodes, repo_b.members)
    order = [n for _, members in rollout.batches() for n in members]
    # A review compares with A alone: every node's base is A (a node's stage history is the agent's).
    base = bases(set(repo_a.nodes) | set(repo_b.nodes), [(a, repo_a)])
    upgrades = fleet_upgrades_of(repo_b, upgraded(repo_b, base), order)
    stage = stage_of(repo_b)
    out = []
    for node in names:
        if node not in repo_a.nodes and node not in repo_b.nodes:
            repo_b.node(node)  # raises UnknownNode
        da = render_node(repo_a, node, a) if node in repo_a.nodes else Desired(node, a, ())
        db = render_node(repo_b, node, b) if node in repo_b.nodes else Desired(node, b, ())
        held = held_back(repo_b, node, base)
        if held:  # outside the commit's stage: these stay as at A
            kept = da.by_name()
            db = Desired(node, b, tuple(kept[s.name] if s.name in held and s.name in kept else s for s in db.services))
        steps = tuple(line for up in upgrades.values() if node in up.participants for line in describe(up, node))
        if held and stage is not None:
            steps += (f"{', '.join(sorted(held))}: kept at their version (not in stage {stage.name})",)
        out.append(NodeDiff(node, make_plan(db, as_applied(da)), tuple(file_diffs(node, da, db)), steps))
    return out


def summary(diffs: list[NodeDiff]) -> dict[str, dict[str, int]]:
    """Per action: how many nodes have it, and how many service instances."""
    nodes: Counter[str] = Counter()
    instances: Counter[str] = Counter()
    for d in diffs:
        kinds = [str(a.kind) for a in d.plan.changes]
        instances.update(kinds)
        nodes.update(set(kinds))
    order = [str(k) for k in ActionKind]
    return {k: {"nodes": nodes[k], "services": instances[k]} for k in order if k in nodes}


def markdown(diffs: list[NodeDiff], a: str, b: str) -> str:
    """A pull-request comment: the summary, then one folded section per node that changes."""
    lines = [f"### reconciler diff `{a[:12]}`..`{b[:12]}`", ""]
    summ = summary(diffs)
    unchanged = sum(1 for d in diffs if not d.plan.changes)
    if not summ:
        lines.append(f"No node changes ({len(diffs)} nodes rendered).")
    else:
        lines += ["| action | nodes | services |", "|---|---:|---:|"]
        lines += [f"| {k} | {v['nodes']} | {v['services']} |" for k, v in summ.items()]
        lines += ["", f"{unchanged} of {len(diffs)} nodes unchanged."]
    for d in diffs:
        if not d.plan.changes and not d.files:
            continue
        lines += ["", f"<details><summary><b>{d.node}</b>: {_brief(d)} (plan <code>{d.plan.hash}</code>)</summary>", "",
                  "| service | action | reason |", "|---|---|---|"]
        lines += [f"| {x.service} | {x.kind} | {_cell(x.reason)} |" for x in d.plan.changes]
        if d.upgrade:
            lines += ["", "Upgrade steps, in order (each waits at its barrier):", ""]
            lines += [f"1. {_cell(u)}" for u in d.upgrade]
        if d.files:
            lines += ["", "```diff"] + ["".join(f.text for f in d.files).rstrip("\n"), "```"]
        lines += ["", "</details>"]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _brief(d: NodeDiff) -> str:
    return ", ".join(f"{a.kind} {a.service}" for a in d.plan.changes) or "files only"
