"""Runs an upgrade step's command, so that a killed agent never runs it twice.

A step's command runs in its own session, in a private directory of the new version's rendered
files, under a small shell wrapper that writes its pid first and its exit status last (each by a
rename). An agent killed meanwhile finds, on its next run, a command still running (waited for,
up to its timeout) or finished (its status used); a command that started and never finished is
``INTERRUPTED``, and the upgrade's rules decide whether to run it again. A docker service's step
runs in a one-off container of its new image (``dockerstep``), under the same wrapper.

Host hooks of a reboot step (drain, undrain, the reboot command) run through ``host_command``.
This is runtime work: it lives with the drivers, and the upgrade state machine
(``node.upgrader``) only says which command to run where.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from reconciler.core import faults
from reconciler.core.atomic import atomic_write
from reconciler.core.model import DesiredService
from reconciler.core.redact import NONE as NO_SECRETS
from reconciler.core.redact import Redactor
from reconciler.drivers.base import clean_env
from reconciler.drivers.hostaccess import HostAccess

OUTPUT = 2000  # characters of a step's output kept in its record
INTERRUPTED = "interrupted: the command started and never finished (the node or the agent died)"
# Runs a step's command; "started" (its pid) first and "status" last, each by a rename.
WRAPPER = ('echo $$ > ../started.tmp && mv ../started.tmp ../started && '
           '(/bin/sh -c "$RECONCILER_STEP_COMMAND") > ../output 2>&1 < /dev/null; '
           'echo $? > ../status.tmp && mv ../status.tmp ../status')


def run_command(d: Path, where: Mapping[str, str], command: str, timeout: float,
                render: Callable[[], DesiredService | None], in_container: bool, redact: Redactor) -> tuple[bool, str]:
    """The step's command in ``d`` (its scratch directory): (ok, its output's end, or why not).
    ``where``: RECONCILER_NODE, _SERVICE, _COMMIT and _STEP; ``render``: the service's new
    version (None for a deployment-wide step), asked only when the command is to start;
    ``in_container``: the service's kind runs steps in a one-off container of its new image
    (``steps_in_image``), so a killed step's container goes too."""
    node, service, name = where["RECONCILER_NODE"], where["RECONCILER_SERVICE"], where["RECONCILER_STEP"]
    mark = f"{where['RECONCILER_COMMIT']}/{service}/{name}"

    def remove_container() -> None:
        if service and in_container:
            from reconciler.drivers import dockerstep  # the docker SDK only where it is used

            dockerstep.remove(dockerstep.step_name(node, service, name))

    status = finished(d, mark, timeout, remove_container)
    if status is None:
        if (d / "started").exists():
            return False, INTERRUPTED
        shutil.rmtree(d, ignore_errors=True)
        svc = render()
        # Private: it holds the rendered files (secret ones too) and the command's raw output.
        d.mkdir(parents=True, mode=0o700, exist_ok=True)
        d.chmod(0o700)
        (d / "files").mkdir(exist_ok=True)
        for f in svc.files if svc else ():
            atomic_write(d / "files" / f.path, f.content, f.mode)
        env = {**clean_env(), **(dict(svc.runtime.env) if svc else {}), **where,
               "RECONCILER_STEP_ID": mark, "RECONCILER_STEP_COMMAND": command}
        if svc is not None and in_container:  # a one-off container of the new image
            from reconciler.drivers import dockerstep

            package_root = str(Path(__file__).resolve().parents[2])  # where the step's python finds reconciler
            env.update(dockerstep.engine_env(), PYTHONPATH=package_root,
                       RECONCILER_STEP_SPEC=json.dumps(dockerstep.spec(svc, node, name, d / "files", command,
                                                                       dict(where))),
                       RECONCILER_STEP_COMMAND=f"{shlex.quote(sys.executable)} -m reconciler.drivers.dockerstep")
        faults.point("spawn", f"upgrade step {service}/{name}")
        proc = subprocess.Popen(["/bin/sh", "-c", WRAPPER], cwd=d / "files", env=env, start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            remove_container()
            return False, f"timed out after {timeout:g}s"
        status = finished(d, mark, 0, lambda: None)
        if status is None:
            return False, "the command's wrapper ended without an exit status"
    try:
        raw = (d / "output").read_bytes()
    except FileNotFoundError:
        raw = b""
    text = raw.decode(errors="replace")
    clean = redact(text)  # whole, then cut: a value cut in half would match none
    if clean != text:  # what stays on disk after the step: names, not values
        atomic_write(d / "output", clean.encode(), 0o600)
    output = clean[-OUTPUT:].strip()
    if status != 0:
        return False, f"exit {status}" + (f": {output[-500:]}" if output else "")
    return True, output[-200:] or "ok"


def finished(d: Path, mark: str, timeout: float, killed: Callable[[], None]) -> int | None:
    """The exit status a step's command left, waiting (up to ``timeout``) for one that a
    killed agent left running; None when it never finished (or never started)."""
    started = d / "started"
    if started.exists() and not (d / "status").exists():
        try:
            pid = int(started.read_text().strip())
        except ValueError:
            pid = 0
        deadline = time.monotonic() + timeout
        while pid and _runs(pid, mark) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid and _runs(pid, mark):  # past its timeout: stopped, never left running beside a new run
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            while _runs(pid, mark):
                time.sleep(0.05)
            killed()
    try:
        return int((d / "status").read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _runs(pid: int, mark: str) -> bool:
    """The process ``pid`` is alive and is the step's wrapper (not a reused pid)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"RECONCILER_STEP_ID={mark}".encode() in environ.split(b"\0")


def host_command(host: HostAccess, command: str, timeout: float, redact: Redactor = NO_SECRETS) -> str:
    """A reboot step's hook or reboot command on the host: "" when it succeeded, else why not
    (its output's end, a timeout, a command that cannot start): a failed step, never a traceback."""
    try:
        done = host.sh(command, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:g}s"
    except OSError as exc:
        return str(exc)
    if done.returncode == 0:
        return ""
    return redact((done.stderr or done.stdout).strip())[-200:] or f"exit {done.returncode}"
