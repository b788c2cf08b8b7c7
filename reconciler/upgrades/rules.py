"""Upgrades: a service's ordered steps across every node that runs it, with barriers read from
the nodes' notes (TripleO's composable upgrades, with no controller). Pure: the repo at the
upgrade commit, the versions this node runs and the notes in; what to do next out.

A commit *upgrades* a service when the service has ``upgrade:`` steps and its version (its
``version`` and its image) differs from the version at the commit's parent. Every node that runs
the service at that commit takes part: it notes every step for that commit, as done, or as
skipped when it already runs the new version. Step k+1 starts on a node only when every
participant noted step k done or skipped (a ``once`` step: done on the one node that runs it,
the first participant in wave order). ``upgrade_after`` holds a service's first step until the
services it names are upgraded on every node. While a commit upgrades something on a node,
barriers order that node, not the rollout's waves; a failure anywhere still halts everyone.

Stages: a commit whose ``rollout: {stage: S}`` names one of reconciler.yaml's ``stages`` takes
its upgrades to S's nodes only. Every other node keeps each service whose version the commit
changes at the commit that last took that node in (its *base*: the nearest ancestor with no
stage or a stage that holds the node), and applies the rest of the commit. A later commit
whose stage holds those nodes (or that has no stage) upgrades them from their base, with the
same steps and barriers, among themselves. A post step waits for the commit in which no node
holds its services back any more.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from reconciler.core.model import PASSED, Scope, StepRecord, StepStatus

if TYPE_CHECKING:
    from reconciler.repo.definitions import DeploymentRepo, ServiceDef
    from reconciler.repo.steps import PostStep, Stage, Step

__all__ = ["Barrier", "Scope", "StepRecord", "StepStatus", "Upgrade",
           "STARTED_FRESH", "barrier", "bases", "describe", "describe_post", "fleet_upgrades_of", "held_back",
           "holding", "plan_upgrades", "post_earned", "post_steps_due", "post_targets", "reboot_turn", "stage_of",
           "upgraded", "version_changed", "version_of"]

# What a node notes on the steps it skips because it did not run the service before the commit:
# the commit brings it a version it never ran, which earns the post steps as a step run does.
STARTED_FRESH = "not running here before: started at the new version"


@dataclass(frozen=True)
class Upgrade:
    """One service's upgrade on this node for one commit."""

    service: str
    from_version: str
    to_version: str
    steps: tuple[Step, ...]
    after: tuple[str, ...]
    participants: tuple[str, ...]  # every node that runs the service at the commit, in wave order
    needed: bool  # False: this node already runs the new version; its steps are noted skipped

    @property
    def once_node(self) -> str:
        return self.participants[0] if self.participants else ""


def version_changed(old: ServiceDef, new: ServiceDef) -> bool:
    """A new version of the software: its ``version`` changed (both name one), or its image.
    Naming a version for the first time is not an upgrade (nothing new runs)."""
    if old.version and new.version and str(old.version) != str(new.version):
        return True
    before, after = old.container.get("image"), new.container.get("image")
    return bool(before and after and before != after)


def version_of(svc: ServiceDef | None) -> str:
    """What an upgrade compares: the service's ``version`` and its image."""
    if svc is None:
        return ""
    parts = [str(svc.version)] if svc.version else []
    image = svc.container.get("image")
    if image:
        parts.append(str(image))
    return " ".join(parts)


def stage_of(repo: DeploymentRepo) -> Stage | None:
    """The stage the commit's upgrades are limited to (``rollout: {stage: S}``); None: the fleet."""
    name = (repo.settings.get("rollout") or {}).get("stage")
    return repo.stages.get(str(name)) if name else None


# node -> (commit, repo at that commit): the commit that last took the node in
Bases = Mapping[str, tuple[str, "DeploymentRepo"]]


