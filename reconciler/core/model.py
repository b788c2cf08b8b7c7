"""What passes between the stages of the loop: plain, frozen, serialisable data.

No I/O here. Every object has ``to_dict`` so a note, a test or ``-o json`` can print it.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, cast

from reconciler.core.memo import ByIdentity


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# One encoder for every call: ``json.dumps`` with options builds a new one each time, a third of
# hashing a service's slice (120,000 hashes in a fleet diff).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_json(obj: Any) -> bytes:
    """Same object, same bytes: sorted keys, no whitespace variance."""
    return _CANONICAL.encode(obj).encode()


_STRING = json.encoder.encode_basestring  # how ``_CANONICAL`` writes a string


def _members(pairs: Iterable[tuple[str, str]]) -> str:
    """Sorted string pairs as ``canonical_json`` writes the members of an object."""
    return ",".join([f"{_STRING(k)}:{_STRING(v)}" for k, v in pairs])


@dataclass(frozen=True)
class Revision:
    """A commit of the deployment repo as the source found it: nothing about it is trusted yet."""

    commit: str
    tree: str
    author: str
    time: int  # committer time, seconds since the epoch (never used to judge a key's validity)

    def to_dict(self) -> dict[str, Any]:
        return {"commit": self.commit, "tree": self.tree, "author": self.author, "time": self.time}


@dataclass(frozen=True)
class VerifiedRevision:
    """A ``Revision`` that trust let through: signed under the node's root and forward of the
    mark. Only ``trustmark`` makes one, and only one of these reaches render and apply."""

    revision: Revision
    signer: Mapping[str, str] | None  # format, principal, fingerprint of the signature that vouched

    @property
    def commit(self) -> str:
        return self.revision.commit

    def to_dict(self) -> dict[str, Any]:
        return {**self.revision.to_dict(), "signer": dict(self.signer) if self.signer else None}


_UNREAD = object()  # what a kept attribute that may be None reads before it is computed


@dataclass(frozen=True)
class FileSpec:
    """One rendered file of a service: a path relative to the service's config dir."""

    path: str
    mode: int
    content: bytes
    # Holds a secret (render saw its template read one): 0600, and printed only as "changed".
    secret: bool = False
    # A secret file rendered with the values (on the node): the key its hash is an HMAC under
    # (``secrets.Opened.hash_key``). A plain SHA-256 of a file that holds a low-entropy password
    # would let anyone who reads a note (the service's hash is built from its files' hashes), a
    # status or a record try passwords against it offline. b"": plain SHA-256 (a file with no
    # secret, or a reviewer's render, whose files hold markers, not values).
    key: bytes = field(default=b"", repr=False)

    @property
    def lines(self) -> list[str] | None:
        """The content's lines, each with its line end, kept (a plan's comparison and a review's
        diff both read them; not to be changed); None when it is not UTF-8."""
        # Looked up, not caught: a KeyError raised on every file's first read costs twice the lookup.
        kept: list[str] | None | object = self.__dict__.get("_lines", _UNREAD)
        if kept is _UNREAD:
            try:
                kept = self.content.decode("utf-8").splitlines(keepends=True)
            except UnicodeDecodeError:
                kept = None
            self.__dict__["_lines"] = kept
        return cast("list[str] | None", kept)

    @property
    def sha256(self) -> str:
        """The content's hash: SHA-256, or HMAC-SHA256 under ``key`` for a keyed secret file."""
        if self.key:
            return hmac.new(self.key, self.content, hashlib.sha256).hexdigest()
        return sha256_hex(self.content)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "mode": f"{self.mode:04o}",
                               "hmac-sha256" if self.key else "sha256": self.sha256}
        if self.secret:  # other files print (and hash) as they always did
            out["secret"] = True
        return out


# Long enough for a program that cannot bind its port or read its config to have exited (a
# Python or Go program does within a tenth of that); slow starters set more in service.yaml.
MIN_HEALTHY = 0.5


@dataclass(frozen=True)
class Health:
    """How to tell that a started service works: ``tcp`` host:port, ``http`` URL, ``command``
    (a shell command run where the service runs: its container, or its config dir), or
    ``running`` (alive after a short settle time; with docker, the image's own healthcheck too).

    ``min_healthy`` (Nomad's min_healthy_time): once the probe passes, the driver's own process
    or container must stay up, passing its probe, this long. A probe alone can be answered by
    another program on the same port; a version that dies at start must not pass."""

    kind: str = "running"
    target: str = ""
    timeout: float = 10.0
    min_healthy: float = MIN_HEALTHY

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "target": self.target, "timeout": self.timeout}
        if self.min_healthy != MIN_HEALTHY:  # the default hashes as before: no restart for it
            out["min_healthy"] = self.min_healthy
        return out


