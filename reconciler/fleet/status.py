"""The whole rollout at a glance, from the notes every node pushes: per commit, per wave, each
node applied, failed, halted, refused, rebooting or pending, and the failing service; for a
commit that upgrades services, each node's upgrade steps (a table of nodes x steps) and the
stage each node is at.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from reconciler.core.text import printable
from reconciler.fleet.notes import Note
from reconciler.fleet.rollout import FleetView, Rollout
from reconciler.repo.planes import Mode, Placement, Planes
from reconciler.upgrades.rules import Bases, fleet_upgrades_of, held_back, holding, stage_of, upgraded

if TYPE_CHECKING:
    from reconciler.repo.definitions import DeploymentRepo

# One colour per state, no two alike (the page's legend and cells); text on each is black or white,
# whichever reads better (``ink``).
COLOURS = {"applied": "#2e7d32", "failed": "#c62828", "halted": "#ef6c00", "refused": "#6a1b9a",
           "error": "#4e342e", "rebooting": "#0277bd", "waiting": "#00695c", "pending": "#9e9e9e",
           "staged": "#f9a825", "unverified": "#ad1457", "malformed": "#283593"}
OTHER = "#607d8b"  # a state this version does not know


@dataclass(frozen=True)
class NodeStatus:
    node: str
    wave: str
    state: str
    commit: str  # the commit its state is about (C, or the descendant it applied)
    detail: str = ""
    stage: str = ""  # with stages: the commit's stage this node is in, or what it keeps outside it
    release: str = ""  # what the inventory at the commit says it runs
    pending_release: str = ""  # and what it is being deployed as
    plane: str = ""  # two control planes side by side: isolated, cutover, detached (off the VIPs), or ""

    def to_dict(self) -> dict[str, Any]:
        out = {"node": self.node, "wave": self.wave, "state": self.state, "commit": self.commit,
               "detail": self.detail, "release": self.release, "pending_release": self.pending_release}
        if self.stage:
            out["stage"] = self.stage
        if self.plane:
            out["plane"] = self.plane
        return out


def stage_labels(repo: DeploymentRepo, base: Bases) -> dict[str, str]:
    """node -> where it stands with the commit's stage: in it, or outside it and what it keeps
    at which version (empty when the commit has no stage)."""
    stage = stage_of(repo)
    if stage is None:
        return {}
    out = {}
    for node in sorted(repo.nodes):
        if node in stage.nodes:
            out[node] = stage.name
            continue
        kept = held_back(repo, node, base)
        old = base[node][1].services
        versions = ", ".join(f"{s} {old[s].version or old[s].container.get('image') or '?'}" for s in sorted(kept))
        out[node] = f"not in {stage.name}" + (f": keeps {versions}" if versions else "")
    return out


def fleet_status(rollout: Rollout, nodes: list[str], commit: str, fleet: FleetView,
                 stages: dict[str, str] | None = None, planes: Planes | None = None) -> list[NodeStatus]:
    """``planes``: the commit's releases and modes (``DeploymentRepo.planes``)."""
    wave_of = {n: w.name for w in rollout.waves for n in w.nodes}
    stages = stages or {}
    out = []
    for node in sorted(nodes, key=lambda n: (_wave_index(rollout, n), n)):
        mine: Note | None = next((x for x in fleet.notes.get(node, ()) if x.commit == commit), None)
        reached = fleet.reached(node, commit)
        refused = next((why for obj, why in fleet.rejected.get(node, ()) if obj == commit), None)
        rewound = _rewound(fleet, node, commit)
        if rewound is not None and mine is not None and mine.time > rewound.refused_time:
            rewound = None  # it noted that head since (applied it again, its state dir rebuilt): that holds
        if rewound is not None:
            # Its note on C may well say applied (it did, before it ran a later commit): the branch
            # was moved back, and the node, which runs that later one, refused to follow.
            detail = (f"runs {rewound.commit[:12]}, which the branch no longer holds; refused the rewind to "
                      f"{commit[:12]}: {rewound.refused_reason}")
            out.append(NodeStatus(node, wave_of.get(node, "-"), "refused", rewound.commit, printable(detail, 512),
                                  stages.get(node, "")))
        elif mine is not None and mine.state != "applied":
            # What a node wrote is shown as text only, whatever it holds (``core.text``).
            detail = f"{mine.failed_service}: {mine.error}" if mine.failed_service else mine.error
            out.append(NodeStatus(node, wave_of.get(node, "-"), printable(mine.state, 64), commit, printable(detail),
                                  stages.get(node, "")))
        elif reached is not None:
            note = "" if reached.commit == commit else f"at descendant {reached.commit[:12]}"
            if reached.held:  # `reconciler stop` on that node: shown, as text only
                note = "; ".join(filter(None, (note, "held stopped: " + ", ".join(reached.held))))
            note = printable(note, 512)
            out.append(NodeStatus(node, wave_of.get(node, "-"), "applied", reached.commit, note,
                                  stages.get(node, "")))
        elif refused is not None:
            # a note that does not count (unsigned, another key, malformed): pending for every
            # reader, and shown as what it is, with why, so the culprit is named
            state = "malformed" if refused.startswith("malformed note") else "unverified"
            out.append(NodeStatus(node, wave_of.get(node, "-"), state, commit, printable(refused, 512),
                                  stages.get(node, "")))
        else:
            out.append(NodeStatus(node, wave_of.get(node, "-"), "pending", commit, stage=stages.get(node, "")))
    if planes is None:
        return out
    return [replace(s, release=p.release, pending_release=p.pending, plane=_plane(p, planes.active))
            if (p := planes.placements.get(s.node)) is not None else s for s in out]


