"""Health is the new version's own: a probe that another process answers proves nothing, and a
version must stay up, passing its probe, for ``health.min_healthy`` seconds.

History used here::

    C1 api on port A --- C2 api moves to port B (a stray process already listens there)
"""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import Deployment, SigningKey, free_port, small_deployment
from test_faults import processes_of

from reconciler.agent import Agent

# Serves GET /healthz with its own pid on the port its config names; exits if the port is taken.
API = """\
import configparser, json, os, sys, threading
from http.server import BaseHTTPRequestHandler, HTTPServer
cfg = configparser.ConfigParser()
cfg.read("api.conf")
class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass
    def do_GET(self):
        body = json.dumps({"pid": os.getpid()}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
try:
    server = HTTPServer(("127.0.0.1", cfg.getint("api", "port")), Handler)
except OSError as e:
    print(f"api: cannot listen: {e}", flush=True)
    sys.exit(2)
lifetime = cfg.getfloat("api", "lifetime", fallback=0)
if lifetime:
    threading.Timer(lifetime, lambda: os._exit(3)).start()
server.serve_forever()
"""

SERVICE = """\
runtime:
  command: [python3, api.py]
files:
  - {{path: api.py, source: api.py}}
  - {{path: api.conf, template: api.conf.j2}}
health:
  http: "http://127.0.0.1:{{{{ port }}}}/healthz"
  timeout: 5
{extra}"""


def api_repo(tmp_path: Path, key: SigningKey, port: int, extra: str = "", lifetime: float = 0) -> Deployment:
    files = {
        "reconciler.yaml": "format: 1\nname: health\n",
        "inventory.yaml": f"vars: {{port: {port}, lifetime: {lifetime}}}\ngroups:\n  g: {{services: [api]}}\n"
                          "nodes:\n  n1: {groups: [g]}\n",
        "services/api/service.yaml": SERVICE.format(extra=extra),
        "services/api/files/api.py": API,
        "services/api/templates/api.conf.j2": "[api]\nport = {{ port }}\nlifetime = {{ lifetime }}\n",
    }
    return small_deployment(tmp_path, key, files, "api")


@pytest.fixture
def stray() -> Iterator[int]:
    """Another program on this machine that answers 200 to any GET: the port it holds is returned."""

    class Yes(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            body = json.dumps({"pid": "stray"}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Yes)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def served_by(port: int) -> object:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
        return json.loads(resp.read())["pid"]


def test_a_probe_answered_by_another_process_does_not_make_a_dead_version_healthy(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent], stray: int
) -> None:
    port = free_port()
    dep = api_repo(tmp_path, merge_key, port)
    node = agents("n1", dep.url)
    assert node.reconcile_once().exit_code == 0
    old = served_by(port)

    # The new version listens where the stray already does: it cannot bind and exits, while the
    # stray answers the new version's health URL.
    dep.edit("inventory.yaml", f"port: {port}", f"port: {stray}")
    bad = dep.commit("api moves to a port that is taken")
    result = node.reconcile_once()

    assert result.exit_code == 1 and result.report is not None and result.report.state == "failed"
    [api] = result.report.services
    assert str(api.state) == "failed" and "exited" in api.detail and "previous version restored" in api.detail, api.detail
    assert (dep.note("n1", bad) or {}).get("state") == "failed"
    # The old version serves again, on its own port.
    running = processes_of(node.cfg.state_dir)
    assert list(running) == ["api"] and len(running["api"]) == 1
    assert served_by(port) == running["api"][0] != old


def test_a_version_that_dies_within_min_healthy_is_not_healthy(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]
) -> None:
    # Up and answering for half a second, then gone: healthy at the first probe, not for 2 s.
    dep = api_repo(tmp_path, merge_key, free_port(), extra="  min_healthy: 2\n", lifetime=0.5)
    node = agents("n1", dep.url)

    result = node.reconcile_once()

    assert result.exit_code == 1 and result.report is not None
    [api] = result.report.services
    assert str(api.state) == "failed" and "exited" in api.detail and "min_healthy 2s" in api.detail
    assert processes_of(node.cfg.state_dir) == {}
