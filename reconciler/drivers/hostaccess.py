"""The node's own operating system as the systemd and host drivers see it: a root for files,
and the commands that reach systemd and run things there.

On a node these are ``/``, ``systemctl`` and nothing; the tests point them at a real systemd in
a container (files under a bind-mounted root, commands through ``docker exec``).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from reconciler.core.errors import ApplyError


@dataclass(frozen=True)
class HostAccess:
    root: Path = Path("/")
    systemctl: tuple[str, ...] = ("systemctl",)
    exec: tuple[str, ...] = ()  # prefix to run a command where the units run (empty: here)
    reboot_command: str = "systemctl reboot"
    boot_id_file: Path = Path("/proc/sys/kernel/random/boot_id")

    def path(self, absolute: str) -> Path:
        rel = PurePosixPath(absolute)
        if not rel.is_absolute() or ".." in rel.parts:
            raise ApplyError(f"host file path must be absolute and plain: {absolute!r}")
        return self.root / rel.relative_to("/")

    def ctl(self, *args: str, check: bool = True) -> str:
        try:
            done = subprocess.run([*self.systemctl, *args], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ApplyError(f"systemctl {' '.join(args)}: {exc}") from exc
        if check and done.returncode != 0:
            raise ApplyError(f"systemctl {' '.join(args)} failed: {(done.stderr or done.stdout).strip()[-300:]}")
        return done.stdout

    def sh(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
           timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """A shell command where the units run."""
        if self.exec:
            prefix = f"cd {cwd} && " if cwd else ""
            exports = "".join(f"export {k}='{v}'; " for k, v in (env or {}).items())
            argv = [*self.exec, "/bin/sh", "-c", exports + prefix + command]
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        import os

        return subprocess.run(["/bin/sh", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})})

    def boot_id(self) -> str:
        try:
            return self.boot_id_file.read_text().strip()
        except OSError:
            return ""
