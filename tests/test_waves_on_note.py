"""Waves start on the note, not on the poll (issue 40): a node waiting for the wave before it
wait-polls cheaply and often (the probe's notes files of the few nodes it waits on, a few
hundred bytes, no git), and polls at once when one of them moved, so its normal interval can
stay long. The files are hints: whatever they say, the notes fetched are judged as always.

Real parts: the deployment's bare repo behind a `git daemon` (stopped to prove a wait-poll
needs no git), `contrib/git-server/post-receive-tips` as its hook, a real nginx serving what it
writes, and a real `reconciler agent` daemon.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
import yaml
from conftest import Deployment, SigningKey, demo_secrets, git, note_key, wait_for
from nginx import Nginx
from test_probe import TIPS, daemon, web  # noqa: F401  (fixtures)
from test_remotes import Daemon, identity_workers
from test_rollout import roll_out_with_two_controllers_side_by_side
from test_shed import Daemon as AgentDaemon

from reconciler.agent import Agent
from reconciler.core.errors import Busy, ReconcilerError
from reconciler.daemon import wake
from reconciler.daemon.loop import _Running
from reconciler.daemon.supervisor import Every, WaitPolls
from reconciler.settings import AgentConfig, RemoteConfig, load_config
from reconciler.source.probe import TIMEOUT, ProbeFailed, TipProbe

FLEET = ("ctl1", "ctl2", "ctl3", "cmp1")


def _fleet(agents: Callable[..., Agent], url: str, web: Nginx) -> dict[str, Agent]:  # noqa: F811
    """The four nodes, each polling every minute (a wait-poll is what brings them on)."""
    return {n: agents(n, url, interval=60.0, remotes=(RemoteConfig(url, "both", probe=web.url(TIPS)),))
            for n in FLEET}


def _waiting_cmp1(deployment: Deployment, fleet: dict[str, Agent]) -> tuple[str, tuple[str, ...]]:
    """Everyone on the rollout's commit; then a change, which cmp1 waits with for ctl2 and ctl3."""
    roll_out_with_two_controllers_side_by_side(deployment)
    for node in FLEET:
        assert fleet[node].reconcile_once().exit_code == 0, node
    head = identity_workers(deployment, 4)
    assert fleet["cmp1"].reconcile_once().waiting == "waiting for ctl2, ctl3"
    return head, fleet["cmp1"].waiting_on()


def test_a_waiting_node_learns_of_the_note_before_at_its_next_wait_poll_and_needs_no_git_until_then(
    deployment: Deployment, agents: Callable[..., Agent], web: Nginx, daemon: Daemon  # noqa: F811
) -> None:
    fleet = _fleet(agents, daemon.url("cloud.git"), web)
    head, watched = _waiting_cmp1(deployment, fleet)
    cmp1 = fleet["cmp1"]
    # The batch before has not begun: one node of it is watched (its sentinel), not the fleet.
    assert watched in (("ctl2",), ("ctl3",)), watched
    daemon.stop()  # a wait-poll that finds nothing moved asks git nothing
    for _ in range(3):
        assert cmp1.notes_moved(watched) == ()
    assert web.requests(f"{TIPS}.notes/{watched[0]}", at_least=4)[-3:] == [200, 200, 200]
    daemon.start()
    for node in ("ctl1", "ctl2", "ctl3"):
        assert fleet[node].reconcile_once().exit_code == 0, node
    assert cmp1.notes_moved(watched) == watched  # the first wait-poll after the note says so
    went = cmp1.reconcile_once()
    assert went.commit == head and went.report is not None and went.report.state == "applied", went.waiting
    assert cmp1.waiting_on() == ()  # nothing to wait for: back to the normal interval


def test_without_a_probe_a_wait_poll_fetches_the_few_refs_it_waits_on(
    deployment: Deployment, agents: Callable[..., Agent]
) -> None:
    fleet = {n: agents(n, deployment.url, interval=60.0) for n in FLEET}
    head, watched = _waiting_cmp1(deployment, fleet)
    cmp1 = fleet["cmp1"]
    assert cmp1.notes_moved(watched) == ()
    for node in ("ctl1", "ctl2", "ctl3"):
        assert fleet[node].reconcile_once().exit_code == 0, node
    assert cmp1.notes_moved(watched) == watched
    assert cmp1.reconcile_once().report is not None and cmp1.ledger.verdict(head) == "applied"


