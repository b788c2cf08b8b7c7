"""Fleet rollout through git notes: waves, batches, soak, and a full stop on failure.

Pure: the rollout plan (from reconciler.yaml), the other nodes' notes and the commit graph
(as a function) in, a verdict for one node out. There is no controller: every node reads the
notes of the nodes before it and decides for itself, in one deterministic order.

Order: the waves as listed; within a wave, its nodes sorted by name and cut into batches;
nodes in no wave form a last wave. A node starts commit C when every node in an earlier
batch has a note saying C, or a descendant of C, applied; after a wave with ``soak`` seconds,
the next wave waits that long after the wave's last note. Any note saying C failed halts
every node that has not started C (``halt_on_failure``, default true).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from typing import Any

from reconciler.core.text import printable
from reconciler.fleet.notes import Claim, Note

__all__ = ["FleetView", "Note", "Quiet", "Rollout", "Verdict", "Wave", "begun", "decide", "early", "plan_rollout",
           "sentinel"]

APPLIED_STATES = ("applied",)
FAILED_STATES = ("failed",)
ERROR_STATES = ("error",)
# An error note says the node could not use the commit at all (it does not render or validate
# there, a secret it cannot open): nothing applied, and the nodes after it would fare no better,
# so it stops the rollout as a failure does. Except a node the commit no longer lists: it
# stops nobody (the commit took it out of the fleet).
NOT_STOPPING = ("UNKNOWN_NODE",)


def stops(note: Note) -> bool:
    """Does this note of a node stop the rollout of its commit?"""
    return note.state in FAILED_STATES or (note.state in ERROR_STATES and note.reason not in NOT_STOPPING)
HALTED_STATES = ("halted",)


@dataclass(frozen=True)
class Wave:
    name: str
    nodes: tuple[str, ...]
    batch: int
    soak: float = 0.0


@dataclass(frozen=True)
class Rollout:
    waves: tuple[Wave, ...] = ()
    halt_on_failure: bool = True

    @property
    def enabled(self) -> bool:
        return bool(self.waves)

    def batches(self) -> list[tuple[Wave, tuple[str, ...]]]:
        out = []
        for wave in self.waves:
            for i in range(0, len(wave.nodes), wave.batch):
                out.append((wave, wave.nodes[i:i + wave.batch]))
        return out

    def watched(self, node: str) -> tuple[str, ...]:
        """The nodes whose notes ``node``'s verdict depends on: its turn on the batches before
        its own, a halt on those and on its own batch's peers, which run beside it (a later
        batch has not started). A node outside the plan depends on none."""
        try:
            mine = self.position(node)
        except KeyError:
            return ()
        return tuple(n for _, members in self.batches()[:mine + 1] for n in members if n != node)

    def frontier(self, node: str) -> tuple[str, ...]:
        """What a waiting node reads on a poll: the batch just before its own. The batches
        further back, and its own batch's peers, are read once that batch has all applied, just
        before the node goes (``early``, then ``decide``): each node before went only after such
        a read itself, and a peer can only have begun (and failed) once that batch was done. So a
        waiting node reads N / batches refs a poll, not every node before it, and a rollout no
        longer costs the server N x N reads; ``sentinel`` cuts that to one ref while the batch
        before has not begun."""
        try:
            mine = self.position(node)
        except KeyError:
            return ()
        return self.batches()[mine - 1][1] if mine > 0 else ()

    def position(self, node: str) -> int:
        for i, (_, members) in enumerate(self.batches()):
            if node in members:
                return i
        raise KeyError(node)


def plan_rollout(settings: Mapping[str, Any], nodes: Iterable[str], members: Callable[[str], Iterable[str]]) -> Rollout:
    """The rollout of reconciler.yaml's ``rollout:``: each wave by ``nodes`` (names or globs) or
    ``group``; ``batch`` a count or a percentage; a node is in the first wave that names it."""
    spec = settings.get("rollout") or {}
    all_nodes = sorted(nodes)
    placed: set[str] = set()
    waves = []
    for i, w in enumerate(spec.get("waves", [])):
        if "group" in w:
            chosen = set(members(str(w["group"])))
        else:
            chosen = {n for n in all_nodes for pattern in w.get("nodes", []) if fnmatchcase(n, str(pattern))}
        names = tuple(sorted(chosen - placed))
        placed.update(names)
        if names:
            waves.append(Wave(str(w.get("name", f"wave{i + 1}")), names, _batch(w.get("batch"), len(names)),
                              float(w.get("soak", 0))))
    rest = tuple(n for n in all_nodes if n not in placed)
    if waves and rest:
        waves.append(Wave("rest", rest, len(rest)))
    return Rollout(tuple(waves), bool(spec.get("halt_on_failure", True)))


def _batch(value: Any, size: int) -> int:
    if value is None:
        return size
    text = str(value)
    if text.endswith("%"):
        return max(1, math.ceil(size * float(text[:-1]) / 100))
    return max(1, int(text))


@dataclass(frozen=True)
class Verdict:
    go: bool
    halted: bool = False
    reason: str = ""
    waiting_for: tuple[str, ...] = ()
    failed: Note | None = None
    until: float = 0.0  # soak: not before this time


@dataclass(frozen=True)
class FleetView:
    """Every node's notes, and the graph to tell whether a commit descends from another."""

    notes: Mapping[str, tuple[Note, ...]] = field(default_factory=dict)
    descends: Callable[[str, str], bool] = lambda a, b: a == b
    claims: Mapping[str, Claim] = field(default_factory=dict)  # node -> its disruption-slot claim
    # node -> (object, why) for each note that does not count: unsigned, signed by another key,
    # malformed. Read as no note (whoever waits on it keeps waiting); ``status --fleet`` shows them.
    rejected: Mapping[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)

    def reached(self, node: str, commit: str) -> Note | None:
        """The node's applied note for ``commit`` or a descendant of it."""
        for note in self.notes.get(node, ()):
            if note.state in APPLIED_STATES and (note.commit == commit or self.descends(note.commit, commit)):
                return note
        return None

    def note(self, node: str, commit: str) -> Note | None:
        return next((n for n in self.notes.get(node, ()) if n.commit == commit), None)

    def progress(self, commit: str) -> dict[str, dict[tuple[str, str], str]]:
        """node -> (service, step) -> status: each node's upgrade steps of ``commit``."""
        return {node: dict(note.steps) for node in self.notes if (note := self.note(node, commit)) is not None}

    def failure(self, commit: str) -> Note | None:
        for node in sorted(self.notes):
            for note in self.notes[node]:
                if note.commit == commit and stops(note):
                    return note
        return None


