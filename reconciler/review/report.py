"""The review as a reader sees it: what every node does, summed up per action (most disruptive
first), nodes grouped per service by what it does there, and the pull-request comment in
markdown, cut to fit a forge's limit.

Everything from the repo (paths, service, node and group names, reasons that quote keys, the
diffs) is written so that the comment shows it and nothing more: a control character or a line
break is shown as its escape, text is escaped for where it stands (``_md`` in markdown, ``_html``
in the raw HTML of a ``<summary>``, ``code_span`` in a code span), and a diff's fence is longer
than any run of backticks in it. A name that opened an HTML comment would hide the rest.
"""

from __future__ import annotations

import html
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reconciler.core.model import ActionKind
from reconciler.repo.cutover import CutoverStep
from reconciler.review.diff import FileDiff, NodeDiff
from reconciler.review.linediff import visible

# Most disruptive first: what a reviewer must see before anything else.
DISRUPTION: tuple[ActionKind, ...] = (
    ActionKind.REBOOT, ActionKind.DRAIN_RESTART, ActionKind.RECREATE, ActionKind.RESTART, ActionKind.STOP,
    ActionKind.START, ActionKind.RELOAD, ActionKind.CONNECT, ActionKind.NONE,
)


def _severity(kind: ActionKind) -> int:
    return DISRUPTION.index(kind) if kind in DISRUPTION else len(DISRUPTION)


def summary(diffs: list[NodeDiff]) -> dict[str, dict[str, int]]:
    """Per action, most disruptive first: how many nodes have it, and how many service instances."""
    nodes: Counter[str] = Counter()
    instances: Counter[str] = Counter()
    for d in diffs:
        kinds = [str(a.kind) for a in d.plan.changes]
        instances.update(kinds)
        nodes.update(set(kinds))
    return {str(k): {"nodes": nodes[str(k)], "services": instances[str(k)]} for k in DISRUPTION if str(k) in nodes}


@dataclass(frozen=True)
class Change:
    """What one service does on a set of nodes that all do the same thing to it: same action,
    same reason, same changed lines in the same files. Diff context lines may differ (a host
    name, a port three lines away), so the diff shown is the first node's."""

    service: str
    kind: ActionKind
    reason: str
    files: tuple[tuple[str, int, int], ...]  # path, lines added, lines removed
    nodes: tuple[str, ...]
    diff: str  # the first node's diff of the service's files
    upgrade: tuple[str, ...] = ()


def _changed_lines(text: str) -> tuple[str, ...]:
    """The +/- lines of a unified diff without its headers, which name the node."""
    return tuple(line for line in text.splitlines()
                 if line[:1] in "+-" and not line.startswith(("+++ ", "--- ")))


def changes(diffs: list[NodeDiff]) -> list[Change]:
    """Nodes grouped per service by what the service does there; most disruptive first."""
    groups: dict[tuple[Any, ...], list[tuple[str, str]]] = {}
    for d in diffs:
        actions = {a.service: a for a in d.plan.changes}
        files: dict[str, list[FileDiff]] = {}
        for f in d.files:
            files.setdefault(f.service, []).append(f)
        for service in sorted(set(actions) | set(files)):
            action = actions.get(service)
            kind = action.kind if action is not None else ActionKind.NONE
            reason = action.reason if action is not None else "files change, nothing to restart"
            mine = files.get(service, [])
            stats = tuple((f.path, *_counts(f.text)) for f in mine)
            steps = tuple(u for u in d.upgrade if u.startswith(f"{service}:") or f" {service} " in u)
            key = (service, kind, reason, stats, tuple(_changed_lines(f.text) for f in mine), steps)
            groups.setdefault(key, []).append((d.node, "".join(f.text for f in mine)))
    out = [Change(k[0], k[1], k[2], k[3], tuple(n for n, _ in members), members[0][1], k[5])
           for k, members in groups.items()]
    worst: dict[str, int] = {}
    for c in out:
        worst[c.service] = min(worst.get(c.service, len(DISRUPTION)), _severity(c.kind))
    return sorted(out, key=lambda c: (worst[c.service], c.service, _severity(c.kind), c.nodes))


def _counts(text: str) -> tuple[int, int]:
    lines = _changed_lines(text)
    return sum(1 for x in lines if x.startswith("+")), sum(1 for x in lines if x.startswith("-"))


def node_set(nodes: tuple[str, ...], groups: Mapping[str, Sequence[str]], everyone: int) -> str:
    """A short name for a set of nodes: "every node", whole inventory groups, then the rest, so
    that 500 nodes do not take 500 names in a comment."""
    if len(nodes) == everyone and everyone > 1:
        return f"every node ({everyone})"
    left = set(nodes)
    named = []
    for g, members in sorted(groups.items(), key=lambda x: (-len(x[1]), x[0])):
        if len(members) > 1 and set(members) <= left:
            named.append(f"group {g} ({len(members)})")
            left -= set(members)
    rest = sorted(left)
    if len(rest) > 12:  # a long tail: a few names and a count, the details have them all
        rest = [*rest[:10], f"{len(rest) - 10} more"]
    return ", ".join(named + rest)