def _rewound(fleet: FleetView, node: str, commit: str) -> Note | None:
    """The node's note that says it refused to rewind to ``commit`` (its last such), if any."""
    said = [n for n in fleet.notes.get(node, ()) if n.refused_head == commit and n.commit != commit]
    return max(said, key=lambda n: n.refused_time) if said else None


def _plane(p: Placement, active: bool) -> str:
    if not active:
        return ""
    if p.mode is not Mode.NORMAL:
        return str(p.mode) + ("" if p.attached or p.mode is Mode.ISOLATED else " (off the VIPs)")
    return "" if p.attached else "detached"


@dataclass(frozen=True)
class StepTable:
    """The upgrade of one commit as nodes x steps: ``columns`` ("service/step", in order, post
    steps last), ``rows`` node -> one status per column ("" where the node has no such step)."""

    columns: tuple[str, ...]
    rows: dict[str, tuple[str, ...]]

    def to_dict(self) -> dict[str, Any]:
        return {"steps": list(self.columns), "nodes": {n: dict(zip(self.columns, r, strict=True))
                                                      for n, r in self.rows.items()}}


def step_table(repo: DeploymentRepo, commit: str, fleet: FleetView, base: Bases, order: list[str]) -> StepTable:
    """Every upgrade step of ``commit`` on every node that takes part, from the notes: done,
    skipped, started, failed, undone, or "waiting" (the next step of a node waiting at a barrier)."""
    ups = fleet_upgrades_of(repo, upgraded(repo, base), order)
    columns = [(u.service, s.name) for u in ups.values() for s in u.steps]
    held = holding(repo, base)  # a post step waits for the stage in which nobody keeps its services back
    columns += [("", p.name) for p in repo.post_upgrade if set(p.after) & set(ups) and not set(p.after) & set(held)]
    if not columns:
        return StepTable((), {})
    progress = fleet.progress(commit)
    takes_part = [n for n in order if any(n in u.participants for u in ups.values()) or progress.get(n)]
    takes_part += sorted(n for n, steps in progress.items() if steps and n not in takes_part)
    rows = {}
    for node in takes_part:
        mine = progress.get(node, {})
        note = fleet.note(node, commit)
        cells = []
        waiting = note is not None and note.state == "waiting"
        for service, step in columns:
            status = mine.get((service, step), "")
            if not status and waiting and (not service or node in ups[service].participants):
                status, waiting = "waiting", False  # the first step not begun is the one it waits for
            cells.append(printable(status, 64))
        rows[node] = tuple(cells)
    return StepTable(tuple(f"{s}/{n}" if s else f"post/{n}" for s, n in columns), rows)


def _wave_index(rollout: Rollout, node: str) -> int:
    for i, w in enumerate(rollout.waves):
        if node in w.nodes:
            return i
    return len(rollout.waves)


def counts(statuses: list[NodeStatus]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in statuses:
        out[s.state] = out.get(s.state, 0) + 1
    return dict(sorted(out.items()))


STEP_COLOURS = {"done": COLOURS["applied"], "skipped": "#81c784", "started": COLOURS["rebooting"],
                "waiting": COLOURS["waiting"], "failed": COLOURS["failed"], "undone": COLOURS["halted"]}
NO_STEP = "#eeeeee"  # a node with no such step


@dataclass(frozen=True)
class CommitInfo:
    """Who wrote the commit and when it was committed: plain values read from git by the caller."""

    author: str
    email: str
    time: int  # the commit time, seconds since the epoch
    offset: int  # the committer's UTC offset, minutes
    subject: str = ""

    def when(self) -> str:
        zone = timezone(timedelta(minutes=self.offset))
        return datetime.fromtimestamp(self.time, UTC).astimezone(zone).strftime("%Y-%m-%d %H:%M:%S %z")


def _luminance(colour: str) -> float:
    """WCAG relative luminance of ``#rrggbb``."""
    def channel(c: int) -> float:
        v = c / 255
        return v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4
    r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)


