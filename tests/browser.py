"""A real headless Chromium (Debian's /usr/bin/chromium) for the pages the CLI writes.

Three ways in, all a fresh browser with a fresh profile each time:
``dump_dom`` (the DOM after load, as Chromium serialises it: what a reader sees as text),
``screenshot`` (a PNG) and ``evaluate`` (JavaScript run in the loaded page through the DevTools
protocol over ``--remote-debugging-pipe``: JSON messages ended by NUL on fds 3 and 4, so no
port and no websocket library).
When Chromium is missing the test fails on CI (``$CI`` set) and is skipped elsewhere, as the
Docker tests do (.ci/run and ./test.sh as root install it).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

from needs import unavailable

# Without the background-networking flags Chromium keeps knocking on a closed network.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars")


def _unavailable(reason: str) -> NoReturn:
    unavailable("Chromium", reason)


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        _unavailable("no chromium on PATH (apt-get install chromium)")
    return found


def _run(*args: str) -> subprocess.CompletedProcess[bytes]:
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        proc = subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                              timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    return proc


def dump_dom(page: Path) -> str:
    return _run("--dump-dom", page.as_uri()).stdout.decode()


def screenshot(page: Path, png: Path, size: tuple[int, int] = (1280, 1000)) -> None:
    _run(f"--screenshot={png}", f"--window-size={size[0]},{size[1]}", page.as_uri())


def hex_colour(computed: str) -> str:
    """``rgb(198, 40, 40)`` (a computed colour) -> ``#c62828``."""
    r, g, b = (int(x) for x in re.findall(r"\d+", computed)[:3])
    return f"#{r:02x}{g:02x}{b:02x}"


def evaluate(page: Path, expression: str) -> Any:
    """The value of ``expression`` (JSON-able) in ``page`` once it has loaded."""
    to_browser_r, to_browser_w = os.pipe()
    from_browser_r, from_browser_w = os.pipe()

    def pipes_on_3_and_4() -> None:  # in the child, before exec
        os.dup2(to_browser_r, 3)
        os.dup2(from_browser_w, 4)
        os.set_inheritable(3, True)  # dup2 onto itself keeps close-on-exec
        os.set_inheritable(4, True)

    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        proc = subprocess.Popen([chromium(), *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe",
                                 "about:blank"], preexec_fn=pipes_on_3_and_4, close_fds=False,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        devtools = _DevTools(to_browser_w, from_browser_r)
        try:
            target = devtools.call("Target.createTarget", url=page.as_uri())["targetId"]
            session = devtools.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            deadline = time.monotonic() + 30
            ready = f"location.href === {json.dumps(page.as_uri())} && document.readyState === 'complete'"
            while not devtools.evaluate(session, ready):
                assert time.monotonic() < deadline, f"{page} did not load"
                time.sleep(0.05)
            return devtools.evaluate(session, expression)
        finally:
            devtools.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class _DevTools:
    """The DevTools protocol over a pipe pair: one call at a time, events skipped."""

    def __init__(self, write_fd: int, read_fd: int) -> None:
        self.write_fd, self.read_fd = write_fd, read_fd
        self.last_id = 0
        self.buffer = b""

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self.last_id += 1
        message: dict[str, Any] = {"id": self.last_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(self.write_fd, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self.buffer:
                chunk = os.read(self.read_fd, 1 << 16)
                assert chunk, f"Chromium closed the DevTools pipe during {method}"
                self.buffer += chunk
            line, self.buffer = self.buffer.split(b"\0", 1)
            answer = json.loads(line)
            if answer.get("id") == self.last_id:
                assert "error" not in answer, (method, answer["error"])
                result: dict[str, Any] = answer["result"]
                return result

    def evaluate(self, session: str, expression: str) -> Any:
        result = self.call("Runtime.evaluate", session, expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def close(self) -> None:
        with contextlib.suppress(AssertionError, OSError):  # it may close the pipe before it answers
            self.call("Browser.close")
        os.close(self.write_fd)
        os.close(self.read_fd)
