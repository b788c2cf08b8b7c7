"""Notes count only when signed by their node's key in the repo's ``trust/nodes``.

A wave goes once the wave before noted the commit applied: the canary here (ctl1), then ctl2.
Whoever carries the notes (a read mirror, a bundle courier, the git server) holds no node's key,
so what they add to a node's notes ref is no note: the next wave keeps waiting. A node whose key
the repo does not list speaks for nobody, however well formed its note; a verified commit that
lists its new key lets it speak again.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from conftest import NODES, Deployment, git, nodes_file, note_key

from reconciler.agent import Agent
from reconciler.fleet.notes import CLAIM_OBJECT, Claim
from reconciler.node.operations import suspend
from reconciler.settings import RemoteConfig
from reconciler.trust.notesig import NoteKey

WAVES = """\
rollout:
  waves:
    - {name: canary, nodes: [ctl1]}
    - {name: second, nodes: [ctl2]}
"""


def roll_out_in_waves(deployment: Deployment) -> str:
    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml") + WAVES)
    return deployment.commit("canary ctl1, then ctl2")


def applied_note(node: str, commit: str) -> str:
    """A note a node would write had it applied ``commit``: well formed, unsigned."""
    return json.dumps({"format": 1, "node": node, "commit": commit, "state": "applied",
                       "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "services": {}}, indent=2)


def add_note(git_dir: Path, node: str, commit: str, text: str) -> None:
    git("--git-dir", str(git_dir), "-c", "user.name=mallory", "-c", "user.email=m@example.org",
        "notes", f"--ref=reconciler/{node}", "add", "-f", "-m", text, commit)


def status_fleet(deployment: Deployment, tmp_path: Path, remote: str) -> subprocess.CompletedProcess[str]:
    clone = tmp_path / "operator"
    if not clone.exists():
        git("clone", "-q", deployment.url, str(clone))
    return subprocess.run([sys.executable, "-m", "reconciler", "status", "--fleet", "--repo", str(clone), "--remote", remote],
                          capture_output=True, text=True, timeout=120)


def test_a_read_mirror_cannot_release_the_next_wave_with_a_note_it_forged(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path
) -> None:
    ctl1 = agents("ctl1", deployment.url)
    earlier = git("rev-parse", "HEAD", cwd=deployment.work)
    assert ctl1.reconcile_once().exit_code == 0  # the canary's real, signed note on the commit before
    commit = roll_out_in_waves(deployment)
    mirror = tmp_path / "mirror.git"
    git("clone", "-q", "--mirror", str(deployment.bare), str(mirror))
    ctl2 = agents("ctl2", deployment.url,
                  remotes=(RemoteConfig(f"file://{mirror}", "read"), RemoteConfig(deployment.url, "write")))
    first = ctl2.reconcile_once()
    assert first.waiting and "ctl1" in first.waiting, first

    # the mirror's operator writes the canary's "applied" note, as the canary would
    add_note(mirror, "ctl1", commit, applied_note("ctl1", commit))
    forged = ctl2.reconcile_once()
    assert forged.waiting and "ctl1" in forged.waiting, forged
    assert forged.report is None or forged.report.state == "waiting", forged.report

    # nor does a note the canary really signed, for another commit, copied onto this one
    signed = git("--git-dir", str(deployment.bare), "notes", "--ref=reconciler/ctl1", "show", earlier)
    assert '"sig"' in signed
    add_note(mirror, "ctl1", commit, signed.replace(earlier, commit))
    copied = ctl2.reconcile_once()
    assert copied.waiting and "ctl1" in copied.waiting, copied

    # status --fleet, read from the mirror, names the culprit: the note does not count
    status = status_fleet(deployment, tmp_path, f"file://{mirror}")
    assert status.returncode in (0, 1) and "Traceback" not in status.stderr, status.stderr
    assert "unverified" in status.stdout and "ctl1" in status.stdout, status.stdout

    # the real canary applies: the wave goes
    assert ctl1.reconcile_once().exit_code == 0
    subprocess.run(["git", "--git-dir", str(mirror), "fetch", "-q", deployment.url,
                    "+refs/heads/*:refs/heads/*", "+refs/notes/*:refs/notes/*"], check=True)
    assert ctl2.reconcile_once().exit_code == 0 and ctl2.ledger.verdict(commit) == "applied"


def test_a_bundle_courier_cannot_release_the_next_wave_with_a_note_it_forged(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path
) -> None:
    commit = roll_out_in_waves(deployment)
    courier = tmp_path / "courier"
    git("clone", "-q", deployment.url, str(courier))
    add_note(courier / ".git", "ctl1", commit, applied_note("ctl1", commit))
    git("branch", "-q", "other", cwd=courier)
    usb = tmp_path / "usb" / "cloud.bundle"
    usb.parent.mkdir()
    git("bundle", "create", "-q", str(usb), "main", "other", "refs/notes/reconciler/ctl1", cwd=courier)

    site = agents("ctl2", f"file://{tmp_path / 'hq-away.git'}",
                  remotes=(RemoteConfig(str(usb), "read"), RemoteConfig(f"file://{tmp_path / 'hq-away.git'}", "write")))
    result = site.reconcile_once()
    assert result.waiting and "ctl1" in result.waiting, result
    assert site.ledger.verdict(commit) != "applied"


def test_a_node_whose_key_the_repo_does_not_list_cannot_release_a_wave_until_a_commit_lists_it(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path
) -> None:
    commit = roll_out_in_waves(deployment)
    # ctl1 signs with a key of its own that trust/nodes does not name (a new machine, say)
    new_key = tmp_path / "ctl1-new-key"
    NoteKey.load_or_create(new_key)
    ctl1 = agents("ctl1", deployment.url, note_key=new_key)
    ctl2 = agents("ctl2", deployment.url)
    assert ctl1.reconcile_once().exit_code == 0
    note = deployment.note("ctl1", commit)
    assert note is not None and note["state"] == "applied" and "sig" in note
    held = ctl2.reconcile_once()
    assert held.waiting and "ctl1" in held.waiting, held

    status = status_fleet(deployment, tmp_path, deployment.url)
    assert "unverified" in status.stdout, status.stdout

    # the operator lists the new key (a verified commit): ctl1's notes count from that commit on
    deployment.write("trust/nodes", nodes_file(*(n for n in NODES if n != "ctl1"))
                     + f"ctl1 {NoteKey.load(new_key).public_line}\n")
    rotated = deployment.commit("trust/nodes: ctl1's new notes key")
    assert ctl1.reconcile_once().exit_code == 0
    go = ctl2.reconcile_once()
    assert go.exit_code == 0 and not go.waiting and go.commit == rotated, go
    assert ctl2.ledger.verdict(rotated) == "applied"

    # and the old key, now retired, speaks for ctl1 no more
    later = deployment.commit("an empty change")
    old = NoteKey.load(note_key("ctl1"))
    body = json.loads(applied_note("ctl1", later))
    add_note(deployment.bare, "ctl1", later, json.dumps(old.seal("ctl1", later, body), indent=2))
    held = ctl2.reconcile_once()
    assert held.waiting and "ctl1" in held.waiting, held


def test_a_claim_a_server_wrote_in_a_nodes_own_ref_holds_no_slot_for_it(
    deployment: Deployment, agents: Callable[..., Agent]
) -> None:
    # the server puts a queued claim with the lowest ticket in ctl2's ref before ctl2 ever ran
    # (or after it lost its state dir): ctl2 takes its ref back from there on its first pass
    claim = Claim("ctl2", "queued", 1, time.time(), "restart db")
    add_note(deployment.bare, "ctl2", CLAIM_OBJECT, json.dumps(claim.to_dict(), indent=2))
    ctl2 = agents("ctl2", deployment.url)
    assert ctl2.reconcile_once().exit_code == 0
    assert ctl2.reporter.read(CLAIM_OBJECT) is not None  # it is in ctl2's ref now
    assert ctl2.reporter.claim() is None  # but holds no slot: ctl2 did not sign it

    mine = Claim("ctl2", "queued", 7, time.time(), "restart db")
    ctl2.reporter.write_claim(mine)
    assert ctl2.reporter.claim() == mine


def test_a_held_node_signs_and_pushes_its_note_once_not_on_every_poll(
    deployment: Deployment, agents: Callable[..., Agent]
) -> None:
    ctl1 = agents("ctl1", deployment.url)
    assert ctl1.reconcile_once().exit_code == 0
    suspend(ctl1.ctx, "disk swap", "op")
    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    deployment.commit("a change the suspended node holds back")
    assert ctl1.reconcile_once().suspended
    tip = git("--git-dir", str(deployment.bare), "rev-parse", "refs/notes/reconciler/ctl1")
    for _ in range(3):
        assert ctl1.reconcile_once().suspended
    # the same record: no new notes commit, no new signature, nothing pushed
    assert git("--git-dir", str(deployment.bare), "rev-parse", "refs/notes/reconciler/ctl1") == tip


def test_status_fleet_checks_notes_against_the_clones_own_head_not_the_one_a_mirror_serves(
    deployment: Deployment, tmp_path: Path
) -> None:
    commit = roll_out_in_waves(deployment)
    status_fleet(deployment, tmp_path, deployment.url)  # the operator's clone, at the reviewed head
    # a keyless mirror serves a commit of its own on main that lists its key for ctl1, and signs
    # ctl1's "applied" with it
    mirror = tmp_path / "mirror"
    git("clone", "-q", deployment.url, str(mirror))
    forger = tmp_path / "forger"
    NoteKey.load_or_create(forger)
    (mirror / "trust" / "nodes").write_text(f"ctl1 {NoteKey.load(forger).public_line}\n")
    git("-c", "user.name=m", "-c", "user.email=m@example.org", "commit", "-q", "-am", "keys of my own", cwd=mirror)
    head = git("rev-parse", "HEAD", cwd=mirror)
    for target in (commit, head):
        add_note(mirror / ".git", "ctl1", target,
                 json.dumps(NoteKey.load(forger).seal("ctl1", target, json.loads(applied_note("ctl1", target)))))
    status = status_fleet(deployment, tmp_path, str(mirror))
    assert "Traceback" not in status.stderr, status.stderr
    assert "unverified" in status.stdout and "applied" not in status.stdout.split("┘")[-1], status.stdout
