"""An idle agent stays light (issue 17): a poll that finds nothing new reads its mirror with
files and git, never pygit2; the ref reader behind that says what git says, or stands aside."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Deployment, SigningKey, git, small_deployment, wait_for
from daemon_probe import DAEMON

from reconciler.agent import Agent
from reconciler.source.refs import NotPlain, read_ref


def test_refs_read_as_git_reads_them_loose_packed_or_absent(tmp_path: Path) -> None:
    repo = tmp_path / "r.git"
    git("init", "-q", "--bare", "-b", "main", str(repo))
    tree = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"  # the empty tree: every repository has it
    one = git("-C", str(repo), "commit-tree", tree, "-m", "one").strip()
    two = git("-C", str(repo), "commit-tree", tree, "-p", one, "-m", "two").strip()
    git("-C", str(repo), "update-ref", "refs/heads/main", one)
    git("-C", str(repo), "update-ref", "refs/notes/reconciler/n1", one)
    assert read_ref(repo, "refs/heads/main") == one  # loose
    git("-C", str(repo), "pack-refs", "--all")
    assert not (repo / "refs/heads/main").exists()
    assert read_ref(repo, "refs/heads/main") == one  # packed
    git("-C", str(repo), "update-ref", "refs/heads/main", two)
    assert read_ref(repo, "refs/heads/main") == two  # loose again, over its stale packed line
    assert read_ref(repo, "refs/notes/reconciler/n1") == one
    assert read_ref(repo, "refs/heads/other") is None
    assert read_ref(repo, "refs/notes/reconciler/n2") is None


@pytest.mark.parametrize("content", ["ref: refs/heads/main\n", "not an id\n", ""])
def test_a_ref_the_files_do_not_say_plainly_is_left_to_pygit2(tmp_path: Path, content: str) -> None:
    repo = tmp_path / "r.git"
    git("init", "-q", "--bare", "-b", "main", str(repo))
    (repo / "refs/heads/odd").write_text(content)
    with pytest.raises(NotPlain):
        read_ref(repo, "refs/heads/odd")


PASS = """
import pickle, sys
from reconciler.agent import Agent
agent = Agent(pickle.load(open(sys.argv[1], "rb")), progress=False)
result = agent.reconcile_once()
print(result.exit_code, result.fetched, result.report is None, "pygit2" in sys.modules)
"""


def test_a_poll_that_finds_nothing_new_never_loads_pygit2(deployment: Deployment, agents: Callable[..., Agent],
                                                           tmp_path: Path) -> None:
    node = agents("cmp1", deployment.url)
    assert node.reconcile_once().exit_code == 0
    node.close()
    cfg = tmp_path / "cfg.pickle"
    cfg.write_bytes(pickle.dumps(node.cfg))
    # A fresh interpreter (this one loaded pygit2 long ago) that starts converged, as a
    # restarted daemon does: its pass finds nothing new.
    done = subprocess.run([sys.executable, "-c", PASS, str(cfg)], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["0", "False", "True", "False"], done.stderr
    # A new commit is fetched, verified and applied: then pygit2 is loaded, as it must be.
    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    deployment.commit("kvm")
    done = subprocess.run([sys.executable, "-c", PASS, str(cfg)], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["0", "True", "False", "True"], done.stderr


ONCE = """
import runpy, sys
sys.argv = ["reconciler", *sys.argv[1:]]
try:
    runpy.run_module("reconciler", run_name="__main__")
except SystemExit as exc:
    print("exit", exc.code)
print(" ".join(sorted(m for m in sys.modules if m.partition(".")[0] in ("pygit2", "jinja2", "jsonschema", "rich", "click")
                      or m in ("http.server", "ssl", "reconciler.daemon.loop", "reconciler.daemon.notify",
                               "reconciler.daemon.shed", "reconciler.cli.group", "reconciler.cli.node",
                               "reconciler.node.converge", "reconciler.node.gate", "reconciler.node.upgrader",
                               "reconciler.plan.planner"))))