@dataclass(frozen=True)
class Runtime:
    """How the driver runs the service. Container fields are empty for the process driver."""

    driver: str
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    image: str = ""
    ports: tuple[str, ...] = ()  # "127.0.0.1:8080:80", "8080:80/udp"
    volumes: tuple[str, ...] = ()  # "source:target[:ro]"
    networks: tuple[str, ...] = ()  # networks the agent creates and owns
    aliases: tuple[tuple[str, str], ...] = ()  # (network, name it answers to there): a VIP's name
    network_mode: str = ""  # "host": share the node's network stack (no ports, no networks)
    restart: str = ""  # no | always | unless-stopped | on-failure[:N]
    user: str = ""  # docker: user[:group]; process: a user on the node (root's agent starts it as that user)
    group: str = ""  # process: a group on the node [the user's own]; supplementary groups are dropped
    healthcheck: tuple[tuple[str, str], ...] = ()  # the container's own: test, interval, timeout, retries
    config_dir: str = ""  # where the rendered files appear inside the container

    def to_dict(self, networks: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"driver": self.driver, "command": list(self.command), "env": dict(self.env)}
        extra: dict[str, Any] = {
            "image": self.image, "ports": list(self.ports), "volumes": list(self.volumes),
            "networks": list(self.networks) if networks else [], "network_mode": self.network_mode,
            "aliases": [list(a) for a in self.aliases] if networks else [],
            "restart": self.restart, "user": self.user, "group": self.group,
            "healthcheck": dict(self.healthcheck), "config_dir": self.config_dir,
        }
        out.update({k: v for k, v in extra.items() if v})  # process specs hash as they always did
        return out


class ActionKind(StrEnum):
    NONE = "none"
    CONNECT = "connect"  # networks only, live
    RELOAD = "reload"  # new files, the running program told to re-read them
    START = "start"
    RESTART = "restart"  # same instance, new files
    RECREATE = "recreate"  # new instance from a new spec (image, command, ports...)
    DRAIN_RESTART = "drain+restart"
    REBOOT = "reboot"
    STOP = "stop"


# Least to most disruptive: what a changed service may need, and the steps of an escalation.
LADDER: tuple[ActionKind, ...] = (
    ActionKind.NONE, ActionKind.RELOAD, ActionKind.RESTART, ActionKind.RECREATE,
    ActionKind.DRAIN_RESTART, ActionKind.REBOOT,
)


def rank(kind: ActionKind) -> int:
    """Position on the ladder; a live network change counts as none."""
    return 0 if kind is ActionKind.CONNECT else LADDER.index(kind) if kind in LADDER else 2


@dataclass(frozen=True)
class Rule:
    """``on_change``: a change to ``file`` (glob) and, if given, to one of ``keys`` (globs over
    dotted paths; ``section.key`` in INI files) needs ``action``."""

    file: str
    action: ActionKind
    keys: tuple[str, ...] = ()
    unit: str = ""  # host files: the systemd unit to reload or restart
    command: str = ""  # host files: a command that applies them (sysctl --system)


@dataclass(frozen=True)
class Reload:
    """How a reload is done: a signal to the program, or a shell command where it runs."""

    signal: str = "SIGHUP"
    command: str = ""


@dataclass(frozen=True)
class DesiredService:
    """A service as this node should run it at one commit."""

    name: str
    runtime: Runtime
    files: tuple[FileSpec, ...]
    health: Health = field(default_factory=Health)
    depends_on: tuple[str, ...] = ()
    drift: str = "correct"  # or "report": a hand-made change is noted, not undone
    # How changes are applied (not part of the slice's hash: changing a rule changes nothing).
    rules: tuple[Rule, ...] = ()
    reload: Reload = field(default_factory=Reload)
    ceiling: ActionKind = ActionKind.RECREATE  # escalation stops here
    manual: bool = False  # apply: manual: staged by the agent, instantiated by `reconciler apply`
    drain: str = ""  # hook commands around drain+restart and reboot (move work away, bring it back)
    undrain: str = ""
    origin: str = ""  # the commit this slice was rendered from (a pinned service: its pin's)

    def fingerprint(self) -> dict[str, str]:
        """Hash per part of the slice, so a plan can say which part changed and how much that
        disrupts: files (restart), runtime (recreate), networks alone (connect live)."""
        return dict(self._fingerprint)

    @property
    def _fingerprint(self) -> dict[str, str]:
        # Kept in the instance's dict by hand: functools.cached_property takes a lock on every
        # first read before Python 3.12, twice per service in a 30,000-service diff.
        kept: dict[str, str] | None = self.__dict__.get("_parts")
        if kept is None:
            kept = self._parts()[0]
        return kept

    def _parts(self) -> tuple[dict[str, str], bytes]:
        """The fingerprint, and its canonical JSON (what the slice's hash is of), both kept.
        The JSON is written from the files' entries and the spec's members, encoded once per
        distinct spec (``_spec_of``): every "file:" key sorts before the spec's keys."""
        files = sorted([(f"file:{f.path}", f"{f.mode:o}:{f.sha256}") for f in self.files])
        spec, members = _spec_of(self.runtime, self.health)
        parts = dict(files)
        parts.update(spec)
        if members is None:
            text = canonical_json(parts)
        else:
            text = ("{" + _members(files) + ("," if files else "") + members + "}").encode()
        self.__dict__["_parts"], self.__dict__["_json"] = parts, text
        return parts, text

    @property
    def config_hash(self) -> str:
        """Hash of the rendered files alone."""
        return sha256_hex(canonical_json([f.to_dict() for f in self.files]))

    @property
    def spec_hash(self) -> str:
        """Hash of how it runs (not what files it reads)."""
        return sha256_hex(canonical_json([self.runtime.to_dict(), self.health.to_dict()]))

    @property
    def hash(self) -> str:
        """Content hash of the service's slice: what decides whether it must change."""
        kept: str | None = self.__dict__.get("_hash")
        if kept is None:
            text: bytes | None = self.__dict__.get("_json")
            kept = self.__dict__["_hash"] = sha256_hex(text if text is not None else self._parts()[1])
        return kept

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "hash": self.hash,
            "runtime": self.runtime.to_dict(),
            "files": [f.to_dict() for f in self.files],
            "health": self.health.to_dict(),
            "depends_on": list(self.depends_on),
        }