def test_a_forged_notes_tip_or_an_unsigned_note_never_starts_the_wave(
    deployment: Deployment, agents: Callable[..., Agent], web: Nginx, daemon: Daemon  # noqa: F811
) -> None:
    fleet = _fleet(agents, daemon.url("cloud.git"), web)
    head, watched = _waiting_cmp1(deployment, fleet)
    cmp1 = fleet["cmp1"]

    # The web server names a tip no one pushed: a hint to look, once; the fetch finds nothing new.
    (web.root / f"{TIPS}.notes" / watched[0]).write_text(f"{'ab' * 20}\trefs/notes/reconciler/{watched[0]}\n")
    assert cmp1.notes_moved(watched) == watched
    assert cmp1.reconcile_once().waiting == "waiting for ctl2, ctl3"
    # The pass found git without that tip: the probe is doubted, and the wait-polls ask git (at
    # their pace, ``WaitPolls.FETCH_EVERY``), not a pass every wait-poll on the same lie.
    assert cmp1.notes_moved(cmp1.waiting_on(), may_fetch=lambda: False) is None
    assert cmp1.notes_moved(cmp1.waiting_on()) == ()

    # Unsigned "applied" notes pushed for the whole batch before: the hook publishes them, the
    # wait-poll sees them move, and the notes' verification keeps the node waiting.
    for node in ("ctl2", "ctl3"):
        note = json.dumps({"format": 1, "node": node, "commit": head, "state": "applied",
                           "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "services": {}})
        git("-c", "user.name=mallory", "-c", "user.email=m@example.org", "notes", f"--ref=reconciler/{node}",
            "add", "-f", "-m", note, head, cwd=deployment.work)
        git("push", "-q", "--force", str(deployment.bare), f"refs/notes/reconciler/{node}", cwd=deployment.work)
    assert cmp1.notes_moved(cmp1.waiting_on()) != ()
    forged = cmp1.reconcile_once()
    assert forged.waiting == "waiting for ctl2, ctl3", forged
    assert cmp1.ledger.verdict(head) != "applied"


def test_the_daemon_polling_every_minute_applies_a_few_wait_polls_after_the_wave_before_noted(
    deployment: Deployment, agents: Callable[..., Agent], web: Nginx, daemon: Daemon,  # noqa: F811
    merge_key: SigningKey, tmp_path: Path
) -> None:
    url = daemon.url("cloud.git")
    fleet = {n: agents(n, url) for n in FLEET[:3]}  # no probe: the tips file's reads are cmp1's
    state = tmp_path / "nodes" / "cmp1"
    agents("cmp1", url, state_dir=state)  # its services stopped at teardown
    config = tmp_path / "cmp1.yaml"
    config.write_text(yaml.safe_dump({
        "node": "cmp1", "remote": url, "state_dir": str(state), "interval": 60, "jitter": 0, "wait_poll": 0.2,
        "remotes": [{"url": url, "role": "both", "probe": web.url(TIPS)}], "note_key": str(note_key("cmp1")),
        "trust": {"allowed_signers": str(merge_key.allowed_signers)},
        **({"secrets": {"age_identity": str(key)}} if (key := demo_secrets("cmp1").age_identity) else {}),
    }))
    roll_out_with_two_controllers_side_by_side(deployment)
    for node in FLEET[:3]:
        assert fleet[node].reconcile_once().exit_code == 0, node
    agent = AgentDaemon(config, tmp_path / "daemon.log")
    try:
        rollout = git("rev-parse", "HEAD", cwd=deployment.work)
        wait_for(lambda: (deployment.note("cmp1", rollout) or {}).get("state") == "applied", 30, "the first pass")
        head = identity_workers(deployment, 4)
        wake.poll_now(state)  # as a push hook's webhook would: the head is seen now, not in a minute
        wait_for(lambda: bool(agent.lines("waiting for ctl2, ctl3")), 30, "cmp1 to wait for the batch before")
        for node in FLEET[:3]:
            assert fleet[node].reconcile_once().exit_code == 0, node
        noted = sum(len(web.requests(f"{TIPS}.notes/{n}")) for n in ("ctl2", "ctl3"))
        wait_for(lambda: (deployment.note("cmp1", head) or {}).get("state") == "applied", 45, "cmp1 to apply")
        # The passes since the daemon's first (the probe's tips file is read by every pass but
        # a daemon's first): the one that waited, at most one more on ctl2's note (when ctl2 is
        # its sentinel, it then waits for ctl3), the one that applied; between them only
        # wait-polls, and the apply came within a few of them after the last note.
        assert 2 <= len(web.requests(TIPS)) <= 3, agent.log.read_text()
        assert sum(len(web.requests(f"{TIPS}.notes/{n}")) for n in ("ctl2", "ctl3")) - noted <= 4
        assert agent.lines("moved: polling now"), agent.log.read_text()
    finally:
        assert agent.stop() == 0


def test_wait_poll_is_a_setting_zero_turns_it_off(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text("node: n1\nremote: /srv/cloud.git\n")
    assert load_config(config, {}).wait_poll == 1.0
    config.write_text("node: n1\nremote: /srv/cloud.git\nwait_poll: 0\n")
    assert load_config(config, {}).wait_poll == 0.0


def test_a_probe_that_flaps_between_two_tips_starts_one_pass_then_is_doubted(
    deployment: Deployment, agents: Callable[..., Agent], web: Nginx, daemon: Daemon  # noqa: F811
) -> None:
    """A broken hook (or a hostile web server) names another tip on each read: the pass it
    started found git's tip another, so the probe is doubted, and its flapping starts no pass
    more, until it names what git has."""
    fleet = _fleet(agents, daemon.url("cloud.git"), web)
    head, watched = _waiting_cmp1(deployment, fleet)
    cmp1, notes = fleet["cmp1"], web.root / f"{TIPS}.notes" / watched[0]
    real = notes.read_text()
    passes = 0
    for tip in ["aa", "bb"] * 3:
        notes.write_text(f"{tip * 20}\trefs/notes/reconciler/{watched[0]}\n")
        if cmp1.notes_moved(watched):
            passes += 1
            assert cmp1.reconcile_once().waiting == "waiting for ctl2, ctl3"
    assert passes == 1
    notes.write_text(real)  # it names git's tip again: believed, and no fetch needed to say so
    assert cmp1.notes_moved(watched, may_fetch=lambda: False) == ()


def test_a_probe_that_never_answers_costs_a_short_timeout_once_then_backs_off() -> None:
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(8)  # the kernel accepts; no one ever answers
    now = [0.0]
    probe = TipProbe(f"http://127.0.0.1:{listening.getsockname()[1]}/tips/cloud", 300.0, clock=lambda: now[0])
    try:
        began = time.monotonic()
        with pytest.raises(ProbeFailed):
            probe.notes_tip("ctl2")
        assert time.monotonic() - began < TIMEOUT / 2  # not the branch tips' whole timeout
        began = time.monotonic()
        with pytest.raises(ProbeFailed, match="asked again"):
            probe.notes_tip("ctl2")  # no connection at all while it backs off
        assert time.monotonic() - began < 0.5
        now[0] += 3600
        listening.close()
        with pytest.raises(ProbeFailed, match="refused"):  # the back-off over: asked again
            probe.notes_tip("ctl2")
    finally:
        listening.close()


class _Waiting:
    """The parts of an agent a wait-poll uses, as a node waiting on ctl2 has them; its probe's
    read blocks until ``answer`` is set (a probe that is slow to answer)."""

    def __init__(self) -> None:
        self.cfg = AgentConfig(node="cmp1", remote="/srv/cloud.git", interval=60.0)
        self.answer, self.reading = threading.Event(), threading.Event()
        self.passes: list[bool] = []

    def waiting_on(self) -> tuple[str, ...]:
        return ("ctl2",)

    def notes_tips(self, nodes: tuple[str, ...]) -> dict[str, str | None]:
        self.reading.set()
        self.answer.wait(10)
        return dict.fromkeys(nodes, "ab" * 20)

    def notes_moved(self, nodes: tuple[str, ...], tips: object = None, may_fetch: object = None) -> tuple[str, ...]:
        return tuple(nodes)


def test_a_wait_poll_holds_no_pass_lock_while_its_probe_is_slow_to_answer() -> None:
    stop, polling, agent = threading.Event(), threading.Lock(), _Waiting()
    polls = Every("poll", 60.0, lambda: None, stop, first=3600.0)
    waits = WaitPolls(cast(Agent, agent), polls, polling, stop, 1.0)
    waits.watch = ("ctl2",)
    tick = threading.Thread(target=waits.tick)
    tick.start()
    try:
        assert agent.reading.wait(5)
        assert polling.acquire(blocking=False), "the wait-poll holds the pass lock on the network"
        polling.release()
    finally:
        agent.answer.set()
        tick.join()
    assert polls.next_due() - time.monotonic() < 1  # and what it read still starts the pass


def test_a_pass_due_while_a_wait_poll_holds_the_lock_does_not_start_after_a_stop() -> None:
    stop, polling, passes = threading.Event(), threading.Lock(), []
    agent = SimpleNamespace(reconcile_once=lambda: passes.append(1))
    running = SimpleNamespace(polling=polling, agent=agent, stopping=stop)
    polling.acquire()  # a wait-poll's fetch in flight
    poll = threading.Thread(target=_Running.poll, args=(running,))
    poll.start()
    stop.set()  # SIGTERM meanwhile
    time.sleep(0.1)
    polling.release()
    poll.join()
    assert passes == []


def test_a_failed_pass_ends_the_wait_polls_so_its_back_off_holds() -> None:
    stop, polling, agent = threading.Event(), threading.Lock(), _Waiting()
    agent.answer.set()
    polls = Every("poll", 60.0, lambda: None, stop, first=3600.0)
    waits = WaitPolls(cast(Agent, agent), polls, polling, stop, 1.0)
    waits.after("waiting for ctl2, ctl3")
    assert waits.watch == ("ctl2",)
    failed = ReconcilerError("the remote is away")
    failed.temporary = True

    def once() -> None:
        raise failed

    running = SimpleNamespace(polling=polling, agent=SimpleNamespace(reconcile_once=once, say_once=lambda *a: None),
                              stopping=stop, failures=0, waits=waits, polls=polls, cfg=agent.cfg,
                              shedding=SimpleNamespace(after=lambda r: False), outputs=lambda *a: None)
    _Running.poll(cast(_Running, running))
    assert polls.next_due() - time.monotonic() > 100  # backing off
    waits.tick()  # a note of ctl2 meanwhile: the back-off holds all the same
    assert polls.next_due() - time.monotonic() > 100
    stop.set()
    waits.wake()


def test_without_a_probe_wait_polls_fetch_gently_and_a_busy_pass_loses_no_note(
    deployment: Deployment, agents: Callable[..., Agent]
) -> None:
    """No probe: each wait-poll that looks is a git fetch, so it looks every ``FETCH_EVERY``
    seconds, not every ``wait_poll``. A note seen counts once a pass ran after it: the pass it
    started found the node's lock held (an operator's `reconciler apply`), and the next wait-poll
    says it again."""
    fleet = {n: agents(n, deployment.url, interval=60.0) for n in FLEET}
    head, watched = _waiting_cmp1(deployment, fleet)
    cmp1, stop, now = fleet["cmp1"], threading.Event(), [1000.0]
    polls = Every("poll", 60.0, lambda: None, stop, first=3600.0)
    waits = WaitPolls(cmp1, polls, threading.Lock(), stop, 1.0, clock=lambda: now[0])
    waits.watch = watched
    waits.tick()  # a fetch: nothing moved
    for node in ("ctl1", "ctl2", "ctl3"):
        assert fleet[node].reconcile_once().exit_code == 0, node
    now[0] += 1.0
    waits.tick()  # the next wait-poll asks git nothing
    assert polls.next_due() - time.monotonic() > 100
    now[0] += WaitPolls.FETCH_EVERY
    waits.tick()
    assert polls.next_due() - time.monotonic() < 1
    polls.later(3600.0)
    with cmp1.state.lock(), pytest.raises(Busy):
        cmp1.reconcile_once()
    waits.busy()
    now[0] += WaitPolls.FETCH_EVERY
    waits.tick()
    assert polls.next_due() - time.monotonic() < 1  # said again: the pass it started did not run
    assert cmp1.reconcile_once().report is not None and cmp1.ledger.verdict(head) == "applied"