def bases(nodes: Iterable[str],
          ancestors: Iterable[tuple[str, DeploymentRepo]]) -> dict[str, tuple[str, DeploymentRepo]]:
    """Each node's base: the first of ``ancestors`` (the commit's parent, then its parent, ...)
    with no stage or a stage that holds the node. ``ancestors`` is read only as far as needed
    (one commit when the parent had no stage); a node no walked commit took in gets the oldest."""
    wanted = set(nodes)
    out: dict[str, tuple[str, DeploymentRepo]] = {}
    last: tuple[str, DeploymentRepo] | None = None
    for commit, repo in ancestors:
        last = (commit, repo)
        stage = stage_of(repo)
        for node in wanted - out.keys():
            if stage is None or node in stage.nodes:
                out[node] = last
        if len(out) == len(wanted):
            break
    if last is not None:
        for node in wanted - out.keys():
            out[node] = last
    return out


def _in_stage(repo: DeploymentRepo, node: str) -> bool:
    stage = stage_of(repo)
    return stage is None or node in stage.nodes


def upgraded(repo: DeploymentRepo, base: Bases) -> tuple[str, ...]:
    """The services this commit upgrades (same answer on every node): those with steps whose
    version differs from the version at the base of some node of the commit's stage that runs it."""
    out = set()
    for name, svc in repo.services.items():
        if not svc.upgrade:
            continue
        for node in participants(repo, name, ()):
            then = base.get(node)
            if then is not None and name in then[1].services and version_changed(then[1].services[name], svc):
                out.add(name)
                break
    return tuple(sorted(out))


def held_back(repo: DeploymentRepo, node: str, base: Bases) -> dict[str, str]:
    """service -> base commit: what a node outside the commit's stage keeps at its base (every
    service it runs whose version the commit changes, steps or not). Empty inside the stage."""
    then = base.get(node)
    if then is None or _in_stage(repo, node) or node not in repo.nodes:
        return {}
    old = then[1]
    return {name: then[0] for name in repo.services_of(node)
            if name in old.services and version_changed(old.services[name], repo.services[name])}


def holding(repo: DeploymentRepo, base: Bases) -> dict[str, tuple[str, ...]]:
    """service -> the nodes outside the commit's stage that keep it at an older version."""
    out: dict[str, list[str]] = {}
    for node in sorted(repo.nodes):
        for name in held_back(repo, node, base):
            out.setdefault(name, []).append(node)
    return {k: tuple(v) for k, v in out.items()}


def participants(repo: DeploymentRepo, service: str, order: Sequence[str]) -> tuple[str, ...]:
    """Every node of the commit's stage that runs ``service``, in ``order`` (wave order; the
    rest by name)."""
    runs = {n for n in repo.nodes if service in repo.services_of(n) and _in_stage(repo, n)}
    first = [n for n in order if n in runs]
    return (*first, *sorted(runs - set(first)))


def plan_upgrades(repo: DeploymentRepo, node: str, fleet_upgrades: Iterable[str], running: Mapping[str, str],
                  order: Sequence[str]) -> tuple[Upgrade, ...]:
    """This node's part in the commit's upgrades, ordered by ``upgrade_after`` then name.
    ``running``: the version each service runs here now ("" when it does not run)."""
    out = []
    for name in fleet_upgrades:
        taking_part = participants(repo, name, order)
        if node not in taking_part:  # does not run it, or outside the commit's stage
            continue
        svc = repo.services[name]
        target = version_of(svc)
        now = running.get(name, "")
        out.append(Upgrade(name, now, target, svc.upgrade, svc.upgrade_after, taking_part,
                           needed=bool(now) and now != target))
    names = {u.service for u in out}
    ordered: list[Upgrade] = []
    pending = sorted(out, key=lambda u: u.service)
    while pending:
        ready = [u for u in pending if not (set(u.after) & names - {o.service for o in ordered})] or pending[:1]
        ordered.append(ready[0])
        pending.remove(ready[0])
    return tuple(ordered)


