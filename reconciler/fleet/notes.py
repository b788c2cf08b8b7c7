"""The note codec: a node's record of one commit as JSON, and back. One schema version.

The only module that knows the note's fields. A note is written by its node alone, in
``refs/notes/reconciler/<node>``; other nodes (the fleet gate), ``status --fleet`` and review
tools read it through ``decode``/``Note``.

A note is input from another machine: ``decode`` (and ``body``, which says why not) reads it
within the bounds of ``fleet.notejson``, the one decoder every reader goes through, and the
writer keeps its own notes within them (``to_dict``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from reconciler.core.model import Report
from reconciler.core.model.facts import BadFacts, Facts
from reconciler.core.text import cut
from reconciler.fleet.notejson import CLAIM_STATES, MAX_HELD, MAX_NAME, MAX_NOTE, MAX_TEXT, MAX_TICKET, check
from reconciler.upgrades.rules import STARTED_FRESH

FORMAT = 1


# What a node's own note keeps of a long text (a service's output in an error): the readers'
# bound, less room for the mark that says how much was cut.
TEXT_KEPT = MAX_TEXT - 64
# A note must stay under the readers' bound with its signature: past this, the free texts of
# each service and step are cut shorter.
NOTE_BUDGET = MAX_NOTE - 8 * 1024


def to_dict(report: Report) -> dict[str, Any]:
    """The note of ``report``, within the bounds every reader holds it to (``fleet.notejson``):
    long texts cut and marked; a note still too big keeps shorter ones."""
    out = _to_dict(report, TEXT_KEPT)
    for keep, brief in ((200, 0), (200, 1), (64, 2)):  # a great many services: the failed ones say why
        if len(json.dumps(out, indent=2)) <= NOTE_BUDGET:
            break
        out = _to_dict(report, keep, brief)
    return out


def _to_dict(report: Report, keep: int, brief: int = 0) -> dict[str, Any]:
    """``brief`` 1: the services that did not fail by their result alone; 2: those left out."""
    def text(value: str, limit: int = keep) -> str:
        return cut(value, limit)

    services: dict[str, dict[str, Any]] = {}
    for r in report.services:
        if brief == 2 and (r.state != "failed" or len(services) >= 64):
            continue
        d = r.to_dict()
        d["reason"], d["detail"] = text(d["reason"] or ""), text(d["detail"] or "")
        d["steps"] = [text(x) for x in d["steps"]][-8 if keep < TEXT_KEPT else 0:]
        if brief == 1 and d["result"] != "failed":
            d = {"action": d["action"], "result": d["result"]}
        services[r.service] = d
    out: dict[str, Any] = {
        "format": FORMAT,
        "node": report.node,
        "commit": report.commit,
        "state": str(report.state),
        "time": report.time,
        "services": services,
    }
    if report.plan_hash:
        out["plan_hash"] = report.plan_hash
    if report.reason:
        out["reason"] = text(report.reason, TEXT_KEPT)
    if report.error:
        out["error"] = text(report.error, TEXT_KEPT)
    if report.signer:
        out["signer"] = dict(report.signer)
    if report.root:
        out["root"] = report.root
    if report.verdicts:
        out["verdicts"] = [dict(v) for v in report.verdicts]
    if report.events:
        out["events"] = [text(e) for e in report.events][-16 if keep < TEXT_KEPT else 0:]
    if report.pins:
        out["pins"] = dict(report.pins)
    if report.steps:
        out["upgrade"] = [{**d, "detail": text(d["detail"])} for d in (s.to_dict() for s in report.steps)]
    if report.suspended:
        out["suspended"] = dict(report.suspended)
    if report.plane:
        out["plane"] = dict(report.plane)
    if report.refused:
        out["refused"] = {k: text(str(v), MAX_NAME - 64) for k, v in report.refused.items()}
    if report.held:
        out["held"] = [text(h, MAX_NAME - 64) for h in report.held[:MAX_HELD]]
    if report.facts:  # within ``notejson``'s bounds already: gathered and kept so (``node.facts``)
        out["facts"] = dict(report.facts)
    return out


def encode(report: Report) -> str:
    """Same record, same bytes: sorted keys."""
    return json.dumps(to_dict(report), indent=2, sort_keys=True) + "\n"


def decode(text: str | bytes) -> dict[str, Any] | None:
    """A note's body, or None for one that is not ours or not within bounds (``body`` says why)."""
    data = check(text)
    return data if isinstance(data, dict) else None


@dataclass(frozen=True)
class Malformed:
    """A note no reader may count: out of the decoder's bounds, or of the wrong shape."""

    node: str
    obj: str  # the commit (or claim object) it is on
    why: str

    def __str__(self) -> str:
        return f"malformed note from {self.node} on {self.obj}: {self.why}"


def body(node: str, obj: str, text: str | bytes) -> dict[str, Any] | Malformed:
    """``node``'s note on ``obj``: its body, or what is wrong with it. Never raises."""
    data = check(text)
    return data if isinstance(data, dict) else Malformed(node, obj, data)