def decide(rollout: Rollout, node: str, commit: str, fleet: FleetView, now: float, *,
           barriers: bool = False, off_first: tuple[str, ...] = ()) -> Verdict:
    """``barriers``: the commit upgrades a service this node runs; its steps' barriers order the
    node instead of the waves (every node that runs the service moves step by step together),
    and a failure anywhere still halts it. ``off_first``: the node joins the VIP networks at this
    commit (see ``repo.planes``): these nodes must have noted it applied, and detached, before
    it goes (a cutover: the old plane leaves first), and a failure anywhere halts it."""
    if not rollout.enabled and not barriers and not off_first:
        return Verdict(True, reason="no rollout plan")
    failed = fleet.failure(commit)
    if failed is not None and failed.node != node and (rollout.halt_on_failure or barriers or off_first):
        return _halted(failed, commit)
    attached = tuple(n for n in off_first if (note := fleet.reached(n, commit)) is None or note.vip == "attached")
    if attached:
        return Verdict(False, reason=f"cutover: waiting for {', '.join(attached)} to leave the VIP networks",
                       waiting_for=attached)
    if barriers:
        return Verdict(True, reason="upgrade: the steps' barriers order this node")
    if not rollout.enabled:
        return Verdict(True, reason="no rollout plan")
    try:
        mine = rollout.position(node)
    except KeyError:
        return Verdict(True, reason="not in the rollout plan")
    batches = rollout.batches()
    waiting = tuple(n for _, members in batches[:mine] for n in members if fleet.reached(n, commit) is None)
    if waiting:
        shown = ", ".join(waiting[:5]) + (f" and {len(waiting) - 5} more" if len(waiting) > 5 else "")
        return Verdict(False, reason=f"waiting for {shown}", waiting_for=waiting)
    my_wave = batches[mine][0]
    earlier = [w for w in rollout.waves[: rollout.waves.index(my_wave)]]
    if earlier and earlier[-1].soak > 0 and batches[mine][1] == my_wave.nodes[: my_wave.batch]:
        prev = earlier[-1]
        times = [_ts(n.time) for m in prev.nodes if (n := fleet.reached(m, commit)) is not None]
        until = max(times, default=0.0) + prev.soak
        if now < until:
            return Verdict(False, reason=f"soaking after wave {prev.name} until "
                           f"{datetime.fromtimestamp(until, UTC).strftime('%H:%M:%S')}Z", until=until)
    return Verdict(True, reason=f"wave {my_wave.name}: every node before this one applied {commit[:12]}")