"""


def test_a_no_op_agent_once_imports_only_what_a_no_op_needs(tmp_path: Path, merge_key: SigningKey,
                                                            agents: Callable[..., Agent]) -> None:
    """`agent --once` from a systemd timer or cron: a no-op is the interpreter, the pass and
    its imports (issue 40); none of the signature, template or schema code, nor the daemon's
    webhook server, nor rich for a one-line answer, nor click and the other commands (a plain
    `agent` command line is read without them), nor the change path (gate, converge, planner)."""
    files = {"reconciler.yaml": "format: 1\nname: once\n",
             "inventory.yaml": "groups:\n  all:\n    services: [idle]\nnodes:\n  o1:\n    groups: [all]\n",
             "services/idle/service.yaml": "runtime:\n  command: [python3, idle.py]\n"
                                           "files:\n  - {path: idle.py, source: idle.py}\n",
             "services/idle/files/idle.py": "import time\nwhile True:\n    time.sleep(3600)\n"}
    dep = small_deployment(tmp_path, merge_key, files)
    node = agents("o1", dep.url)
    assert node.reconcile_once().exit_code == 0
    args = ["agent", "--once", "--node", "o1", "--remote", dep.url, "--state-dir", str(node.cfg.state_dir),
            "--allowed-signers", str(merge_key.allowed_signers), "--note-key", str(node.cfg.note_key)]
    done = subprocess.run([sys.executable, "-c", ONCE, *args], capture_output=True, text=True, check=True)
    said, _, loaded = done.stdout.partition("exit 0\n")
    assert said.strip().endswith("unchanged, nothing to do"), done
    assert loaded.split() == [], done.stderr


@pytest.mark.parametrize("words", [
    ["agent", "--config", "/etc/reconciler/agent.yaml"],
    ["agent", "--once", "--node", "n1", "--remote", "file:///srv/cloud.git", "--state-dir", "/var/lib/r",
     "--allowed-signers=/etc/a", "--trust-policy", "head", "--interval", "2.5", "--jitter=0", "-o", "json",
     "--metrics-textfile", "/tmp/m.prom", "--note-key", "k", "--node", "n2", "--once"],
    ["agent", "--gpg-home", "g", "--revoked", "r", "--age-identity", "a", "--branch", "b", "--output=human"],
])
def test_a_plain_agent_command_line_is_read_as_click_reads_it(words: list[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`reconciler agent ...` runs without click (issue 40): what it reads is what click would
    have handed the command, the config's variable included."""
    from reconciler.cli.node import agent_command
    from reconciler.entry import plain_agent

    monkeypatch.setenv("RECONCILER_CONFIG", "/etc/other.yaml")
    plain = plain_agent(words)
    assert plain is not None
    params = agent_command.make_context("agent", words[1:]).params
    assert {**plain.agent_opts, **plain.settings, "once": plain.once, "output": plain.output} == params


@pytest.mark.parametrize("words", [
    ["agent", "--help"], ["-v", "agent"], ["agent", "--interval", "soon"], ["agent", "--trust-policy", "any"],
    ["agent", "--node"], ["agent", "--node", "--once"], ["agent", "--nod", "n1"], ["agent", "extra"],
    ["agent", "--", "--once"], ["status"], ["agent", "--node="], ["agent", "-onope"],
])
def test_any_other_command_line_is_left_to_click(words: list[str]) -> None:
    from reconciler.entry import plain_agent

    assert plain_agent(words) is None


def test_a_plain_agent_command_line_fails_as_click_s_does(tmp_path: Path) -> None:
    """A refused start is said the same with or without click: one line, or one JSON object,
    and the exit code (a settings file that is missing)."""
    said = []
    for words in (["agent", "--once", "--config", str(tmp_path / "none.yaml")],
                  ["--log-format", "text", "agent", "--once", "--config", str(tmp_path / "none.yaml")]):
        for output in ([], ["-o", "json"]):
            done = subprocess.run([sys.executable, "-m", "reconciler", *words, *output], capture_output=True,
                                  text=True)
            said.append((done.returncode, done.stdout, done.stderr))
    assert said[0] == said[2] and said[1] == said[3], said
    assert said[0][0] == 2 and said[0][2].startswith("error: ") and said[1][1].startswith("{"), said



# What an idle daemon needs none of (issue 40): OpenSSL, hashlib's and the CA check's (3.5 MB of
# its RSS; it hashes its node's name and its live files with the interpreter's own SHA-256), nor
# hmac and secrets, which load it too.
NOT_IDLE = ("_hashlib", "_ssl", "hashlib", "hmac", "secrets")


