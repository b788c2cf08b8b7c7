"""Nothing a test started may outlive the session: at its end (each xdist worker's), every
process whose command line or working directory lies under this session's temporary base (a
service a node agent started, a gpg-agent for a test's keyring, a git daemon) is a leftover. It
is killed, so nothing stays running, and the session fails naming it.

Processes outside the base (the Docker engine, a registry started once for the whole run) are
the fixtures' own to stop (docker_fixtures, registry_fixtures).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def under(base: Path) -> list[tuple[int, str]]:
    """(pid, command line) of every process of this machine started in or about ``base``."""
    me, found = os.getpid(), []
    root = str(base)
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            cmdline = (Path("/proc", entry, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if root in cmdline or cwd == root or cwd.startswith(root + "/"):
            found.append((int(entry), cmdline.strip()[:200]))
    return found


@pytest.fixture(scope="session", autouse=True)
def no_leftovers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    base = tmp_path_factory.getbasetemp()
    yield
    # A test's teardown may have just sent SIGKILL: such a process is still listed while the
    # kernel tears it down (its command line already empty). Only what outlives that counts.
    deadline = time.monotonic() + 2
    while (left := under(base)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if not left:
        return
    for pid, _ in left:
        with contextlib.suppress(OSError):  # gone by itself meanwhile
            os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    listed = "\n  ".join(f"{pid}: {cmd}" for pid, cmd in left)
    raise AssertionError(f"{len(left)} process(es) left running by the tests (now killed):\n  {listed}")