def markdown(diffs: list[NodeDiff], a: str, b: str, *, groups: Mapping[str, Sequence[str]] | None = None,
             max_bytes: int | None = None, artifact_url: str | None = None,
             steps: Sequence[CutoverStep] = ()) -> str:
    """A pull-request comment for a reviewer: the summary (most disruptive first), then per
    service the nodes grouped by what it does there, then each group's diff folded.

    ``max_bytes``: cut (whole sections, from the end) to fit a forge's comment limit, with a line
    saying what was left out and where the full report is (``artifact_url``)."""
    head = [f"### reconciler diff `{a[:12]}`..`{b[:12]}`", ""]
    summ = summary(diffs)
    unchanged = sum(1 for d in diffs if not d.plan.changes and not d.files)
    if not summ and unchanged == len(diffs):
        head.append(f"No node changes ({len(diffs)} nodes rendered).")
        return "\n".join(head) + "\n"
    head += ["| action | nodes | services |", "|---|---:|---:|"]
    head += [f"| {k} | {v['nodes']} | {v['services']} |" for k, v in summ.items()]
    head += ["", f"{len(diffs) - unchanged} of {len(diffs)} nodes change; {unchanged} unchanged."]
    if steps:
        head += ["", "#### Cutover of the VIP networks, in order (each step gated on the notes)", ""]
        head += [_md(step.line(i)) for i, step in enumerate(steps, 1)]
    found = changes(diffs)
    names = {id(c): node_set(c.nodes, groups or {}, len(diffs)) for c in found}
    overview = ["", "#### Per service", ""]
    blocks: list[str] = []
    for c in found:
        files = ", ".join(f"{code_span(p)} (+{plus} -{minus})" for p, plus, minus in c.files) or "no file"
        blocks.append(f"- **{_md(c.service)}** on {_md(names[id(c)])}: **{c.kind}**, {files}: {_md(_short(c.reason))}")
    details = ["", "#### Details", ""]
    for c in found:
        body = [f"<details><summary>{_html(c.service)} on {_html(names[id(c)])}: {c.kind}</summary>", ""]
        if c.reason != _short(c.reason):
            body += [f"Why: {_md(_short(c.reason, 2000))}", ""]  # -o json has it whole
        if names[id(c)].endswith(" more"):  # the short name left some out: here they all are
            body += [f"Nodes: {_md(', '.join(c.nodes))}.", ""]
        if len(c.nodes) > 1:
            body += [f"The diff shown is {_md(c.nodes[0])}'s; the others change the same lines.", ""]
        if c.upgrade:
            body += ["Upgrade steps, in order (each waits at its barrier):", ""]
            body += [f"1. {_md(u)}" for u in c.upgrade] + [""]
        if c.diff:
            fence = "`" * max(3, _longest_backticks(c.diff) + 1)
            body += [f"{fence}diff", c.diff.rstrip("\n"), fence, ""]
        body.append("</details>")
        blocks.append("\n".join(body))
    parts = ["\n".join(head + overview)] + blocks[:len(found)] + ["\n".join(details)] + blocks[len(found):]
    return _fit(parts, max_bytes, artifact_url, a, b)


def _fit(parts: list[str], max_bytes: int | None, artifact_url: str | None, a: str, b: str) -> str:
    """Join ``parts`` (the head, one line per change, the details heading, one folded diff per
    change); past ``max_bytes`` keep the longest run of whole parts that fits with the note."""
    full = "\n".join(parts) + "\n"
    if max_bytes is None or len(full.encode()) <= max_bytes:
        return full
    where = (f"the full report is at {artifact_url}" if artifact_url else
             f"the full report: `reconciler diff {a[:12]} {b[:12]} -o markdown`")

    def note(left_out: int) -> str:
        return f"\n\n**Cut to fit {max_bytes} bytes**: {left_out} of {len(parts) - 1} sections left out; {where}\n"

    budget = max_bytes - len(note(len(parts)).encode())  # the note with its widest count
    kept: list[str] = []
    size = 0
    for part in parts:
        size += len(part.encode()) + 1
        if size > budget:
            break
        kept.append(part)
    text = "\n".join(kept) + note(len(parts) - max(1, len(kept)))
    # Only a head larger than the limit gets here cut mid-text; the note goes last all the same.
    if len(text.encode()) > max_bytes:
        end = note(len(parts) - 1)
        text = text.encode()[:max_bytes - len(end.encode())].decode(errors="ignore") + end
    return text


def _longest_backticks(text: str) -> int:
    longest = run = 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    return longest


def _short(reason: str, limit: int = 200) -> str:
    """A reason as long as a line: one that names every changed key of a big file can run to
    kilobytes (600 added lines: 27 kB), and a comment has a limit."""
    return reason if len(reason) <= limit else reason[:limit - 1] + "…"


# Every character that starts markdown inline syntax (emphasis, links, images, code, raw HTML,
# entities, strikethrough, table cells) and the escape itself. On one line (``visible``), no
# block syntax can start mid-line.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>!&~|])")


def _md(text: str) -> str:
    """Text from the repo in markdown, shown as it is."""
    return _MD_SPECIAL.sub(r"\\\1", visible(text))


def _html(text: str) -> str:
    """Text from the repo inside raw HTML (a ``<summary>``), where markdown does not apply."""
    return html.escape(visible(text), quote=False)


def code_span(text: str) -> str:
    """Text from the repo as a code span: delimited by more backticks than any run in it."""
    shown = visible(text)
    ticks = "`" * (_longest_backticks(shown) + 1)
    # A space on each side, which the span drops, lets the text itself begin or end with one.
    pad = " " if shown[:1] in ("`", " ") or shown[-1:] in ("`", " ") else ""
    return f"{ticks}{pad}{shown}{pad}{ticks}"