# A spec's parts, and those parts as members of a canonical JSON object (None: a key would not
# sort after "file:"), by the identity of its runtime and health check.
_SPEC_BY_ID: ByIdentity[tuple[dict[str, str], str | None]] = ByIdentity(4096)


def _spec_of(runtime: Runtime, health: Health) -> tuple[dict[str, str], str | None]:
    """A runtime and health check built once per service definition are the same objects on
    every node: found by identity, not by hashing every field of both."""
    key = (id(runtime), id(health))
    hit = _SPEC_BY_ID.get(key)
    if hit is not None:
        return hit
    parts = _spec_parts(runtime, health)
    members = _members(sorted(parts.items())) if all(k > "file;" for k in parts) else None
    return _SPEC_BY_ID.put(key, (parts, members), runtime, health)


@functools.lru_cache(maxsize=4096)
def _spec_parts(runtime: Runtime, health: Health) -> dict[str, str]:
    # Most services of a fleet run alike on every node: hashed once per distinct spec, not once
    # per node (JSON encoding was most of a 30,000-service plan's cost). Callers copy the dict.
    parts = {"runtime": sha256_hex(canonical_json(runtime.to_dict(networks=False))),
             "health": sha256_hex(canonical_json(health.to_dict()))}
    if runtime.networks:
        parts["networks"] = sha256_hex(canonical_json(sorted(runtime.networks) + (
            [list(a) for a in runtime.aliases] if runtime.aliases else [])))
    return parts


@dataclass(frozen=True)
class Desired:
    """A node's slice of the deployment repo at one commit."""

    node: str
    commit: str
    services: tuple[DesiredService, ...]

    def __iter__(self) -> Iterator[DesiredService]:
        return iter(self.services)

    def by_name(self) -> Mapping[str, DesiredService]:
        return {s.name: s for s in self.services}

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "commit": self.commit,
            "services": [s.to_dict() for s in self.services],
        }


@dataclass(frozen=True)
class ObservedService:
    """What runs on the node for one service, as read back from the driver's own records."""

    name: str
    driver: str
    running: bool
    hash: str | None = None
    commit: str | None = None
    pid: int | None = None
    detail: str = ""
    fingerprint: tuple[tuple[str, str], ...] = ()
    # A change made by hand that the driver can see: "networks", "restart policy", or one that
    # starts with "files:" ("files: identity.conf changed, notes.txt added") for the live files.
    drifted: str = ""
    files: tuple[FileSpec, ...] = ()  # the config files it runs with now, for key-level comparison
    drift: str = "correct"  # the policy it was applied with: "report" means hands off

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "driver": self.driver,
            "running": self.running,
            "hash": self.hash,
            "commit": self.commit,
            "pid": self.pid,
            "detail": self.detail,
            "drifted": self.drifted,
        }


@dataclass(frozen=True)
class Observed:
    node: str
    services: tuple[ObservedService, ...]

    def by_name(self) -> Mapping[str, ObservedService]:
        return {s.name: s for s in self.services}

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "services": [s.to_dict() for s in self.services]}


