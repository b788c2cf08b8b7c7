"""The node's mirror: remote failures say git's real cause, and a damaged mirror heals itself.

Real remotes only: a transport git does not have, a path that is no repository, a git:// and
an http:// port nothing listens on, a real bare repo behind ``file://``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Deployment, free_port

from reconciler.errors import RemoteError
from reconciler.source import Source


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
