"""The whole rollout at a glance, from the notes every node pushes: per commit, per wave, each
node applied, failed, halted, refused, rebooting or pending, and the failing service; for a
commit that upgrades services, each node's upgrade steps (a table of nodes x steps) and the
stage each node is at.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .notes import Note
from .rollout import FleetView, Rollout
from .upgrade import Bases, fleet_upgrades_of, held_back, holding, stage_of, upgraded

if TYPE_CHECKING:
    from .repo import DeploymentRepo

COLOURS = {"applied": "#2e7d32", "failed": "#c62828", "halted": "#ef6c00", "refused": "#6a1b9a",
           "error": "#c62828", "rebooting": "#0277bd", "pending": "#9e9e9e", "staged": "#f9a825"}


@dataclass(frozen=True)
class NodeStatus:
    node: str
    wave: str
    state: str
    commit: str  # the commit its state is about (C, or the descendant it applied)
    detail: str = ""
    stage: str = ""  # with stages: the commit's stage this node is in, or what it keeps outside it

    def to_dict(self) -> dict[str, Any]:
        out = {"node": self.node, "wave": self.wave, "state": self.state, "commit": self.commit,
               "detail": self.detail}
        if self.stage:
            out["stage"] = self.stage
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
                 stages: dict[str, str] | None = None) -> list[NodeStatus]:
    wave_of = {n: w.name for w in rollout.waves for n in w.nodes}
    stages = stages or {}
    out = []
    for node in sorted(nodes, key=lambda n: (_wave_index(rollout, n), n)):
        mine: Note | None = next((x for x in fleet.notes.get(node, ()) if x.commit == commit), None)
        reached = fleet.reached(node, commit)
        if mine is not None and mine.state != "applied":
            detail = f"{mine.failed_service}: {mine.error}" if mine.failed_service else mine.error
            out.append(NodeStatus(node, wave_of.get(node, "-"), mine.state, commit, detail, stages.get(node, "")))
        elif reached is not None:
            note = "" if reached.commit == commit else f"at descendant {reached.commit[:12]}"
            out.append(NodeStatus(node, wave_of.get(node, "-"), "applied", reached.commit, note,
                                  stages.get(node, "")))
        else:
            out.append(NodeStatus(node, wave_of.get(node, "-"), "pending", commit, stage=stages.get(node, "")))
    return out


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
            cells.append(status)
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


STEP_COLOURS = {"done": "#2e7d32", "skipped": "#81c784", "started": "#0277bd", "waiting": "#9e9e9e",
                "failed": "#c62828", "undone": "#ef6c00"}


def _steps_html(table: StepTable | None) -> str:
    if table is None or not table.columns:
        return ""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
    body = "".join(
        f"<tr><th>{html.escape(node)}</th>" + "".join(
            f'<td style="background:{STEP_COLOURS.get(c, "#eeeeee")}">{html.escape(c)}</td>' for c in cells) + "</tr>"
        for node, cells in table.rows.items())
    return f'<h2>Upgrade steps</h2><table class="steps"><tr><th></th>{head}</tr>{body}</table>'


def to_html(statuses: list[NodeStatus], commit: str, title: str, steps: StepTable | None = None) -> str:
    """A self-contained page: waves as rows, nodes as coloured cells (with their stage), a
    legend, and the upgrade's nodes x steps table when the commit upgrades something."""
    waves: dict[str, list[NodeStatus]] = {}
    for s in statuses:
        waves.setdefault(s.wave, []).append(s)
    rows = []
    for wave, members in waves.items():
        cells = "".join(
            f'<td style="background:{COLOURS.get(s.state, "#607d8b")}" title="{html.escape(s.detail or s.state)}">'
            f"{html.escape(s.node)}<br><small>{html.escape(s.state)}</small>"
            + (f"<br><small>{html.escape(s.stage)}</small>" if s.stage else "") + "</td>" for s in members)
        rows.append(f"<tr><th>{html.escape(wave)}</th>{cells}</tr>")
    legend = " ".join(f'<span style="background:{c}">{html.escape(k)}</span>' for k, c in COLOURS.items())
    summary = ", ".join(f"{v} {k}" for k, v in counts(statuses).items())
    failures = "".join(f"<li><b>{html.escape(s.node)}</b> {html.escape(s.state)}: {html.escape(s.detail)}</li>"
                       for s in statuses if s.state in ("failed", "halted", "refused", "error") and s.detail)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }}
table {{ border-collapse: separate; border-spacing: 4px; }}
th {{ text-align: right; padding-right: 1em; }}
td {{ color: white; padding: 0.5em 0.8em; border-radius: 4px; text-align: center; min-width: 5em; }}
table.steps td {{ min-width: 4em; padding: 0.3em 0.5em; }}
.legend span {{ color: white; padding: 0.2em 0.6em; border-radius: 3px; margin-right: 0.3em; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<p>commit <code>{html.escape(commit)}</code>: {html.escape(summary)}</p>
<table>{"".join(rows)}</table>
<ul>{failures}</ul>
{_steps_html(steps)}
<p class="legend">{legend}</p>
</body></html>
"""