@dataclass(frozen=True)
class Action:
    """One step of a plan, with the reason a reviewer reads."""

    kind: ActionKind
    service: str
    reason: str
    desired: DesiredService | None = None
    driver: str = ""
    sync: bool = False  # a "none" whose files still change on disk (comments, none-rules)
    staged: bool = False  # held back by apply: manual until an operator's `reconciler apply`
    waiting: str = ""  # held back on purpose: by what (which window and when it opens, whose slots)
    held_by: str = ""  # the reason code of that hold: WINDOW or BUDGET

    def without_desired(self) -> Action:
        """The same step without the rendered service it carries (what a review keeps)."""
        return Action(self.kind, self.service, self.reason, None, self.driver, self.sync, self.staged, self.waiting,
                      self.held_by)

    def to_dict(self) -> dict[str, Any]:
        out = {"service": self.service, "action": str(self.kind), "reason": self.reason}
        if self.waiting:
            out["waiting"] = self.waiting
        return out


@dataclass(frozen=True)
class Plan:
    node: str
    commit: str
    actions: tuple[Action, ...]

    @property
    def changes(self) -> tuple[Action, ...]:
        return tuple(a for a in self.actions if a.kind is not ActionKind.NONE or a.sync)

    @property
    def hash(self) -> str:
        """Of the changes only, so a reviewer's `diff` and the node's run name the same plan
        even when "unchanged since <commit>" differs."""
        return sha256_hex(canonical_json([a.to_dict() for a in self.changes]))[:16]

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "commit": self.commit,
            "hash": self.hash,
            "actions": [a.to_dict() for a in self.actions],
        }


class ResultState(StrEnum):
    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class ServiceResult:
    service: str
    action: ActionKind
    state: ResultState
    reason: str
    detail: str = ""
    pid: int | None = None
    hash: str | None = None
    steps: tuple[str, ...] = ()  # escalation: each step tried and how it ended

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": list(self.steps),
            "action": str(self.action),
            "result": str(self.state),
            "reason": self.reason,
            "detail": self.detail,
            "pid": self.pid,
            "hash": self.hash,
        }


class Scope(StrEnum):
    """Where an upgrade step runs: on every node that runs the service, or on one of them."""

    NODE = "node"
    ONCE = "once"


class StepStatus(StrEnum):
    STARTED = "started"  # begun, not finished: a killed run leaves this
    DONE = "done"
    SKIPPED = "skipped"  # nothing to do here: the node runs the new version already, or a once step runs elsewhere
    FAILED = "failed"
    UNDONE = "undone"  # the upgrade failed or halted: this step was taken back


PASSED = (StepStatus.DONE, StepStatus.SKIPPED)


@dataclass(frozen=True)
class StepRecord:
    """One step on one node, as the ledger keeps it and the note shows it."""

    service: str  # "" for a deployment-wide post step
    step: str
    scope: Scope
    status: StepStatus
    started: float = 0.0
    ended: float = 0.0
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"service": self.service, "step": self.step, "scope": str(self.scope), "status": str(self.status),
                "started": _iso(self.started), "ended": _iso(self.ended), "detail": self.detail}


def _iso(t: float) -> str:
    """Milliseconds: an audit of barriers compares the ends and starts of steps."""
    if not t:
        return ""
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class Verdict(StrEnum):
    """The node's verdict on a commit: what its note says, and what the fleet gate reads."""

    APPLIED = "applied"  # every service of the slice runs it and passed its check
    FAILED = "failed"  # a service failed here (and was put back)
    ERROR = "error"  # the commit cannot be used as it is (render, validation): nothing applied
    REFUSED = "refused"  # trust said no: nothing rendered
    REBOOTING = "rebooting"  # a reboot this commit needs is under way
    HALTED = "halted"  # another node failed it: this one did not start
    STAGED = "staged"  # apply: manual services wait for an operator's `reconciler apply`
    WAITING = "waiting"  # not this node's turn yet; noted only at an upgrade's barrier


RunState = Verdict  # the first wave's name for it


@dataclass(frozen=True)
class Report:
    """What the node did for one commit: a run's outcome, and the ledger's record that a note is
    encoded from (``reconciler.notes`` is the only place that knows the note's JSON)."""

    node: str
    commit: str
    state: RunState
    time: str
    services: tuple[ServiceResult, ...] = ()
    reason: str = ""
    error: str = ""
    plan_hash: str = ""
    signer: Mapping[str, str] | None = None
    verdicts: tuple[Mapping[str, Any], ...] = ()
    events: tuple[str, ...] = ()  # what happened around the run: a reboot finished, a run interrupted
    pins: Mapping[str, str] = field(default_factory=dict)  # service -> commit it is held at
    steps: tuple[StepRecord, ...] = ()  # upgrade steps of this commit on this node
    suspended: Mapping[str, str] | None = None  # held back by a suspension: {reason, by, since}
    # Two control planes side by side: the node's release, mode and VIP attachment at this commit
    plane: Mapping[str, Any] | None = None