# What a halted node quotes of the failed node's reason, in its own note and log: enough to say
# what failed, never the whole of what another machine wrote (one 20 MB reason, copied by every
# halted node, would be N x 20 MB at the git server), and never a control character.
QUOTE = 1024


def _halted(failed: Note, commit: str) -> Verdict:
    if failed.state in ERROR_STATES:
        what = f"could not use {commit[:12]} ({printable(failed.reason, 64) or 'ERROR'})"
    else:
        service = f" ({printable(failed.failed_service, 256)})" if failed.failed_service else ""
        what = f"failed {commit[:12]}{service}"
    return Verdict(False, halted=True, failed=failed,
                   reason=f"halted: {failed.node} {what}: {printable(failed.error, QUOTE)}".rstrip(": "))


def early(rollout: Rollout, node: str, commit: str, fleet: FleetView) -> Verdict | None:
    """What a read of the node's ``frontier`` alone can tell: halted (a node of it failed the
    commit, or was halted by a failure further back: its reason is carried on, so the whole
    fleet says which node failed), or waiting for the batch before this one. None when that
    batch has all applied: then every node before it is read, and ``decide`` says."""
    near = rollout.frontier(node)
    if rollout.halt_on_failure:
        for n in near:
            note = fleet.note(n, commit)
            if note is not None and stops(note):
                return _halted(note, commit)
            if note is not None and note.state in HALTED_STATES:
                # carried on as that node said it: quoted bounded like a failure
                said = printable(note.error, QUOTE + 320)
                return Verdict(False, halted=True, reason=said or f"halted: {n} halted {commit[:12]}")
    waiting = tuple(n for n in near if fleet.reached(n, commit) is None)
    if not waiting:
        return None
    shown = ", ".join(waiting[:5]) + (f" and {len(waiting) - 5} more" if len(waiting) > 5 else "")
    return Verdict(False, reason=f"waiting for {shown}", waiting_for=waiting)


# A waiting node reads its whole frontier at least this often, however still its sentinel.
WHOLE_READ_EVERY = 300.0


@dataclass(frozen=True)
class Quiet:
    """A waiting node's last read of its whole frontier (at ``since``) found the batch before
    not begun: it reads ``sentinel`` alone, and says ``verdict`` again, until the sentinel
    moves or ``WHOLE_READ_EVERY`` has passed."""

    commit: str
    sentinel: str
    since: float
    verdict: Verdict


def begun(fleet: FleetView, node: str, commit: str) -> bool:
    """The node has noted something of ``commit`` (applied, failed, halted, at a barrier), or
    applied a later commit."""
    return fleet.note(node, commit) is not None or fleet.reached(node, commit) is not None


def sentinel(rollout: Rollout, node: str, commit: str, fleet: FleetView) -> str | None:
    """The one node of the batch before that ``node`` reads alone on its next polls, after a
    read of its whole frontier found no node of that batch begun; None once one has. That batch
    goes when the batch before it is done, each of its nodes within a poll of the others, so
    its first move is soon the sentinel's too: then the whole batch is read again, in the same
    poll. What the sentinel cannot show, a node of that batch that begins long before it and
    fails, is seen when it moves or at the next whole read (``WHOLE_READ_EVERY``); a go is never
    early, as it needs the sentinel's applied note too. Waiting nodes pick different sentinels
    (a hash of their names), so no one ref takes every read."""
    near = rollout.frontier(node)
    if not near or any(begun(fleet, n, commit) for n in near):
        return None
    return near[zlib.crc32(node.encode()) % len(near)]


def _ts(text: str) -> float:
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return 0.0
