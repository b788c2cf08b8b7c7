"""``status --fleet`` and ``history --fleet``: the whole rollout of a commit, from every node's
notes, read through a node's agent or from any clone of the deployment repo (``--repo``)."""

from __future__ import annotations

import contextlib
import gc
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pygit2

from reconciler.cli.common import Failed, emit_json, err, escape, new_table, node_agent, out, style, write_output
from reconciler.core.errors import ReconcilerError

if TYPE_CHECKING:
    from reconciler.fleet.rollout import FleetView
    from reconciler.fleet.status import CommitInfo, NodeStatus, StepTable
    from reconciler.repo.definitions import DeploymentRepo

# A node in one of these states has stopped the rollout of the commit: nobody after it starts.
STOPPED = ("error", "failed", "halted", "refused")


@dataclass(frozen=True)
class Snapshot:
    """What the fleet says about one commit, read once."""

    commit: str
    name: str  # the deployment's name, from reconciler.yaml
    statuses: list[NodeStatus]
    steps: StepTable  # the commit's upgrade as nodes x steps (empty when it upgrades nothing)
    info: CommitInfo  # its author, commit time and subject


class FleetSource:
    """Where the notes come from: the node's mirror (its agent settings) or any clone of the
    deployment repo (``--repo``: no node settings, state dir or trust root)."""

    def __init__(self, agent_opts: dict[str, Any], repo_dir: Path | None) -> None:
        named = any(agent_opts.get(k) for k in ("config_file", "node", "state_dir"))
        self.clone = None if named and repo_dir is None else repo_dir or Path(".")
        if self.clone is None:
            self.agent = node_agent(agent_opts)
        else:
            self.remote = agent_opts.get("remote") or "origin"
            self.branch = agent_opts.get("branch") or "main"

    def read(self, rev: str | None, history: bool = False) -> tuple[pygit2.Repository, str, FleetView]:
        """Fetch the notes now: (the repo, the commit asked for or the branch head, the view).
        From a clone, the view of that commit only (the notes its status shows: ``Shown``), or
        with ``history`` of every commit."""
        from reconciler.fleet.view import fetch_from_clone, fleet_view, open_clone, resolve

        if self.clone is None:
            with self.agent.state.lock(wait=30):
                head, _ = self.agent.head(fetch=True, rev=None)
                commit = head if rev is None else self.agent.head(fetch=False, rev=rev)[0]
                # Notes are checked against trust/nodes at the node's mark; a state dir that has
                # verified nothing yet verifies the head first (a refusal is the error it is).
                trusted = None if self.agent.ledger.mark().commit else self.agent.ctx.keeper.decide(head).head
                view = self.agent.fleet_view(trusted=trusted)
            return self.agent.source.repo, commit, view
        from reconciler.fleet.known import KnownNotes
        from reconciler.trust.notesig import note_trust

        head = fetch_from_clone(self.clone, self.remote, self.branch)
        repo = open_clone(self.clone)
        # The keys of trust/nodes at the clone's own HEAD (what the operator checked out), never
        # at the head just fetched: a clone verifies no commit, and whoever serves --remote
        # would name the keys (the threat model).
        own = None if repo.head_is_unborn else str(repo.head.target)
        trust = note_trust(repo, own)
        commit = head if rev is None else resolve(repo, rev)
        # The notes this user's earlier runs found counting under the same keys: not checked
        # again (a fleet's 10,000 signatures are most of a run), each new one is.
        return repo, commit, fleet_view(repo, trust=trust, known=KnownNotes.of(trust),
                                        about=None if history else commit)

    def load(self, commit: str) -> DeploymentRepo:
        if self.clone is None:
            return self.agent.load(commit)
        from reconciler.repo.load import load_repo
        from reconciler.repo.tree import open_tree

        return load_repo(open_tree(self.clone, commit))

    def snapshot(self, rev: str | None) -> Snapshot:
        with _no_collector_passes():
            return self._snapshot(rev)

    def _snapshot(self, rev: str | None) -> Snapshot:
        from reconciler.fleet.rollout import plan_rollout
        from reconciler.fleet.status import CommitInfo, fleet_status, stage_labels, step_table
        from reconciler.upgrades.history import bases_in

        git, commit, view = self.read(rev)
        # The repo at the commit (and the ancestors its stages point back to): for the order of
        # the waves, the stages and the upgrade's steps only; nothing is applied.
        repo = self.load(commit)
        rollout = plan_rollout(repo.settings, repo.nodes, repo.members)
        base = bases_in(git, commit, repo, self.load)
        order = [n for _, m in rollout.batches() for n in m]
        made = git[commit]
        assert isinstance(made, pygit2.Commit)
        info = CommitInfo(made.author.name, made.author.email, made.commit_time, made.commit_time_offset,
                          made.message.split("\n", 1)[0])
        return Snapshot(commit, repo.name, fleet_status(rollout, sorted(repo.nodes), commit, view,
                                                        stage_labels(repo, base), repo.planes),
                        step_table(repo, commit, view, base, order), info)