def _str(value: Any, limit: int = MAX_NAME) -> str:
    """A field of a body that passed ``check`` is a string within bounds; one given to ``parse``
    by other code is made one, and cut."""
    if type(value) is str and len(value) <= limit:  # what ``check`` let through: as it is
        return value
    if value is None:  # a field the note does not have
        return ""
    return cut(value if isinstance(value, str) else "" if value is None else str(value), limit)


@dataclass(frozen=True)
class Note:
    """The part of a node's note the rollout and fleet status read."""

    node: str
    commit: str
    state: str
    time: str = ""
    failed_service: str = ""
    error: str = ""
    steps: Mapping[tuple[str, str], str] = field(default_factory=dict)  # (service, step) -> status
    vip: str = ""  # "attached" | "detached": on the VIP networks at this commit ("": no two planes)
    fresh: frozenset[str] = frozenset()  # services whose steps it skipped, not running them before
    # On the commit the node runs: the older head it refused to rewind to, why, and when
    refused_head: str = ""
    refused_reason: str = ""
    refused_time: str = ""
    held: tuple[str, ...] = ()  # services held stopped by `reconciler stop` when it was written
    reason: str = ""  # the stable reason code of an error or a refusal (RENDER_FAILED, UNKNOWN_NODE...)
    facts: Facts | None = None  # the node's facts its render read (None: none published, or not readable)

    @staticmethod
    def parse(node: str, commit: str, data: Mapping[str, Any]) -> Note:
        services = data.get("services")
        # (``type(r) is dict`` first: what ``check`` builds, told without the ABC's isinstance)
        failed = [s for s, r in services.items()
                  if (type(r) is dict or isinstance(r, Mapping)) and r.get("result") == "failed"] \
            if isinstance(services, Mapping) else []
        upgrade = data.get("upgrade")
        steps: dict[tuple[str, str], str] = {}
        fresh: frozenset[str] = frozenset()
        if isinstance(upgrade, list) and upgrade:
            steps = {(_str(s.get("service")), _str(s.get("step"))): _str(s.get("status"))
                     for s in upgrade if isinstance(s, Mapping)}
            fresh = frozenset(_str(s.get("service")) for s in upgrade
                              if isinstance(s, Mapping) and s.get("status") == "skipped"
                              and s.get("detail") == STARTED_FRESH)
        plane = data.get("plane")
        refused = data.get("refused")
        refused = refused if isinstance(refused, Mapping) else {}
        return Note(node, commit, _str(data.get("state")), _str(data.get("time")),
                    _str(failed[0]) if failed else "", _str(data.get("error"), MAX_TEXT), steps,
                    _str(plane.get("vip")) if isinstance(plane, Mapping) else "", fresh,
                    _str(refused.get("head")), _str(refused.get("reason")), _str(refused.get("time")),
                    tuple(_str(h) for h in held[:MAX_HELD]) if isinstance(held := data.get("held"), list) else (),
                    _str(data.get("reason"), 64), _facts(data.get("facts")))


def _facts(value: Any) -> Facts | None:
    """A note's facts, or None when it has none, or none a reader may use (checked by
    ``notejson`` already; ``Facts.from_dict`` says the same of a body from elsewhere)."""
    if value is None:
        return None
    try:
        return Facts.from_dict(value)
    except BadFacts:
        return None


# A node's claim on a disruption slot (see ``budget``) is a note too, in the same ref, on an
# object no commit is: the empty tree, which every repository knows without storing it.
CLAIM_OBJECT = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


@dataclass(frozen=True)
class Claim:
    """A node's register in the disruption bakery: ``choosing`` while it picks a ticket,
    ``queued`` with its ticket until it is done, ``free`` (ticket 0) once its change passed."""

    node: str
    state: str  # choosing | queued | free
    ticket: int = 0
    time: float = 0.0  # when the node last wrote it (seconds since the epoch, its clock)
    action: str = ""  # what it needs the slot for: "restart db, identity"

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "claim": {"node": self.node, "state": self.state, "ticket": self.ticket,
                                            "time": self.time, "action": self.action}}

    def encode(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @staticmethod
    def parse(node: str, data: Mapping[str, Any]) -> Claim | None:
        """The claim in a note body, or None for one that is not (an old agent's, garbage): a
        claim that cannot be read is no claim, as if the node held none."""
        c = data.get("claim")
        if not isinstance(c, Mapping) or c.get("state") not in CLAIM_STATES:
            return None
        ticket, when = c.get("ticket", 0), c.get("time", 0.0)
        # Only what ``notejson`` lets through: a ticket one higher never overflows, a time compares.
        if not isinstance(ticket, int) or isinstance(ticket, bool) or not 0 <= ticket <= MAX_TICKET:
            return None
        if not isinstance(when, int | float) or isinstance(when, bool) or not math.isfinite(when):
            return None
        return Claim(node, str(c["state"]), ticket, float(when), _str(c.get("action"), MAX_TEXT))
