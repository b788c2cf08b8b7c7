"""A node's slice as render makes it: each service's files, runtime and health check, how its
changes are applied (the action ladder, rules, reload), and the content hashes that decide
whether it must change. Hashed as canonical JSON: same object, same bytes, same hash.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from reconciler.core import digest
from reconciler.core.memo import ByIdentity

# OpenSSL's, or in the daemon the interpreter's own (``core.digest``): not hashlib imported here,
# which would load OpenSSL into every idle daemon (issue 40).
sha256_hex = digest.sha256_hex


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
        kept: list[str] | None = self.__dict__.get("_lines", _UNREAD)  # not cast(): a call, 120,000 times
        if kept is _UNREAD:
            try:
                # str.splitlines in C, each break it knows (measured quicker than a split at "\n"
                # with the ends put back, on short and long files alike)
                kept = self.content.decode("utf-8").splitlines(True)
            except UnicodeDecodeError:
                kept = None
            self.__dict__["_lines"] = kept
        return kept

    @property
    def sha256(self) -> str:
        """The content's hash: SHA-256, or HMAC-SHA256 under ``key`` for a keyed secret file."""
        if self.key:
            return digest.hmac_sha256_hex(self.key, self.content)
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



# A frozen dataclass's __init__ sets each field through object.__setattr__: a third of what a
# rendered service costs beyond its templates (60,000 files and services in a fleet diff). These
# make the same instances, every field set, in one write to the instance's dict (neither class
# has a __post_init__); tests/test_render_speed5.py holds their parameters to the fields.
_new = object.__new__


def file_spec(path: str, mode: int, content: bytes, secret: bool = False, key: bytes = b"") -> FileSpec:
    """``FileSpec(path, mode, content, secret, key)``, made quicker."""
    made = _new(FileSpec)
    made.__dict__.update(path=path, mode=mode, content=content, secret=secret, key=key)
    return made


def desired_service(name: str, runtime: Runtime, files: tuple[FileSpec, ...], health: Health,
                    depends_on: tuple[str, ...], drift: str, rules: tuple[Rule, ...], reload: Reload,
                    ceiling: ActionKind, manual: bool, drain: str, undrain: str, origin: str = "") -> DesiredService:
    """``DesiredService(...)`` with every field given (but ``origin``), made quicker."""
    made = _new(DesiredService)
    made.__dict__.update(name=name, runtime=runtime, files=files, health=health, depends_on=depends_on, drift=drift,
                         rules=rules, reload=reload, ceiling=ceiling, manual=manual, drain=drain, undrain=undrain,
                         origin=origin)
    return made
