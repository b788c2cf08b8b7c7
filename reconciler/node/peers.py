"""This node among its peers: their notes read from its read remote and the rollout's word on
a commit (go, wait for the wave or barrier before, halted by a failure); the watch a node keeps
over the nodes taking the VIP networks over in a cutover (``repo.planes``); and its disruption
slot (``fleet.budget``): its claim written to its own notes ref and pushed, every node's claims
read through the same view.

Every decision a node makes about the rest of the fleet starts here; the notes are decoded by
``fleet.view``, the one reader of other nodes' notes, and judged by ``fleet.rollout``.

A node takes a slot for the pass whose plan restarts, recreates, drains or reboots something
of a group with a budget, and frees it once that pass settled (its services passed their
checks, or failed and were put back). A reboot keeps the slot until the node is back.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from reconciler.core.errors import ReconcilerError, RemoteError
from reconciler.core.model import Plan, Verdict
from reconciler.core.text import printable
from reconciler.fleet.notes import Claim
from reconciler.fleet.rollout import WHOLE_READ_EVERY, FleetView, Quiet, begun, decide, early, plan_rollout, sentinel
from reconciler.fleet.rollout import Verdict as Go
from reconciler.node.settle import write_note
from reconciler.source.refs import NOTES_PREFIX, NotPlain, read_ref

if TYPE_CHECKING:
    from reconciler.node.context import NodeContext
    from reconciler.repo.budgets import Budget
    from reconciler.repo.definitions import DeploymentRepo
    from reconciler.trust.notesig import NoteTrust

log = logging.getLogger("reconciler.agent")

CLOCK_SKEW = 300.0
"""Seconds a node's clock may run ahead of another's (NTP keeps them far closer)."""


# the notes of the others, and the rollout's word --------------------------------------------
def fleet_view(ctx: NodeContext, nodes: Iterable[str] | None = None, trusted: str | None = None) -> FleetView:
    """The notes of ``nodes`` (None: every node's), fetched now from the read remote this
    pass uses (only those refs: a node waiting on three predecessors reads three refs, not
    the fleet's); this node's own from its local ref, the freshest. ``trusted``: a commit this
    process verified, whose ``trust/nodes`` to check the notes with (None: the mark's)."""
    from reconciler.fleet.view import FLEET_PREFIX  # pygit2: only once the fleet is read
    from reconciler.fleet.view import fleet_view as read_fleet

    fetch_notes(ctx, nodes)
    # its own ref is fresher than what it fetched back, once it has one (a state dir that has
    # noted nothing, a view from another state dir, reads the remote's)
    own = {ctx.node: ctx.reporter.ref} if ctx.reporter.ref in ctx.source.repo.references else {}
    return read_fleet(ctx.source.repo, FLEET_PREFIX, own, note_trust_of(ctx, trusted), ctx.clock())


def fetch_notes(ctx: NodeContext, nodes: Iterable[str] | None) -> None:
    """Fetch the notes of ``nodes`` (None: every node's) from the read remote (``fleet_view``,
    a wait-poll without a probe)."""
    from reconciler.fleet.view import FLEET_PREFIX

    if nodes is None:
        specs = [f"+{NOTES_PREFIX}*:{FLEET_PREFIX}*"]
    else:
        # One glob per node: protocol v2 asks the server for that prefix only, and a node that
        # has noted nothing yet (no ref) is no error, as it would be for an exact refspec.
        specs = [f"+{NOTES_PREFIX}{n}*:{FLEET_PREFIX}{n}*" for n in sorted(set(nodes))
                 if n != ctx.node]
    if specs:
        ctx.source.run("fetch", "--no-tags", "--prune", ctx.source.url, *specs, what="notes fetch from")


def note_trust_of(ctx: NodeContext, commit: str | None = None) -> NoteTrust:
    """Whose key speaks for which node: ``trust/nodes`` at the newest commit this node verified
    (its high-water mark: a commit it already judged signed), or at ``commit``. Never at a head it
    has not verified: whoever serves the repo could otherwise name the keys."""
    from reconciler.trust.notesig import note_trust

    commit = commit or ctx.ledger.mark().commit
    memo = ctx.memory.note_trust
    if memo is None or memo[0] != commit:
        memo = ctx.memory.note_trust = (commit, note_trust(ctx.source.repo, commit))
    return memo[1]


def _still(ctx: NodeContext, sentinel: str, commit: str) -> bool:
    """The sentinel has not begun ``commit``: the read remote's probe publishes the notes tip
    this node fetched last (no git at all), or a read of that one ref says so."""
    from reconciler.fleet.view import FLEET_PREFIX

    probe = ctx.source.probes.get(ctx.source.url)
    if probe is not None and (tip := probe.note_tip(sentinel)) is not None:
        try:
            if tip == read_ref(ctx.source.path, f"{FLEET_PREFIX}{sentinel}"):
                return True
        except NotPlain:
            pass  # git's read below says
    return not begun(fleet_view(ctx, (sentinel,)), sentinel, commit)


def rollout_gate(ctx: NodeContext, repo: DeploymentRepo, commit: str, *, barriers: bool = False,
                 fleet: FleetView | None = None, before: bool | None = None) -> Go:
    """``barriers``: this node takes part in an upgrade of ``commit``; its steps' barriers
    order it (the waves do not), and a failure anywhere halts it all the same. ``before``: on
    the VIP networks after the commit it settled last (a node joining them waits for the
    nodes that leave them: see ``repo.planes``). A wait leaves in ``ctx.memory.watch`` the
    nodes whose next note may end it, for the daemon's wait-polls."""
    verdict = _rollout_gate(ctx, repo, commit, barriers=barriers, fleet=fleet, before=before)
    quiet = ctx.memory.quiet
    if verdict.go or verdict.halted:
        ctx.memory.watch = ()
    elif quiet is not None and quiet.commit == commit and verdict is quiet.verdict:
        ctx.memory.watch = (quiet.sentinel,)  # the batch before has not begun: its sentinel tells
    else:
        watch(ctx, verdict.waiting_for)
    return verdict


# A waiting node's wait-poll reads at most this many notes tips: the batch before a node of a
# large wave can be hundreds. Each note that ends a wait is seen once it is among the few left.
WATCH_AT_MOST = 4


def watch(ctx: NodeContext, nodes: Iterable[str]) -> None:
    """The daemon's wait-polls look at the notes of a few of ``nodes`` (the pass waits for them:
    the wave before, the holders of a disruption slot, an upgrade barrier's laggards), each
    waiting node its own few (no one file read by all)."""
    ctx.memory.watch = tuple(sorted(set(nodes) - {ctx.node},
                                    key=lambda n: zlib.crc32(f"{ctx.node}/{n}".encode()))[:WATCH_AT_MOST])


def _rollout_gate(ctx: NodeContext, repo: DeploymentRepo, commit: str, *, barriers: bool = False,
                  fleet: FleetView | None = None, before: bool | None = None) -> Go:
    # A node under `decommission` is placed in the waves as its name places it (its decommission is
    # its apply of the commit); the others never wait for it: theirs is built without it.
    gone = ctx.node not in repo.nodes
    rollout = plan_rollout(repo.settings, (*repo.nodes, ctx.node) if gone else repo.nodes, repo.members)
    off = repo.planes.off(ctx.node) if not gone and repo.planes.attaches(ctx.node, before) else ()
    if not rollout.enabled and not barriers and not off:
        return Go(True)
    own = ctx.ledger.verdict(commit)
    if own is not None and own not in (Verdict.HALTED, Verdict.WAITING, Verdict.ERROR, Verdict.REFUSED):
        return Go(True, reason="already started")  # started it: finish it whatever others do
    if fleet is None and barriers:
        fleet = fleet_view(ctx)
    if fleet is None:  # waves alone: the batch before it (and who leaves the VIPs first)
        watched, near = rollout.watched(ctx.node), rollout.frontier(ctx.node)
        # The batch before first, every poll (its sentinel alone while it has not begun); all
        # of them when it is done. A cutover (``off``) reads all at once: it is rare, and its
        # wait is said before the waves'.
        if len(near) < len(watched) and not off:
            now = ctx.clock().timestamp()
            quiet = ctx.memory.quiet
            if (quiet is not None and quiet.commit == commit and 0 <= now - quiet.since < WHOLE_READ_EVERY
                    and _still(ctx, quiet.sentinel, commit)):
                return quiet.verdict
            view = fleet_view(ctx, near)
            said = early(rollout, ctx.node, commit, view)
            ctx.memory.quiet = None
            if said is not None and not said.halted and (s := sentinel(rollout, ctx.node, commit, view)):
                ctx.memory.quiet = Quiet(commit, s, now, said)
            if said is not None:
                return said
        fleet = fleet_view(ctx, (*watched, *off))
    return decide(rollout, ctx.node, commit, fleet, time.time(), barriers=barriers, off_first=off)


# a cutover ----------------------------------------------------------------------------------
def plane_of(node: str, repo: DeploymentRepo | None, before: bool | None, failed: bool) -> dict[str, Any] | None:
    """What the note says of the node's place while two control planes run side by side (see
    ``repo.planes``): release, mode, on the VIP networks or not, and, where it left them for a
    cutover, the nodes whose attach it watches (their failure puts it back on)."""
    if repo is None or node not in repo.nodes or not (repo.planes.active or repo.cutover_aborted):
        return None  # (not a node of the commit: one under `decommission`)
    planes = repo.planes
    out = planes[node].to_dict()
    if failed and planes.attaches(node, before):
        out["vip"] = "detached"  # put back where it was
    taking_over = planes.cutover(node) if planes.detaches(node, before) else ()
    if repo.cutover_aborted:
        out["aborted"] = True
    elif taking_over:
        out["watch"] = list(taking_over)
    return out


def cutover_watch(ctx: NodeContext, commit: str) -> list[str]:
    """This node left the VIP networks at ``commit`` for a cutover: while the nodes taking them
    over have not all noted it applied, read their notes; one that failed it aborts the cutover
    here (the next render of ``commit`` puts this node back on them). Returns what the note says."""
    plane = ctx.ledger.plane(commit)
    if not plane or not plane.get("watch") or plane.get("aborted"):
        return []
    watched = [str(n) for n in plane["watch"]]
    try:
        fleet = fleet_view(ctx, watched)
    except ReconcilerError as exc:  # the remote is away: look again next poll
        ctx.say_once(("cutover-watch", commit, exc.reason), logging.WARNING, "%s: %s: cannot read the notes of "
                       "%s: %s", ctx.node, commit[:12], ", ".join(watched), exc)
        return []
    failed = next((note for n in watched if (note := fleet.note(n, commit)) is not None and note.state == "failed"),
                  None)
    if failed is not None:
        # another node's words, quoted bounded and cleaned (they reach this node's note and log)
        why = f"cutover aborted: {failed.node} failed {commit[:12]}" + (
            f" ({printable(failed.error, 1024)})" if failed.error else "")
        text = f"{why}: back onto the VIP networks"
        # Why, with the commit's record, before the plane moves: a pass killed after the move
        # still notes it (the record is not noted yet, so no pass stops at the no-op check).
        if ctx.ledger.last_event(commit) != text:
            ctx.ledger.add_event(commit, text)
        ctx.ledger.replan(commit, {**{k: v for k, v in plane.items() if k != "watch"}, "aborted": True})
        log.error("%s: %s: back onto the VIP networks", ctx.node, why)
        return []
    if all(fleet.reached(n, commit) is not None for n in watched):
        ctx.ledger.replan(commit, {k: v for k, v in plane.items() if k != "watch"})
        write_note(ctx, commit)
    return []


# the disruption slot --------------------------------------------------------------------------
def take(ctx: NodeContext, repo: DeploymentRepo, plan: Plan) -> str | None:
    """None when this node may make the plan's disruptive changes now (it holds its slot in
    every budget it is in); otherwise why it waits, and for whom."""
    from reconciler.fleet.budget import DISRUPTIVE, budgets_of  # repo.windows, cronsim: not for the idle daemon

    node = ctx.node
    mine = budgets_of(repo.budgets, node)
    needs = [a for a in plan.actions if a.kind in DISRUPTIVE]
    if not mine or not needs:
        return None
    what = ", ".join(f"{a.kind} {a.service}" for a in needs)
    ctx.memory.watch = ()  # unless it waits for the holders of the slot (``_take``)
    try:
        return _take(ctx, mine, what)
    except RemoteError as exc:  # the others' claims unread: a wait, never a go (nor a failed commit)
        return f"waiting (budget): the other nodes' claims could not be read: {exc}"


def _take(ctx: NodeContext, mine: tuple[Budget, ...], what: str) -> str | None:
    from reconciler.fleet.budget import next_ticket, wait

    node = ctx.node
    if ctx.reporter.key is not None and (why := note_trust_of(ctx).refuses(node, ctx.reporter.key(), ctx.clock())):
        # the others would not count our claim: a slot taken unseen is no slot (a key not yet
        # listed in trust/nodes: a new node, a key made anew after the state dir was lost)
        return f"waiting (budget): this node's claim would count for no other node ({why})"
    group = {n for b in mine for n in b.members}
    claim = ctx.reporter.claim()
    now = ctx.clock().timestamp()
    if claim is None or claim.state != "queued" or not all(b.live(claim, now) for b in mine):
        # The doorway: say we are choosing before reading the others, so a node that reads us
        # meanwhile waits for our ticket instead of missing it.
        ctx.reporter.write_claim(Claim(node, "choosing", 0, now, what))
        if not ctx.reporter.push():
            return "waiting (budget): this node's claim could not be pushed (the remote did not answer)"
        seen = observed(ctx, fleet_view(ctx, group).claims)
        claim = Claim(node, "queued", next_ticket(seen, mine, ctx.clock().timestamp()), ctx.clock().timestamp(), what)
        ctx.reporter.write_claim(claim)
        if not ctx.reporter.push():
            return "waiting (budget): this node's ticket could not be pushed (the remote did not answer)"
    elif claim.action != what or now - claim.time > min(b.expire_after for b in mine).total_seconds() / 3:
        claim = replace(claim, time=now, action=what)  # still here: kept live while it waits
        ctx.reporter.write_claim(claim)
        ctx.reporter.push()
    held = wait(claim, observed(ctx, fleet_view(ctx, group).claims), mine, ctx.clock().timestamp())
    if held is not None:
        # Their next note (a ticket chosen, a slot freed) may end the wait: the daemon wait-polls
        # them, so the slot is taken within a wait-poll of its release, not at the next poll.
        watch(ctx, held.nodes)
        return str(held)
    log.info("%s: disruption slot taken (ticket %d): %s", node, claim.ticket, what)
    return None


def observed(ctx: NodeContext, claims: Mapping[str, Claim]) -> dict[str, Claim]:
    """The others' claims timed by this node's clock: each as of when this node first read it
    as it is now (a claim its node rewrites is new again; one nobody rewrites ages, and stops
    counting after ``expire_after``, whatever time its writer put in it). A claim dated more than
    ``CLOCK_SKEW`` ahead of this clock is expired: no clock is that far off, only a forger's.
    A claim older (by its writer's time) than one read before from the same node is a replay
    and does not replace it."""
    now = ctx.clock().timestamp()
    before = ctx.ledger.claims_seen()
    seen: dict[str, tuple[str, float]] = {}
    out: dict[str, Claim] = {}
    for node, claim in claims.items():
        if node == ctx.node:
            out[node] = claim  # our own, by our own clock
            continue
        if claim.time > now + CLOCK_SKEW:
            ctx.say_once(("claim-ahead", node, claim.time), logging.WARNING, "%s: %s's disruption claim is dated "
                         "%.0f s ahead of this clock: not counted", ctx.node, node, claim.time - now)
            continue
        as_read = f"{claim.state}|{claim.ticket}|{claim.time!r}|{claim.action}"
        first = before.get(node)
        if first is not None and (known := _as_claim(node, first[0])) is not None and claim.time < known.time:
            # older than one this node read before: a replay (a mirror serving a stale copy, an
            # old "free"); the newer one stands, aged from when it was first read
            claim, as_read = known, first[0]
        seen[node] = first if first is not None and first[0] == as_read else (as_read, now)
        out[node] = replace(claim, time=seen[node][1])
    if seen != before:
        ctx.ledger.set_claims_seen(seen)
    return out


def _as_claim(node: str, as_read: str) -> Claim | None:
    """A claim as ``observed`` keeps it (``state|ticket|time|action``)."""
    try:
        state, ticket, when, action = as_read.split("|", 3)
        return Claim(node, state, int(ticket), float(when), action)
    except ValueError:
        return None


def release(ctx: NodeContext) -> None:
    """Free this node's slot, if it holds or waits for one."""
    claim = ctx.reporter.claim()
    if claim is None or claim.state == "free":
        return
    ctx.reporter.write_claim(Claim(ctx.node, "free", 0, ctx.clock().timestamp()))
    ctx.reporter.push()  # a push that fails is retried on the next pass, like a note
