"""A change's first pass in a fresh process (a daemon after its re-execution, `agent --once` from a
timer) imports what that change needs and no more (issue 40): no age or SOPS code for a repo
without secrets, no time zones or cron for one without windows, and the note signed with the
node's ed25519 key through libsodium, without the cryptography package."""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import SigningKey, small_deployment
from test_idle import ONCE

from reconciler.agent import Agent
from reconciler.core.warmup import warming

SERVICE = ("runtime:\n  command: [python3, idle.py]\nfiles:\n  - {path: idle.py, source: idle.py}\n"
           "  - {path: idle.conf, template: idle.conf.j2}\n")
HEAVY = ("pyrage", "cryptography", "cronsim", "zoneinfo")
SEEN = ONCE.replace('print(" ".join(sorted(m for m in sys.modules if m.partition(".")[0] in ("pygit2", ',
                    f'print(" ".join(sorted(m for m in sys.modules if m.partition(".")[0] in {HEAVY!r} + ("pygit2", ')


def test_a_change_applied_by_a_fresh_agent_once_loads_no_secret_window_or_openssl_key_code(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]
) -> None:
    assert SEEN != ONCE  # the module list below is this test's, not test_idle's
    files = {"reconciler.yaml": "format: 1\nname: change\n",
             "inventory.yaml": "vars:\n  level: info\ngroups:\n  all:\n    services: [idle]\n"
                               "nodes:\n  c1:\n    groups: [all]\n",
             "services/idle/service.yaml": SERVICE,
             "services/idle/templates/idle.conf.j2": "level = {{ level }}\n",
             "services/idle/files/idle.py": "import time\nwhile True:\n    time.sleep(3600)\n"}
    dep = small_deployment(tmp_path, merge_key, files)
    node = agents("c1", dep.url)
    assert node.reconcile_once().exit_code == 0
    (dep.work / "inventory.yaml").write_text(files["inventory.yaml"].replace("level: info", "level: debug"))
    commit = dep.commit("idle: debug level")
    args = ["agent", "--once", "--node", "c1", "--remote", dep.url, "--state-dir", str(node.cfg.state_dir),
            "--allowed-signers", str(merge_key.allowed_signers), "--note-key", str(node.cfg.note_key)]
    done = subprocess.run([sys.executable, "-c", SEEN, *args], capture_output=True, text=True, check=True)
    said, _, loaded = done.stdout.partition("exit 0\n")
    assert commit[:12] in said, done
    modules = set(loaded.split())
    assert "pygit2" in modules and "jinja2" in modules, modules  # the change path ran
    assert not {m for m in modules if m.partition(".")[0] in HEAVY}, modules
    assert (node.cfg.state_dir / "services/idle/live/idle.conf").read_text() == "level = debug\n"


def test_a_module_that_fails_to_import_while_the_fetch_waits_fails_the_same_in_the_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The warm-up swallows nothing the pass would have said: the module is not left half made
    in ``sys.modules``, and the pass's own import raises the module's error (a broken install)."""
    name = f"broken_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text("raise ImportError('libgit2.so.1.9: cannot open shared object file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with warming([name, "json"]):
        pass
    assert name not in sys.modules
    with pytest.raises(ImportError, match="libgit2.so.1.9"):
        importlib.import_module(name)
