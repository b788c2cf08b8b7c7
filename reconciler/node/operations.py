"""An operator's hands on one node: rollback, unpin, retry, suspend, resume, prepull. Small
operations over the ledger (prepull: over the engine only).

None of them changes a commit's verdict: a rollback of a service on a node whose head failed
leaves that commit failed (the fleet gate still halts on it); it adds an event and a pin to the
head's note. Only a run of the commit itself that applies it healthy can make it applied.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pygit2

from reconciler.core.errors import BadInput
from reconciler.core.model import Verdict
from reconciler.drivers.observe import observe
from reconciler.ledger.ledger import Pin, Version
from reconciler.node.apply import Pulled, pull_images
from reconciler.node.steps import Run, RunResult, converge, write_note
from reconciler.trust.verify import is_descendant

if TYPE_CHECKING:
    from reconciler.agent import Agent


def rollback(agent: Agent, service: str, to: str | None, by: str) -> RunResult:
    """Put one service back to an earlier commit's version, here and now, without the remote,
    and pin it there (the note says so) until the branch moves on or `unpin`."""
    with agent.state.lock(wait=30):
        head = agent.ledger.mark().commit
        if head is None:
            raise BadInput("this node has applied nothing yet: nothing to roll back")
        if to is None:
            to = previous_good(agent, service).commit
        target_rev = agent.keeper.vouch(agent.revision(to))
        target = target_rev.commit
        old = agent.desired(target_rev).by_name()
        if service not in old:
            raise BadInput(f"service {service} is not on node {agent.cfg.node} at {target[:12]}")
        previous = next((p for p in agent.ledger.pins() if p.service == service), None)
        agent.ledger.pin(Pin(service, target, old[service].hash, head, by, time.time()))
        what = f"rollback of {service} to {target[:12]} by {by}"
        result = converge(agent, Run(head, False, ()), agent.keeper.vouch(agent.revision(head)), only={service},
                          instantiate=True, operation=what)
        if result.error is not None:
            # It runs what it ran before (the driver put it back): the pin would lie.
            if previous is not None:
                agent.ledger.pin(previous)
            else:
                agent.ledger.unpin(service)
            write_note(agent, head)
        return result


def prepull(agent: Agent, *, fetch: bool, rev: str | None) -> tuple[str, list[Pulled]]:
    """Pull the images the verified head (or ``rev``) runs on this node, ahead of its wave. No
    container, record, verdict or note changes. The pass lock is held only to read the commit:
    a long pull never holds back the agent's own passes."""
    with agent.state.lock(wait=30):
        desired, _ = agent.verified_desired(fetch=fetch, rev=rev)
    return desired.commit, pull_images(desired, agent.drivers(desired))


def previous_good(agent: Agent, service: str) -> Version:
    """The newest version that ran healthy here and is older than the running one: rendered
    from an ancestor of the running version's commit, with other content. Going back twice goes
    back two versions, never forward to the version that was just rolled back from."""
    running = observe(agent.cfg.node, agent.drivers(None)).by_name().get(service)
    if running is None:
        raise BadInput(f"service {service} does not run on node {agent.cfg.node}")
    repo = agent.source.repo
    for version in agent.ledger.good_versions(service):
        if version.hash == running.hash:
            continue
        if running.commit and version.commit != running.commit:
            try:
                older = is_descendant(repo, running.commit, version.commit)
            except (KeyError, ValueError, pygit2.GitError):
                older = False
            if not older:
                continue
        return version
    raise BadInput(f"service {service}: no earlier good version in this node's history")


def unpin(agent: Agent, service: str, by: str) -> bool:
    """Release a rollback's pin; the next run brings the service to the head's version (when
    the head did not fail here: a failed head waits for `retry` or a new commit)."""
    with agent.state.lock(wait=30):
        pin = agent.ledger.unpin(service)
        if pin is None:
            return False
        if agent.ledger.record(pin.head) is not None:
            agent.ledger.add_event(pin.head, f"pin of {service} at {pin.commit[:12]} released by {by}")
            write_note(agent, pin.head)
        agent.reporter.push()
        return True


def retry(agent: Agent) -> str | None:
    """The head failed (or was halted) here: let the next run try it again. Returns it, or None."""
    with agent.state.lock(wait=30):
        head = agent.ledger.mark().commit
        if head is None:
            return None
        rec = agent.ledger.record(head)
        if rec is None or rec.verdict not in (Verdict.FAILED, Verdict.HALTED):
            return None
        return head if agent.ledger.retry(head) else None


def invoker() -> str:
    """Who runs the command: the person behind sudo, else the login name (a service user, a
    container without a login: its uid's name, or the uid itself)."""
    import getpass
    import os

    who = os.environ.get("SUDO_USER")
    if who:
        return who
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return str(os.getuid())


def suspend(agent: Agent, reason: str, by: str) -> bool:
    """Passes apply nothing from now on; True when it was suspended already (the reason changes).
    The ledger alone, no lock: a pass under way finishes as it began, the next one holds."""
    from reconciler.node.steps import now_iso

    return agent.ledger.suspend(reason, by, now_iso())


def resume(agent: Agent) -> dict[str, str] | None:
    """The operator's suspension lifted (the next pass converges); None when there was none."""
    return agent.ledger.resume()
