"""The composition root: one node's parts built over one state dir and wired into a context.

Nothing below imports this module. A pass is ``node.reconcile`` (its steps each take the
``NodeContext`` built here), an operator's operations are ``node.operations``, the daemon
(scheduler, supervisor, signals) is ``daemon``. The command line and the daemon hold an
``Agent``; the few methods here only hand them to those modules, so a test swaps a part by
building the context with another, without patching.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from reconciler.core.errors import CorruptMirror
from reconciler.drivers.process import check_account
from reconciler.ledger import Ledger
from reconciler.ledger.statedir import State
from reconciler.node.context import Memory, NodeContext
from reconciler.node.desired import Resolver
from reconciler.node.keeper import TrustKeeper
from reconciler.node.localfiles import check_local
from reconciler.node.peers import fleet_view
from reconciler.node.reconcile import CHANGE_IMPORTS, head, reconcile
from reconciler.node.report import Reporter, key_loader, notes_ref
from reconciler.node.run import Request, RunResult
from reconciler.node.waitpoll import Tips, notes_moved, notes_tips, passed
from reconciler.source.gitrun import safe_url
from reconciler.source.mirror import Source
from reconciler.source.probe import TipProbe

if TYPE_CHECKING:
    from reconciler.core.model import Desired
    from reconciler.core.redact import Redactor
    from reconciler.drivers import Driver
    from reconciler.fleet.rollout import FleetView
    from reconciler.repo.definitions import DeploymentRepo
    from reconciler.settings import AgentConfig
    from reconciler.trust.verify import Gate

__all__ = ["Agent"]


@dataclass
class Agent:
    """One node's agent: its parts wired together over one state dir (``ctx``)."""

    cfg: AgentConfig
    progress: bool | None = None
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    # The node's agent (a pass that converges: `agent`, `apply`, the daemon) keeps the state dir:
    # it records itself as its owner. Any other command only checks it is this node's: a
    # mistyped --node there must not make the real agent's start a refusal (exit 2, for good).
    keeps: bool = True
    ctx: NodeContext = field(init=False)

    def __post_init__(self) -> None:
        cfg = self.cfg
        # The node's own files first: a settings error is said here, before a state dir is made
        # or anything fetched, and never noted to the fleet as the commit's (``localfiles``).
        check_local(cfg)
        note_key = key_loader(cfg.note_key, cfg.state_dir)
        state = State(cfg.state_dir)
        ledger = Ledger.open(cfg.state_dir)
        try:
            ledger.claim(cfg.node, record=self.keeps)  # another node's state dir is refused, never taken over
        except BaseException:
            ledger.close()
            raise
        source = Source(
            cfg.remote, cfg.branch, state.mirror, ssh_command=cfg.ssh_command, progress=self.progress,
            reads=cfg.read_urls, write=cfg.write_url,
            probes={r.url: TipProbe(r.probe, r.check_every, safe_url(r.probe)) for r in cfg.remotes
                    if r.probe and r.reads},
            warm=CHANGE_IMPORTS,
        )
        keeper = TrustKeeper(cfg.trust, cfg.state_dir, ledger, lambda: source.repo, notes_ref(cfg.node), self.clock,
                             cfg.node, cfg.branch, note_key)
        memory = Memory()
        resolver = Resolver(cfg.node, lambda: source.repo, ledger, keeper, cfg.secrets.age_identity,
                            lambda repo: self.ctx.learn(repo), check_account)
        reporter = Reporter(source, ledger, cfg.node, note_key)
        self.ctx = NodeContext(cfg, state, ledger, source, keeper, reporter, resolver, memory, self.clock)

    def close(self) -> None:
        self.ctx.ledger.close()

    def reconcile_once(self, *, fetch: bool = True, rev: str | None = None, instantiate: bool = False,
                       only: set[str] | None = None) -> RunResult:
        """One pass. ``instantiate``: an operator's `reconciler apply`, which also applies what
        ``apply: manual`` staged (``only``: just these services)."""
        ask = Request(fetch, rev, frozenset(only) if only is not None else None, instantiate)
        self.ctx.memory.watch = ()  # what this pass waits on, if it does, it says itself
        try:
            result = reconcile(self.ctx, ask)
        except CorruptMirror as exc:  # the mirror is a cache: cloned again, and the pass once more
            with self.ctx.state.lock(wait=30):
                self.ctx.source.repair(exc)
            result = reconcile(self.ctx, ask)
        passed(self.ctx)  # the notes tips a wait-poll saw move: read by this pass
        return result

    # the parts, for the command line and the daemon ------------------------------------------
    @property
    def ledger(self) -> Ledger:
        return self.ctx.ledger

    @property
    def state(self) -> State:
        return self.ctx.state

    @property
    def source(self) -> Source:
        return self.ctx.source

    @property
    def reporter(self) -> Reporter:
        return self.ctx.reporter

    @property
    def gate(self) -> Gate:
        return self.ctx.keeper.gate

    @property
    def redact(self) -> Redactor:
        return self.ctx.redact

    @property
    def pulled_ahead(self) -> set[str]:
        return self.ctx.memory.pulled_ahead

    def say_once(self, key: Hashable, level: int, msg: str, *args: Any) -> None:
        self.ctx.say_once(key, level, msg, *args)

    def said(self) -> tuple[Hashable, ...]:
        return self.ctx.memory.said()

    def take_back(self, said: Iterable[Hashable], secrets: Iterable[tuple[str, str]], pulled: Iterable[str]) -> None:
        self.ctx.take_back(said, secrets, pulled)

    def drivers(self, desired: Desired | None) -> dict[str, Driver]:
        return self.ctx.drivers(desired)

    def head(self, fetch: bool, rev: str | None) -> tuple[str, bool]:
        return head(self.ctx, fetch, rev)

    def load(self, commit: str) -> DeploymentRepo:
        return self.ctx.resolver.load(commit)

    def fleet_view(self, nodes: Iterable[str] | None = None, trusted: str | None = None) -> FleetView:
        return fleet_view(self.ctx, nodes, trusted)

    def waiting_on(self) -> tuple[str, ...]:
        """The few nodes whose next note may end the last pass's wait in the rollout (none when
        it did not wait on one): what the daemon's wait-polls look at."""
        return self.ctx.memory.watch

    def notes_tips(self, nodes: Iterable[str]) -> dict[str, str | None] | None:
        """A wait-poll's first step (``node.waitpoll.notes_tips``): the probe's word, no lock needed."""
        return notes_tips(self.ctx, nodes)

    def notes_moved(self, nodes: Iterable[str], tips: Tips | None | Literal["ask"] = "ask",
                    may_fetch: Callable[[], bool] | None = None) -> tuple[str, ...] | None:
        """A wait-poll (``node.waitpoll.notes_moved``): those of ``nodes`` whose notes tip moved.
        ``tips``: what ``notes_tips`` read ("ask": read them now)."""
        nodes = tuple(nodes)
        return notes_moved(self.ctx, nodes, notes_tips(self.ctx, nodes) if isinstance(tips, str) else tips, may_fetch)

