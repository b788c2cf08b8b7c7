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
from test_sops_real import age_key, seal

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


def host_node(tmp_path: Path, merge_key: SigningKey, files: dict[str, str], settings: str = "",
              reboot: str = "false") -> Node:
    """Node hv1 of a deployment of ``files`` (``{root}`` in them: the node's "/"), its host root
    under the test dir, a boot id file and its agent.yaml (``settings``: more lines of it)."""
    root = tmp_path / "hostroot"
    root.mkdir()
    dep = small_deployment(tmp_path, merge_key, {k: v.replace("{root}", str(root)) for k, v in files.items()},
                           "hosts and a web service")
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    config = tmp_path / "agent.yaml"
    config.write_text(
        f"node: hv1\nremote: {dep.url}\nstate_dir: {tmp_path / 'state'}\nnote_key: {note_key('hv1')}\n"
        f"trust: {{allowed_signers: {merge_key.allowed_signers}}}\n"
        f"host: {{root: {root}, boot_id_file: {boot}, reboot_command: {json.dumps(reboot)}}}\n{settings}")
    return Node(dep, root, config)


@pytest.fixture
def hv1(tmp_path: Path, merge_key: SigningKey) -> Iterator[Node]:
    root = "{root}"
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
    node = host_node(tmp_path, merge_key, files)
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


AUTH = "/etc/containers/auth.json"
POLICY = "/etc/containers/policy.json"


def test_a_host_record_written_before_drift_was_recorded_puts_nothing_back(tmp_path: Path,
                                                                           merge_key: SigningKey) -> None:
    """A host service holding a secret, applied by an agent of before drift was recorded: its
    record keeps neither the keys of the secret file's hash nor the drift policy. The upgraded
    agent must not read the secret file as changed by hand (it did: a put-back, on every host
    with such a file, at the first pass after the upgrade): no drift verdict from such a record,
    and the next change of the service writes the record a drift check needs."""
    key, public = age_key(tmp_path)
    files = {
        "reconciler.yaml": "format: 1\nname: drift\n",
        "inventory.yaml": (f"vars: {{policy: reject}}\ngroups:\n  hv: {{services: [auth]}}\n"
                           f"nodes:\n  hv1: {{groups: [hv], vars: {{age_recipient: {public}}}}}\n"),
        # auth.json: no rule for it, so a change of it reboots; policy.json: nothing to do
        "services/auth/service.yaml": (
            f"driver: host\nfiles:\n  - {{path: {AUTH}, template: auth.json.j2}}\n"
            f"  - {{path: {POLICY}, template: policy.json.j2}}\n"
            f"on_change:\n  - {{file: {POLICY}, action: none}}\n"),
        "services/auth/templates/auth.json.j2": '{"token": "{{ secrets.registry_token }}"}\n',
        "services/auth/templates/policy.json.j2": '{"default": "{{ policy }}"}\n',
    }
    hv1 = host_node(tmp_path, merge_key, files, settings=f"secrets: {{age_identity: {key}}}\n",
                    reboot=f"touch {tmp_path / 'rebooted'}; false")
    seal(tmp_path, hv1.dep, "secrets/registry.yaml", "registry_token: t0k-5e3c\n", public)
    hv1.dep.commit("the registry token")
    assert hv1.json("apply")["report"]["state"] == "applied"
    assert "t0k-5e3c" in hv1.host_file(AUTH).read_text()

    # The record as the agent before drift checks wrote it (and so did a pending reboot's).
    [record] = (tmp_path / "state").rglob("auth/record.json")
    old = {k: v for k, v in json.loads(record.read_text()).items() if k not in ("file_keys", "drift")}
    assert any(v.startswith("600:") for v in old["fingerprint"].values()), old  # the secret file's keyed hash
    record.write_text(json.dumps(old))

    planned = by_service(hv1.json("plan")["actions"])
    assert planned["auth"]["action"] == "none" and planned["auth"]["reason"].startswith("unchanged since"), planned
    assert hv1.json("status")["services"][0]["drifted"] == ""
    done = hv1.json("apply")
    assert not (tmp_path / "rebooted").exists(), done
    assert (done["report"] or {}).get("services", {}).get("auth", {}).get("action", "none") == "none", done

    # The next change of the service writes the record anew: its drift is checked from then on.
    hv1.dep.edit("inventory.yaml", "policy: reject", "policy: accept")
    hv1.dep.commit("accept")
    assert hv1.json("apply")["report"]["services"]["auth"]["action"] == "none"  # policy.json: nothing restarted
    assert set(json.loads(record.read_text())["file_keys"]) == {AUTH}
    assert hv1.json("status")["services"][0]["drifted"] == ""
    hv1.host_file(AUTH).write_text('{"token": "by-hand"}\n')
    assert hv1.json("status")["services"][0]["drifted"] == f"files: {AUTH} changed"
    assert not (tmp_path / "rebooted").exists()