@contextlib.contextmanager
def _no_collector_passes() -> Iterator[None]:
    """A snapshot builds millions of objects (each note's body, the repo's YAML) and leaves no
    cycle to collect: the cyclic collector, walking them all again as they pile up, took 0.5-1 s
    of a 10,000-node fleet's status (issue 40). It runs again once the snapshot is made."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def show_fleet(agent_opts: dict[str, Any], rev: str | None, html_file: Path | None, output: str, *,
               repo_dir: Path | None = None, watch: bool = False, interval: float = 10.0,
               html_refresh: int | None = None) -> None:
    from reconciler.fleet.status import counts, to_html

    source = FleetSource(agent_opts, repo_dir)
    snap = source.snapshot(rev)
    # --watch: the rollout of this one commit, read again until every node is done with it.
    while watch and not all(s.state == "applied" or s.state in STOPPED for s in snap.statuses):
        if output == "human":
            err.print(f"{time.strftime('%H:%M:%S')} {snap.commit[:12]}: "
                      + ", ".join(f"{v} {escape(k)}" for k, v in counts(snap.statuses).items()))
        time.sleep(interval)
        snap = source.snapshot(snap.commit)
    commit, statuses, steps = snap.commit, snap.statuses, snap.steps
    if html_file is not None:
        page = to_html(statuses, commit, f"{snap.name}: rollout of {commit[:12]}", steps, info=snap.info,
                       refresh=html_refresh)
        write_output("--html", html_file, page.encode())
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
    released = any(s.release for s in statuses)
    pending = any(s.pending_release for s in statuses)
    planes = any(s.plane for s in statuses)
    print_table(f"{escape(snap.name)} @ {commit[:12]}",
                ["wave", "node", "state", *(("stage",) if staged else ()), *(("release",) if released else ()),
                 *(("pending",) if pending else ()), *(("plane",) if planes else ()), "detail"],
                [[(s.wave, False), (s.node, False), (s.state, True), *(((s.stage, False),) if staged else ()),
                  *(((s.release, False),) if released else ()), *(((s.pending_release, False),) if pending else ()),
                  *(((s.plane, False),) if planes else ()), (s.detail, False)] for s in statuses])
    if steps.columns:
        print_table("upgrade steps", ["node", *steps.columns],
                    [[(node, False), *((c, True) if c else ("·", False) for c in cells)]
                     for node, cells in steps.rows.items()])
    out.print(", ".join(f"{v} {escape(k)}" for k, v in tally.items()))
    if stopped:
        sys.exit(1)  # the table says which node and why: no extra error line


def show_fleet_history(agent_opts: dict[str, Any], repo_dir: Path | None, limit: int, output: str) -> None:
    """The branch's commits, newest first (first parents), each with what the nodes noted on it."""
    source = FleetSource(agent_opts, repo_dir)
    repo, head, view = source.read(None, history=True)
    rows: list[dict[str, Any]] = []
    walker = repo.walk(head)
    walker.simplify_first_parent()  # the branch's own commits, not those merged into it
    for commit in walker:
        if len(rows) >= limit:
            break
        cid = str(commit.id)
        on_it = [n for node in sorted(view.notes) if (n := view.note(node, cid)) is not None]
        tally: dict[str, int] = {}
        for n in on_it:
            tally[n.state] = tally.get(n.state, 0) + 1
        rows.append({"commit": cid, "author": commit.author.name, "subject": commit.message.split("\n", 1)[0],
                     "time": commit.commit_time, "counts": dict(sorted(tally.items())),
                     "failed": [{"node": n.node, "service": n.failed_service, "error": n.error}
                                for n in on_it if n.state == "failed"]})
    if output == "json":
        emit_json(rows)
        return
    table = new_table("commit", "author", "subject", "nodes", "failed")
    for r in rows:
        table.add_row(r["commit"][:12], escape(r["author"]), escape(r["subject"]),
                      ", ".join(f"{v} {style(k)}" for k, v in r["counts"].items()) or "-",
                      escape("; ".join(f"{f['node']} {f['service']}: {f['error']}".strip() for f in r["failed"])))
    out.print(table)


