"""The systemd driver and host domains against a real systemd (PID 1 in a container).

The agent runs here; systemctl and commands reach the container through `docker exec`, and
the unit directory and host config directory are bind mounts of folders under the test's
root, as HostConfig(root=..., systemctl=..., exec=...) says.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Deployment, SigningKey, small_deployment

from reconciler.agent import Agent
from reconciler.settings import HostConfig, TrustConfig

pytestmark = pytest.mark.usefixtures("docker_cleanup")

APP = """\
import http.server, os, signal
def load():
    global VALUE
    VALUE = open("app.conf").read().strip()
load()
signal.signal(signal.SIGHUP, lambda *_: load())
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"{VALUE} pid={os.getpid()}".encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", 8080), H).serve_forever()
"""
SERVICE = """\
driver: systemd
runtime:
  command: [/usr/bin/python3, app.py]
files:
  - {path: app.py, source: app.py}
  - {path: app.conf, template: app.conf.j2}
reload: {signal: SIGHUP}
on_change:
  - {file: app.conf, action: reload}
health:
  command: "python3 -c 'import urllib.request; urllib.request.urlopen(\\"http://127.0.0.1:8080/\\", timeout=1)'"
  timeout: 15
"""
HOST = """\
driver: host
files:
  - {path: /etc/reconciler-host/motd.conf, template: motd.conf.j2}
on_change:
  - {file: /etc/reconciler-host/*, action: reload, unit: rc-app.service}
"""


def repo(tmp_path: Path, key: SigningKey) -> Deployment:
    files = {
        "reconciler.yaml": "format: 1\nname: sd\n",
        "inventory.yaml": "vars: {greeting: hello, motd: welcome}\ngroups:\n  g: {services: [app, host]}\n"
                          "nodes:\n  t-sd1: {groups: [g]}\n",
        "services/app/service.yaml": SERVICE,
        "services/app/files/app.py": APP,
        "services/app/templates/app.conf.j2": "{{ greeting }}\n",
        "services/host/service.yaml": HOST,
        "services/host/templates/motd.conf.j2": "{{ motd }}\n",
    }
    return small_deployment(tmp_path, key, files, "systemd app")


def fetch(host: object) -> str:
    out = host.run("python3", "-c", "import urllib.request;"  # type: ignore[attr-defined]
                   "print(urllib.request.urlopen('http://127.0.0.1:8080/').read().decode())")
    return str(out.stdout.strip())


def test_systemd_units_start_reload_restart_and_go(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent], systemd_host: object
) -> None:
    sd = systemd_host
    dep = repo(tmp_path, merge_key)
    host = HostConfig(root=sd.root, systemctl=sd.systemctl, exec=sd.exec)  # type: ignore[attr-defined]
    node = agents("t-sd1", dep.url, trust=TrustConfig(allowed_signers=merge_key.allowed_signers), host=host,
                  state_dir=sd.shared / "state")  # type: ignore[attr-defined]

    first = node.reconcile_once()
    assert first.exit_code == 0, first.report
    assert (sd.unit_dir / "rc-app.service").exists()  # type: ignore[attr-defined]
    assert sd.show("rc-app.service", "ActiveState")["ActiveState"] == "active"  # type: ignore[attr-defined]
    served = fetch(sd)
    assert served.startswith("hello pid=")
    pid = served.split("pid=")[1]

    # A config change its rule says reloads: same MainPID, new value served.
    dep.edit("inventory.yaml", "greeting: hello", "greeting: bonjour")
    dep.commit("bonjour")
    result = node.reconcile_once()
    app = next(r for r in result.report.services if r.service == "app")  # type: ignore[union-attr]
    assert str(app.action) == "reload"
    assert fetch(sd) == f"bonjour pid={pid}"

    # A host file whose rule reloads a named unit.
    dep.edit("inventory.yaml", "motd: welcome", "motd: maintenance tonight")
    dep.commit("motd")
    result = node.reconcile_once()
    hostres = next(r for r in result.report.services if r.service == "host")  # type: ignore[union-attr]
    assert (str(hostres.action), hostres.reason) == ("reload", "only /etc/reconciler-host/motd.conf changed")
    assert (sd.config_dir / "motd.conf").read_text() == "maintenance tonight\n"  # type: ignore[attr-defined]
    assert fetch(sd) == f"bonjour pid={pid}"

    # The program itself changes: no rule, so a restart (a new MainPID).
    dep.edit("services/app/files/app.py", 'f"{VALUE} pid={os.getpid()}"', 'f"{VALUE}! pid={os.getpid()}"')
    dep.commit("app v2")
    result = node.reconcile_once()
    assert next(str(r.action) for r in result.report.services if r.service == "app") == "restart"  # type: ignore[union-attr]
    served = fetch(sd)
    assert served.startswith("bonjour! pid=") and served.split("pid=")[1] != pid

    # Retired: the unit is stopped, disabled and its file removed; host files it wrote go too.
    dep.edit("inventory.yaml", "services: [app, host]", "services: []")
    dep.commit("retire")
    assert node.reconcile_once().exit_code == 0
    assert not (sd.unit_dir / "rc-app.service").exists()  # type: ignore[attr-defined]
    assert sd.show("rc-app.service", "LoadState")["LoadState"] == "not-found"  # type: ignore[attr-defined]
    assert not (sd.config_dir / "motd.conf").exists()  # type: ignore[attr-defined]