def fleet_upgrades_of(repo: DeploymentRepo, fleet_upgrades: Iterable[str], order: Sequence[str]) -> dict[str, Upgrade]:
    """Every upgrade of the commit as the fleet runs it (steps and participants): what a
    barrier on ``upgrade_after`` waits on, whether or not this node runs that service."""
    return {name: Upgrade(name, "", version_of(repo.services[name]), repo.services[name].upgrade,
                          repo.services[name].upgrade_after, participants(repo, name, order), needed=False)
            for name in fleet_upgrades}


@dataclass(frozen=True)
class Barrier:
    """Whether a step may start: ``waiting_for`` the nodes that have not noted what it needs."""

    what: str
    waiting_for: tuple[str, ...] = ()

    @property
    def go(self) -> bool:
        return not self.waiting_for

    @property
    def reason(self) -> str:
        shown = ", ".join(self.waiting_for[:5]) + (f" and {len(self.waiting_for) - 5} more"
                                                     if len(self.waiting_for) > 5 else "")
        return f"waiting at barrier {self.what}: for {shown}"


# node -> (service, step) -> status, for one commit: what the fleet's notes say
Progress = Mapping[str, Mapping[tuple[str, str], str]]


def barrier(up: Upgrade, k: int, progress: Progress, others: Mapping[str, Upgrade]) -> Barrier:
    """May step ``k`` of ``up`` start? ``others``: every upgrade of the commit, fleet-wide
    (``fleet_upgrades_of``), for the services ``up.after`` names."""
    def passed(node: str, service: str, step: str, statuses: tuple[StepStatus, ...] = PASSED) -> bool:
        return progress.get(node, {}).get((service, step)) in statuses

    if k == 0:
        waiting: list[str] = []
        for name in up.after:
            other = others.get(name)
            if other is None:
                continue  # not upgraded by this commit: nothing to wait for
            for node in other.participants:
                if not all(passed(node, name, s.name) for s in other.steps) and node not in waiting:
                    waiting.append(node)
        return Barrier(f"{up.service}/{up.steps[0].name} (after {', '.join(up.after)})", tuple(waiting))
    prev = up.steps[k - 1]
    what = f"{up.service}/{up.steps[k].name} (after {prev.name})"
    if prev.scope is Scope.ONCE:
        once = up.once_node
        return Barrier(what, () if passed(once, up.service, prev.name, (StepStatus.DONE,)) else (once,))
    return Barrier(what, tuple(n for n in up.participants if not passed(n, up.service, prev.name)))


def post_steps_due(repo: DeploymentRepo, node: str, fleet_upgrades: Iterable[str], applied: Callable[[str], bool],
                   members: Callable[[str], Iterable[str]], held: Mapping[str, tuple[str, ...]] | None = None,
                   ) -> tuple[tuple[PostStep, tuple[str, ...]], ...]:
    """The post steps this node runs for the commit, each with the nodes it still waits for
    (those that run one of its ``after`` services and have not noted the commit applied).
    ``held`` (``holding``): a post step none of whose services a node outside the stage still
    keeps at an older version; otherwise it waits for the commit of a later stage."""
    upgrading = set(fleet_upgrades)
    out = []
    for post in repo.post_upgrade:
        if not upgrading & set(post.after) or any((held or {}).get(s) for s in post.after):
            continue
        runs = sorted({n for s in post.after for n in participants(repo, s, ())})
        if node not in post_targets(repo, post, members):
            continue
        out.append((post, tuple(n for n in runs if not applied(n))))
    return tuple(out)


def post_earned(post: PostStep, upgrades: Mapping[str, Upgrade], progress: Progress,
                fresh: Mapping[str, Iterable[str]]) -> str:
    """Why ``post`` does not run for the commit ('' when it does). A commit "upgrades" a service
    whenever its version differs from the parent's, a revert of an upgrade that failed too; a
    post step (an unpin, a reboot) is owed only where some node ran a step of one of its
    ``after`` services' upgrades (``progress``: what each participant noted) or started its new
    version fresh (``fresh``: node -> such services). Every node skipping every step (each runs
    that version already) earns none. Read once every participant noted the commit applied."""
    ups = [upgrades[s] for s in post.after if s in upgrades]
    for up in ups:
        for node in up.participants:
            noted = progress.get(node, {})
            if up.service in fresh.get(node, ()) or any(
                    svc == up.service and status != StepStatus.SKIPPED for (svc, _), status in noted.items()):
                return ""
    names = " or ".join(up.service for up in ups)
    return f"no node ran the steps of {names} at this commit (each runs {_versions(ups)} already)"


