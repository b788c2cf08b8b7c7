"""A real nginx serving a directory of static files on a loopback port: the web server an
operator puts in front of the tips files (``contrib/git-server/post-receive-tips``). Started
and stopped at will; its access log says which files were asked for."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from ports import wait_listening


class Nginx:
    def __init__(self, root: Path, work: Path, port: int, extra: str = "",
                 tls: tuple[Path, Path] | None = None) -> None:
        self.root, self.work, self.port = root, work, port
        self.extra = extra  # more of the server block (a location for git http-backend, say)
        self.tls = tls  # (certificate, key): https only
        self.proc: subprocess.Popen[bytes] | None = None
        self.binary = shutil.which("nginx") or "/usr/sbin/nginx"

    @property
    def available(self) -> bool:
        return os.access(self.binary, os.X_OK)

    def url(self, path: str) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/{path}"

    def start(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        conf = self.work / "nginx.conf"
        listen = f"127.0.0.1:{self.port}"
        if self.tls:
            listen += f" ssl;\n        ssl_certificate {self.tls[0]};\n        ssl_certificate_key {self.tls[1]}"
        temp = "\n".join(f"    {kind}_temp_path {self.work}/{kind};" for kind in
                         ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        conf.write_text(f"""{"user root;" if os.geteuid() == 0 else ""}
daemon off;
worker_processes 1;
pid {self.work}/nginx.pid;
error_log {self.work}/error.log;
events {{ worker_connections 256; }}
http {{
    access_log {self.work}/access.log;
{temp}
    server {{
        listen {listen};
        root {self.root};
        location / {{ default_type text/plain; }}
{self.extra}
    }}
}}
""")
        self.proc = subprocess.Popen([self.binary, "-c", str(conf), "-p", str(self.work)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_listening(self.port, "nginx", self.proc)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None

    def requests(self, path: str, at_least: int = 0) -> list[int]:
        """The HTTP status of each request for ``path`` so far. nginx logs a request after the
        client has its whole response, so a test that just made one waits (up to 5 s) for
        ``at_least`` lines of it, then a moment more for any line still behind them."""
        deadline = time.monotonic() + 5
        out = self._logged(path)
        while len(out) < at_least and time.monotonic() < deadline:
            time.sleep(0.02)
            out = self._logged(path)
        if at_least:
            time.sleep(0.1)
            out = self._logged(path)
        return out

    def _logged(self, path: str) -> list[int]:
        log = self.work / "access.log"
        if not log.exists():
            return []
        out = []
        for line in log.read_text().splitlines():
            request, _, rest = line.partition('" ')
            if request.endswith(f" /{path} HTTP/1.1"):
                out.append(int(rest.split()[0]))
        return out
