"""The MCD-style drift story, as an operator runs it from the command line: a file changed by hand
on the node is seen by `plan`, `apply` and `status`, host files (a ``driver: host`` service) as
much as a service's own live files, and the repo's ``drift:`` policy decides what happens to it:
``correct`` puts the repo's version back (with what its ``on_change`` rule asks, here a command
that re-reads it), ``report`` only says so and leaves it.

One node, hv1, under a test root (``host: {root: ...}``): two host services, ``registries``
(``drift: correct``) and ``sshkeys`` (``drift: report``), and ``web``, a process service.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import Deployment, SigningKey, note_key, small_deployment

REGISTRIES = "/etc/containers/registries.conf"
KEYS = "/etc/ssh/authorized_keys.d/ops"


@dataclass(frozen=True)
class Node:
    dep: Deployment
    root: Path  # the node's "/" for host files
    config: Path  # its agent.yaml

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "reconciler", *args, "--config", str(self.config)],
                              capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})

    def json(self, *args: str, code: int = 0) -> Any:
        done = self.cli(*args, "-o", "json")
        assert done.returncode == code, (done.stdout, done.stderr)
        return json.loads(done.stdout)

    def host_file(self, path: str) -> Path:
        return self.root / path.lstrip("/")


@pytest.fixture
def hv1(tmp_path: Path, merge_key: SigningKey) -> Iterator[Node]:
    root = tmp_path / "hostroot"
    root.mkdir()
    files = {
        "reconciler.yaml": "format: 1\nname: drift\n",
        "inventory.yaml": ("vars: {mirror: mirror.example.org, ops_key: ssh-ed25519 AAAAops}\n"
                           "groups:\n  hv: {services: [registries, sshkeys, web]}\nnodes:\n  hv1: {groups: [hv]}\n"),
        "services/registries/service.yaml": (
            f"driver: host\ndrift: correct\nfiles:\n  - {{path: {REGISTRIES}, template: registries.conf.j2}}\n"
            f"on_change:\n  - {{file: {REGISTRIES}, action: reload, "
            f"command: \"cp {root}{REGISTRIES} {root}/registries-read-by-engine\"}}\n"),
        "services/registries/templates/registries.conf.j2": '[[registry]]\nlocation = "{{ mirror }}"\n',
        "services/sshkeys/service.yaml": (
            f"driver: host\ndrift: report\nfiles:\n  - {{path: {KEYS}, template: ops.j2}}\n"
            f"on_change:\n  - {{file: {KEYS}, action: none}}\n"),
        "services/sshkeys/templates/ops.j2": "{{ ops_key }}\n",
        "services/web/service.yaml": ("runtime:\n  command: [python3, sleeper.py]\nfiles:\n"
                                      "  - {path: sleeper.py, source: sleeper.py}\n"
                                      "  - {path: web.conf, template: web.conf.j2}\n"),
        "services/web/files/sleeper.py": "import time\nwhile True:\n    time.sleep(60)\n",
        "services/web/templates/web.conf.j2": "[web]\nlevel = info\n",
    }
    dep = small_deployment(tmp_path, merge_key, files, "hosts and a web service")
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    config = tmp_path / "agent.yaml"
    config.write_text(
        f"node: hv1\nremote: {dep.url}\nstate_dir: {tmp_path / 'state'}\nnote_key: {note_key('hv1')}\n"
        f"trust: {{allowed_signers: {merge_key.allowed_signers}}}\n"
        f"host: {{root: {root}, boot_id_file: {boot}, reboot_command: 'false'}}\n")
    node = Node(dep, root, config)
    try:
        yield node
    finally:
        from reconciler.drivers import make_driver

        driver = make_driver("process", tmp_path / "state", "hv1")
        for o in driver.observe():
            driver.remove(o.name)


def by_service(actions: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {a["service"]: a for a in actions}


def test_a_hand_edit_of_a_host_file_is_seen_and_handled_per_drift_policy(hv1: Node) -> None:
    assert hv1.json("apply")["report"]["state"] == "applied"
    registries, keys = hv1.host_file(REGISTRIES), hv1.host_file(KEYS)
    assert registries.read_text() == '[[registry]]\nlocation = "mirror.example.org"\n'

    # Someone on the node points the engine at another registry and adds a key by hand.
    registries.write_text('[[registry]]\nlocation = "evil.example.net"\n')
    keys.write_text("ssh-ed25519 AAAAops\nssh-ed25519 AAAAsomeone-else\n")

    planned = by_service(hv1.json("plan")["actions"])
    assert planned["registries"]["action"] == "reload"
    assert f"files: {REGISTRIES} changed by hand" in planned["registries"]["reason"]
    assert planned["sshkeys"]["action"] == "none"
    assert planned["sshkeys"]["reason"] == f"drift not corrected (policy report): files: {KEYS} changed by hand"
    assert planned["web"]["reason"].startswith("unchanged since")

    status = hv1.cli("status")
    assert status.returncode == 0, status.stderr
    assert "drifted" in status.stdout and REGISTRIES in status.stdout

    applied = hv1.json("apply")["report"]["services"]  # as in the note: by service
    assert applied["registries"]["action"] == "reload" and applied["registries"]["result"] == "ok"
    assert registries.read_text() == '[[registry]]\nlocation = "mirror.example.org"\n'  # corrected
    # ... and the program was brought back onto it the way the repo's rule says (it re-read it)
    assert hv1.host_file("/registries-read-by-engine").read_text() == registries.read_text()
    assert applied["sshkeys"]["reason"].startswith("drift not corrected (policy report)")
    assert "someone-else" in keys.read_text()  # reported, left alone

    after = {s["name"]: s for s in hv1.json("status")["services"]}
    assert after["registries"]["drifted"] == ""
    assert after["sshkeys"]["drifted"] == f"files: {KEYS} changed"

    # The repo changes the reported file next: the hand edit goes, and the reason says so.
    hv1.dep.edit("inventory.yaml", "ops_key: ssh-ed25519 AAAAops", "ops_key: ssh-ed25519 AAAAops2")
    hv1.dep.commit("a new ops key")
    keys_result = hv1.json("apply")["report"]["services"]["sshkeys"]
    assert keys_result["reason"].endswith(f"; replaces a hand edit ({KEYS} changed)"), keys_result
    assert keys.read_text() == "ssh-ed25519 AAAAops2\n"


def test_status_says_a_service_runs_with_a_file_changed_by_hand(hv1: Node, tmp_path: Path) -> None:
    assert hv1.json("apply")["report"]["state"] == "applied"
    live = tmp_path / "state" / "services" / "web" / "live" / "web.conf"
    live.write_text("[web]\nlevel = debug\n")

    shown = hv1.cli("status")
    assert shown.returncode == 0, shown.stderr
    [row] = [line for line in shown.stdout.splitlines() if "web" in line and "process" in line]
    assert "drifted" in row, shown.stdout
    assert "web.conf" in shown.stdout
