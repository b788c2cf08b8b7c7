"""A real install: the site's "Install on a node" page, run as an operator would run it.

The page's ```sh blocks are read from docs/node-install.md, so the manual cannot drift from what is
tested: the first (build the wheels) runs on this machine, once per session, against PyPI; the
others run in a fresh Debian 12 container with systemd as PID 1 (tests/systemd_fixtures.py), which
gets nothing but those wheels and contrib/ (no checkout; the installer fetches python3-venv, git
and ca-certificates with apt-get). The operator's edit of agent.yaml is an ``editor`` on the
node's PATH that writes a test node's settings. The node pulls a signed deployment from a
``git daemon`` inside the container and runs a service as ``nobody`` (process driver) and one
as a unit (systemd driver), under the installed, sandboxed agent unit.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import pytest
from conftest import SigningKey, git, small_deployment
from needs import unavailable
from systemd_fixtures import SystemdHost

import reconciler

ROOT = Path(__file__).resolve().parent.parent
MANUAL = ROOT / "docs" / "node-install.md"  # the "Install on a node" page of the site
CONTRIB = ROOT / "contrib"
UNIT = "reconciler-agent.service"
WORK = "/root/install"  # where the operator copied wheels/ and contrib/ on the node


def install_blocks() -> list[str]:
    """The ```sh blocks of the "Install on a node" page, in order."""
    section = MANUAL.read_text()
    return re.findall(r"```sh\n(.*?)```", section, re.S)


def readme_score(which: str) -> float:
    """A systemd-analyze figure the page states: the unit's, or the unit's with the host drop-in."""
    section = MANUAL.read_text()
    figures = [float(f) for f in re.findall(r"\*\*(\d+\.\d) OK\*\*", section)]
    assert len(figures) == 2, figures
    return figures[0] if which == "unit" else figures[1]


def _unavailable(reason: str) -> NoReturn:
    unavailable("the install test's Debian node", reason)


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The page's build block, run in a folder holding a copy of this checkout as ./reconciler
    (its tracked and unignored files, as a clean clone plus the work in progress)."""
    build = install_blocks()[0]
    where = tmp_path_factory.mktemp("wheels")
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src, dst = ROOT / rel, where / "reconciler" / rel
        if not src.is_symlink() and not src.exists():
            continue  # deleted in the work tree
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(os.readlink(src))
        else:
            shutil.copy2(src, dst)
    # `python3` is this venv's, which has pip (Debian's own python3 may not).
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", build], cwd=where, env=env, capture_output=True,
                          text=True, timeout=900)
    if proc.returncode != 0:
        _unavailable(f"the install page's build block failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return where / "wheels"


class Node:
    """The container as an operator's root shell sees it."""

    def __init__(self, host: SystemdHost) -> None:
        self.host = host
        self.docker = host.exec[:3]  # docker -H HOST
        self.name = host.exec[-1]

    def sh(self, script: str, cwd: str = WORK, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """A bash script on the node (errexit, pipefail), output captured."""
        return subprocess.run([*self.docker, "exec", "-w", cwd, self.name, "bash", "-euo", "pipefail", "-c", script],
                              capture_output=True, text=True, timeout=timeout)

    def ok(self, script: str, cwd: str = WORK, timeout: float = 300) -> str:
        proc = self.sh(script, cwd, timeout)
        assert proc.returncode == 0, f"{script!r} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout

    def copy_in(self, src: Path, dst: str) -> None:
        subprocess.run([*self.docker, "cp", str(src), f"{self.name}:{dst}"], check=True, capture_output=True)

    def write(self, path: str, text: str, mode: str = "0644") -> None:
        subprocess.run([*self.docker, "exec", "-i", self.name, "sh", "-c", f"cat > {path} && chmod {mode} {path}"],
                       input=text, text=True, check=True, capture_output=True)

    def main_pid(self) -> int:
        return int(self.ok(f"systemctl show -p MainPID --value {UNIT}"))

    def exposure(self) -> float:
        out = self.ok(f"systemd-analyze security --no-pager {UNIT}")
        found = re.search(rf"Overall exposure level for {re.escape(UNIT)}: (\d+\.\d) ", out)
        assert found, out[-500:]
        return float(found[1])


WEB = """\
import http.server, os, pathlib, sys, tempfile
# Written as the service's user, in the one place of the sandbox that is its own.
pathlib.Path(os.environ["RECONCILER_DATA_DIR"], "started-by").write_text(f"{os.getuid()}\\n")
class Page(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        with tempfile.TemporaryFile() as scratch:  # /tmp, as services use it: it must outlive an agent restart
            scratch.write(b"upload")
        super().do_GET()
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Page).serve_forever()
"""

SETTINGS = """\
node: n1
remote: git://127.0.0.1/cloud.git
state_dir: /var/lib/reconciler
interval: 5
jitter: 0
trust:
  allowed_signers: /etc/reconciler/trust/allowed_signers
"""


def deployment(tmp_path: Path, key: SigningKey) -> Path:
    """A signed deployment of two web pages: one served by a process running as ``nobody``
    (the process driver), one by a unit of its own (the systemd driver)."""
    files = {
        "reconciler.yaml": "format: 1\nname: installed\ndefaults: {driver: process}\n",
        "inventory.yaml": "vars: {port: 8080}\ngroups:\n  web: {services: [static, web]}\nnodes:\n  n1: {groups: [web]}\n",
        "services/web/service.yaml": (
            "runtime:\n  command: [python3, web.py, '{{ port }}']\n  user: nobody\n"
            "files:\n  - {path: web.py, source: web.py}\n  - {path: index.html, template: index.html.j2}\n"
            "health:\n  http: 'http://127.0.0.1:{{ port }}/index.html'\n"),
        "services/web/files/web.py": WEB,
        "services/web/templates/index.html.j2": "hello from {{ node }}\n",
        # The systemd driver writes its unit under /etc/systemd/system, which the sandbox keeps writable.
        "services/static/service.yaml": (
            "driver: systemd\nruntime:\n  command: [/usr/bin/python3, -m, http.server, '8081', --bind, 127.0.0.1]\n"
            "files:\n  - {path: index.html, template: index.html.j2}\nhealth:\n  tcp: '127.0.0.1:8081'\n"),
        "services/static/templates/index.html.j2": "static on {{ node }}\n",
    }
    dep = small_deployment(tmp_path / "repo", key, files, "a web page")
    return dep.bare


def test_the_readme_installs_a_working_agent_on_a_fresh_debian_node(
    systemd_host: SystemdHost, wheels: Path, merge_key: SigningKey, tmp_path: Path
) -> None:
    _build, install, first_start, look = install_blocks()
    node = Node(systemd_host)
    node.ok(f"mkdir -p {WORK}", cwd="/")
    node.copy_in(wheels, f"{WORK}/wheels")
    node.copy_in(CONTRIB, f"{WORK}/contrib")

    # Install: a node with no checkout, no pip, no venv module and no CA certificates.
    assert node.sh("python3 -c 'import ensurepip'").returncode != 0
    node.ok(install, timeout=600)

    assert node.ok("reconciler --version").strip() == f"reconciler, version {reconciler.__version__}"
    assert node.ok("readlink -f \"$(command -v reconciler)\"").strip() == "/opt/reconciler/bin/reconciler"
    assert node.ok("/opt/reconciler/bin/python -c 'import reconciler; print(reconciler.__file__)'").startswith(
        "/opt/reconciler/lib/")
    assert node.ok("cat /etc/reconciler/agent.yaml") == (CONTRIB / "agent.yaml").read_text()
    assert node.ok("stat -c '%a %U' /etc/reconciler/agent.yaml /etc/reconciler/trust /var/lib/reconciler"
                   ).split("\n")[:3] == ["600 root", "755 root", "711 root"]
    assert node.ok(f"systemctl is-enabled {UNIT}").strip() == "enabled"
    assert node.sh(f"systemctl is-active {UNIT}").stdout.strip() == "inactive"  # not configured yet
    # The skeleton alone is a located one-line error, not a traceback.
    unset = node.sh("reconciler status")
    assert unset.returncode == 2
    assert unset.stderr.strip() == ("error: /etc/reconciler/agent.yaml: missing setting 'node' "
                                    "(give --node or set it in --config) [BAD_CONFIG]")

    # The deployment repo, served by a git daemon on the node's loopback.
    bare = deployment(tmp_path, merge_key)
    node.ok("mkdir -p /srv/git", cwd="/")
    node.copy_in(bare, "/srv/git/cloud.git")
    node.ok("systemd-run --unit=install-test-gitd git daemon --reuseaddr --base-path=/srv/git --export-all "
            "--enable=receive-pack --listen=127.0.0.1 --port=9418")
    node.copy_in(merge_key.allowed_signers, f"{WORK}/allowed_signers")
    node.write(f"{WORK}/agent.yaml.wanted", SETTINGS)
    node.write("/usr/local/bin/editor", f"#!/bin/sh\ncp {WORK}/agent.yaml.wanted \"$1\"\n", mode="0755")

    # The first start, then (once the first pass is through) the look.
    head = git("--git-dir", str(bare), "rev-parse", "main")
    node.ok(first_start)
    status: dict[str, Any] = {}
    deadline = time.monotonic() + 90
    while status.get("applied_commit") != head:
        if time.monotonic() > deadline or status.get("verdict") in ("failed", "error", "refused", "halted"):
            journal = node.sh(f"journalctl -u {UNIT} --no-pager | tail -40").stdout
            pytest.fail(f"{head[:12]} not applied; status: {status}\n{journal}")
        time.sleep(0.5)
        proc = node.sh("reconciler status -o json")
        status = json.loads(proc.stdout) if proc.returncode == 0 else {}
    services = {s["name"]: s for s in status["services"]}
    assert status["verdict"] == "applied" and sorted(services) == ["static", "web"], status
    web = services["web"]
    assert web["running"] and web["driver"] == "process" and services["static"]["running"], status
    shown = node.ok(look)
    assert shown.startswith(f"node n1: head {head[:12]} applied"), shown
    [row] = [line.split() for line in shown.splitlines() if re.search(r"\bweb\b", line)]
    assert {"process", "ok", str(web["pid"]), head[:12]} <= set(row), shown

    # The service runs as nobody, inside the sandbox, and serves its page.
    pid = int(web["pid"])
    assert node.ok(f"ps -o user= -p {pid}").strip() == "nobody"
    proc_status = node.ok(f"cat /proc/{pid}/status")
    assert re.search(r"^NoNewPrivs:\s+1$", proc_status, re.M), proc_status  # the agent's child: its sandbox
    assert re.search(r"^Groups:\s*$", proc_status, re.M), proc_status  # no supplementary groups
    # ...but a cgroup of its own, out of the agent unit's: a scope in reconciler.slice.
    cgroup = node.ok(f"cat /proc/{pid}/cgroup")
    scope = re.search(r"/reconciler\.slice/(reconciler-web-[0-9a-f]{8}\.scope)$", cgroup, re.M)
    assert scope and UNIT not in cgroup, cgroup
    # Its environment is still the clean one with the marker (adoption finds it): nothing of
    # systemd's, neither the agent unit's nor the scope's.
    environ = node.ok(f"tr '\\0' '\\n' < /proc/{pid}/environ").splitlines()
    assert "RECONCILER_INSTANCE=/var/lib/reconciler/services|n1|web|" in "\n".join(environ)
    assert not [v for v in environ if v.startswith(("INVOCATION_ID=", "JOURNAL_STREAM=", "SYSTEMD_"))], environ
    nobody = node.ok("id -u nobody").strip()
    assert node.ok("cat /var/lib/reconciler/services/web/data/started-by").strip() == nobody
    page = "python3 -c 'import urllib.request; print(urllib.request.urlopen(\"http://127.0.0.1:8080/\").read().decode())'"
    assert node.ok(page).strip() == "hello from n1"
    assert node.ok("systemctl is-active rc-static.service").strip() == "active"
    assert node.ok(page.replace("8080", "8081")).strip() == "static on n1"
    # The node's note reached the remote: the agent pushed through the sandbox.
    note = json.loads(node.ok(f"git --git-dir=/srv/git/cloud.git notes --ref=reconciler/n1 show {head}", cwd="/"))
    assert note["state"] == "applied", note

    # The sandbox: the install page's figure (and the unit's own comment), below 5 (9.6 UNSAFE before it).
    assert node.exposure() == readme_score("unit") < 5
    assert f"rates it {readme_score('unit')} OK" in (CONTRIB / UNIT).read_text()

    # Upgrade: the same install again. The unit restarts, its service keeps running, the
    # settings the operator wrote stay.
    # The agent is stopped while pip replaces its code, so it never runs half an install
    # (it once died importing a module pip had just removed, and systemd's auto-restart left the
    # unit unstarted).
    before = node.main_pid()
    upgrade = node.sh(install, timeout=600)
    assert upgrade.returncode == 0, upgrade.stderr[-2000:]
    assert f"stopping {UNIT} while its code is replaced" in upgrade.stderr
    assert upgrade.stderr.rstrip().endswith(f"installed; {UNIT} restarted"), upgrade.stderr[-500:]
    assert node.ok("cat /etc/reconciler/agent.yaml") == SETTINGS
    after = node.main_pid()
    journal = node.ok(f"journalctl -u {UNIT} --no-pager")
    assert after not in (0, before), journal[-2000:]
    assert node.ok(f"ps -o user= -p {pid}").strip() == "nobody"
    assert node.ok(page).strip() == "hello from n1"
    assert "left-over process" not in journal, journal[-2000:]
    assert "Failed with result" not in journal and "Scheduled restart job" not in journal, journal[-2000:]

    # Without CA certificates every command says so in one line (the real Debian paths, moved away).
    node.ok("mv /etc/ssl/certs /etc/ssl/certs.away", cwd="/")
    try:
        bare_node = node.sh("reconciler --version", cwd="/")
    finally:
        node.ok("mv /etc/ssl/certs.away /etc/ssl/certs", cwd="/")
    assert bare_node.returncode == 2 and bare_node.stdout == ""
    assert re.fullmatch(r"error: no usable CA certificates in \S+ or \S+ \(pygit2: .*\): install the "
                        r"ca-certificates package \(apt-get install ca-certificates\).* \[NO_CA_BUNDLE\]\n",
                        bare_node.stderr), bare_node.stderr

    # The host driver's drop-in opens what it must and the install page's figure holds for it too.
    node.ok(f"mkdir -p /etc/systemd/system/{UNIT}.d && cp contrib/host-driver.conf /etc/systemd/system/{UNIT}.d/ "
            "&& systemctl daemon-reload")
    assert node.exposure() == readme_score("host") < 5


def test_a_node_without_ca_certificates_gets_one_line_naming_the_package(tmp_path: Path) -> None:
    """pygit2 loads the CA certificates when it is imported; none where OpenSSL looks (the
    variables point where Debian's paths point on a node without ca-certificates) fails there."""
    env = {**os.environ, "SSL_CERT_FILE": str(tmp_path / "no-bundle.pem"), "SSL_CERT_DIR": str(tmp_path / "no-dir")}
    for argv in (["--version"], ["status", "--state-dir", str(tmp_path)]):
        proc = subprocess.run([sys.executable, "-m", "reconciler", *argv], env=env, cwd=tmp_path, capture_output=True,
                              text=True, timeout=60)
        assert (proc.returncode, proc.stdout) == (2, ""), proc
        [line] = proc.stderr.splitlines()
        assert line.startswith(f"error: no usable CA certificates in {tmp_path}/no-bundle.pem or {tmp_path}/no-dir/ "
                               "(pygit2: OpenSSL error: failed to load certificates"), line
        assert line.endswith("install the ca-certificates package (apt-get install ca-certificates), or set "
                             "SSL_CERT_FILE to a CA bundle [NO_CA_BUNDLE]"), line

    proc = subprocess.run([sys.executable, "-m", "reconciler", "status", "-o", "json"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    error = json.loads(proc.stdout)["error"]
    assert (error["reason"], error["exit_code"]) == ("NO_CA_BUNDLE", 2)
    assert "ca-certificates" in error["message"]