@pytest.mark.parametrize("group", [[], ["-v"]], ids=["plain", "through-click"])
def test_an_idle_daemon_holds_no_openssl(group: list[str], tmp_path: Path, merge_key: SigningKey,
                                         agents: Callable[..., Agent]) -> None:
    files = {"reconciler.yaml": "format: 1\nname: idle\n",
             "inventory.yaml": "groups:\n  all:\n    services: [idle]\nnodes:\n  d1:\n    groups: [all]\n",
             "services/idle/service.yaml": "runtime:\n  command: [python3, idle.py]\n"
                                           "files:\n  - {path: idle.py, source: idle.py}\n",
             "services/idle/files/idle.py": "import time\nwhile True:\n    time.sleep(3600)\n"}
    dep = small_deployment(tmp_path, merge_key, files)
    node = agents("d1", dep.url)
    assert node.reconcile_once().exit_code == 0
    node.close()
    listed, log = tmp_path / "modules", tmp_path / "daemon.log"
    args = [*group, "agent", "--node", "d1", "--remote", dep.url, "--state-dir", str(node.cfg.state_dir),
            "--allowed-signers", str(merge_key.allowed_signers), "--note-key", str(node.cfg.note_key),
            "--interval", "0.5", "--jitter", "0"]
    with log.open("w") as out:
        daemon = subprocess.Popen([sys.executable, "-c", DAEMON, str(listed), *args], stdout=out, stderr=out)
    try:
        wait_for(lambda: "unchanged" in log.read_text(), 30, "the first quiet poll")
        time.sleep(1.5)  # three more
        maps = Path(f"/proc/{daemon.pid}/maps").read_text()
        daemon.send_signal(signal.SIGUSR2)
        wait_for(listed.exists, 10, "the daemon to list its modules")
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(30) == 0, log.read_text()
    mapped = {line.rsplit("/", 1)[-1] for line in maps.splitlines() if ".so" in line}
    assert sorted(lib for lib in mapped if lib.startswith(("libcrypto", "libssl"))) == [], mapped
    loaded = set(listed.read_text().split())
    assert "reconciler.daemon.loop" in loaded  # it is the daemon
    assert sorted(loaded & set(NOT_IDLE)) == [], log.read_text()


@pytest.mark.parametrize("key", [b"", b"k", b"\x00" * 31, bytes(range(64)), bytes(range(65)), b"long key " * 20])
def test_the_interpreter_s_own_sha256_hashes_as_openssl_s(key: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon's digests (``core.digest`` without OpenSSL) are the ones hashlib and hmac
    give: a secret file's keyed hash recorded by one is checked by the other."""
    import hashlib
    import hmac

    from reconciler.core import digest
    from reconciler.core.model import FileSpec

    data = b"password: hunter2\n" * 100
    expected = (hashlib.sha256(data).hexdigest(), hmac.new(key, data, hashlib.sha256).hexdigest())
    assert (digest.sha256_hex(data), digest.hmac_sha256_hex(key, data)) == expected
    assert digest._BUILTIN is not None
    monkeypatch.setattr(digest, "_sha256", digest._BUILTIN)  # what ``without_openssl`` does, for this test
    assert (digest.sha256_hex(data), digest.hmac_sha256_hex(key, data)) == expected
    assert FileSpec("f", 0o600, data, secret=True, key=key).sha256 == expected[1 if key else 0]
    assert digest.sha256(b"n1") == hashlib.sha256(b"n1").digest()


def test_a_daemon_on_a_node_without_ca_certificates_stops_at_its_start_in_one_line(tmp_path: Path) -> None:
    """The daemon asks a child interpreter where OpenSSL looks (``entry.no_ca_paths``), and
    stops as every command does where nothing is there."""
    env = {**os.environ, "SSL_CERT_FILE": str(tmp_path / "no-bundle.pem"), "SSL_CERT_DIR": str(tmp_path / "no-dir")}
    done = subprocess.run([sys.executable, "-m", "reconciler", "agent", "--node", "n1", "--remote", "file:///nowhere",
                           "--state-dir", str(tmp_path / "state")], env=env, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (2, ""), done
    [line] = done.stderr.splitlines()
    assert line.startswith(f"error: no usable CA certificates in {tmp_path}/no-bundle.pem or {tmp_path}/no-dir/ "), line
    assert line.endswith("[NO_CA_BUNDLE]"), line
