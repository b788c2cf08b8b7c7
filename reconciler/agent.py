"""The composition root: one node's stages and ledger, wired together over one state dir.

The loop itself is ``pipeline`` (named sub-steps); operator operations (rollback, unpin, retry)
are ``operations``; the daemon (scheduler, supervisor, signals) is ``daemon``. Everything here
is wiring and the small stage helpers those share, so a test swaps a part without patching.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from reconciler.core.errors import BadInput, CorruptMirror
from reconciler.core.model import Desired, Plan, Revision, VerifiedRevision
from reconciler.core.redact import NONE as NO_SECRETS
from reconciler.core.redact import Redactor
from reconciler.drivers import Driver, HostAccess, drivers_in_use, make_driver
from reconciler.drivers.observe import observe
from reconciler.ledger.ledger import Ledger
from reconciler.ledger.statedir import State
from reconciler.node.report import Reporter, notes_ref
from reconciler.node.steps import RunResult, reconcile
from reconciler.plan.planner import in_windows, stage
from reconciler.plan.planner import plan as make_plan
from reconciler.settings.agent import AgentConfig
from reconciler.source.mirror import Source, safe_url
from reconciler.source.probe import TipProbe
from reconciler.source.refs import NOTES_PREFIX
from reconciler.trust.keeper import TrustKeeper

if TYPE_CHECKING:
    from reconciler.fleet.rollout import FleetView, Quiet
    from reconciler.fleet.rollout import Verdict as RolloutVerdict
    from reconciler.node.apply import Pulled
    from reconciler.repo.load import DeploymentRepo
    from reconciler.trust.verify import Decision, Gate

log = logging.getLogger("reconciler.agent")

__all__ = ["Agent", "RunResult", "drivers_for", "host_access"]


def drivers_for(cfg: AgentConfig, desired: Desired | None) -> dict[str, Driver]:
    """Drivers that hold services of this node (they may have some to stop), plus what the slice names."""
    names = drivers_in_use(cfg.state_dir) | ({s.runtime.driver for s in desired.services} if desired else set())
    return {n: make_driver(n, cfg.state_dir, cfg.node, host_access(cfg), cfg.docker.registries) for n in sorted(names)}


def host_access(cfg: AgentConfig) -> HostAccess:
    return cfg.host.access()


@dataclass
class Agent:
    """One node's agent: the stages wired together over one state dir."""

    cfg: AgentConfig
    progress: bool | None = None
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    state: State = field(init=False)
    ledger: Ledger = field(init=False)
    source: Source = field(init=False)
    reporter: Reporter = field(init=False)
    keeper: TrustKeeper = field(init=False)
    # Every secret value this agent decrypted so far (never fewer: a service may still run, or
    # be put back on, an older value): what its output is cleaned of before it is kept or shown.
    redact: Redactor = field(init=False, default=NO_SECRETS)
    _said: dict[Hashable, None] = field(init=False, default_factory=dict)
    pulled_ahead: set[str] = field(init=False, default_factory=set)  # commits whose images a wait pulled
    _quiet: Quiet | None = field(init=False, default=None)  # a waiting node's still batch before (``rollout``)

    def __post_init__(self) -> None:
        self.state = State(self.cfg.state_dir)
        self.ledger = Ledger.open(self.cfg.state_dir)
        self.source = Source(
            self.cfg.remote, self.cfg.branch, self.state.mirror,
            ssh_command=self.cfg.ssh_command, progress=self.progress,
            reads=self.cfg.read_urls, write=self.cfg.write_url,
            probes={r.url: TipProbe(r.probe, r.check_every, safe_url(r.probe))
                    for r in self.cfg.remotes if r.probe and r.reads},
        )
        self.keeper = TrustKeeper(self.cfg.trust, self.cfg.state_dir, self.ledger, lambda: self.source.repo,
                                  notes_ref(self.cfg.node), self.clock, self.cfg.node, self.cfg.branch)
        self.reporter = Reporter(self.source, self.ledger, self.cfg.node)

    def close(self) -> None:
        self.ledger.close()

    @property
    def gate(self) -> Gate:
        return self.keeper.gate

    def say_once(self, key: Hashable, level: int, msg: str, *args: Any) -> None:
        """Log a verdict once, not on every poll that finds it again."""
        if key in self._said:
            return
        if len(self._said) > 1000:
            self._said.clear()
        self._said[key] = None
        log.log(level, msg, *args)

    def said(self) -> tuple[Hashable, ...]:
        """What was logged once so far (``say_once``), to hand to a re-executed daemon."""
        return tuple(self._said)

    def take_back(self, said: Iterable[Hashable], secrets: Iterable[tuple[str, str]], pulled: Iterable[str]) -> None:
        """What the interpreter this agent's daemon replaced knew (``shed``): what it logged once,
        the secret values it decrypted (``(value, name)``), the commits whose images it pulled."""
        self._said.update(dict.fromkeys(said))
        self.redact = self.redact.plus((name, value) for value, name in secrets)
        self.ledger.redact = self.redact
        self.pulled_ahead.update(pulled)

    # stages ----------------------------------------------------------------------------
    def drivers(self, desired: Desired | None) -> dict[str, Driver]:
        return drivers_for(self.cfg, desired)

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

    def head(self, fetch: bool, rev: str | None) -> tuple[str, bool]:
        if rev is not None:
            import pygit2

            try:
                return str(self.source.repo.revparse_single(rev).peel(pygit2.Commit).id), False
            except (KeyError, ValueError, pygit2.GitError) as exc:
                raise BadInput(f"revision {rev!r} is not in the node's mirror (fetch first)") from exc
        if fetch:
            return self.source.update()
        local = self.source.local_head()
        if local is None:
            raise BadInput("the node's mirror is empty: run `reconciler agent --once` first")
        return local, False

    def decide(self, commit: str) -> Decision:
        return self.keeper.decide(commit)

    def revision(self, commit: str) -> Revision:
        """What the mirror holds for ``commit``; nothing trusted yet."""
        import pygit2

        from reconciler.repo.tree import corrupt

        try:
            c = self.source.repo.revparse_single(commit).peel(pygit2.Commit)
        except (KeyError, ValueError) as exc:
            raise BadInput(f"commit {commit!r} is not in the node's mirror") from exc
        except pygit2.GitError as exc:
            raise corrupt(self.source.repo, exc) from exc
        return Revision(str(c.id), str(c.tree_id), f"{c.author.name} <{c.author.email}>", int(c.commit_time))

    def load(self, commit: str) -> DeploymentRepo:
        # Imported here: templates and schemas are not needed on a poll that finds nothing new.
        from dataclasses import replace

        from reconciler.repo.load import load_repo
        from reconciler.repo.tree import GitTree

        repo = load_repo(GitTree(self.source.repo, commit))
        if (self.ledger.plane(commit) or {}).get("aborted"):
            repo = replace(repo, cutover_aborted=True)  # its cutover failed where it attached: see controlplane
        return self.unlock(repo) if repo.secret_files else repo

    def unlock(self, repo: DeploymentRepo) -> DeploymentRepo:
        """The repo with this node's secrets decrypted (only the files encrypted to its key). No
        identity configured: none decrypted, and a template that reads one fails SECRET_UNREADABLE."""
        from dataclasses import replace

        from reconciler.render.secrets import SecretUnreadable, identities, open_files

        path = self.cfg.secrets.age_identity
        if path is None:
            return replace(repo, unlocked={}, no_identity=True)
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise SecretUnreadable(f"cannot read the age identity: {getattr(exc, 'strerror', None) or exc}",
                                   file=str(path)) from None
        unlocked = replace(repo, unlocked=open_files(repo.secret_files, identities(text, str(path))))
        self.learn(unlocked)
        return unlocked

    def learn(self, repo: DeploymentRepo) -> None:
        """Remember the secret values ``repo`` was decrypted with, to clean them out of every
        output this agent captures (here, and in the ledger it writes)."""
        from reconciler.render.secrets import named_values

        for f in (repo.unlocked or {}).values():
            self.redact = self.redact.plus(named_values(f.values))
        self.ledger.redact = self.redact

    def desired(self, rev: VerifiedRevision, repo: DeploymentRepo | None = None) -> Desired:
        """The node's slice at ``rev``, with pinned services at their pinned commit (vouched for
        by trust again); each service knows the commit it was rendered from."""
        from dataclasses import replace

        from reconciler.drivers.process import check_account
        from reconciler.render.node import render_node
        from reconciler.upgrades.rules import held_back
        from reconciler.upgrades.runner import owed, stage_bases

        commit = rev.commit
        repo = repo or self.load(commit)
        held = self.ledger.held()  # template variables an upgrade's pin step holds here
        desired = render_node(repo, self.cfg.node, commit, check_account, pinned=held)
        # An operator's pin wins; then what this node keeps as it ran it, being outside the stage
        # the commit's upgrades are limited to.
        staged = held_back(repo, self.cfg.node, stage_bases(self, commit, repo)) if repo.stages else {}
        # and what it keeps because the upgrade that brings the new version failed here
        staged.update({s: at for s, (at, _) in owed(self, commit, repo).kept.items()})
        pins = {p.service: p.commit for p in self.ledger.pins()}
        services = []
        for svc in desired.services:
            at = pins.get(svc.name) or staged.get(svc.name)
            if at is not None:
                pinned = self.keeper.vouch(self.revision(at))
                old = render_node(self.load(pinned.commit), self.cfg.node, pinned.commit, check_account,
                                  pinned=held).by_name()
                if svc.name in old:
                    services.append(replace(old[svc.name], origin=at))
                    continue
            services.append(replace(svc, origin=commit))
        return Desired(desired.node, desired.commit, tuple(services))

    def resume_after_reboot(self, events: list[str]) -> str | None:
        """A reboot this node started for a commit: once the boot id changed, run the undrain
        hook and go on (returns None); before that, the commit it waits for."""
        if "host" not in drivers_in_use(self.cfg.state_dir):
            return None
        from reconciler.drivers.host import HostDriver

        driver = make_driver("host", self.cfg.state_dir, self.cfg.node, host_access(self.cfg))
        assert isinstance(driver, HostDriver)
        pending = driver.pending_reboot()
        if pending is None:
            return None
        boot = driver.host.boot_id()
        if boot == pending["boot_id"]:
            self.say_once(("reboot", pending["commit"]), logging.WARNING, "%s: reboot pending for %s",
                          self.cfg.node, pending["commit"][:12])
            return str(pending["commit"])
        detail = f"rebooted for {pending['commit'][:12]} (boot id {pending['boot_id'][:8]} -> {boot[:8]})"
        if pending.get("undrain"):
            import subprocess

            done = subprocess.run(["/bin/sh", "-c", pending["undrain"]], capture_output=True, text=True, timeout=1800)
            detail += "; undrain hook " + ("ok" if done.returncode == 0 else f"failed: {done.stderr.strip()[-200:]}")
        driver.finish_reboot(pending)
        self.ledger.log(pending["service"], pending["commit"], pending["hash"], "reboot", "ok", "resumed", detail)
        events.append(detail)
        log.warning("%s: %s", self.cfg.node, detail)
        return None

    # the loop ------------------------------------------------------------------------
    def verified_desired(self, *, fetch: bool, rev: str | None) -> tuple[Desired, bool]:
        """The node's slice at the branch head (or ``rev``), for a command that reads ahead and
        applies nothing (plan, prepull): verified first, nothing moves in the ledger. Call with
        the pass lock held."""
        desired, _, fetched = self.verified_slice(fetch=fetch, rev=rev)
        return desired, fetched

    def verified_slice(self, *, fetch: bool, rev: str | None) -> tuple[Desired, DeploymentRepo, bool]:
        """``verified_desired`` with the repo it was rendered from (its windows, its budgets)."""
        commit, fetched = self.head(fetch, rev)
        self.decide(commit)  # a refusal is raised: nothing unverified is even rendered
        repo = self.load(commit)
        return self.desired(self.keeper.vouch(self.revision(commit)), repo), repo, fetched

    def plan(self, *, fetch: bool = True, rev: str | None = None) -> tuple[Plan, bool]:
        with self.state.lock(wait=30):
            desired, repo, fetched = self.verified_slice(fetch=fetch, rev=rev)
            observed = observe(self.cfg.node, self.drivers(desired))
            # what the next pass would do now: apply: manual staged, closed windows waited for
            return in_windows(stage(make_plan(desired, observed)), repo.windows, self.clock()), fetched

    def prepull(self, *, fetch: bool = True, rev: str | None = None) -> tuple[str, list[Pulled]]:
        """The images the branch head (or ``rev``) needs on this node, pulled now, ahead of its
        wave; nothing else changes. Returns the commit and each image's result."""
        from reconciler.node.operations import prepull

        return prepull(self, fetch=fetch, rev=rev)

    def reconcile_once(self, *, fetch: bool = True, rev: str | None = None, instantiate: bool = False,
                       only: set[str] | None = None) -> RunResult:
        """One pass. ``instantiate``: an operator's `reconciler apply`, which also applies what
        ``apply: manual`` staged (``only``: just these services)."""
        try:
            return reconcile(self, fetch=fetch, rev=rev, only=only, instantiate=instantiate)
        except CorruptMirror as exc:  # the mirror is a cache: cloned again, and the pass once more
            with self.state.lock(wait=30):
                self.source.repair(exc)
            return reconcile(self, fetch=fetch, rev=rev, only=only, instantiate=instantiate)

    # operations ------------------------------------------------------------------------
    def rollback(self, service: str, to: str | None = None, by: str = "an operator") -> RunResult:
        from reconciler.node.operations import rollback

        return rollback(self, service, to, by)

    def unpin(self, service: str, by: str = "an operator") -> bool:
        from reconciler.node.operations import unpin

        return unpin(self, service, by)

    def retry(self) -> str | None:
        from reconciler.node.operations import retry

        return retry(self)

    # fleet -----------------------------------------------------------------------------
    def fleet_view(self, nodes: Iterable[str] | None = None) -> FleetView:
        """The notes of ``nodes`` (None: every node's), fetched now from the read remote this
        pass uses (only those refs: a node waiting on three predecessors reads three refs, not
        the fleet's); this node's own from its local ref, the freshest."""
        from reconciler.fleet.view import FLEET_PREFIX, fleet_view

        if nodes is None:
            specs = [f"+{NOTES_PREFIX}*:{FLEET_PREFIX}*"]
        else:
            # One glob per node: protocol v2 asks the server for that prefix only, and a node that
            # has noted nothing yet (no ref) is no error, as it would be for an exact refspec.
            specs = [f"+{NOTES_PREFIX}{n}*:{FLEET_PREFIX}{n}*" for n in sorted(set(nodes))
                     if n != self.cfg.node]
        if specs:
            self.source.run("fetch", "--no-tags", "--prune", self.source.url, *specs, what="notes fetch from")
        # its own ref is fresher than what it fetched back, once it has one (a state dir that has
        # noted nothing, a view from another state dir, reads the remote's)
        own = {self.cfg.node: self.reporter.ref} if self.reporter.ref in self.source.repo.references else {}
        return fleet_view(self.source.repo, FLEET_PREFIX, own)

    def _still(self, sentinel: str, commit: str) -> bool:
        """The sentinel has not begun ``commit``: the read remote's probe publishes the notes tip
        this node fetched last (no git at all), or a read of that one ref says so."""
        from reconciler.fleet.rollout import begun
        from reconciler.fleet.view import FLEET_PREFIX
        from reconciler.source.refs import NotPlain, read_ref

        probe = self.source.probes.get(self.source.url)
        if probe is not None and (tip := probe.note_tip(sentinel)) is not None:
            try:
                if tip == read_ref(self.source.path, f"{FLEET_PREFIX}{sentinel}"):
                    return True
            except NotPlain:
                pass  # git's read below says
        return not begun(self.fleet_view((sentinel,)), sentinel, commit)

    def rollout_gate(self, repo: DeploymentRepo, commit: str, *, barriers: bool = False,
                     fleet: FleetView | None = None, before: bool | None = None) -> RolloutVerdict:
        """``barriers``: this node takes part in an upgrade of ``commit``; its steps' barriers
        order it (the waves do not), and a failure anywhere halts it all the same. ``before``: on
        the VIP networks after the commit it settled last (a node joining them waits for the
        nodes that leave them: see ``controlplane``)."""
        from reconciler.core.model import Verdict
        from reconciler.fleet.rollout import WHOLE_READ_EVERY, Quiet, decide, early, plan_rollout, sentinel
        from reconciler.fleet.rollout import Verdict as Go

        rollout = plan_rollout(repo.settings, repo.nodes, repo.members)
        off = repo.planes.off(self.cfg.node) if repo.planes.attaches(self.cfg.node, before) else ()
        if not rollout.enabled and not barriers and not off:
            return Go(True)
        own = self.ledger.verdict(commit)
        if own is not None and own not in (Verdict.HALTED, Verdict.WAITING, Verdict.ERROR, Verdict.REFUSED):
            return Go(True, reason="already started")  # started it: finish it whatever others do
        if fleet is None and barriers:
            fleet = self.fleet_view()
        if fleet is None:  # waves alone: the batch before it (and who leaves the VIPs first)
            watched, near = rollout.watched(self.cfg.node), rollout.frontier(self.cfg.node)
            # The batch before first, every poll (its sentinel alone while it has not begun); all
            # of them when it is done. A cutover (``off``) reads all at once: it is rare, and its
            # wait is said before the waves'.
            if len(near) < len(watched) and not off:
                now = self.clock().timestamp()
                quiet = self._quiet
                if (quiet is not None and quiet.commit == commit and 0 <= now - quiet.since < WHOLE_READ_EVERY
                        and self._still(quiet.sentinel, commit)):
                    return quiet.verdict
                view = self.fleet_view(near)
                said = early(rollout, self.cfg.node, commit, view)
                self._quiet = None
                if said is not None and not said.halted and (s := sentinel(rollout, self.cfg.node, commit, view)):
                    self._quiet = Quiet(commit, s, now, said)
                if said is not None:
                    return said
            fleet = self.fleet_view((*watched, *off))
        return decide(rollout, self.cfg.node, commit, fleet, time.time(), barriers=barriers, off_first=off)
