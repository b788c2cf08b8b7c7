"""The whole rollout at a glance, from the notes every node pushes: per commit, per wave, each
node applied, failed, halted, refused, rebooting or pending, and the failing service.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from .notes import Note
from .rollout import FleetView, Rollout

COLOURS = {"applied": "#2e7d32", "failed": "#c62828", "halted": "#ef6c00", "refused": "#6a1b9a",
           "error": "#c62828", "rebooting": "#0277bd", "pending": "#9e9e9e", "staged": "#f9a825"}


@dataclass(frozen=True)
class NodeStatus:
    node: str
    wave: str
    state: str
    commit: str  # the commit its state is about (C, or the descendant it applied)
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "wave": self.wave, "state": self.state, "commit": self.commit,
                "detail": self.detail}


def fleet_status(rollout: Rollout, nodes: list[str], commit: str, fleet: FleetView) -> list[NodeStatus]:
    wave_of = {n: w.name for w in rollout.waves for n in w.nodes}
    out = []
    for node in sorted(nodes, key=lambda n: (_wave_index(rollout, n), n)):
        mine: Note | None = next((x for x in fleet.notes.get(node, ()) if x.commit == commit), None)
        reached = fleet.reached(node, commit)
        if mine is not None and mine.state != "applied":
            detail = f"{mine.failed_service}: {mine.error}" if mine.failed_service else mine.error
            out.append(NodeStatus(node, wave_of.get(node, "-"), mine.state, commit, detail))
        elif reached is not None:
            note = "" if reached.commit == commit else f"at descendant {reached.commit[:12]}"
            out.append(NodeStatus(node, wave_of.get(node, "-"), "applied", reached.commit, note))
        else:
            out.append(NodeStatus(node, wave_of.get(node, "-"), "pending", commit))
    return out


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


def to_html(statuses: list[NodeStatus], commit: str, title: str) -> str:
    """A self-contained page: waves as rows, nodes as coloured cells, a legend."""
    waves: dict[str, list[NodeStatus]] = {}
    for s in statuses:
        waves.setdefault(s.wave, []).append(s)
    rows = []
    for wave, members in waves.items():
        cells = "".join(
            f'<td style="background:{COLOURS.get(s.state, "#607d8b")}" title="{html.escape(s.detail or s.state)}">'
            f"{html.escape(s.node)}<br><small>{html.escape(s.state)}</small></td>" for s in members)
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
.legend span {{ color: white; padding: 0.2em 0.6em; border-radius: 3px; margin-right: 0.3em; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<p>commit <code>{html.escape(commit)}</code>: {html.escape(summary)}</p>
<table>{"".join(rows)}</table>
<ul>{failures}</ul>
<p class="legend">{legend}</p>
</body></html>
"""
