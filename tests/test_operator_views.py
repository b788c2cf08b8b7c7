"""What an operator reads on one node says what happened: `history` shows why each action ran
(the plan's reason, not only that its step went well), and `rollback` says where the service
went back to and that it is pinned there, not the head's verdict.

One node, n1, one process service, web: C1 starts it, C2 changes its config (a restart).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from conftest import SigningKey, age_args, small_deployment

from reconciler.agent import Agent


def test_history_shows_the_reason_and_rollback_says_where_it_went(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]
) -> None:
    files = {
        "reconciler.yaml": "format: 1\nname: views\n",
        "inventory.yaml": "vars: {level: info}\ngroups:\n  g: {services: [web]}\nnodes:\n  n1: {groups: [g]}\n",
        "services/web/service.yaml": ("runtime:\n  command: [python3, sleeper.py]\nfiles:\n"
                                      "  - {path: sleeper.py, source: sleeper.py}\n"
                                      "  - {path: web.conf, template: web.conf.j2}\n"),
        "services/web/files/sleeper.py": "import time\nwhile True:\n    time.sleep(60)\n",
        "services/web/templates/web.conf.j2": "[web]\nlevel = {{ level }}\n",
    }
    dep = small_deployment(tmp_path, merge_key, files, "web")
    n1 = agents("n1", dep.url)
    assert n1.reconcile_once().exit_code == 0
    dep.edit("inventory.yaml", "level: info", "level: debug")
    dep.commit("web: debug logs")
    c1, c2 = (subprocess.run(["git", "-C", str(dep.work), "rev-parse", rev], capture_output=True, text=True,
                             check=True).stdout.strip() for rev in ("HEAD~1", "HEAD"))
    assert n1.reconcile_once().exit_code == 0
    n1.close()
    args = ["--node", "n1", "--remote", dep.url, "--state-dir", str(n1.cfg.state_dir),
            "--allowed-signers", str(merge_key.allowed_signers), *age_args(n1)]

    def cli(*words: str) -> str:
        done = subprocess.run([sys.executable, "-m", "reconciler", *words, *args], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "COLUMNS": "250"})
        assert done.returncode == 0, (done.stdout, done.stderr)
        return done.stdout

    history = cli("history", "web")
    [restart] = [line for line in history.splitlines() if c2[:12] in line]
    assert "only [web] level changed in web.conf" in restart, history
    [start] = [line for line in history.splitlines() if c1[:12] in line]
    assert "not running on this node yet" in start, history

    said = cli("rollback", "web")
    assert f"web rolled back to {c1[:12]}, pinned" in said, said
    assert f"@ {c2[:12]}: applied" not in said, said