# A cell of a table: its text as a note or the repo says it, and whether it is a state word
# (coloured by ``style`` on a terminal).
Cell = tuple[str, bool]


def print_table(title: str, headers: list[str], rows: list[list[Cell]]) -> None:
    """rich's table of ``rows``; written directly, the very same characters, where no colour
    is printed and it fits the width as laid out: rich takes some 0.35 ms a row to lay out and
    render (3.5 s of a 10,000-node fleet's status), this a few microseconds."""
    # (an output that cannot take UTF-8 gets rich's ASCII box: rich draws it)
    if not out.is_terminal and out.color_system is None and out.encoding.startswith("utf") \
            and not out.legacy_windows:
        text = plain_table(title, headers, rows, out.width)
        if text is not None:
            out.file.write(text)
            out.file.flush()
            return
    out.print(rich_table(title, headers, rows))


def rich_table(title: str, headers: list[str], rows: list[list[Cell]]) -> Any:
    table = new_table(*(escape(h) for h in headers), title=title)
    for row in rows:
        table.add_row(*(style(text) if coloured else escape(text) for text, coloured in row))
    return table


def plain_table(title: str, headers: list[str], rows: list[list[Cell]], width: int) -> str | None:
    """What rich prints for this table (box HEAVY_HEAD, one space of padding, the title as is
    above it: the console's soft wrap), without colour; None where rich would shrink or wrap a
    column to fit ``width`` (rich then lays it out)."""
    from rich.cells import cell_len

    grid = [[_shown(escape(h)) for h in headers], *([_cell(t, coloured) for t, coloured in row] for row in rows)]
    sizes = [[len(t) if t.isascii() else cell_len(t) for t in line] for line in grid]
    # rich pads a cell with spaces and measures the whole, and trims the whitespace it wraps
    # at: a zero-width joiner joins the padding, an ideographic space at the end is dropped.
    # A cell with a space or a format character beyond ASCII, or one that counts otherwise
    # beside a space, is laid out by rich (a name or a note's text with one is a rare thing).
    if any(not t.isascii() and (_unusual(t) or cell_len(f" {t} ") != n + 2)
           for line, ns in zip(grid, sizes, strict=True) for t, n in zip(line, ns, strict=True)):
        return None
    widths = [max(column) + 2 for column in zip(*sizes, strict=True)]
    if sum(widths) + len(widths) + 1 > width:
        return None

    def line(cells: list[str], lengths: list[int], edge: str) -> str:
        return edge + edge.join(f" {c}{' ' * (w - n - 1)}" for c, n, w in zip(cells, lengths, widths, strict=True)) \
            + edge + "\n"

    def rule(left: str, bar: str, mid: str, right: str) -> str:
        return left + mid.join(bar * w for w in widths) + right + "\n"

    return "".join([_shown(title) + "\n" if title else "", rule("┏", "━", "┳", "┓"), line(grid[0], sizes[0], "┃"),
                    rule("┡", "━", "╇", "┩"), *(line(c, n, "│") for c, n in zip(grid[1:], sizes[1:], strict=True)),
                    rule("└", "─", "┴", "┘")])


def _unusual(text: str) -> bool:
    """A space, a separator or a format character (zero-width, soft hyphen, tag) beyond ASCII."""
    import unicodedata

    return any(not c.isascii() and unicodedata.category(c)[0] in "ZC" for c in text)


def _cell(text: str, coloured: bool) -> str:
    """What rich shows of a cell: a state word as ``style`` marks it up (its closing tag reads a
    trailing backslash as an escape), any other text as ``escape`` does."""
    shown = escape(text)
    if coloured and shown.endswith("\\"):
        from rich.text import Text

        return Text.from_markup(style(text)).plain
    return _shown(shown)


def _shown(markup: str) -> str:
    """What rich shows of ``markup`` (text ``escape``d): the text itself, but where rich reads
    something in it (an escaped bracket, a backslash, an emoji code between colons)."""
    if ":" in markup or "[" in markup or "\\" in markup:
        from rich.text import Text

        return Text.from_markup(markup).plain
    return markup


def _stopped_error(commit: str, stopped: dict[str, int]) -> ReconcilerError:
    what = ", ".join(f"{v} {k}" for k, v in stopped.items())
    return ReconcilerError(f"the rollout of {commit[:12]} is stopped: {what}", reason="ROLLOUT_STOPPED")