def _versions(ups: Sequence[Upgrade]) -> str:
    return ", ".join(f"{up.service} {up.to_version or 'nothing'}" for up in ups)


def describe_post(repo: DeploymentRepo, node: str, upgrades: Mapping[str, Upgrade],
                  members: Callable[[str], Iterable[str]], held: Mapping[str, tuple[str, ...]] | None = None,
                  ) -> tuple[str, ...]:
    """The post steps ``node`` runs for the commit, and what they wait for (a reviewer's `diff`):
    a review cannot know what the nodes run, so it says when a post step does not run."""
    lines = []
    for post in repo.post_upgrade:
        ups = [upgrades[s] for s in post.after if s in upgrades]
        if not ups or node not in post_targets(repo, post, members):
            continue
        what = f"post_upgrade {post.name} ({post.action})"
        if any((held or {}).get(s) for s in post.after):
            lines.append(f"{what}: waits for the commit of a later stage (nodes outside this one keep "
                         f"{', '.join(sorted(s for s in post.after if (held or {}).get(s)))})")
            continue
        runs = sorted({n for up in ups for n in up.participants})
        names = "'s or ".join(up.service for up in ups)
        lines.append(f"{what}, after {', '.join(up.service for up in ups)} applied on {_count(runs)}: only if some "
                     f"node runs {names}'s steps (a node that runs {_versions(ups)} already skips them; where "
                     "every node does, as after reverting an upgrade that never landed, it does not run)")
    return tuple(lines)


def _count(nodes: Sequence[str]) -> str:
    return f"all {len(nodes)} nodes" if len(nodes) > 1 else nodes[0] if nodes else "no node"


def post_targets(repo: DeploymentRepo, post: PostStep, members: Callable[[str], Iterable[str]]) -> set[str]:
    """The nodes a post step runs on: its ``node``, its ``group``, or every node that runs one of
    its services."""
    if post.node:
        return {post.node}
    if post.group:
        return set(members(post.group))
    return {n for n in repo.nodes if set(post.targets) & set(repo.services_of(n))}


def reboot_turn(post: PostStep, targets: Iterable[str], order: Sequence[str], node: str) -> tuple[str, ...]:
    """The nodes that reboot before ``node`` for a reboot post step: the targets in wave order
    (then by name), cut into batches of ``post.batch``; every node of an earlier batch."""
    chosen = set(targets)
    ordered = [n for n in order if n in chosen]
    ordered += sorted(chosen - set(ordered))
    if node not in ordered:
        return ()
    mine = ordered.index(node) // post.batch
    return tuple(ordered[: mine * post.batch])


def describe(up: Upgrade, node: str) -> tuple[str, ...]:
    """What ``node`` will do for ``up``, step by step, and the barrier each step waits on (for
    a reviewer's `diff`)."""
    lines = []
    everyone = f"all {len(up.participants)} nodes" if len(up.participants) > 1 else up.participants[0]
    for k, step in enumerate(up.steps):
        what = f"{up.service}: {step.name} ({step.action}"
        if step.scope is Scope.ONCE:
            what += ", once: here" if up.once_node == node else f", once: on {up.once_node}, not here"
        what += ")"
        if k == 0:
            if up.after:
                what += f", after {', '.join(up.after)} upgraded everywhere"
        elif up.steps[k - 1].scope is Scope.ONCE:
            what += f", after {up.steps[k - 1].name} on {up.once_node}"
        else:
            what += f", after {up.steps[k - 1].name} on {everyone}"
        lines.append(what)
    return tuple(lines)
