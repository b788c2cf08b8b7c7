"""The ledger's flags: the node's small named facts, each kept as a text under a key of ``meta``.

An operator's suspension and the repo's, the commit whose post-upgrade steps are owed, the notes
ref as last pushed, the last poll and the polls counted, a corrupt ledger set aside. Each has
typed accessors here; the keys and the text stored under them (JSON where it is) are the on-disk
format an agent upgraded in place reads back, so they never change. The table itself is not
handed out: a new flag is a new pair of accessors, named for what it means.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from reconciler.core.errors import ConfigError
from reconciler.ledger.aside import Damaged
from reconciler.ledger.db import DAMAGED_KEY, Store

SUSPENDED_KEY = "suspended"  # meta: an operator's suspension, JSON {reason, by, since}
REPO_SUSPENDED_KEY = "suspended_repo"  # meta: the verified head's `suspend: true`, same shape
POST_PENDING_KEY = "post_upgrade_pending"  # meta: the commit whose post steps wait on the fleet
REWIND_KEY = "rewind_refused"  # meta: JSON {commit, head, reason, time}: the last rewind refused
PUSHED_KEY = "notes_pushed"  # meta: the notes ref's tip when it was last pushed
PUSHED_TIME_KEY = "notes_pushed_time"  # when the last push went through (seconds since the epoch; metrics)
POLL_KEY = "metrics_last_poll"  # meta: JSON {time, result, head, head_time}
POLLS_KEY = "metrics_polls"  # meta: JSON result -> count, the polls_total counter kept across restarts
CLAIMS_SEEN_KEY = "claims_seen"  # meta: JSON node -> [claim as read, first seen (this clock)]
NODE_KEY = "node"  # meta: the node whose agent keeps this state dir (written by agents since issue 37)
STOPPED_KEY = "stopped_held"  # meta: JSON service -> {by, since}: stopped by `reconciler stop`, kept stopped
RETIRED_KEY = "retired"  # meta: JSON {commit, time, stopped}: the node left the inventory there (decommissioned)
FACTS_KEY = "facts_rendered"  # meta: JSON {commit, read, facts}: the node's facts its last converged render had


@dataclass(frozen=True)
class NotesPushed:
    """This node's notes ref as it last pushed it."""

    tip: str | None  # the ref's commit then (None: never pushed, or pushed with no notes yet)
    time: float | None  # when (None: not recorded, e.g. notes recovered from the remote)


@dataclass(frozen=True)
class Poll:
    """The last poll of the branch, as the metrics recorded it."""

    time: float  # when it ended (seconds since the epoch)
    result: str  # what it came to: a verdict, or "unchanged" or "error"
    head: str  # the branch head it saw ('' when none was seen yet)
    head_time: float | None  # that head's committer time, when git told it


