"""The tip probe: a no-op poll reads one static file from a web server and asks git nothing.

Real parts: the deployment's bare repo behind a `git daemon`, `contrib/git-server/post-receive-tips`
installed as its post-receive hook, a real nginx serving the tips file it writes. The git daemon
is stopped to prove a poll did not need it, and started again when one must.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from conftest import Deployment, free_port, git
from needs import unavailable
from nginx import Nginx
from test_faults import FakeClock
from test_remotes import Daemon, identity_workers, live
from test_rollout import roll_out_with_two_controllers_side_by_side

from reconciler.agent import Agent
from reconciler.core.errors import ConfigError, RemoteError
from reconciler.settings import RemoteConfig, load_config
from reconciler.source.mirror import Source
from reconciler.source.probe import TipProbe

HOOK = Path(__file__).resolve().parent.parent / "contrib" / "git-server" / "post-receive-tips"
TIPS = "tips/cloud"


@pytest.fixture
def web(tmp_path: Path, deployment: Deployment) -> Iterator[Nginx]:
    """nginx serving tmp/www; the bare repo's hook writes its tips file there."""
    www = tmp_path / "www"
    (www / "tips").mkdir(parents=True)
    git("--git-dir", str(deployment.bare), "config", "reconciler.tips", str(www / TIPS))
    shutil.copy(HOOK, deployment.bare / "hooks" / "post-receive")
    server = Nginx(www, tmp_path / "nginx", free_port())
    if not server.available:
        unavailable("nginx", f"{server.binary} not found")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def daemon(deployment: Deployment) -> Iterator[Daemon]:
    server = Daemon(deployment.bare.parent)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_a_poll_that_finds_its_own_head_in_the_tips_file_asks_git_nothing(
    deployment: Deployment, agents: Callable[..., Agent], web: Nginx, daemon: Daemon
) -> None:
    identity_workers(deployment, 2)  # a push: the hook writes the tips file
    tips = (web.root / TIPS).read_text()
    assert tips == f"{git('rev-parse', 'HEAD', cwd=deployment.work)}\trefs/heads/main\n"
    remotes = (RemoteConfig(daemon.url("cloud.git"), "both", probe=web.url(TIPS)),)
    ctl1 = agents("ctl1", daemon.url("cloud.git"), remotes=remotes)
    first = ctl1.reconcile_once()
    assert first.exit_code == 0 and first.pushed, first

    # A note push runs the hook too; the branch did not move, so neither did the file.
    assert (web.root / TIPS).read_text() == tips
    daemon.stop()  # git is not needed for a poll that finds nothing new
    idle = ctl1.reconcile_once()
    assert idle.exit_code == 0 and idle.commit == first.commit and idle.report is None, idle
    assert web.requests(TIPS, at_least=1) == [200]  # the first poll asked git only; the second the probe only

    # A commit lands: the probe names another head, so the poll goes to git (still down: it says so).
    c1 = identity_workers(deployment, 4)
    assert c1 in (web.root / TIPS).read_text()
    with pytest.raises(RemoteError, match="ref check of git://127.0.0.1"):
        ctl1.reconcile_once()
    daemon.start()
    moved = ctl1.reconcile_once()
    assert moved.exit_code == 0 and moved.commit == c1 and "workers = 4" in live(ctl1)


def test_a_node_waiting_on_a_still_batch_watches_its_sentinel_through_the_hooks_notes_files(
    deployment: Deployment, agents: Callable[..., Agent], web: Nginx, daemon: Daemon
) -> None:
    roll_out_with_two_controllers_side_by_side(deployment)
    url = daemon.url("cloud.git")
    fleet = {n: agents(n, url, remotes=(RemoteConfig(url, "both", probe=web.url(TIPS)),))
             for n in ("ctl1", "ctl2", "ctl3", "cmp1")}
    for node in ("ctl1", "ctl2", "ctl3", "cmp1"):
        assert fleet[node].reconcile_once().exit_code == 0, node
    # Each note push ran the hook: one file per node's notes ref, beside the tips file.
    ctl2_tip = git("--git-dir", str(deployment.bare), "rev-parse", "refs/notes/reconciler/ctl2")
    assert (web.root / f"{TIPS}.notes" / "ctl2").read_text() == f"{ctl2_tip}\trefs/notes/reconciler/ctl2\n"

    cmp1 = fleet["cmp1"]
    identity_workers(deployment, 4)
    assert cmp1.reconcile_once().waiting == "waiting for ctl2, ctl3"  # git: the branch, then the batch before
    daemon.stop()
    # The branch's tip and its sentinel's (ctl2) notes tip are where cmp1 left them: no git at all.
    assert cmp1.reconcile_once().waiting == "waiting for ctl2, ctl3"
    assert web.requests(f"{TIPS}.notes/ctl2", at_least=1) == [200]
    daemon.start()
    assert fleet["ctl1"].reconcile_once().exit_code == 0
    assert fleet["ctl2"].reconcile_once().exit_code == 0
    # ctl2's note moved its file: cmp1 reads it with git, then the batch whole (ctl3 has not applied).
    assert cmp1.reconcile_once().waiting == "waiting for ctl3"
    assert fleet["ctl3"].reconcile_once().exit_code == 0
    went = cmp1.reconcile_once()
    assert went.exit_code == 0 and went.report is not None and went.report.state == "applied", went.waiting


