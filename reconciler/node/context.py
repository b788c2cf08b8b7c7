"""What every step of a pass is handed: one node's parts, wired once by the agent, and the
process's own memory.

A step takes the context and the run so far and returns the run for the next step, or a
result that stops the pass (``node.run``). It never reaches back into whoever built it: the
parts are here, named, each with one job (settings, the ledger and the state dir, the mirror,
the trust keeper, the note writer, the desired-state resolver, the process's memory, the clock).

The ledger is the node's memory that survives a crash; ``Memory`` is the process's: what it
logged once already (a verdict found again on every poll is said once), every secret value it
decrypted (its output is cleaned of them before it is kept or shown), the commits whose images
a waiting node pulled ahead, and the batch before it that a waiting node watches cheaply. A
re-executed daemon hands it over (``daemon.shed``): ``said``, ``take_back``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from reconciler.core.redact import NONE as NO_SECRETS
from reconciler.core.redact import Redactor
from reconciler.drivers import Driver, drivers_in_use, make_driver

if TYPE_CHECKING:
    from reconciler.core.model import Desired, Observed, Plan
    from reconciler.fleet.rollout import Quiet
    from reconciler.ledger import Ledger
    from reconciler.ledger.statedir import State
    from reconciler.node.desired import Resolver
    from reconciler.node.keeper import TrustKeeper
    from reconciler.node.report import Reporter
    from reconciler.repo.definitions import DeploymentRepo
    from reconciler.settings import AgentConfig
    from reconciler.source.mirror import Source
    from reconciler.trust.notesig import NoteTrust

log = logging.getLogger("reconciler.agent")

SAID_AT_MOST = 1000  # distinct verdicts remembered before the memory starts over


@dataclass
class Memory:
    """The agent process's own memory (see the module's docstring)."""

    # Every secret value this agent decrypted so far (never fewer: a service may still run, or
    # be put back on, an older value): what its output is cleaned of before it is kept or shown.
    redact: Redactor = NO_SECRETS
    pulled_ahead: set[str] = field(default_factory=set)  # commits whose images a wait pulled
    quiet: Quiet | None = None  # a waiting node's still batch before (``fleet.rollout``)
    # The nodes whose notes the last pass's wait hangs on (a few at most): the daemon's wait-polls
    # look at their tips (``node.waitpoll.notes_moved``). ``told``: tips a wait-poll said moved, no
    # pass run since (said again until one ran); ``handled``: those a pass ran after; a notes probe
    # whose tip a pass found git not to have is ``notes_doubted`` until it names git's tips again.
    watch: tuple[str, ...] = ()
    told: dict[str, str | None] = field(default_factory=dict)
    handled: dict[str, str | None] = field(default_factory=dict)
    notes_doubted: bool = False
    note_trust: tuple[str | None, NoteTrust] | None = None  # the commit whose trust/nodes it is
    _said: dict[Hashable, None] = field(default_factory=dict)

    def say_once(self, key: Hashable, level: int, msg: str, *args: Any) -> None:
        """Log a verdict once, not on every poll that finds it again."""
        if key in self._said:
            return
        if len(self._said) > SAID_AT_MOST:
            self._said.clear()
        self._said[key] = None
        log.log(level, msg, *args)

    def said(self) -> tuple[Hashable, ...]:
        """What was logged once so far (``say_once``), to hand to a re-executed daemon."""
        return tuple(self._said)

    def learn(self, secrets: Iterable[tuple[str, str]]) -> Redactor:
        """Remember secret values (``(name, value)``); returns the redactor that now knows them."""
        self.redact = self.redact.plus(secrets)
        return self.redact

    def take_back(self, said: Iterable[Hashable], secrets: Iterable[tuple[str, str]], pulled: Iterable[str]) -> None:
        """What the interpreter this agent's daemon replaced knew (``shed``): what it logged once,
        the secret values it decrypted (``(value, name)``), the commits whose images it pulled."""
        self._said.update(dict.fromkeys(said))
        self.learn((name, value) for value, name in secrets)
        self.pulled_ahead.update(pulled)


@dataclass
class NodeContext:
    """One node's parts (see the module's docstring)."""

    settings: AgentConfig
    state: State
    ledger: Ledger
    source: Source
    keeper: TrustKeeper
    reporter: Reporter
    resolver: Resolver
    memory: Memory
    clock: Callable[[], datetime]

    @property
    def node(self) -> str:
        return self.settings.node

    @property
    def redact(self) -> Redactor:
        return self.memory.redact

    def say_once(self, key: Hashable, level: int, msg: str, *args: Any) -> None:
        self.memory.say_once(key, level, msg, *args)

    def learn(self, repo: DeploymentRepo) -> None:
        """Remember the secret values ``repo`` was decrypted with, to clean them out of every
        output this agent captures (here, and in the ledger it writes)."""
        from reconciler.render.secrets import secret_values  # only once a repo was decrypted

        self.ledger.redact = self.memory.learn((name, text) for _, name, text in secret_values(repo.unlocked))

    def take_back(self, said: Iterable[Hashable], secrets: Iterable[tuple[str, str]], pulled: Iterable[str]) -> None:
        """What a replaced interpreter knew (``Memory.take_back``), the ledger told too."""
        self.memory.take_back(said, secrets, pulled)
        self.ledger.redact = self.memory.redact

    def drivers(self, desired: Desired | None) -> dict[str, Driver]:
        return drivers_for(self.settings, desired)

    def plan(self, desired: Desired, observed: Observed) -> Plan:
        """The planner's plan, its reasons cleaned of secret values before anything hashes, shows
        or logs it: a reason names the changed keys of a file, and a template may use a secret
        as a key. The values of the commits the running services were rendered from are learnt
        first: a key a rotation renamed is the old value, in the files on disk."""
        from reconciler.plan.planner import plan as make_plan  # here: an idle poll plans nothing

        self.resolver.learn_running(s.commit for s in observed.services if s.commit)
        held = {name: str(h.get("by", "?")) for name, h in self.ledger.held_stopped().items()}
        return self.redact.plan(make_plan(desired, observed, held))

    def last_output(self, service: str) -> str:
        """The service's last lines of output, secret values replaced by ``<secret NAME>``."""
        for driver in self.drivers(None).values():
            try:
                text = driver.last_output(service)
            except Exception:  # a driver that cannot read its log says nothing
                continue
            if text:
                return self.redact(text)
        return ""


def drivers_for(cfg: AgentConfig, desired: Desired | None) -> dict[str, Driver]:
    """Drivers that hold services of this node (they may have some to stop), plus what the slice names."""
    names = drivers_in_use(cfg.state_dir) | ({s.runtime.driver for s in desired.services} if desired else set())
    return {n: make_driver(n, cfg.state_dir, cfg.node, cfg.host.access(), cfg.docker.registries)
            for n in sorted(names)}
