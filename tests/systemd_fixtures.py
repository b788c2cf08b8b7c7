"""Pytest plugin: a real systemd, as PID 1 in a container (registered in conftest.py).

``systemd_host`` boots a fresh container of ``reconciler-test/systemd:1`` (Debian bookworm minbase with
systemd, dbus and python3; built once by scripts/systemd-image.sh when missing) for one test::

    def test_unit(systemd_host: SystemdHost) -> None:
        (systemd_host.unit_dir / "t-demo.service").write_text("[Service]\\nExecStart=/bin/sleep 600\\n")
        subprocess.run([*systemd_host.systemctl, "daemon-reload"], check=True)
        subprocess.run([*systemd_host.systemctl, "start", "t-demo"], check=True)
        assert systemd_host.show("t-demo", "ActiveState") == {"ActiveState": "active"}

Host paths and what the container sees:

- ``root/etc/systemd/system`` is ``/etc/systemd/system`` (rw bind mount; starts empty, which hides the
  image's own enablement symlinks: systemd boots fine without them, see scripts/systemd-image.sh);
- ``root/etc/reconciler-host`` is ``/etc/reconciler-host`` (host config files the tests manage);
- ``shared`` is bind-mounted at the same absolute path, so ``WorkingDirectory=<shared>/...`` works.

Files the container writes there are owned by root. When the container cannot be had the test fails
on CI (``$CI`` set) and is skipped elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import docker
import docker.errors
import pytest
from docker.models.containers import Container
from needs import unavailable

ROOT = Path(__file__).resolve().parent.parent
IMAGE_SCRIPT = ROOT / "scripts" / "systemd-image.sh"
SYSTEMD_IMAGE = "reconciler-test/systemd:1"
RUN_LABEL = "reconciler.test-run"  # as in docker_fixtures: docker_engine's teardown removes leftovers
BOOT_TIMEOUT = 60.0


def _unavailable(reason: str) -> NoReturn:
    unavailable("systemd container", reason)


@dataclass(frozen=True)
class SystemdHost:
    """A booted systemd container. Run things in it with ``[*host.systemctl, "start", "x"]`` or
    ``[*host.exec, "cat", "/etc/os-release"]`` (docker CLI argv prefixes)."""

    name: str
    root: Path  # stands for the container's / (for etc/systemd/system and etc/reconciler-host only)
    shared: Path  # the same absolute path inside and outside
    systemctl: tuple[str, ...]
    exec: tuple[str, ...]

    @property
    def unit_dir(self) -> Path:
        """Host side of /etc/systemd/system."""
        return self.root / "etc" / "systemd" / "system"

    @property
    def config_dir(self) -> Path:
        """Host side of /etc/reconciler-host."""
        return self.root / "etc" / "reconciler-host"

    def run(self, *argv: str, check: bool = False, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run a command inside the container; output captured as text."""
        return subprocess.run([*self.exec, *argv], capture_output=True, text=True, check=check, timeout=timeout)

    def show(self, unit: str, *props: str) -> dict[str, str]:
        """``systemctl show -p PROP,...`` of a unit, as a dict."""
        proc = subprocess.run([*self.systemctl, "show", "-p", ",".join(props), unit], capture_output=True,
                              text=True, check=True, timeout=60)
        return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)


def _have_image(client: docker.DockerClient) -> bool:
    try:
        client.images.get(SYSTEMD_IMAGE)
        return True
    except docker.errors.ImageNotFound:
        return False


@pytest.fixture(scope="session")
def systemd_image(docker_engine: docker.DockerClient) -> str:
    """The systemd test image, built once by scripts/systemd-image.sh when missing (needs root then)."""
    if shutil.which("docker") is None:
        _unavailable("the docker CLI is not installed")
    if _have_image(docker_engine):
        return SYSTEMD_IMAGE
    try:
        proc = subprocess.run(["bash", str(IMAGE_SCRIPT)], cwd=ROOT, capture_output=True, text=True, timeout=1800,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        _unavailable(f"{IMAGE_SCRIPT.name}: {e}")
    if proc.returncode != 0 or not _have_image(docker_engine):
        tail = "\n".join(proc.stderr.strip().splitlines()[-30:])
        _unavailable(f"{IMAGE_SCRIPT.name} exited {proc.returncode}:\n{tail}")
    return SYSTEMD_IMAGE


def _system_state(exec_prefix: tuple[str, ...]) -> str:
    try:
        proc = subprocess.run([*exec_prefix, "systemctl", "is-system-running"], capture_output=True, text=True,
                              timeout=15)
    except subprocess.TimeoutExpired:
        return "(no answer)"
    return proc.stdout.strip() or proc.stderr.strip()


@pytest.fixture
def systemd_host(docker_engine: docker.DockerClient, systemd_image: str, docker_run_id: str,
                 tmp_path: Path) -> Iterator[SystemdHost]:
    """A fresh container with systemd as PID 1, booted ("running" or "degraded"); removed afterwards."""
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"  # docker_engine set it
    root = tmp_path / "systemd-root"
    shared = tmp_path / "shared"
    for d in (root / "etc" / "systemd" / "system", root / "etc" / "reconciler-host", shared):
        d.mkdir(parents=True, exist_ok=True)
    name = f"reconciler-systemd-{docker_run_id}-{secrets.token_hex(3)}"
    exec_prefix = ("docker", "-H", host, "exec", name)
    volumes = {
        "/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "ro"},
        str(root / "etc" / "systemd" / "system"): {"bind": "/etc/systemd/system", "mode": "rw"},
        str(root / "etc" / "reconciler-host"): {"bind": "/etc/reconciler-host", "mode": "rw"},
        str(shared): {"bind": str(shared), "mode": "rw"},
    }
    container: Container | None = None
    try:
        try:
            container = docker_engine.containers.run(
                systemd_image, detach=True, name=name, hostname="systemd-host", labels={RUN_LABEL: docker_run_id},
                cap_add=["SYS_ADMIN"], security_opt=["seccomp=unconfined"], tmpfs={"/run": "", "/run/lock": ""},
                volumes=volumes,
            )
        except docker.errors.DockerException as e:
            _unavailable(f"docker run {systemd_image}: {e}")
        deadline = time.monotonic() + BOOT_TIMEOUT
        state = ""
        while True:
            state = _system_state(exec_prefix)
            if state in ("running", "degraded"):
                break
            container.reload()
            if container.status not in ("created", "running"):
                logs = container.logs(tail=30).decode(errors="replace")
                _unavailable(f"container {name} is {container.status} (state {state!r}); its last output:\n{logs}")
            if time.monotonic() > deadline:
                failed = subprocess.run([*exec_prefix, "systemctl", "--failed", "--no-pager"], capture_output=True,
                                        text=True, timeout=15).stdout
                _unavailable(f"systemd in {name} not running after {BOOT_TIMEOUT:.0f} s: {state!r}\n{failed}")
            time.sleep(0.1)
        yield SystemdHost(name=name, root=root, shared=shared, systemctl=(*exec_prefix, "systemctl"),
                          exec=exec_prefix)
    finally:
        if container is not None:
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                container.remove(force=True, v=True)