def test_a_stale_probe_hides_a_commit_no_longer_than_check_every_and_is_doubted_until_it_agrees(
    deployment: Deployment, web: Nginx, daemon: Daemon, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    c0 = git("rev-parse", "HEAD", cwd=deployment.work)
    subprocess_hook(deployment)
    clock = FakeClock()
    url = daemon.url("cloud.git")
    source = Source(url, "main", tmp_path / "mirror.git",
                    probes={url: TipProbe(web.url(TIPS), 60.0, "tips", clock)}, progress=False)
    assert source.update() == (c0, True)

    (deployment.bare / "hooks" / "post-receive").unlink()  # the hook is lost: the file stays at c0
    c1 = identity_workers(deployment, 4)
    clock.now += 59
    assert source.update() == (c0, False)  # believed: nothing moved
    clock.now += 1
    caplog.set_level(logging.INFO, "reconciler.probe")
    assert source.update() == (c1, True)  # a check is due: git has c1
    assert "is stale" in caplog.text

    daemon.stop()  # doubted: every poll asks git now, however recent the last check
    with pytest.raises(RemoteError):
        source.update()
    daemon.start()
    subprocess_hook(deployment)  # the hook runs again: the file names c1
    assert source.update() == (c1, False)
    assert "agrees with git again" in caplog.text
    daemon.stop()
    assert source.update() == (c1, False)  # believed again: no git


def test_a_probe_that_fails_or_says_nonsense_sends_the_poll_to_git(
    deployment: Deployment, web: Nginx, daemon: Daemon, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    head = git("rev-parse", "HEAD", cwd=deployment.work)
    subprocess_hook(deployment)
    url = daemon.url("cloud.git")
    clock = FakeClock()
    probe = TipProbe(web.url(TIPS), 60.0, "tips", clock)
    source = Source(url, "main", tmp_path / "mirror.git", probes={url: probe}, progress=False)
    assert source.update() == (head, True)
    assert probe.unmoved("refs/heads/main", head)

    tips = web.root / TIPS
    other = "0123456789abcdef0123456789abcdef01234567"
    caplog.set_level(logging.INFO, "reconciler.probe")
    daemon.stop()  # so a poll that goes to git says so
    for body in ("<html>not found</html>\n", f"{other}\trefs/heads/main\n", f"{head}\trefs/heads/other\n", ""):
        tips.write_text(body)
        assert not probe.unmoved("refs/heads/main", head), body
        with pytest.raises(RemoteError, match="ref check of"):
            source.update()  # to git
    tips.unlink()  # 404
    assert not probe.unmoved("refs/heads/main", head)
    web.stop()  # no answer at all
    assert not probe.unmoved("refs/heads/main", head)
    with pytest.raises(RemoteError, match="ref check of"):
        source.update()
    daemon.start()
    assert source.update() == (head, False)  # git's word
    failures = [r.getMessage() for r in caplog.records if r.name == "reconciler.probe" and "failed" in r.getMessage()]
    assert len(failures) == 2, failures  # once per outage (the HTML page, then the 404 and the stop), not per poll
    assert "line 1 is not" in failures[0] and "HTTP 404" in failures[1]
    web.start()
    subprocess_hook(deployment)
    assert probe.unmoved("refs/heads/main", head) and "answers again" in caplog.text


def test_a_probe_over_https_is_believed_only_behind_a_certificate_the_node_trusts(
    deployment: Deployment, daemon: Daemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import subprocess

    cert, key = tmp_path / "tips.crt", tmp_path / "tips.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    www = tmp_path / "www"
    www.mkdir()
    subprocess.run([str(HOOK)], cwd=deployment.bare, env={**os.environ, "RECONCILER_TIPS": str(www / "cloud")},
                   stdin=subprocess.DEVNULL, check=True)
    server = Nginx(www, tmp_path / "nginx", free_port(), tls=(cert, key))
    if not server.available:
        unavailable("nginx", f"{server.binary} not found")
    server.start()
    try:
        head = git("rev-parse", "HEAD", cwd=deployment.work)
        url = daemon.url("cloud.git")
        probe = TipProbe(server.url("cloud"), 60.0, "tips", FakeClock())
        source = Source(url, "main", tmp_path / "mirror.git", probes={url: probe}, progress=False)
        assert source.update() == (head, True)
        caplog.set_level(logging.WARNING, "reconciler.probe")
        assert not probe.unmoved("refs/heads/main", head)  # a certificate nobody vouches for
        assert "CERTIFICATE_VERIFY_FAILED" in caplog.text
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the node trusts its site's CA
        assert probe.unmoved("refs/heads/main", head)
        daemon.stop()
        assert source.update() == (head, False)
    finally:
        server.stop()


def subprocess_hook(deployment: Deployment) -> None:
    """Run the hook by hand, as a mirror's cron job would after its fetch."""
    import subprocess

    subprocess.run([str(HOOK)], cwd=deployment.bare, stdin=subprocess.DEVNULL, check=True)


def test_the_hook_run_with_no_stdin_on_a_fetched_mirror_rebuilds_the_notes_files_from_its_refs(
    deployment: Deployment, tmp_path: Path,
) -> None:
    import subprocess

    head = git("rev-parse", "HEAD", cwd=deployment.work)
    mirror = tmp_path / "mirror.git"
    git("init", "-q", "--bare", str(mirror))
    tips = tmp_path / "www" / "cloud"
    tips.parent.mkdir()

    def fetched(*refs: str) -> dict[str, str]:
        """The mirror's refs are ``refs`` now (as a cron job's fetch --prune leaves them); the
        hook runs with nothing on stdin; the notes files it leaves, by name."""
        for ref in git("--git-dir", str(mirror), "for-each-ref", "--format=%(refname)").split():
            git("--git-dir", str(mirror), "update-ref", "-d", ref)
        for ref in refs:
            git("--git-dir", str(mirror), "fetch", "-q", str(deployment.bare), f"{head}:{ref}")
        subprocess.run([str(HOOK)], cwd=mirror, env={**os.environ, "RECONCILER_TIPS": str(tips)},
                       stdin=subprocess.DEVNULL, check=True)
        return {f.name: f.read_text() for f in (tips.parent / "cloud.notes").iterdir()}

    def line(node: str) -> str:
        return f"{head}\trefs/notes/reconciler/{node}\n"

    assert fetched("refs/heads/main", "refs/notes/reconciler/ctl1", "refs/notes/reconciler/ctl2",
                   "refs/notes/reconciler/a/b") == {"ctl1": line("ctl1"), "ctl2": line("ctl2")}
    assert tips.read_text() == f"{head}\trefs/heads/main\n"
    (tips.parent / "cloud.notes" / "ctl1.tmp.4242").write_text("half")  # a hook killed mid-write
    # ctl2's ref is gone (the node left the fleet): so is its file, and the half-written one.
    assert fetched("refs/heads/main", "refs/notes/reconciler/ctl1") == {"ctl1": line("ctl1")}

    # A push says which refs moved: only those files change; a deleted ref's file goes.
    zero = "0" * 40
    pushed = (f"{head} {zero} refs/notes/reconciler/ctl1\n{zero} {head} refs/notes/reconciler/x/y\n"
              f"{zero} {head} refs/notes/reconciler/ctl3\n")
    subprocess.run([str(HOOK)], cwd=mirror, env={**os.environ, "RECONCILER_TIPS": str(tips)}, input=pushed,
                   text=True, check=True)
    assert {f.name: f.read_text() for f in (tips.parent / "cloud.notes").iterdir()} == {"ctl3": line("ctl3")}
    assert sorted(p.name for p in tips.parent.iterdir()) == ["cloud", "cloud.lock", "cloud.notes"]  # no scratch


@pytest.mark.parametrize(("remote", "error"), [
    ({"url": "git://h/c.git", "probe": "ftp://h/tips"}, r"remotes\[0\]: probe is not an http:// or https:// URL"),
    ({"url": "git://h/c.git", "probe": "http://h/tips", "check_every": 0},
     r"remotes\[0\].check_every: 0 must be > 0 and at most 604800"),
    ({"url": "git://h/c.git", "probe": "http://h/tips", "check_every": True},
     r"remotes\[0\].check_every: True is not a number"),
    ({"url": "git://h/c.git", "check_every": 60}, "check_every without a probe"),
    ({"url": "git://h/c.git", "role": "write", "probe": "http://h/tips"}, "a probe is for a remote that is read"),
    ({"url": "git://h/c.git", "probe": "https://:hunter2@/tips"}, "not an http:// or https:// URL"),
])
def test_a_bad_probe_setting_is_one_located_line(tmp_path: Path, remote: dict[str, object], error: str) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({"node": "ctl1", "remotes": [remote, {"url": "git://m/c.git", "role": "read"}]}))
    with pytest.raises(ConfigError, match=error) as caught:
        load_config(config, {})
    assert "\n" not in str(caught.value) and "hunter2" not in str(caught.value)
    assert str(config) in str(caught.value)


def test_a_probe_setting_reaches_the_agent(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({"node": "ctl1", "remotes": [
        {"url": "git://mirror/c.git", "role": "read", "probe": "https://mirror/tips/c", "check_every": 120},
        {"url": "ssh://git@primary/c.git", "role": "write"}]}))
    cfg = load_config(config, {})
    assert cfg.remotes[0] == RemoteConfig("git://mirror/c.git", "read", "https://mirror/tips/c", 120.0)
    assert cfg.remotes[1].probe is None
