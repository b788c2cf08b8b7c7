"""The upgrade steps a repo defines, as data: a service's ``upgrade:`` steps, reconciler.yaml's
``post_upgrade`` steps and ``stages``, parsed and checked when the repo loads.

What they mean when a commit runs them (participants, barriers, bases) is ``upgrades.rules``';
the agent runs them (``node.upgrader``). Here only what a step is, so that the repo's
definitions need nothing from above them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from reconciler.core.model import Scope


class StepAction(StrEnum):
    COMMAND = "command"
    STOP = "stop"
    START = "start"
    RELOAD = "reload"
    PIN = "pin"
    UNPIN = "unpin"
    REBOOT = "reboot"  # post steps only


@dataclass(frozen=True)
class Step:
    name: str
    action: StepAction
    scope: Scope = Scope.NODE
    command: str = ""
    rollback: str = ""
    timeout: float = 600.0
    values: Mapping[str, Any] = field(default_factory=dict)  # pin: var -> value
    names: tuple[str, ...] = ()  # unpin: vars
    idempotent: bool = False


@dataclass(frozen=True)
class PostStep:
    name: str
    after: tuple[str, ...]
    action: StepAction
    command: str = ""
    names: tuple[str, ...] = ()
    services: tuple[str, ...] = ()
    node: str = ""
    group: str = ""
    timeout: float = 600.0
    batch: int = 1  # reboot: nodes at once
    drain: str = ""  # reboot: before
    undrain: str = ""  # reboot: once back

    @property
    def targets(self) -> tuple[str, ...]:
        return self.services or self.after


@dataclass(frozen=True)
class Stage:
    """A named part of the fleet a commit's upgrades are limited to (reconciler.yaml ``stages``)."""

    name: str
    nodes: frozenset[str]


def parse_steps(items: Sequence[Mapping[str, Any]]) -> tuple[Step, ...]:
    return tuple(Step(str(s["name"]), StepAction(s["action"]), Scope(s.get("scope", "node")), str(s.get("command", "")),
                      str(s.get("rollback", "")), float(s.get("timeout", 600)), dict(s.get("set", {})),
                      tuple(str(v) for v in s.get("vars", ())), bool(s.get("idempotent", False)))
                 for s in items)


def parse_post(items: Sequence[Mapping[str, Any]]) -> tuple[PostStep, ...]:
    return tuple(PostStep(str(p["name"]), tuple(str(a) for a in p["after"]), StepAction(p["action"]),
                          str(p.get("command", "")), tuple(str(v) for v in p.get("vars", ())),
                          tuple(str(s) for s in p.get("services", ())), str(p.get("node", "")),
                          str(p.get("group", "")), float(p.get("timeout", 600)), int(p.get("batch", 1)),
                          str(p.get("drain", "")), str(p.get("undrain", "")))
                 for p in items)


def check_steps(steps: Sequence[Step]) -> list[tuple[int, str]]:
    """What is wrong with a service's steps: (index, message)."""
    problems = []
    seen: set[str] = set()
    for i, s in enumerate(steps):
        if s.name in seen:
            problems.append((i, f"step {s.name!r} named twice"))
        seen.add(s.name)
        if s.action is StepAction.COMMAND and not s.command.strip():
            problems.append((i, f"step {s.name!r}: action command needs a command"))
        if s.action is not StepAction.COMMAND and s.command:
            problems.append((i, f"step {s.name!r}: only action command takes a command"))
        if s.scope is Scope.ONCE and s.action is not StepAction.COMMAND:
            problems.append((i, f"step {s.name!r}: only a command can run once (scope: once)"))
        if s.action is StepAction.PIN and not s.values:
            problems.append((i, f"step {s.name!r}: action pin needs `set`"))
        if s.action is StepAction.UNPIN and not s.names:
            problems.append((i, f"step {s.name!r}: action unpin needs `vars`"))
        if s.action is StepAction.REBOOT:
            problems.append((i, f"step {s.name!r}: a reboot is a post_upgrade step (reconciler.yaml), after the "
                                "services it waits for"))
        if s.rollback and s.action is not StepAction.COMMAND:
            problems.append((i, f"step {s.name!r}: `rollback` is for command steps (stop, start and pins are "
                                "taken back by the agent itself)"))
    return problems
