"""``status --fleet``: the whole rollout of a commit, from every node's notes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from ..atomic import atomic_write
from ..errors import ReconcilerError
from .common import Failed, emit_json, node_agent, out, style

# A node in one of these states has stopped the rollout of the commit: nobody after it starts.
STOPPED = ("error", "failed", "halted", "refused")


def show_fleet(agent_opts: dict[str, Any], rev: str | None, html_file: Path | None, output: str) -> None:
    from ..fleet import counts, fleet_status, stage_labels, step_table, to_html
    from ..rollout import plan_rollout
    from ..upgrader import stage_bases

    the_agent = node_agent(agent_opts)
    with the_agent.state.lock(wait=30):
        head, _ = the_agent.head(fetch=True, rev=None)
        commit = head if rev is None else the_agent.head(fetch=False, rev=rev)[0]
        fleet_view = the_agent.fleet_view()
    # The repo at the commit (and the ancestors its stages point back to): for the order of the
    # waves, the stages and the upgrade's steps only; nothing is applied.
    repo = the_agent.load(commit)
    rollout = plan_rollout(repo.settings, repo.nodes, repo.members)
    base = stage_bases(the_agent, commit, repo)
    statuses = fleet_status(rollout, sorted(repo.nodes), commit, fleet_view, stage_labels(repo, base))
    steps = step_table(repo, commit, fleet_view, base, [n for _, m in rollout.batches() for n in m])
    if html_file is not None:
        atomic_write(html_file, to_html(statuses, commit, f"{repo.name}: rollout of {commit[:12]}", steps).encode())
    tally = counts(statuses)
    stopped = {k: v for k, v in tally.items() if k in STOPPED}
    if output == "json":
        result: dict[str, Any] = {"commit": commit, "counts": tally, "nodes": [s.to_dict() for s in statuses]}
        if steps.columns:
            result["upgrade"] = steps.to_dict()
        if stopped:
            raise Failed(_stopped_error(commit, stopped), result)
        emit_json(result)
        return
    staged = any(s.stage for s in statuses)
    table = Table("wave", "node", "state", *(("stage",) if staged else ()), "detail",
                  title=f"{repo.name} @ {commit[:12]}")
    for s in statuses:
        table.add_row(s.wave, s.node, style(s.state), *((escape(s.stage),) if staged else ()), escape(s.detail))
    out.print(table)
    if steps.columns:
        grid = Table("node", *(escape(c) for c in steps.columns), title="upgrade steps")
        for node, cells in steps.rows.items():
            grid.add_row(node, *(style(c) if c else "·" for c in cells))
        out.print(grid)
    out.print(", ".join(f"{v} {k}" for k, v in tally.items()))
    if stopped:
        sys.exit(1)  # the table says which node and why: no extra error line


def _stopped_error(commit: str, stopped: dict[str, int]) -> ReconcilerError:
    what = ", ".join(f"{v} {k}" for k, v in stopped.items())
    return ReconcilerError(f"the rollout of {commit[:12]} is stopped: {what}", reason="ROLLOUT_STOPPED")