def contrast(a: str, b: str) -> float:
    """WCAG contrast ratio of two ``#rrggbb`` colours (1 to 21; 4.5 and more reads well)."""
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def ink(background: str) -> str:
    """The text colour that reads better on ``background``: black or white."""
    return max(("#000000", "#ffffff"), key=lambda c: contrast(c, background))


def _css(prefix: str, colours: dict[str, str]) -> str:
    return "\n".join(f".{prefix}-{name} {{ background: {c}; color: {ink(c)}; }}" for name, c in colours.items())


def _cls(prefix: str, word: str, colours: dict[str, str]) -> str:
    """The class of a cell: its state's (a known word only: states come from notes) or "other"."""
    return f"{prefix}-{word}" if word in colours else f"{prefix}-other"


def _steps_html(table: StepTable | None) -> str:
    if table is None or not table.columns:
        return ""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
    body = "".join(
        f"<tr><th>{html.escape(node)}</th>" + "".join(
            f'<td class="{_cls("step", c, STEP_COLOURS) if c else "step-none"}">{html.escape(c)}</td>'
            for c in cells) + "</tr>"
        for node, cells in table.rows.items())
    return f'<h2>Upgrade steps</h2>\n<table class="steps"><tr><th></th>{head}</tr>{body}</table>'


def _cell(s: NodeStatus) -> str:
    lines = [f'<b class="node">{html.escape(s.node)}</b>', f'<span class="state">{html.escape(s.state)}</span>']
    if s.stage:
        lines.append(f'<span class="stage">{html.escape(s.stage)}</span>')
    if s.detail:
        lines.append(f'<span class="detail">{html.escape(s.detail)}</span>')
    return (f'<td class="{_cls("state", s.state, COLOURS)}" title="{html.escape(s.detail or s.state)}">'
            + "<br>".join(lines) + "</td>")


def to_html(statuses: list[NodeStatus], commit: str, title: str, steps: StepTable | None = None, *,
            info: CommitInfo | None = None, refresh: int | None = None) -> str:
    """A self-contained page (no script, no external asset; every value escaped): the commit and
    its author, waves as rows, nodes as coloured cells (state, stage, and the failing service and
    reason, also on hover), the nodes that stopped the rollout, the upgrade's nodes x steps table
    when the commit upgrades something, and a legend. ``refresh``: reload every so many seconds
    (a page served from a CI artifact while the rollout goes on)."""
    waves: dict[str, list[NodeStatus]] = {}
    for s in statuses:
        waves.setdefault(s.wave, []).append(s)
    rows = "".join(f'<tr><th>{html.escape(wave)}</th>{"".join(_cell(s) for s in members)}</tr>'
                   for wave, members in waves.items())
    legend = " ".join(f'<span class="state-{k}">{html.escape(k)}</span>' for k in COLOURS)
    summary = ", ".join(f"{v} {k}" for k, v in counts(statuses).items())
    failures = "".join(  # a halted node's detail already starts "halted: ..."
        f"<li><b>{html.escape(s.node)}</b> "
        + html.escape(s.detail if s.detail.startswith(f"{s.state}:") else f"{s.state}: {s.detail}") + "</li>"
        for s in statuses if s.state in ("failed", "halted", "refused", "error") and s.detail)
    by = ""
    if info is not None:
        by = (f'<p class="commit-info">by <span class="author">{html.escape(info.author)} '
              f"&lt;{html.escape(info.email)}&gt;</span>, committed "
              f'<span class="time">{html.escape(info.when())}</span>'
              + (f': <span class="subject">{html.escape(info.subject)}</span>' if info.subject else "") + "</p>\n")
    meta = f'<meta http-equiv="refresh" content="{int(refresh)}">\n' if refresh else ""
    return f"""<!doctype html>
<html><head><meta charset="utf-8">
{meta}<title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #000000; background: #ffffff; }}
table {{ border-collapse: separate; border-spacing: 4px; }}
th {{ text-align: right; padding-right: 1em; }}
td {{ padding: 0.5em 0.8em; border-radius: 4px; text-align: center; min-width: 5em; max-width: 22em; }}
td .detail {{ font-size: small; }}
table.steps td {{ min-width: 4em; padding: 0.3em 0.5em; }}
.legend span {{ padding: 0.2em 0.6em; border-radius: 3px; margin-right: 0.3em; }}
{_css("state", COLOURS)}
.state-other {{ background: {OTHER}; color: {ink(OTHER)}; }}
{_css("step", STEP_COLOURS)}
.step-other {{ background: {OTHER}; color: {ink(OTHER)}; }}
.step-none {{ background: {NO_STEP}; color: {ink(NO_STEP)}; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<p>commit <code>{html.escape(commit)}</code>: {html.escape(summary)}</p>
{by}<table class="waves">{rows}</table>
<ul class="stopped">{failures}</ul>
{_steps_html(steps)}
<p class="legend">{legend}</p>
</body></html>
"""
