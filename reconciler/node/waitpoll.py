"""A waiting node's wait-poll (issue 40: waves start on the note): between passes, while the
rollout keeps this node waiting on a few others (``Memory.watch``, set by ``peers.rollout_gate``),
the daemon looks at their notes tips often and cheaply, and polls at once when one moved.

Two steps, so the daemon holds its pass lock only for what touches the mirror: ``notes_tips``
reads the read remote's probe (a few static files of a hundred bytes, no git, no lock);
``notes_moved`` compares with the refs this node fetched last, or fetches those refs alone when
the probe cannot say or is doubted, as often as the daemon lets it (``may_fetch``).

The tips are hints. A tip said to have moved is said again until a pass ran after it (a pass
that found the node's lock held loses no note); a probe that named a tip which the pass after
found git not to have is doubted (a broken hook, a web server that lies), and the wait-polls ask
git instead, until it names what git has again: a flapping probe starts one pass, not one a
second.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from reconciler.node.peers import fetch_notes
from reconciler.source.refs import NotPlain, read_ref

if TYPE_CHECKING:
    from reconciler.node.context import NodeContext

log = logging.getLogger("reconciler.agent")

Tips = Mapping[str, "str | None"]


def notes_tips(ctx: NodeContext, nodes: Iterable[str]) -> dict[str, str | None] | None:
    """The read remote's probe's word on the notes tips of ``nodes`` (None: a node with no notes);
    None when there is no probe or it cannot say (it backs off after a failure, ``TipProbe``)."""
    from reconciler.source.probe import ProbeFailed

    probe = ctx.source.probes.get(ctx.source.url)
    if probe is None:
        return None
    try:
        return {n: probe.notes_tip(n) for n in nodes if n != ctx.node}
    except ProbeFailed as exc:
        log.debug("%s: wait-poll: the probe cannot say (%s)", ctx.node, exc)
        return None


def notes_moved(ctx: NodeContext, nodes: Iterable[str], tips: Tips | None,
                may_fetch: Callable[[], bool] | None = None) -> tuple[str, ...] | None:
    """Those of ``nodes`` whose notes tip moved since this node fetched them last, by ``tips``
    (``notes_tips``) if believed, else by a fetch of those refs alone (one git request), when
    ``may_fetch`` (None: always) allows one now; None when it cannot say without one."""
    from reconciler.fleet.view import FLEET_PREFIX

    nodes = tuple(n for n in nodes if n != ctx.node)
    memory = ctx.memory
    pending = tuple(n for n in nodes if n in memory.told)
    if pending:  # no pass ran after them yet (it found the lock held): said again, no look needed
        return pending
    mine = {n: _local(ctx, f"{FLEET_PREFIX}{n}") for n in nodes}
    if tips is not None and _believed(ctx, nodes, tips, mine):
        seen = dict(tips)
    elif may_fetch is None or may_fetch():
        fetch_notes(ctx, nodes)
        seen = {n: _local(ctx, f"{FLEET_PREFIX}{n}") for n in nodes}
    else:
        return None
    moved = tuple(n for n in nodes if seen.get(n) != mine[n])
    memory.told.update({n: seen.get(n) for n in moved})
    return moved


def passed(ctx: NodeContext) -> None:
    """A pass ran to its end: the tips said to have moved before it are handled (it read them)."""
    ctx.memory.handled.update(ctx.memory.told)
    ctx.memory.told.clear()


def _believed(ctx: NodeContext, nodes: tuple[str, ...], tips: Tips, mine: Mapping[str, str | None]) -> bool:
    """Is the probe believed? Not once a tip it named, a pass ran after, is not what git gave
    that pass; again once it names what git has for each of ``nodes``."""
    memory = ctx.memory
    if all(tips.get(n) == mine[n] for n in nodes):
        if memory.notes_doubted:
            log.info("%s: the tip probe's notes tips agree with git again", ctx.node)
        memory.notes_doubted = False
        memory.handled.clear()  # settled: git has them
    elif not memory.notes_doubted:
        lied = [n for n in nodes if n in memory.handled and memory.handled[n] != mine[n]]
        if lied:
            n = lied[0]
            log.warning("%s: the tip probe named %s for the notes of %s, git gave %s: wait-polls ask git "
                        "until it agrees", ctx.node, (memory.handled[n] or "none")[:12], n, (mine[n] or "none")[:12])
            memory.notes_doubted = True
    return not memory.notes_doubted


def _local(ctx: NodeContext, ref: str) -> str | None:
    try:
        return read_ref(ctx.source.path, ref)
    except NotPlain:
        ref_ = ctx.source.repo.references.get(ref)
        return None if ref_ is None else str(ref_.target)
