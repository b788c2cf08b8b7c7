"""The node's mirror: remote failures say git's real cause, and a damaged mirror heals itself.

Real remotes only: a transport git does not have, a path that is no repository, a git:// and
an http:// port nothing listens on, a real bare repo behind ``file://``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Deployment, free_port, git
from test_faults import FakeClock

from reconciler.agent import Agent
from reconciler.core.errors import RemoteError
from reconciler.source import gitrun as source_module
from reconciler.source.mirror import RECHECK_EVERY, Source


def ref_check_error(url: str, tmp_path: Path, *, progress: bool = False) -> str:
    source = Source(url, "main", tmp_path / "mirror.git", progress=progress)
    with pytest.raises(RemoteError) as info:
        source.remote_head()
    message = str(info.value)
    assert "\n" not in message, message
    return message


def test_an_unknown_transport_names_the_helper_git_lacks(tmp_path: Path) -> None:
    message = ref_check_error("foo://x/y.git", tmp_path)

    assert message.startswith("ref check of foo://x/y.git failed: ")
    assert "'remote-foo' is not a git command" in message


def test_a_path_that_is_no_repository_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "cloud.git"

    message = ref_check_error(f"file://{missing}", tmp_path)

    assert f"'{missing}' does not appear to be a git repository" in message
    assert "Could not read from remote repository" in message


def test_a_git_daemon_port_nothing_listens_on_gives_the_socket_error(tmp_path: Path) -> None:
    url = f"git://127.0.0.1:{free_port()}/cloud.git"

    message = ref_check_error(url, tmp_path)

    assert "unable to connect to 127.0.0.1" in message
    assert "Connection refused" in message  # on git's continuation line, after the colon
    # A fetch that shows progress on a terminal: git prints "Connecting to ... fatal: ..."
    with pytest.raises(RemoteError, match="unable to connect to 127.0.0.1: .*Connection refused"):
        Source(url, "main", tmp_path / "shown.git", progress=True).fetch()


def test_an_http_password_never_reaches_the_message(tmp_path: Path) -> None:
    port = free_port()

    message = ref_check_error(f"http://deploy:s3cret-pw@127.0.0.1:{port}/cloud.git", tmp_path)

    assert "s3cret-pw" not in message and "deploy" not in message
    assert message.startswith(f"ref check of http://127.0.0.1:{port}/cloud.git failed: ")
    assert "Failed to connect to 127.0.0.1" in message


def test_credentials_git_itself_echoes_are_stripped_too(tmp_path: Path) -> None:
    # git:// has no user part: git takes "deploy:s3cret-pw@127.0.0.1" for the host name and
    # prints it back, with no scheme in front, in its own error line.
    message = ref_check_error(f"git://deploy:s3cret-pw@127.0.0.1:{free_port()}/cloud.git", tmp_path)

    assert "unable to look up" in message
    assert "s3cret-pw" not in message


@pytest.mark.parametrize("progress", [False, True], ids=["quiet", "progress"])
def test_a_fetch_of_a_branch_the_remote_lacks_keeps_gits_words(deployment: Deployment, tmp_path: Path,
                                                                progress: bool) -> None:
    source = Source(deployment.url, "no-such-branch", tmp_path / "mirror.git", progress=progress)

    with pytest.raises(RemoteError) as info:
        source.fetch()

    assert "couldn't find remote ref refs/heads/no-such-branch" in str(info.value)
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------ a damaged mirror
# History in these tests:  C1 (applied) --- C2 (pushed after the node's mirror was damaged)


def mirror_object(agent: Agent, oid: str) -> Path:
    return agent.source.path / "objects" / oid[:2] / oid[2:]


def flip_bytes(path: Path, start: int, count: int = 8) -> None:
    """Damage bytes inside a zlib stream, as a bad disk block or a torn write would."""
    data = bytearray(path.read_bytes())
    for i in range(start, start + count):
        data[i] ^= 0xFF
    path.chmod(0o644)  # git writes objects and packs read-only
    path.write_bytes(bytes(data))


def damage_loose(agent: Agent, oid: str) -> None:
    path = mirror_object(agent, oid)
    flip_bytes(path, len(path.read_bytes()) // 2)


def damage_packed(agent: Agent, oid: str) -> None:
    """Pack the mirror, then damage the middle of ``oid``'s compressed data in the pack."""
    mirror = agent.source.path
    git("-C", str(mirror), "repack", "-adq")
    [idx] = (mirror / "objects" / "pack").glob("*.idx")
    for line in git("verify-pack", "-v", str(idx)).splitlines():
        fields = line.split()
        if fields and fields[0] == oid:
            size_in_pack, offset = int(fields[3]), int(fields[4])
            break
    else:
        raise AssertionError(f"{oid} is not in {idx}")
    flip_bytes(idx.with_suffix(".pack"), offset + size_in_pack // 2, 4)


def test_a_damaged_object_in_the_mirror_is_healed_by_a_fresh_clone(
    deployment: Deployment, agents: Callable[..., Agent], caplog: pytest.LogCaptureFixture,
    damage: Callable[[Agent, str], None],
) -> None:
    node = agents("cmp1", deployment.url)
    c1 = node.reconcile_once().commit
    # reconciler.yaml is read on every commit: the next run cannot avoid the damaged blob.
    damage(node, git("rev-parse", f"{c1}:reconciler.yaml", cwd=deployment.work))
    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    c2 = deployment.commit("kvm")

    with caplog.at_level(logging.WARNING):
        result = node.reconcile_once()

    assert result.exit_code == 0 and result.commit == c2
    assert result.report is not None and result.report.state == "applied"
    assert "re-cloned" in caplog.text and "kept notes refs/notes/reconciler/cmp1" in caplog.text
    # The notes the node wrote before stay in its mirror; nothing of the broken copy is left.
    assert (node.reporter.read(c1) or {}).get("state") == "applied"
    git("-C", str(node.source.path), "fsck", "--no-dangling")
    assert sorted(p.name for p in node.source.path.parent.glob("mirror.git*")) == ["mirror.git"]


@pytest.fixture(params=["loose", "packed"])
def damage(request: pytest.FixtureRequest) -> Callable[[Agent, str], None]:
    return damage_loose if request.param == "loose" else damage_packed


def test_a_damaged_head_commit_is_healed_on_the_next_poll(
    deployment: Deployment, agents: Callable[..., Agent], caplog: pytest.LogCaptureFixture,
) -> None:
    node = agents("cmp1", deployment.url)
    c1 = node.reconcile_once().commit
    damage_loose(node, c1)  # git cannot even negotiate a fetch from this mirror now
    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    c2 = deployment.commit("kvm")

    with caplog.at_level(logging.WARNING):
        result = node.reconcile_once()

    assert result.exit_code == 0 and result.commit == c2
    assert result.report is not None and result.report.state == "applied"
    assert "re-cloned" in caplog.text
    assert (node.reporter.read(c1) or {}).get("state") == "applied"

    # The same damage with nothing new on the remote: the poll itself finds it and heals.
    caplog.clear()
    damage_loose(node, c2)
    with caplog.at_level(logging.WARNING):
        again = node.reconcile_once()
    assert again.exit_code == 0 and again.report is None
    assert "re-cloned" in caplog.text
    git("-C", str(node.source.path), "fsck", "--no-dangling")


def test_an_idle_poll_reads_the_head_by_git_only_when_its_files_changed_or_five_minutes_passed(
    deployment: Deployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    mirror = tmp_path / "mirror.git"
    source = Source(deployment.url, "main", mirror, progress=False, clock=clock)
    head, fetched = source.update()
    assert fetched
    reads: list[str] = []
    real = source_module.git_result

    def spy(cwd: Path, *args: str) -> object:
        if "cat-file" in args:
            reads.append(args[-1])
        return real(cwd, *args)

    monkeypatch.setattr(source_module, "git_result", spy)
    for _ in range(3):
        assert source.update() == (head, False)
    assert reads == [f"{head}^{{tree}}"]  # the first idle poll asked git; the next two looked at its files

    clock.now += RECHECK_EVERY  # a disk's bit rot keeps a file's stat: git reads it again all the same
    for _ in range(2):
        assert source.update() == (head, False)
    assert len(reads) == 2

    # The head commit damaged in place (its file written): the next poll reads it, and heals.
    loose = mirror / "objects" / head[:2] / head[2:]
    assert loose.exists()  # a small fetch leaves its objects loose
    flip_bytes(loose, len(loose.read_bytes()) // 2)
    with caplog.at_level(logging.WARNING):
        assert source.update() == (head, True)
    assert len(reads) == 3 and "re-cloned" in caplog.text
    assert source.update() == (head, False)  # a new mirror: read once
    assert len(reads) == 4

    # The objects moved into a pack (git gc): read again, then quiet.
    git("-C", str(mirror), "repack", "-adq")
    for _ in range(2):
        assert source.update() == (head, False)
    assert len(reads) == 5


def test_notes_that_do_not_read_back_come_again_from_the_remote(
    deployment: Deployment, agents: Callable[..., Agent], caplog: pytest.LogCaptureFixture,
) -> None:
    node = agents("cmp1", deployment.url)
    c1 = node.reconcile_once().commit
    note_blob = git("-C", str(node.source.path), "notes", "--ref=reconciler/cmp1", "list", c1)
    damage_loose(node, note_blob)
    damage_loose(node, git("rev-parse", f"{c1}:reconciler.yaml", cwd=deployment.work))
    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    c2 = deployment.commit("kvm")

    with caplog.at_level(logging.WARNING):
        assert node.reconcile_once().exit_code == 0

    assert "notes refs/notes/reconciler/cmp1 unreadable, fetched again from the remote" in caplog.text
    assert (node.reporter.read(c1) or {}).get("state") == "applied"
    assert (deployment.note("cmp1", c2) or {}).get("state") == "applied"
    assert (deployment.note("cmp1", c1) or {}).get("state") == "applied"


def test_a_mirror_that_cannot_even_be_opened_is_started_again(
    deployment: Deployment, agents: Callable[..., Agent], caplog: pytest.LogCaptureFixture,
) -> None:
    node = agents("cmp1", deployment.url)
    c1 = node.reconcile_once().commit
    node.close()
    (node.source.path / "config").write_text("[[[ half-written\n")

    with caplog.at_level(logging.WARNING):
        again = agents("cmp1", deployment.url)
        result = again.reconcile_once()

    assert "cannot be opened" in caplog.text
    assert result.exit_code == 0 and result.commit == c1 and result.fetched
    assert (again.reporter.read(c1) or {}).get("state") == "applied"  # recovered from the remote


def test_agit_result_that_hangs_or_a_mirror_that_is_gone_is_a_failed_result_not_an_exception(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, deployment: Deployment
) -> None:
    # The metrics read a commit's time with git after a pass; a hung git (a stalled disk) must
    # not end the pass with a traceback. A real git, stopped by a hook that never returns.
    mirror = tmp_path / "mirror.git"
    git("clone", "-q", "--bare", str(deployment.bare), str(mirror))
    head = git("--git-dir", str(mirror), "rev-parse", "HEAD").strip()
    assert source_module.commit_time(mirror, head) is not None
    monkeypatch.setattr(source_module, "GIT_TIMEOUT", 1.0)
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "core.fsmonitor")  # run by git status: a hook that hangs
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", "sleep 30 #")
    hung = source_module.git_result(deployment.work, "status")
    assert hung.returncode != 0 and "did not answer within 1 s" in hung.stderr
    assert source_module.commit_time(tmp_path / "gone.git", head) is None