class FlagLedger(Store):
    """The Ledger's flags: suspensions, the post-upgrade steps owed, notes pushed, polls."""

    # suspension --------------------------------------------------------------------------
    def suspend(self, reason: str, by: str, since: str) -> bool:
        """An operator's `suspend`: passes apply nothing until `resume`. Returns whether it was
        suspended already (then only the reason changes; who and since stay the first ones).
        The no-op marker goes in the same transaction, so the next pass notes the suspension."""
        with self._tx("suspend") as db:
            row = db.execute("SELECT value FROM meta WHERE key=?", (SUSPENDED_KEY,)).fetchone()
            old = json.loads(row[0]) if row else None
            record = {"reason": reason, "by": old["by"] if old else by, "since": old["since"] if old else since}
            db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?,?)", (SUSPENDED_KEY, json.dumps(record)))
            db.execute("DELETE FROM converged")
        return old is not None

    def resume(self) -> dict[str, str] | None:
        """An operator's `resume`: the suspension it lifted, or None when there was none."""
        with self._tx("resume") as db:
            row = db.execute("SELECT value FROM meta WHERE key=?", (SUSPENDED_KEY,)).fetchone()
            if row is None:
                return None
            db.execute("DELETE FROM meta WHERE key=?", (SUSPENDED_KEY,))
            db.execute("DELETE FROM converged")  # the next pass converges, and notes it resumed
        return dict(json.loads(row[0]))

    def suspend_from_repo(self, record: Mapping[str, str] | None) -> None:
        """The verified head's ``suspend: true`` (None: the head has none). Kept apart from the
        operator's, so a commit lifting the fleet's never lifts an operator's own."""
        with self._tx("suspend from repo") as db:
            if record is None:
                db.execute("DELETE FROM meta WHERE key=?", (REPO_SUSPENDED_KEY,))
            else:
                row = db.execute("SELECT value FROM meta WHERE key=?", (REPO_SUSPENDED_KEY,)).fetchone()
                kept = dict(record)
                if row is not None:  # suspended since the first commit that said so, not since this pass
                    kept.update({k: v for k, v in json.loads(row[0]).items() if k in ("by", "since")})
                db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?,?)",
                           (REPO_SUSPENDED_KEY, json.dumps(kept)))

    def suspension(self) -> dict[str, str] | None:
        """In force now: the operator's suspension first, else the fleet's from the repo."""
        for key in (SUSPENDED_KEY, REPO_SUSPENDED_KEY):
            value = self._meta(key)
            if value:
                return dict(json.loads(value))
        return None

    # post-upgrade steps owed -------------------------------------------------------------
    def post_pending(self) -> str | None:
        """The commit whose post-upgrade steps wait on the fleet, if any: a run killed after the
        verdict (before the post steps) still runs them."""
        return self._meta(POST_PENDING_KEY) or None

    def set_post_pending(self, commit: str | None) -> None:
        """``commit``'s post steps are owed; None or '' clears it (stored as an empty text, as
        agents before these accessors wrote it)."""
        self._set_meta(POST_PENDING_KEY, commit or "")

    # a rewind refused ---------------------------------------------------------------------
    def rewind_refused(self) -> dict[str, str] | None:
        """The last time the branch was moved back to a commit this node had applied and it
        refused to go there: {commit (the one it ran then), head, reason, time}; None: never.
        Never cleared: it is history of ``commit``'s note only (a later head's note does not
        carry it), and this ledger cannot apply the refused head later (an ancestor of what it
        ran); a rebuilt one that does starts without it, and the fleet view trusts the node's
        newer note on that head over the old refusal (``fleet.status``)."""
        record = _json_object(self._meta(REWIND_KEY))
        return {k: str(v) for k, v in record.items()} if "commit" in record else None

    def refused_rewind_to(self, commit: str, head: str, reason: str) -> bool:
        """The last rewind refused is this one: running ``commit``, to ``head``, for ``reason``."""
        said = self.rewind_refused()
        return said is not None and (said["commit"], said["head"], said["reason"]) == (commit, head, reason)

    def set_rewind_refused(self, commit: str, head: str, reason: str, time: str) -> None:
        """Said on ``commit``'s note (the one the node runs): the refused head's own stays as it was.
        The note is to be written again in the same transaction (``unnoted``): a pass killed
        before it wrote it leaves the next one to."""
        with self._tx(f"meta {REWIND_KEY}") as db:
            db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?,?)",
                       (REWIND_KEY, json.dumps({"commit": commit, "head": head, "reason": reason, "time": time},
                                               sort_keys=True)))
            db.execute("UPDATE commits SET noted=0 WHERE commit_id=?", (commit,))

    # the node's facts ----------------------------------------------------------------------
    def facts_rendered(self) -> tuple[str, bool, dict[str, Any]] | None:
        """The facts the last converged render had: (its commit, whether a template read them,
        the facts as a note holds them); None: no render settled since facts were gathered."""
        record = _json_object(self._meta(FACTS_KEY))
        facts = record.get("facts")
        return (str(record.get("commit", "")), bool(record.get("read")), facts) if isinstance(facts, dict) else None

    def facts_reads(self) -> frozenset[str] | None:
        """What of the facts that render read (``core.model.facts.subjects``); None: a record
        written before they were kept (every fact is compared, once)."""
        reads = _json_object(self._meta(FACTS_KEY)).get("reads")
        return frozenset(str(r) for r in reads) if isinstance(reads, list) else None

    def set_facts_rendered(self, commit: str, read: bool, facts: Mapping[str, Any],
                           reads: Iterable[str] | None = None) -> None:
        """What ``commit``'s note publishes: set before its verdict settles (its note written then).
        ``reads``: what of them the render read (None: not known, as an older agent wrote it)."""
        record = {"commit": commit, "read": read, "facts": dict(facts)}
        self._set_meta(FACTS_KEY, json.dumps(record if reads is None else {**record, "reads": sorted(reads)},
                                             sort_keys=True))

    # notes pushed ------------------------------------------------------------------------
    def notes_pushed(self) -> NotesPushed:
        when = self._meta(PUSHED_TIME_KEY)
        return NotesPushed(self._meta(PUSHED_KEY) or None, float(when) if when else None)

    def set_notes_pushed(self, tip: str | None, when: float | None = None) -> None:
        """The notes ref at ``tip`` is on the remote; ``when``: the push that put it there went
        through then (None: it was found there, not pushed, and the last push's time stays)."""
        self._set_meta(PUSHED_KEY, tip or "")
        if when is not None:
            self._set_meta(PUSHED_TIME_KEY, repr(when))

    # polls (what metrics read: totals that outlive the process) --------------------------
    def last_poll(self) -> Poll | None:
        last = _json_object(self._meta(POLL_KEY))
        if "time" not in last:
            return None
        return Poll(float(last["time"]), str(last.get("result", "")), str(last.get("head") or ""),
                    last.get("head_time"))

    def poll_counts(self) -> dict[str, int]:
        """Result -> how many polls came to it, since the node's state began."""
        return {str(k): int(v) for k, v in _json_object(self._meta(POLLS_KEY)).items()}

    def record_poll(self, poll: Poll) -> None:
        """The last poll, and one more of its result counted."""
        self._set_meta(POLL_KEY, json.dumps({"time": poll.time, "result": poll.result, "head": poll.head,
                                             "head_time": poll.head_time}, sort_keys=True))
        polls = self.poll_counts()
        polls[poll.result] = polls.get(poll.result, 0) + 1
        self._set_meta(POLLS_KEY, json.dumps(polls, sort_keys=True))

    # other nodes' disruption claims, as this node first saw them ---------------------------
    def claims_seen(self) -> dict[str, tuple[str, float]]:
        """node -> (its claim as last read, when this node first read it so: its own clock).
        A claim's age is judged from here, never from the time its writer put in it."""
        out = {}
        for node, value in _json_object(self._meta(CLAIMS_SEEN_KEY)).items():
            if isinstance(value, list) and len(value) == 2 and isinstance(value[1], int | float):
                out[str(node)] = (str(value[0]), float(value[1]))
        return out

    def set_claims_seen(self, seen: Mapping[str, tuple[str, float]]) -> None:
        self._set_meta(CLAIMS_SEEN_KEY, json.dumps({n: list(v) for n, v in seen.items()}, sort_keys=True))

    # services an operator stopped (`reconciler stop`), and a node retired ------------------
    def held_stopped(self) -> dict[str, dict[str, str]]:
        """service -> {by, since}: stopped on purpose, left stopped by every pass until `start`."""
        return {str(k): dict(v) for k, v in _json_object(self._meta(STOPPED_KEY)).items() if isinstance(v, dict)}

    def hold_stopped(self, services: list[str], by: str, since: str, event: tuple[str, str] | None = None) -> None:
        """``services`` are to stay stopped. Written before the first one is stopped: a stop killed
        half way is finished by the next pass, which no longer wants them. The no-op marker goes
        in the same transaction, so the next pass converges (and notes what it runs), and so does
        ``event`` (commit, text: on the mark's record, if it has one), so the note says it whatever
        comes after."""
        with self._tx("hold stopped") as db:
            self._event(db, event)
            row = db.execute("SELECT value FROM meta WHERE key=?", (STOPPED_KEY,)).fetchone()
            held = _json_object(row[0] if row else None)
            for name in services:
                held.setdefault(name, {"by": by, "since": since})  # stopped since the first stop
            db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?,?)",
                       (STOPPED_KEY, json.dumps(held, sort_keys=True)))
            db.execute("DELETE FROM converged")

    def release_stopped(self, services: list[str] | None, event: tuple[str, str] | None = None) -> list[str]:
        """Lift the hold on ``services`` (None: all); returns those it was on, sorted. ``event``
        (commit, text with ``{}`` for the services lifted) in the same transaction, when any was."""
        with self._tx("release stopped") as db:
            row = db.execute("SELECT value FROM meta WHERE key=?", (STOPPED_KEY,)).fetchone()
            held = _json_object(row[0] if row else None)
            lifted = sorted(held if services is None else (s for s in services if s in held))
            if lifted and event is not None:
                self._event(db, (event[0], event[1].replace("{}", ", ".join(lifted))))
            for name in lifted:
                del held[name]
            db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?,?)",
                       (STOPPED_KEY, json.dumps(held, sort_keys=True)))
            if lifted:
                db.execute("DELETE FROM converged")  # the next pass starts them
        return lifted

    def retired(self) -> dict[str, Any] | None:
        """The node was decommissioned: {commit, time, stopped, seen}; None while it is not."""
        record = _json_object(self._meta(RETIRED_KEY))
        return record if "commit" in record else None

    def retire(self, commit: str, time: str, stopped: list[str]) -> None:
        """Decommissioned at ``commit`` (applied and noted there first): passes do nothing more
        until a verified head names the node again."""
        self._set_meta(RETIRED_KEY, json.dumps({"commit": commit, "time": time, "stopped": stopped, "seen": commit},
                                               sort_keys=True))

    def retired_seen(self, head: str) -> None:
        """A retired node judged ``head`` (still not named as a node): not judged again."""
        record = self.retired()
        if record is not None and record.get("seen") != head:
            self._set_meta(RETIRED_KEY, json.dumps({**record, "seen": head}, sort_keys=True))

    def unretire(self) -> dict[str, Any] | None:
        """A verified head names the node again: the retirement lifted (returned), and the no-op
        marker cleared in the same transaction, so the pass converges."""
        record = self.retired()
        with self._tx("unretire") as db:
            db.execute("DELETE FROM meta WHERE key=?", (RETIRED_KEY,))
            db.execute("DELETE FROM converged")
        return record

    def _event(self, db: sqlite3.Connection, event: tuple[str, str] | None) -> None:
        """``add_event``'s insert, inside a flag's transaction (nothing when the commit has no record)."""
        if event is None or db.execute("SELECT 1 FROM commits WHERE commit_id=?", (event[0],)).fetchone() is None:
            return
        db.execute("INSERT INTO events(commit_id, text) VALUES (?,?)", (event[0], self.redact(event[1])))
        db.execute("UPDATE commits SET noted=0 WHERE commit_id=?", (event[0],))

    # whose state dir this is -------------------------------------------------------------
    def owner(self) -> str | None:
        """The node whose agent keeps this ledger; None when none said yet (an agent before the
        flag, until its next start)."""
        return self._meta(NODE_KEY) or None

    def claim(self, node: str, *, record: bool = True) -> None:
        """This state dir is ``node``'s: ``ConfigError`` when it is another node's (a command
        would show, change or note that node's state under this one's name); ``record``: kept
        as its owner when none is yet (an agent; a read leaves it as it is)."""
        if record and self.owner() is None:
            with self._tx("claim") as db:
                db.execute("INSERT OR IGNORE INTO meta(key, value) VALUES (?,?)", (NODE_KEY, node))
        known = self.owner()
        if known is not None and known != node:
            raise ConfigError(f"state dir {self.path.parent} is node {known}'s, not {node}'s: --node or "
                              "--state-dir is wrong")

    # a corrupt ledger set aside ----------------------------------------------------------
    def damaged(self) -> tuple[Damaged, bool] | None:
        """The last time this node's ledger was found corrupt and started afresh (``Store.open``
        records it in the fresh one), and whether a note carries it yet; None: never."""
        record = _json_object(self._meta(DAMAGED_KEY))
        if "time" not in record:
            return None
        return (Damaged(str(record["time"]), str(record.get("why", "")), str(record.get("moved_to", ""))),
                bool(record.get("noted")))

    def damage_noted(self) -> bool:
        """Whether a settled commit's events hold the event (then it is marked noted, and passes
        stop carrying it): a pass killed before its note carried it leaves it to the next."""
        found = self.damaged()
        if found is None or found[1]:
            return True
        if self._one("SELECT 1 FROM events WHERE text=?", self.redact(found[0].event)) is None:
            return False
        self._set_meta(DAMAGED_KEY, json.dumps({**asdict(found[0]), "noted": True}))
        return True

    # the meta table ----------------------------------------------------------------------
    def _meta(self, key: str) -> str | None:
        row = self._one("SELECT value FROM meta WHERE key=?", key)
        return None if row is None else str(row[0])

    def _set_meta(self, key: str, value: str) -> None:
        with self._tx(f"meta {key}") as db:
            db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?,?)", (key, value))


def _json_object(text: str | None) -> dict[str, Any]:
    """A flag's JSON object; {} when it is not set, or not an object (an unreadable flag counts
    as none, as the metrics always read it)."""
    if not text:
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
